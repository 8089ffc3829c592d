//! `rlark bench port-forward`: the user's path end to end, beside direct TCP and an OpenSSH
//! relay measured in the same run, all on 127.0.0.1.
//!
//! - rlark: client → `rlark port-forward` → TLS + HTTP `CONNECT` to a real `rlark server`
//!   → reverse tunnel (TLS + WebSocket + mux) → a real `rlark agent` → target. Server, agent
//!   and port-forward are the `rlark` binary beside this one, run as child processes with temporary data
//!   directories; the agent joins with a bootstrap token from `rlark token create`.
//! - OpenSSH: an edge host behind NAT reached through a relay — `sshd` on loopback (a
//!   throwaway host key, key authentication only), `ssh -R` from the target's side exposing
//!   the target on a relay port of that sshd, `ssh -L` from the client's side to that port.
//!   Not measured (and said so, with the reason) when `sshd`/`ssh` are missing.
//! - direct TCP to the target: the machine's ceiling.
//!
//! The target is a server in this process: per connection a mode byte (`U` upload, `D`
//! download, `E` echo) that it acknowledges at once, so every path is known to reach it
//! before a transfer is timed. Figures per path: throughput of `--mib` MiB over one
//! connection each way (median and range over `--runs`, the paths interleaved), 64-byte
//! round trips p50/p99 on one connection, connection setup p50/p99 (connect + mode byte
//! echoed back: a port-forward accepts locally before it dials through), CPU time of the
//! forwarding processes per GiB, and how busy the rest of the machine was meanwhile.
//! Figures are printed, never asserted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use super::report::TargetCheck;
use super::stats::{LatencySummary, cpu_time_of, machine_busy_time, process_cpu_time};

/// Target: end-to-end port-forward throughput over the OpenSSH relay's.
pub const TARGET_THROUGHPUT_VS_SSH: f64 = 1.5;
/// Target: port-forward connection setup p99, milliseconds.
pub const TARGET_SETUP_P99_MS: f64 = 2.0;
/// Other processes keeping this many cores busy during a phase make its figures "measured
/// under load".
const INTERFERENCE_CORES: f64 = 0.2;
/// Longest wait for one operation (a transfer, a batch of round trips or setups).
const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for a child process to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Round-trip payload.
const ECHO_BYTES: usize = 64;
/// Largest frame of the target's framed upload (mode `F`).
pub(super) const MAX_FRAME: usize = 16 << 20;
/// The agent's cluster ID.
const CLUSTER: &str = "bench";

/// Options of `rlark bench port-forward`.
#[derive(Debug, Clone, clap::Args)]
pub struct PortForwardBenchOptions {
    /// MiB per throughput measurement (one connection, each direction).
    #[arg(long, default_value_t = 256)]
    pub mib: usize,
    /// Throughput runs per path and direction (the paths interleaved); round trips and
    /// setups are split into as many interleaved rounds.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// 64-byte round trips timed per path (one connection per round).
    #[arg(long, default_value_t = 2000)]
    pub round_trips: usize,
    /// Connection setups timed per path.
    #[arg(long, default_value_t = 1000)]
    pub setups: usize,
    /// Do not start the OpenSSH relay (reported as not measured).
    #[arg(long)]
    pub skip_ssh: bool,
    /// Cipher of the OpenSSH relay (`ssh -c`); default: OpenSSH's own first choice.
    #[arg(long, value_name = "CIPHER")]
    pub ssh_cipher: Option<String>,
    /// Give up after this many seconds (the whole run).
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Where and how the run happened.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Environment {
    /// `release` or `debug`.
    pub build: String,
    /// CPUs available to this process.
    pub cpus: usize,
    /// `/proc/loadavg` (1, 5, 15 minutes) before and after the run.
    pub load_average_start: Option<[f64; 3]>,
    pub load_average_end: Option<[f64; 3]>,
    /// Bytes per throughput measurement.
    pub bytes: u64,
    pub runs: usize,
    pub round_trips: usize,
    pub setups: usize,
    /// `ssh -V`.
    pub openssh_version: Option<String>,
    /// The relay's cipher: `--ssh-cipher`, else the first of `ssh -G`'s list (both ends are
    /// the same OpenSSH, so that is what they negotiate).
    pub openssh_cipher: Option<String>,
    /// rlark's TLS: the cipher suite its provider prefers.
    pub rlark_tls: String,
}

/// Throughput of one direction over the runs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rate {
    /// Median over the runs, MiB/s.
    pub median_mib_s: f64,
    pub min_mib_s: f64,
    pub max_mib_s: f64,
    /// Every run, in order.
    pub runs_mib_s: Vec<f64>,
}

impl Rate {
    fn from_runs(runs: Vec<f64>) -> Option<Self> {
        if runs.is_empty() {
            return None;
        }
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Some(Self {
            median_mib_s: median,
            min_mib_s: sorted[0],
            max_mib_s: sorted[n - 1],
            runs_mib_s: runs,
        })
    }
}

/// Everything measured on one path.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PathFigures {
    /// `direct TCP`, `rlark port-forward`, `OpenSSH relay`.
    pub name: String,
    /// The hops.
    pub route: String,
    /// Why the path was not measured, when it was not.
    pub not_measured: Option<String>,
    /// Client → target.
    pub upload: Option<Rate>,
    /// Target → client.
    pub download: Option<Rate>,
    /// 64-byte round trips.
    pub round_trip: Option<LatencySummary>,
    /// Connect + mode byte echoed back.
    pub setup: Option<LatencySummary>,
    /// CPU seconds of the forwarding processes (not this one) per GiB moved, both
    /// directions of the throughput runs together. `None` for direct TCP.
    pub relay_cpu_s_per_gib: Option<f64>,
    /// CPU of the forwarding processes per connection setup, microseconds.
    pub relay_cpu_us_per_setup: Option<f64>,
    /// The forwarding processes and their CPU share, e.g. `server 40%, agent 35%, ...`
    /// (throughput runs).
    pub relay_cpu_split: Vec<(String, f64)>,
    /// The most cores that processes outside this run kept busy during one of this path's
    /// phases.
    pub others_cores_max: Option<f64>,
    /// Phase failures.
    pub errors: Vec<String>,
}

/// Everything `rlark bench port-forward` measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PortForwardBenchReport {
    pub environment: Environment,
    /// Direct TCP, rlark port-forward, OpenSSH relay.
    pub paths: Vec<PathFigures>,
    /// Targets with met / not met.
    pub targets: Vec<TargetCheck>,
    /// Derived observations.
    pub analysis: Vec<String>,
    /// Wall time of the whole run.
    pub elapsed_secs: f64,
}

const DIRECT: usize = 0;
const RLARK: usize = 1;
const SSH: usize = 2;

impl PortForwardBenchReport {
    fn path(&self, index: usize) -> Option<&PathFigures> {
        self.paths.get(index).filter(|p| p.not_measured.is_none())
    }

