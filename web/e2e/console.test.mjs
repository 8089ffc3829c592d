// End-to-end test of the web console in a real browser: Debian's Chromium, headless, driven
// by playwright-core (no browser download), against a real `rlark up` started from the debug
// binary cargo built. Run by scripts/test.sh; by hand:
//   cargo build -p rlark && (cd web && npm ci) && node --test web/e2e/console.test.mjs
// Under CI=true or RLARK_REQUIRE_TOOLS=1 a missing binary or browser fails the test;
// elsewhere the test is skipped with a message. Screenshots go to web/e2e/artifacts/.
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const WEB = fileURLToPath(new URL('..', import.meta.url));
const ROOT = join(WEB, '..');
const ARTIFACTS = join(WEB, 'e2e', 'artifacts');
const RLARK = process.env.RLARK_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target'), 'debug', 'rlark');
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const REQUIRED = process.env.CI === 'true' || process.env.RLARK_REQUIRE_TOOLS === '1';

function missing(what) {
  if (REQUIRED) throw new Error(`${what}: scripts/test.sh installs it; under CI=true (or RLARK_REQUIRE_TOOLS=1) a missing tool fails the test`);
  return `SKIPPED: ${what} (scripts/test.sh installs it)`;
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

/** Start `rlark up`; resolves with its URL and login link once the banner is printed. */
function startUp(dataDir, port) {
  const child = spawn(RLARK, ['up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  let out = '';
  let err = '';
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`rlark up printed no login link in 90 s\nstdout:\n${out}\nstderr:\n${err}`)), 90_000);
    child.stdout.on('data', (d) => {
      out += d;
      const link = out.match(/log in once with (https:\/\/\S+)/);
      const url = out.match(/rlark is running at (https:\/\/\S+)/);
      if (link && url) {
        clearTimeout(timer);
        resolve({ link: link[1], url: url[1] });
      }
    });
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`rlark up exited with ${code}\nstdout:\n${out}\nstderr:\n${err}`));
    });
  });
  return { child, ready, output: () => ({ out, err }) };
}

function rlark(dataDir, ...args) {
  return execFileSync(RLARK, [...args, '--kubeconfig', join(dataDir, 'admin.kubeconfig')], { encoding: 'utf8' }).trim();
}

const VALID_JOB = `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: e2e-hello
spec:
  tasks:
    - name: main
      agentType: Raw
      role: Actor
      raw:
        entrypoint: ["python3", "-c", "print('hello from the e2e job')"]
        replicas: 1
`;

// Line 9 sets a role the API does not know.
const INVALID_JOB = `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: e2e-invalid
spec:
  tasks:
    - name: main
      agentType: Raw
      role: Wizard
      raw:
        entrypoint: ["true"]
        replicas: 1
`;

