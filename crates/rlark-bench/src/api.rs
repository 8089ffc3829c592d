//! `rlark bench api`: throughput and latency of the API server on this machine.
//!
//! Phases, in order (each bounded by its count and by the overall `--timeout`):
//! 1. baselines without the server: loopback TCP echo, store-only creates;
//! 2. a fresh in-process server (`rlark_server::start`, `127.0.0.1:0`, temporary data dir);
//! 3. `GET /healthz` with 64 clients (TLS + HTTP without the store);
//! 4. creates at each concurrency level (default 1, 16, 64), one keep-alive connection per
//!    client;
//! 5. top-up to `--list-objects` Jobs, then `--lists` full lists;
//! 6. `--watchers` watches and a paced writer: delivery latency of every event.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use http::{Method, StatusCode};
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tokio::time::Instant as TokioInstant;

use super::baseline;
use super::client::{Reconnecting, Target, expect_status};
use super::micro;
use super::object::{self, JOBS_PATH, JOBS_RESOURCE, OBJECT_BYTES};
use super::report::{ApiBenchReport, Environment, ListFigures};
use super::stats::{LatencySummary, PhaseClock, Throughput, WorkerOutcome, ms};
use super::watch::{self, WatchPlan};

/// Concurrency of the baselines and of the top-up before the list phase.
const BASELINE_CONCURRENCY: usize = 64;
/// Iterations of each in-process create step timing.
const MICRO_ITERATIONS: usize = 2000;
/// Timeout of the graceful server shutdown at the end.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of `rlark bench api`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct ApiBenchOptions {
    /// Jobs created at each concurrency level.
    #[arg(long, default_value_t = 2000)]
    pub creates: usize,
    /// Concurrency levels of the create phase (comma-separated; one keep-alive connection
    /// per client).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 64])]
    pub concurrency: Vec<usize>,
    /// Jobs in the collection when it is listed (created ones plus a top-up).
    #[arg(long, default_value_t = 10_000)]
    pub list_objects: usize,
    /// Full lists timed.
    #[arg(long, default_value_t = 20)]
    pub lists: usize,
    /// Concurrent watchers (one connection each).
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Jobs created while the watchers watch.
    #[arg(long, default_value_t = 1000)]
    pub watch_events: usize,
    /// Pace of the creates during the watch phase, per second.
    #[arg(long, default_value_t = 200.0)]
    pub watch_rate: f64,
    /// Round trips of the loopback TCP echo baseline.
    #[arg(long, default_value_t = 100_000)]
    pub tcp_round_trips: usize,
    /// Requests of the `GET /healthz` baseline.
    #[arg(long, default_value_t = 20_000)]
    pub healthz_requests: usize,
    /// Creates of the store-only baseline.
    #[arg(long, default_value_t = 10_000)]
    pub store_creates: usize,
    /// Stop every phase after this many seconds in total (figures so far are reported).
    #[arg(long, value_name = "SECONDS", default_value_t = 900)]
    pub timeout: u64,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Data directory for the server and the store baseline, kept afterwards (default: a
    /// temporary directory, removed afterwards). Its filesystem decides the fsync cost.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Run the store baseline and the server on PostgreSQL (`postgres://...`, an empty
    /// database) instead of SQLite in the data directory. The
    /// baseline's objects are deleted again before the server starts. Not in the JSON report
    /// (it may hold a password); the store baseline's label names the backend.
    #[arg(long = "store", value_name = "URL")]
    #[serde(skip)]
    pub store: Option<String>,
}

impl Default for ApiBenchOptions {
    fn default() -> Self {
        Self {
            creates: 2000,
            concurrency: vec![1, 16, 64],
            list_objects: 10_000,
            lists: 20,
            watchers: 100,
            watch_events: 1000,
            watch_rate: 200.0,
            tcp_round_trips: 100_000,
            healthz_requests: 20_000,
            store_creates: 10_000,
            timeout: 900,
            json: false,
            data_dir: None,
            store: None,
        }
    }
}

