// Small DOM and formatting helpers. Every text goes in through
// textContent (never innerHTML), so a name from the API is shown, not run.

/** Makes an element: h('td', {class: 'x', dataset: {node: 'n1'}}, 'text', child). */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElementNS(
    tag === 'svg' || attributes.svg ? 'http://www.w3.org/2000/svg' : 'http://www.w3.org/1999/xhtml',
    tag,
  );
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false || key === 'svg') continue;
    if (key === 'dataset') {
      for (const [name, data] of Object.entries(value)) {
        if (data !== undefined && data !== null) element.dataset[name] = String(data);
      }
    } else if (key === 'style') {
      // Through the CSSOM: the page's CSP refuses style attributes.
      Object.assign(element.style, value);
    } else if (key.startsWith('on') && typeof value === 'function') {
      element.addEventListener(key.slice(2), value);
    } else {
      element.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(element, children);
  return element;
}

/** An SVG element (h with the SVG namespace). */
export function s(tag, attributes = {}, ...children) {
  return h(tag, { ...attributes, svg: true }, ...children);
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces an element's children. */
export function replace(element, ...children) {
  element.replaceChildren();
  append(element, children);
}

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Bytes as the CLI prints them (`format_size`): 1024-based, one decimal. */
export function bytes(value) {
  if (value === undefined || value === null) return '–';
  let scaled = Number(value);
  let unit = 0;
  while (scaled >= 1024 && unit + 1 < UNITS.length) {
    scaled /= 1024;
    unit += 1;
  }
  if (unit === 0) return `${value} B`;
  return Number.isInteger(scaled) ? `${scaled} ${UNITS[unit]}` : `${scaled.toFixed(1)} ${UNITS[unit]}`;
}

/** A rate: `12.5 MiB/s`. */
export function rate(bytesPerSecond) {
  return `${bytes(Math.round(bytesPerSecond))}/s`;
}

/** Operations per second, short. */
export function iops(value) {
  if (value >= 10000) return `${(value / 1000).toFixed(1)}k`;
  return value >= 100 ? value.toFixed(0) : value.toFixed(1);
}

const SHIFTS = { K: 10, M: 20, G: 30, T: 40, P: 50 };

/**
 * A size as people write it (`512M`, `1.5G`, `64KiB`, `4096`), like the
 * CLI's parse_size; throws with the reason.
 */
export function parseSize(text) {
  const match = /^\s*(\d+)(?:\.(\d+))?\s*([KMGTP])?(i?B)?\s*$/i.exec(text);
  if (!match || (match[4] && match[4].toUpperCase() === 'IB' && !match[3])) {
    throw new Error(`"${text}" is not a size: write e.g. 512M, 1.5G or 4096`);
  }
  const shift = match[3] ? SHIFTS[match[3].toUpperCase()] : 0;
  const whole = BigInt(match[1]) << BigInt(shift);
  const fraction = match[2]
    ? (BigInt(match[2]) << BigInt(shift)) / 10n ** BigInt(match[2].length)
    : 0n;
  const total = whole + fraction;
  if (total > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`${text} is too large`);
  return Number(total);
}

/** `3 s`, `5 min`, `2 h`, `4 d`. */
export function duration(seconds) {
  if (seconds < 90) return `${seconds} s`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min`;
  if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

/** A coloured word for a state: online, offline, ready, degraded... */
export function badge(word, extraClass = '') {
  const kind = String(word).split(/[\s(]/)[0].replace(/[^A-Za-z_-]/g, '');
  return h('span', { class: `badge badge-${kind} ${extraClass}`.trim() }, word);
}

/**
 * A bar of `used` out of `total`, its label beside it (never on top of
 * the fill, where a long label ran into the next column).
 */
export function bar(used, total, label) {
  const percent = total > 0 ? Math.min(100, Math.round((used / total) * 100)) : 0;
  const level = percent >= 90 ? 'full' : percent >= 75 ? 'high' : 'ok';
  return h('div', { class: 'meter', title: label },
    h('div', { class: 'bar', role: 'meter', 'aria-valuenow': percent, 'aria-valuemin': 0, 'aria-valuemax': 100, 'aria-label': label },
      h('div', { class: `bar-fill bar-${level}`, style: { width: `${percent}%` } })),
    h('span', { class: 'bar-label' }, label ?? `${percent}%`));
}

/** A percentage for people: `644%`, `0.4%`. */
export function percent(part, whole) {
  if (!(whole > 0)) return '–';
  const value = (part / whole) * 100;
  return value >= 10 || value === 0 ? `${Math.round(value)}%` : `${value.toFixed(1)}%`;
}