test('the console in a real browser against rlark up', { timeout: 300_000 }, async (t) => {
  if (!existsSync(RLARK)) return t.skip(missing(`the rlark binary is not at ${RLARK} (cargo build -p rlark)`));
  if (!existsSync(CHROMIUM)) return t.skip(missing(`chromium is not installed at ${CHROMIUM}`));
  let playwright;
  try {
    playwright = await import('playwright-core');
  } catch {
    return t.skip(missing('playwright-core is not installed (npm ci in web/)'));
  }
  mkdirSync(ARTIFACTS, { recursive: true });
  const dataDir = mkdtempSync(join(tmpdir(), 'rlark-e2e-'));
  const port = await freePort();
  const up = startUp(join(dataDir, 'data'), port);
  let browser;
  try {
    const { link, url } = await up.ready;
    const kube = join(dataDir, 'data');
    browser = await playwright.chromium.launch({
      executablePath: CHROMIUM,
      headless: true,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    // The server's certificate is signed by the installation's own CA.
    const admin = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await admin.newPage();
    const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });

    // ---- login with the one-time link ----
    const started = Date.now();
    const first = await page.goto(link);
    const csp = first.headers()['content-security-policy'];
    assert.match(csp, /script-src 'self'/);
    assert.match(csp, /frame-ancestors 'none'/);
    await page.getByTestId('user').waitFor();
    const firstLoadMs = Date.now() - started;
    assert.match(await page.getByTestId('user').textContent(), /admin \(admin\)/);
    assert.ok(!page.url().includes('login='), `the login code left the address bar: ${page.url()}`);
    assert.equal(await page.evaluate(() => localStorage.length + sessionStorage.length), 0, 'nothing in web storage');
    const cookies = await admin.cookies();
    assert.equal(cookies.length, 1, JSON.stringify(cookies));
    assert.equal(cookies[0].name, '__Host-rlark_session');
    assert.equal(cookies[0].httpOnly, true);
    assert.equal(cookies[0].secure, true);
    assert.equal(cookies[0].sameSite, 'Strict');
    assert.equal(cookies[0].path, '/');
    // The link works once.
    const reuse = await browser.newContext({ ignoreHTTPSErrors: true });
    const reusePage = await reuse.newPage();
    await reusePage.goto(link);
    await reusePage.getByRole('alert').filter({ hasText: 'used or expired' }).waitFor();
    await reuse.close();

    // ---- overview numbers match the API ----
    const clusters = await (await page.request.get(`${url}/rlark/v1/clusters`)).json();
    const online = clusters.items.reduce((n, c) => n + c.onlineNodes, 0);
    const total = clusters.items.reduce((n, c) => n + c.totalNodes, 0);
    assert.ok(total > 0, 'rlark up has local agents');
    await page.getByTestId('card-nodes-online').filter({ hasText: `${online} / ${total}` }).waitFor();
    await page.getByTestId('card-clusters').filter({ hasText: String(clusters.items.length) }).waitFor();
    await shot('overview');

    // ---- nodes: cordon one ----
    await page.getByRole('link', { name: 'Clusters' }).click();
    const button = page.getByRole('button', { name: /^Cordon node / }).first();
    const label = await button.getAttribute('aria-label');
    const nodeName = label.replace('Cordon node ', '');
    await button.click();
    const row = page.locator(`tr[data-node="${nodeName}"]`);
    await row.getByTestId('schedulable').filter({ hasText: 'Cordoned' }).waitFor();
    const nodes = await (await page.request.get(`${url}/apis/rlinf.io/v1alpha1/nodes?fieldSelector=metadata.name=${nodeName}`)).json();
    assert.equal(nodes.items[0].spec.unschedulable, true, 'the cordon reached the API');
    await shot('nodes-cordoned');
    await page.getByRole('button', { name: `Uncordon node ${nodeName}` }).click();
    await row.getByTestId('schedulable').filter({ hasText: 'Yes' }).waitFor();

    // ---- a write without the CSRF token is refused ----
    const noCsrf = await page.request.post(`${url}/apis/rlinf.io/v1alpha1/jobs`, {
      data: { apiVersion: 'rlinf.io/v1alpha1', kind: 'Job', metadata: { name: 'forged' }, spec: { tasks: [] } },
    });
    assert.equal(noCsrf.status(), 403);
    assert.match((await noCsrf.json()).message, /CSRF/);

    // ---- create from YAML: a validation error at its line, then a Job that runs ----
    await page.getByRole('link', { name: 'Create' }).click();
    const editor = page.getByLabel('Manifest (YAML)');
    await editor.fill(INVALID_JOB);
    await page.getByRole('button', { name: 'Create' }).click();
    const fieldError = page.locator('li[data-field="spec.tasks[0].role"]');
    await fieldError.waitFor();
    assert.equal(await fieldError.getAttribute('data-line'), '9');
    assert.match(await fieldError.textContent(), /line 9/);
    await page.locator('.gutter [data-line="9"].gutter-error').waitFor();
    await shot('create-invalid');

    await editor.fill(VALID_JOB);
    await page.getByRole('button', { name: 'Create' }).click();
    await page.getByRole('heading', { name: /Job e2e-hello/ }).waitFor();
    // Live: the phase changes without a reload.
    await page.getByRole('heading', { name: /Job e2e-hello/ }).locator('.phase-succeeded').waitFor({ timeout: 90_000 });
    await shot('job-succeeded');

    // ---- the job list shows it; task detail shows its log ----
    await page.getByRole('link', { name: 'Jobs', exact: true }).click();
    await page.getByRole('table', { name: 'Jobs' }).getByRole('link', { name: 'e2e-hello' }).click();
    await page.getByRole('table', { name: 'Tasks' }).getByRole('link', { name: 'e2e-hello-main' }).click();
    await page.getByTestId('log').filter({ hasText: 'hello from the e2e job' }).waitFor({ timeout: 30_000 });
    await shot('task-log');

    // ---- a viewer: reads everything, no write buttons, a forged write is refused ----
    const viewerToken = rlark(kube, 'token', 'create', '--user', 'vera', '--role', 'viewer');
    const viewer = await browser.newContext({ ignoreHTTPSErrors: true });
    const vpage = await viewer.newPage();
    await vpage.goto(url + '/');
    await vpage.getByLabel('Bearer token').fill(viewerToken);
    await vpage.getByRole('button', { name: 'Log in' }).click();
    await vpage.getByTestId('user').filter({ hasText: 'vera (viewer)' }).waitFor();
    assert.equal(await vpage.getByRole('link', { name: 'Create' }).count(), 0);
    await vpage.getByRole('link', { name: 'Clusters' }).click();
    await vpage.locator(`tr[data-node="${nodeName}"]`).waitFor();
    assert.equal(await vpage.getByRole('button', { name: /cordon/i }).count(), 0);
    await vpage.goto(`${url}/#/jobs/e2e-hello`);
    await vpage.getByRole('heading', { name: /Job e2e-hello/ }).waitFor();
    for (const name of ['Stop', 'Restart', 'Delete']) {
      assert.equal(await vpage.getByRole('button', { name }).count(), 0, `a viewer sees no ${name} button`);
    }
    await vpage.screenshot({ path: join(ARTIFACTS, 'viewer-job.png'), fullPage: true });
    const session = await (await vpage.request.get(`${url}/rlark/v1/console/session`)).json();
    const forged = await vpage.request.fetch(`${url}/apis/rlinf.io/v1alpha1/jobs/e2e-hello`, {
      method: 'DELETE',
      headers: { 'X-Rlark-CSRF': session.csrfToken },
    });
    assert.equal(forged.status(), 403);
    assert.match((await forged.json()).message, /User "vera" cannot delete/);

    // ---- logout revokes the session ----
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.getByLabel('Bearer token').waitFor();
    const after = await page.request.get(`${url}/rlark/v1/console/session`);
    assert.equal(after.status(), 401);
    // The viewer's own session is untouched.
    assert.equal((await vpage.request.get(`${url}/rlark/v1/console/session`)).status(), 200);

    // ---- report bundle size and first-load time ----
    const assets = join(WEB, 'dist', 'assets');
    const bytes = readdirSync(assets).reduce((n, f) => n + statSync(join(assets, f)).size, 0);
    t.diagnostic(`console bundle: ${(bytes / 1024).toFixed(1)} KiB (uncompressed); first load to logged-in overview: ${firstLoadMs} ms`);
  } catch (error) {
    const { out, err } = up.output();
    t.diagnostic(`rlark up stdout:\n${out}\nstderr (tail):\n${err.slice(-4000)}`);
    throw error;
  } finally {
    if (browser) await browser.close();
    up.child.kill('SIGINT');
    await new Promise((r) => {
      if (up.child.exitCode !== null) return r();
      const timer = setTimeout(() => {
        up.child.kill('SIGKILL');
        r();
      }, 20_000);
      up.child.on('exit', () => {
        clearTimeout(timer);
        r();
      });
    });
    rmSync(dataDir, { recursive: true, force: true });
  }
});
