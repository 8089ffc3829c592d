//! `rlark bench agent`: a server with its controllers in this process (`rlark_server::start`
//! as `rlark up` starts it, controllers without leader election) and a real agent as its
//! own process — this binary's `rlark agent`, joined with a bootstrap token from the
//! server's `/rlark/v1/tokens`, heartbeat 500 ms — on 127.0.0.1, so the agent's resources
//! are measured alone. Figures:
//!
//! - task start latency: `--tasks` Jobs of one raw task (`["true"]`), created in batches of
//!   `--batch` concurrent creates. Per task, from the moment a Task watch first sees its Task
//!   (the "Task created") to the moment a Pod watch sees its Pod `Running` (or already
//!   `Succeeded`): controllers' placement, the agent's watch, Pod creation, supervisor and
//!   process start, the `Running` status write. The same end measured from the start of the
//!   Job's create call is printed too (it adds the Job controller's Task creation). Measured
//!   client-side because `creationTimestamp` and `startTime` have 1 s resolution; with it,
//!   the API requests and store writes per short task (everyone's, from the server's
//!   `/metrics`): what a start costs the control plane;
//! - agent resources with `--running` Jobs of `["sleep","3600"]`, once all their Pods are
//!   `Running`: the agent process's RSS (`VmRSS`) and CPU over a 5 s window, and the
//!   replicas' supervisor processes (count, and the sum of their proportional set sizes —
//!   memory the agent's way of running tasks costs besides the agent itself).
//!
//! With `--agent-type docker` the agent runs `--agent-type Docker` and the tasks are
//! `docker` tasks of `--image` (which must be on the engine: nothing is pulled), `true` and
//! `sleep 3600` as above; beside the task start latency, the same run measures `docker run
//! -d --rm IMAGE true` (the engine's own create + start, from the CLI) `--docker-runs`
//! times in a row: what rlark adds to a container start; and `--batch` of those commands
//! at once, the engine's own figure for a burst the size of a batch of tasks (each from
//! the common start to its command's exit). There are no supervisor
//! processes then (the engine runs the containers).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::types::{Job, Node, Pod, PodPhase, Task};
use rlark_server::RunningServer;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::server::{admin_client, config_for};
use super::stats::{LatencySummary, children_cpu_time_of, cpu_time_of};

/// Target: p99 of task created → Pod running.
const START_P99_TARGET_MS: f64 = 300.0;
/// Target: the agent's RSS with the running tasks.
const AGENT_RSS_TARGET_MIB: f64 = 50.0;
/// Longest wait for one batch of Pods.
const BATCH_DEADLINE: Duration = Duration::from_secs(120);
/// CPU sampling window with the long-running tasks.
const CPU_WINDOW: Duration = Duration::from_secs(5);
/// The agent's node name.
const NODE: &str = "bench-node";
/// The agent's cluster.
const CLUSTER: &str = "a";
/// The namespace of [`CLUSTER`] (where its Node, Tasks and Pods are).
const NAMESPACE: &str = "rlark-a";
/// Longest wait for the agent's Node to appear, and for the Pods to be gone at the end.
const WAIT_DEADLINE: Duration = Duration::from_secs(60);
/// How often [`eventually`] checks.
const POLL: Duration = Duration::from_millis(100);
/// Life of the agent's bootstrap token (it joins at once).
const TOKEN_TTL_SECONDS: u64 = 600;

/// Options of `rlark bench agent`.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentBenchOptions {
    /// Short tasks (`["true"]`) whose start latency is measured.
    #[arg(long, default_value_t = 500)]
    pub tasks: usize,
    /// Long-running tasks (`["sleep","3600"]`) during the resource measurement.
    #[arg(long, default_value_t = 200)]
    pub running: usize,
    /// Jobs created concurrently per batch (the next batch starts once all of this one's
    /// Pods are running).
    #[arg(long, default_value_t = 50)]
    pub batch: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keep the agent's log in this file (its level: `RUST_LOG`, else `warn`), to see where
    /// a start spends its time (`RUST_LOG=rlark_agent=debug` logs every step of a replica).
    #[arg(long, value_name = "FILE")]
    pub agent_log: Option<std::path::PathBuf>,
    /// The runtime measured: raw (processes) or docker (containers of this machine's
    /// Docker engine).
    #[arg(long, value_enum, default_value_t = BenchRuntime::Raw)]
    pub agent_type: BenchRuntime,
    /// The image of the docker tasks (must be present on the engine; it needs `true` and
    /// `sleep`).
    #[arg(long, default_value = "rlark-test/busybox:1")]
    pub image: String,
    /// `docker run -d --rm IMAGE true` measured this many times beside (docker only).
    #[arg(long, default_value_t = 50)]
    pub docker_runs: usize,
    /// The agent's `--replica-isolation` (raw only): `false` measures the unisolated start
    /// path, to see what isolation costs beside the default.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub replica_isolation: bool,
}

