// The volumes list, one volume's page, and the actions on volumes:
// create, grow, attach, detach, snapshot, rollback, verify, add and
// remove a replica, delete (snapshots' own actions are in snapshots.js).
// Detach, rollback and replica removal cannot be undone from here: each
// asks for a confirmation first; delete asks for the volume's name typed.

import { h, bytes, badge, bar, iops, rate, parseSize, duration } from './dom.js';
import { post, del, segment } from './api.js';
import { formDialog, typedConfirmDialog, notify } from './dialogs.js';
import { ioCharts, eventsTable, section } from './widgets.js';
import { snapshotsPanel } from './snapshots.js';

const BLOCK = 4096;

function button(label, action, onclick, className = 'secondary') {
  return h('button', { class: className, dataset: { action }, onclick }, label);
}

/** One replica as a chip: node, state, and the resync bar while it runs. */
function replicaChip(replica) {
  const word = replica.state.split(' ')[0];
  return h('span', { class: `replica badge-${word.replace(/[^a-z-]/g, '')}`, dataset: { replica: replica.node, state: replica.state } },
    h('b', {}, replica.node), ' ', replica.state,
    replica.sync ? bar(replica.sync.percent, 100, `${replica.sync.percent}%`) : null);
}

export function volumesPage(state, context) {
  const latest = new Map(
    [...state.io.volumes.entries()].map(([name, history]) => [name, history[history.length - 1]?.values]),
  );
  return [
    h('div', { class: 'title-row' },
      h('h1', {}, 'Volumes'),
      button('Create volume', 'create-volume', () => createVolume(state, context), 'primary')),
    state.volumes.length === 0
      ? h('p', {}, 'No volume yet.')
      : h('table', { class: 'volumes' },
          h('thead', {}, h('tr', {}, ['Name', 'State', 'Size', 'Used', 'Attached on', 'Replicas', 'I/O'].map((title) => h('th', {}, title)))),
          h('tbody', {}, state.volumes.map((volume) => {
            const io = latest.get(volume.name);
            return h('tr', { dataset: { volume: volume.name, state: volume.state, size: volume.size_bytes } },
              h('td', { class: 'name' }, h('a', { href: `#/volumes/${encodeURIComponent(volume.name)}` }, volume.name)),
              h('td', { class: 'state' }, badge(volume.state)),
              h('td', { class: 'number size' }, bytes(volume.size_bytes)),
              h('td', { class: 'number' }, bytes(volume.allocated_bytes)),
              h('td', { class: 'primaries' }, volume.primaries.join(', ') || '–'),
              h('td', { class: 'replicas' }, volume.replicas.map(replicaChip)),
              h('td', { class: 'number io' }, io && state.io.available
                ? `${iops(io.read_iops + io.write_iops)} op/s, ${rate(io.read_bytes_per_sec + io.write_bytes_per_sec)}`
                : '–'));
          }))),
  ];
}

export function volumePage(state, name, context) {
  const volume = state.volumes.find((candidate) => candidate.name === name);
  if (!volume) {
    return [
      h('h1', {}, name),
      h('p', { class: 'warning', dataset: { notFound: name } }, `No volume ${name} in this cluster. `,
        h('a', { href: '#/volumes' }, 'See the volumes'), '.'),
    ];
  }
  const snapshots = state.snapshots.filter((snapshot) => snapshot.volume === name);
  const rollback = (chosen) => rollbackVolume(volume, snapshots, chosen, context);
  const attached = volume.primaries.length > 0;
  const actions = h('div', { class: 'actions' },
    button('Grow', 'grow', () => growVolume(volume, context)),
    button('Attach', 'attach', () => attachVolume(state, volume, context)),
    attached ? button('Detach', 'detach', () => detachVolume(volume, context), 'danger') : null,
    button('Snapshot', 'snapshot', () => snapshotVolume(volume, context)),
    snapshots.length ? button('Roll back', 'rollback', () => rollback(null), 'danger') : null,
    attached ? button('Verify', 'verify', () => verifyVolume(volume, context)) : null,
    button('Add replica', 'add-replica', () => addReplica(state, volume, context)),
    button('Delete', 'delete-volume', () => deleteVolume(volume, snapshots, context), 'danger'));
  const segmentName = segment(name);
  return [
    h('div', { class: 'title-row', dataset: { volume: volume.name, state: volume.state } },
      h('h1', {}, 'Volume ', h('span', { class: 'name' }, volume.name), ' ', badge(volume.state)), actions),
    h('dl', { class: 'facts' },
      fact('Size', bytes(volume.size_bytes), 'size'),
      fact('Used', bytes(volume.allocated_bytes)),
      fact('Attached on', volume.primaries.join(', ') || 'not attached', 'primaries'),
      fact('NBD', volume.nbd_url ?? '–'),
      fact('Group', volume.group),
      fact('Generation', volume.generation),
      fact('Checksum errors', volume.checksum_errors)),
    section('Replicas', 'replicas', replicasTable(volume, context)),
    attached ? section('Verify', 'verify', verifyReport(state.extra.get(`/volumes/${segmentName}/verify`))) : null,
    section('I/O', 'io', ioCharts(state, `volume:${name}`, context)),
    snapshotsPanel(volume, snapshots, state.extra.get(`/volumes/${segmentName}/snapshot-schedule`), context, rollback),
    section('Events', 'events', eventsTable(state.events, state.events.list.filter((event) => event.volume === name).slice(-50))),
  ];
}

