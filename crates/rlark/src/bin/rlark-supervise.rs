//! `rlark-supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME] -- PROGRAM [ARGS...]`:
//! the per-replica supervisor ([`rlark_agent::supervisor`]), the same code as `rlark
//! supervise` in a binary that starts in a third of the time. The agent uses it when it is
//! installed beside `rlark` and of the same version (`cargo build` builds both; see
//! `rlark_agent::runtime::default_supervisor`).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

fn main() {
    std::process::exit(rlark_agent::supervisor::main(std::env::args_os().skip(1)));
}
