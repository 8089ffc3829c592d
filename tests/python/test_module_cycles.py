"""scripts/module_cycles.py on small crates written here: it must find the cycles and only them."""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "module_cycles.py")


def write_crate(base, files):
    """A crate `fixture` under base with `files` ({path under the crate: Rust source})."""
    crate = os.path.join(base, "fixture")
    for path, source in {"Cargo.toml": '[package]\nname = "fixture"\n', **files}.items():
        full = os.path.join(crate, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(textwrap.dedent(source))
    return crate


def run(*arguments):
    result = subprocess.run(
        [sys.executable, SCRIPT, *arguments], capture_output=True, text=True, check=False
    )
    return result.returncode, result.stdout


def test_two_modules_using_each_other_fail(tmp_path):
    crate = write_crate(
        tmp_path,
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": "pub struct B;\nfn make() -> crate::a::A { crate::a::A }\n",
        },
    )
    code, out = run(crate)
    assert code == 1, out
    assert "modules a, b import each other (under crate)" in out
    assert "src/a.rs:1 (a uses b)" in out
    assert "src/b.rs:2 (b uses a)" in out


def test_a_longer_cycle_through_nested_modules_and_use_trees(tmp_path):
    # net::server -> store (a `use` tree), store -> auth::token (`super::`), auth -> net.
    crate = write_crate(
        tmp_path,
        {
            "src/main.rs": "mod auth;\nmod net;\nmod store;\nfn main() {}\n",
            "src/net/mod.rs": "pub mod server;\npub struct Conn;\n",
            "src/net/server.rs": "use crate::{store::{self, Store as _}, net::Conn};\n",
            "src/store.rs": "pub trait Store {}\nuse super::auth::token::Token;\n",
            "src/auth/mod.rs": "pub mod token;\n",
            "src/auth/token.rs": "pub struct Token(crate::net::Conn);\n",
        },
    )
    code, out = run(crate)
    assert code == 1, out
    assert "modules auth, net, store import each other (under crate)" in out
    # One edge per step of the cycle, each with the line that makes it.
    assert "auth -> net: " in out and "net -> store: " in out and "store -> auth: " in out


def test_parents_children_tests_comments_and_strings_are_not_cycles(tmp_path):
    crate = write_crate(
        tmp_path,
        {
            # The root re-exports a child and the child uses the root: not a cycle.
            "src/lib.rs": """
                mod a;
                mod b;
                pub use crate::a::A;
                pub struct Root;
            """,
            "src/a.rs": """
                use super::Root;
                use crate::b::B;
                pub struct A(Root, B);
                #[cfg(test)]
                mod tests {
                    use super::*;
                }
            """,
            # b names a only in comments, a string and its tests (which may use anything).
            "src/b.rs": """
                pub struct B;
                // crate::a::A in a comment, /* crate::a::A */ and in a string:
                const TEXT: &str = "crate::a::A";
                #[cfg(test)]
                mod tests {
                    use crate::a::A;
                }
            """,
        },
    )
    code, out = run(crate)
    assert code == 0, out
    assert "no module import cycle" in out


def test_a_test_crate_is_its_own_target(tmp_path):
    crate = write_crate(
        tmp_path,
        {
            "src/lib.rs": "",
            "tests/it/main.rs": "mod x;\nmod y;\n",
            "tests/it/x.rs": "use crate::y::Y;\npub struct X;\n",
            "tests/it/y.rs": "pub struct Y(super::x::X);\n",
        },
    )
    code, out = run(crate)
    assert code == 1, out
    assert "fixture (tests/it): modules x, y import each other" in out


def test_known_cycles_pass_and_a_gone_one_fails(tmp_path):
    crate = write_crate(
        tmp_path,
        {
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": "use crate::b::B;\npub struct A;\n",
            "src/b.rs": "use crate::a::A;\npub struct B;\n",
        },
    )
    known = tmp_path / "known"
    known.write_text("# not broken yet\nfixture (lib): a, b  # a and b\n")
    code, out = run("--known", str(known), crate)
    assert code == 0, out
    assert "still to break: fixture (lib): modules a, b import each other" in out

    known.write_text("fixture (lib): a, b\nfixture (lib): c, d\n")
    code, out = run("--known", str(known), crate)
    assert code == 1, out
    assert "lists a cycle that is gone (delete the line): fixture (lib): c, d" in out


@pytest.mark.parametrize("argument", ["--help", "-h"])
def test_usage_errors_exit_2(argument):
    assert run(argument)[0] == 2