function replicasTable(volume, context) {
  return h('table', { class: 'replicas' },
    h('thead', {}, h('tr', {}, ['Node', 'Kind', 'Pool', 'State', 'Storage', 'Resync', ''].map((title) => h('th', {}, title)))),
    h('tbody', {}, volume.replicas.map((replica) =>
      h('tr', { dataset: { replica: replica.node, state: replica.state, kind: replica.kind } },
        h('td', {}, h('a', { href: `#/nodes/${encodeURIComponent(replica.node)}` }, replica.node)),
        h('td', {}, replica.kind),
        h('td', {}, replica.pool ?? '–'),
        h('td', {}, badge(replica.state)),
        h('td', {}, replica.observed, replica.message ? h('small', { class: 'warning' }, ` ${replica.message}`) : null),
        h('td', { class: 'sync' }, syncCell(replica)),
        h('td', {}, replica.kind === 'diskful'
          ? button('Remove', 'remove-replica', () => removeReplica(volume, replica, context), 'danger small')
          : null)))));
}

/** The running or last verify (GET .../verify), or why there is none. */
function verifyReport(answer) {
  if (!answer) return h('p', { class: 'muted' }, 'Loading…');
  if (answer.error) {
    const none = answer.error.status === 404 && answer.error.code !== 'volume_not_found';
    return h('p', { class: 'muted', dataset: { verify: 'none' } },
      none ? 'No verify since the volume was attached: Verify compares every block of its up-to-date replicas.' : answer.error.message);
  }
  const report = answer.value;
  const repaired = report.repaired.filter((entry) => entry.blocks > 0);
  return h('div', { class: 'verify', dataset: { verify: report.state, differing: report.differing_blocks } },
    h('p', {}, badge(report.state), ' ',
      report.state === 'running'
        ? `${report.percent}% of ${bytes(report.total_bytes)} compared on ${report.replicas.join(', ')}`
        : `${bytes(report.checked_bytes)} compared on ${report.replicas.join(', ')}` +
          (report.elapsed_ms ? ` in ${(report.elapsed_ms / 1000).toFixed(1)} s` : '')),
    report.state === 'running' ? bar(report.percent, 100, `${report.percent}%`) : null,
    h('p', { class: report.differing_blocks ? 'warning' : '' },
      report.differing_blocks
        ? `${report.differing_blocks} block(s) differed (${report.no_majority_blocks} without a majority, ${report.unrecoverable_blocks} unrecoverable); ` +
          `repaired: ${repaired.map((entry) => `${entry.blocks} on ${entry.node}`).join(', ') || 'none'}.`
        : 'Every block compared is the same on every replica.'),
    report.skipped_bytes ? h('p', { class: 'warning' }, `${bytes(report.skipped_bytes)} not compared: fewer than two up-to-date replicas answered.`) : null,
    report.reason ? h('p', { class: 'warning' }, `Stopped: ${report.reason}`) : null);
}

function fact(term, value, name) {
  return [h('dt', {}, term), h('dd', { dataset: { fact: name } }, value)];
}

function syncCell(replica) {
  if (replica.sync) {
    const sync = replica.sync;
    return [
      bar(sync.done_bytes, sync.total_bytes, `${sync.percent}% of ${bytes(sync.total_bytes)}`),
      h('small', {}, sync.stalled_secs
        ? ` stalled for ${duration(sync.stalled_secs)}`
        : ` ${rate(sync.rate_bytes_per_sec)}${sync.eta_secs !== null && sync.eta_secs !== undefined ? `, ${duration(sync.eta_secs)} left` : ''}`),
    ];
  }
  if (replica.resync_blocked) return h('small', { class: 'warning' }, replica.resync_blocked);
  return replica.in_sync ? 'in sync' : '–';
}

