// The dashboard: polls the node's API every POLL_MS, keeps a short
// history for the charts, and draws the page the URL's fragment names
// (#/, #/nodes, #/pools, #/volumes, #/volumes/NAME, #/events).

import { get, onUnauthorized, setToken, forgetToken, token } from './api.js';
import { h, replace, badge } from './dom.js';
import { tokenDialog } from './dialogs.js';
import { renderPage, PAGES } from './pages.js';

/** A node killed shows offline within OFFLINE_AFTER (3 s) plus one poll. */
const POLL_MS = 2000;
/** Samples kept per chart: 5 minutes at one every 2 s. */
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
  io: { available: null, message: null, latest: null, cluster: [], volumes: new Map(), missingNodes: [] },
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
  await Promise.all([pollNodeDetails(), pollIo(), pollEvents()]);
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
    const perVolume = new Map();
    for (const entry of io.volumes ?? []) {
      const sum = perVolume.get(entry.volume) ?? { read_iops: 0, write_iops: 0, read_bytes_per_sec: 0, write_bytes_per_sec: 0 };
      for (const [key, value] of Object.entries(pick(entry))) sum[key] += value;
      perVolume.set(entry.volume, sum);
    }
    const names = new Set(state.volumes.map((volume) => volume.name));
    for (const name of names) {
      const history = state.io.volumes.get(name) ?? [];
      history.push({ time, values: perVolume.get(name) ?? pick({}) });
      keep(history, HISTORY_SAMPLES);
      state.io.volumes.set(name, history);
    }
    for (const name of [...state.io.volumes.keys()]) {
      if (!names.has(name)) state.io.volumes.delete(name);
    }
  } catch (failure) {
    state.io.available = failure.endpointMissing ? false : state.io.available;
    state.io.message = failure.endpointMissing ? 'not available on this node' : failure.message;
  }
}

function pick(sample) {
  return {
    read_iops: Number(sample.read_iops ?? 0),
    write_iops: Number(sample.write_iops ?? 0),
    read_bytes_per_sec: Number(sample.read_bytes_per_sec ?? 0),
    write_bytes_per_sec: Number(sample.write_bytes_per_sec ?? 0),
  };
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
  renderPage(document.getElementById('main'), route, state, { refresh });
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

window.addEventListener('hashchange', render);
document.getElementById('nav').replaceChildren(
  ...PAGES.map(([page, label]) => h('a', { href: `#/${page}`, dataset: { page } }, label)),
);
refresh();
