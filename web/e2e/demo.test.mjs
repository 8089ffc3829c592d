// The web console on `rlark up --demo`: the built-in embodied RL Workflow (a learner on
// `cloud`, two rollouts on `edge` driving simulated arms) followed in the browser, with the
// must-show list of issue 22: login with the link, the overview's numbers equal to the
// API's, the DAG, a Job created from YAML (a validation error at its line first) that
// wants an arm the demo holds, so it waits, saying why, and runs once the demo ends,
// reaching Succeeded without a reload, its log followed, `echo hi` in its terminal, the
// learner's reward chart growing, the Workflow reaching Succeeded, a camera's frames
// changing, a viewer without write buttons whose forged write is refused, logout.
// Screenshots go to web/e2e/artifacts/demo-*.png.
// Needs python3 with numpy, grpcio and protobuf (scripts/test.sh installs them). By hand:
//   cargo build -p rlark && (cd web && npm ci) && node --test web/e2e/demo.test.mjs
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ARTIFACTS, freePort, launch, prerequisites, rlark, startUp, stopUp } from './support.mjs';

// Wants one of the edge host's simulated arms, which the demo's two rollouts hold both of:
// it waits (Unschedulable, naming the resource) until the demo ends, then runs, printing a
// line every second for the log and the terminal to be seen. Line 9 is the role.
const CONTENDER = `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: contender
spec:
  tasks:
    - name: arm
      agentType: Raw
      role: Actor
      nodeSelector:
        rlark.io/cluster-id: edge
      raw:
        replicas: 1
        entrypoint: ["python3", "-u", "-c", "import time\\nprint('got an arm')\\nfor i in range(30):\\n    print(f'tick {i}'); time.sleep(1)"]
        resources:
          requests: {rlinf.io/robot-sim-arm: "1"}
          limits: {rlinf.io/robot-sim-arm: "1"}
`;

