// Parts several pages draw: panels, the I/O charts with their span
// chooser, the provisioned figure with its over-commit flag, events.

import { h, bytes, rate, iops, badge, percent } from './dom.js';
import { lineChart, binaryCeiling, SPANS } from './chart.js';
import { chartSamples, chartSpan, setChartSpan } from './history.js';
import { overcommitted } from './space.js';

export function section(title, panel, ...children) {
  return h('section', { class: 'panel', dataset: { panel } }, h('h2', {}, title), children);
}

/** "X provisioned (N%)", flagged when it is more than the capacity. */
export function provisionedLine(provisioned, capacity, where = '') {
  const over = overcommitted(provisioned, capacity);
  return h('span', { class: over ? 'provisioned overcommitted' : 'provisioned', dataset: { overcommitted: over } },
    `${bytes(provisioned)} provisioned${where ? ` ${where}` : ''} (${percent(provisioned, capacity)} of the capacity)`,
    over ? [' ', h('span', { class: 'badge badge-overcommitted', title: 'Thin volumes may grow to their size: written in full, they would not fit.' }, 'over-committed')] : null);
}

/** The page's live samples for a history key. */
function liveSamples(io, key) {
  if (key === 'cluster') return io.cluster;
  const name = key.slice(key.indexOf(':') + 1);
  return key.startsWith('volume:') ? io.volumes.get(name) : io.nodes.get(name);
}

/** Buttons that choose the charts' span; the charts are drawn again. */
function spanChooser(context) {
  return h('div', { class: 'spans', role: 'group', 'aria-label': 'time span' },
    SPANS.map(([label, ms]) => h('button', {
      class: `small ${ms === chartSpan() ? 'primary' : 'secondary'}`,
      dataset: { span: label },
      'aria-pressed': String(ms === chartSpan()),
      onclick: () => {
        setChartSpan(ms);
        context.render();
      },
    }, label)));
}

/**
 * The I/O charts of the history `key` ('cluster', 'node:NAME',
 * 'volume:NAME'): the node's last hour, then the page's own samples.
 */
export function ioCharts(state, key, context) {
  const io = state.io;
  const entry = state.history.get(key);
  if (io.available === false && entry?.available !== true) {
    return h('p', { class: 'unavailable' }, `I/O rates: ${io.message ?? 'not available on this node'}.`);
  }
  const samples = chartSamples(entry, liveSamples(io, key));
  if (samples.length === 0) {
    return h('p', { class: 'muted' }, io.message ?? entry?.message ?? 'Waiting for the first sample…');
  }
  const missingNodes = [...new Set([...io.missingNodes, ...(entry?.missing ?? [])])];
  const missing = missingNodes.length
    ? h('p', { class: 'warning' }, `No rates from ${missingNodes.join(', ')}: the figures leave them out.`)
    : null;
  const spanMs = chartSpan();
  return [
    spanChooser(context),
    missing,
    h('div', { class: 'charts', dataset: { chart: key } },
      lineChart({
        title: 'Operations per second',
        samples,
        spanMs,
        format: iops,
        series: [
          { key: 'read_iops', label: 'read', className: 'read' },
          { key: 'write_iops', label: 'write', className: 'write' },
        ],
      }),
      lineChart({
        title: 'Throughput',
        samples,
        spanMs,
        format: rate,
        top: binaryCeiling,
        series: [
          { key: 'read_bytes_per_sec', label: 'read', className: 'read' },
          { key: 'write_bytes_per_sec', label: 'write', className: 'write' },
        ],
      })),
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