/** A size in bytes from a form field, a positive multiple of 4 KiB. */
function sizeField(text) {
  const size = parseSize(text);
  if (size <= 0 || size % BLOCK !== 0) {
    throw new Error(`the size must be a positive multiple of 4 KiB; ${text} is ${size} bytes`);
  }
  return size;
}

function done(context, message) {
  notify(message);
  context.refresh();
}

function createVolume(state, context) {
  formDialog({
    id: 'create-volume',
    title: 'Create a volume',
    submit: 'Create',
    fields: [
      { name: 'name', label: 'Name', required: true, placeholder: 'vm-101-disk-0', hint: 'letters, digits, - _ and .' },
      { name: 'size', label: 'Size', required: true, placeholder: '10G', hint: 'e.g. 512M, 10G, 1.5T' },
      { name: 'replicas', label: 'Replicas', type: 'number', placeholder: 'the group\'s place-count' },
      { name: 'group', label: 'Resource group', placeholder: 'default' },
    ],
    onSubmit: async (values) => {
      const body = { name: values.name.trim(), size_bytes: sizeField(values.size) };
      if (values.replicas.trim()) body.replicas = Number(values.replicas);
      if (values.group.trim()) body.group = values.group.trim();
      const volume = await post('/volumes', body);
      done(context, `Volume ${volume.name} created (${bytes(volume.size_bytes)}, ${volume.state}).`);
    },
  });
}

function growVolume(volume, context) {
  formDialog({
    id: 'grow-volume',
    title: `Grow ${volume.name}`,
    message: `It is ${bytes(volume.size_bytes)} now; a volume cannot shrink.`,
    submit: 'Grow',
    fields: [{ name: 'size', label: 'New size', required: true, value: bytes(volume.size_bytes).replace(/ |iB/g, '') }],
    onSubmit: async (values) => {
      const grown = await post(`/volumes/${segment(volume.name)}/grow`, { size_bytes: sizeField(values.size) });
      done(context, `Volume ${grown.name} is now ${bytes(grown.size_bytes)}.`);
    },
  });
}

function attachVolume(state, volume, context) {
  const online = state.nodes.filter((node) => node.state === 'online');
  formDialog({
    id: 'attach-volume',
    title: `Attach ${volume.name}`,
    message: volume.primaries.length
      ? `It is attached on ${volume.primaries.join(', ')}: attaching elsewhere is refused unless that node is offline (then it is taken over and fenced).`
      : 'The node chosen serves it over NBD from now on.',
    submit: 'Attach',
    fields: [{
      name: 'node', label: 'Node', type: 'select', required: true, value: state.status.this_node,
      options: online.map((node) => ({ value: node.name, label: node.name })),
    }],
    onSubmit: async (values) => {
      const attached = await post(`/volumes/${segment(volume.name)}/attach`, { node: values.node });
      const fenced = (attached.fenced ?? []).map((primary) => primary.node);
      done(context, `Volume ${attached.name} attached on ${values.node}${attached.nbd_url ? ` at ${attached.nbd_url}` : ''}` +
        `${fenced.length ? `; ${fenced.join(', ')} fenced` : ''}.`);
    },
  });
}

function detachVolume(volume, context) {
  formDialog({
    id: 'detach-volume',
    title: `Detach ${volume.name}?`,
    message: 'Whatever uses it on that node (a VM, an NBD client) gets I/O errors from now on. Stop it first.',
    submit: 'Detach',
    danger: true,
    fields: [{
      name: 'node', label: 'From node', type: 'select', required: true, value: volume.primaries[0],
      options: volume.primaries.map((node) => ({ value: node, label: node })),
    }],
    onSubmit: async (values) => {
      await post(`/volumes/${segment(volume.name)}/detach`, { node: values.node });
      done(context, `Volume ${volume.name} detached from ${values.node}.`);
    },
  });
}

function snapshotName() {
  const now = new Date();
  const two = (value) => String(value).padStart(2, '0');
  return `ui-${now.getFullYear()}${two(now.getMonth() + 1)}${two(now.getDate())}-${two(now.getHours())}${two(now.getMinutes())}${two(now.getSeconds())}`;
}

function snapshotVolume(volume, context) {
  formDialog({
    id: 'snapshot-volume',
    title: `Snapshot ${volume.name}`,
    submit: 'Take snapshot',
    fields: [{ name: 'name', label: 'Snapshot name', required: true, value: snapshotName() }],
    onSubmit: async (values) => {
      const snapshot = await post(`/volumes/${segment(volume.name)}/snapshots`, { name: values.name.trim() });
      done(context, `Snapshot ${snapshot.name} of ${volume.name} taken (${snapshot.state}).`);
    },
  });
}

