// A line chart in SVG, drawn here: a few series over the chosen span, a
// y axis from 0 to a rounded maximum, and the time span below.

import { s, h } from './dom.js';

const WIDTH = 600;
const HEIGHT = 150;
const LEFT = 64;
const BOTTOM = 18;
const TOP = 8;

/** The spans a chart can show, [label, ms]; the node keeps an hour. */
export const SPANS = [['5 min', 5 * 60_000], ['15 min', 15 * 60_000], ['1 h', 60 * 60_000]];
export const DEFAULT_SPAN_MS = 15 * 60_000;

/**
 * A "nice" ceiling for the y axis: 1, 2 or 5 times a power of ten, and at
 * least 1: below that, half the top (0.05) prints as the top (0.1).
 */
function ceiling(value) {
  if (!(value > 1)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

/**
 * For byte rates: a power of two, so the axis reads 64 MiB/s, 32 MiB/s,
 * and at least 1 KiB/s: below that, half the top (0.5 B/s) would print
 * as the top itself, "1 B/s" twice on an idle chart.
 */
export function binaryCeiling(value) {
  const FLOOR = 1024;
  return value > FLOOR ? 2 ** Math.ceil(Math.log2(value)) : FLOOR;
}

/**
 * samples: [{time: ms, values: {key: number}}], oldest first.
 * series: [{key, label, className}]; format: number -> axis text;
 * top: the axis' maximum for the largest value [default: 1, 2 or 5 × 10^n].
 */
export function lineChart({ title, samples, series, format, spanMs, top = ceiling }) {
  const now = samples.length ? samples[samples.length - 1].time : Date.now();
  const span = spanMs ?? DEFAULT_SPAN_MS;
  const shown = samples.filter((sample) => sample.time >= now - span);
  const peak = Math.max(0, ...shown.flatMap((sample) => series.map((one) => sample.values[one.key] ?? 0)));
  const maximum = top(peak);
  const x = (time) => LEFT + ((time - (now - span)) / span) * (WIDTH - LEFT);
  const y = (value) => TOP + (1 - value / maximum) * (HEIGHT - TOP - BOTTOM);
  const grid = [maximum, maximum / 2, 0].map((value) =>
    s('g', { class: 'grid' },
      s('line', { x1: LEFT, x2: WIDTH, y1: y(value), y2: y(value) }),
      s('text', { x: LEFT - 6, y: y(value) + 4, 'text-anchor': 'end' }, format(value)),
    ),
  );
  const lines = series.map((one) => {
    const points = shown.map((sample) => `${x(sample.time).toFixed(1)},${y(sample.values[one.key] ?? 0).toFixed(1)}`);
    return s('polyline', { class: `line ${one.className}`, points: points.join(' '), dataset: { series: one.key } });
  });
  const svg = s(
    'svg',
    {
      viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: 'chart', role: 'img', 'aria-label': title,
      // What is drawn, for a reader of the DOM (and the browser test).
      dataset: { samples: shown.length, oldest: shown[0]?.time, peak },
    },
    grid,
    lines,
    s('text', { class: 'axis', x: LEFT, y: HEIGHT - 4 }, `−${Math.round(span / 60000)} min`),
    s('text', { class: 'axis', x: WIDTH, y: HEIGHT - 4, 'text-anchor': 'end' }, 'now'),
  );
  const latest = samples[samples.length - 1]?.values ?? {};
  const legend = h(
    'div',
    { class: 'legend' },
    series.map((one) =>
      h('span', { class: `key ${one.className}` }, `${one.label} ${format(latest[one.key] ?? 0)}`),
    ),
  );
  return h('figure', { class: 'chart-box' }, h('figcaption', {}, title), svg, legend);
}
