// End-to-end test of the web console in a real browser: Debian's Chromium, headless, driven
// by playwright-core (no browser download), against a real `rlark up` started from the debug
// binary cargo built. Run by scripts/test.sh; by hand:
//   cargo build -p rlark && (cd web && npm ci) && node --test web/e2e/console.test.mjs
// (web/e2e/demo.test.mjs follows the `up --demo` Workflow the same way.)
// Under CI=true or RLARK_REQUIRE_TOOLS=1 a missing binary or browser fails the test;
// elsewhere the test is skipped with a message. Screenshots go to web/e2e/artifacts/.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { ARTIFACTS, RLARK, ROOT, WEB, axeViolations, consoleCheck, focused, freePort, keyboardAudit, launch, newContext, prerequisites, rlark, startUp, stopUp, tabFromTop, tabTo, waitFor, watchCspViolations } from './support.mjs';

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

// Runs until stopped: for the terminal, the reward chart and the task HTTP proxy (a web
// server on HTTP_PORT of the replica's node; with tensorBoardDir its agent starts the
// node's TensorBoard beside it, or the Pod says why not).
const SHELL_JOB = (httpPort) => `apiVersion: rlinf.io/v1alpha1
kind: Job
metadata:
  name: e2e-shell
spec:
  tasks:
    - name: main
      agentType: Raw
      role: Actor
      tensorBoardDir: /tmp/e2e-tensorboard
      raw:
        entrypoint: ["python3", "-m", "http.server", "${httpPort}", "--bind", "127.0.0.1"]
        replicas: 1
`;

