// The volumes list, one volume's page, and the actions on volumes:
// create, grow, attach, detach, snapshot, rollback. Detach and rollback
// cannot be undone from here: each asks for a confirmation first.

import { h, bytes, badge, bar, iops, rate, parseSize, duration } from './dom.js';
import { post, segment } from './api.js';
import { formDialog, notify } from './dialogs.js';
import { ioCharts, eventsTable } from './pages.js';

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
  const actions = h('div', { class: 'actions' },
    button('Grow', 'grow', () => growVolume(volume, context)),
    button('Attach', 'attach', () => attachVolume(state, volume, context)),
    volume.primaries.length ? button('Detach', 'detach', () => detachVolume(volume, context), 'danger') : null,
    button('Snapshot', 'snapshot', () => snapshotVolume(volume, context)),
    snapshots.length ? button('Roll back', 'rollback', () => rollbackVolume(volume, snapshots, null, context), 'danger') : null);
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
    h('section', { class: 'panel', dataset: { panel: 'replicas' } }, h('h2', {}, 'Replicas'),
      h('table', { class: 'replicas' },
        h('thead', {}, h('tr', {}, ['Node', 'Kind', 'Pool', 'State', 'Storage', 'Resync'].map((title) => h('th', {}, title)))),
        h('tbody', {}, volume.replicas.map((replica) =>
          h('tr', { dataset: { replica: replica.node, state: replica.state } },
            h('td', {}, replica.node),
            h('td', {}, replica.kind),
            h('td', {}, replica.pool ?? '–'),
            h('td', {}, badge(replica.state)),
            h('td', {}, replica.observed, replica.message ? h('small', { class: 'warning' }, ` ${replica.message}`) : null),
            h('td', { class: 'sync' }, syncCell(replica))))))),
    h('section', { class: 'panel', dataset: { panel: 'io' } }, h('h2', {}, 'I/O'),
      ioCharts(state.io, state.io.volumes.get(name), name)),
    h('section', { class: 'panel', dataset: { panel: 'snapshots' } }, h('h2', {}, 'Snapshots'),
      snapshots.length === 0 ? h('p', { class: 'muted' }, 'No snapshot.') :
        h('table', { class: 'snapshots' },
          h('thead', {}, h('tr', {}, ['Name', 'State', 'Taken', 'Size', 'Own bytes', 'On', ''].map((title) => h('th', {}, title)))),
          h('tbody', {}, snapshots.map((snapshot) =>
            h('tr', { dataset: { snapshot: snapshot.name, state: snapshot.state } },
              h('td', { class: 'name' }, snapshot.name, snapshot.scheduled ? h('small', {}, ' (scheduled)') : null),
              h('td', {}, badge(snapshot.state)),
              h('td', {}, new Date(snapshot.created_unix_seconds * 1000).toLocaleString()),
              h('td', { class: 'number' }, bytes(snapshot.size_bytes)),
              h('td', { class: 'number' }, bytes(snapshot.exclusive_bytes)),
              h('td', {}, snapshot.nodes.join(', ')),
              h('td', {}, button('Roll back', 'rollback-to', () => rollbackVolume(volume, snapshots, snapshot.name, context), 'danger small')))))),
    ),
    h('section', { class: 'panel', dataset: { panel: 'events' } }, h('h2', {}, 'Events'),
      eventsTable(state.events, state.events.list.filter((event) => event.volume === name).slice(-50))),
  ];
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
