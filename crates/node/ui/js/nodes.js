// A node's page (its pools, replicas, attached volumes, I/O; labels and
// removal), the pools list and a pool's page (scan). A pool is scanned by
// its own node: the API's /pools routes act on the node that answers, so
// the page offers the scan where it is served by that node, and a link to
// that node's dashboard elsewhere.

import { h, bytes, duration, badge, bar, percent } from './dom.js';
import { post, put, del, segment } from './api.js';
import { formDialog, typedConfirmDialog, notify } from './dialogs.js';
import { ioCharts, eventsTable, section, provisionedLine } from './widgets.js';
import { poolProvisioned, overcommitted } from './space.js';

function button(label, action, onclick, className = 'secondary') {
  return h('button', { class: className, dataset: { action }, onclick }, label);
}

function fact(term, value, name) {
  return [h('dt', {}, term), h('dd', { dataset: { fact: name } }, value)];
}

const nodeHref = (node) => `#/nodes/${encodeURIComponent(node)}`;
const poolHref = (node, pool) => `#/pools/${encodeURIComponent(node)}/${encodeURIComponent(pool)}`;

/** Every pool of every node, as the nodes last reported them. */
function allPools(state) {
  const pools = [];
  for (const node of state.nodes) {
    for (const pool of state.nodeDetails.get(node.name)?.pool_list ?? []) pools.push({ node, pool });
  }
  return pools;
}

/** "used of capacity" as a bar. */
function usage(pool) {
  const used = pool.capacity_bytes - pool.free_bytes;
  return bar(used, pool.capacity_bytes, `${bytes(used)} of ${bytes(pool.capacity_bytes)}`);
}

/** The provisioned figure of a pool with its share, flagged when over. */
function provisionedCell(state, node, pool) {
  const provisioned = poolProvisioned(state, node, pool);
  const over = overcommitted(provisioned, pool.capacity_bytes);
  return h('td', { class: 'number provisioned', dataset: { provisioned, overcommitted: over } },
    `${bytes(provisioned)} (${percent(provisioned, pool.capacity_bytes)})`,
    over ? [' ', badge('over-committed')] : null);
}

export function poolsPage(state) {
  const rows = allPools(state).map(({ node, pool }) =>
    h('tr', {
      dataset: {
        pool: `${node.name}/${pool.name}`, capacity: pool.capacity_bytes, free: pool.free_bytes,
        state: pool.online ? 'online' : 'offline',
      },
    },
    h('td', {}, h('a', { href: nodeHref(node.name) }, node.name), node.state === 'online' ? null : h('small', {}, ` (${node.state})`)),
    h('td', { class: 'name' }, h('a', { href: poolHref(node.name, pool.name) }, pool.name)),
    h('td', {}, pool.class),
    h('td', {}, badge(pool.online ? 'online' : 'offline')),
    h('td', { class: 'usage' }, usage(pool)),
    h('td', { class: 'number' }, bytes(pool.free_bytes)),
    provisionedCell(state, node.name, pool)));
  return [
    h('h1', {}, 'Pools'),
    h('p', { class: 'muted' }, 'Capacity and free space as each node last reported them. Provisioned: the sizes of the volumes with a replica in the pool; more than its capacity is over-committed (thin volumes that, written in full, would not fit).'),
    rows.length
      ? h('table', { class: 'pools' },
          h('thead', {}, h('tr', {}, ['Node', 'Pool', 'Class', 'State', 'Used', 'Free', 'Provisioned'].map((title) => h('th', {}, title)))),
          h('tbody', {}, rows))
      : h('p', {}, 'No pool yet: add one with trireme pool create.'),
  ];
}

/** The scan button where this node serves the page, else where to scan. */
function scanAction(state, node, pool, context) {
  if (node.name === state.status.this_node) {
    return button('Scan', 'scan-pool', () => scanPool(pool.name, context));
  }
  return h('a', {
    class: 'scan-elsewhere', href: `http://${node.api_address}/ui/${poolHref(node.name, pool.name)}`,
    title: 'A pool is scanned by its own node: open that node\'s dashboard, or run trireme pool scan there.',
  }, `scan on ${node.name}'s dashboard`);
}