test('the console in a real browser against rlark up', { timeout: 300_000 }, async (t) => {
  const { playwright, skip } = await prerequisites();
  if (skip) return t.skip(skip);
  const dataDir = mkdtempSync(join(tmpdir(), 'rlark-e2e-'));
  const port = await freePort();
  const up = startUp(join(dataDir, 'data'), port);
  let browser;
  try {
    const { link, url } = await up.ready;
    const kube = join(dataDir, 'data');
    browser = await launch(playwright);
    // The server's certificate is signed by the installation's own CA.
    const admin = await newContext(browser, url);
    if (!(await consoleCheck(admin.request, url))) t.diagnostic('RLARK_E2E_SERVE_DIST=1: the console is loaded from web/dist, not from the binary');
    // Every Content-Security-Policy violation on the admin's pages (none is expected: the
    // policy has no 'unsafe-inline' and the app needs none), reported through a CDP binding.
    const cspViolations = [];
    await watchCspViolations(admin, cspViolations);
    const page = await admin.newPage();
    const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });

    // ---- login with the one-time link ----
    const started = Date.now();
    // A client that only loads the link (a link preview) does not spend it.
    const preview = await newContext(browser, url);
    const previewPage = await preview.newPage();
    await previewPage.goto(link);
    await previewPage.getByTestId('login-link').waitFor();
    assert.ok(!previewPage.url().includes('login='), 'the code left the preview\'s address bar');
    await preview.close();
    const first = await page.goto(link);
    const csp = first.headers()['content-security-policy'];
    assert.match(csp, /script-src 'self'/);
    assert.match(csp, /frame-ancestors 'none'/);
    assert.match(csp, /style-src 'self';/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
    await page.getByTestId('login-link').click();
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
    const reuse = await newContext(browser, url);
    const reusePage = await reuse.newPage();
    await reusePage.goto(link);
    await reusePage.getByTestId('login-link').click();
    await reusePage.getByRole('alert').filter({ hasText: 'used or expired' }).waitFor();
    await reusePage.getByRole('alert').filter({ hasText: 'rlark token login-link' }).waitFor();
    await reuse.close();
    // `rlark token login-link` makes another one for the kubeconfig's user.
    const cliLink = rlark(kube, 'token', 'login-link');
    assert.match(cliLink, new RegExp(`^${url.replace(/[.]/g, '\\.')}/#login=[0-9a-f]{64}$`));
    const second = await newContext(browser, url);
    const secondPage = await second.newPage();
    await secondPage.goto(cliLink);
    await secondPage.getByTestId('login-link').click();
    await secondPage.getByTestId('user').filter({ hasText: 'admin (admin)' }).waitFor();
    await second.close();

    // ---- overview numbers match the API ----
    const clusters = await (await page.request.get(`${url}/rlark/v1/clusters`)).json();
    const online = clusters.items.reduce((n, c) => n + c.onlineNodes, 0);
    const total = clusters.items.reduce((n, c) => n + c.totalNodes, 0);
    assert.ok(total > 0, 'rlark up has local agents');
    await page.getByTestId('card-nodes-online').filter({ hasText: `${online} / ${total}` }).waitFor();
    await page.getByTestId('card-clusters').filter({ hasText: String(clusters.items.length) }).waitFor();
    await shot('overview');
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the overview');

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
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the nodes page');
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
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the create page');

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
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the task page');

    // ---- a reload keeps the session; keyboard: the skip link, the main navigation ----
    await page.reload();
    await page.getByTestId('user').waitFor();
    const taskPage = page.url();
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.textContent), 'Skip to content');
    await page.keyboard.press('Enter');
    assert.equal(page.url(), taskPage, 'the skip link keeps the page (routes live in the hash)');
    assert.equal(await page.evaluate(() => document.activeElement?.id), 'content');
    await page.getByRole('heading', { name: /Task e2e-hello-main/ }).waitFor();
    await page.keyboard.press('Shift+Tab');
    assert.equal((await focused(page))?.name, 'Log out', 'Shift+Tab from the content goes back through the header');

    // ---- keyboard: every control of the main pages is reached by Tab with a visible focus,
    // and the pages are worked by keyboard alone ----
    const audited = [];
    audited.push(`task ${await keyboardAudit(page, 'the task page')}`);
    await tabFromTop(page, 'Jobs');
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Jobs' }).waitFor();
    audited.push(`jobs ${await keyboardAudit(page, 'the jobs page')}`);
    await tabFromTop(page, 'Filter jobs by name');
    await page.keyboard.type('e2e-hel');
    await page.getByText(/^1 of \d+ jobs$/).waitFor();
    await tabTo(page, 'e2e-hello');
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: /Job e2e-hello/ }).waitFor();
    audited.push(`job ${await keyboardAudit(page, 'the job page')}`);
    await tabFromTop(page, 'Clusters');
    await page.keyboard.press('Enter');
    const kbdCordon = await tabTo(page, /^Cordon node /);
    const kbdNode = kbdCordon.name.replace('Cordon node ', '');
    await page.keyboard.press('Space');
    await page.locator(`tr[data-node="${kbdNode}"]`).getByTestId('schedulable').filter({ hasText: 'Cordoned' }).waitFor();
    assert.equal((await focused(page))?.name, `Uncordon node ${kbdNode}`, 'the focus stays on the button');
    await page.keyboard.press('Space');
    await page.locator(`tr[data-node="${kbdNode}"]`).getByTestId('schedulable').filter({ hasText: 'Yes' }).waitFor();
    audited.push(`clusters ${await keyboardAudit(page, 'the clusters page')}`);
    await tabFromTop(page, 'Create');
    await page.keyboard.press('Enter');
    await tabTo(page, 'Manifest (YAML)');
    await page.keyboard.press('Control+A');
    await page.keyboard.insertText(INVALID_JOB);
    await tabTo(page, 'Create');
    await page.keyboard.press('Enter');
    await tabTo(page, 'line 9');
    await page.keyboard.press('Enter');
    assert.equal((await focused(page))?.id, 'manifest', 'the error\'s line button goes to the editor');
    assert.equal(await page.evaluate(() => { const t = document.activeElement; return t.value.slice(t.selectionStart, t.selectionEnd); }), '      role: Wizard');
    audited.push(`create ${await keyboardAudit(page, 'the create page')}`);
    // Each page with what must be in it before its controls are counted.
    for (const [link, heading, ready] of [
      ['Overview', 'Overview', '[data-testid="card-clusters"]'],
      ['Workflows', 'Workflows', null],
      ['Tasks', 'Tasks', null],
      ['Domains', 'Domains', null],
      ['Devices', 'Devices', 'tr[data-robot="arm-0"] button, tr[data-camera="cam-0"] button'],
      ['SSH keys', 'SSH keys', '[data-testid="ssh-command"]'],
      ['Admin', 'Administration', 'table[aria-label="Certificates"] tbody tr'],
    ]) {
      await tabFromTop(page, link);
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { name: heading, exact: true }).waitFor();
      if (ready) await page.locator(ready).first().waitFor();
      if (link === 'Devices') {
        await page.locator('tr[data-robot="arm-0"] button').first().waitFor();
        await page.locator('tr[data-camera="cam-0"] button').first().waitFor();
      }
      audited.push(`${link} ${await keyboardAudit(page, `the ${link} page`)}`);
    }
    t.diagnostic(`keyboard: every control reached by Tab with a visible focus (page controls): ${audited.join(', ')}`);
    await page.goto(taskPage);
    await page.getByRole('heading', { name: /Task e2e-hello-main/ }).waitFor();

    // ---- a running task: terminal, live reward chart, stop and delete ----
    await page.getByRole('link', { name: 'Create' }).click();
    const httpPort = await freePort();
    await page.getByLabel('Manifest (YAML)').fill(SHELL_JOB(httpPort));
    await page.getByRole('button', { name: 'Create' }).click();
    await page.getByRole('heading', { name: /Job e2e-shell/ }).waitFor();
    await page.getByRole('table', { name: 'Tasks' }).getByRole('link', { name: 'e2e-shell-main' }).click();
    const openTerminal = page.getByRole('button', { name: 'Open a terminal in e2e-shell-main-0' });
    await openTerminal.waitFor({ timeout: 60_000 });
    // By keyboard: the terminal takes the focus once connected.
    await tabFromTop(page, 'Open a terminal in e2e-shell-main-0');
    await page.keyboard.press('Enter');
    await page.getByTestId('terminal-state').filter({ hasText: 'connected' }).waitFor({ timeout: 30_000 });
    await page.waitForFunction(() => document.activeElement?.classList.contains('xterm-helper-textarea'));
    await page.keyboard.type('echo hi\n');
    const rows = page.locator('.xterm-rows > div');
    await page.waitForFunction(() => [...document.querySelectorAll('.xterm-rows > div')].some((r) => r.textContent.trim() === 'hi'), null, { timeout: 15_000 });
    assert.ok((await rows.count()) > 0);
    // The terminal's generated rules apply without inline styles: no <style> element, and
    // its theme (white text) and cell sizes come from constructed sheets.
    assert.equal(await page.evaluate(() => document.querySelectorAll('style').length), 0);
    assert.equal(await page.evaluate(() => getComputedStyle(document.querySelector('.xterm-rows')).color), 'rgb(255, 255, 255)');
    assert.equal(await page.evaluate(() => getComputedStyle(document.querySelector('.xterm-rows span')).display), 'inline-block');
    await shot('terminal');
    // Tab stays in the shell; Shift+Tab leaves the terminal for its Close button.
    await page.keyboard.press('Tab');
    assert.equal(await page.evaluate(() => document.activeElement?.classList.contains('xterm-helper-textarea')), true);
    await page.keyboard.press('Shift+Tab');
    assert.deepEqual(await focused(page).then((f) => [f.name, f.visible]), ['Close terminal', true]);

    const tasks = await (await page.request.get(`${url}/apis/rlinf.io/v1alpha1/tasks?labelSelector=rlinf.io/job=e2e-shell`)).json();
    const taskNs = tasks.items[0].metadata.namespace;
    const { csrfToken } = await (await page.request.get(`${url}/rlark/v1/console/session`)).json();
    const post = async (step) => {
      const r = await page.request.post(`${url}/rlark/v1/namespaces/${taskNs}/tasks/e2e-shell-main/reports`, {
        data: { type: 'reward', value: step * 1.5, step },
        headers: { 'X-Rlark-CSRF': csrfToken },
      });
      assert.equal(r.status(), 201, await r.text());
    };
    for (const step of [1, 2, 3]) await post(step);
    const chart = page.locator('figure[data-series="reward"]');
    await page.locator('figure[data-series="reward"][data-points="3"]').waitFor({ timeout: 15_000 });
    for (const step of [4, 5]) await post(step);
    // The chart grows without a reload.
    await page.locator('figure[data-series="reward"][data-points="5"]').waitFor({ timeout: 15_000 });
    assert.match(await chart.locator('figcaption').textContent(), /last 7\.5 \(min 1\.5, max 7\.5\)/);
    await shot('reward-chart');

    // ---- the task HTTP proxy: a button opens a port of the replica in a new tab, on the ----
    // ---- task proxy's own origin (a one-time ticket), where the app cannot act as the admin ----
    const webApps = page.getByRole('region', { name: 'Web apps' });
    // The replica's TensorBoard as its Pod reports it: a button when the node has
    // `tensorboard` (scripts/test.sh installs it), else the reason.
    let hasTensorBoard = true;
    try {
      execFileSync('sh', ['-c', 'command -v tensorboard'], { stdio: 'ignore' });
    } catch {
      hasTensorBoard = false;
    }
    if (hasTensorBoard) {
      await webApps.getByTestId('tensorboard-link-0').waitFor({ timeout: 30_000 });
    } else {
      await webApps.getByTestId('tensorboard-status-0').filter({ hasText: 'TensorBoard was not started' }).waitFor({ timeout: 30_000 });
    }
    await webApps.getByLabel('Port').fill('99999');
    await webApps.getByText('99999 is not a port').waitFor();
    await webApps.getByLabel('Port').fill(String(httpPort));
    const proxyButton = webApps.getByRole('button', { name: `Open port ${httpPort} of e2e-shell-main-0` });
    assert.equal(await page.locator('a[href*="/proxy/"]').count(), 0, 'no link to the proxy on the console origin');
    const [proxied] = await Promise.all([admin.waitForEvent('page'), proxyButton.click()]);
    await proxied.getByText('Directory listing for /').waitFor({ timeout: 15_000 });
    const appUrl = new URL(proxied.url());
    assert.notEqual(appUrl.origin, new URL(url).origin, `the task app runs on the console's origin: ${proxied.url()}`);
    assert.notEqual(appUrl.hostname, new URL(url).hostname, 'another host, not only another port (cookies are per host)');
    assert.equal(appUrl.pathname, `/rlark/v1/namespaces/${taskNs}/tasks/e2e-shell-main/proxy/${httpPort}/`);
    assert.ok(!proxied.url().includes('ticket='), `the ticket stayed in the address bar: ${proxied.url()}`);
    assert.equal(await proxied.evaluate(() => window.opener), null, 'the tab is cut from the console (noopener)');
    // A script of the app cannot read the console's session (nor its CSRF token): the
    // console answers no CORS, so a credentialed fetch fails and a no-cors one is opaque.
    const leak = await proxied.evaluate(async (consoleUrl) => {
      const out = {};
      try {
        const r = await fetch(`${consoleUrl}/rlark/v1/console/session`, { credentials: 'include' });
        out.cors = { status: r.status, text: await r.text() };
      } catch (e) {
        out.cors = { error: String(e) };
      }
      const opaque = await fetch(`${consoleUrl}/rlark/v1/console/session`, { credentials: 'include', mode: 'no-cors' });
      out.noCors = { type: opaque.type, status: opaque.status, text: await opaque.text() };
      // On its own origin the console's routes do not exist.
      const local = await fetch('/rlark/v1/console/session', { credentials: 'include' });
      out.local = { status: local.status, text: await local.text() };
      return out;
    }, url);
    assert.ok(leak.cors.error, `a credentialed cross-origin read succeeded: ${JSON.stringify(leak)}`);
    assert.deepEqual(leak.noCors, { type: 'opaque', status: 0, text: '' });
    assert.equal(leak.local.status, 404, JSON.stringify(leak));
    assert.ok(!leak.local.text.includes('csrfToken'), JSON.stringify(leak));
    // The proxy origin's cookie: HttpOnly, Lax, on its host only; the console's is not there.
    const appCookies = await admin.cookies(appUrl.origin);
    assert.deepEqual(
      appCookies.map((c) => [c.name, c.httpOnly, c.secure, c.sameSite, c.path]),
      [['__Host-rlark_proxy', true, true, 'Lax', '/']],
    );
    assert.equal(await proxied.evaluate(() => document.cookie), '', 'the app reads no rlark cookie');
    await proxied.close();

    await page.getByRole('link', { name: 'e2e-shell' }).first().click();
    await page.getByRole('button', { name: 'Stop' }).click();
    await page.getByRole('heading', { name: /Job e2e-shell/ }).locator('.phase-stopped').waitFor({ timeout: 60_000 });
    await page.getByRole('button', { name: 'Resume' }).waitFor();
    page.once('dialog', (dialog) => dialog.accept());
    await page.getByRole('button', { name: 'Delete' }).click();
    await page.getByRole('heading', { name: 'Jobs' }).waitFor();
    await page.waitForFunction(() => !document.body.textContent.includes('e2e-shell'), null, { timeout: 30_000 });

    // ---- domains and devices ----
    rlark(kube, 'apply', '-f', join(ROOT, 'examples', 'domain.yaml'));
    await page.getByRole('link', { name: 'Domains' }).click();
    await page.getByRole('table', { name: 'Domains' }).getByRole('row').filter({ hasText: '10.88.0.0/16' }).waitFor();
    await page.getByRole('link', { name: 'demo-net' }).click();
    await page.getByRole('heading', { name: 'Domain demo-net' }).waitFor();
    await page.getByRole('link', { name: 'Devices' }).click();
    const devices = page.getByRole('table', { name: 'Devices' }).getByRole('row').filter({ hasText: 'Healthy' });
    await devices.first().waitFor();
    assert.ok((await devices.count()) >= 4, 'rlark up offers two simulated arms and two cameras');
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the devices page');

    // ---- a camera's live view, relayed from the edge agent through its tunnel ----
    const socketDir = up.output().out.match(/--socket-dir (\S+) list/)[1];
    const camera = page.getByTestId('camera-cam-0');
    const cameraStatus = page.getByTestId('camera-status-cam-0');
    const framesShown = async () => Number((await camera.getAttribute('data-frames')) ?? 0);
    await page.getByRole('button', { name: /^View camera cam-0 on / }).click();
    // Closed cameras are not opened by viewing: the reason is shown, and the view tries again.
    await cameraStatus.filter({ hasText: /not open.*opening it again/ }).waitFor({ timeout: 15_000 });
    // An admin opens it from the page; the view starts by itself.
    const cam0 = page.locator('tr[data-camera="cam-0"]');
    await page.getByRole('button', { name: 'Open camera cam-0' }).click();
    await cam0.getByTestId('camera-state').filter({ hasText: 'OPEN' }).waitFor({ timeout: 15_000 });
    await cameraStatus.filter({ hasText: 'live' }).waitFor({ timeout: 30_000 });
    await page.getByRole('button', { name: 'Close view' }).click();
    // cam-1 opened with the CLI: the page shows it without a reload.
    execFileSync(RLARK, ['camera', '--socket-dir', socketDir, 'open', 'cam-1'], { encoding: 'utf8' });
    await page.locator('tr[data-camera="cam-1"]').getByTestId('camera-state').filter({ hasText: 'OPEN' }).waitFor({ timeout: 15_000 });
    await page.getByRole('button', { name: /^View camera cam-0 on / }).click();
    await page.waitForFunction(() => document.querySelector('[data-testid="camera-cam-0"]')?.naturalWidth > 0, null, { timeout: 15_000 });
    const pixels = () =>
      camera.evaluate((img) => {
        const canvas = document.createElement('canvas');
        canvas.width = img.naturalWidth;
        canvas.height = img.naturalHeight;
        const ctx = canvas.getContext('2d');
        ctx.drawImage(img, 0, 0);
        return Array.from(ctx.getImageData(0, 0, canvas.width, canvas.height).data.filter((_, i) => i % 97 === 0)).join(',');
      });
    const frameBefore = await pixels();
    await page.waitForTimeout(1500);
    const frameAfter = await pixels();
    assert.notEqual(frameBefore, frameAfter, 'the simulated camera\'s frames change over time');
    await shot('camera');
    // The stream drops (the camera is closed behind the page's back): the view says so and
    // reopens by itself once the camera is open again.
    execFileSync(RLARK, ['camera', '--socket-dir', socketDir, 'close', 'cam-0'], { encoding: 'utf8' });
    await cameraStatus.filter({ hasText: /opening it again/ }).waitFor({ timeout: 15_000 });
    await cam0.getByTestId('camera-state').filter({ hasText: 'CLOSED' }).waitFor({ timeout: 15_000 });
    const beforeDrop = await framesShown();
    execFileSync(RLARK, ['camera', '--socket-dir', socketDir, 'open', 'cam-0'], { encoding: 'utf8' });
    await cameraStatus.filter({ hasText: 'live' }).waitFor({ timeout: 30_000 });
    await page.waitForFunction((n) => Number(document.querySelector('[data-testid="camera-cam-0"]')?.dataset.frames) > n + 2, beforeDrop, { timeout: 15_000 });
    await page.getByRole('button', { name: 'Close view' }).click();
    await page.getByRole('button', { name: 'Close camera cam-0' }).click();
    await cam0.getByTestId('camera-state').filter({ hasText: 'CLOSED' }).waitFor({ timeout: 15_000 });

    // ---- robots: start, switch mode, stop, through the edge agent ----
    const arm = page.locator('tr[data-robot="arm-0"]');
    await arm.waitFor({ timeout: 15_000 });
    await page.getByRole('button', { name: 'Start arm-0', exact: true }).click();
    await arm.getByTestId('robot-state').filter({ hasText: 'RUNNING' }).waitFor({ timeout: 30_000 });
    await page.getByLabel('Mode for arm-0').fill('teleop');
    await page.getByRole('button', { name: 'Switch arm-0 to the mode' }).click();
    await arm.getByTestId('robot-mode').filter({ hasText: 'teleop' }).waitFor({ timeout: 30_000 });
    // Its modes (with their launch files) and its log, from the embodied runtime.
    await page.getByRole('button', { name: 'Modes and log of arm-0' }).click();
    await page.getByRole('table', { name: 'Modes of arm-0' }).locator('tr[data-mode="teleop"]').waitFor({ timeout: 15_000 });
    const robotLog = page.getByTestId('robot-log-arm-0');
    await robotLog.filter({ hasText: 'switch to mode teleop' }).waitFor({ timeout: 15_000 });
    await shot('robots');
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the robot details');
    await page.getByRole('button', { name: 'Stop arm-0' }).click();
    await arm.getByTestId('robot-state').filter({ hasText: 'STOPPED' }).waitFor({ timeout: 30_000 });
    // The log is read again after the action.
    await robotLog.filter({ hasText: /STOPPED\s*$/ }).waitFor({ timeout: 15_000 });
    // A custom launch file: `rlark up`'s runtime allows no launch packages, and its reason
    // comes back through the agent and the server.
    await page.getByRole('combobox', { name: 'Launch package' }).fill('rlark_sim');
    await page.getByRole('textbox', { name: 'Launch file' }).fill('arm.launch');
    await page.getByRole('button', { name: 'Start arm-0 with this launch file' }).click();
    await page.getByRole('alert').filter({ hasText: 'custom launch of package "rlark_sim" on robot "arm-0" is not allowed' }).waitFor({ timeout: 30_000 });
    // A mode the robot's type does not have is refused with the runtime's reason.
    await page.getByLabel('Mode for arm-0').fill('dance');
    await page.getByRole('button', { name: 'Start arm-0', exact: true }).click();
    await page.getByRole('alert').filter({ hasText: 'dance' }).waitFor({ timeout: 30_000 });
    // Launch arguments, as `rlark robot start --arg NAME=VALUE`.
    const arm1 = page.locator('tr[data-robot="arm-1"]');
    await page.getByLabel('Launch arguments for arm-1 (NAME=VALUE ...)').fill('speed');
    await page.getByRole('button', { name: 'Start arm-1', exact: true }).click();
    await page.getByRole('alert').filter({ hasText: 'must be NAME=VALUE' }).waitFor();
    await page.getByLabel('Mode for arm-1').fill('teleop');
    await page.getByLabel('Launch arguments for arm-1 (NAME=VALUE ...)').fill('target=0.2,0.2,0.2,0.2,0.2,0.2 speed=2');
    await page.getByRole('button', { name: 'Start arm-1', exact: true }).click();
    await arm1.getByTestId('robot-state').filter({ hasText: 'RUNNING' }).waitFor({ timeout: 30_000 });
    await arm1.getByTestId('robot-mode').filter({ hasText: 'teleop' }).waitFor();
    await page.getByRole('button', { name: 'Stop arm-1' }).click();
    await arm1.getByTestId('robot-state').filter({ hasText: 'STOPPED' }).waitFor({ timeout: 30_000 });
    // Live: a robot started and stopped behind the page's back (the CLI, on the edge host)
    // changes on the page without a reload or an action there.
    execFileSync(RLARK, ['robot', '--socket-dir', socketDir, 'start', 'arm-1', '--mode', 'teleop'], { encoding: 'utf8' });
    await arm1.getByTestId('robot-state').filter({ hasText: 'RUNNING' }).waitFor({ timeout: 15_000 });
    await arm1.getByTestId('robot-mode').filter({ hasText: 'teleop' }).waitFor();
    execFileSync(RLARK, ['robot', '--socket-dir', socketDir, 'stop', 'arm-1'], { encoding: 'utf8' });
    await arm1.getByTestId('robot-state').filter({ hasText: 'STOPPED' }).waitFor({ timeout: 15_000 });

    // ---- admin: a join command, a user token made and revoked ----
    await page.getByRole('link', { name: 'Admin' }).click();
    await page.getByLabel('Cluster ID').fill('edge-9');
    await page.getByRole('button', { name: 'Create join token' }).click();
    const joinText = await page.getByTestId('join command').textContent();
    assert.match(joinText, new RegExp(`^rlark join --server ${url.replace(/[.]/g, '\\.')} --token \\S+ --ca-hash sha256:[0-9a-f]+ --cluster-id edge-9$`));
    // The lists follow changes pushed by the server: the join token made here, and a join
    // token and a user token made with the CLI, appear without a reload.
    const joinTokens = page.getByRole('table', { name: 'Join tokens' });
    await joinTokens.getByRole('row').filter({ hasText: 'edge-9' }).waitFor({ timeout: 15_000 });
    rlark(kube, 'token', 'create', '--cluster-id', 'edge-cli');
    await joinTokens.getByRole('row').filter({ hasText: 'edge-cli' }).waitFor({ timeout: 15_000 });
    const carlToken = rlark(kube, 'token', 'create', '--user', 'carl', '--role', 'viewer');
    await page.locator(`tr[data-token="${carlToken.split('.')[0]}"]`).filter({ hasText: 'carl' }).waitFor({ timeout: 15_000 });
    await page.getByLabel('User', { exact: true }).fill('tess');
    await page.getByRole('button', { name: 'Create user token' }).click();
    const tessToken = await page.getByTestId('user token').textContent();
    const tessId = tessToken.split('.')[0];
    await page.getByRole('table', { name: 'Certificates' }).getByRole('row').nth(1).waitFor();
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the admin page');
    await shot('admin');
    const tess = await newContext(browser, url);
    const tpage = await tess.newPage();
    await tpage.goto(url + '/');
    await tpage.getByLabel('Bearer token').fill(tessToken);
    await tpage.getByRole('button', { name: 'Log in' }).click();
    await tpage.getByTestId('user').filter({ hasText: 'tess (viewer)' }).waitFor();
    await page.getByLabel('Token ID').fill(tessId);
    await page.getByRole('button', { name: 'Revoke token', exact: true }).click();
    await page.getByRole('status').filter({ hasText: `Token ${tessId} revoked.` }).waitFor();
    // Revoking the token ends the session it logged in.
    assert.equal((await tpage.request.get(`${url}/rlark/v1/console/session`)).status(), 401);
    await page.locator(`tr[data-token="${tessId}"]`).getByTestId('token-revoked').filter({ hasText: /\d{4}-/ }).waitFor();
    await tess.close();

    // ---- SSH keys: the endpoint; a link session cannot register keys ----
    await page.getByRole('link', { name: 'SSH keys' }).click();
    assert.match(await page.getByTestId('ssh-command').textContent(), /^ssh -p \d+ TASK@127\.0\.0\.1$/);
    assert.match(await page.getByTestId('ssh-host-key').textContent(), /^SHA256:/);
    await page.getByTestId('ssh-key-needs-token').waitFor();
    assert.equal(await page.getByRole('button', { name: 'Register key' }).isDisabled(), true);
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the SSH keys page');

    // ---- 1,000 Jobs: paged reads, a windowed list, filters ----
    {
      const { csrfToken: csrf } = await (await page.request.get(`${url}/rlark/v1/console/session`)).json();
      const bulk = (i) => ({
        apiVersion: 'rlinf.io/v1alpha1',
        kind: 'Job',
        metadata: { name: `bulk-${String(i).padStart(4, '0')}` },
        spec: { stopped: true, tasks: [{ name: 'main', agentType: 'Raw', role: 'Actor', raw: { entrypoint: ['true'], replicas: 1 } }] },
      });
      const started = Date.now();
      for (let i = 0; i < 1000; i += 50) {
        const batch = Array.from({ length: 50 }, (_, k) => page.request.post(`${url}/apis/rlinf.io/v1alpha1/jobs`, { data: bulk(i + k), headers: { 'X-Rlark-CSRF': csrf } }));
        for (const r of await Promise.all(batch)) assert.equal(r.status(), 201, await r.text());
      }
      const shown = Date.now();
      await page.getByRole('link', { name: 'Jobs', exact: true }).click();
      await page.getByText(/^\d+ of (100[0-9]) jobs$/).waitFor({ timeout: 30_000 });
      const listMs = Date.now() - shown;
      const rows = await page.getByRole('table', { name: 'Jobs' }).locator('.vlist-row').count();
      assert.ok(rows < 60, `only the rows in view are in the page (${rows})`);
      // The header sits above the rows: it covers none of the first one.
      const table = page.getByRole('table', { name: 'Jobs' });
      const head = await table.locator('.vlist-head').boundingBox();
      const firstRow = await table.locator('[role=rowgroup] .vlist-row').first().boundingBox();
      assert.ok(head && firstRow && head.y + head.height <= firstRow.y + 0.5, `the header overlaps the first row: ${JSON.stringify({ head, firstRow })}`);
      await page.getByLabel('Filter jobs by name').fill('bulk-09');
      await page.getByText('100 of ', { exact: false }).waitFor();
      await shot('jobs-1000');
      await page.getByLabel('Filter jobs by name').fill('');
      t.diagnostic(`1,000 Jobs created in ${Date.now() - started - listMs} ms; the Jobs page listed them in ${listMs} ms with ${rows} rows in the DOM`);
    }

    // ---- a viewer: reads everything, no write buttons, a forged write is refused ----
    const viewerToken = rlark(kube, 'token', 'create', '--user', 'vera', '--role', 'viewer');
    const viewer = await newContext(browser, url);
    const vpage = await viewer.newPage();
    await vpage.goto(url + '/');
    await vpage.getByLabel('Bearer token').fill(viewerToken);
    await vpage.getByRole('button', { name: 'Log in' }).click();
    await vpage.getByTestId('user').filter({ hasText: 'vera (viewer)' }).waitFor();
    assert.equal(await vpage.getByRole('link', { name: 'Create' }).count(), 0);
    assert.equal(await vpage.getByRole('link', { name: 'Admin' }).count(), 0);
    await vpage.getByRole('link', { name: 'Clusters' }).click();
    await vpage.locator(`tr[data-node="${nodeName}"]`).waitFor();
    assert.equal(await vpage.getByRole('button', { name: /cordon/i }).count(), 0);
    await vpage.getByRole('link', { name: 'Devices' }).click();
    await vpage.locator('tr[data-robot="arm-0"]').waitFor();
    assert.equal(await vpage.getByRole('button', { name: /^(Start|Stop|Reset) arm/ }).count(), 0, 'a viewer sees no robot actions');
    assert.equal(await vpage.getByRole('button', { name: /^(Open|Close) camera/ }).count(), 0, 'a viewer opens no camera');
    assert.equal(await vpage.getByRole('button', { name: /^View camera cam-1/ }).count(), 1, 'a viewer may view');
    await vpage.getByRole('button', { name: 'Modes and log of arm-0' }).click();
    await vpage.getByTestId('robot-log-arm-0').filter({ hasText: 'switch to mode teleop' }).waitFor({ timeout: 15_000 });
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
    const edgeNode = (await (await vpage.request.get(`${url}/apis/rlinf.io/v1alpha1/namespaces/rlark-edge/nodes`)).json()).items[0].metadata.name;
    const forgedRobot = await vpage.request.post(`${url}/rlark/v1/namespaces/rlark-edge/nodes/${edgeNode}/robots/arm-0/start`, {
      data: {},
      headers: { 'X-Rlark-CSRF': session.csrfToken },
    });
    assert.equal(forgedRobot.status(), 403);

    // ---- a viewer registers an SSH key, the admin sees it live, the viewer removes it ----
    await page.getByRole('link', { name: 'SSH keys' }).click();
    await page.getByRole('heading', { name: "Everyone's keys" }).waitFor();
    const keyFile = join(dataDir, 'vera_ed25519');
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'vera@e2e', '-f', keyFile]);
    const publicKey = readFileSync(`${keyFile}.pub`, 'utf8').trim();
    await vpage.getByRole('link', { name: 'SSH keys' }).click();
    await vpage.getByLabel(/^Public key/).fill(publicKey);
    await vpage.getByRole('button', { name: 'Register key' }).click();
    await vpage.getByRole('status').filter({ hasText: /^Key SHA256:\S+ registered\.$/ }).waitFor();
    const veraKey = vpage.getByRole('table', { name: 'SSH keys' }).getByRole('row').filter({ hasText: 'vera@e2e' });
    await veraKey.waitFor();
    const keyId = await veraKey.getAttribute('data-ssh-key');
    assert.match(await veraKey.textContent(), new RegExp(`token ${viewerToken.split('.')[0]}`), 'registered with the token vera logged in with');
    // Registering the same key again is refused with the server's reason.
    await vpage.getByLabel(/^Public key/).fill(publicKey);
    await vpage.getByRole('button', { name: 'Register key' }).click();
    await vpage.getByRole('alert').filter({ hasText: /registered/ }).waitFor();
    await page.locator(`tr[data-ssh-key="${keyId}"]`).filter({ hasText: 'vera' }).waitFor({ timeout: 15_000 });
    vpage.once('dialog', (dialog) => dialog.accept());
    await vpage.getByRole('button', { name: `Remove SSH key ${keyId} of vera` }).click();
    await vpage.getByRole('status').filter({ hasText: 'removed' }).waitFor();
    await vpage.locator(`tr[data-ssh-key="${keyId}"]`).waitFor({ state: 'detached', timeout: 15_000 });
    // The admin's page drops it without a reload.
    await page.locator(`tr[data-ssh-key="${keyId}"]`).waitFor({ state: 'detached', timeout: 15_000 });
    const keysLeft = await (await page.request.get(`${url}/rlark/v1/sshkeys?user=vera`)).json();
    assert.deepEqual(keysLeft.items, []);

    // ---- no CSP violation on any admin page; and the check sees one when there is ----
    assert.deepEqual(cspViolations, [], 'Content-Security-Policy violations');
    await page.evaluate(() => {
      const style = document.createElement('style');
      style.textContent = 'body { color: red; }';
      document.head.append(style);
    });
    await waitFor(() => cspViolations.length > 0, 'a <style> element is refused and reported');
    assert.match(cspViolations[0], /^style-src/);

    // ---- logout revokes the session ----
    await page.getByRole('button', { name: 'Log out' }).click();
    await page.getByLabel('Bearer token').waitFor();
    const after = await page.request.get(`${url}/rlark/v1/console/session`);
    assert.equal(after.status(), 401);
    // The viewer's own session is untouched.
    assert.equal((await vpage.request.get(`${url}/rlark/v1/console/session`)).status(), 200);

    // ---- report bundle size and first-load time ----
    const assets = join(WEB, 'dist', 'assets');
    const size = (pred) => readdirSync(assets).filter(pred).reduce((n, f) => n + statSync(join(assets, f)).size, 0);
    const firstLoad = size((f) => f.startsWith('index-'));
    const everything = size(() => true);
    t.diagnostic(
      `console bundle: ${(firstLoad / 1024).toFixed(1)} KiB loaded first, ${(everything / 1024).toFixed(1)} KiB with the terminal (uncompressed); first load to logged-in overview: ${firstLoadMs} ms`,
    );
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