/// `--agent-type` of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchRuntime {
    Raw,
    Docker,
}

/// Figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct AgentBenchReport {
    /// The runtime measured.
    pub agent_type: BenchRuntime,
    /// Whether the agent isolated its raw replicas (`--replica-isolation`).
    pub replica_isolation: bool,
    /// The filesystem of the agent's data directory (and of the baseline's replica
    /// directories): `fstype (source)`, and for ext4 whether it has a journal.
    pub data_filesystem: String,
    /// `docker run -d --rm IMAGE true` in the same run (docker only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_run: Option<LatencySummary>,
    /// `docker run -d --rm IMAGE true`, `batch` of them at once (docker only): the
    /// engine's own figure for a burst the size of a batch of tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docker_burst: Option<LatencySummary>,
    pub tasks: usize,
    pub batch: usize,
    /// Task seen by a watch → Pod seen `Running`/`Succeeded` by a watch.
    pub task_start: LatencySummary,
    /// Job create call started → Pod seen `Running`/`Succeeded`.
    pub job_start: LatencySummary,
    /// Task seen placed → Pod seen started: the agent's part of `task_start`.
    pub agent_start: LatencySummary,
    /// Short tasks whose Pod ended `Failed`.
    pub task_failures: usize,
    /// CPU of the agent process and of its reaped children (the replicas' supervisors and
    /// their processes) per short task, over the short-task phase (µs).
    pub agent_cpu_us_per_task: Option<f64>,
    /// The same supervisor and program started directly by the bench, `batch` at once,
    /// as many times as there are short tasks: the guard's baseline (raw runtime only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_start: Option<DirectStarts>,
    /// API requests the server answered per short task (everyone's: the bench's Job
    /// create, controllers, the agent), from its `/metrics`.
    pub api_requests_per_task: f64,
    /// Objects written to the store per short task.
    pub store_writes_per_task: f64,
    pub running: usize,
    /// Time until all `running` Pods were `Running`.
    pub running_ready_s: f64,
    /// Agent process RSS after startup, before any task.
    pub agent_idle_rss_mib: f64,
    /// Agent process RSS with the long-running tasks.
    pub agent_rss_mib: f64,
    /// Agent process CPU cores busy over the 5 s window with the long-running tasks.
    pub agent_cpu_cores: f64,
    /// Supervisor processes with the long-running tasks (one per replica).
    pub supervisors: usize,
    /// Sum of their proportional set sizes.
    pub supervisors_pss_mib: f64,
    /// The supervisor command the agent chose (`rlark-supervise` beside `rlark` when built,
    /// else `rlark supervise`): it changes start latency (docs/tasks.md).
    pub supervisor: String,
}

/// The baseline of the agent's guard ratio: the replica's process tree (supervisor and
/// program) started without the agent, the API and the store.
#[derive(Debug, Clone, Serialize)]
pub struct DirectStarts {
    /// The command started: the supervisor and its program.
    pub command: String,
    pub starts: usize,
    /// CPU of the supervisors and their programs per start (µs), read from the bench's
    /// reaped children.
    pub cpu_us_per_start: Option<f64>,
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets target" } else { "BELOW TARGET" }
}

