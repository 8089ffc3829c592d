#!/usr/bin/env python3
"""No product source file over 1,000 non-test lines (issue 39's rule, checked by scripts/test.sh).

    python3 scripts/file_sizes.py [--limit N] [--list]

Product files: `crates/*/src/**/*.rs` except the test kit, generated code (`src/gen/`) and
test-only modules (`tests.rs`, `tests/` under src, `fuzzing.rs`). Non-test lines: the file
without its `#[cfg(test)]` items (the `mod tests { ... }` block or a `mod tests;` line), counted
as lines. `--list` prints every file over half the limit, largest first.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP_CRATES = {"rlark-testkit"}


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
        if path.name in ("tests.rs", "fuzzing.rs"):
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
    over = [(rel, n) for rel, n in sizes if n > limit]
    if over:
        print(f"product files over {limit} non-test lines (split them by concept):", file=sys.stderr)
        for rel, n in over:
            print(f"  {n:6d}  {rel}", file=sys.stderr)
        return 1
    print(f"no product file over {limit} non-test lines (largest: {sizes[0][1]}, {sizes[0][0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
