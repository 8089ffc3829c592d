//! `rlark-bench`: the benchmarks of docs/benchmarks.md as their own binary, so the product
//! binary `rlark` carries no bench code (`rlark bench ARGS` runs `rlark-bench ARGS`). Parse
//! the arguments, set up logging, run the bench; 1 = failure, 2 = usage error.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::process::ExitCode;

/// mimalloc, the allocator the benches ran on as `rlark bench` (the control plane's: `rlark`
/// chooses mimalloc for `server`, `up` and `controller-manager`, see its `allocator.rs`),
/// for the in-process servers the benches measure and for this executable's helper
/// processes (`net-peer`, `target`). The agents and supervisors the benches start are the
/// `rlark` binary and make their own choice.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // kube's client and anything else using `ClientConfig::builder()` need one unambiguous
    // process-wide provider. Err means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    // clap prints usage errors and exits with 2 (0 for --help/--version).
    let args = rlark_bench::parse();
    init_tracing();

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
    match runtime.block_on(rlark_bench::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// `tracing` on stderr as `rlark bench` had it: the `RUST_LOG` filter, default `warn`
/// (kube's own ERROR line for a failed connection off: the error is printed once, by us).
fn init_tracing() {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,kube_client::client::builder=off")
    });
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    // Err only if a subscriber is already set, which cannot happen in `main`.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `error` and its causes as `a: b: c`, each cause once: a cause whose text its parent
/// already shows (as `kube` and `std::io` wrappers do) is left out (as `rlark` prints them).
fn error_chain(error: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if text.is_empty() || parts.iter().any(|shown| shown.contains(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ")
}