// A training run that reports: posts `rewardAt(scale, k)` at step 10k (k = 1..POSTS) and a
// loss, with the environment the agent gives a raw replica (RLARK_REPORT_URL, RLARK_TOKEN,
// RLARK_CA_FILE), then sleeps so the task stays Running (bounded: 10 minutes).
const POSTS = 12;
const rewardAt = (scale, k) => Number((scale * k + 0.1 * Math.sin(k)).toFixed(6));
/** A value as the console prints it: four significant digits, no trailing zeros. */
const fmt = (v) => String(Number(v.toPrecision(4)));
const REPORTER = `
import json, math, os, ssl, sys, time, urllib.request
scale = float(sys.argv[1])
ctx = ssl.create_default_context(cafile=os.environ["RLARK_CA_FILE"])
def post(report):
    request = urllib.request.Request(os.environ["RLARK_REPORT_URL"], data=json.dumps(report).encode(), method="POST",
        headers={"Authorization": "Bearer " + os.environ["RLARK_TOKEN"], "Content-Type": "application/json"})
    for attempt in range(40):
        try:
            urllib.request.urlopen(request, context=ctx, timeout=10).read()
            return
        except Exception as e:
            print("retrying a report:", e, flush=True)
            time.sleep(0.5)
    sys.exit("a report could not be posted")
for k in range(1, ${POSTS} + 1):
    post({"type": "reward", "step": 10 * k, "value": round(scale * k + 0.1 * math.sin(k), 6)})
    post({"type": "metrics", "step": 10 * k, "loss": round(1.0 / (k * scale), 6)})
print("posted ${POSTS} rewards", flush=True)
time.sleep(600)
`;
const REPORTING_JOB = (name, scale) => ({
  apiVersion: 'rlinf.io/v1alpha1',
  kind: 'Job',
  metadata: { name },
  spec: { tasks: [{ name: 'train', agentType: 'Raw', role: 'Actor', raw: { entrypoint: ['python3', '-c', REPORTER, String(scale)], replicas: 1 } }] },
});

