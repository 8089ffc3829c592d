//! `rlark-bench` (also run as `rlark bench`, which forwards to it): benchmarks that run
//! entirely on this machine (network on 127.0.0.1 only, or network namespaces) and print
//! their figures next to baselines measured in the same run.
//!
//! Owns the benchmarks and their regression guard (docs/bench-ratios.json). It may depend
//! on everything in the workspace, the simulated agent (`rlark-sim`) included; nothing may
//! depend on it, the `rlark` product binary least of all (scripts/test.sh checks with
//! `cargo tree`). The benches that run real processes start the `rlark` binary found beside
//! this executable ([`rlark_exe`]) for `rlark server`, `rlark agent` and the CLI, and this
//! executable itself for their helper processes (`net-peer`, `target`).
// The zero-unwrap discipline as a rule: a failure is an error that names what failed.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod agent;
mod api;
mod baseline;
mod camera;
mod client;
mod controllers;
mod examples;
mod filesystem;
mod guard;
mod micro;
mod net;
mod object;
mod port_forward;
mod report;
mod server;
mod ssh;
mod stats;
mod tunnel;
mod watch;

pub use agent::{AgentBenchOptions, AgentBenchReport, run_agent};
pub use api::{ApiBenchOptions, run_api};
pub use camera::{CameraBenchOptions, CameraBenchReport, run_camera};
pub use controllers::{ControllerBenchOptions, ControllerBenchReport, run_controllers};
pub use examples::{command, parse};
pub use net::{NetBenchOptions, NetBenchReport, NetPeerOptions, run_net, run_net_peer};
pub use port_forward::{PortForwardBenchOptions, PortForwardBenchReport, run_port_forward};
pub use report::ApiBenchReport;
pub use ssh::{SshBenchOptions, SshBenchReport, run_ssh};
pub use tunnel::{TunnelBenchOptions, run_tunnel};

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use guard::{Comparison, Guarded, RatioFile, RatioTable};

/// The `rlark bench` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// API server throughput and latency: creates/s at 1/16/64 clients, full-list latency at
    /// 10 000 objects, watch delivery latency with 100 watchers, plus baselines (loopback
    /// TCP, HTTPS /healthz, store-only creates).
    Api(ApiBenchOptions),
    /// Controllers: 1,000 Jobs x 4 Tasks from creation to all Tasks placed (target: 4,000
    /// Tasks in under 10 s), and a 100-deep Workflow chain from creation to `Succeeded`,
    /// with simulated agents, next to raw Task creates/s through the API.
    Controllers(ControllerBenchOptions),
    /// Reverse tunnel on loopback (TLS + WebSocket + mux + agent dial): single-stream and
    /// 8-stream throughput, stream setup p50/p99 and head-of-line isolation, next to direct
    /// TCP measured in the same run. Targets: >= 25% / >= 30% of direct TCP, setup p99 <= 2
    /// ms, a stalled stream's neighbour >= 80% of its unstalled throughput.
    Tunnel(TunnelBenchOptions),
    /// The user's port-forward path end to end, as real processes on 127.0.0.1: client ->
    /// `rlark port-forward` -> TLS to `rlark server` -> tunnel -> `rlark agent` -> target,
    /// beside direct TCP and an OpenSSH relay (`ssh -L` to an sshd that an `ssh -R` exposes
    /// the target on) measured in the same run: throughput each way, 64-byte round trips,
    /// connection setup p50/p99. Targets: >= 1.5x the OpenSSH relay's throughput, setup p99
    /// <= 2 ms.
    PortForward(PortForwardBenchOptions),
    /// The SSH endpoint beside OpenSSH's sshd on 127.0.0.1, in one run: session setup
    /// (`ssh TASK@... true` through the tunnel and the agent's exec, against `ssh user@sshd
    /// true`) p50/p99, `-L` throughput each way, server-side CPU per session and per GiB.
    Ssh(SshBenchOptions),
    /// A real in-process agent: task start latency (Task created -> its Pod `Running`,
    /// 500 short tasks; target p99 <= 300 ms) and, with 200 long-running tasks, the agent's
    /// RSS (delta from the idle server + agent; target <= 50 MiB) and process CPU over 5 s.
    Agent(AgentBenchOptions),
    /// The camera controller: WatchFrames from a sim camera (640x480 at 90 fps) over a unix
    /// socket, JPEG and raw, to 1 and 4 clients: frames/s, MB/s, latency (capture ->
    /// receipt) p50/p99. Target: >= 60 fps to each of 4 JPEG clients with p99 <= 50 ms.
    Camera(CameraBenchOptions),
    /// TCP between two "clusters" that are network namespaces on one bridge (needs root):
    /// direct TCP and an OpenSSH relay (`ssh -L` + `ssh -R` through an sshd in a third
    /// namespace) measured in the same run: single-stream and 8-stream throughput,
    /// connection setup p50/p99, CPU seconds per GiB; beside them the Domain network's
    /// local, direct and relayed paths through a real server and real agents (kernel and
    /// tun mode), with the targets (relayed >= 1.5x the OpenSSH relay with setup
    /// p99 <= 5 ms, kernel mode >= 3x tun mode, direct agent-to-agent >= 50% of direct TCP).
    Net(NetBenchOptions),
    /// One end of `rlark bench net`'s paths (run by it inside a namespace).
    #[command(hide = true)]
    NetPeer(NetPeerOptions),
    /// The forwarding target of `rlark bench ssh`, run by it as the task's replica (the
    /// SSH endpoint forwards only to ports a replica listens on).
    #[command(hide = true)]
    Target(TargetOptions),
}