impl ApiBenchOptions {
    fn validate(&self) -> anyhow::Result<()> {
        if self.concurrency.contains(&0) {
            bail!("--concurrency: levels must be at least 1");
        }
        if self.concurrency.iter().any(|&c| c > 4096) || self.watchers > 4096 {
            bail!("--concurrency and --watchers are limited to 4096 connections");
        }
        if !(self.watch_rate.is_finite() && self.watch_rate > 0.0) {
            bail!("--watch-rate must be a positive number");
        }
        if self.timeout == 0 {
            bail!("--timeout must be at least 1 second");
        }
        Ok(())
    }
}

/// The data directory: a temporary one (removed on drop) or the one given (kept).
struct Workspace {
    path: PathBuf,
    remove: bool,
}

impl Workspace {
    fn new(dir: Option<&Path>) -> anyhow::Result<Self> {
        match dir {
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let path = std::env::temp_dir()
                    .join(format!("rlark-bench-{}-{nanos:09}", std::process::id()));
                // `create_dir` (not `_all`): fails instead of reusing an existing directory.
                std::fs::create_dir(&path).with_context(|| {
                    format!("create temporary data directory {}", path.display())
                })?;
                Ok(Self { path, remove: true })
            }
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("create data directory {}", dir.display()))?;
                let path = dir
                    .canonicalize()
                    .with_context(|| format!("resolve data directory {}", dir.display()))?;
                for sub in ["server", "store-baseline"] {
                    if path.join(sub).exists() {
                        bail!(
                            "data directory {} holds a previous run ({sub}/); pass an empty \
                             directory",
                            path.display()
                        );
                    }
                }
                Ok(Self {
                    path,
                    remove: false,
                })
            }
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.remove
            && let Err(e) = std::fs::remove_dir_all(&self.path)
        {
            tracing::warn!(error = %e, dir = %self.path.display(), "could not remove data directory");
        }
    }
}

