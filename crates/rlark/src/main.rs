//! `rlark`: the one binary. A thin shell over the `rlark-cli` library: parse flags, set up
//! logging, run the subcommand, map failures to exit codes (1 = failure, 2 = usage error).
//! The binary's own parts are the memory allocator and the `rlark supervise` dispatch.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod allocator;

use std::process::ExitCode;

/// mimalloc for the control plane, glibc's allocator for agents and everything else
/// (`allocator.rs` says why and how).
#[global_allocator]
static GLOBAL: allocator::ByCommand = allocator::ByCommand;

fn main() -> ExitCode {
    // `rlark supervise ...`: the per-replica supervisor the agent starts (hidden; see
    // rlark_agent::supervisor). Dispatched before anything else: it runs no async runtime
    // and logs nothing but its own errors, so it stays small.
    if std::env::args_os().nth(1).is_some_and(|a| a == "supervise") {
        let code = rlark_agent::supervisor::main(std::env::args_os().skip(2));
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }

    // kube's client and anything else using `ClientConfig::builder()` need one unambiguous
    // process-wide provider. Err means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    // clap prints usage errors and exits with 2 (0 for --help/--version).
    let args = rlark_cli::parse();
    rlark_cli::init_tracing(&args);
    tracing::debug!(allocator = allocator::name(), "memory allocator");
    // What `/version` of a server this process runs reports, and `rlark_build_info` on
    // every `/metrics` it serves.
    let build = rlark_cli::version::build_info();
    rlark_observe::process_metrics::set_build_info(rlark_observe::process_metrics::BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: build.git_commit.clone(),
        date: build.build_date.clone(),
    });
    rlark_server::set_build_info(build);

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(rlark_cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if let Some(message) = rlark_cli::report(&error) {
                eprintln!("{message}");
            }
            ExitCode::FAILURE
        }
    }
}
