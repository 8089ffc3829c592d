//! `rlark bench agent`: a real in-process agent (`rlark_agent::start`) joined to a server
//! with its controllers, both in this process on 127.0.0.1
//! (`rlark_testkit::real_agent::Harness`). Figures:
//!
//! - task start latency: `--tasks` Jobs of one raw task (`["true"]`), created in batches of
//!   `--batch` concurrent creates; for each, the time from the start of its create call to
//!   a Pod watch seeing its Pod `Running` (or already `Succeeded`). Measured client-side
//!   because `creationTimestamp` and `startTime` have 1 s resolution;
//! - agent resources with `--running` Jobs of `["sleep","3600"]`, once all their Pods are
//!   `Running`: the process RSS, its delta from the idle server + agent (the agent's share:
//!   the server holds only a few hundred small objects more), and the process CPU over a
//!   5 s window (mostly the agent's heartbeats and reconcile).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::types::{Job, Pod, PodPhase};
use rlark_testkit::real_agent::{Harness, NAMESPACE};
use serde::Serialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::task::JoinSet;

use super::stats::{LatencySummary, process_cpu_time};

/// Target: p99 of task created → Pod running.
const START_P99_TARGET_MS: f64 = 300.0;
/// Target: the agent's RSS with the running tasks.
const AGENT_RSS_TARGET_MIB: f64 = 50.0;
/// Longest wait for one batch of Pods.
const BATCH_DEADLINE: Duration = Duration::from_secs(120);
/// CPU sampling window with the long-running tasks.
const CPU_WINDOW: Duration = Duration::from_secs(5);

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
}

/// Figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct AgentBenchReport {
    pub tasks: usize,
    pub batch: usize,
    /// Create call started → Pod seen `Running`/`Succeeded` by a watch.
    pub task_start: LatencySummary,
    /// Short tasks whose Pod ended `Failed`.
    pub task_failures: usize,
    pub running: usize,
    /// Time until all `running` Pods were `Running`.
    pub running_ready_s: f64,
    /// Process RSS (server + agent) after startup, before any task.
    pub idle_rss_mib: f64,
    /// Process RSS with the long-running tasks.
    pub running_rss_mib: f64,
    /// `running_rss_mib - idle_rss_mib`: the agent's share.
    pub agent_rss_delta_mib: f64,
    /// Process CPU cores busy over the 5 s window with the long-running tasks.
    pub running_cpu_cores: f64,
}

fn verdict(ok: bool) -> &'static str {
    if ok { "meets target" } else { "BELOW TARGET" }
}

impl std::fmt::Display for AgentBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "rlark bench agent: {} short tasks (batches of {}), {} long-running tasks; server + real agent in one process on 127.0.0.1",
            self.tasks, self.batch, self.running
        )?;
        writeln!(f)?;
        writeln!(f, "{:<44} {:>12}  target", "", "value")?;
        let s = &self.task_start;
        writeln!(
            f,
            "{:<44} {:>9.1} ms",
            "task start p50 (create -> Pod Running)", s.p50_ms
        )?;
        writeln!(
            f,
            "{:<44} {:>9.1} ms  p99 <= {START_P99_TARGET_MS} ms: {}",
            "task start p99",
            s.p99_ms,
            verdict(s.p99_ms <= START_P99_TARGET_MS && s.count > 0)
        )?;
        writeln!(f, "{:<44} {:>9.1} ms", "task start max", s.max_ms)?;
        writeln!(f, "{:<44} {:>12}", "short tasks failed", self.task_failures)?;
        writeln!(
            f,
            "{:<44} {:>10.2} s",
            format!("all {} long-running tasks Running after", self.running),
            self.running_ready_s
        )?;
        writeln!(
            f,
            "{:<44} {:>8.1} MiB",
            "process RSS, server + agent idle", self.idle_rss_mib
        )?;
        writeln!(
            f,
            "{:<44} {:>8.1} MiB",
            format!("process RSS, {} tasks running", self.running),
            self.running_rss_mib
        )?;
        writeln!(
            f,
            "{:<44} {:>8.1} MiB  <= {AGENT_RSS_TARGET_MIB} MiB: {}",
            "agent RSS share (delta from idle)",
            self.agent_rss_delta_mib,
            verdict(self.agent_rss_delta_mib <= AGENT_RSS_TARGET_MIB)
        )?;
        writeln!(
            f,
            "{:<44} {:>9.3}",
            "process CPU cores busy, 5 s with tasks running", self.running_cpu_cores
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "The agent runs in-process with the server: process RSS includes the server; the agent's share is the RSS delta from the idle process."
        )
    }
}

/// First time the watch saw each Pod in a started phase, and its phase then.
type Seen = Arc<Mutex<HashMap<String, (Instant, PodPhase)>>>;

/// Resident set size of this process, MiB, from `/proc/self/status`.
fn rss_mib() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmRSS in /proc/self/status")?;
    Ok(kib / 1024.0)
}