impl std::fmt::Display for AgentBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rlark bench agent ({:?} runtime, replica isolation {}): {} short tasks (batches of {}), {} long-running tasks; server in this process, `rlark agent` as its own process (replica supervisor: `{}`), on 127.0.0.1",
            self.agent_type,
            if self.replica_isolation { "on" } else { "off" },
            self.tasks,
            self.batch,
            self.running,
            self.supervisor
        )?;
        writeln!(
            f,
            "data directories on {} (under {}){}",
            self.data_filesystem,
            std::env::temp_dir().display(),
            if self.data_filesystem.ends_with("without a journal") {
                "; there every file created scans the inodes deleted in the last minutes: \
                 CPU per start grows with earlier runs' churn (docs/benchmarks.md)"
            } else {
                ""
            }
        )?;
        writeln!(f)?;
        writeln!(f, "{:<48} {:>12}  target", "", "value")?;
        let s = &self.task_start;
        writeln!(
            f,
            "{:<48} {:>9.1} ms",
            "task start p50 (Task created -> Pod Running)", s.p50_ms
        )?;
        writeln!(
            f,
            "{:<48} {:>9.1} ms  p99 <= {START_P99_TARGET_MS} ms: {}",
            "task start p99",
            s.p99_ms,
            verdict(s.p99_ms <= START_P99_TARGET_MS && s.count > 0)
        )?;
        writeln!(f, "{:<48} {:>9.1} ms", "task start max", s.max_ms)?;
        if let Some(d) = &self.docker_run {
            writeln!(
                f,
                "{:<48} {:>9.1} ms / {:.1} ms",
                format!("`docker run -d` p50 / p99 ({} runs)", d.count),
                d.p50_ms,
                d.p99_ms
            )?;
        }
        if let Some(d) = &self.docker_burst {
            writeln!(
                f,
                "{:<48} {:>9.1} ms / {:.1} ms",
                format!("`docker run -d` p50 / p99 ({} at once)", d.count),
                d.p50_ms,
                d.p99_ms
            )?;
        }
        let j = &self.job_start;
        writeln!(
            f,
            "{:<48} {:>9.1} ms / {:.1} ms",
            "Job create -> Pod Running p50 / p99", j.p50_ms, j.p99_ms
        )?;
        let a = &self.agent_start;
        writeln!(
            f,
            "{:<48} {:>9.1} ms / {:.1} ms",
            "  of which Task placed -> Pod Running p50 / p99", a.p50_ms, a.p99_ms
        )?;
        writeln!(f, "{:<48} {:>12}", "short tasks failed", self.task_failures)?;
        if let Some(cpu) = self.agent_cpu_us_per_task {
            writeln!(
                f,
                "{:<48} {:>9.0} µs",
                "agent + supervisors + tasks CPU per short task", cpu
            )?;
        }
        if let Some(d) = &self.direct_start {
            writeln!(
                f,
                "{:<48} {:>12}",
                format!(
                    "  baseline: `{}` started directly, CPU per start",
                    d.command
                ),
                d.cpu_us_per_start
                    .map_or("n/a".to_string(), |cpu| format!("{cpu:.0} µs"))
            )?;
        }
        writeln!(
            f,
            "{:<48} {:>9.1} / {:.1}",
            "API requests / store writes per short task",
            self.api_requests_per_task,
            self.store_writes_per_task
        )?;
        writeln!(
            f,
            "{:<48} {:>10.2} s",
            format!("all {} long-running tasks Running after", self.running),
            self.running_ready_s
        )?;
        writeln!(
            f,
            "{:<48} {:>8.1} MiB",
            "agent RSS, idle", self.agent_idle_rss_mib
        )?;
        writeln!(
            f,
            "{:<48} {:>8.1} MiB  <= {AGENT_RSS_TARGET_MIB} MiB: {}",
            format!("agent RSS, {} tasks running", self.running),
            self.agent_rss_mib,
            verdict(self.agent_rss_mib <= AGENT_RSS_TARGET_MIB)
        )?;
        writeln!(
            f,
            "{:<48} {:>9.3}",
            "agent CPU cores busy, 5 s with tasks running", self.agent_cpu_cores
        )?;
        writeln!(
            f,
            "{:<48} {:>8.1} MiB",
            format!("{} replica supervisors, PSS sum", self.supervisors),
            self.supervisors_pss_mib
        )
    }
}

/// First time a watch saw each object (Pods: in a started phase, with the phase).
type Seen<T> = Arc<Mutex<HashMap<String, (Instant, T)>>>;

/// A `/proc/<pid>/status` or `smaps_rollup` figure in kB, as MiB.
fn proc_kib(pid: u32, file: &str, field: &str) -> anyhow::Result<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}"))?;
    let kib: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} in /proc/{pid}/{file}"))?;
    Ok(kib / 1024.0)
}

/// Children of `parent` (from `/proc/*/stat`).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn job(name: &str, entrypoint: &[&str], docker_image: Option<&str>) -> anyhow::Result<Job> {
    if let Some(image) = docker_image {
        return Ok(serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [{
                "name": "main",
                "agentType": "Docker",
                "role": "Actor",
                "docker": {"containers": [{
                    "name": "main",
                    "image": image,
                    "command": entrypoint,
                }]},
            }]},
        }))?);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "main",
            "agentType": "Raw",
            "role": "Actor",
            "raw": {"entrypoint": entrypoint, "replicas": 1},
        }]},
    }))?)
}

