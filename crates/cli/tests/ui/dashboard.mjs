// Drives trireme's web dashboard in headless Chromium (Debian's chromium,
// through playwright-core: no browser is downloaded). Started by
// crates/cli/tests/dashboard.rs, which runs a real three-node cluster:
//
//   TRIREME_UI_URL       a node that trusts loopback (http://127.0.0.1:P)
//   TRIREME_LOCKED_URL   a node of the same cluster run with --trust-loopback=false
//   TRIREME_TOKEN        the cluster's admin token
//   TRIREME_VOLUME       a volume attached on TRIREME_ATTACHED_ON
//   TRIREME_VICTIM       the node the Rust side kills when asked
//   SCREENSHOT_DIR       where the screenshots go
//   CHROMIUM             the browser binary [default: /usr/bin/chromium]
//
// It checks that the pages show what the REST API says, changes the
// cluster through the page (and checks the change through the API), asks
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