/// Filesystem type of `path` from `/proc/mounts` (longest matching mount point).
fn filesystem_of(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let path = path.canonicalize().ok()?;
    mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let _device = fields.next()?;
            let mount_point = fields.next()?.replace("\\040", " ");
            let fs_type = fields.next()?;
            path.starts_with(&mount_point)
                .then(|| (mount_point.len(), fs_type.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}

/// Run the benchmark. Failures of individual requests are counted in the report (and listed
/// in [`ApiBenchReport::errors`]); only failures to set the benchmark up are `Err`.
pub async fn run_api(options: ApiBenchOptions) -> anyhow::Result<ApiBenchReport> {
    options.validate()?;
    let started = Instant::now();
    let deadline = TokioInstant::now() + Duration::from_secs(options.timeout);
    let workspace = Workspace::new(options.data_dir.as_deref())?;
    let mut report = ApiBenchReport {
        environment: Environment {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .into(),
            data_dir: workspace.path().display().to_string(),
            filesystem: filesystem_of(workspace.path()),
            object_bytes: OBJECT_BYTES,
            resource_path: JOBS_PATH.into(),
        },
        ..ApiBenchReport::default()
    };

    report.create_steps = Some(micro::create_step_costs(MICRO_ITERATIONS));

    // Baselines that do not need the server, measured while nothing else runs.
    tracing::info!(round_trips = options.tcp_round_trips, "baseline: TCP echo");
    report.baselines.tcp_echo =
        Some(baseline::tcp_echo(BASELINE_CONCURRENCY, options.tcp_round_trips, deadline).await?);
    tracing::info!(
        creates = options.store_creates,
        "baseline: store-only creates"
    );
    let store_dir = workspace.path().join("store-baseline");
    let store = baseline::store_creates(
        &store_dir,
        options.store.as_deref(),
        BASELINE_CONCURRENCY,
        options.store_creates,
        JOBS_RESOURCE,
        |name| object::job(name, "store"),
        deadline,
    )
    .await?;
    report.baselines.store_creates = Some(store);
    if let Err(e) = std::fs::remove_dir_all(&store_dir) {
        tracing::warn!(error = %e, dir = %store_dir.display(), "could not remove store baseline");
    }

    // The server.
    let mut config = rlark_server::ServerConfig::new(workspace.path().join("server"));
    config.store_url = options.store.clone();
    config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    config.shutdown_grace = Duration::from_secs(2);
    let server = rlark_server::start(config)
        .await
        .context("start the server")?;
    tracing::info!(addr = %server.local_addr, "benchmark server started");
    let measured = match Target::from_kubeconfig(&server.kubeconfig_path, server.local_addr).await {
        Ok(target) => measure_server(&options, &target, deadline, &mut report).await,
        Err(e) => Err(e),
    };
    match tokio::time::timeout(SHUTDOWN_TIMEOUT, server.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report.errors.push(format!("server shutdown: {e}")),
        Err(_) => report.errors.push(format!(
            "server shutdown did not finish within {} s",
            SHUTDOWN_TIMEOUT.as_secs()
        )),
    }
    measured?;

    if TokioInstant::now() >= deadline {
        report.errors.push(format!(
            "overall deadline of {} s reached: later figures are partial",
            options.timeout
        ));
    }
    report.elapsed_secs = started.elapsed().as_secs_f64();
    report.evaluate();
    drop(workspace);
    Ok(report)
}

/// The phases that talk to the server. `Err` only when the server cannot be reached at all.
async fn measure_server(
    options: &ApiBenchOptions,
    target: &Target,
    deadline: TokioInstant,
    report: &mut ApiBenchReport,
) -> anyhow::Result<()> {
    let mut probe = Reconnecting::new(target.clone());
    tokio::time::timeout_at(deadline, probe.warm())
        .await
        .context("overall deadline reached")?
        .context("connect to the benchmark server")?;

    tracing::info!(
        requests = options.healthz_requests,
        "baseline: GET /healthz"
    );
    let healthz = run_pool(
        target,
        BASELINE_CONCURRENCY,
        Plan::get(
            "GET /healthz (HTTPS, no store)",
            "/healthz",
            options.healthz_requests,
        ),
        deadline,
    )
    .await;
    note_failures(report, &healthz);
    report.baselines.healthz = Some(healthz);

    let mut created = 0;
    for &concurrency in &options.concurrency {
        tracing::info!(concurrency, creates = options.creates, "creates");
        let phase = format!("create-{concurrency}");
        let plan = Plan::creates(
            "POST jobs",
            (0..options.creates).map(|i| format!("bench-c{concurrency}-{i:06}")),
            &phase,
        );
        let before = store_counters(&mut probe).await;
        let mut result = run_pool(target, concurrency, plan, deadline).await;
        let after = store_counters(&mut probe).await;
        result.writes_per_commit = writes_per_commit(before, after);
        note_failures(report, &result);
        created += result.ok;
        report.creates.push(result);
    }

    if options.lists > 0 {
        tracing::info!(
            objects = options.list_objects,
            lists = options.lists,
            "lists"
        );
        report.list = Some(list_phase(options, target, created, deadline, report).await);
    }

    if options.watchers > 0 && options.watch_events > 0 {
        tracing::info!(
            watchers = options.watchers,
            events = options.watch_events,
            rate = options.watch_rate,
            "watch"
        );
        let plan = WatchPlan {
            watchers: options.watchers,
            events: options.watch_events,
            rate: options.watch_rate,
        };
        match watch::run(target, &plan, deadline, &mut report.errors).await {
            Ok(figures) => report.watch = Some(figures),
            Err(e) => report.errors.push(format!("watch phase: {e:#}")),
        }
    }
    Ok(())
}

/// Top the collection up to `--list-objects`, then time `--lists` full lists.
async fn list_phase(
    options: &ApiBenchOptions,
    target: &Target,
    created: usize,
    deadline: TokioInstant,
    report: &mut ApiBenchReport,
) -> ListFigures {
    let mut figures = ListFigures::default();
    let missing = options.list_objects.saturating_sub(created);
    if missing > 0 {
        let plan = Plan::creates(
            "POST jobs (top-up)",
            (0..missing).map(|i| format!("bench-fill-{i:06}")),
            "fill",
        );
        let fill = run_pool(target, BASELINE_CONCURRENCY, plan, deadline).await;
        note_failures(report, &fill);
        figures.fill = Some(fill);
    }

    let mut conn = Reconnecting::new(target.clone());
    let mut outcome = WorkerOutcome::default();
    let mut clock = None;
    let mut heads = Vec::with_capacity(options.lists);
    let mut first_body = None;
    for i in 0..options.lists {
        if i == 0 {
            // Connect outside the timing.
            match tokio::time::timeout_at(deadline, conn.warm()).await {
                Ok(Ok(first)) => outcome.first_requests.push(first),
                Ok(Err(e)) => {
                    outcome.fail(format!("{e:#}"));
                    break;
                }
                Err(_) => {
                    outcome.fail("overall deadline reached");
                    break;
                }
            }
            clock = Some(PhaseClock::start());
        }
        let start = Instant::now();
        match tokio::time::timeout_at(deadline, conn.request(Method::GET, JOBS_PATH, None)).await {
            Ok(Ok(reply)) => {
                let elapsed = start.elapsed();
                match expect_status(&reply, StatusCode::OK) {
                    Ok(()) => {
                        outcome.latencies.push(elapsed);
                        heads.push(reply.head_at.saturating_duration_since(start));
                        if first_body.is_none() {
                            first_body = Some(reply.body);
                        }
                    }
                    Err(e) => outcome.fail(e),
                }
            }
            Ok(Err(e)) => outcome.fail(format!("{e:#}")),
            Err(_) => {
                outcome.fail("overall deadline reached");
                break;
            }
        }
    }
    outcome.connections = conn.opened;
    let times = clock.map(|c| c.stop()).unwrap_or_default();
    // Examine a response after the timing.
    if let Some(body) = first_body {
        figures.response_bytes = body.len();
        match count_items(&body) {
            Ok(n) => figures.items = n,
            Err(e) => outcome.fail(format!("{e:#}")),
        }
        figures.encode_ms = encode_time(&body).map(ms);
    }
    figures.head_latency = LatencySummary::from_samples(&mut heads);
    figures.lists = Throughput::from_parts("GET jobs (full list)", 1, outcome, times);
    note_failures(report, &figures.lists);
    if figures.items < options.list_objects && figures.lists.ok > 0 {
        report.errors.push(format!(
            "list: the collection held {} objects, not the {} requested",
            figures.items, options.list_objects
        ));
    }
    figures
}

/// Median of three `serde_json::to_vec` runs over `body` parsed into a JSON value: what
/// encoding the list costs without any IO. `None` if the body is not JSON.
fn encode_time(body: &[u8]) -> Option<Duration> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut runs: Vec<Duration> = (0..3)
        .map(|_| {
            let start = Instant::now();
            let encoded = serde_json::to_vec(&value);
            let elapsed = start.elapsed();
            drop(encoded);
            elapsed
        })
        .collect();
    runs.sort_unstable();
    runs.get(1).copied()
}

/// Number of `items` of a list response.
fn count_items(body: &[u8]) -> anyhow::Result<usize> {
    #[derive(Deserialize)]
    struct List {
        items: Vec<serde::de::IgnoredAny>,
    }
    let list: List = serde_json::from_slice(body).context("parse list response")?;
    Ok(list.items.len())
}

/// Record a phase's failures in the report's error list.
fn note_failures(report: &mut ApiBenchReport, t: &Throughput) {
    if t.failed > 0 {
        report.errors.push(format!(
            "{} ({} clients): {} of {} failed; first: {}",
            t.name,
            t.concurrency,
            t.failed,
            t.requests,
            t.first_error.as_deref().unwrap_or("-")
        ));
    }
}

/// `(commits, writes)` of the server's store, scraped from `/metrics`.
async fn store_counters(probe: &mut Reconnecting) -> Option<(u64, u64)> {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        probe.request(Method::GET, "/metrics", None),
    )
    .await
    .ok()?
    .ok()?;
    if reply.status != StatusCode::OK {
        return None;
    }
    let text = std::str::from_utf8(&reply.body).ok()?;
    let value = |name: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((
        value("rlark_store_commits_total")?,
        value("rlark_store_writes_total")?,
    ))
}

