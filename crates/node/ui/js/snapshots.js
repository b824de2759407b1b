// A volume's snapshots panel and its actions: roll back, clone, delete,
// and the snapshot schedule (`trireme snapshot schedule`). Roll back and
// delete lose something: each asks for a confirmation first.

import { h, bytes, badge } from './dom.js';
import { post, put, del, segment } from './api.js';
import { formDialog, notify } from './dialogs.js';

function button(label, action, onclick, className = 'secondary small') {
  return h('button', { class: className, dataset: { action }, onclick }, label);
}

function done(context, message) {
  notify(message);
  context.refresh();
}

const UNIT_SECONDS = { s: 1, m: 60, min: 60, h: 3600, d: 86400, w: 604800 };
/** The shortest interval a schedule takes (the node refuses less). */
const SCHEDULE_MIN_SECONDS = 10;

/** `15m`, `1h`, `1d`, `90s` as the CLI's --every takes them, in seconds. */
export function parseInterval(text) {
  const match = /^\s*(\d+)\s*(s|m|min|h|d|w)\s*$/i.exec(text);
  if (!match) throw new Error(`"${text}" is not an interval: write e.g. 15m, 1h or 1d`);
  const seconds = Number(match[1]) * UNIT_SECONDS[match[2].toLowerCase()];
  if (seconds < SCHEDULE_MIN_SECONDS) throw new Error(`${text} is too often: at least every ${SCHEDULE_MIN_SECONDS}s`);
  return seconds;
}

/** Seconds as the shortest whole unit: `1h`, `15m`, `45s`. */
export function interval(seconds) {
  for (const [unit, size] of [['d', 86400], ['h', 3600], ['m', 60]]) {
    if (seconds % size === 0) return `${seconds / size}${unit}`;
  }
  return `${seconds}s`;
}

function scheduleText(schedule) {
  if (!schedule) return 'Loading…';
  if (schedule.error) return `Schedule: ${schedule.error.message}`;
  const { every_secs: every, keep } = schedule.value;
  return every ? `A snapshot every ${interval(every)}, keeping the newest ${keep}.` : 'No schedule.';
}

/** The panel: the snapshot table, and the schedule with its buttons. */
export function snapshotsPanel(volume, snapshots, schedule, context, rollback) {
  const scheduled = Boolean(schedule?.value?.every_secs);
  return h('section', { class: 'panel', dataset: { panel: 'snapshots' } },
    h('div', { class: 'title-row' }, h('h2', {}, 'Snapshots'),
      h('div', { class: 'actions' },
        button(scheduled ? 'Change schedule' : 'Schedule', 'schedule', () => setSchedule(volume, schedule?.value, context)),
        scheduled ? button('Stop schedule', 'unschedule', () => stopSchedule(volume, context)) : null)),
    h('p', { class: 'muted', dataset: { schedule: scheduled ? `${schedule.value.every_secs}/${schedule.value.keep}` : 'none' } },
      scheduleText(schedule)),
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
            h('td', { class: 'row-actions' },
              button('Clone', 'clone', () => cloneSnapshot(volume, snapshot, context)),
              button('Roll back', 'rollback-to', () => rollback(snapshot.name), 'danger small'),
              button('Delete', 'delete-snapshot', () => deleteSnapshot(volume, snapshot, context), 'danger small')))))));
}

function cloneSnapshot(volume, snapshot, context) {
  formDialog({
    id: 'clone-snapshot',
    title: `Clone ${volume.name}@${snapshot.name}`,
    message: 'A new volume with the snapshot\'s content, sharing its chunks until either is written; on the nodes holding the snapshot.',
    submit: 'Clone',
    fields: [
      { name: 'name', label: 'New volume', required: true, placeholder: `${volume.name}-clone` },
      { name: 'group', label: 'Resource group', value: volume.group, hint: `where its replicas go [default: ${volume.group}, the volume's]` },
    ],
    onSubmit: async (values) => {
      const body = { name: values.name.trim() };
      const group = values.group.trim();
      if (group && group !== volume.group) body.group = group;
      const clone = await post(`/volumes/${segment(volume.name)}/snapshots/${segment(snapshot.name)}/clone`, body);
      done(context, `Volume ${clone.name} cloned from ${volume.name}@${snapshot.name} (${bytes(clone.size_bytes)}, ${clone.state}).`);
    },
  });
}

function deleteSnapshot(volume, snapshot, context) {
  formDialog({
    id: 'delete-snapshot',
    title: `Delete snapshot ${volume.name}@${snapshot.name}?`,
    message: `Its content is gone for good; its own ${bytes(snapshot.exclusive_bytes)} are given back on each node holding it. Clones made from it keep their data.`,
    submit: 'Delete snapshot',
    danger: true,
    fields: [],
    onSubmit: async () => {
      const { status } = await del(`/volumes/${segment(volume.name)}/snapshots/${segment(snapshot.name)}`);
      done(context, status === 202
        ? `Snapshot ${volume.name}@${snapshot.name} is being deleted; a node holding it removes it when it is back online.`
        : `Snapshot ${volume.name}@${snapshot.name} deleted.`);
    },
  });
}

function setSchedule(volume, current, context) {
  formDialog({
    id: 'snapshot-schedule',
    title: `Snapshot schedule of ${volume.name}`,
    message: 'Scheduled snapshots are named auto-YYYYMMDD-HHMMSS (UTC); beyond the number kept, the oldest scheduled ones are deleted. Snapshots taken by hand are never deleted by the schedule.',
    submit: 'Set schedule',
    fields: [
      { name: 'every', label: 'Every', required: true, value: current?.every_secs ? interval(current.every_secs) : '1h', hint: 'e.g. 15m, 1h, 1d (at least 10s)' },
      { name: 'keep', label: 'Keep', type: 'number', required: true, value: current?.keep ?? 24 },
    ],
    onSubmit: async (values) => {
      const keep = Number(values.keep);
      if (!Number.isInteger(keep) || keep < 1) throw new Error(`keep must be a whole number of snapshots, 1 or more (not "${values.keep}")`);
      const schedule = await put(`/volumes/${segment(volume.name)}/snapshot-schedule`, { every_secs: parseInterval(values.every), keep });
      done(context, `${volume.name}: a snapshot every ${interval(schedule.every_secs)}, keeping ${schedule.keep}; the first one in ${interval(schedule.every_secs)}.`);
    },
  });
}

async function stopSchedule(volume, context) {
  try {
    await del(`/volumes/${segment(volume.name)}/snapshot-schedule`);
    done(context, `${volume.name}: no snapshot schedule any more; its snapshots stay.`);
  } catch (failure) {
    notify(`Stopping the schedule of ${volume.name} failed: ${failure.message}`, 'error');
  }
}
