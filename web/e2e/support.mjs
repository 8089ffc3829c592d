// Shared by the browser tests: where the binary and the browser are, starting and
// stopping `rlark up`, launching Chromium, and what a missing tool does (fails under
// CI=true or RLARK_REQUIRE_TOOLS=1, else skips with a message).
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const WEB = fileURLToPath(new URL('..', import.meta.url));
export const ROOT = join(WEB, '..');
export const ARTIFACTS = join(WEB, 'e2e', 'artifacts');
export const RLARK = process.env.RLARK_BIN ?? join(process.env.CARGO_TARGET_DIR ?? join(ROOT, 'target'), 'debug', 'rlark');
export const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const REQUIRED = process.env.CI === 'true' || process.env.RLARK_REQUIRE_TOOLS === '1';

function missing(what) {
  if (REQUIRED) throw new Error(`${what}: scripts/test.sh installs it; under CI=true (or RLARK_REQUIRE_TOOLS=1) a missing tool fails the test`);
  return `SKIPPED: ${what} (scripts/test.sh installs it)`;
}

/** playwright-core, or a skip message when the binary, the browser or the package is missing. */
export async function prerequisites() {
  if (!existsSync(RLARK)) return { skip: missing(`the rlark binary is not at ${RLARK} (cargo build -p rlark)`) };
  if (!existsSync(CHROMIUM)) return { skip: missing(`chromium is not installed at ${CHROMIUM}`) };
  try {
    const playwright = await import('playwright-core');
    mkdirSync(ARTIFACTS, { recursive: true });
    return { playwright };
  } catch {
    return { skip: missing('playwright-core is not installed (npm ci in web/)') };
  }
}

// The console the binary serves is web/dist as it was when the binary was built. A binary
// built before web/ changed (RLARK_BIN pointing at an older build) serves an older console:
// `consoleCheck` stops the test and says so, unless RLARK_E2E_SERVE_DIST=1, which has the
// browser load the console's files (`/`, `/assets/*`, `/favicon.svg`) from web/dist instead,
// with the server's own response headers (its Content-Security-Policy included); the API,
// the streams and the login are the server's as ever.
export const SERVE_DIST = process.env.RLARK_E2E_SERVE_DIST === '1';

/** Whether `url` serves the console in web/dist; throws when it does not and
 * RLARK_E2E_SERVE_DIST=1 is not set. `request` is a playwright APIRequestContext. */
export async function consoleCheck(request, url) {
  const served = await (await request.get(`${url}/`)).text();
  const built = readFileSync(join(WEB, 'dist', 'index.html'), 'utf8');
  if (served === built) return true;
  if (SERVE_DIST) return false;
  throw new Error(
    `${RLARK} serves a console built from other sources than web/dist (its index.html differs): rebuild the binary (cargo build -p rlark), or set RLARK_E2E_SERVE_DIST=1 to have the browser load web/dist (with the server's headers)`,
  );
}

const TYPES = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.css': 'text/css', '.svg': 'image/svg+xml' };

/** A browser context for the console at `url` (its CA is the installation's own); with
 * RLARK_E2E_SERVE_DIST=1 its console files come from web/dist (above). */
export async function newContext(browser, url) {
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  if (!SERVE_DIST) return context;
  const origin = new URL(url).origin;
  const isConsoleFile = (u) => u.origin === origin && (u.pathname === '/' || u.pathname === '/favicon.svg' || u.pathname.startsWith('/assets/'));
  await context.route(isConsoleFile, async (route) => {
    const { pathname } = new URL(route.request().url());
    const file = join(WEB, 'dist', pathname === '/' ? 'index.html' : pathname.slice(1));
    if (!pathname.split('/').every((part) => part !== '..') || !existsSync(file)) return route.fulfill({ status: 404, body: 'not found' });
    // The page's headers as the server sends them.
    const headers = (await route.fetch({ url: `${origin}/` })).headers();
    headers['content-type'] = TYPES[file.slice(file.lastIndexOf('.'))] ?? 'application/octet-stream';
    delete headers['content-length'];
    await route.fulfill({ status: 200, headers, body: readFileSync(file) });
  });
  return context;
}

/** Debian's Chromium, headless, with a fresh profile (playwright's default). */
export function launch(playwright) {
  return playwright.chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync',
      // A page fulfilled by the test (RLARK_E2E_SERVE_DIST=1) has no address of its own, so
      // Chromium's local network access checks would refuse its WebSockets to 127.0.0.1.
      ...(SERVE_DIST ? ['--disable-features=LocalNetworkAccessChecks'] : []),
    ],
  });
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on('error', reject);
  });
}

