#!/usr/bin/env python3
"""No product source file over 1,000 non-test lines (issue 39's rule, checked by scripts/test.sh).

    python3 scripts/file_sizes.py [--limit N] [--list]

Should a file have to stay over the limit for a while, list it in scripts/file_sizes.known
(one path a line, `#` comments): it is reported without failing, while a listed file that
is no longer over the limit fails, so the list only shrinks. No file is listed today.

Product files: `crates/*/src/**/*.rs` except the test kit, generated code (`src/gen/`) and
test-only modules (`tests.rs`, `tests/` under src, `fuzzing.rs`). Non-test lines: the file
without its `#[cfg(test)]` items (the `mod tests { ... }` block or a `mod tests;` line), counted
as lines. `--list` prints every file over half the limit, largest first.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Test support and benchmarks are not product code.
SKIP_CRATES = {"rlark-testkit", "rlark-bench", "rlark-sim"}
# The backend conformance suite is a test suite (cargo feature `conformance`, for tests).
SKIP_FILES = {"crates/rlark-store/src/conformance.rs"}
KNOWN = ROOT / "scripts" / "file_sizes.known"


def non_test_lines(text):
    """The file's line count without its #[cfg(test)] items (brace-matched)."""
    lines = text.splitlines()
    out = 0
    i = 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            # Skip the attribute and the item after it: to its matching close brace, or one
            # line (`mod tests;`, `use ...;`).
            j = i + 1
            depth = 0
            opened = False
            while j < len(lines):
                code = re.sub(r'"(?:\\.|[^"\\])*"|//.*', "", lines[j])
                depth += code.count("{") - code.count("}")
                opened = opened or "{" in code
                if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
                    break
                j += 1
            i = j + 1
            continue
        out += 1
        i += 1
    return out


def product_files():
    for path in sorted(ROOT.glob("crates/*/src/**/*.rs")):
        rel = path.relative_to(ROOT)
        parts = rel.parts
        if parts[1] in SKIP_CRATES or "gen" in parts[3:-1] or "tests" in parts[3:-1]:
            continue
        if path.name in ("tests.rs", "fuzzing.rs") or str(rel) in SKIP_FILES:
            continue
        yield rel, non_test_lines(path.read_text())


def main():
    limit = 1000
    if "--limit" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--limit") + 1])
    sizes = sorted(product_files(), key=lambda f: -f[1])
    if "--list" in sys.argv:
        for rel, n in sizes:
            if n > limit // 2:
                print(f"{n:6d}  {rel}")
        return 0
    known = set()
    if KNOWN.exists():
        for line in KNOWN.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                known.add(line)
    over = [(str(rel), n) for rel, n in sizes if n > limit]
    new = [(rel, n) for rel, n in over if rel not in known]
    gone = sorted(known - {rel for rel, _ in over})
    for rel, n in over:
        if rel in known:
            print(f"  known, still to split: {n:6d}  {rel}")
    if new or gone:
        for rel, n in new:
            print(f"{rel}: {n} non-test lines, over {limit}: split it by concept", file=sys.stderr)
        for rel in gone:
            print(f"{rel} is no longer over {limit} lines: remove it from {KNOWN.name}", file=sys.stderr)
        return 1
    print(f"no product file over {limit} non-test lines but the {len(known)} known ones")
    return 0


if __name__ == "__main__":
    sys.exit(main())
