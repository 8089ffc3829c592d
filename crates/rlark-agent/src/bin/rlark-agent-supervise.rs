//! `rlark-agent-supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME] -- PROGRAM
//! [ARGS...]`: the replica supervisor ([`rlark_agent::supervisor`]) as a binary of this
//! crate, so its integration tests run real agents without the `rlark` package's binaries
//! (`rlark supervise`, `rlark-supervise`).
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

fn main() {
    std::process::exit(rlark_agent::supervisor::main(std::env::args_os().skip(1)));
}
