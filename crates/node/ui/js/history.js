// I/O history for the charts. The nodes keep the last hour at 10 s
// (GET /api/v1/io/history, docs/dashboard.md), so a chart opens full;
// the page's own 2 s samples of /api/v1/io follow the newest of the
// node's, so it stays live between two fetches of the history.

import { get, segment } from './api.js';
import { DEFAULT_SPAN_MS } from './chart.js';

/** The history is fetched again after this long: its resolution. */
const REFETCH_MS = 10_000;

let spanMs = DEFAULT_SPAN_MS;

/** The span the charts show (5 min, 15 min, 1 h). */
export function chartSpan() {
  return spanMs;
}

export function setChartSpan(value) {
  spanMs = value;
}

/** A sample's four rates, as numbers (0 when missing). */
export function pick(sample) {
  return {
    read_iops: Number(sample.read_iops ?? 0),
    write_iops: Number(sample.write_iops ?? 0),
    read_bytes_per_sec: Number(sample.read_bytes_per_sec ?? 0),
    write_bytes_per_sec: Number(sample.write_bytes_per_sec ?? 0),
  };
}

/** The history a page charts: 'cluster', 'node:NAME', 'volume:NAME' or null. */
export function historyKey(route) {
  const [page, name, ...rest] = route;
  if (page === undefined) return 'cluster';
  if (page === 'volumes' && name && rest.length === 0) return `volume:${name}`;
  if (page === 'nodes' && name && rest.length === 0) return `node:${name}`;
  return null;
}

function query(key) {
  if (key === 'cluster') return '';
  const [kind, name] = [key.slice(0, key.indexOf(':')), key.slice(key.indexOf(':') + 1)];
  return `?${kind}=${segment(name)}`;
}

/** Fetches the history of `key` unless it was fetched in the last 10 s. */
export async function pollHistory(state, key) {
  if (!key) return;
  const entry = state.history.get(key) ?? { samples: [], fetched: 0, available: null, message: null, missing: [] };
  state.history.set(key, entry);
  if (entry.available !== null && Date.now() - entry.fetched < REFETCH_MS) return;
  entry.fetched = Date.now();
  try {
    const answer = await get(`/io/history${query(key)}`);
    // A sample covers its slot; it is drawn where the slot ends.
    const end = answer.resolution_seconds * 1000;
    entry.samples = answer.samples.map((sample) => ({ time: sample.unix_seconds * 1000 + end, values: pick(sample) }));
    entry.available = true;
    entry.message = null;
    entry.missing = answer.missing_nodes ?? [];
  } catch (failure) {
    entry.available = failure.endpointMissing ? false : entry.available;
    entry.message = failure.endpointMissing ? 'not available on this node' : failure.message;
  }
}

/** The node's samples, then the page's own ones that are newer. */
export function chartSamples(entry, live) {
  const kept = entry?.samples ?? [];
  const newest = kept.length ? kept[kept.length - 1].time : -Infinity;
  return [...kept, ...(live ?? []).filter((sample) => sample.time > newest)];
}
