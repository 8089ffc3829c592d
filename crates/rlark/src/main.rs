//! `rlark`: the one binary. A thin shell over library calls: parse flags, set up logging,
//! run the subcommand, map failures to exit codes (1 = failure, 2 = usage error).

mod cli;
mod bench; // TEMP(bench helper)

use std::process::ExitCode;

use clap::Parser as _;

fn main() -> ExitCode {
    // kube's client and anything else using `ClientConfig::builder()` need one unambiguous
    // process-wide provider. Err means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    // TEMP(bench helper): `rlark bench ...` until the lead wires it into cli.
    if std::env::args().nth(1).as_deref() == Some("bench") {
        #[derive(clap::Parser)]
        struct BenchCli {
            #[command(subcommand)]
            command: bench::BenchCommand,
        }
        let args = BenchCli::parse_from(std::env::args().skip(1));
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
        let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
        else {
            return ExitCode::FAILURE;
        };
        return match runtime.block_on(bench::run(args.command)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }

    // clap prints usage errors and exits with 2 (0 for --help/--version).
    let args = cli::Cli::parse();
    cli::init_tracing(&args);

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
    match runtime.block_on(cli::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            if let Some(message) = cli::report(&error) {
                eprintln!("{message}");
            }
            ExitCode::FAILURE
        }
    }
}