fn writes_per_commit(before: Option<(u64, u64)>, after: Option<(u64, u64)>) -> Option<f64> {
    let ((c0, w0), (c1, w1)) = (before?, after?);
    let commits = c1.checked_sub(c0).filter(|&c| c > 0)?;
    Some(w1.saturating_sub(w0) as f64 / commits as f64)
}

/// The requests of one closed-loop run.
struct Plan {
    name: String,
    method: Method,
    path: String,
    /// One body per request (creates), or `None` (bodiless requests, `count` of them).
    bodies: Option<Vec<Bytes>>,
    count: usize,
    expected: StatusCode,
}

impl Plan {
    fn get(name: &str, path: &str, count: usize) -> Self {
        Self {
            name: name.into(),
            method: Method::GET,
            path: path.into(),
            bodies: None,
            count,
            expected: StatusCode::OK,
        }
    }

    /// Creates of Jobs with the given names; bodies are built now, before any timing.
    fn creates(name: &str, names: impl Iterator<Item = String>, phase: &str) -> Self {
        let bodies: Vec<Bytes> = names
            .map(|n| Bytes::from(object::job_bytes(&n, phase)))
            .collect();
        Self {
            name: name.into(),
            method: Method::POST,
            path: JOBS_PATH.into(),
            count: bodies.len(),
            bodies: Some(bodies),
            expected: StatusCode::CREATED,
        }
    }
}