function rollbackVolume(volume, snapshots, chosen, context) {
  formDialog({
    id: 'rollback-volume',
    title: `Roll ${volume.name} back?`,
    message: `Every write to ${volume.name} since the snapshot is lost, on every replica. The volume must be detached.`,
    submit: 'Roll back',
    danger: true,
    fields: [{
      name: 'snapshot', label: 'To snapshot', type: 'select', required: true, value: chosen ?? snapshots[snapshots.length - 1].name,
      options: [...snapshots].reverse().map((snapshot) => ({
        value: snapshot.name, label: `${snapshot.name} (${new Date(snapshot.created_unix_seconds * 1000).toLocaleString()})`,
      })),
    }],
    onSubmit: async (values) => {
      const rolled = await post(`/volumes/${segment(volume.name)}/rollback`, { snapshot: values.snapshot });
      done(context, `Volume ${rolled.name} rolled back to ${values.snapshot}.`);
    },
  });
}

function verifyVolume(volume, context) {
  post(`/volumes/${segment(volume.name)}/verify`)
    .then((report) => done(context, `Verify of ${volume.name} ${report.state === 'running' ? 'started' : report.state}: it compares every block of ${report.replicas.join(', ')}.`))
    .catch((failure) => notify(`Verify of ${volume.name} refused: ${failure.message}`, 'error'));
}

function addReplica(state, volume, context) {
  const holding = new Set(volume.replicas.filter((replica) => replica.kind === 'diskful').map((replica) => replica.node));
  const candidates = state.nodes.filter((node) => node.state === 'online' && !holding.has(node.name));
  formDialog({
    id: 'add-replica',
    title: `Add a replica of ${volume.name}`,
    message: 'The new replica is empty: it is outdated until the primary has copied the data to it (the resync shows in Replicas).',
    submit: 'Add replica',
    fields: [
      {
        name: 'node', label: 'On node', type: 'select', value: '',
        options: [{ value: '', label: 'where the volume\'s group places it' }, ...candidates.map((node) => ({ value: node.name, label: node.name }))],
      },
      { name: 'pool', label: 'Pool', placeholder: 'the node\'s pool with the most free space' },
    ],
    onSubmit: async (values) => {
      const body = {};
      if (values.node) body.node = values.node;
      if (values.pool.trim()) body.pool = values.pool.trim();
      const changed = await post(`/volumes/${segment(volume.name)}/replicas`, body);
      const added = changed.replicas.filter((replica) => replica.kind === 'diskful' && !holding.has(replica.node)).map((replica) => replica.node);
      done(context, `${volume.name}: new replica on ${added.join(', ') || 'another node'}; it is outdated until the data is copied to it.`);
    },
  });
}

function removeReplica(volume, replica, context) {
  const primary = volume.primaries.includes(replica.node);
  formDialog({
    id: 'remove-replica',
    title: `Remove the replica of ${volume.name} on ${replica.node}?`,
    message: `Its copy of the data on ${replica.node} is deleted; the volume keeps ${volume.replicas.filter((r) => r.kind === 'diskful').length - 1} diskful replica(s). ` +
      (primary ? `${replica.node} stays attached and serves the volume through the other replicas. ` : '') +
      'The node refuses if it is the last up-to-date copy or the volume would lose its quorum.',
    submit: 'Remove replica',
    danger: true,
    fields: [],
    onSubmit: async () => {
      await del(`/volumes/${segment(volume.name)}/replicas/${segment(replica.node)}`);
      done(context, `${volume.name}: the replica on ${replica.node} is removed.`);
    },
  });
}

function deleteVolume(volume, snapshots, context) {
  typedConfirmDialog({
    id: 'delete-volume',
    title: `Delete volume ${volume.name}?`,
    message: `Its data (${bytes(volume.size_bytes)}) is deleted on every replica, for good.` +
      (volume.primaries.length ? ` It is attached on ${volume.primaries.join(', ')}: the node refuses until it is detached.` : ''),
    name: volume.name,
    what: 'volume',
    confirm: 'Delete volume',
    extraFields: snapshots.length
      ? [{ name: 'with_snapshots', label: `Delete its ${snapshots.length} snapshot(s) too`, type: 'checkbox', hint: 'without it, a volume with snapshots is refused' }]
      : [],
    onConfirm: async (values) => {
      const query = values.with_snapshots ? '?with_snapshots=true' : '';
      const { status } = await del(`/volumes/${segment(volume.name)}${query}`);
      location.hash = '#/volumes';
      done(context, status === 202
        ? `Volume ${volume.name} is being deleted: a node holding a replica has not removed its copy yet (offline?); it is gone once it has.`
        : `Volume ${volume.name} deleted.`);
    },
  });
}
