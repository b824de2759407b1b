// The pages: overview (cluster health), nodes, events and the page for
// an unknown fragment. Volumes are in volumes.js, a node's page and the
// pools in nodes.js, the parts they share in widgets.js.

import { h, replace, bytes, duration, badge, bar } from './dom.js';
import { section, provisionedLine, ioCharts, eventsTable } from './widgets.js';
import { volumesPage, volumePage } from './volumes.js';
import { nodePage, poolsPage, poolPage } from './nodes.js';

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
  if (page === undefined) content = overviewPage(state, context);
  else if (page === 'nodes' && !name) content = nodesPage(state);
  else if (page === 'nodes' && rest.length === 0) content = nodePage(state, name, context);
  else if (page === 'pools' && !name) content = poolsPage(state);
  else if (page === 'pools' && rest.length === 1) content = poolPage(state, name, rest[0], context);
  else if (page === 'volumes' && !name) content = volumesPage(state, context);
  else if (page === 'volumes' && rest.length === 0) content = volumePage(state, name, context);
  else if (page === 'events' && !name) content = eventsPage(state);
  else content = notFoundPage(route);
  main.dataset.page = page ?? 'overview';
  replace(main, content);
}

function overviewPage(state, context) {
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
        provisionedLine(status.provisioned_bytes, status.capacity_bytes, `in ${status.pools} pool(s)`)),
    ),
    status.warnings.length
      ? section('Warnings', 'warnings', h('ul', { class: 'warnings' }, status.warnings.map((warning) => h('li', {}, warning))))
      : null,
    section('Cluster I/O', 'io', ioCharts(state, 'cluster', context)),
    section('Recent events', 'events', eventsTable(state.events, state.events.list.slice(-8))),
  ];
}

function card(title, name, value, detail) {
  return h('div', { class: 'card', dataset: { card: name } },
    h('h3', {}, title), h('div', { class: 'card-value' }, value), h('div', { class: 'muted' }, detail));
}

function nodesPage(state) {
  return [
    h('h1', {}, 'Nodes'),
    h('table', { class: 'nodes' },
      h('thead', {}, h('tr', {}, ['Name', 'State', 'Role', 'API', 'NBD', 'Pools', 'Capacity', 'Free'].map((title) => h('th', {}, title)))),
      h('tbody', {}, state.nodes.map((node) =>
        h('tr', { dataset: { node: node.name, state: node.state } },
          h('td', { class: 'name' }, h('a', { href: `#/nodes/${encodeURIComponent(node.name)}` }, node.name)),
          h('td', { class: 'state' }, badge(node.state), h('small', {}, ` for ${duration(node.state_seconds)}`)),
          h('td', {}, node.role),
          h('td', {}, node.api_address),
          h('td', {}, node.nbd_address ?? '–'),
          h('td', { class: 'number' }, node.pools),
          h('td', { class: 'number' }, bytes(node.capacity_bytes)),
          h('td', { class: 'number' }, bytes(node.free_bytes)))))),
  ];
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
