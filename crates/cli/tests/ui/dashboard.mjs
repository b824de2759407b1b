// Drives trireme's web dashboard in headless Chromium (Debian's chromium,
// through playwright-core: no browser is downloaded). Started by
// crates/cli/tests/dashboard.rs, which runs a real three-node cluster:
//
//   TRIREME_UI_URL       a node that trusts loopback (http://127.0.0.1:P)
//   TRIREME_LOCKED_URL   a node of the same cluster run with --trust-loopback=false
//   TRIREME_TOKEN        the cluster's admin token
//   TRIREME_VOLUME       a volume attached on TRIREME_ATTACHED_ON
//   TRIREME_VICTIM       the node the Rust side kills when asked
//   TRIREME_IO_SINCE_MS  when the Rust side first wrote to TRIREME_VOLUME
//                        (ms since the epoch), before this script started
//   SCREENSHOT_DIR       where the screenshots go
//   CHROMIUM             the browser binary [default: /usr/bin/chromium]
//
// It checks that the pages show what the REST API says, changes the
// cluster through the page (and checks the change through the API: create,
// grow, snapshot, roll back, detach, attach, delete with the name typed,
// replica remove and add, verify, clone, snapshot delete, schedules, node
// labels, pool scan), that every change is sent as JSON, that charts open
// with the node's history and never print an axis label twice, asks
// the Rust side to SIGKILL a node ("kill NAME" on stdout, "killed" back on
// stdin) and checks the page shows it offline within 10 s, then checks the
// token prompt of the locked node and the 404 pages.