test('reward charts: axes, hover values and several runs compared', { timeout: 240_000 }, async (t) => {
  const { playwright, skip } = await prerequisites();
  if (skip) return t.skip(skip);
  const dataDir = mkdtempSync(join(tmpdir(), 'rlark-e2e-chart-'));
  const port = await freePort();
  const up = startUp(join(dataDir, 'data'), port);
  let browser;
  try {
    const { link, url } = await up.ready;
    browser = await launch(playwright);
    const admin = await newContext(browser, url);
    if (!(await consoleCheck(admin.request, url))) t.diagnostic('RLARK_E2E_SERVE_DIST=1: the console is loaded from web/dist, not from the binary');
    const cspViolations = [];
    await watchCspViolations(admin, cspViolations);
    const page = await admin.newPage();
    const shot = (name) => page.screenshot({ path: join(ARTIFACTS, `${name}.png`), fullPage: true });
    await page.goto(link);
    await page.getByTestId('login-link').click();
    await page.getByTestId('user').waitFor();

    // ---- two Jobs whose tasks post rewards and a loss ----
    const { csrfToken } = await (await page.request.get(`${url}/rlark/v1/console/session`)).json();
    const runs = [
      { job: 'e2e-ppo-a', scale: 0.5 },
      { job: 'e2e-ppo-b', scale: 0.25 },
    ];
    for (const { job, scale } of runs) {
      const r = await page.request.post(`${url}/apis/rlinf.io/v1alpha1/jobs`, { data: REPORTING_JOB(job, scale), headers: { 'X-Rlark-CSRF': csrfToken } });
      assert.equal(r.status(), 201, await r.text());
    }
    const namespaceOf = async (job) => {
      let items = [];
      const end = Date.now() + 60_000;
      while (items.length === 0 && Date.now() < end) {
        items = (await (await page.request.get(`${url}/apis/rlinf.io/v1alpha1/tasks?labelSelector=rlinf.io/job=${job}`)).json()).items;
        if (items.length === 0) await page.waitForTimeout(250);
      }
      assert.equal(items.length, 1, `Job ${job} has one Task`);
      return items[0].metadata.namespace;
    };
    for (const run of runs) {
      run.task = `${run.job}-train`;
      run.key = `${await namespaceOf(run.job)}/${run.task}`;
    }
    const [a, b] = runs;

    // ---- the task page: its chart with axes, above the log ----
    await page.goto(`${url}/#/tasks/${a.key}`);
    await page.getByRole('heading', { name: new RegExp(`Task ${a.task}`) }).waitFor();
    await page.locator(`figure[data-series="reward"][data-points="${POSTS}"]`).waitFor({ timeout: 90_000 });
    const taskChart = page.locator('figure[data-series="reward"]');
    assert.equal(await taskChart.locator('figcaption strong').textContent(), 'reward');
    const caption = await taskChart.locator('figcaption').textContent();
    assert.ok(caption.startsWith(`reward: ${POSTS} points, last ${fmt(rewardAt(0.5, POSTS))} (min `), caption);
    await page.getByRole('button', { name: `Show log of ${a.task}-0` }).waitFor({ timeout: 30_000 });
    await page.getByTestId('log').filter({ hasText: `posted ${POSTS} rewards` }).waitFor({ timeout: 30_000 });
    const chartBox = await page.getByRole('region', { name: 'Rewards and metrics' }).boundingBox();
    const logBox = await page.getByRole('region', { name: /^Log of / }).boundingBox();
    assert.ok(chartBox.y + chartBox.height <= logBox.y, `the chart comes before the log: ${JSON.stringify({ chartBox, logBox })}`);
    await shot('task-reward-chart');
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the task page with charts');

    // ---- the Tasks list: tick both, Compare rewards ----
    await page.getByRole('link', { name: 'Tasks', exact: true }).click();
    await page.getByLabel('Filter tasks by name').fill('e2e-ppo-');
    // Each row's reward summary (status.reward.summary, folded by the server): last/mean.
    const meanOf = (scale) => Array.from({ length: POSTS }, (_, i) => rewardAt(scale, i + 1)).reduce((x, y) => x + y, 0) / POSTS;
    for (const { task, scale } of runs) {
      const cell = page.getByRole('row').filter({ hasText: task }).locator('[data-reward]');
      await cell.filter({ hasText: `${fmt(rewardAt(scale, POSTS))}/${fmt(meanOf(scale))}` }).waitFor({ timeout: 30_000 });
    }
    const compareButton = page.getByRole('button', { name: 'Compare rewards' });
    await page.getByRole('checkbox', { name: `Compare ${a.key}` }).check();
    assert.equal(await compareButton.isDisabled(), true, 'one run is not a comparison');
    await page.getByRole('checkbox', { name: `Compare ${b.key}` }).check();
    await page.getByText(`2 ticked: ${a.key}, ${b.key}`).waitFor();
    const tasksAudited = await keyboardAudit(page, 'the tasks page with two tasks ticked');
    await compareButton.click();
    await page.getByRole('heading', { name: 'Compare runs' }).waitFor();
    const compareUrl = page.url();
    assert.ok(compareUrl.endsWith(`#/compare?tasks=${a.key},${b.key}`), compareUrl);

    // ---- the overlay: a line per run, axes with round ticks, a legend ----
    const reward = page.locator(`figure[data-series="reward"][data-runs="2"][data-points="${2 * POSTS}"]`);
    await reward.waitFor({ timeout: 30_000 });
    await page.locator('figure[data-series="metrics.loss"][data-runs="2"]').waitFor({ timeout: 30_000 });
    const lines = await reward.locator('polyline').evaluateAll((ps) => ps.map((p) => [p.getAttribute('data-run'), p.getAttribute('points').split(' ').length, getComputedStyle(p).stroke]));
    assert.deepEqual(lines.map(([run, n]) => [run, n]), [
      [a.key, POSTS],
      [b.key, POSTS],
    ]);
    assert.notEqual(lines[0][2], lines[1][2], 'each run has its own colour');
    assert.deepEqual(await reward.getByRole('list', { name: 'Runs in reward' }).getByRole('listitem').allTextContents(), [a.key, b.key]);
    assert.equal(await reward.locator('[data-axis="x"] .chart-axis-label').textContent(), 'step');
    const xTicks = (await reward.locator('[data-axis="x"] .chart-tick').allTextContents()).map(Number);
    assert.ok(xTicks.length >= 3, `x ticks: ${xTicks}`);
    const xStep = xTicks[1] - xTicks[0];
    assert.ok([1, 2, 5].some((m) => [1, 10, 100].some((p) => xStep === m * p)), `a 1-2-5 step between x ticks: ${xTicks}`);
    assert.ok(xTicks[0] >= 10 && xTicks[xTicks.length - 1] <= 10 * POSTS, `x ticks within the steps: ${xTicks}`);
    const yTicks = await reward.locator('[data-axis="y"] .chart-tick').allTextContents();
    assert.ok(yTicks.length >= 3, `y ticks: ${yTicks}`);
    for (const tick of yTicks) assert.match(tick, /^-?\d+(\.\d{1,3})?$/, `a short y tick label: ${yTicks}`);

    // ---- hover: every run's value at the nearest step ----
    const plot = reward.getByRole('img');
    const box = await plot.boundingBox();
    // The view box is 640 wide with the plot from x 58 to 624: the middle step is 10 * 6 or 10 * 7.
    await page.mouse.move(box.x + box.width * ((58 + (624 - 58) * (5.1 / 11)) / 640), box.y + box.height / 2);
    const hover = reward.locator('.chart-hover');
    await hover.waitFor({ timeout: 5_000 });
    const step = Number(await hover.getAttribute('data-step'));
    assert.equal(step, 60, 'the nearest step to the pointer');
    const expected = `step 60: ${a.key}: ${fmt(rewardAt(0.5, 6))}, ${b.key}: ${fmt(rewardAt(0.25, 6))}`;
    assert.equal(await page.getByTestId('readout-reward').textContent(), expected);
    assert.deepEqual(await hover.locator('text').allTextContents(), ['step 60', `${a.key}: ${fmt(rewardAt(0.5, 6))}`, `${b.key}: ${fmt(rewardAt(0.25, 6))}`]);
    assert.equal(await hover.locator('circle').count(), 2, 'a marker on each line');
    await shot('compare-rewards');
    await page.mouse.move(0, 0);
    await hover.waitFor({ state: 'detached', timeout: 5_000 });

    // ---- the keyboard: the chart takes the focus, the arrow keys move along the steps ----
    await tabFromTop(page, new RegExp(`^reward by step for ${a.key.replace(/[.]/g, '\\.')}`));
    await page.getByTestId('readout-reward').filter({ hasText: `step ${10 * POSTS}: ` }).waitFor({ timeout: 5_000 });
    await page.keyboard.press('ArrowLeft');
    await page.getByTestId('readout-reward').filter({ hasText: `step ${10 * (POSTS - 1)}: ${a.key}: ${fmt(rewardAt(0.5, POSTS - 1))}` }).waitFor({ timeout: 5_000 });
    await page.keyboard.press('Home');
    await page.getByTestId('readout-reward').filter({ hasText: `step 10: ${a.key}: ${fmt(rewardAt(0.5, 1))}, ${b.key}: ${fmt(rewardAt(0.25, 1))}` }).waitFor({ timeout: 5_000 });
    const audited = await keyboardAudit(page, 'the compare page');
    assert.deepEqual(await axeViolations(page), [], 'accessibility of the compare page');

    // ---- the link is shareable: opened anew it shows the same runs ----
    const shared = await admin.newPage();
    await shared.goto(compareUrl);
    await shared.locator(`figure[data-series="reward"][data-runs="2"][data-points="${2 * POSTS}"]`).waitFor({ timeout: 30_000 });
    await shared.close();

    // ---- from a task page: compare with other runs, adding one by name ----
    await page.goto(`${url}/#/tasks/${b.key}`);
    await page.getByRole('link', { name: 'Compare with other runs' }).click();
    await page.locator(`figure[data-series="reward"][data-runs="1"][data-points="${POSTS}"]`).waitFor({ timeout: 30_000 });
    await page.getByLabel('Add a run (namespace/task)').fill(a.key);
    await page.getByRole('button', { name: 'Add run' }).click();
    await page.locator(`figure[data-series="reward"][data-runs="2"][data-points="${2 * POSTS}"]`).waitFor({ timeout: 30_000 });
    assert.ok(page.url().endsWith(`#/compare?tasks=${b.key},${a.key}`), page.url());
    await page.getByRole('button', { name: `Remove ${b.key} from the comparison` }).click();
    await page.locator(`figure[data-series="reward"][data-runs="1"][data-points="${POSTS}"] polyline[data-run="${a.key}"]`).waitFor({ timeout: 30_000 });
    assert.deepEqual(await page.locator('figure[data-series="reward"] polyline').evaluateAll((ps) => ps.map((p) => p.getAttribute('data-run'))), [a.key]);

    assert.deepEqual(cspViolations, [], 'Content-Security-Policy violations');
    t.diagnostic(`tasks page (two ticked): ${tasksAudited} and compare page: ${audited} controls reached by Tab; reward x ticks ${xTicks.join(' ')}, y ticks ${yTicks.join(' ')}`);
    for (const { job } of runs) {
      const r = await page.request.delete(`${url}/apis/rlinf.io/v1alpha1/jobs/${job}`, { headers: { 'X-Rlark-CSRF': csrfToken } });
      assert.ok([200, 202].includes(r.status()), await r.text());
    }
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