/// One started task: its Task was seen at, its Job create started at, its Pod reached phase
/// at.
struct Start {
    task_to_pod: Duration,
    /// Task seen placed → Pod started (the agent's part); `None` if the placement was not
    /// seen before the Pod (the watch may coalesce).
    placed_to_pod: Option<Duration>,
    job_to_pod: Duration,
    phase: PodPhase,
}

/// The watches the measurements read.
struct Watches {
    tasks: Seen<()>,
    /// First time each Task was seen with a placement (the controllers' part done).
    placed: Seen<()>,
    pods: Seen<PodPhase>,
    notify: Arc<Notify>,
}

/// Create Jobs `{prefix}-{i}` for `i` in `0..count`, `batch` at a time, each batch waiting
/// until all its Pods are seen started.
async fn create_in_batches(
    jobs: &Api<Job>,
    watches: &Watches,
    prefix: &str,
    count: usize,
    batch: usize,
    entrypoint: &'static [&'static str],
    docker_image: Option<&str>,
) -> anyhow::Result<Vec<Start>> {
    let mut out = Vec::with_capacity(count);
    let mut next = 0;
    while next < count {
        let end = (next + batch.max(1)).min(count);
        let mut creates = JoinSet::new();
        for i in next..end {
            let jobs = jobs.clone();
            let name = format!("{prefix}-{i}");
            let image = docker_image.map(str::to_string);
            creates.spawn(async move {
                let object = job(&name, entrypoint, image.as_deref())?;
                let started = Instant::now();
                jobs.create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("create job {name}"))?;
                anyhow::Ok((format!("{name}-main"), started))
            });
        }
        let mut pending = Vec::with_capacity(end - next);
        while let Some(result) = creates.join_next().await {
            pending.push(result??);
        }
        let deadline = tokio::time::Instant::now() + BATCH_DEADLINE;
        loop {
            let notified = watches.notify.notified();
            let missing = {
                let pods = watches.pods.lock().unwrap_or_else(PoisonError::into_inner);
                let tasks = watches.tasks.lock().unwrap_or_else(PoisonError::into_inner);
                pending
                    .iter()
                    .filter(|(task, _)| {
                        !pods.contains_key(&format!("{task}-0")) || !tasks.contains_key(task)
                    })
                    .count()
            };
            if missing == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                bail!(
                    "{missing} Pods of {prefix}-{next}..{end} not started after {BATCH_DEADLINE:?}"
                );
            }
        }
        let pods = watches.pods.lock().unwrap_or_else(PoisonError::into_inner);
        let tasks = watches.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let placed = watches
            .placed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (task, job_started) in &pending {
            let (pod_at, phase) = pods[&format!("{task}-0")];
            let (task_at, ()) = tasks[task];
            out.push(Start {
                task_to_pod: pod_at.saturating_duration_since(task_at),
                placed_to_pod: placed
                    .get(task)
                    .filter(|(at, ())| *at <= pod_at)
                    .map(|(at, ())| pod_at.saturating_duration_since(*at)),
                job_to_pod: pod_at.saturating_duration_since(*job_started),
                phase,
            });
        }
        next = end;
    }
    Ok(out)
}

/// CPU of process `pid` and of its reaped children.
fn agent_cpu_with_children(pid: &str) -> Option<Duration> {
    Some(cpu_time_of(pid)? + children_cpu_time_of(pid)?)
}

/// The replica supervisor the agent (the `rlark` binary beside this executable) starts:
/// `rlark-supervise` beside it, else `rlark supervise` (as
/// `rlark_agent::runtime::default_supervisor` chooses in the agent, which also checks that
/// `rlark-supervise` is of its own version).
fn agent_supervisor() -> anyhow::Result<Vec<std::ffi::OsString>> {
    let rlark = super::rlark_exe()?;
    let small = rlark.with_file_name(rlark_agent::runtime::SUPERVISE_BINARY);
    Ok(if small.is_file() {
        vec![small.into_os_string()]
    } else {
        vec![rlark.into_os_string(), "supervise".into()]
    })
}