    /// Fill the targets and the analysis from the figures.
    pub fn evaluate(&mut self) {
        let mut targets = Vec::new();
        let rlark = self.path(RLARK);
        let ssh = self.path(SSH);
        let loaded = |p: Option<&PathFigures>| {
            p.and_then(|p| p.others_cores_max)
                .filter(|c| *c >= INTERFERENCE_CORES)
        };
        let load_note = match (loaded(rlark), loaded(ssh)) {
            (None, None) => None,
            (a, b) => Some(format!(
                "measured under load: other processes kept up to {:.1} cores busy",
                a.unwrap_or(0.0).max(b.unwrap_or(0.0))
            )),
        };
        for (direction, pick) in [
            (
                "upload",
                (|p: &PathFigures| p.upload.clone()) as fn(&PathFigures) -> _,
            ),
            ("download", |p: &PathFigures| p.download.clone()),
        ] {
            let ours = rlark.and_then(pick);
            let theirs = ssh.and_then(pick);
            let (measured, note) = match (&ours, &theirs) {
                (Some(o), Some(t)) if t.median_mib_s > 0.0 => {
                    (Some(o.median_mib_s / t.median_mib_s), load_note.clone())
                }
                (None, _) => (None, Some("rlark port-forward not measured".to_string())),
                (_, _) => (
                    None,
                    Some(
                        match self.paths.get(SSH).and_then(|p| p.not_measured.clone()) {
                            Some(why) => format!("OpenSSH relay not measured: {why}"),
                            None => "OpenSSH relay throughput missing".to_string(),
                        },
                    ),
                ),
            };
            targets.push(TargetCheck {
                name: format!("{direction} throughput vs OpenSSH relay"),
                target: format!(">= {TARGET_THROUGHPUT_VS_SSH:.1}"),
                pass: measured.is_some_and(|r| r >= TARGET_THROUGHPUT_VS_SSH),
                measured,
                unit: "x".into(),
                note,
            });
        }
        let setup = rlark.and_then(|p| p.setup.as_ref()).filter(|s| s.count > 0);
        targets.push(TargetCheck {
            name: "port-forward connection setup p99".into(),
            target: format!("<= {TARGET_SETUP_P99_MS:.0}"),
            pass: setup.is_some_and(|s| s.p99_ms <= TARGET_SETUP_P99_MS),
            measured: setup.map(|s| s.p99_ms),
            unit: "ms".into(),
            note: if setup.is_none() {
                Some("not measured".into())
            } else {
                load_note.clone()
            },
        });
        self.targets = targets;
        self.analysis = self.derive_analysis();
    }

    fn derive_analysis(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let (Some(rlark), direct) = (self.path(RLARK), self.path(DIRECT)) else {
            return lines;
        };
        let ssh = self.path(SSH);
        if let (Some(r), Some(d)) = (rlark.setup.as_ref(), direct.and_then(|d| d.setup.as_ref())) {
            let mut line = format!(
                "setup: rlark p50 {:.2} ms vs direct {:.2} ms: every forwarded connection takes \
                 its own TCP + TLS 1.3 connection (client certificate) to the server, opened \
                 ahead as a spare, and sends CONNECT with the client's first bytes behind it; \
                 the server opens a tunnel stream and the agent dials the target",
                r.p50_ms, d.p50_ms
            );
            if let Some(s) = ssh.and_then(|s| s.setup.as_ref()) {
                line.push_str(&format!(
                    "; ssh -L opens a channel on its already authenticated session instead \
                     (p50 {:.2} ms)",
                    s.p50_ms
                ));
            }
            if let Some(us) = rlark.relay_cpu_us_per_setup {
                line.push_str(&format!(
                    "; the rlark processes spend {us:.0} µs of CPU per setup"
                ));
                if let Some(s) = ssh.and_then(|s| s.relay_cpu_us_per_setup) {
                    line.push_str(&format!(", OpenSSH's {s:.0} µs"));
                }
            }
            lines.push(line);
        }
        if let Some(cpu) = rlark.relay_cpu_s_per_gib {
            let mut line = format!("forwarding CPU: rlark {cpu:.2} s per GiB");
            if !rlark.relay_cpu_split.is_empty() {
                let split: Vec<String> = rlark
                    .relay_cpu_split
                    .iter()
                    .map(|(name, share)| format!("{name} {:.0}%", share * 100.0))
                    .collect();
                line.push_str(&format!(" ({})", split.join(", ")));
            }
            if let Some(s) = ssh.and_then(|s| s.relay_cpu_s_per_gib) {
                line.push_str(&format!(
                    ", OpenSSH {s:.2} s per GiB ({:.2}x rlark's)",
                    s / cpu.max(1e-9)
                ));
            }
            line.push_str(
                "; with both sides on one 2-core machine the throughput is bound by this CPU \
                 per byte",
            );
            lines.push(line);
        }
        if let Some(s) = ssh.and_then(|s| s.setup.as_ref())
            && (30.0..=60.0).contains(&s.p50_ms)
        {
            lines.push(format!(
                "OpenSSH setup p50 {:.1} ms sits at the ~40 ms delayed-ACK interval while its \
                 round trips take {} ms: the signature of Nagle's algorithm on a session socket \
                 (OpenSSH sets TCP_NODELAY for interactive sessions, and `ssh -N` opens none) \
                 holding a small write until the peer's delayed ACK",
                s.p50_ms,
                ssh.and_then(|s| s.round_trip.as_ref())
                    .map_or("-".to_string(), |r| format!("{:.2}", r.p50_ms))
            ));
        }
        if let (Some(r), Some(s)) = (
            rlark.round_trip.as_ref(),
            ssh.and_then(|s| s.round_trip.as_ref()),
        ) {
            lines.push(format!(
                "64-byte round trip: rlark p50 {:.3} ms / p99 {:.3} ms, OpenSSH p50 {:.3} ms / \
                 p99 {:.3} ms",
                r.p50_ms, r.p99_ms, s.p50_ms, s.p99_ms
            ));
        }
        let loaded: Vec<String> = self
            .paths
            .iter()
            .filter_map(|p| {
                let c = p.others_cores_max?;
                (c >= INTERFERENCE_CORES).then(|| format!("{} {c:.1}", p.name))
            })
            .collect();
        if !loaded.is_empty() {
            lines.push(format!(
                "other processes kept cores busy during the phases (most cores, per path: {}): \
                 the figures are pessimistic and vary with that load; compare the paths with \
                 each other (they were interleaved), not with a quiet machine",
                loaded.join(", ")
            ));
        }
        lines
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

impl std::fmt::Display for PortForwardBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env = &self.environment;
        let load = |l: Option<[f64; 3]>| l.map_or("?".to_string(), |l| format!("{:.1}", l[0]));
        writeln!(
            f,
            "rlark bench port-forward: {} build, {} CPU(s), load average {} at start / {} at \
             end; {} MiB per transfer x {} runs, {} round trips, {} setups",
            env.build,
            env.cpus,
            load(env.load_average_start),
            load(env.load_average_end),
            env.bytes / (1024 * 1024),
            env.runs,
            env.round_trips,
            env.setups
        )?;
        if env.build == "debug" {
            writeln!(
                f,
                "  (debug build: figures are not representative; use --release)"
            )?;
        }
        for p in &self.paths {
            write!(f, "  {}: {}", p.name, p.route)?;
            if let Some(why) = &p.not_measured {
                write!(f, " -- not measured: {why}")?;
            }
            writeln!(f)?;
        }
        writeln!(
            f,
            "  rlark TLS: {}; OpenSSH: {}, cipher {}",
            env.rlark_tls,
            env.openssh_version.as_deref().unwrap_or("-"),
            env.openssh_cipher.as_deref().unwrap_or("-")
        )?;
        writeln!(f)?;
        let get = |i: usize| self.path(i);
        let cell = |v: Option<f64>, precision: usize| {
            v.map_or("-".to_string(), |v| format!("{v:.precision$}"))
        };
        writeln!(
            f,
            "  {:<36} {:>12} {:>12} {:>12} {:>10} {:>10}",
            "", "direct TCP", "rlark pf", "OpenSSH", "rlark/TCP", "rlark/ssh"
        )?;
        type Pick = fn(&PathFigures) -> Option<f64>;
        let rows: [(&str, Pick, usize); 11] = [
            (
                "upload MiB/s (median)",
                |p| p.upload.as_ref().map(|r| r.median_mib_s),
                0,
            ),
            (
                "  min over runs",
                |p| p.upload.as_ref().map(|r| r.min_mib_s),
                0,
            ),
            (
                "  max over runs",
                |p| p.upload.as_ref().map(|r| r.max_mib_s),
                0,
            ),
            (
                "download MiB/s (median)",
                |p| p.download.as_ref().map(|r| r.median_mib_s),
                0,
            ),
            (
                "  min over runs",
                |p| p.download.as_ref().map(|r| r.min_mib_s),
                0,
            ),
            (
                "  max over runs",
                |p| p.download.as_ref().map(|r| r.max_mib_s),
                0,
            ),
            (
                "64-byte round trip p50 ms",
                |p| p.round_trip.as_ref().map(|l| l.p50_ms),
                3,
            ),
            (
                "64-byte round trip p99 ms",
                |p| p.round_trip.as_ref().map(|l| l.p99_ms),
                3,
            ),
            (
                "connection setup p50 ms",
                |p| p.setup.as_ref().map(|l| l.p50_ms),
                3,
            ),
            (
                "connection setup p99 ms",
                |p| p.setup.as_ref().map(|l| l.p99_ms),
                3,
            ),
            ("forwarding CPU s/GiB", |p| p.relay_cpu_s_per_gib, 2),
        ];
        for (name, pick, precision) in rows {
            let d = get(DIRECT).and_then(pick);
            let r = get(RLARK).and_then(pick);
            let s = get(SSH).and_then(pick);
            writeln!(
                f,
                "  {:<36} {:>12} {:>12} {:>12} {:>10} {:>10}",
                name,
                cell(d, precision),
                cell(r, precision),
                cell(s, precision),
                ratio(r, d),
                ratio(r, s)
            )?;
        }
        writeln!(
            f,
            "  {:<36} {:>12} {:>12} {:>12}",
            "other processes' cores busy (max)",
            cell(get(DIRECT).and_then(|p| p.others_cores_max), 2),
            cell(get(RLARK).and_then(|p| p.others_cores_max), 2),
            cell(get(SSH).and_then(|p| p.others_cores_max), 2),
        )?;

        writeln!(f, "\nTargets")?;
        for t in &self.targets {
            let mark = if t.pass { "met" } else { "NOT MET" };
            write!(
                f,
                "  [{mark}] {:<40} {:>8}{} (target {}{})",
                t.name,
                cell(t.measured, 2),
                t.unit,
                t.target,
                t.unit
            )?;
            if let Some(note) = &t.note {
                write!(f, ": {note}")?;
            }
            writeln!(f)?;
        }
        if !self.analysis.is_empty() {
            writeln!(f, "\nAnalysis")?;
            for line in &self.analysis {
                writeln!(f, "  - {line}")?;
            }
        }
        let errors: Vec<String> = self
            .paths
            .iter()
            .flat_map(|p| p.errors.iter().map(move |e| format!("{}: {e}", p.name)))
            .collect();
        if !errors.is_empty() {
            writeln!(f, "\nErrors")?;
            for e in errors {
                writeln!(f, "  ! {e}")?;
            }
        }
        writeln!(f, "\nTotal time {:.1} s", self.elapsed_secs)
    }
}