fn job(name: &str, entrypoint: &[&str]) -> anyhow::Result<Job> {
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

/// Create Jobs `{prefix}-{i}` for `i` in `range`, `batch` at a time, each batch waiting
/// until all its Pods are seen in one of `phases`; the latency of each (create call start →
/// seen).
async fn create_in_batches(
    jobs: &Api<Job>,
    seen: &Seen,
    notify: &Notify,
    prefix: &str,
    count: usize,
    batch: usize,
    entrypoint: &'static [&'static str],
) -> anyhow::Result<Vec<(Duration, PodPhase)>> {
    let mut out = Vec::with_capacity(count);
    let mut next = 0;
    while next < count {
        let end = (next + batch.max(1)).min(count);
        let mut creates = JoinSet::new();
        for i in next..end {
            let jobs = jobs.clone();
            let name = format!("{prefix}-{i}");
            creates.spawn(async move {
                let object = job(&name, entrypoint)?;
                let started = Instant::now();
                jobs.create(&PostParams::default(), &object)
                    .await
                    .with_context(|| format!("create job {name}"))?;
                anyhow::Ok((format!("{name}-main-0"), started))
            });
        }
        let mut pending = Vec::with_capacity(end - next);
        while let Some(result) = creates.join_next().await {
            pending.push(result??);
        }
        let deadline = tokio::time::Instant::now() + BATCH_DEADLINE;
        loop {
            let notified = notify.notified();
            let missing = {
                let seen = seen.lock().expect("seen lock");
                pending
                    .iter()
                    .filter(|(p, _)| !seen.contains_key(p))
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
        let seen = seen.lock().expect("seen lock");
        for (pod, started) in &pending {
            let (at, phase) = seen[pod];
            out.push((at.saturating_duration_since(*started), phase));
        }
        next = end;
    }
    Ok(out)
}

/// Run the agent benchmark.
pub async fn run_agent(options: AgentBenchOptions) -> anyhow::Result<AgentBenchReport> {
    let harness = Harness::start_with(rlark_agent::runtime::default_supervisor()).await?;
    let result = measure(&harness, &options).await;
    let stopped = harness.stop().await;
    let report = result?;
    stopped?;
    Ok(report)
}

async fn measure(
    harness: &Harness,
    options: &AgentBenchOptions,
) -> anyhow::Result<AgentBenchReport> {
    let admin = harness.admin.clone();
    let jobs: Api<Job> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);

    // The Pod watch: records the first time each Pod is seen Running/Succeeded/Failed.
    let seen: Seen = Arc::default();
    let notify = Arc::new(Notify::new());
    let mut events = watcher(pods, watcher::Config::default())
        .default_backoff()
        .boxed();
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(_) => {}
            None => bail!("pod watch ended before it synced"),
        }
    }
    let watch_task = {
        let seen = seen.clone();
        let notify = notify.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
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
                let mut seen = seen.lock().expect("seen lock");
                seen.entry(pod.name_any()).or_insert((now, phase));
                drop(seen);
                notify.notify_waiters();
            }
        })
    };

    let result = async {
        // Let startup settle, then the idle figure.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let idle_rss_mib = rss_mib()?;

        // 1. Start latency of short tasks.
        let starts = create_in_batches(
            &jobs,
            &seen,
            &notify,
            "start",
            options.tasks,
            options.batch,
            &["true"],
        )
        .await?;
        let task_failures = starts
            .iter()
            .filter(|(_, p)| *p == PodPhase::Failed)
            .count();
        let mut latencies: Vec<Duration> = starts.iter().map(|(d, _)| *d).collect();
        let task_start = LatencySummary::from_samples(&mut latencies);
        for i in 0..options.tasks {
            let _ = jobs
                .delete(&format!("start-{i}"), &DeleteParams::background())
                .await;
        }

        // 2. Resources with long-running tasks.
        let ready_clock = Instant::now();
        let running = create_in_batches(
            &jobs,
            &seen,
            &notify,
            "run",
            options.running,
            options.batch,
            &["sleep", "3600"],
        )
        .await?;
        let running_ready_s = ready_clock.elapsed().as_secs_f64();
        let not_running = running
            .iter()
            .filter(|(_, p)| *p != PodPhase::Running)
            .count();
        if not_running > 0 {
            bail!("{not_running} long-running tasks did not stay Running");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let cpu_before = process_cpu_time().context("process CPU time")?;
        let wall = Instant::now();
        tokio::time::sleep(CPU_WINDOW).await;
        let cpu_after = process_cpu_time().context("process CPU time")?;
        let running_cpu_cores =
            cpu_after.saturating_sub(cpu_before).as_secs_f64() / wall.elapsed().as_secs_f64();
        let running_rss_mib = rss_mib()?;

        // Clean up: stop the long-running jobs (the agent also stops its tasks on exit).
        for i in 0..options.running {
            let _ = jobs
                .delete(&format!("run-{i}"), &DeleteParams::background())
                .await;
        }

        anyhow::Ok(AgentBenchReport {
            tasks: options.tasks,
            batch: options.batch,
            task_start,
            task_failures,
            running: options.running,
            running_ready_s,
            idle_rss_mib,
            running_rss_mib,
            agent_rss_delta_mib: running_rss_mib - idle_rss_mib,
            running_cpu_cores,
        })
    }
    .await;
    watch_task.abort();
    result
}
