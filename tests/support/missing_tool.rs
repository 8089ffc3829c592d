//! What a test does when a tool it needs (kubectl, ffmpeg, iproute2, util-linux...) is not
//! on the machine. One source for every suite, included with
//! `#[path = "../../../tests/support/missing_tool.rs"] mod missing_tool;`.
//!
//! `scripts/test.sh` installs every tool the tests use and sets `RLARK_REQUIRE_TOOLS=1`; CI
//! runs it with `CI=true`. In either case a missing tool fails the test, so a machine
//! without it can never pass by skipping. Elsewhere (a developer's `cargo test`) the test
//! says why it is skipped and returns.

/// True when a missing tool must fail the test (`CI=true` or `RLARK_REQUIRE_TOOLS=1`).
pub fn tools_required() -> bool {
    let set = |name: &str, value: &str| std::env::var(name).is_ok_and(|v| v == value);
    set("CI", "true") || set("RLARK_REQUIRE_TOOLS", "1")
}

/// Call when `what` (e.g. "kubectl is not installed") stops a test: panics when tools are
/// required, else prints `SKIPPED: what` so the caller can return.
#[track_caller]
pub fn skip_or_fail(what: &str) {
    if tools_required() {
        panic!(
            "{what}: scripts/test.sh installs it, and under CI=true (or RLARK_REQUIRE_TOOLS=1) \
             a missing tool fails the test instead of skipping it"
        );
    }
    eprintln!("SKIPPED: {what} (scripts/test.sh installs it)");
}
