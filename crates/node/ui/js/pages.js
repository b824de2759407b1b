// The pages: overview (cluster health), nodes, pools, events, and the
// page for an unknown fragment. Volumes are in volumes.js.

import { h, replace, bytes, rate, iops, duration, badge, bar } from './dom.js';
import { lineChart, binaryCeiling } from './chart.js';
import { volumesPage, volumePage } from './volumes.js';

/** [fragment, label] of the navigation, in order. */
export const PAGES = [
  ['', 'Overview'],
  ['nodes', 'Nodes'],
  ['pools', 'Pools'],
  ['volumes', 'Volumes'],
  ['events', 'Events'],
];

export function renderPage(main, route, state, context) {
  if (!state.status) {
    replace(main, h('p', { class: 'muted' }, state.needToken ? 'Waiting for the admin token…' : 'Loading…'));
    return;
  }
  const [page, name, ...rest] = route;
  let content;
  if (page === undefined) content = overviewPage(state);
  else if (page === 'nodes' && !name) content = nodesPage(state);
  else if (page === 'pools' && !name) content = poolsPage(state);
  else if (page === 'volumes' && !name) content = volumesPage(state, context);
  else if (page === 'volumes' && rest.length === 0) content = volumePage(state, name, context);
  else if (page === 'events' && !name) content = eventsPage(state);
  else content = notFoundPage(route);
  main.dataset.page = page ?? 'overview';
  replace(main, content);
}

function section(title, panel, ...children) {
  return h('section', { class: 'panel', dataset: { panel } }, h('h2', {}, title), children);
}

function overviewPage(state) {
  const status = state.status;
  const used = status.capacity_bytes - status.free_bytes;
  const counts = status.volumes;
  return [
    h('h1', {}, 'Cluster'),
    h('div', { class: 'cards' },
      card('Health', 'health', badge(status.health), status.warnings.length ? `${status.warnings.length} warning(s)` : 'no warnings'),
      card('Nodes', 'nodes', `${status.nodes.online} / ${status.nodes.total} online`,
        [status.nodes.offline ? `${status.nodes.offline} offline` : null, status.nodes.evicted ? `${status.nodes.evicted} evicted` : null]
          .filter(Boolean).join(', ') || 'all online'),
      card('Volumes', 'volumes', `${counts.total}`,
        [['ready', counts.ready], ['syncing', counts.syncing], ['degraded', counts.degraded], ['no quorum', counts.no_quorum],
          ['failed', counts.failed], ['creating', counts.creating], ['deleting', counts.deleting]]
          .filter(([, count]) => count > 0).map(([word, count]) => `${count} ${word}`).join(', ') || 'none yet'),
      card('Capacity', 'capacity', bar(used, status.capacity_bytes, `${bytes(used)} of ${bytes(status.capacity_bytes)} used`),
        `${bytes(status.provisioned_bytes)} provisioned in ${status.pools} pool(s)`),
    ),
    status.warnings.length
      ? section('Warnings', 'warnings', h('ul', { class: 'warnings' }, status.warnings.map((warning) => h('li', {}, warning))))
      : null,
    section('Cluster I/O', 'io', ioCharts(state.io, state.io.cluster, 'cluster')),
    section('Recent events', 'events', eventsTable(state.events, state.events.list.slice(-8))),
  ];
}

function card(title, name, value, detail) {
  return h('div', { class: 'card', dataset: { card: name } },
    h('h3', {}, title), h('div', { class: 'card-value' }, value), h('div', { class: 'muted' }, detail));
}

/** The I/O charts of a history, or why there are none. */
export function ioCharts(io, history, what) {
  if (io.available === false || (io.available === null && io.message)) {
    return h('p', { class: 'unavailable' }, `I/O rates: ${io.message ?? 'not available on this node'}.`);
  }
  if (!history || history.length === 0) return h('p', { class: 'muted' }, 'Waiting for the first sample…');
  const missing = io.missingNodes.length
    ? h('p', { class: 'warning' }, `No rates from ${io.missingNodes.join(', ')}: the figures leave them out.`)
    : null;
  return [
    missing,
    h('div', { class: 'charts', dataset: { chart: what } },
      lineChart({
        title: 'Operations per second',
        samples: history,
        format: iops,
        series: [
          { key: 'read_iops', label: 'read', className: 'read' },
          { key: 'write_iops', label: 'write', className: 'write' },
        ],
      }),
      lineChart({
        title: 'Throughput',
        samples: history,
        format: rate,
        top: binaryCeiling,
        series: [
          { key: 'read_bytes_per_sec', label: 'read', className: 'read' },
          { key: 'write_bytes_per_sec', label: 'write', className: 'write' },
        ],
      })),
  ];
}