/// `concurrency` workers, each on its own keep-alive connection (opened before the clock
/// starts), share the `plan.count` requests; each waits for its response before sending the
/// next.
async fn run_pool(
    target: &Target,
    concurrency: usize,
    plan: Plan,
    deadline: TokioInstant,
) -> Throughput {
    let plan = Arc::new(plan);
    let next = Arc::new(AtomicUsize::new(0));
    let start_line = Arc::new(Barrier::new(concurrency + 1));
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let plan = Arc::clone(&plan);
        let next = Arc::clone(&next);
        let start_line = Arc::clone(&start_line);
        let mut conn = Reconnecting::new(target.clone());
        workers.spawn(async move {
            let mut outcome = WorkerOutcome::default();
            let warm = tokio::time::timeout_at(deadline, conn.warm()).await;
            start_line.wait().await;
            match warm {
                Ok(Ok(first)) => outcome.first_requests.push(first),
                Ok(Err(e)) => {
                    outcome.fail(format!("{e:#}"));
                    return outcome;
                }
                Err(_) => {
                    outcome.fail("overall deadline reached");
                    return outcome;
                }
            }
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= plan.count {
                    break;
                }
                let body = plan.bodies.as_ref().and_then(|b| b.get(i)).cloned();
                let start = Instant::now();
                let request = conn.request(plan.method.clone(), &plan.path, body);
                match tokio::time::timeout_at(deadline, request).await {
                    Ok(Ok(reply)) => match expect_status(&reply, plan.expected) {
                        Ok(()) => outcome.latencies.push(start.elapsed()),
                        Err(e) => outcome.fail(e),
                    },
                    Ok(Err(e)) => outcome.fail(format!("{e:#}")),
                    Err(_) => {
                        outcome.fail("overall deadline reached");
                        break;
                    }
                }
            }
            outcome.connections = conn.opened;
            outcome
        });
    }
    start_line.wait().await;
    let clock = PhaseClock::start();
    let outcome = baseline::join_outcomes(workers).await;
    let times = clock.stop();
    Throughput::from_parts(plan.name.clone(), concurrency, outcome, times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_size_from_counters() {
        assert_eq!(
            writes_per_commit(Some((10, 100)), Some((20, 300))),
            Some(20.0)
        );
        assert_eq!(writes_per_commit(Some((10, 100)), Some((10, 100))), None);
        assert_eq!(writes_per_commit(None, Some((10, 100))), None);
    }

    #[test]
    fn counts_list_items() {
        let body = br#"{"kind":"JobList","metadata":{},"items":[{"a":1},{"b":[2]}]}"#;
        assert_eq!(count_items(body).expect("count"), 2);
    }

    #[test]
    fn options_defaults_match_flags() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            options: ApiBenchOptions,
        }
        <Cli as clap::CommandFactory>::command().debug_assert();
        let parsed = Cli::parse_from(["bench"]).options;
        let default = ApiBenchOptions::default();
        assert_eq!(
            serde_json::to_value(&parsed).expect("json"),
            serde_json::to_value(&default).expect("json")
        );
        let parsed = Cli::parse_from(["bench", "--concurrency", "2,8", "--creates", "5"]).options;
        assert_eq!(parsed.concurrency, [2, 8]);
        assert_eq!(parsed.creates, 5);
        assert!(parsed.validate().is_ok());
        let bad = ApiBenchOptions {
            concurrency: vec![0],
            ..ApiBenchOptions::default()
        };
        assert!(bad.validate().is_err());
    }
}