/** Poll a condition outside the page (the API), every 500 ms, up to `ms`. */
async function waitFor(predicate, what, ms) {
  const end = Date.now() + ms;
  while (!(await predicate())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

function pythonHasDemoPackages() {
  try {
    execFileSync('python3', ['-c', 'import numpy, grpc, google.protobuf'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

test('the demo workflow followed in the console', { timeout: 300_000 }, async (t) => {
  const { playwright, skip } = await prerequisites();
  if (skip) return t.skip(skip);
  if (!pythonHasDemoPackages()) {
    if (process.env.CI === 'true' || process.env.RLARK_REQUIRE_TOOLS === '1') throw new Error('python3 lacks numpy, grpcio or protobuf, which scripts/test.sh installs');
    return t.skip('SKIPPED: python3 lacks numpy, grpcio or protobuf (the demo needs them)');
  }
  const dataDir = mkdtempSync(join(tmpdir(), 'rlark-e2e-demo-'));
  const up = startUp(join(dataDir, 'data'), await freePort(), ['--demo']);
  let browser;
  try {
    const { link, url } = await up.ready;
    const kube = join(dataDir, 'data');
    browser = await launch(playwright);
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
    const api = async (path) => (await page.request.get(`${url}${path}`)).json();

    // ---- login with the one-time link; the overview's numbers are the API's ----
    await page.goto(link);
    await page.getByTestId('login-link').click();
    await page.getByTestId('user').filter({ hasText: 'admin (admin)' }).waitFor();
    assert.ok(!page.url().includes('login='), 'no login code in the address bar');
    const clusters = await api('/rlark/v1/clusters');
    const online = clusters.items.reduce((n, c) => n + c.onlineNodes, 0);
    const total = clusters.items.reduce((n, c) => n + c.totalNodes, 0);
    await page.getByTestId('card-nodes-online').filter({ hasText: `${online} / ${total}` }).waitFor();
    await page.getByTestId('card-clusters').filter({ hasText: String(clusters.items.length) }).waitFor();
    await shot('demo-overview');

    // ---- the Workflow and its DAG ----
    await page.getByRole('link', { name: 'Workflows' }).click();
    await page.getByRole('table', { name: 'Workflows' }).getByRole('link', { name: 'demo' }).click({ timeout: 60_000 });
    const dag = page.getByRole('img', { name: 'DAG of workflow demo' });
    await dag.waitFor();
    assert.ok((await dag.locator('rect.dag-node').count()) >= 1, 'the DAG has its job templates');
    await shot('demo-workflow');

    // ---- a Job from YAML: a validation error at its line, then one that wants an arm ----
    // The demo's two rollouts hold both simulated arms; wait until they are placed.
    await waitFor(async () => {
      const tasks = await api('/apis/rlinf.io/v1alpha1/tasks?labelSelector=rlinf.io/job=demo-train');
      return tasks.items.some((t) => t.metadata.name === 'demo-train-rollout' && t.spec?.placement);
    }, 'the demo rollouts placed', 90_000);
    await page.getByRole('link', { name: 'Create' }).click();
    const editor = page.getByLabel('Manifest (YAML)');
    await editor.fill(CONTENDER.replace('role: Actor', 'role: Wizard'));
    await page.getByRole('button', { name: 'Create' }).click();
    const fieldError = page.locator('li[data-field="spec.tasks[0].role"]');
    await fieldError.waitFor();
    assert.equal(await fieldError.getAttribute('data-line'), '9');
    await shot('demo-create-invalid');
    await editor.fill(CONTENDER);
    await page.getByRole('button', { name: 'Create' }).click();
    const contenderHeading = page.getByRole('heading', { name: /Job contender/ });
    await contenderHeading.waitFor();
    // Device contention: both arms are the demo's, so the Job waits, and says why.
    const unschedulable = page.getByRole('region', { name: 'Conditions' }).getByRole('row').filter({ hasText: 'Unschedulable' }).filter({ hasText: 'robot-sim-arm' });
    await unschedulable.first().waitFor({ timeout: 60_000 });
    await contenderHeading.locator('.phase-pending').waitFor();
    await shot('demo-contention');

    // ---- the learner's rewards, live ----
    await page.goto(`${url}/#/workflows/demo`);
    await page.getByRole('table', { name: 'Workflow jobs' }).getByRole('link', { name: 'train' }).click();
    await page.getByRole('table', { name: 'Tasks' }).getByRole('link', { name: 'demo-train-learner' }).click({ timeout: 60_000 });
    const reward = page.locator('figure[data-series="reward"]');
    await reward.waitFor({ timeout: 120_000 });
    const first = Number(await reward.getAttribute('data-points'));
    await page.waitForFunction((n) => Number(document.querySelector('figure[data-series="reward"]')?.dataset.points) > n, first, { timeout: 120_000 });
    await shot('demo-reward-chart');

    // ---- the Workflow ends Succeeded; the page follows it without a reload ----
    await page.goto(`${url}/#/workflows/demo`);
    await page.getByRole('heading', { name: /Workflow demo/ }).locator('.phase-succeeded').waitFor({ timeout: 180_000 });
    await shot('demo-succeeded');

    // ---- the arm is free: the waiting Job runs; its log follows, a terminal answers ----
    await page.goto(`${url}/#/jobs/contender`);
    await contenderHeading.locator('.phase-running').waitFor({ timeout: 90_000 });
    await page.getByRole('table', { name: 'Tasks' }).getByRole('link', { name: 'contender-arm' }).click();
    const log = page.getByTestId('log');
    await log.filter({ hasText: 'got an arm' }).waitFor({ timeout: 30_000 });
    // Followed: later lines arrive without a reload.
    await log.filter({ hasText: 'tick 3' }).waitFor({ timeout: 30_000 });
    await page.getByRole('button', { name: 'Open a terminal in contender-arm-0' }).click();
    await page.getByTestId('terminal-state').filter({ hasText: 'connected' }).waitFor({ timeout: 30_000 });
    await page.waitForFunction(() => document.activeElement?.classList.contains('xterm-helper-textarea'));
    await page.keyboard.type('echo hi\n');
    await page.waitForFunction(() => [...document.querySelectorAll('.xterm-rows > div')].some((r) => r.textContent.trim() === 'hi'), null, { timeout: 15_000 });
    await shot('demo-terminal');
    await page.goto(`${url}/#/jobs/contender`);
    await contenderHeading.locator('.phase-succeeded').waitFor({ timeout: 90_000 });
    await shot('demo-contender-succeeded');

    // ---- a camera of the edge host: opened from the page, its frames change ----
    await page.getByRole('link', { name: 'Devices' }).click();
    await page.getByRole('button', { name: 'Open camera cam-0' }).click();
    await page.locator('tr[data-camera="cam-0"]').getByTestId('camera-state').filter({ hasText: 'OPEN' }).waitFor({ timeout: 15_000 });
    await page.getByRole('button', { name: /^View camera cam-0 on / }).click();
    await page.waitForFunction(() => Number(document.querySelector('[data-testid="camera-cam-0"]')?.dataset.frames) > 0, null, { timeout: 15_000 });
    const pixels = () =>
      page.getByTestId('camera-cam-0').evaluate((img) => {
        const canvas = document.createElement('canvas');
        canvas.width = img.naturalWidth;
        canvas.height = img.naturalHeight;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(img, 0, 0);
        return Array.from(ctx.getImageData(0, 0, canvas.width, canvas.height).data.filter((_, i) => i % 97 === 0)).join(',');
      });
    const before = await pixels();
    await page.waitForTimeout(1500);
    assert.notEqual(before, await pixels(), 'the simulated camera\'s frames change over time');
    await shot('demo-camera');
    await page.getByRole('button', { name: 'Close view' }).click();
    await page.getByRole('button', { name: 'Close camera cam-0' }).click();

    // ---- a viewer: no write buttons; a forged write is refused ----
    const viewerToken = rlark(kube, 'token', 'create', '--user', 'vera', '--role', 'viewer');
    const viewer = await browser.newContext({ ignoreHTTPSErrors: true });
    const vpage = await viewer.newPage();
    await vpage.goto(`${url}/`);
    await vpage.getByLabel('Bearer token').fill(viewerToken);
    await vpage.getByRole('button', { name: 'Log in' }).click();
    await vpage.getByTestId('user').filter({ hasText: 'vera (viewer)' }).waitFor();
    assert.equal(await vpage.getByRole('link', { name: 'Create' }).count(), 0);
    await vpage.goto(`${url}/#/workflows/demo`);
    await vpage.getByRole('heading', { name: /Workflow demo/ }).waitFor();
    await vpage.goto(`${url}/#/jobs/demo-train`);
    await vpage.getByRole('heading', { name: /Job demo-train/ }).waitFor();
    for (const name of ['Stop', 'Resume', 'Restart', 'Delete']) {
      assert.equal(await vpage.getByRole('button', { name }).count(), 0, `a viewer sees no ${name} button`);
    }
    await vpage.screenshot({ path: join(ARTIFACTS, 'demo-viewer.png'), fullPage: true });
    const { csrfToken } = await (await vpage.request.get(`${url}/rlark/v1/console/session`)).json();
    const forged = await vpage.request.fetch(`${url}/apis/rlinf.io/v1alpha1/workflows/demo`, { method: 'DELETE', headers: { 'X-Rlark-CSRF': csrfToken } });
    assert.equal(forged.status(), 403);
    assert.match((await forged.json()).message, /User "vera" cannot delete/);

    // ---- logout ends the session on the server ----
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.getByLabel('Bearer token').waitFor();
    assert.equal((await page.request.get(`${url}/rlark/v1/console/session`)).status(), 401);
    await viewer.close();
  } catch (error) {
    const { out, err } = up.output();
    t.diagnostic(`rlark up stdout:\n${out}\nstderr (tail):\n${err.slice(-4000)}`);
    throw error;
  } finally {
    if (browser) await browser.close();
    await stopUp(up);
    rmSync(dataDir, { recursive: true, force: true });
  }
});
