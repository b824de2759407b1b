// The dashboard: polls the node's API every POLL_MS, fetches the I/O
// history the page charts, and draws the page the URL's fragment names
// (#/, #/nodes, #/nodes/NAME, #/pools, #/pools/NODE/POOL, #/volumes,
// #/volumes/NAME, #/events).

import { get, segment, onUnauthorized, setToken, forgetToken, token } from './api.js';
import { h, replace, badge } from './dom.js';
import { tokenDialog } from './dialogs.js';
import { renderPage, PAGES } from './pages.js';
import { pick, historyKey, pollHistory } from './history.js';

/** A node killed shows offline within OFFLINE_AFTER (3 s) plus one poll. */
const POLL_MS = 2000;
/**
 * The page's own samples kept per chart: 5 minutes at one every 2 s.
 * They follow the node's history (history.js), or stand in for it on a
 * node without one.
 */
const HISTORY_SAMPLES = 150;
/** Events kept in the page; older ones are dropped. */
const EVENTS_KEPT = 500;
const EVENTS_PAGE = 100;
/** Pages of events read in one poll, so a huge backlog cannot stall it. */
const EVENT_PAGES_PER_POLL = 5;

const state = {
  status: null,
  nodes: [],
  volumes: [],
  snapshots: [],
  /** node name -> GET /nodes/{name} (its pools) */
  nodeDetails: new Map(),
  io: { available: null, message: null, latest: null, cluster: [], volumes: new Map(), nodes: new Map(), missingNodes: [] },
  /** 'cluster' | 'node:NAME' | 'volume:NAME' -> the node's I/O history (history.js) */
  history: new Map(),
  /** API path -> {value} or {error}: what the current page shows beyond the lists */
  extra: new Map(),
  events: { available: null, message: null, list: [], lastSeq: null },
  /** Why the last poll failed (the node is unreachable...), or null. */
  error: null,
  updated: null,
  needToken: false,
};

let polling = false;
let pollAgain = false;
let timer = null;

/** Polls now (after an action), and then every POLL_MS again. */
async function refresh() {
  if (polling) {
    pollAgain = true;
    return;
  }
  polling = true;
  clearTimeout(timer);
  try {
    do {
      pollAgain = false;
      await poll();
    } while (pollAgain);
  } finally {
    polling = false;
    render();
    if (!state.needToken) timer = setTimeout(refresh, POLL_MS);
  }
}

async function poll() {
  const [status, nodes, volumes, snapshots] = await Promise.allSettled([
    get('/status'),
    get('/nodes'),
    get('/volumes'),
    get('/snapshots'),
  ]);
  const failed = [status, nodes, volumes, snapshots].find((result) => result.status === 'rejected');
  if (failed) {
    state.error = failed.reason;
    if (failed.reason.unauthorized) state.needToken = true;
    return;
  }
  state.error = null;
  state.needToken = false;
  state.status = status.value;
  state.nodes = nodes.value;
  state.volumes = volumes.value;
  state.snapshots = snapshots.value;
  state.updated = new Date();
  const route = currentRoute();
  await Promise.all([pollNodeDetails(), pollIo(), pollEvents(), pollHistory(state, historyKey(route)), pollExtras(route)]);
}

/** The API paths the page of `route` shows beyond the lists of every poll. */
function extraPaths(route) {
  const [page, name, pool] = route;
  if (page === 'volumes' && name) {
    const paths = [`/volumes/${segment(name)}/snapshot-schedule`];
    const volume = state.volumes.find((candidate) => candidate.name === name);
    if (volume?.primaries.length) paths.push(`/volumes/${segment(name)}/verify`);
    return paths;
  }
  // A pool's own figures come from its node only: the node serving the page.
  if (page === 'pools' && pool && name === state.status?.this_node) return [`/pools/${segment(pool)}`];
  return [];
}

async function pollExtras(route) {
  const paths = extraPaths(route);
  const results = await Promise.allSettled(paths.map((path) => get(path)));
  const fresh = new Map();
  paths.forEach((path, index) => {
    const result = results[index];
    fresh.set(path, result.status === 'fulfilled' ? { value: result.value } : { error: result.reason });
  });
  state.extra = fresh;
}

async function pollNodeDetails() {
  const details = await Promise.allSettled(
    state.nodes.map((node) => get(`/nodes/${encodeURIComponent(node.name)}`)),
  );
  const fresh = new Map();
  details.forEach((result, index) => {
    const name = state.nodes[index].name;
    if (result.status === 'fulfilled') fresh.set(name, result.value);
    else if (state.nodeDetails.has(name)) fresh.set(name, state.nodeDetails.get(name));
  });
  state.nodeDetails = fresh;
}

function keep(list, limit) {
  if (list.length > limit) list.splice(0, list.length - limit);
}

