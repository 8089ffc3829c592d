//! `rlark-supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME] -- PROGRAM [ARGS...]`:
//! the replica supervisor ([`rlark_agent::supervisor`]) as a binary of its own. The agent
//! normally runs it as `rlark supervise`; this binary lets the crate's integration tests
//! run real agents without the `rlark` binary.

fn main() {
    std::process::exit(rlark_agent::supervisor::main(std::env::args_os().skip(1)));
}