// ---------------------------------------------------------------------------------------
// The target
// ---------------------------------------------------------------------------------------

/// The target server: per connection a mode byte, acknowledged with the same byte at once;
/// `U`: read to EOF, answer the byte count (u64); `D`: read a u64 N, write N bytes, close;
/// `E`: echo until EOF.
/// Serve the target on `127.0.0.1:port` until killed (`rlark-bench target`).
pub(super) async fn serve_targets(port: u16) -> anyhow::Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("listen on 127.0.0.1:{port}"))?;
    loop {
        let (socket, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = serve_target(socket).await;
        });
    }
}

pub(super) async fn target_server() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = serve_target(socket).await;
            });
        }
    });
    Ok(addr)
}

/// Serve one connection of the target: a mode byte (echoed back), then `U` (upload until
/// the client half-closes, answer the count), `F` (framed upload, [`MAX_FRAME`] at most a
/// frame, ended by an empty frame, answer the count: no half-close), `D` (download the
/// `u64` asked), or `E` (echo).
pub(super) async fn serve_target(mut socket: TcpStream) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    let mode = socket.read_u8().await?;
    socket.write_all(&[mode]).await?;
    let mut buf = vec![0u8; 256 * 1024];
    match mode {
        b'U' => {
            let mut total = 0u64;
            loop {
                match socket.read(&mut buf).await? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            socket.write_u64(total).await?;
            socket.shutdown().await?;
        }
        b'D' => {
            let mut left = socket.read_u64().await?;
            buf.fill(0xa5);
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                socket.write_all(&buf[..n]).await?;
                left -= n as u64;
            }
            socket.shutdown().await?;
            // Until the client closes.
            let _ = socket.read(&mut buf).await;
        }
        b'F' => {
            // Framed upload: `u32` length + payload, until a zero length; then the count.
            // Needs no half-close (tun mode's userspace stack has none).
            let mut total = 0u64;
            loop {
                let len = socket.read_u32().await? as usize;
                if len == 0 {
                    break;
                }
                if len > MAX_FRAME {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("frame of {len} bytes, at most {MAX_FRAME}"),
                    ));
                }
                let mut left = len;
                while left > 0 {
                    let want = left.min(buf.len());
                    let n = socket.read(&mut buf[..want]).await?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    left -= n;
                    total += n as u64;
                }
            }
            socket.write_u64(total).await?;
            // Until the client closes.
            let _ = socket.read(&mut buf).await;
        }
        b'E' => loop {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            socket.write_all(&buf[..n]).await?;
        },
        _ => {}
    }
    Ok(())
}

/// Connect and have `mode` acknowledged by the target: the whole path is up.
pub(super) async fn open(addr: SocketAddr, mode: u8) -> anyhow::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    stream.write_all(&[mode]).await?;
    let ack = stream.read_u8().await.context("read the target's ack")?;
    if ack != mode {
        bail!("the target answered {ack:#x} to mode {mode:#x}");
    }
    Ok(stream)
}