/** Start `rlark up ARGS`; `ready` resolves with its URL and login link once the banner is printed. */
export function startUp(dataDir, port, args = []) {
  const child = spawn(RLARK, ['up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`, ...args], {
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

/** Stop `rlark up` as Ctrl-C does (SIGKILL after 20 s). */
export async function stopUp(up) {
  up.child.kill('SIGINT');
  await new Promise((resolve) => {
    if (up.child.exitCode !== null) return resolve();
    const timer = setTimeout(() => {
      up.child.kill('SIGKILL');
      resolve();
    }, 20_000);
    up.child.on('exit', () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** `rlark ARGS` with the admin kubeconfig of data directory `dataDir`. */
export function rlark(dataDir, ...args) {
  return execFileSync(RLARK, [...args, '--kubeconfig', join(dataDir, 'admin.kubeconfig')], { encoding: 'utf8' }).trim();
}

/** axe-core's WCAG 2 A/AA violations on the page (run through CDP, so the page's CSP,
 * which forbids injected scripts, stays on). */
export async function axeViolations(page) {
  const source = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
  await page.evaluate(source);
  const result = await page.evaluate(() => window.axe.run(document, { runOnly: ['wcag2a', 'wcag2aa'] }));
  return result.violations.map((v) => `${v.id}: ${v.help} (${v.nodes.map((n) => n.target.join(' ')).join(', ')})`);
}

/** Collect every Content-Security-Policy violation of the context's pages into `into`
 * (`"directive blocked-uri"`), through a CDP binding, which the page's CSP does not affect. */
export async function watchCspViolations(context, into) {
  await context.exposeFunction('__rlarkCspViolation', (v) => into.push(v));
  await context.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => window.__rlarkCspViolation(`${e.effectiveDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
  });
}

/** Wait up to `ms` for `predicate()` to hold (for state outside the page). */
export async function waitFor(predicate, what, ms = 10_000) {
  const end = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > end) throw new Error(`timed out waiting: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** What the focused element is: its accessible name (aria-label, label or text) and whether
 * its focus is visible (`:focus-visible` with an outline). */
export function focused(page) {
  return page.evaluate(() => {
    const el = document.activeElement;
    if (!el || el === document.body) return null;
    const label = el.getAttribute('aria-label') ?? el.labels?.[0]?.textContent ?? el.textContent ?? '';
    const style = getComputedStyle(el);
    return {
      name: label.trim().replace(/\s+/g, ' '),
      tag: el.tagName.toLowerCase(),
      id: el.id,
      kbd: el.getAttribute('data-kbd'),
      visible: el.matches(':focus-visible') && style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0,
    };
  });
}

/** Press Tab (Shift+Tab with `back`) until the focused element's name is `name` (a string
 * or a RegExp), at most `max` times; its focus must be visible. */
export async function tabTo(page, name, { max = 120, back = false } = {}) {
  const matches = (n) => (typeof name === 'string' ? n === name : name.test(n));
  for (let i = 0; i < max; i++) {
    await page.keyboard.press(back ? 'Shift+Tab' : 'Tab');
    const f = await focused(page);
    if (f && matches(f.name)) {
      if (!f.visible) throw new Error(`the focus on ${f.tag} ${JSON.stringify(f.name)} is not visible`);
      return f;
    }
  }
  throw new Error(`${max} presses of ${back ? 'Shift+Tab' : 'Tab'} did not reach ${name}`);
}

/** `tabTo` from the top of the page (the skip link, the first stop). */
export async function tabFromTop(page, name, options) {
  await page.evaluate(() => document.querySelector('a.skip')?.focus());
  return tabTo(page, name, options);
}

/** Every enabled, rendered control of the page (links, buttons, fields, scroll regions) is
 * reached by Tab from the top, in one pass, each with a visible focus. Returns how many. */
export async function keyboardAudit(page, what) {
  const total = await page.evaluate(() => {
    const controls = [...document.querySelectorAll('a[href], button, input, select, textarea, [tabindex]:not([tabindex="-1"])')].filter(
      (el) => !el.disabled && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden' && !el.closest('[hidden], [inert], .xterm'),
    );
    document.querySelectorAll('[data-kbd]').forEach((el) => el.removeAttribute('data-kbd'));
    controls.forEach((el, i) => el.setAttribute('data-kbd', String(i)));
    return controls.length;
  });
  await page.evaluate(() => document.querySelector('a.skip')?.focus());
  const reached = new Map();
  for (let i = 0; i < total + 10 && reached.size < total; i++) {
    const f = await focused(page);
    if (f?.kbd != null && !reached.has(f.kbd)) {
      // The skip link was focused by script, which shows focus only after keyboard use.
      if (!f.visible && i > 0) throw new Error(`${what}: the focus on ${f.tag} ${JSON.stringify(f.name)} is not visible`);
      reached.set(f.kbd, f.name);
    }
    await page.keyboard.press('Tab');
  }
  if (reached.size < total) {
    const missed = await page.evaluate((seen) => [...document.querySelectorAll('[data-kbd]')].filter((el) => !seen.includes(el.getAttribute('data-kbd'))).map((el) => `${el.tagName.toLowerCase()} ${JSON.stringify((el.getAttribute('aria-label') ?? el.textContent ?? '').trim().slice(0, 40))}`), [...reached.keys()]);
    throw new Error(`${what}: Tab does not reach ${missed.join(', ')}`);
  }
  return total;
}