function nodePools(state, node, detail, context) {
  const pools = detail?.pool_list ?? [];
  if (pools.length === 0) return h('p', { class: 'muted' }, 'No pool on this node.');
  return h('table', { class: 'pools' },
    h('thead', {}, h('tr', {}, ['Pool', 'Class', 'State', 'Used', 'Free', 'Provisioned', ''].map((title) => h('th', {}, title)))),
    h('tbody', {}, pools.map((pool) =>
      h('tr', { dataset: { pool: `${node.name}/${pool.name}`, capacity: pool.capacity_bytes } },
        h('td', { class: 'name' }, h('a', { href: poolHref(node.name, pool.name) }, pool.name)),
        h('td', {}, pool.class),
        h('td', {}, badge(pool.online ? 'online' : 'offline')),
        h('td', { class: 'usage' }, usage(pool)),
        h('td', { class: 'number' }, bytes(pool.free_bytes)),
        provisionedCell(state, node.name, pool),
        h('td', {}, scanAction(state, node, pool, context))))));
}

function nodeReplicas(detail) {
  const replicas = detail?.replicas ?? [];
  if (replicas.length === 0) return h('p', { class: 'muted' }, 'No volume has a replica here.');
  return h('table', { class: 'node-replicas' },
    h('thead', {}, h('tr', {}, ['Volume', 'Kind', 'Pool', 'Data', 'Attached here'].map((title) => h('th', {}, title)))),
    h('tbody', {}, replicas.map((replica) =>
      h('tr', { dataset: { volume: replica.volume, primary: replica.primary } },
        h('td', { class: 'name' }, h('a', { href: `#/volumes/${encodeURIComponent(replica.volume)}` }, replica.volume)),
        h('td', {}, replica.kind),
        h('td', {}, replica.pool ?? '–'),
        h('td', {}, replica.data === '-' ? '–' : badge(replica.data)),
        h('td', {}, replica.primary ? badge('primary') : '')))));
}

function labelsText(labels) {
  const pairs = Object.entries(labels ?? {});
  return pairs.length ? pairs.map(([key, value]) => `${key}=${value}`).join(', ') : 'none';
}

export function nodePage(state, name, context) {
  const node = state.nodes.find((candidate) => candidate.name === name);
  if (!node) {
    return [
      h('h1', {}, name),
      h('p', { class: 'warning', dataset: { notFound: name } }, `No node ${name} in this cluster. `,
        h('a', { href: '#/nodes' }, 'See the nodes'), '.'),
    ];
  }
  const detail = state.nodeDetails.get(name);
  const actions = h('div', { class: 'actions' },
    button('Labels', 'labels', () => editLabels(node, context)),
    button('Remove from cluster', 'remove-node', () => removeNode(state, node, detail, context), 'danger'));
  return [
    h('div', { class: 'title-row', dataset: { node: node.name, state: node.state } },
      h('h1', {}, 'Node ', h('span', { class: 'name' }, node.name), ' ', badge(node.state)), actions),
    h('dl', { class: 'facts' },
      fact('State', `${node.state} for ${duration(node.state_seconds)}`, 'state'),
      fact('Role', node.role, 'role'),
      fact('API', node.api_address, 'api'),
      fact('NBD', node.nbd_address ?? '–', 'nbd'),
      fact('Data links', node.data_address ?? '–'),
      fact('Labels', labelsText(node.labels), 'labels'),
      fact('Capacity', `${bytes(node.capacity_bytes)}, ${bytes(node.free_bytes)} free`, 'capacity'),
      fact('Joined', detail ? new Date(detail.joined_ms).toLocaleString() : '–')),
    section('Pools', 'pools', nodePools(state, node, detail, context)),
    section('Replicas', 'replicas', nodeReplicas(detail)),
    section('I/O of the volumes it serves', 'io', ioCharts(state, `node:${name}`, context)),
    section('Events', 'events', eventsTable(state.events, state.events.list.filter((event) => event.node === name).slice(-50))),
  ];
}