pub(super) async fn bounded<T>(
    what: &str,
    future: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(OP_TIMEOUT, future)
        .await
        .with_context(|| format!("{what}: not done within {OP_TIMEOUT:?}"))?
}

/// Upload `bytes` over one connection; the time from the first byte written to the target's
/// count.
pub(super) async fn upload(addr: SocketAddr, bytes: u64) -> anyhow::Result<Duration> {
    bounded("upload", async {
        let mut stream = open(addr, b'U').await?;
        let chunk = vec![0x5au8; 256 * 1024];
        let started = Instant::now();
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            stream.write_all(&chunk[..n]).await?;
            left -= n as u64;
        }
        stream.shutdown().await?;
        let got = stream.read_u64().await.context("read the target's count")?;
        let elapsed = started.elapsed();
        if got != bytes {
            bail!("the target received {got} bytes of {bytes}");
        }
        Ok(elapsed)
    })
    .await
}

/// Download `bytes` over one connection; the time from the request to the last byte.
pub(super) async fn download(addr: SocketAddr, bytes: u64) -> anyhow::Result<Duration> {
    bounded("download", async {
        let mut stream = open(addr, b'D').await?;
        let mut buf = vec![0u8; 256 * 1024];
        let started = Instant::now();
        stream.write_u64(bytes).await?;
        let mut got = 0u64;
        loop {
            match stream.read(&mut buf).await? {
                0 => break,
                n => got += n as u64,
            }
        }
        let elapsed = started.elapsed();
        if got != bytes {
            bail!("received {got} bytes of {bytes}");
        }
        Ok(elapsed)
    })
    .await
}

/// `n` 64-byte round trips on one connection.
async fn round_trips(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Duration>> {
    bounded("round trips", async {
        let mut stream = open(addr, b'E').await?;
        let out = [0x42u8; ECHO_BYTES];
        let mut back = [0u8; ECHO_BYTES];
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let started = Instant::now();
            stream.write_all(&out).await?;
            stream.read_exact(&mut back).await?;
            samples.push(started.elapsed());
        }
        Ok(samples)
    })
    .await
}

