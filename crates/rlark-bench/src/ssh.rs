//! `rlark bench ssh`: the SSH endpoint beside OpenSSH's `sshd`, on 127.0.0.1, in one run.
//!
//! - rlark: a real `rlark server --ssh-listen` and `rlark agent` (the `rlark` binary beside this one, as child
//!   processes, temporary data directories), a Job whose raw task sleeps, and a key
//!   registered for the admin (`rlark ssh-key add`). `ssh TASK@127.0.0.1 true` runs `true`
//!   in the replica through the tunnel and the agent's exec; `ssh -N -L` forwards through
//!   the tunnel to a target the replica itself serves (`rlark-bench target`: the endpoint
//!   forwards only to ports a replica's own processes listen on).
//! - OpenSSH: `sshd` on loopback (throwaway host key, key authentication only): `ssh
//!   user@127.0.0.1 true`, and `ssh -N -L` to the same target.
//!
//! The same `ssh` client drives both. Figures: session setup (an `ssh ... true` process, from
//! spawn to exit) p50/p99, interleaved; `-L` throughput of `--mib` MiB each way over one
//! connection; the CPU of the server side per session and per GiB (rlark: server + agent and
//! what the agent ran; OpenSSH: sshd and its per-connection children). The guard divides
//! rlark's CPU per operation by sshd's. Figures are printed, never asserted. Without `sshd`
//! the bench fails (it has no baseline then).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use tokio::process::Command;

use super::guard::{GuardRatio, Guarded};
use super::port_forward::{
    Proc, descendants, download, find_tool, free_port, is_root, mib_s, spawn_agent, tool_output,
    upload, wait_path_ready,
};
use super::stats::{LatencySummary, children_cpu_time_of, cpu_time_of};

/// Longest wait for a child process or the task to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest wait for one `ssh` session.
const SESSION_TIMEOUT: Duration = Duration::from_secs(60);
/// The agent's cluster and namespace.
const CLUSTER: &str = "bench";
const NAMESPACE: &str = "rlark-bench";
/// The task the sessions go to.
const TASK: &str = "sshbench-main";

/// Options of `rlark bench ssh`.
#[derive(Debug, Clone, clap::Args)]
pub struct SshBenchOptions {
    /// Sessions (`ssh ... true`) timed per path.
    #[arg(long, default_value_t = 40)]
    pub sessions: usize,
    /// MiB per `-L` throughput measurement (one connection, each direction).
    #[arg(long, default_value_t = 64)]
    pub mib: usize,
    /// Give up after this many seconds (the whole run).
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One path's figures.
#[derive(Debug, Default, Serialize)]
pub struct SshPathFigures {
    /// Session setup, spawn of `ssh ... true` to its exit.
    pub session: Option<LatencySummary>,
    /// Server-side CPU per session, microseconds.
    pub session_cpu_us: Option<f64>,
    /// `-L` upload and download, MiB/s.
    pub upload_mib_s: Option<f64>,
    pub download_mib_s: Option<f64>,
    /// Server-side CPU per GiB forwarded, seconds.
    pub forward_cpu_s_per_gib: Option<f64>,
}

/// The report.
#[derive(Debug, Serialize)]
pub struct SshBenchReport {
    pub sessions: usize,
    pub mib: usize,
    pub openssh_version: String,
    pub build: &'static str,
    pub rlark: SshPathFigures,
    pub sshd: SshPathFigures,
}

impl Guarded for SshBenchReport {
    fn bench(&self) -> &'static str {
        "ssh"
    }

    fn ratios(&self) -> Vec<GuardRatio> {
        [
            GuardRatio::new(
                "session-setup",
                "µs/op",
                self.rlark.session_cpu_us,
                "sshd session",
                self.sshd.session_cpu_us,
            ),
            GuardRatio::new(
                "forward",
                "s/GiB",
                self.rlark.forward_cpu_s_per_gib,
                "sshd -L",
                self.sshd.forward_cpu_s_per_gib,
            ),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

fn figure(value: Option<f64>, unit: &str) -> String {
    value.map_or("-".into(), |v| format!("{v:.1} {unit}"))
}

impl std::fmt::Display for SshBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rlark bench ssh: {} sessions per path, -L {} MiB each way, {} build, {}",
            self.sessions, self.mib, self.build, self.openssh_version
        )?;
        writeln!(
            f,
            "  {:<8} {:>12} {:>12} {:>16} {:>12} {:>12} {:>16}",
            "PATH", "SETUP p50", "SETUP p99", "CPU/SESSION", "-L UP", "-L DOWN", "CPU/GiB"
        )?;
        for (name, p) in [("rlark", &self.rlark), ("sshd", &self.sshd)] {
            writeln!(
                f,
                "  {:<8} {:>12} {:>12} {:>16} {:>12} {:>12} {:>16}",
                name,
                figure(p.session.as_ref().map(|s| s.p50_ms), "ms"),
                figure(p.session.as_ref().map(|s| s.p99_ms), "ms"),
                figure(p.session_cpu_us, "µs"),
                figure(p.upload_mib_s, "MiB/s"),
                figure(p.download_mib_s, "MiB/s"),
                figure(p.forward_cpu_s_per_gib, "s"),
            )?;
        }
        Ok(())
    }
}