export function poolPage(state, nodeName, poolName, context) {
  const node = state.nodes.find((candidate) => candidate.name === nodeName);
  const pool = state.nodeDetails.get(nodeName)?.pool_list?.find((candidate) => candidate.name === poolName);
  if (!node || !pool) {
    return [
      h('h1', {}, `${nodeName}/${poolName}`),
      h('p', { class: 'warning', dataset: { notFound: `${nodeName}/${poolName}` } }, `No pool ${poolName} on a node ${nodeName}. `,
        h('a', { href: '#/pools' }, 'See the pools'), '.'),
    ];
  }
  // The node's own figures, when it serves this page.
  const own = state.extra.get(`/pools/${segment(poolName)}`)?.value;
  const volumes = state.volumes.filter((volume) =>
    volume.replicas.some((replica) => replica.node === nodeName && replica.pool === poolName && replica.kind === 'diskful'));
  const provisioned = poolProvisioned(state, nodeName, pool);
  return [
    h('div', { class: 'title-row', dataset: { pool: `${nodeName}/${poolName}` } },
      h('h1', {}, 'Pool ', h('span', { class: 'name' }, poolName), ' on ', h('a', { href: nodeHref(nodeName) }, nodeName), ' ',
        badge(pool.online ? 'online' : 'offline')),
      h('div', { class: 'actions' }, scanAction(state, node, pool, context))),
    h('dl', { class: 'facts' },
      fact('Class', pool.class),
      fact('Capacity', bytes(pool.capacity_bytes), 'capacity'),
      fact('Used', usage(pool)),
      fact('Free', bytes(pool.free_bytes)),
      fact('Provisioned', provisionedLine(provisioned, pool.capacity_bytes), 'provisioned'),
      fact('Volumes', volumes.length, 'volumes'),
      own ? [
        fact('Device', own.device_path),
        fact('Journal', bytes(own.journal_bytes)),
        fact('Chunk', bytes(own.chunk_bytes)),
        fact('Checksum errors', own.checksum_errors ?? 0, 'checksum-errors'),
      ] : null),
    section('Volumes with a replica here', 'volumes', volumes.length === 0 ? h('p', { class: 'muted' }, 'None.') :
      h('table', { class: 'pool-volumes' },
        h('thead', {}, h('tr', {}, ['Volume', 'Size', 'State', 'Replica'].map((title) => h('th', {}, title)))),
        h('tbody', {}, volumes.map((volume) => {
          const replica = volume.replicas.find((candidate) => candidate.node === nodeName);
          return h('tr', { dataset: { volume: volume.name } },
            h('td', { class: 'name' }, h('a', { href: `#/volumes/${encodeURIComponent(volume.name)}` }, volume.name)),
            h('td', { class: 'number' }, bytes(volume.size_bytes)),
            h('td', {}, badge(volume.state)),
            h('td', {}, badge(replica.state)));
        })))),
  ];
}

async function scanPool(pool, context) {
  notify(`Scanning pool ${pool}: every written block's checksum is read…`);
  try {
    const report = await post(`/pools/${segment(pool)}/scan`);
    const findings = [...report.problems, ...report.checksum_mismatches];
    notify(report.clean
      ? `Pool ${pool} is clean: ${report.blocks_checked} blocks checked, accounting agrees.`
      : `Pool ${pool}: ${findings.length} problem(s): ${findings.slice(0, 3).join('; ')}`, report.clean ? 'ok' : 'error');
  } catch (failure) {
    notify(`Scanning pool ${pool} failed: ${failure.message}`, 'error');
  }
  context.refresh();
}

/** KEY=VALUE pairs, comma- or space-separated, as `trireme node label` takes them. */
function parseLabels(text) {
  const labels = {};
  for (const pair of text.split(/[\s,]+/).filter(Boolean)) {
    const [key, value, ...more] = pair.split('=');
    if (!key || value === undefined || more.length) throw new Error(`"${pair}" is not KEY=VALUE (e.g. zone=rack1)`);
    labels[key] = value;
  }
  return labels;
}

function editLabels(node, context) {
  formDialog({
    id: 'node-labels',
    title: `Labels of ${node.name}`,
    message: 'Placement spreads replicas over them (a group\'s replicas-on-different). Replicas already placed stay where they are.',
    submit: 'Save labels',
    fields: [{
      name: 'labels', label: 'Labels', value: labelsText(node.labels) === 'none' ? '' : labelsText(node.labels),
      placeholder: 'zone=rack1, room=a', hint: 'KEY=VALUE, separated by commas; remove one by leaving it out',
    }],
    onSubmit: async (values) => {
      const set = parseLabels(values.labels);
      const remove = Object.keys(node.labels ?? {}).filter((key) => !(key in set));
      const changed = await put(`/nodes/${segment(node.name)}/labels`, { set, remove });
      notify(`Labels of ${node.name}: ${labelsText(changed.labels)}.`);
      context.refresh();
    },
  });
}

function removeNode(state, node, detail, context) {
  const held = (detail?.replicas ?? []).map((replica) => replica.volume);
  typedConfirmDialog({
    id: 'remove-node',
    title: `Remove ${node.name} from the cluster?`,
    message: `It stops being a member: its vote goes to another node, and its replicas${held.length ? ` (${held.join(', ')})` : ''} ` +
      'are no longer counted; add replicas elsewhere for the volumes that need them. A node that is still running must join again to come back.',
    name: node.name,
    what: 'node',
    confirm: 'Remove node',
    onConfirm: async () => {
      await del(`/nodes/${segment(node.name)}`);
      notify(`Node ${node.name} removed from the cluster.`);
      location.hash = '#/nodes';
      context.refresh();
    },
  });
}
