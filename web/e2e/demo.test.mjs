// The web console on `rlark up --demo`: the built-in embodied RL Workflow (a learner on
// `cloud`, two rollouts on `edge` driving simulated arms) followed in the browser: its DAG,
// the learner's reward chart growing without a reload, the Workflow reaching Succeeded.
// Needs python3 with numpy, grpcio and protobuf (scripts/test.sh installs them). By hand:
//   cargo build -p rlark && (cd web && npm ci) && node --test web/e2e/demo.test.mjs
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ARTIFACTS, freePort, launch, prerequisites, startUp, stopUp } from './support.mjs';

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
    const { link } = await up.ready;
    browser = await launch(playwright);
    const context = await browser.newContext({ ignoreHTTPSErrors: true });
    const page = await context.newPage();
    const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
    await page.goto(link);
    await page.getByTestId('user').waitFor();

    // The Workflow and its DAG.
    await page.getByRole('link', { name: 'Workflows' }).click();
    await page.getByRole('table', { name: 'Workflows' }).getByRole('link', { name: 'demo' }).click({ timeout: 60_000 });
    const dag = page.getByRole('img', { name: 'DAG of workflow demo' });
    await dag.waitFor();
    assert.ok((await dag.locator('rect.dag-node').count()) >= 1, 'the DAG has its job templates');
    await shot('demo-workflow');

    // The learner's rewards, live.
    await page.getByRole('table', { name: 'Workflow jobs' }).getByRole('link', { name: 'train' }).click();
    await page.getByRole('table', { name: 'Tasks' }).getByRole('link', { name: 'demo-train-learner' }).click({ timeout: 60_000 });
    const reward = page.locator('figure[data-series="reward"]');
    await reward.waitFor({ timeout: 120_000 });
    const first = Number(await reward.getAttribute('data-points'));
    await page.waitForFunction((n) => Number(document.querySelector('figure[data-series="reward"]')?.dataset.points) > n, first, { timeout: 120_000 });
    await shot('demo-reward-chart');

    // The Workflow ends Succeeded; the page follows it without a reload.
    await page.goto(page.url().replace(/#.*/, '#/workflows/demo'));
    await page.getByRole('heading', { name: /Workflow demo/ }).locator('.phase-succeeded').waitFor({ timeout: 180_000 });
    await shot('demo-succeeded');
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
