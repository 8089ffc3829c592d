//! `rlark-supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME] -- PROGRAM [ARGS...]`:
//! the per-replica supervisor ([`rlark_agent::supervisor`]), the same code as `rlark
//! supervise` in a binary that starts in a third of the time. The agent uses it when it is
//! installed beside `rlark` and of the same version (`cargo build` builds both; see
//! `rlark_agent::runtime::default_supervisor`).

fn main() {
    std::process::exit(rlark_agent::supervisor::main(std::env::args_os().skip(1)));
}