/// `rlark-bench target --port N`.
#[derive(Debug, clap::Args)]
pub struct TargetOptions {
    /// The loopback port to serve on.
    #[arg(long)]
    pub port: u16,
}

/// Benchmarks that run on this machine (network on 127.0.0.1 only, or network namespaces);
/// `rlark bench ARGS` runs `rlark-bench ARGS`.
///
/// The benches that start real processes run the `rlark` binary beside this executable
/// (else the one on PATH). The regression guard's flags go anywhere after the program name.
#[derive(Debug, clap::Parser)]
#[command(name = "rlark-bench", version)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
    /// Compare this run's CPU-per-operation ratios (each path against its same-run
    /// baseline) with those in FILE (the committed docs/bench-ratios.json) and flag every
    /// ratio more than 25% worse; exit 1 when one is.
    #[arg(long, value_name = "FILE", global = true)]
    pub compare: Option<PathBuf>,
    /// Write this run's ratios into FILE, keeping the other benches' entries (how
    /// docs/bench-ratios.json is refreshed, from a release build).
    #[arg(long, value_name = "FILE", global = true)]
    pub write_ratios: Option<PathBuf>,
}

/// This executable (`rlark-bench`): the benches' helper processes (`net-peer`, `target`).
fn bench_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().context("the path of this executable (rlark-bench)")
}

/// The `rlark` binary the benches start as `rlark server`, `rlark agent` and the CLI: the
/// one beside this executable (as `cargo build` and the packages install them), else the
/// first on PATH; an error names where it looked.
pub fn rlark_exe() -> anyhow::Result<PathBuf> {
    let beside = bench_exe()?.with_file_name("rlark");
    if beside.is_file() {
        return Ok(beside);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("rlark");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!(
        "this bench runs the rlark binary, which was found neither beside this executable \
         ({}) nor on PATH ({}); build or install it (`cargo build -p rlark`)",
        beside.display(),
        path.to_string_lossy()
    )
}

/// Print `report` (JSON with `json`), its guard table, and the comparison with `compare`.
fn finish<R: serde::Serialize + std::fmt::Display + Guarded>(
    report: &R,
    json: bool,
    compare: Option<(&Path, &RatioFile)>,
    write_ratios: Option<&Path>,
) -> anyhow::Result<()> {
    let ratios = report.ratios();
    let comparison =
        compare.map(|(path, file)| Comparison::new(path, file, report.bench(), &ratios));
    if json {
        let mut value = serde_json::to_value(report)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("guard".into(), serde_json::to_value(&ratios)?);
            if let Some(c) = &comparison {
                object.insert("comparison".into(), serde_json::to_value(c)?);
            }
        }
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{report}");
        print!("{}", RatioTable(&ratios));
        if let Some(c) = &comparison {
            print!("{c}");
        }
    }
    if let Some(path) = write_ratios {
        let existing = match path.exists() {
            true => Some(RatioFile::load(path)?),
            false => None,
        };
        let mut file = RatioFile::merged(existing, report.bench(), &ratios);
        // A hand-written note on where the figures came from is kept.
        if file.measured.is_empty() {
            file.measured = format!(
                "{} build, {} CPU(s); see docs/benchmarks.md",
                if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
                std::thread::available_parallelism().map_or(0, |n| n.get())
            );
        }
        std::fs::write(path, serde_json::to_string_pretty(&file)? + "\n")
            .with_context(|| format!("write {}", path.display()))?;
        eprintln!(
            "ratios of bench {} written to {}",
            report.bench(),
            path.display()
        );
    }
    if let Some(c) = comparison {
        let regressions = c.regressions();
        if !regressions.is_empty() {
            anyhow::bail!(
                "{} ratio(s) more than {:.0}% worse than {}: {}",
                regressions.len(),
                guard::WORSE_BY * 100.0,
                c.file.display(),
                regressions.join(", ")
            );
        }
    }
    Ok(())
}

/// Run a `rlark bench` subcommand and print its report (a table, or JSON with `--json`),
/// then the regression guard's ratios (and, with `--compare`, their comparison).
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    // The ratio file is read and checked before anything is measured.
    let committed = args.compare.as_deref().map(RatioFile::load).transpose()?;
    let compare = args.compare.as_deref().zip(committed.as_ref());
    let write = args.write_ratios.as_deref();
    match args.command {
        BenchCommand::Api(options) => {
            let json = options.json;
            let report: ApiBenchReport = run_api(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Tunnel(options) => {
            let json = options.json;
            let report = run_tunnel(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::PortForward(options) => {
            let json = options.json;
            let report: PortForwardBenchReport = run_port_forward(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Ssh(options) => {
            let json = options.json;
            let report: SshBenchReport = run_ssh(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Net(options) => {
            let json = options.json;
            let report: NetBenchReport = run_net(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Controllers(options) => {
            let json = options.json;
            let report: ControllerBenchReport = run_controllers(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Agent(options) => {
            let json = options.json;
            let report: AgentBenchReport = run_agent(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::Camera(options) => {
            let json = options.json;
            let report: CameraBenchReport = run_camera(options).await?;
            finish(&report, json, compare, write)
        }
        BenchCommand::NetPeer(options) => run_net_peer(options).await,
        BenchCommand::Target(options) => port_forward::serve_targets(options.port).await,
    }
}
