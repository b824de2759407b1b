// Provisioned space against pool size: over-commit, flagged in the
// overview, the pools and a node's and a pool's page.
//
// The provisioned figure of a pool is the sum of the sizes of the volumes
// with a diskful replica on it (a thin volume may grow to its size there).
// The API gives it as `provisioned_bytes` where it has it; where it does
// not (a node's pool list), it is computed here, in this one function.

/** `${node}/${pool}` -> bytes provisioned on it. */
export function provisionedByPool(volumes) {
  const provisioned = new Map();
  for (const volume of volumes) {
    if (volume.state === 'deleting') continue;
    for (const replica of volume.replicas) {
      if (replica.kind !== 'diskful' || !replica.pool) continue;
      const key = `${replica.node}/${replica.pool}`;
      provisioned.set(key, (provisioned.get(key) ?? 0) + volume.size_bytes);
    }
  }
  return provisioned;
}

/** A pool's provisioned bytes: the API's figure, or the sum above. */
export function poolProvisioned(state, node, pool) {
  if (typeof pool.provisioned_bytes === 'number') return pool.provisioned_bytes;
  return provisionedByPool(state.volumes).get(`${node}/${pool.name}`) ?? 0;
}

/** More provisioned than there is: thin volumes may not all fit when written. */
export function overcommitted(provisioned, capacity) {
  return capacity > 0 && provisioned > capacity;
}