/// Start the agent's replica supervisor with the short tasks' program `starts` times,
/// `batch` at once, as the agent would (each in a directory of its own) but without the
/// agent: the CPU of that process tree per start is the agent guard's baseline.
async fn direct_starts(starts: usize, batch: usize) -> anyhow::Result<DirectStarts> {
    let supervisor = agent_supervisor()?;
    let (program_path, supervisor_args) = supervisor
        .split_first()
        .context("no replica supervisor found beside the rlark binary")?;
    // The supervisor does not search PATH (the agent resolves the program first).
    let program = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .context("no `true` program in /usr/bin or /bin")?;
    let dir = tempfile::tempdir()?;
    let before = children_cpu_time_of("self");
    let mut next = 0;
    while next < starts {
        let end = (next + batch.max(1)).min(starts);
        let mut set = JoinSet::new();
        for i in next..end {
            let replica = dir.path().join(i.to_string());
            std::fs::create_dir(&replica)
                .with_context(|| format!("create {}", replica.display()))?;
            let mut command = tokio::process::Command::new(program_path);
            command
                .args(supervisor_args)
                .arg("--dir")
                .arg(&replica)
                .args(["--", program])
                .current_dir(&replica)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            set.spawn(async move {
                let status = command.status().await.context("start the supervisor")?;
                if !status.success() {
                    bail!("the supervisor of a direct start exited with {status}");
                }
                anyhow::Ok(())
            });
        }
        while let Some(result) = set.join_next().await {
            result??;
        }
        next = end;
    }
    let cpu_us_per_start = match (before, children_cpu_time_of("self")) {
        (Some(before), Some(after)) if starts > 0 => {
            Some(after.saturating_sub(before).as_secs_f64() * 1e6 / starts as f64)
        }
        _ => None,
    };
    let name = |p: &std::ffi::OsStr| {
        std::path::Path::new(p)
            .file_name()
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    Ok(DirectStarts {
        command: format!(
            "{} -- {program}",
            supervisor
                .iter()
                .map(|a| name(a))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        starts,
        cpu_us_per_start,
    })
}

/// Poll `check` until it returns `Ok(Some(value))`, at most [`WAIT_DEADLINE`]; the error
/// names `what` and the last error `check` returned.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + WAIT_DEADLINE;
    let mut last = String::new();
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {WAIT_DEADLINE:?} waiting for {what}; last error: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What `POST /rlark/v1/tokens` answers for a bootstrap token (the fields the join needs).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct BootstrapToken {
    token: String,
    ca_hash: String,
}

/// A bootstrap token for `cluster_id`, made by the admin through the server's token API
/// (`POST /rlark/v1/tokens`, as `rlark token create` and `rlark up` do).
async fn bootstrap_token(admin: &kube::Client, cluster_id: &str) -> anyhow::Result<BootstrapToken> {
    let body =
        json!({"kind": "bootstrap", "ttlSeconds": TOKEN_TTL_SECONDS, "clusterID": cluster_id});
    let request = http::Request::post("/rlark/v1/tokens")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(body.to_string().into_bytes())
        .context("build the token request")?;
    admin
        .request(request)
        .await
        .context("POST /rlark/v1/tokens")
}

/// The server with its controllers, in this process, on a temporary data directory
/// (returned: keep it until the server has stopped). Leader election is off: the one
/// in-process controller manager leads at once.
async fn start_server() -> anyhow::Result<(RunningServer, tempfile::TempDir)> {
    let dir = tempfile::Builder::new()
        .prefix("rlark-bench-agent-")
        .tempdir()
        .context("create the server's data directory")?;
    let mut config = config_for(dir.path());
    config.controllers.enabled = true;
    config.controllers.leader_election = false;
    Ok((super::server::start(config).await?, dir))
}

/// The agent as its own process: `rlark agent` of this binary.
struct AgentProcess {
    child: tokio::process::Child,
    pid: u32,
    _dir: tempfile::TempDir,
}

impl AgentProcess {
    async fn start(
        server: &RunningServer,
        admin: &kube::Client,
        log_path: Option<&std::path::Path>,
        runtime: BenchRuntime,
        replica_isolation: bool,
    ) -> anyhow::Result<AgentProcess> {
        let dir = tempfile::tempdir()?;
        let token = bootstrap_token(admin, CLUSTER).await?;
        let (log_path, level) = match log_path {
            Some(path) => (
                path.to_path_buf(),
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_string()),
            ),
            None => (dir.path().join("agent.log"), "warn".to_string()),
        };
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("create the agent log {}", log_path.display()))?;
        let mut command = tokio::process::Command::new(super::rlark_exe()?);
        command
            .args(["agent", "--server", &server.url(), "--cluster-id", CLUSTER])
            .arg("--data-dir")
            .arg(dir.path().join("agent"))
            .args(["--node-name", NODE, "--heartbeat-interval", "500ms"])
            .arg("--token")
            .arg(&token.token)
            .arg("--ca-hash")
            .arg(&token.ca_hash)
            .arg("--stop-tasks-on-exit")
            .arg(format!("--replica-isolation={replica_isolation}"))
            .args(match runtime {
                BenchRuntime::Raw => ["--agent-type", "Raw"],
                BenchRuntime::Docker => ["--agent-type", "Docker"],
            })
            .env("RUST_LOG", level)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = command.spawn().context("start `rlark agent`")?;
        let pid = child.id().context("agent pid")?;
        let mut agent = AgentProcess {
            child,
            pid,
            _dir: dir,
        };
        let nodes: Api<Node> = Api::namespaced(admin.clone(), NAMESPACE);
        let registered = eventually("the agent's Node", || async {
            Ok(nodes.get_opt(NODE).await?.map(|_| ()))
        })
        .await;
        if let Err(error) = registered {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let _ = agent.child.kill().await;
            bail!("{error:#}\nagent log:\n{log}");
        }
        Ok(agent)
    }

    fn rss_mib(&self) -> anyhow::Result<f64> {
        proc_kib(self.pid, "status", "VmRSS:")
    }

    /// The supervisors (children of the agent) and the sum of their PSS.
    fn supervisors(&self) -> (usize, f64) {
        let children = children_of(self.pid);
        let pss: f64 = children
            .iter()
            .filter_map(|pid| proc_kib(*pid, "smaps_rollup", "Pss:").ok())
            .sum();
        (children.len(), pss)
    }
}