/// `n` connection setups, one after another: connect + the mode byte echoed back.
pub(super) async fn setups(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<Duration>> {
    bounded("setups", async {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let started = Instant::now();
            let stream = open(addr, b'E').await?;
            samples.push(started.elapsed());
            drop(stream);
        }
        Ok(samples)
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------------------

/// How long a child gets to end after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A child process, stopped when dropped; its output goes to `log`.
///
/// Stopping (and dropping, on an error path) sends SIGTERM and waits up to [`STOP_GRACE`]
/// before SIGKILL: an `rlark agent` started with `--stop-tasks-on-exit` then stops its
/// replicas, whose supervisors would otherwise outlive a killed agent (as they are meant
/// to, for adoption) and stay behind after the bench.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) child: Child,
    pub(super) pid: u32,
    pub(super) log: PathBuf,
}

impl Proc {
    pub(super) fn spawn(name: &str, mut command: Command, log: &Path) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stderr(file)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        let child = command.spawn().with_context(|| format!("start {name}"))?;
        let pid = child.id().with_context(|| format!("{name} has no pid"))?;
        Ok(Self {
            name: name.to_string(),
            child,
            pid,
            log: log.to_path_buf(),
        })
    }

    /// The last lines of its log, for an error message.
    pub(super) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(20);
        format!("{} log:\n{}", self.name, lines[start..].join("\n"))
    }

    /// Fails (with the log) when it has exited.
    pub(super) fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited with {status}\n{}", self.name, self.log_tail());
        }
        Ok(())
    }

    /// SIGTERM, then SIGKILL after [`STOP_GRACE`] (type docs).
    pub(super) async fn stop(mut self) {
        self.terminate();
        if tokio::time::timeout(STOP_GRACE, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.start_kill();
            let _ = tokio::time::timeout(STOP_GRACE, self.child.wait()).await;
        }
    }

    /// Send SIGTERM unless it has exited.
    fn terminate(&mut self) {
        if matches!(self.child.try_wait(), Ok(None))
            && let Some(pid) = i32::try_from(self.pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
}

impl Drop for Proc {
    /// An error path: the same SIGTERM and bounded wait as [`Proc::stop`], blocking (a
    /// drop cannot await), then the kill on drop.
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        self.terminate();
        let until = Instant::now() + STOP_GRACE;
        while Instant::now() < until && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A free port on 127.0.0.1 (bound and released: another process could take it meanwhile,
/// which would show as a start failure).
/// Start `rlark agent` (binary `exe`) for `cluster` against the server at `url`, joining
/// with `token` (the JSON of `rlark token create -o json`), its data and log under `dir`.
pub(super) fn spawn_agent(
    exe: &Path,
    url: &str,
    cluster: &str,
    node: &str,
    token: &serde_json::Value,
    dir: &Path,
) -> anyhow::Result<Proc> {
    let field = |name: &str| {
        token[name]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("no {name} in {token}"))
    };
    let mut command = Command::new(exe);
    command
        .args(["agent", "--server", url, "--cluster-id", cluster])
        .arg("--data-dir")
        .arg(dir.join("agent"))
        .args(["--node-name", node, "--stop-tasks-on-exit"])
        .arg("--token")
        .arg(field("token")?)
        .arg("--ca-hash")
        .arg(field("caHash")?)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    Proc::spawn("rlark agent", command, &dir.join("agent.log"))
}

pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Retry one echo round trip through `addr` until it works.
pub(super) async fn wait_path_ready(
    addr: SocketAddr,
    procs: &mut [&mut Proc],
) -> anyhow::Result<()> {
    let until = Instant::now() + START_TIMEOUT;
    let mut last = None;
    while Instant::now() < until {
        for p in procs.iter_mut() {
            p.check_running()?;
        }
        let attempt = tokio::time::timeout(Duration::from_secs(5), async {
            let mut s = open(addr, b'E').await?;
            s.write_all(b"ping").await?;
            let mut back = [0u8; 4];
            s.read_exact(&mut back).await?;
            anyhow::Ok(())
        })
        .await;
        match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => last = Some(format!("{e:#}")),
            Err(_) => last = Some("timed out".into()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logs: Vec<String> = procs.iter().map(|p| p.log_tail()).collect();
    bail!(
        "no echo through {addr} within {START_TIMEOUT:?} (last: {})\n{}",
        last.unwrap_or_default(),
        logs.join("\n")
    )
}

/// The rlark path: server, agent, port-forward.
struct RlarkPath {
    local: SocketAddr,
    server: Proc,
    agent: Proc,
    forward: Proc,
    _dir: tempfile::TempDir,
}

impl RlarkPath {
    fn procs(&self) -> Vec<(&str, u32)> {
        vec![
            ("server", self.server.pid),
            ("agent", self.agent.pid),
            ("port-forward", self.forward.pid),
        ]
    }

    async fn stop(self) {
        self.forward.stop().await;
        self.agent.stop().await;
        self.server.stop().await;
    }
}

async fn start_rlark(target: SocketAddr) -> anyhow::Result<RlarkPath> {
    let exe = super::rlark_exe()?;
    let dir = tempfile::Builder::new()
        .prefix("rlark-bench-pf-")
        .tempdir()?;
    let data = dir.path().join("server");
    let kubeconfig = data.join("admin.kubeconfig");

    let mut command = Command::new(&exe);
    command
        .args(["--log-format", "json", "server", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(&data)
        .arg("--controllers=false")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    let mut server = Proc::spawn("rlark server", command, &dir.path().join("server.log"))?;
    let url = wait_listening(&mut server).await?;

    let token = tokio::time::timeout(
        START_TIMEOUT,
        Command::new(&exe)
            .args(["token", "create", "--cluster-id", CLUSTER, "--ttl", "10m"])
            .args(["-o", "json", "--kubeconfig"])
            .arg(&kubeconfig)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("rlark token create: timed out")??;
    if !token.status.success() {
        bail!(
            "rlark token create: {}: {}",
            token.status,
            String::from_utf8_lossy(&token.stderr)
        );
    }
    let token: serde_json::Value =
        serde_json::from_slice(&token.stdout).context("rlark token create output")?;
    let mut agent = spawn_agent(&exe, &url, CLUSTER, "bench-pf", &token, dir.path())?;

    let mut command = Command::new(&exe);
    command
        .args([
            "port-forward",
            CLUSTER,
            &format!("0:127.0.0.1:{}", target.port()),
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped());
    let mut forward = Proc::spawn(
        "rlark port-forward",
        command,
        &dir.path().join("port-forward.log"),
    )?;
    let stdout = forward.child.stdout.take().context("port-forward stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_TIMEOUT, lines.next_line())
        .await
        .context("rlark port-forward printed nothing")??;
    let Some(first) = first else {
        forward.check_running()?;
        bail!(
            "rlark port-forward closed its output\n{}",
            forward.log_tail()
        );
    };
    // Keep reading so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let local: SocketAddr = first
        .strip_prefix("Forwarding from ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.parse().ok())
        .with_context(|| format!("rlark port-forward printed {first:?}"))?;

    wait_path_ready(local, &mut [&mut server, &mut agent, &mut forward]).await?;
    Ok(RlarkPath {
        local,
        server,
        agent,
        forward,
        _dir: dir,
    })
}

/// Wait for the server's JSON `listening` log line and return its URL.
async fn wait_listening(server: &mut Proc) -> anyhow::Result<String> {
    let until = Instant::now() + START_TIMEOUT;
    while Instant::now() < until {
        server.check_running()?;
        let text = std::fs::read_to_string(&server.log).unwrap_or_default();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if value["fields"]["message"] == "listening"
                && let Some(url) = value["fields"]["url"].as_str()
            {
                return Ok(url.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "rlark server did not listen within {START_TIMEOUT:?}\n{}",
        server.log_tail()
    )
}

/// The OpenSSH relay: sshd, `ssh -R` (target side), `ssh -L` (client side).
pub(super) struct SshPath {
    pub(super) local: SocketAddr,
    pub(super) sshd: Proc,
    pub(super) reverse: Proc,
    pub(super) forward: Proc,
    _dir: tempfile::TempDir,
}

impl SshPath {
    /// The relay's processes: both clients, sshd and its per-connection children.
    pub(super) fn procs(&self) -> Vec<(String, u32)> {
        let mut procs = vec![
            ("ssh -L".to_string(), self.forward.pid),
            ("ssh -R".to_string(), self.reverse.pid),
            ("sshd".to_string(), self.sshd.pid),
        ];
        procs.extend(
            descendants(self.sshd.pid)
                .into_iter()
                .map(|pid| ("sshd".to_string(), pid)),
        );
        procs
    }

    pub(super) async fn stop(self) {
        self.forward.stop().await;
        self.reverse.stop().await;
        self.sshd.stop().await;
    }
}

/// The peer tools a bench needs, looked up before it starts anything: `Err` names the first
/// missing one, the Debian package that has it and `skip` (the flag that measures without
/// that peer), so a bench never reports a peer as "not measured" for want of a package.
pub(super) fn require_peers(bench: &str, tools: &[(&str, &str)], skip: &str) -> anyhow::Result<()> {
    for (tool, package) in tools {
        if find_tool(tool).is_none() {
            bail!(
                "rlark bench {bench} measures beside a peer that needs `{tool}`, which is not \
                 installed: apt-get install {package} (or pass {skip} to leave that peer out)"
            );
        }
    }
    Ok(())
}

/// The OpenSSH relay's tools.
pub(super) const OPENSSH: &[(&str, &str)] = &[
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
    ("sshd", "openssh-server"),
];

/// `name` on PATH or in the sbin directories.
pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// Processes whose parent chain reaches `root` (from `/proc`).
pub(super) fn descendants(root: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(u32, u32)> = entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, ppid)| *ppid == parent)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

pub(super) async fn tool_output(
    program: &Path,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    tokio::time::timeout(
        START_TIMEOUT,
        Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{}: timed out", program.display()))?
    .with_context(|| format!("run {}", program.display()))
}

/// One of the OpenSSH relay's processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SshRole {
    /// `sshd`, the relay.
    Sshd,
    /// `ssh -R`, on the target's side.
    Reverse,
    /// `ssh -L`, on the client's side.
    Forward,
}

/// Puts a relay process where it runs (e.g. into a network namespace).
pub(super) type SshWrap<'a> =
    &'a (dyn Fn(SshRole, std::process::Command) -> anyhow::Result<std::process::Command> + Sync);

/// Where the OpenSSH relay's pieces run and listen.
pub(super) struct SshLayout<'a> {
    /// Address sshd listens on, which both clients connect to.
    pub(super) sshd_host: std::net::IpAddr,
    pub(super) sshd_port: u16,
    /// Port sshd opens on its loopback for `ssh -R`.
    pub(super) relay_port: u16,
    /// Port `ssh -L` listens on, on its loopback: the path's entry.
    pub(super) local_port: u16,
    /// The target as `ssh -R` reaches it.
    pub(super) target: SocketAddr,
    /// `None`: every piece runs in this process's network namespace (readiness is
    /// checked by connecting, the path by an echo through it). `Some`: each piece runs
    /// where the function puts it; a port is ready when `ss` lists it listening there,
    /// and the caller checks the path.
    pub(super) wrap: Option<SshWrap<'a>>,
}

impl SshLayout<'_> {
    /// All on 127.0.0.1, free ports.
    fn loopback(target: SocketAddr) -> anyhow::Result<Self> {
        Ok(Self {
            sshd_host: std::net::Ipv4Addr::LOCALHOST.into(),
            sshd_port: free_port()?,
            relay_port: free_port()?,
            local_port: free_port()?,
            target,
            wrap: None,
        })
    }

    fn command(&self, role: SshRole, command: std::process::Command) -> anyhow::Result<Command> {
        Ok(match self.wrap {
            Some(wrap) => Command::from(wrap(role, command)?),
            None => Command::from(command),
        })
    }

    /// Wait until `port` listens where `role` runs.
    async fn wait_port(
        &self,
        role: SshRole,
        host: std::net::IpAddr,
        port: u16,
        proc: &mut Proc,
    ) -> anyhow::Result<()> {
        if self.wrap.is_none() {
            return wait_port(SocketAddr::new(host, port), proc).await;
        }
        let until = Instant::now() + START_TIMEOUT;
        while Instant::now() < until {
            proc.check_running()?;
            let mut ss = std::process::Command::new("ss");
            ss.args(["-Hltn", &format!("sport = :{port}")]);
            let out = tokio::time::timeout(
                START_TIMEOUT,
                self.command(role, ss)?
                    .stdin(Stdio::null())
                    .kill_on_drop(true)
                    .output(),
            )
            .await
            .context("ss: timed out")?
            .context("run ss (iproute2)")?;
            if !out.stdout.is_empty() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "{} did not listen on port {port} within {START_TIMEOUT:?}\n{}",
            proc.name,
            proc.log_tail()
        )
    }
}

pub(super) async fn start_ssh(
    layout: &SshLayout<'_>,
    cipher: Option<&str>,
    env: &mut Environment,
) -> anyhow::Result<SshPath> {
    let target = layout.target;
    let sshd_bin = find_tool("sshd").context("sshd not found (apt-get install openssh-server)")?;
    let ssh_bin = find_tool("ssh").context("ssh not found (apt-get install openssh-client)")?;
    let keygen = find_tool("ssh-keygen").context("ssh-keygen not found")?;
    let version = tool_output(&ssh_bin, &["-V"]).await?;
    env.openssh_version = Some(String::from_utf8_lossy(&version.stderr).trim().to_string());

    let dir = tempfile::Builder::new()
        .prefix("rlark-bench-ssh-")
        .tempdir()?;
    let path = |name: &str| dir.path().join(name);
    let text = |p: &Path| p.to_string_lossy().into_owned();
    for key in ["host_key", "user_key"] {
        let file = text(&path(key));
        let out = tool_output(
            &keygen,
            &["-q", "-t", "ed25519", "-N", "", "-C", "bench", "-f", &file],
        )
        .await?;
        if !out.status.success() {
            bail!(
                "ssh-keygen: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    std::fs::copy(path("user_key.pub"), path("authorized_keys"))?;
    let user = tool_output(Path::new("id"), &["-un"]).await?;
    let user = String::from_utf8_lossy(&user.stdout).trim().to_string();
    if user.is_empty() {
        bail!("`id -un` printed no user name");
    }
    // sshd's privilege separation directory (Debian's package creates it at boot).
    if is_root() && !Path::new("/run/sshd").exists() {
        let _ = std::fs::create_dir_all("/run/sshd");
    }

    let (sshd_host, sshd_port, relay_port) =
        (layout.sshd_host, layout.sshd_port, layout.relay_port);
    let config = format!(
        "ListenAddress {sshd_host}\nPort {sshd_port}\nHostKey {host}\nPidFile none\n\
         AuthorizedKeysFile {auth}\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n\
         AllowTcpForwarding yes\nGatewayPorts no\nX11Forwarding no\nPrintMotd no\nUseDNS no\n\
         LogLevel ERROR\n",
        host = text(&path("host_key")),
        auth = text(&path("authorized_keys")),
    );
    std::fs::write(path("sshd_config"), config)?;
    let mut command = std::process::Command::new(&sshd_bin);
    command.args(["-D", "-e", "-f"]).arg(path("sshd_config"));
    let mut command = layout.command(SshRole::Sshd, command)?;
    command.stdout(Stdio::null());
    let mut sshd = Proc::spawn("sshd", command, &path("sshd.log"))?;
    layout
        .wait_port(SshRole::Sshd, sshd_host, sshd_port, &mut sshd)
        .await?;

    let cipher = match cipher {
        Some(c) => c.to_string(),
        None => {
            let out = tool_output(&ssh_bin, &["-G", "-F", "/dev/null", "127.0.0.1"]).await?;
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("ciphers "))
                .and_then(|list| list.split(',').next())
                .unwrap_or("?")
                .to_string()
        }
    };
    env.openssh_cipher = Some(cipher.clone());
    let ssh = |role: SshRole, forward: &str, spec: String| -> anyhow::Result<Command> {
        let mut command = std::process::Command::new(&ssh_bin);
        command
            .args(["-N", "-F", "/dev/null", "-p", &sshd_port.to_string(), "-i"])
            .arg(path("user_key"))
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "ExitOnForwardFailure=yes",
                "-o",
                "LogLevel=ERROR",
                "-c",
                &cipher,
                forward,
                &spec,
            ])
            .arg(format!("{user}@{sshd_host}"));
        let mut command = layout.command(role, command)?;
        command.stdout(Stdio::null());
        Ok(command)
    };
    let mut reverse = Proc::spawn(
        "ssh -R",
        ssh(
            SshRole::Reverse,
            "-R",
            format!("127.0.0.1:{relay_port}:{}", bracketed(target)),
        )?,
        &path("ssh-R.log"),
    )?;
    let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
    layout
        .wait_port(SshRole::Sshd, loopback, relay_port, &mut reverse)
        .await?;
    let local_port = layout.local_port;
    let mut forward = Proc::spawn(
        "ssh -L",
        ssh(
            SshRole::Forward,
            "-L",
            format!("127.0.0.1:{local_port}:127.0.0.1:{relay_port}"),
        )?,
        &path("ssh-L.log"),
    )?;
    let local = SocketAddr::new(loopback, local_port);
    layout
        .wait_port(SshRole::Forward, loopback, local_port, &mut forward)
        .await?;
    if layout.wrap.is_none() {
        wait_path_ready(local, &mut [&mut sshd, &mut reverse, &mut forward]).await?;
    }
    Ok(SshPath {
        local,
        sshd,
        reverse,
        forward,
        _dir: dir,
    })
}

/// `host:port` as ssh's forwarding specs want it (an IPv6 host in brackets).
fn bracketed(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V4(a) => a.to_string(),
        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
    }
}

pub(super) fn is_root() -> bool {
    // The owner of /proc/self is the effective user.
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// Wait until `addr` accepts a TCP connection.
async fn wait_port(addr: SocketAddr, proc: &mut Proc) -> anyhow::Result<()> {
    let until = Instant::now() + START_TIMEOUT;
    while Instant::now() < until {
        proc.check_running()?;
        if TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "{} did not open {addr} within {START_TIMEOUT:?}\n{}",
        proc.name,
        proc.log_tail()
    )
}

// ---------------------------------------------------------------------------------------
// Accounting
// ---------------------------------------------------------------------------------------

/// CPU of this process, of each path's forwarding processes and of the machine at the
/// start of a phase.
pub(super) struct Snapshot {
    wall: Instant,
    own: Option<Duration>,
    groups: Vec<Vec<(String, Duration)>>,
    machine: Option<Duration>,
}

/// What a phase cost.
pub(super) struct Cost {
    /// Per path: CPU of each forwarding process (by name, summed).
    pub(super) groups: Vec<Vec<(String, Duration)>>,
    /// Cores busy outside this run.
    pub(super) others_cores: Option<f64>,
}

pub(super) fn snapshot(groups: &[Vec<(String, u32)>]) -> Snapshot {
    Snapshot {
        wall: Instant::now(),
        own: process_cpu_time(),
        groups: groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|(name, pid)| {
                        (
                            name.clone(),
                            cpu_time_of(&pid.to_string()).unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .collect(),
        machine: machine_busy_time(),
    }
}

pub(super) fn cost(before: &Snapshot, groups: &[Vec<(String, u32)>]) -> Cost {
    let after = snapshot(groups);
    let wall = before.wall.elapsed();
    let mut deltas = Vec::new();
    let mut ours = Duration::ZERO;
    for (i, group) in after.groups.iter().enumerate() {
        let mut per_name: Vec<(String, Duration)> = Vec::new();
        for (j, (name, cpu)) in group.iter().enumerate() {
            // A process that appeared during the phase started from zero.
            let start = before
                .groups
                .get(i)
                .and_then(|g| g.get(j))
                .filter(|(n, _)| n == name)
                .map_or(Duration::ZERO, |(_, d)| *d);
            let d = cpu.saturating_sub(start);
            ours += d;
            match per_name.iter_mut().find(|(n, _)| n == name) {
                Some((_, total)) => *total += d,
                None => per_name.push((name.clone(), d)),
            }
        }
        deltas.push(per_name);
    }
    let others_cores = match (before.own, after.own, before.machine, after.machine) {
        (Some(o0), Some(o1), Some(m0), Some(m1)) if wall.as_secs_f64() >= 0.5 => {
            let others = (m1.saturating_sub(m0))
                .saturating_sub(o1.saturating_sub(o0))
                .saturating_sub(ours);
            Some(others.as_secs_f64() / wall.as_secs_f64())
        }
        _ => None,
    };
    Cost {
        groups: deltas,
        others_cores,
    }
}

pub(super) fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

pub(super) fn mib_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / elapsed.as_secs_f64().max(1e-9)
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

/// Per path, during the measurement.
#[derive(Default)]
struct Acc {
    addr: Option<SocketAddr>,
    upload: Vec<f64>,
    download: Vec<f64>,
    round_trips: Vec<Duration>,
    setups: Vec<Duration>,
    transfer_cpu: Vec<(String, Duration)>,
    transfer_bytes: u64,
    setup_cpu: Duration,
    others_max: Option<f64>,
    errors: Vec<String>,
}

impl Acc {
    fn note_cost(&mut self, cost: &Cost, index: usize, transfer: bool) {
        if let Some(c) = cost.others_cores {
            self.others_max = Some(self.others_max.map_or(c, |m| m.max(c)));
        }
        let Some(group) = cost.groups.get(index) else {
            return;
        };
        for (name, d) in group {
            if transfer {
                match self.transfer_cpu.iter_mut().find(|(n, _)| n == name) {
                    Some((_, total)) => *total += *d,
                    None => self.transfer_cpu.push((name.clone(), *d)),
                }
            } else {
                self.setup_cpu += *d;
            }
        }
    }

    fn fail(&mut self, what: &str, error: &anyhow::Error) {
        if self.errors.len() < 5 {
            self.errors.push(format!("{what}: {error:#}"));
        }
    }
}

/// Run the benchmark.
pub async fn run_port_forward(
    options: PortForwardBenchOptions,
) -> anyhow::Result<PortForwardBenchReport> {
    let started = Instant::now();
    if !options.skip_ssh {
        require_peers("port-forward", OPENSSH, "--skip-ssh")?;
    }
    let bytes = (options.mib as u64).max(1) * 1024 * 1024;
    let runs = options.runs.max(1);
    let mut env = Environment {
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_average_start: load_average(),
        bytes,
        runs,
        round_trips: options.round_trips,
        setups: options.setups,
        rlark_tls: "TLS 1.3, TLS13_AES_128_GCM_SHA256 preferred (rustls + ring)".into(),
        ..Environment::default()
    };
    let target = target_server().await?;

    let rlark = start_rlark(target)
        .await
        .context("start rlark server, agent and port-forward")?;
    let ssh = if options.skip_ssh {
        Err("--skip-ssh".to_string())
    } else {
        let started = match SshLayout::loopback(target) {
            Ok(layout) => start_ssh(&layout, options.ssh_cipher.as_deref(), &mut env).await,
            Err(e) => Err(e),
        };
        started.map_err(|e| format!("{e:#}"))
    };

    let mut paths = vec![
        PathFigures {
            name: "direct TCP".into(),
            route: "client -> target".into(),
            ..PathFigures::default()
        },
        PathFigures {
            name: "rlark port-forward".into(),
            route: "client -> rlark port-forward -> TLS + CONNECT -> rlark server -> tunnel \
                    (TLS + WebSocket + mux) -> rlark agent -> target"
                .into(),
            ..PathFigures::default()
        },
        PathFigures {
            name: "OpenSSH relay".into(),
            route: "client -> ssh -L -> sshd (relay) -> ssh -R -> target".into(),
            not_measured: ssh.as_ref().err().cloned(),
            ..PathFigures::default()
        },
    ];
    let mut accs: Vec<Acc> = (0..3).map(|_| Acc::default()).collect();
    accs[DIRECT].addr = Some(target);
    accs[RLARK].addr = Some(rlark.local);
    if let Ok(ssh) = &ssh {
        accs[SSH].addr = Some(ssh.local);
    }
    let groups = |ssh: &Result<SshPath, String>| -> Vec<Vec<(String, u32)>> {
        vec![
            Vec::new(),
            rlark
                .procs()
                .into_iter()
                .map(|(n, p)| (n.to_string(), p))
                .collect(),
            ssh.as_ref().map(SshPath::procs).unwrap_or_default(),
        ]
    };

    let measure = async {
        // Warm-up, untimed.
        for acc in accs.iter_mut() {
            let Some(addr) = acc.addr else { continue };
            let warm = async {
                upload(addr, 1 << 20).await?;
                download(addr, 1 << 20).await?;
                round_trips(addr, 50).await?;
                setups(addr, 10).await
            };
            if let Err(e) = warm.await {
                acc.fail("warm-up", &e);
            }
        }
        for _ in 0..runs {
            for (index, acc) in accs.iter_mut().enumerate() {
                let Some(addr) = acc.addr else { continue };
                let g = groups(&ssh);
                let before = snapshot(&g);
                match upload(addr, bytes).await {
                    Ok(t) => {
                        acc.upload.push(mib_s(bytes, t));
                        acc.transfer_bytes += bytes;
                    }
                    Err(e) => acc.fail("upload", &e),
                }
                acc.note_cost(&cost(&before, &g), index, true);
                let before = snapshot(&g);
                match download(addr, bytes).await {
                    Ok(t) => {
                        acc.download.push(mib_s(bytes, t));
                        acc.transfer_bytes += bytes;
                    }
                    Err(e) => acc.fail("download", &e),
                }
                acc.note_cost(&cost(&before, &g), index, true);
            }
        }
        let per_round =
            |total: usize, round: usize| total / runs + usize::from(round < total % runs);
        for round in 0..runs {
            for (index, acc) in accs.iter_mut().enumerate() {
                let Some(addr) = acc.addr else { continue };
                let g = groups(&ssh);
                let before = snapshot(&g);
                match round_trips(addr, per_round(options.round_trips, round)).await {
                    Ok(samples) => acc.round_trips.extend(samples),
                    Err(e) => acc.fail("round trips", &e),
                }
                let c = cost(&before, &g);
                if let Some(o) = c.others_cores {
                    acc.others_max = Some(acc.others_max.map_or(o, |m| m.max(o)));
                }
                let before = snapshot(&g);
                match setups(addr, per_round(options.setups, round)).await {
                    Ok(samples) => acc.setups.extend(samples),
                    Err(e) => acc.fail("setups", &e),
                }
                acc.note_cost(&cost(&before, &g), index, false);
            }
        }
    };
    let timed_out = tokio::time::timeout(Duration::from_secs(options.timeout), measure)
        .await
        .is_err();

    for (index, acc) in accs.into_iter().enumerate() {
        let p = &mut paths[index];
        if p.not_measured.is_some() {
            continue;
        }
        p.upload = Rate::from_runs(acc.upload);
        p.download = Rate::from_runs(acc.download);
        let mut rt = acc.round_trips;
        p.round_trip = (!rt.is_empty()).then(|| LatencySummary::from_samples(&mut rt));
        let mut st = acc.setups;
        p.setup = (!st.is_empty()).then(|| LatencySummary::from_samples(&mut st));
        if index != DIRECT {
            let total: Duration = acc.transfer_cpu.iter().map(|(_, d)| *d).sum();
            if acc.transfer_bytes > 0 && !total.is_zero() {
                let gib = acc.transfer_bytes as f64 / (1024.0 * 1024.0 * 1024.0);
                p.relay_cpu_s_per_gib = Some(total.as_secs_f64() / gib);
                p.relay_cpu_split = acc
                    .transfer_cpu
                    .iter()
                    .map(|(n, d)| (n.clone(), d.as_secs_f64() / total.as_secs_f64()))
                    .collect();
            }
            let n = p.setup.as_ref().map_or(0, |s| s.count);
            if n > 0 && !acc.setup_cpu.is_zero() {
                p.relay_cpu_us_per_setup = Some(acc.setup_cpu.as_secs_f64() * 1e6 / n as f64);
            }
        }
        p.others_cores_max = acc.others_max;
        p.errors = acc.errors;
        if timed_out {
            p.errors
                .push(format!("the run hit --timeout {} s", options.timeout));
        }
    }

    if let Ok(ssh) = ssh {
        ssh.stop().await;
    }
    rlark.stop().await;
    env.load_average_end = load_average();
    let mut report = PortForwardBenchReport {
        environment: env,
        paths,
        elapsed_secs: started.elapsed().as_secs_f64(),
        ..PortForwardBenchReport::default()
    };
    report.evaluate();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Proc dropped on an error path gets SIGTERM (an agent then stops its replicas),
    /// not only the kill on drop.
    #[tokio::test]
    async fn a_dropped_proc_is_asked_to_stop_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("terminated");
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!(
            "trap 'touch {}; exit 0' TERM; while true; do sleep 0.1; done",
            marker.display()
        ));
        let proc = Proc::spawn("sh", command, &dir.path().join("sh.log")).expect("spawn");
        // Let the shell set its trap.
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(proc);
        assert!(marker.exists(), "no SIGTERM before the kill");
    }

    #[test]
    fn a_missing_peer_is_named_with_its_package_and_the_flag_that_leaves_it_out() {
        let error = require_peers(
            "net",
            &[("sh", "dash"), ("rlark-no-such-tool", "nothing")],
            "--skip-ssh",
        )
        .expect_err("missing");
        let text = error.to_string();
        assert!(
            text.contains("needs `rlark-no-such-tool`, which is not installed")
                && text.contains("apt-get install nothing")
                && text.contains("--skip-ssh"),
            "{text}"
        );
        assert!(require_peers("net", &[("sh", "dash")], "--skip-ssh").is_ok());
    }

    fn latency(p50: f64, p99: f64) -> LatencySummary {
        LatencySummary {
            count: 100,
            p50_ms: p50,
            p99_ms: p99,
            max_ms: p99,
            mean_ms: p50,
        }
    }

    fn path(name: &str, upload: f64, download: f64, setup_p99: f64) -> PathFigures {
        PathFigures {
            name: name.into(),
            upload: Rate::from_runs(vec![upload, upload * 0.9, upload * 1.1]),
            download: Rate::from_runs(vec![download]),
            round_trip: Some(latency(0.05, 0.2)),
            setup: Some(latency(setup_p99 / 2.0, setup_p99)),
            relay_cpu_s_per_gib: Some(3.0),
            ..PathFigures::default()
        }
    }

    #[test]
    fn rate_median_and_range() {
        let r = Rate::from_runs(vec![3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((r.median_mib_s, r.min_mib_s, r.max_mib_s), (2.5, 1.0, 10.0));
        assert!(Rate::from_runs(Vec::new()).is_none());
    }

    #[test]
    fn targets_met_and_not_met() {
        let mut report = PortForwardBenchReport {
            paths: vec![
                path("direct TCP", 3000.0, 3000.0, 0.1),
                path("rlark port-forward", 600.0, 300.0, 1.5),
                path("OpenSSH relay", 300.0, 300.0, 0.5),
            ],
            ..PortForwardBenchReport::default()
        };
        report.evaluate();
        let pass: Vec<bool> = report.targets.iter().map(|t| t.pass).collect();
        assert_eq!(pass, [true, false, true]);
        assert_eq!(report.targets[0].measured, Some(2.0));
        let text = report.to_string();
        assert!(
            text.contains("[met] upload throughput vs OpenSSH relay"),
            "{text}"
        );
        assert!(text.contains("[NOT MET] download"), "{text}");
        assert!(text.contains("2.00x"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["paths"][1]["upload"]["median_mib_s"], 600.0);
    }

    #[test]
    fn a_missing_relay_is_not_measured_never_met() {
        let mut report = PortForwardBenchReport {
            paths: vec![
                path("direct TCP", 3000.0, 3000.0, 0.1),
                path("rlark port-forward", 600.0, 600.0, 1.0),
                PathFigures {
                    name: "OpenSSH relay".into(),
                    not_measured: Some("sshd not found".into()),
                    ..PathFigures::default()
                },
            ],
            ..PortForwardBenchReport::default()
        };
        report.evaluate();
        assert!(!report.targets[0].pass && report.targets[0].measured.is_none());
        assert_eq!(
            report.targets[0].note.as_deref(),
            Some("OpenSSH relay not measured: sshd not found")
        );
        assert!(report.targets[2].pass);
        assert!(report.to_string().contains("not measured: sshd not found"));
    }

    #[test]
    fn descendants_of_this_process_exclude_itself() {
        let me = std::process::id();
        assert!(!descendants(me).contains(&me));
    }
}
