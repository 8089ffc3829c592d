#!/usr/bin/env python3
"""Fail when a crate's modules import each other in a cycle.

Usage: scripts/module_cycles.py [--known FILE] [CRATE_DIR ...]
    CRATE_DIR: default every crates/*/ of the workspace this script is in.
    --known FILE: cycles not yet broken, one key a line as printed (`<target>: <module>,
    ...`; `#` comments): reported without failing; a listed cycle that is gone fails, so
    the list only shrinks.

For each crate target (src/lib.rs, src/main.rs, src/bin/*.rs, tests/*.rs, benches/*.rs,
examples/*.rs) the script follows `mod x;` declarations from the root to map files to modules,
reads every path that names a module of the same crate (`use crate::a::b`, `super::x::Y`,
`self::x`, `crate::a::f()` in code, `use` trees with braces) and resolves it to the deepest
module it names. Comments and string literals are skipped; `#[cfg(test)]` modules are left
out (test code may use anything).

What counts as a cycle: a module may use its ancestors (`super::Args`) and an ancestor may
use or re-export its descendants, so an edge between a module and one of its ancestors is
not a dependency between modules. Every other edge A -> B is lifted to the two siblings under
the deepest common ancestor of A and B (`a::x -> b::y` is `a -> b`), and a strongly connected
component of more than one sibling is a cycle: `a` and `b` use each other, directly or through
more modules. Each cycle is printed with one `file:line` per edge that forms it.

Exit status: 0 when no crate has a cycle (but known ones), 1 when one has or a known one is
gone, 2 on a usage error.

This is a lexical reading, not rustc's name resolution: a path that reaches a module through
a `use` alias or a glob re-export is attributed to the module it names textually. That
misses no edge written with `crate::`, `super::` or `self::`, which is how this workspace
names its own modules.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

Module = tuple[str, ...]

TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<line_comment>//[^\n]*)
  | (?P<block_comment>/\*)
  | (?P<raw_string>b?r(?P<hashes>\#*)")
  | (?P<string>b?"(?:\\.|[^"\\])*")
  | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])')
  | (?P<lifetime>'[A-Za-z_][A-Za-z0-9_]*)
  | (?P<ident>(?:r\#)?[A-Za-z_][A-Za-z0-9_]*|\$crate)
  | (?P<number>[0-9][0-9A-Za-z_.]*)
  | (?P<path_sep>::)
  | (?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass
class Token:
    kind: str  # "ident", "str", "punct", "::"
    text: str
    line: int


def tokenize(source: str) -> list[Token]:
    """Rust tokens that matter here: identifiers, `::`, punctuation and string values."""
    tokens: list[Token] = []
    pos, line = 0, 1
    while pos < len(source):
        m = TOKEN.match(source, pos)
        assert m is not None  # `punct` matches any character
        kind = "raw_string" if m.group("raw_string") is not None else m.lastgroup
        start = pos
        if kind == "block_comment":
            depth, pos = 1, m.end()
            while depth and pos < len(source):
                if source.startswith("/*", pos):
                    depth, pos = depth + 1, pos + 2
                elif source.startswith("*/", pos):
                    depth, pos = depth - 1, pos + 2
                else:
                    pos += 1
        elif kind == "raw_string":
            close = '"' + m.group("hashes")
            end = source.find(close, m.end())
            end = len(source) if end < 0 else end + len(close)
            tokens.append(Token("str", source[m.end() : end - len(close)], line))
            pos = end
        else:
            pos = m.end()
            text = m.group(0)
            if kind == "string":
                tokens.append(Token("str", text[text.index('"') + 1 : -1], line))
            elif kind == "ident":
                tokens.append(Token("ident", text.removeprefix("r#"), line))
            elif kind == "path_sep":
                tokens.append(Token("::", text, line))
            elif kind == "punct":
                tokens.append(Token("punct", text, line))
        line += source.count("\n", start, pos)
    return tokens


@dataclass
class Edge:
    source: Module
    target: Module
    file: str
    line: int


@dataclass
class Target:
    """One crate target (a library, a binary, a test crate): its modules and their uses."""

    name: str
    root: str
    modules: dict[Module, str] = field(default_factory=dict)  # module -> file defining it
    test_modules: set[Module] = field(default_factory=set)
    # (module the path is written in, path segments, file, line)
    paths: list[tuple[Module, list[str], str, int]] = field(default_factory=list)


def is_mod_rs(path: str, is_root: bool) -> bool:
    return is_root or os.path.basename(path) == "mod.rs"


def child_file(parent_file: str, parent_is_dir_owner: bool, inline: list[str], name: str) -> str | None:
    """The file of `mod name;` declared in `parent_file` (inside the inline modules `inline`)."""
    if parent_is_dir_owner:
        base = os.path.dirname(parent_file)
    else:
        base = os.path.splitext(parent_file)[0]
    base = os.path.join(base, *inline)
    for candidate in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
        if os.path.isfile(candidate):
            return candidate
    return None


def attributes_before(tokens: list[Token], index: int) -> list[list[Token]]:
    """The `#[...]` attributes (token lists inside the brackets) before tokens[index],
    skipping a visibility (`pub`, `pub(crate)`, `pub(in a::b)`)."""
    i = index - 1
    if i >= 0 and tokens[i].text == ")":
        depth = 0
        while i >= 0:
            if tokens[i].text == ")":
                depth += 1
            elif tokens[i].text == "(":
                depth -= 1
                if depth == 0:
                    break
            i -= 1
        i -= 1
    if i >= 0 and tokens[i].text == "pub":
        i -= 1
    attrs = []
    while i >= 0 and tokens[i].text == "]":
        depth, j = 0, i
        while j >= 0:
            if tokens[j].text == "]":
                depth += 1
            elif tokens[j].text == "[":
                depth -= 1
                if depth == 0:
                    break
            j -= 1
        if j < 1 or tokens[j - 1].text != "#":
            break
        attrs.append(tokens[j + 1 : i])
        i = j - 2
    return attrs


def is_cfg_test(attr: list[Token]) -> bool:
    return [t.text for t in attr] == ["cfg", "(", "test", ")"]


def path_attr(attr: list[Token]) -> str | None:
    if len(attr) == 3 and attr[0].text == "path" and attr[1].text == "=" and attr[2].kind == "str":
        return attr[2].text
    return None


def parse_use_tree(tokens: list[Token], i: int, prefix: list[str], out: list[tuple[list[str], int]]) -> int:
    """Parse one use tree at tokens[i]; append (full path, line) to out; return the index after it."""
    segments = list(prefix)
    line = tokens[i].line if i < len(tokens) else 0
    while i < len(tokens):
        t = tokens[i]
        if t.kind == "::":
            i += 1
        elif t.text == "{":
            i += 1
            while i < len(tokens) and tokens[i].text != "}":
                i = parse_use_tree(tokens, i, segments, out)
                if i < len(tokens) and tokens[i].text == ",":
                    i += 1
            return i + 1
        elif t.text == "*":
            out.append((segments, t.line))
            return i + 1
        elif t.kind == "ident" and t.text != "as":
            segments = segments + [t.text]
            line = t.line
            i += 1
        elif t.text == "as":
            i += 2  # the alias
        else:
            break
    if segments:
        out.append((segments, line))
    return i


def read_target(name: str, root: str) -> Target:
    target = Target(name, root)
    pending: list[tuple[str, Module, bool]] = [(root, (), False)]
    while pending:
        path, module, in_test = pending.pop()
        if module in target.modules:
            continue
        target.modules[module] = path
        if in_test:
            target.test_modules.add(module)
        with open(path, encoding="utf-8") as f:
            tokens = tokenize(f.read())
        dir_owner = is_mod_rs(path, module == ())
        # Stack of open inline modules: (name, brace depth at which it closes, test).
        inline: list[tuple[str, int, bool]] = []
        depth = 0
        i = 0
        while i < len(tokens):
            t = tokens[i]
            current = module + tuple(n for n, _, _ in inline)
            current_test = in_test or any(test for _, _, test in inline)
            if t.text == "{":
                depth += 1
            elif t.text == "}":
                depth -= 1
                if inline and inline[-1][1] == depth:
                    inline.pop()
            elif (
                t.text == "mod"
                and i + 2 < len(tokens)
                and tokens[i + 1].kind == "ident"
                and tokens[i + 2].text in (";", "{")
            ):
                child = tokens[i + 1].text
                attrs = attributes_before(tokens, i)
                test = current_test or any(is_cfg_test(a) for a in attrs)
                if tokens[i + 2].text == "{":
                    inline.append((child, depth, test))
                    target.modules[current + (child,)] = path
                    if test:
                        target.test_modules.add(current + (child,))
                    depth += 1
                    i += 3
                    continue
                explicit = next((p for p in map(path_attr, attrs) if p), None)
                if explicit is not None:
                    file = os.path.normpath(os.path.join(os.path.dirname(path), explicit))
                else:
                    file = child_file(path, dir_owner, [n for n, _, _ in inline], child)
                if file is not None and os.path.isfile(file):
                    pending.append((file, current + (child,), test))
                i += 3
                continue
            elif t.text == "use" and not current_test:
                uses: list[tuple[list[str], int]] = []
                j = parse_use_tree(tokens, i + 1, [], uses)
                for segments, line in uses:
                    target.paths.append((current, segments, path, line))
                i = j
                continue
            elif (
                t.text in ("crate", "$crate", "super", "self")
                and not current_test
                and i + 1 < len(tokens)
                and tokens[i + 1].kind == "::"
                and (i == 0 or tokens[i - 1].kind != "::")
                and (i == 0 or tokens[i - 1].text != "in")  # pub(in crate::a)
            ):
                segments = [t.text]
                j = i + 1
                while j + 1 < len(tokens) and tokens[j].kind == "::" and tokens[j + 1].kind == "ident":
                    segments.append(tokens[j + 1].text)
                    j += 2
                target.paths.append((current, segments, path, t.line))
                i = j
                continue
            i += 1
    return target


def resolve(target: Target, current: Module, segments: list[str]) -> Module | None:
    """The deepest module of this crate that `segments`, written in `current`, names."""
    if not segments:
        return None
    head, rest = segments[0], segments[1:]
    if head in ("crate", "$crate"):
        base: Module = ()
    elif head == "super":
        base = current[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif head == "self":
        base = current
    else:
        return None  # another crate, or a name in scope (a descendant at most)
    for segment in rest:
        if base + (segment,) in target.modules:
            base = base + (segment,)
        else:
            break
    return base


def is_ancestor(a: Module, b: Module) -> bool:
    return len(a) <= len(b) and b[: len(a)] == a


def sibling_edges(target: Target) -> dict[Module, dict[tuple[Module, Module], Edge]]:
    """Edges lifted to siblings: parent module -> {(child a, child b): an edge behind it}."""
    levels: dict[Module, dict[tuple[Module, Module], Edge]] = {}
    for current, segments, file, line in target.paths:
        resolved = resolve(target, current, segments)
        if resolved is None or resolved in target.test_modules:
            continue
        if is_ancestor(resolved, current) or is_ancestor(current, resolved):
            continue
        common = 0
        while current[common] == resolved[common]:
            common += 1
        parent = current[:common]
        a, b = current[: common + 1], resolved[: common + 1]
        levels.setdefault(parent, {}).setdefault((a, b), Edge(current, resolved, file, line))
    return levels


def strongly_connected(nodes: set[Module], edges: set[tuple[Module, Module]]) -> list[list[Module]]:
    """Tarjan's algorithm; components of more than one node, each sorted, sorted."""
    successors: dict[Module, list[Module]] = {n: [] for n in nodes}
    for a, b in sorted(edges):
        successors[a].append(b)
    index: dict[Module, int] = {}
    low: dict[Module, int] = {}
    stack: list[Module] = []
    on_stack: set[Module] = set()
    components: list[list[Module]] = []

    def visit(v: Module) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in successors[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(components)


def cycle_through(component: list[Module], edges: set[tuple[Module, Module]]) -> list[Module]:
    """A closed walk from the component's first module through every module of it (the
    shortest path from each to the next, inside the component)."""
    inside = set(component)
    successors: dict[Module, list[Module]] = {m: [] for m in component}
    for a, b in sorted(edges):
        if a in inside and b in inside:
            successors[a].append(b)
    walk = [component[0]]
    for goal in component[1:] + [component[0]]:
        start = walk[-1]
        previous: dict[Module, Module] = {}
        frontier = [start]
        while goal not in previous:
            following = []
            for a in frontier:
                for b in successors[a]:
                    if b not in previous:
                        previous[b] = a
                        following.append(b)
            frontier = following
        step = [goal]
        while step[-1] != start or len(step) == 1:
            step.append(previous[step[-1]])
        walk.extend(reversed(step[:-1]))
    return walk


def module_name(module: Module) -> str:
    return "::".join(module) if module else "crate"


def find_cycles(target: Target) -> list[tuple[str, str]]:
    """Every cycle in one target as (key, printable report); the key (`<target>: <module>,
    <module>, ...`) is how a known-cycles file names it."""
    reports = []
    for parent, lifted in sorted(sibling_edges(target).items()):
        nodes = {m for edge in lifted for m in edge}
        for component in strongly_connected(nodes, set(lifted)):
            walk = cycle_through(component, set(lifted))
            key = f"{target.name}: {', '.join(module_name(m) for m in component)}"
            lines = [f"{target.name}: modules {key.split(': ', 1)[1]} import each other (under {module_name(parent)}):"]
            for a, b in zip(walk, walk[1:]):
                edge = lifted[(a, b)]
                lines.append(
                    f"  {module_name(a)} -> {module_name(b)}: {edge.file}:{edge.line} "
                    f"({module_name(edge.source)} uses {module_name(edge.target)})"
                )
            reports.append((key, "\n".join(lines)))
    return reports


def read_known(path: str) -> set[str]:
    """The cycle keys listed in a known-cycles file (one a line; `#` starts a comment)."""
    with open(path, encoding="utf-8") as f:
        return {line.split("#", 1)[0].strip() for line in f} - {""}


def crate_targets(crate_dir: str) -> list[tuple[str, str]]:
    """(name, root file) of every target of the crate in crate_dir."""
    crate = os.path.basename(os.path.normpath(crate_dir))
    found = []
    for root, label in (("src/lib.rs", "lib"), ("src/main.rs", "bin")):
        if os.path.isfile(os.path.join(crate_dir, root)):
            found.append((f"{crate} ({label})", os.path.join(crate_dir, root)))
    for folder in ("src/bin", "tests", "benches", "examples"):
        directory = os.path.join(crate_dir, folder)
        if not os.path.isdir(directory):
            continue
        for entry in sorted(os.listdir(directory)):
            full = os.path.join(directory, entry)
            if entry.endswith(".rs") and os.path.isfile(full):
                found.append((f"{crate} ({folder}/{entry})", full))
            elif os.path.isfile(os.path.join(full, "main.rs")):
                found.append((f"{crate} ({folder}/{entry})", os.path.join(full, "main.rs")))
    return found


def main(argv: list[str]) -> int:
    known: set[str] = set()
    known_file = None
    if len(argv) >= 2 and argv[0] == "--known":
        known_file, argv = argv[1], argv[2:]
        known = read_known(known_file)
    if any(arg.startswith("-") for arg in argv):
        print(__doc__, file=sys.stderr)
        return 2
    if argv:
        crate_dirs = argv
    else:
        workspace = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        crates = os.path.join(workspace, "crates")
        crate_dirs = sorted(
            os.path.join(crates, d)
            for d in os.listdir(crates)
            if os.path.isfile(os.path.join(crates, d, "Cargo.toml"))
        )
    found: list[tuple[str, str]] = []
    targets = 0
    for crate_dir in crate_dirs:
        if not os.path.isfile(os.path.join(crate_dir, "Cargo.toml")):
            print(f"{crate_dir}: no Cargo.toml", file=sys.stderr)
            return 2
        for name, root in crate_targets(crate_dir):
            targets += 1
            found.extend(find_cycles(read_target(name, os.path.relpath(root))))
    failed = False
    for key, report in found:
        if key in known:
            print(f"known (listed in {known_file}), still to break: {report}")
        else:
            print(report)
            failed = True
    for key in sorted(known - {key for key, _ in found}):
        print(f"{known_file} lists a cycle that is gone (delete the line): {key}")
        failed = True
    if failed:
        print(f"module import cycles in {targets} crate targets: see above", file=sys.stderr)
        return 1
    print(f"no module import cycle in {targets} crate targets ({len(found)} known)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