/// Run the agent benchmark.
pub async fn run_agent(options: AgentBenchOptions) -> anyhow::Result<AgentBenchReport> {
    let (server, _server_dir) = start_server().await?;
    let admin = admin_client(&server.kubeconfig_path).await?;
    let result = async {
        let mut agent = AgentProcess::start(
            &server,
            &admin,
            options.agent_log.as_deref(),
            options.agent_type,
            options.replica_isolation,
        )
        .await?;
        let result = measure(&admin, &agent, &options).await;
        // The Jobs are deleted by `measure`; the agent stops what is left on exit
        // (`--stop-tasks-on-exit`), and kill_on_drop ends it should that hang.
        let _ = agent.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), agent.child.wait()).await;
        result
    }
    .await;
    let stopped = server.shutdown().await.context("shut the server down");
    let report = result?;
    stopped?;
    Ok(report)
}

/// A watch that records when each object is first seen (and for Pods, in a started phase).
async fn start_watches(
    admin: &kube::Client,
) -> anyhow::Result<(Watches, Vec<tokio::task::JoinHandle<()>>)> {
    let watches = Watches {
        tasks: Arc::default(),
        placed: Arc::default(),
        pods: Arc::default(),
        notify: Arc::new(Notify::new()),
    };
    let mut pod_events = watcher(
        Api::<Pod>::namespaced(admin.clone(), NAMESPACE),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let mut task_events = watcher(Api::<Task>::all(admin.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        match pod_events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(_) => {}
            None => bail!("pod watch ended before it synced"),
        }
    }
    loop {
        match task_events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(_) => {}
            None => bail!("task watch ended before it synced"),
        }
    }
    let pods_task = {
        let seen = watches.pods.clone();
        let notify = watches.notify.clone();
        tokio::spawn(async move {
            while let Some(event) = pod_events.next().await {
                let pod = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                    _ => continue,
                };
                let phase = pod.status.as_ref().and_then(|s| s.phase);
                let Some(phase @ (PodPhase::Running | PodPhase::Succeeded | PodPhase::Failed)) =
                    phase
                else {
                    continue;
                };
                let now = Instant::now();
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(pod.name_any())
                    .or_insert((now, phase));
                notify.notify_waiters();
            }
        })
    };
    let tasks_task = {
        let seen = watches.tasks.clone();
        let placed = watches.placed.clone();
        let notify = watches.notify.clone();
        tokio::spawn(async move {
            while let Some(event) = task_events.next().await {
                let task = match event {
                    Ok(watcher::Event::Apply(task) | watcher::Event::InitApply(task)) => task,
                    _ => continue,
                };
                let now = Instant::now();
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(task.name_any())
                    .or_insert((now, ()));
                if task.spec.placement.is_some() {
                    placed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(task.name_any())
                        .or_insert((now, ()));
                }
                notify.notify_waiters();
            }
        })
    };
    Ok((watches, vec![pods_task, tasks_task]))
}

/// The server's request and store-write counters (its `/metrics`).
struct ControlPlaneCounts {
    requests: f64,
    writes: f64,
}