import { chromium } from 'playwright-core';
import assert from 'node:assert/strict';
import { createInterface } from 'node:readline';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set (this script is run by crates/cli/tests/dashboard.rs)`);
  return value;
};
const base = env('TRIREME_UI_URL');
const lockedBase = env('TRIREME_LOCKED_URL');
const adminToken = env('TRIREME_TOKEN');
const attachedVolume = env('TRIREME_VOLUME');
const attachedOn = env('TRIREME_ATTACHED_ON');
const victim = env('TRIREME_VICTIM');
const ioSinceMs = Number(env('TRIREME_IO_SINCE_MS'));
const screenshots = env('SCREENSHOT_DIR');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
/** The promise of the issue: a killed node shows offline within this. */
const OFFLINE_WITHIN_MS = 10_000;

mkdirSync(screenshots, { recursive: true });
const lines = createInterface({ input: process.stdin });
const stdinLines = lines[Symbol.asyncIterator]();

function step(text) {
  console.log(`step: ${text}`);
}

/** The REST API, as the CLI sees it (from loopback, no token needed on base). */
async function rest(path, init = {}) {
  const response = await fetch(`${base}/api/v1${path}`, init);
  const text = await response.text();
  return { status: response.status, json: text ? JSON.parse(text) : null };
}

async function restOk(path) {
  const { status, json } = await rest(path);
  assert.equal(status, 200, `GET ${path}: ${JSON.stringify(json)}`);
  return json;
}

/** A change through the API, as JSON (the setup of a step, not under test). */
async function restChange(method, path, body) {
  const { status, json } = await rest(path, {
    method, headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body ?? {}),
  });
  assert.ok(status >= 200 && status < 300, `${method} ${path}: ${status} ${JSON.stringify(json)}`);
  return json;
}

/** Polls `check` (an async function) until it is true, for at most `ms`. */
async function eventually(what, check, ms = 30_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const last = await check();
    if (last === true) return;
    if (Date.now() > deadline) throw new Error(`${what}: not so within ${ms / 1000} s (${JSON.stringify(last)})`);
    await new Promise((resolve) => setTimeout(resolve, 300));
  }
}

/** Every chart in the page: no y-axis label printed twice. */
async function assertAxisLabelsDistinct(page, where) {
  const charts = await page.locator('svg.chart').evaluateAll((svgs) =>
    svgs.map((svg) => [...svg.querySelectorAll('.grid text')].map((text) => text.textContent)));
  assert.ok(charts.length > 0, `${where}: charts shown`);
  for (const labels of charts) {
    assert.equal(new Set(labels).size, labels.length, `${where}: an axis label printed twice: ${labels.join(' | ')}`);
  }
}

const diskfulNodes = (volume) => volume.replicas.filter((replica) => replica.kind === 'diskful').map((replica) => replica.node).sort();

async function shot(page, name) {
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage: true });
}

const browser = await chromium.launch({
  executablePath: chromiumPath,
  headless: true,
  // Debian's chromium as root refuses to start without --no-sandbox; CI
  // machines have a small /dev/shm and no way out to the internet, where
  // chromium's own background connections would only fail.
  args: [
    '--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu', '--disable-quic',
    '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run',
  ],
});
const problems = [];
function watch(page) {
  page.on('pageerror', (error) => problems.push(`uncaught error in the page: ${error.message}`));
  // Every change the page sends is JSON: a node refuses others (a form or
  // text/plain is what another site can make a browser send).
  page.on('request', (request) => {
    if (request.method() !== 'GET' && request.url().includes('/api/v1/')) {
      const type = request.headers()['content-type'] ?? '(none)';
      if (!type.startsWith('application/json')) problems.push(`${request.method()} ${request.url()} sent as ${type}`);
    }
  });
  page.on('console', (message) => {
    // A refused script or style (CSP) is a broken page; 404s of endpoints
    // this node lacks are expected and shown as such.
    if (message.type() === 'error' && /Content Security Policy|SyntaxError|TypeError/.test(message.text())) {
      problems.push(`console: ${message.text()}`);
    }
  });
  return page;
}

try {
  const context = await browser.newContext({ viewport: { width: 1360, height: 860 } });
  const page = watch(await context.newPage());

  step('overview shows the cluster health the API reports');
  const status = await restOk('/status');
  await page.goto(`${base}/ui/`);
  await page.locator('[data-card=health] .badge').filter({ hasText: status.health }).waitFor({ timeout: 10_000 });
  await page.locator('[data-card=nodes] .card-value').filter({ hasText: `${status.nodes.online} / ${status.nodes.total} online` }).waitFor();
  assert.equal(await page.locator('#token-dialog').count(), 0, 'a loopback client is trusted: no token prompt');
  // I/O and events: charts when the node has the endpoints, a plain
  // "not available" otherwise, never a broken page.
  const io = await rest('/io');
  if (io.status === 404) {
    await page.locator('[data-panel=io] .unavailable').filter({ hasText: 'not available on this node' }).waitFor();
  } else {
    assert.equal(io.status, 200, JSON.stringify(io.json));
    await page.locator('[data-panel=io] svg.chart').first().waitFor();
  }
  const events = await rest('/events?limit=10');
  if (events.status === 404) {
    await page.locator('[data-panel=events] .unavailable').filter({ hasText: 'not available on this node' }).waitFor();
  } else {
    assert.equal(events.status, 200, JSON.stringify(events.json));
    await page.locator('[data-panel=events] :is(table.events, p.muted)').first().waitFor();
  }
  await shot(page, 'overview');

  step('nodes page lists the nodes the API lists, with their states');
  const nodes = await restOk('/nodes');
  assert.equal(nodes.length, 3);
  await page.click('nav a[data-page=nodes]');
  for (const node of nodes) {
    const row = page.locator(`tr[data-node="${node.name}"]`);
    await row.waitFor();
    assert.equal(await row.getAttribute('data-state'), node.state, `state of ${node.name}`);
    assert.match(await row.innerText(), new RegExp(`${node.name}\\s+${node.state}.*${node.role}`, 's'));
  }
  assert.equal(await page.locator('table.nodes tbody tr').count(), nodes.length);
  await shot(page, 'nodes');

  step('pools page shows every node\'s pools with their capacity');
  await page.click('nav a[data-page=pools]');
  let poolCount = 0;
  for (const node of nodes) {
    const detail = await restOk(`/nodes/${node.name}`);
    for (const pool of detail.pool_list) {
      poolCount += 1;
      const row = page.locator(`tr[data-pool="${node.name}/${pool.name}"]`);
      await row.waitFor();
      assert.equal(Number(await row.getAttribute('data-capacity')), pool.capacity_bytes, `${node.name}/${pool.name}`);
      assert.equal(await row.locator('[role=meter]').count(), 1, 'a capacity bar');
    }
  }
  assert.ok(poolCount >= 3, `each node has a pool (${poolCount})`);
  assert.equal(await page.locator('table.pools tbody tr').count(), poolCount);
  await shot(page, 'pools');

  step('volumes page shows the volumes, states, sizes and replicas the API reports');
  const volumes = await restOk('/volumes');
  await page.click('nav a[data-page=volumes]');
  for (const volume of volumes) {
    const row = page.locator(`tr[data-volume="${volume.name}"]`);
    await row.waitFor();
    assert.equal(await row.getAttribute('data-state'), volume.state);
    assert.equal(Number(await row.getAttribute('data-size')), volume.size_bytes);
    const shown = await row.locator('[data-replica]').evaluateAll((chips) => chips.map((chip) => chip.dataset.replica));
    assert.deepEqual(shown.sort(), volume.replicas.map((replica) => replica.node).sort(), `replicas of ${volume.name}`);
    assert.equal((await row.locator('td.primaries').innerText()).trim(), volume.primaries.join(', ') || '–');
  }
  assert.equal(await page.locator('table.volumes tbody tr').count(), volumes.length);
  await shot(page, 'volumes');

  step('create a volume through the page; a bad size is refused in the dialog');
  await page.click('[data-action=create-volume]');
  const create = page.locator('dialog#create-volume');
  await create.locator('input[name=name]').fill('ui-made');
  await create.locator('input[name=size]').fill('12Q');
  await create.locator('button[type=submit]').click();
  await create.locator('.dialog-error').filter({ hasText: 'is not a size' }).waitFor();
  await create.locator('input[name=size]').fill('32M');
  await create.locator('button[type=submit]').click();
  await create.waitFor({ state: 'detached' });
  const made = await restOk('/volumes/ui-made');
  assert.equal(made.size_bytes, 32 << 20);
  await page.locator('tr[data-volume="ui-made"]').waitFor();
  step('a name taken is refused with the node\'s message');
  await page.click('[data-action=create-volume]');
  await create.locator('input[name=name]').fill('ui-made');
  await create.locator('input[name=size]').fill('32M');
  await create.locator('button[type=submit]').click();
  await create.locator('.dialog-error').filter({ hasText: 'ui-made' }).waitFor();
  await create.locator('button[value=cancel]').click();

  step('grow it and snapshot it through the page');
  await page.click('tr[data-volume="ui-made"] a');
  await page.locator('.title-row[data-volume="ui-made"]').waitFor();
  await page.click('[data-action=grow]');
  await page.locator('dialog#grow-volume input[name=size]').fill('64M');
  await page.locator('dialog#grow-volume button[type=submit]').click();
  await page.locator('dialog#grow-volume').waitFor({ state: 'detached' });
  assert.equal((await restOk('/volumes/ui-made')).size_bytes, 64 << 20);
  await page.locator('[data-fact=size]').filter({ hasText: '64 MiB' }).waitFor();
  await page.click('[data-action=snapshot]');
  await page.locator('dialog#snapshot-volume input[name=name]').fill('ui-snap');
  await page.locator('dialog#snapshot-volume button[type=submit]').click();
  await page.locator('dialog#snapshot-volume').waitFor({ state: 'detached' });
  const snapshots = await restOk('/volumes/ui-made/snapshots');
  assert.deepEqual(snapshots.map((snapshot) => snapshot.name), ['ui-snap']);
  await page.locator('tr[data-snapshot="ui-snap"]').waitFor();
  step('the volume\'s events show the grow and the snapshot, with who asked');
  const logged = await restOk('/events?volume=ui-made');
  assert.ok(logged.events.some((event) => event.kind === 'volume_grown'), JSON.stringify(logged));
  const snapshotEvent = page.locator('[data-panel=events] tr[data-kind=snapshot_created]');
  await snapshotEvent.waitFor();
  assert.match(await snapshotEvent.innerText(), /ui-made.*local client on n\d.*ui-snap/s);

  step('roll back asks for a confirmation first');
  await page.click('tr[data-snapshot="ui-snap"] [data-action=rollback-to]');
  const rollback = page.locator('dialog#rollback-volume');
  await rollback.filter({ hasText: 'is lost' }).waitFor();
  assert.equal(await rollback.locator('select[name=snapshot]').inputValue(), 'ui-snap');
  await rollback.locator('button[type=submit]').click();
  await rollback.waitFor({ state: 'detached' });
  await page.locator('.notice').filter({ hasText: 'rolled back to ui-snap' }).waitFor();
  await shot(page, 'volume');

  step('detach asks for a confirmation; cancelled, nothing changes');
  await page.goto(`${base}/ui/#/volumes/${attachedVolume}`);
  await page.locator(`.title-row[data-volume="${attachedVolume}"]`).waitFor();
  await page.click('[data-action=detach]');
  const detach = page.locator('dialog#detach-volume');
  await detach.filter({ hasText: 'I/O errors' }).waitFor();
  await detach.locator('button[value=cancel]').click();
  await detach.waitFor({ state: 'detached' });
  assert.deepEqual((await restOk(`/volumes/${attachedVolume}`)).primaries, [attachedOn]);
  step('confirmed, the volume is detached');
  await page.click('[data-action=detach]');
  await detach.locator('button[type=submit]').click();
  await detach.waitFor({ state: 'detached' });
  assert.deepEqual((await restOk(`/volumes/${attachedVolume}`)).primaries, []);
  await page.locator('[data-fact=primaries]').filter({ hasText: 'not attached' }).waitFor();
  step('attach it again through the page');
  await page.click('[data-action=attach]');
  await page.locator('dialog#attach-volume select[name=node]').selectOption(attachedOn);
  await page.locator('dialog#attach-volume button[type=submit]').click();
  await page.locator('dialog#attach-volume').waitFor({ state: 'detached' });
  assert.deepEqual((await restOk(`/volumes/${attachedVolume}`)).primaries, [attachedOn]);
  await page.locator('[data-fact=primaries]').filter({ hasText: attachedOn }).waitFor();

  step('a volume larger than its pool is flagged over-committed, in the pools and the overview');
  const home = await restOk(`/nodes/${attachedOn}`);
  const homePool = home.pool_list[0];
  const bigSize = Math.ceil((homePool.capacity_bytes * 4) / 2 ** 30) * 2 ** 30;
  await restChange('POST', '/volumes', { name: 'ui-big', size_bytes: bigSize, replicas: 1, nodes: [attachedOn] });
  await page.goto(`${base}/ui/#/pools`);
  const flagged = page.locator(`tr[data-pool="${attachedOn}/${homePool.name}"] td.provisioned[data-overcommitted=true]`);
  await flagged.locator('.badge').filter({ hasText: 'over-committed' }).waitFor();
  await page.click('nav a[data-page=""]');
  await page.locator('[data-card=capacity] [data-overcommitted=true]').filter({ hasText: 'over-committed' }).waitFor();
  await shot(page, 'overcommitted');

  step('delete asks for the volume\'s name typed: a wrong one deletes nothing, the right one deletes it');
  await page.goto(`${base}/ui/#/volumes/ui-big`);
  await page.locator('.title-row[data-volume="ui-big"]').waitFor();
  await page.click('[data-action=delete-volume]');
  const deleting = page.locator('dialog#delete-volume');
  await deleting.locator('input[name=typed]').fill('ui-bi');
  await deleting.locator('button[type=submit]').click();
  await deleting.locator('.dialog-error').filter({ hasText: '"ui-bi" is not the volume\'s name' }).waitFor();
  assert.equal((await rest('/volumes/ui-big')).status, 200, 'a wrong name deletes nothing');
  await deleting.locator('input[name=typed]').fill('ui-big');
  await deleting.locator('button[type=submit]').click();
  await deleting.waitFor({ state: 'detached' });
  await eventually('ui-big is gone', async () => (await rest('/volumes/ui-big')).status === 404);
  await page.locator('main[data-page=volumes]').waitFor();

  step('remove a replica through the page (confirmed), then add it back');
  await page.goto(`${base}/ui/#/volumes/ui-made`);
  await page.locator(`tr[data-replica="${victim}"][data-kind=diskful] [data-action=remove-replica]`).click();
  const removing = page.locator('dialog#remove-replica');
  await removing.filter({ hasText: 'is deleted' }).waitFor();
  await removing.locator('button[type=submit]').click();
  await removing.waitFor({ state: 'detached' });
  assert.ok(!diskfulNodes(await restOk('/volumes/ui-made')).includes(victim), `no diskful replica of ui-made on ${victim}`);
  await page.locator(`tr[data-replica="${victim}"][data-kind=diskful]`).waitFor({ state: 'detached' });
  await page.click('[data-action=add-replica]');
  const adding = page.locator('dialog#add-replica');
  await adding.locator('select[name=node]').selectOption(victim);
  await adding.locator('button[type=submit]').click();
  await adding.waitFor({ state: 'detached' });
  assert.ok(diskfulNodes(await restOk('/volumes/ui-made')).includes(victim), `a diskful replica of ui-made on ${victim} again`);

  step('clone a snapshot, delete another, through the page');
  await page.locator('tr[data-snapshot="ui-snap"] [data-action=clone]').click();
  const cloning = page.locator('dialog#clone-snapshot');
  await cloning.locator('input[name=name]').fill('ui-clone');
  await cloning.locator('button[type=submit]').click();
  await cloning.waitFor({ state: 'detached' });
  assert.equal((await restOk('/volumes/ui-clone')).size_bytes, 64 << 20, 'the clone has the snapshot\'s size');
  await restChange('POST', '/volumes/ui-made/snapshots', { name: 'ui-snap-gone' });
  await page.locator('tr[data-snapshot="ui-snap-gone"] [data-action=delete-snapshot]').click();
  const unsnapping = page.locator('dialog#delete-snapshot');
  await unsnapping.filter({ hasText: 'gone for good' }).waitFor();
  await unsnapping.locator('button[type=submit]').click();
  await unsnapping.waitFor({ state: 'detached' });
  await eventually('ui-snap-gone is deleted', async () =>
    !(await restOk('/volumes/ui-made/snapshots')).some((snapshot) => snapshot.name === 'ui-snap-gone'));

  step('a snapshot schedule set and stopped through the page');
  await page.click('[data-action=schedule]');
  const scheduling = page.locator('dialog#snapshot-schedule');
  await scheduling.locator('input[name=every]').fill('5s');
  await scheduling.locator('button[type=submit]').click();
  await scheduling.locator('.dialog-error').filter({ hasText: 'too often' }).waitFor();
  await scheduling.locator('input[name=every]').fill('1h');
  await scheduling.locator('input[name=keep]').fill('3');
  await scheduling.locator('button[type=submit]').click();
  await scheduling.waitFor({ state: 'detached' });
  const schedule = await restOk('/volumes/ui-made/snapshot-schedule');
  assert.deepEqual([schedule.every_secs, schedule.keep], [3600, 3], JSON.stringify(schedule));
  await page.locator('[data-schedule="3600/3"]').waitFor();
  await page.click('[data-action=unschedule]');
  await eventually('no schedule', async () => (await restOk('/volumes/ui-made/snapshot-schedule')).every_secs == null);
  await page.locator('[data-schedule=none]').waitFor();
  step('an idle volume\'s charts print each axis label once');
  await page.locator('[data-panel=io] svg.chart').first().waitFor();
  await assertAxisLabelsDistinct(page, 'ui-made');

  step('verify through the page; its report shows when done');
  await page.goto(`${base}/ui/#/volumes/${attachedVolume}`);
  await page.click('[data-action=verify]');
  await eventually('the verify is done', async () => {
    const { status, json } = await rest(`/volumes/${attachedVolume}/verify`);
    return (status === 200 && json.state === 'done') || [status, json?.state];
  });
  await page.locator('[data-panel=verify] [data-verify=done][data-differing="0"]').waitFor();

  step('a node\'s page: its pools, replicas and attached volumes; labels and a pool scan through it');
  await page.goto(`${base}/ui/#/nodes/${attachedOn}`);
  await page.locator(`.title-row[data-node="${attachedOn}"]`).waitFor();
  await eventually('the node page lists the replicas the API lists', async () => {
    const detail = await restOk(`/nodes/${attachedOn}`);
    const shown = await page.locator('[data-panel=replicas] tbody tr').evaluateAll((rows) =>
      rows.map((row) => `${row.dataset.volume}:${row.dataset.primary}`));
    const expected = detail.replicas.map((replica) => `${replica.volume}:${replica.primary}`);
    return JSON.stringify(shown.sort()) === JSON.stringify(expected.sort()) || { shown, expected };
  });
  await page.locator(`[data-panel=replicas] tr[data-volume="${attachedVolume}"][data-primary=true]`).waitFor();
  for (const pool of home.pool_list) {
    await page.locator(`[data-panel=pools] tr[data-pool="${attachedOn}/${pool.name}"]`).waitFor();
  }
  await page.click('[data-action=labels]');
  const labelling = page.locator('dialog#node-labels');
  await labelling.locator('input[name=labels]').fill('zone=rack1');
  await labelling.locator('button[type=submit]').click();
  await labelling.waitFor({ state: 'detached' });
  assert.deepEqual((await restOk(`/nodes/${attachedOn}`)).labels, { zone: 'rack1' });
  await page.locator('[data-fact=labels]').filter({ hasText: 'zone=rack1' }).waitFor();
  await page.click('[data-action=remove-node]');
  const evicting = page.locator('dialog#remove-node');
  await evicting.locator('input[name=typed]').fill(`${attachedOn}x`);
  await evicting.locator('button[type=submit]').click();
  await evicting.locator('.dialog-error').filter({ hasText: 'is not the node\'s name' }).waitFor();
  await evicting.locator('button[value=cancel]').click();
  assert.equal((await restOk('/nodes')).length, 3, 'a wrong name removes nothing');
  await page.click(`[data-panel=pools] tr[data-pool="${attachedOn}/${homePool.name}"] [data-action=scan-pool]`);
  await page.locator('.notice').filter({ hasText: `Pool ${homePool.name} is clean` }).waitFor({ timeout: 30_000 });
  await shot(page, 'node');
  step('a pool\'s page: its figures and the volumes with a replica in it');
  await page.click(`[data-panel=pools] tr[data-pool="${attachedOn}/${homePool.name}"] td.name a`);
  await page.locator(`.title-row[data-pool="${attachedOn}/${homePool.name}"]`).waitFor();
  await page.locator(`[data-panel=volumes] tr[data-volume="${attachedVolume}"]`).waitFor();
  await page.locator('[data-fact=checksum-errors]').waitFor();
  await shot(page, 'pool');
  step('another node\'s pool is scanned on that node\'s dashboard: a link, not a button');
  const other = nodes.find((node) => node.name !== attachedOn && node.name !== victim);
  await page.goto(`${base}/ui/#/nodes/${other.name}`);
  await page.locator(`[data-panel=pools] tr[data-pool^="${other.name}/"] a.scan-elsewhere`).first().waitFor();
  assert.equal(await page.locator('[data-panel=pools] [data-action=scan-pool]').count(), 0);

  step('charts open with the node\'s history: samples from before the page was opened');
  await eventually('the node\'s history holds the writes made before this script', async () => {
    const history = await restOk(`/io/history?volume=${attachedVolume}`);
    return history.samples.some((sample) => sample.write_bytes_per_sec > 0) || history.samples.length;
  }, 40_000);
  const fresh = watch(await context.newPage());
  for (const [where, url] of [['volume', `${base}/ui/#/volumes/${attachedVolume}`], ['overview', `${base}/ui/`]]) {
    const openedAt = Date.now();
    await fresh.goto(url);
    const throughput = fresh.locator('[data-panel=io] svg.chart[aria-label=Throughput]');
    await throughput.waitFor();
    const oldest = Number(await throughput.getAttribute('data-oldest'));
    assert.ok(oldest < openedAt - 5000, `${where}: the chart starts before the page opened (${oldest} vs ${openedAt}, ${ioSinceMs})`);
    assert.ok(Number(await throughput.getAttribute('data-peak')) > 0, `${where}: the writes made before the page opened are drawn`);
    await assertAxisLabelsDistinct(fresh, where);
  }
  await fresh.click('[data-panel=io] [data-span="1 h"]');
  await fresh.locator('[data-panel=io] svg.chart text.axis').filter({ hasText: '−60 min' }).first().waitFor();
  await fresh.goto(`${base}/ui/#/volumes/${attachedVolume}`);
  await fresh.locator('[data-panel=verify] [data-verify=done]').waitFor();
  await fresh.locator('[data-panel=io] svg.chart').first().waitFor();
  await fresh.locator('[data-panel=events] table.events').waitFor();
  await fresh.click('[data-panel=io] [data-span="5 min"]');
  await shot(fresh, 'dashboard');
  await fresh.close();

  step(`a killed node (${victim}) shows offline within ${OFFLINE_WITHIN_MS / 1000} s`);
  await page.click('nav a[data-page=nodes]');
  await page.locator(`tr[data-node="${victim}"][data-state=online]`).waitFor();
  console.log(`kill ${victim}`);
  const answer = await stdinLines.next();
  assert.equal(answer.value, 'killed', 'the Rust side answers "killed"');
  const killedAt = Date.now();
  await page.locator(`tr[data-node="${victim}"][data-state=offline]`).waitFor({ timeout: OFFLINE_WITHIN_MS });
  console.log(`result: offline shown ${Date.now() - killedAt} ms after the kill`);
  await shot(page, 'node-offline');
  await page.click('nav a[data-page=""]');
  await page.locator('[data-card=nodes] .card-value').filter({ hasText: '2 / 3 online' }).waitFor();
  await shot(page, 'overview-node-down');
  await page.goto(`${base}/ui/#/volumes/${attachedVolume}`);
  await page.locator(`[data-replica="${victim}"]`).waitFor();
  await shot(page, 'volume-node-down');

  step('unknown pages: a 404 page from the server, a "no such page" in the app');
  const missing = await page.goto(`${base}/ui/no-such-page`);
  assert.equal(missing.status(), 404);
  await page.locator('h1').filter({ hasText: 'No such page' }).waitFor();
  assert.equal(await page.locator('a[href="/ui/"]').count(), 1);
  await page.goto(`${base}/ui/#/bogus`);
  await page.locator('[data-not-found="#/bogus"]').waitFor();
  await page.goto(`${base}/ui/#/volumes/no-such-volume`);
  await page.locator('[data-not-found="no-such-volume"]').waitFor();
  await context.close();

  step('a browser without the token, at a node that trusts no one, gets the token prompt');
  const locked = await browser.newContext({ viewport: { width: 1360, height: 860 } });
  const lockedPage = watch(await locked.newPage());
  await lockedPage.goto(`${lockedBase}/ui/`);
  const prompt = lockedPage.locator('dialog#token-dialog[open]');
  await prompt.filter({ hasText: 'needs the admin token' }).waitFor({ timeout: 10_000 });
  await prompt.locator('.token-reason').filter({ hasText: 'needs a token' }).waitFor();
  assert.equal(await lockedPage.locator('[data-card=health]').count(), 0, 'nothing shown without the token');
  await shot(lockedPage, 'token-prompt');
  step('a wrong token is refused with the node\'s message');
  await prompt.locator('input[name=token]').fill('trmadm-wrong');
  await prompt.locator('button[type=submit]').click();
  await prompt.locator('.token-reason').filter({ hasText: 'The token was refused' }).waitFor();
  step('the right token opens the dashboard and stays in sessionStorage');
  await prompt.locator('input[name=token]').fill(adminToken);
  await prompt.locator('button[type=submit]').click();
  await lockedPage.locator('[data-card=health] .badge').waitFor();
  await lockedPage.click('nav a[data-page=nodes]');
  // The page renders once its first poll is in: wait for it, then count.
  await lockedPage.locator('table.nodes tbody tr').first().waitFor();
  assert.equal(await lockedPage.locator('table.nodes tbody tr').count(), 3);
  assert.equal(await lockedPage.evaluate(() => sessionStorage.getItem('trireme.adminToken')), adminToken);
  await lockedPage.reload();
  await lockedPage.locator('table.nodes tbody tr').first().waitFor();
  assert.equal(await lockedPage.locator('dialog#token-dialog[open]').count(), 0, 'the token is kept for the tab');
  await locked.close();

  assert.deepEqual(problems, [], 'the pages ran without errors');
  console.log('result: dashboard checks passed');
} catch (failure) {
  console.error(failure.stack ?? String(failure));
  if (problems.length) console.error(`problems in the page:\n${problems.join('\n')}`);
  process.exitCode = 1;
} finally {
  await browser.close();
  lines.close();
}