/// Server-side CPU of a set of processes: their own, their reaped children's and their
/// live descendants' (sshd's per-connection children, the commands an agent runs).
fn server_cpu(pids: &[u32]) -> Duration {
    pids.iter()
        .map(|pid| {
            let own = pid.to_string();
            let live: Duration = descendants(*pid)
                .into_iter()
                .map(|d| cpu_time_of(&d.to_string()).unwrap_or_default())
                .sum();
            cpu_time_of(&own).unwrap_or_default()
                + children_cpu_time_of(&own).unwrap_or_default()
                + live
        })
        .sum()
}

/// How a path is reached with `ssh`.
struct SshTarget {
    ssh: PathBuf,
    key: PathBuf,
    port: u16,
    login: String,
    /// The server-side processes whose CPU counts.
    pids: Vec<u32>,
}

impl SshTarget {
    fn command(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(&self.ssh);
        command
            .args(["-F", "/dev/null", "-i"])
            .arg(&self.key)
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "LogLevel=ERROR",
                "-p",
                &self.port.to_string(),
            ])
            .args(extra)
            .arg(format!("{}@127.0.0.1", self.login))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// One `ssh ... true`: its wall time.
    async fn session(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let out = tokio::time::timeout(SESSION_TIMEOUT, self.command(&[]).arg("true").output())
            .await
            .context("ssh session timed out")??;
        if !out.status.success() {
            bail!(
                "ssh {}@127.0.0.1 true: {}: {}",
                self.login,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(started.elapsed())
    }
}

async fn run_cli(exe: &Path, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        START_TIMEOUT,
        Command::new(exe)
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("rlark {args:?}: timed out"))??;
    if !out.status.success() {
        bail!(
            "rlark {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A field of the server's JSON log line with `message`.
async fn log_field(server: &mut Proc, message: &str, field: &str) -> anyhow::Result<String> {
    let until = Instant::now() + START_TIMEOUT;
    while Instant::now() < until {
        server.check_running()?;
        let text = std::fs::read_to_string(&server.log).unwrap_or_default();
        for line in text.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if value["fields"]["message"] == message
                && let Some(found) = value["fields"][field].as_str()
            {
                return Ok(found.to_string());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!(
        "rlark server logged no {message:?} within {START_TIMEOUT:?}\n{}",
        server.log_tail()
    )
}

struct Rlark {
    server: Proc,
    agent: Proc,
    path: SshTarget,
    _dir: tempfile::TempDir,
}

async fn start_rlark(ssh: &Path, keygen: &Path, target_port: u16) -> anyhow::Result<Rlark> {
    // `rlark server`, `rlark agent` and the CLI are the product binary; the replica is this
    // executable (`rlark-bench target`).
    let exe = super::rlark_exe()?;
    let bench_exe = super::bench_exe()?;
    let dir = tempfile::Builder::new()
        .prefix("rlark-bench-ssh-")
        .tempdir()?;
    let data = dir.path().join("server");
    let kubeconfig = data.join("admin.kubeconfig");
    let mut command = Command::new(&exe);
    command
        .args(["--log-format", "json", "server", "--listen", "127.0.0.1:0"])
        .args(["--ssh-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    let mut server = Proc::spawn("rlark server", command, &dir.path().join("server.log"))?;
    let url = log_field(&mut server, "listening", "url").await?;
    let ssh_addr: SocketAddr = log_field(&mut server, "SSH listening", "addr")
        .await?
        .parse()
        .context("the SSH address the server logged")?;
    let token = run_cli(
        &exe,
        &kubeconfig,
        &[
            "token",
            "create",
            "--cluster-id",
            CLUSTER,
            "--ttl",
            "10m",
            "-o",
            "json",
        ],
    )
    .await?;
    let token: serde_json::Value = serde_json::from_str(&token).context("token create output")?;
    let agent = spawn_agent(&exe, &url, CLUSTER, "bench-ssh", &token, dir.path())?;

    let job = dir.path().join("job.yaml");
    std::fs::write(
        &job,
        format!(
            "apiVersion: rlinf.io/v1alpha1\nkind: Job\nmetadata: {{name: sshbench}}\nspec:\n  \
             tasks:\n  - name: main\n    agentType: Raw\n    role: Actor\n    \
             raw: {{entrypoint: [{exe}, target, --port, '{target_port}']}}\n",
            exe = serde_json::to_string(&bench_exe.to_string_lossy())?,
        ),
    )?;
    let job_path = job.to_string_lossy().into_owned();
    run_cli(&exe, &kubeconfig, &["apply", "-f", &job_path]).await?;
    let key = dir.path().join("id_ed25519");
    let made = tool_output(
        keygen,
        &[
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "bench",
            "-f",
            &key.to_string_lossy(),
        ],
    )
    .await?;
    if !made.status.success() {
        bail!("ssh-keygen: {}", String::from_utf8_lossy(&made.stderr));
    }
    let public = dir.path().join("id_ed25519.pub");
    run_cli(
        &exe,
        &kubeconfig,
        &["ssh-key", "add", &public.to_string_lossy()],
    )
    .await?;
    let path = SshTarget {
        ssh: ssh.to_path_buf(),
        key,
        port: ssh_addr.port(),
        login: format!("{TASK}.0.{NAMESPACE}"),
        pids: vec![server.pid, agent.pid],
    };
    // The replica runs when a session gets through.
    let until = Instant::now() + START_TIMEOUT;
    loop {
        let last = match path.session().await {
            Ok(_) => break,
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() > until {
            bail!(
                "no SSH session into {TASK} within {START_TIMEOUT:?} (last: {last})\n{}\n{}",
                server.log_tail(),
                agent.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(Rlark {
        server,
        agent,
        path,
        _dir: dir,
    })
}

struct Sshd {
    sshd: Proc,
    path: SshTarget,
    _dir: tempfile::TempDir,
}

/// The path of `tool`, or an error naming the Debian package that has it: `rlark bench
/// ssh` needs its peer and says so before it starts anything.
fn require(tool: &str, package: &str) -> anyhow::Result<PathBuf> {
    find_tool(tool).with_context(|| {
        format!(
            "rlark bench ssh measures rlark beside OpenSSH and needs `{tool}`, which is not \
             installed: apt-get install {package}"
        )
    })
}

async fn start_sshd(ssh: &Path, keygen: &Path, sshd_bin: &Path) -> anyhow::Result<Sshd> {
    let dir = tempfile::Builder::new()
        .prefix("rlark-bench-sshd-")
        .tempdir()?;
    let path = |name: &str| dir.path().join(name);
    for key in ["host_key", "user_key"] {
        let out = tool_output(
            keygen,
            &[
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "bench",
                "-f",
                &path(key).to_string_lossy(),
            ],
        )
        .await?;
        if !out.status.success() {
            bail!("ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    std::fs::copy(path("user_key.pub"), path("authorized_keys"))?;
    let user = tool_output(Path::new("id"), &["-un"]).await?;
    let user = String::from_utf8_lossy(&user.stdout).trim().to_string();
    if is_root() && !Path::new("/run/sshd").exists() {
        let _ = std::fs::create_dir_all("/run/sshd");
    }
    let port = free_port()?;
    std::fs::write(
        path("sshd_config"),
        format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {host}\nPidFile none\n\
             AuthorizedKeysFile {auth}\nPubkeyAuthentication yes\nPasswordAuthentication no\n\
             KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n\
             AllowTcpForwarding yes\nX11Forwarding no\nPrintMotd no\nUseDNS no\nLogLevel ERROR\n",
            host = path("host_key").display(),
            auth = path("authorized_keys").display(),
        ),
    )?;
    let mut command = Command::new(sshd_bin);
    command
        .args(["-D", "-e", "-f"])
        .arg(path("sshd_config"))
        .stdout(Stdio::null());
    let mut sshd = Proc::spawn("sshd", command, &path("sshd.log"))?;
    let target = SshTarget {
        ssh: ssh.to_path_buf(),
        key: path("user_key"),
        port,
        login: user,
        pids: vec![sshd.pid],
    };
    let until = Instant::now() + START_TIMEOUT;
    loop {
        sshd.check_running()?;
        match target.session().await {
            Ok(_) => break,
            Err(error) if Instant::now() > until => {
                bail!(
                    "sshd: no session within {START_TIMEOUT:?}: {error:#}\n{}",
                    sshd.log_tail()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    Ok(Sshd {
        sshd,
        path: target,
        _dir: dir,
    })
}

/// `-L` through `path` to `target`: upload and download MiB/s, server CPU per GiB.
async fn forward(
    path: &SshTarget,
    target: SocketAddr,
    mib: usize,
    procs: &mut [&mut Proc],
) -> anyhow::Result<(f64, f64, Option<f64>)> {
    let local = free_port()?;
    let spec = format!("127.0.0.1:{local}:localhost:{}", target.port());
    let mut command = path.command(&["-N", "-o", "ExitOnForwardFailure=yes", "-L", &spec]);
    command.stderr(Stdio::null());
    let log = tempfile::NamedTempFile::new()?;
    let mut client = Proc::spawn("ssh -L", command, log.path())?;
    let local = SocketAddr::from(([127, 0, 0, 1], local));
    let mut all: Vec<&mut Proc> = procs.iter_mut().map(|p| &mut **p).collect();
    all.push(&mut client);
    wait_path_ready(local, &mut all).await?;
    let bytes = (mib as u64) << 20;
    let cpu_before = server_cpu(&path.pids);
    let up = upload(local, bytes).await?;
    let down = download(local, bytes).await?;
    let cpu = server_cpu(&path.pids).saturating_sub(cpu_before);
    client.stop().await;
    let gib = (2 * bytes) as f64 / f64::from(1u32 << 30);
    let per_gib = (cpu > Duration::ZERO).then(|| cpu.as_secs_f64() / gib);
    Ok((mib_s(bytes, up), mib_s(bytes, down), per_gib))
}

pub async fn run_ssh(options: SshBenchOptions) -> anyhow::Result<SshBenchReport> {
    let deadline = Duration::from_secs(options.timeout);
    tokio::time::timeout(deadline, run_inner(options))
        .await
        .with_context(|| format!("rlark bench ssh: not done within {deadline:?}"))?
}

async fn run_inner(options: SshBenchOptions) -> anyhow::Result<SshBenchReport> {
    // Every tool is looked up before anything starts: the bench measures rlark beside
    // OpenSSH's sshd, and one without the other is no figure.
    let ssh = require("ssh", "openssh-client")?;
    let keygen = require("ssh-keygen", "openssh-client")?;
    let sshd_bin = require("sshd", "openssh-server")?;
    let version = tool_output(&ssh, &["-V"]).await?;
    let openssh_version = String::from_utf8_lossy(&version.stderr).trim().to_string();
    // The target runs as the task's replica: the SSH endpoint forwards only to ports a
    // replica's own processes listen on. sshd forwards to the same one.
    let target = SocketAddr::from(([127, 0, 0, 1], free_port()?));
    let mut rlark = start_rlark(&ssh, &keygen, target.port()).await?;
    let mut sshd = start_sshd(&ssh, &keygen, &sshd_bin).await?;

    // Sessions, interleaved.
    let mut times = [Vec::new(), Vec::new()];
    let mut cpu = [Duration::ZERO, Duration::ZERO];
    for _ in 0..options.sessions.max(1) {
        for (i, path) in [&rlark.path, &sshd.path].into_iter().enumerate() {
            let before = server_cpu(&path.pids);
            times[i].push(path.session().await?);
            cpu[i] += server_cpu(&path.pids).saturating_sub(before);
        }
    }
    let per_session = |cpu: Duration, n: usize| {
        (cpu > Duration::ZERO).then(|| cpu.as_secs_f64() * 1e6 / n as f64)
    };
    let [mut rlark_times, mut sshd_times] = times;
    let mut report = SshBenchReport {
        sessions: rlark_times.len(),
        mib: options.mib,
        openssh_version,
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        rlark: SshPathFigures {
            session: Some(LatencySummary::from_samples(&mut rlark_times)),
            session_cpu_us: per_session(cpu[0], rlark_times.len()),
            ..Default::default()
        },
        sshd: SshPathFigures {
            session: Some(LatencySummary::from_samples(&mut sshd_times)),
            session_cpu_us: per_session(cpu[1], sshd_times.len()),
            ..Default::default()
        },
    };

    let (up, down, per_gib) = forward(
        &rlark.path,
        target,
        options.mib,
        &mut [&mut rlark.server, &mut rlark.agent],
    )
    .await?;
    report.rlark.upload_mib_s = Some(up);
    report.rlark.download_mib_s = Some(down);
    report.rlark.forward_cpu_s_per_gib = per_gib;
    let (up, down, per_gib) =
        forward(&sshd.path, target, options.mib, &mut [&mut sshd.sshd]).await?;
    report.sshd.upload_mib_s = Some(up);
    report.sshd.download_mib_s = Some(down);
    report.sshd.forward_cpu_s_per_gib = per_gib;

    sshd.sshd.stop().await;
    rlark.agent.stop().await;
    rlark.server.stop().await;
    Ok(report)
}