impl ControlPlaneCounts {
    async fn read(admin: &kube::Client) -> anyhow::Result<ControlPlaneCounts> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = admin
            .request_text(request)
            .await
            .context("read the server's /metrics")?;
        let sum = |name: &str| -> f64 {
            text.lines()
                .filter(|line| {
                    line.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(['{', ' ']))
                })
                .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        Ok(ControlPlaneCounts {
            requests: sum("rlark_apiserver_requests_total"),
            writes: sum("rlark_store_writes_total"),
        })
    }

    /// Per-task increase since `before`.
    fn since(&self, before: &ControlPlaneCounts, tasks: usize) -> ControlPlaneCounts {
        let per = |now: f64, then: f64| (now - then) / tasks.max(1) as f64;
        ControlPlaneCounts {
            requests: per(self.requests, before.requests),
            writes: per(self.writes, before.writes),
        }
    }
}

async fn delete_jobs(jobs: &Api<Job>, prefix: &str, count: usize) {
    for i in 0..count {
        let _ = jobs
            .delete(&format!("{prefix}-{i}"), &DeleteParams::background())
            .await;
    }
}

/// Label on the bench's own `docker run` containers, so that whatever a failed or timed
/// out run left behind is removed ([`remove_bench_containers`]).
const BENCH_CONTAINER_LABEL: &str = "rlark.io/bench=docker-run";

