//! `rlark bench`: benchmarks that run entirely on this machine (network on 127.0.0.1 only)
//! and print their figures next to baselines measured in the same run.

mod api;
mod baseline;
mod client;
mod micro;
mod object;
mod report;
mod stats;
mod watch;

pub use api::{ApiBenchOptions, run_api};
pub use report::ApiBenchReport;

/// The `rlark bench` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// API server throughput and latency: creates/s at 1/16/64 clients, full-list latency at
    /// 10 000 objects, watch delivery latency with 100 watchers, plus baselines (loopback
    /// TCP, HTTPS /healthz, store-only creates).
    Api(ApiBenchOptions),
}

/// Run a `rlark bench` subcommand and print its report (a table, or JSON with `--json`).
pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Api(options) => {
            let json = options.json;
            let report: ApiBenchReport = run_api(options).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{report}");
            }
            Ok(())
        }
    }
}
