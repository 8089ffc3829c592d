// Records which sources web/dist/ was built from: SHA-256 over every input file (path and
// content, sorted by path) in dist/source-hash.txt. The Rust test
// `console_build_is_current` (crates/rlark-server/tests/console_build.rs) recomputes the
// same hash, so a change to the sources without a rebuild fails the tests.
// Usage: node scripts/stamp.mjs          write the stamp (after `vite build`)
//        node scripts/stamp.mjs --check  exit 1 if the stamp is stale
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
// Keep in step with INPUTS in crates/rlark-server/tests/console_build.rs.
const INPUTS = ['index.html', 'package-lock.json', 'package.json', 'public', 'src', 'tsconfig.json', 'vite.config.ts'];

function files(path) {
  const full = join(root, path);
  if (statSync(full).isDirectory()) {
    return readdirSync(full).flatMap((name) => files(join(path, name)));
  }
  return [path];
}

export function sourceHash() {
  const all = INPUTS.flatMap(files).map((p) => p.split('\\').join('/')).sort();
  const hash = createHash('sha256');
  for (const path of all) {
    hash.update(path);
    hash.update('\0');
    hash.update(readFileSync(join(root, path)));
    hash.update('\0');
  }
  return hash.digest('hex');
}

const stampFile = join(root, 'dist', 'source-hash.txt');
const hash = sourceHash();
if (process.argv.includes('--check')) {
  const recorded = readFileSync(stampFile, 'utf8').trim();
  if (recorded !== hash) {
    console.error(`web/dist is stale: built from ${recorded}, sources are ${hash}; run npm run build in web/`);
    process.exit(1);
  }
} else {
  writeFileSync(stampFile, hash + '\n');
  console.log(`web/dist/source-hash.txt: ${hash}`);
}