function nodesPage(state) {
  return [
    h('h1', {}, 'Nodes'),
    h('table', { class: 'nodes' },
      h('thead', {}, h('tr', {}, ['Name', 'State', 'Role', 'API', 'NBD', 'Pools', 'Capacity', 'Free'].map((title) => h('th', {}, title)))),
      h('tbody', {}, state.nodes.map((node) =>
        h('tr', { dataset: { node: node.name, state: node.state } },
          h('td', { class: 'name' }, node.name),
          h('td', { class: 'state' }, badge(node.state), h('small', {}, ` for ${duration(node.state_seconds)}`)),
          h('td', {}, node.role),
          h('td', {}, node.api_address),
          h('td', {}, node.nbd_address ?? '–'),
          h('td', { class: 'number' }, node.pools),
          h('td', { class: 'number' }, bytes(node.capacity_bytes)),
          h('td', { class: 'number' }, bytes(node.free_bytes)))))),
  ];
}

function poolsPage(state) {
  const rows = [];
  for (const node of state.nodes) {
    const detail = state.nodeDetails.get(node.name);
    for (const pool of detail?.pool_list ?? []) {
      const used = pool.capacity_bytes - pool.free_bytes;
      rows.push(h('tr', {
        dataset: {
          pool: `${node.name}/${pool.name}`, capacity: pool.capacity_bytes, free: pool.free_bytes,
          state: pool.online ? 'online' : 'offline',
        },
      },
      h('td', {}, node.name, node.state === 'online' ? null : h('small', {}, ` (${node.state})`)),
      h('td', { class: 'name' }, pool.name),
      h('td', {}, pool.class),
      h('td', {}, badge(pool.online ? 'online' : 'offline')),
      h('td', { class: 'usage' }, bar(used, pool.capacity_bytes, `${bytes(used)} of ${bytes(pool.capacity_bytes)}`)),
      h('td', { class: 'number' }, bytes(pool.free_bytes))));
    }
  }
  return [
    h('h1', {}, 'Pools'),
    h('p', { class: 'muted' }, 'Capacity and free space as each node last reported them.'),
    rows.length
      ? h('table', { class: 'pools' },
          h('thead', {}, h('tr', {}, ['Node', 'Pool', 'Class', 'State', 'Used', 'Free'].map((title) => h('th', {}, title)))),
          h('tbody', {}, rows))
      : h('p', {}, 'No pool yet: add one with trireme pool create.'),
  ];
}

/** A table of events, newest first, or why there are none. */
export function eventsTable(events, list) {
  if (events.available === false || (events.available === null && events.message)) {
    return h('p', { class: 'unavailable' }, `Events: ${events.message ?? 'not available on this node'}.`);
  }
  if (list.length === 0) return h('p', { class: 'muted' }, events.available ? 'No events.' : 'Loading…');
  return h('table', { class: 'events' },
    h('thead', {}, h('tr', {}, ['Time', 'Kind', 'Node', 'Volume', 'By', 'What'].map((title) => h('th', {}, title)))),
    h('tbody', {}, [...list].reverse().map((event) =>
      h('tr', { dataset: { seq: event.seq, kind: event.kind } },
        h('td', { title: event.time }, new Date(event.time).toLocaleString()),
        h('td', {}, event.kind.replaceAll('_', ' ')),
        h('td', {}, event.node ?? ''),
        h('td', {}, event.volume ? h('a', { href: `#/volumes/${encodeURIComponent(event.volume)}` }, event.volume) : ''),
        h('td', {}, event.actor ?? ''),
        h('td', {}, event.message)))));
}

function eventsPage(state) {
  return [
    h('h1', {}, 'Events'),
    h('p', { class: 'muted' }, 'The cluster\'s event log, newest first (the last 500 seen by this page).'),
    section('Events', 'events', eventsTable(state.events, state.events.list)),
  ];
}

function notFoundPage(route) {
  return [
    h('h1', {}, 'No such page'),
    h('p', { dataset: { notFound: `#/${route.join('/')}` } },
      `The dashboard has no page #/${route.join('/')}. `, h('a', { href: '#/' }, 'Go to the overview'), '.'),
  ];
}