/// One `docker run -d --rm IMAGE true`, bounded by [`BATCH_DEADLINE`]: from the command's
/// start to its exit (it returns once the container started).
async fn docker_run_once(image: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let out = tokio::time::timeout(
        BATCH_DEADLINE,
        tokio::process::Command::new("docker")
            .args(["run", "-d", "--rm", "--network", "host", "--label"])
            .arg(BENCH_CONTAINER_LABEL)
            .args([image, "true"])
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("docker run timed out")?
    .context("run `docker run`")?;
    if !out.status.success() {
        bail!(
            "docker run -d --rm {image} true: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(started.elapsed())
}

/// `docker run -d --rm IMAGE true`, `runs` times in a row.
async fn docker_runs(image: &str, runs: usize) -> anyhow::Result<LatencySummary> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        samples.push(docker_run_once(image).await?);
    }
    Ok(LatencySummary::from_samples(&mut samples))
}

/// `docker run -d --rm IMAGE true`, `count` at once (the engine's side of a batch of
/// `count` docker tasks): each sample from the common start to that command's exit. The
/// containers remove themselves (`--rm`, `true` exits at once); whatever a failed run left
/// is removed before returning.
async fn docker_burst(image: &str, count: usize) -> anyhow::Result<LatencySummary> {
    let mut runs = JoinSet::new();
    for _ in 0..count {
        let image = image.to_string();
        runs.spawn(async move { docker_run_once(&image).await });
    }
    let mut samples = Vec::with_capacity(count);
    let mut failure = None;
    while let Some(joined) = runs.join_next().await {
        match joined.context("a docker run task panicked").and_then(|r| r) {
            Ok(sample) => samples.push(sample),
            Err(error) => failure = failure.or(Some(error)),
        }
    }
    remove_bench_containers().await;
    match failure {
        Some(error) => Err(error.context(format!("{count} `docker run -d` at once"))),
        None => Ok(LatencySummary::from_samples(&mut samples)),
    }
}

/// Remove the bench's own containers ([`BENCH_CONTAINER_LABEL`]) that are still there;
/// best effort, bounded by [`WAIT_DEADLINE`].
async fn remove_bench_containers() {
    let listed = tokio::time::timeout(
        WAIT_DEADLINE,
        tokio::process::Command::new("docker")
            .args(["ps", "-aq", "--filter"])
            .arg(format!("label={BENCH_CONTAINER_LABEL}"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await;
    let Ok(Ok(out)) = listed else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return;
    }
    let removed = tokio::time::timeout(
        WAIT_DEADLINE,
        tokio::process::Command::new("docker")
            .args(["rm", "-f"])
            .args(&ids)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .status(),
    )
    .await;
    if !matches!(removed, Ok(Ok(status)) if status.success()) {
        tracing::warn!(containers = ?ids, "could not remove the bench's docker run containers");
    }
}

async fn measure(
    admin: &kube::Client,
    agent: &AgentProcess,
    options: &AgentBenchOptions,
) -> anyhow::Result<AgentBenchReport> {
    let jobs: Api<Job> = Api::all(admin.clone());
    let (watches, watch_tasks) = start_watches(admin).await?;
    let result = async {
        // Let startup settle, then the idle figure.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let agent_idle_rss_mib = agent.rss_mib()?;

        // 1. Start latency of short tasks.
        let counts_before = ControlPlaneCounts::read(admin).await?;
        let agent_pid = agent.pid.to_string();
        let agent_cpu_before = agent_cpu_with_children(&agent_pid);
        let image = (options.agent_type == BenchRuntime::Docker).then_some(options.image.as_str());
        let starts = create_in_batches(
            &jobs,
            &watches,
            "start",
            options.tasks,
            options.batch,
            &["true"],
            image,
        )
        .await?;
        let task_failures = starts
            .iter()
            .filter(|s| s.phase == PodPhase::Failed)
            .count();
        let mut latencies: Vec<Duration> = starts.iter().map(|s| s.task_to_pod).collect();
        let task_start = LatencySummary::from_samples(&mut latencies);
        let mut latencies: Vec<Duration> = starts.iter().map(|s| s.job_to_pod).collect();
        let job_start = LatencySummary::from_samples(&mut latencies);
        let mut latencies: Vec<Duration> = starts.iter().filter_map(|s| s.placed_to_pod).collect();
        let agent_start = LatencySummary::from_samples(&mut latencies);
        // The short tasks' last writes (Succeeded, Events) land just after they started.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counts = ControlPlaneCounts::read(admin)
            .await?
            .since(&counts_before, options.tasks);
        let agent_cpu_us_per_task = match (agent_cpu_before, agent_cpu_with_children(&agent_pid)) {
            (Some(before), Some(after)) if options.tasks > 0 => {
                Some(after.saturating_sub(before).as_secs_f64() * 1e6 / options.tasks as f64)
            }
            _ => None,
        };
        delete_jobs(&jobs, "start", options.tasks).await;
        let direct_start = match options.agent_type {
            BenchRuntime::Raw => Some(direct_starts(options.tasks, options.batch).await?),
            BenchRuntime::Docker => None,
        };
        let (docker_run, docker_burst) = match image {
            Some(image) => (
                Some(docker_runs(image, options.docker_runs).await?),
                Some(docker_burst(image, options.batch).await?),
            ),
            None => (None, None),
        };

        // 2. Resources with long-running tasks.
        let ready_clock = Instant::now();
        let running = create_in_batches(
            &jobs,
            &watches,
            "run",
            options.running,
            options.batch,
            &["sleep", "3600"],
            image,
        )
        .await?;
        let running_ready_s = ready_clock.elapsed().as_secs_f64();
        let not_running = running
            .iter()
            .filter(|s| s.phase != PodPhase::Running)
            .count();
        if not_running > 0 {
            bail!("{not_running} long-running tasks did not stay Running");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pid = agent.pid.to_string();
        let cpu_before = cpu_time_of(&pid).context("agent CPU time")?;
        let wall = Instant::now();
        tokio::time::sleep(CPU_WINDOW).await;
        let cpu_after = cpu_time_of(&pid).context("agent CPU time")?;
        let agent_cpu_cores =
            cpu_after.saturating_sub(cpu_before).as_secs_f64() / wall.elapsed().as_secs_f64();
        let agent_rss_mib = agent.rss_mib()?;
        let (supervisors, supervisors_pss_mib) = agent.supervisors();

        // Clean up: the agent stops the replicas of deleted Jobs.
        delete_jobs(&jobs, "run", options.running).await;
        let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
        let _ = eventually("the long-running Pods are gone", || async {
            Ok(pods
                .list(&Default::default())
                .await?
                .items
                .is_empty()
                .then_some(()))
        })
        .await;

        anyhow::Ok(AgentBenchReport {
            agent_type: options.agent_type,
            replica_isolation: options.replica_isolation,
            data_filesystem: super::filesystem::describe(&std::env::temp_dir()),
            docker_run,
            docker_burst,
            tasks: options.tasks,
            batch: options.batch,
            task_start,
            job_start,
            agent_start,
            task_failures,
            agent_cpu_us_per_task,
            direct_start,
            api_requests_per_task: counts.requests,
            store_writes_per_task: counts.writes,
            running: options.running,
            running_ready_s,
            agent_idle_rss_mib,
            agent_rss_mib,
            agent_cpu_cores,
            supervisors,
            supervisors_pss_mib,
            // The supervisor the agent (`rlark`, beside this executable) starts. Containers
            // have none: the engine runs them.
            supervisor: if options.agent_type == BenchRuntime::Docker {
                "none: the Docker engine runs the containers".to_string()
            } else {
                agent_supervisor()?
                    .iter()
                    .map(|a| {
                        std::path::Path::new(a)
                            .file_name()
                            .unwrap_or(a)
                            .to_string_lossy()
                            .into_owned()
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            },
        })
    }
    .await;
    for task in watch_tasks {
        task.abort();
    }
    result
}