async function pollIo() {
  try {
    const io = await get('/io');
    const time = Date.now();
    state.io.available = true;
    state.io.message = null;
    state.io.latest = io;
    // Names, or objects naming a node: shown either way.
    state.io.missingNodes = (io.missing_nodes ?? []).map((missing) =>
      typeof missing === 'string' ? missing : missing?.node ?? missing?.name ?? JSON.stringify(missing));
    state.io.cluster.push({ time, values: pick(io) });
    keep(state.io.cluster, HISTORY_SAMPLES);
    const perVolume = sumBy(io.volumes ?? [], (entry) => entry.volume);
    const perNode = sumBy(io.volumes ?? [], (entry) => entry.node);
    sample(state.io.volumes, state.volumes.map((volume) => volume.name), perVolume, time);
    sample(state.io.nodes, state.nodes.map((node) => node.name), perNode, time);
  } catch (failure) {
    state.io.available = failure.endpointMissing ? false : state.io.available;
    state.io.message = failure.endpointMissing ? 'not available on this node' : failure.message;
  }
}

/** The rates of /io's entries added up by `keyOf` (volume or node). */
function sumBy(entries, keyOf) {
  const sums = new Map();
  for (const entry of entries) {
    const sum = sums.get(keyOf(entry)) ?? pick({});
    for (const [key, value] of Object.entries(pick(entry))) sum[key] += value;
    sums.set(keyOf(entry), sum);
  }
  return sums;
}

/** Appends a sample to each name's series; forgets names that are gone. */
function sample(series, names, sums, time) {
  for (const name of names) {
    const history = series.get(name) ?? [];
    history.push({ time, values: sums.get(name) ?? pick({}) });
    keep(history, HISTORY_SAMPLES);
    series.set(name, history);
  }
  for (const name of [...series.keys()]) {
    if (!names.includes(name)) series.delete(name);
  }
}

async function pollEvents() {
  try {
    for (let page = 0; page < EVENT_PAGES_PER_POLL; page += 1) {
      const after = state.events.lastSeq === null ? '' : `&after=${state.events.lastSeq}`;
      const answer = await get(`/events?limit=${EVENTS_PAGE}${after}`);
      const events = answer?.events ?? [];
      state.events.available = true;
      state.events.message = null;
      const fresh = events.filter((event) => state.events.lastSeq === null || event.seq > state.events.lastSeq);
      state.events.list.push(...fresh);
      keep(state.events.list, EVENTS_KEPT);
      if (fresh.length) state.events.lastSeq = Math.max(...fresh.map((event) => event.seq));
      if (events.length < EVENTS_PAGE) break;
    }
  } catch (failure) {
    state.events.available = failure.endpointMissing ? false : state.events.available;
    state.events.message = failure.endpointMissing ? 'not available on this node' : failure.message;
  }
}

function currentRoute() {
  const path = decodeURIComponent(location.hash.replace(/^#/, '')) || '/';
  return path.split('/').filter(Boolean);
}

function render() {
  renderHeader();
  renderBanner();
  const route = currentRoute();
  for (const link of document.querySelectorAll('nav a')) {
    link.classList.toggle('current', link.dataset.page === (route[0] ?? ''));
  }
  renderPage(document.getElementById('main'), route, state, { refresh, render });
}

function renderHeader() {
  const status = state.status;
  replace(
    document.getElementById('cluster'),
    status
      ? [
          badge(status.health, 'health'),
          h('span', { class: 'cluster-id', title: 'cluster id' }, status.cluster_id),
          h('span', {}, `served by ${status.this_node}`),
          h('span', {}, `leader ${status.leader ?? 'none'}`),
        ]
      : 'connecting…',
  );
  replace(
    document.getElementById('session'),
    state.updated ? h('span', { class: 'updated' }, `updated ${state.updated.toLocaleTimeString()}`) : null,
    token()
      ? h('button', {
          class: 'secondary small',
          dataset: { action: 'forget-token' },
          onclick: () => {
            forgetToken();
            refresh();
          },
        }, 'Forget token')
      : null,
  );
}

function renderBanner() {
  const banner = document.getElementById('banner');
  const error = state.error;
  if (!error || error.unauthorized) {
    banner.hidden = true;
    return;
  }
  banner.hidden = false;
  const since = state.updated ? ` Showing what it said at ${state.updated.toLocaleTimeString()}.` : '';
  replace(banner, `${error.message}.${since} Retrying every ${POLL_MS / 1000} s.`);
}

onUnauthorized((error) => {
  const refused = error.tokenSent;
  if (refused) forgetToken();
  state.needToken = true;
  tokenDialog({
    reason: error.message,
    refused,
    onToken: (value) => {
      setToken(value);
      state.needToken = false;
      refresh();
    },
  });
});

// A new page may chart another history: fetch it now, not at the next poll.
window.addEventListener('hashchange', () => {
  render();
  refresh();
});
document.getElementById('nav').replaceChildren(
  ...PAGES.map(([page, label]) => h('a', { href: `#/${page}`, dataset: { page } }, label)),
);
refresh();
