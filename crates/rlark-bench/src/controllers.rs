//! `rlark bench controllers`: how fast the controllers turn declarations into placed and
//! finished work, on this machine.
//!
//! Phases, in order (everything in this process, network on 127.0.0.1 only):
//! 1. baseline, on a server without controllers (`rlark_server::start`, temporary data
//!    directory): raw creates of as many Task objects as the placement phase places,
//!    through the API with one kube client and 64 concurrent requests (every placed Task
//!    is one such create, so this bounds placement throughput), and the latency of one
//!    create issued after another;
//! 2. a second server on a fresh data directory with its controllers in-process, as
//!    `rlark server` runs them (leader election on), plus simulated agents
//!    (`rlark_sim::SimAgent`); a one-Task warm-up Job shows the controllers act;
//! 3. placement: `--jobs` Jobs × `--tasks-per-job` Tasks on the Nodes of a simulated
//!    cluster that only registers and heartbeats (it runs nothing, so only placement is
//!    measured), from the first create to the moment every Task exists with
//!    `spec.placement` (observed through a watch); the Jobs are then deleted;
//! 4. chain: a Workflow of `--chain` Jobs, each depending on the previous, one Task each,
//!    on a simulated cluster whose replicas succeed at once, from creation to `Succeeded`.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::types::{Job, Task, Workflow, WorkflowPhase};
use rlark_sim::{Behaviour, SimAgent, SimNode};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::time::Instant as TokioInstant;

use super::server::{admin_client, config_for};
use super::stats::PhaseClock;

/// The target: this many Tasks placed ...
pub const TARGET_TASKS: usize = 4000;
/// ... in under this long.
pub const TARGET_SECONDS: f64 = 10.0;
/// Concurrent requests of the raw-create baseline and of Job submission.
const CONCURRENCY: usize = 64;
/// Sequential creates timed for the one-create latency baseline.
const SEQUENTIAL_CREATES: usize = 200;
/// Namespace of the baseline's Task objects (no agent watches it).
const BASELINE_NAMESPACE: &str = "rlark-bench-baseline";
/// Cluster whose agent only registers Nodes (placement phase).
const PLACE_CLUSTER: &str = "bench-place";
/// Cluster whose agent runs replicas (chain phase).
const RUN_CLUSTER: &str = "bench-run";
/// Job name prefix of the placement phase.
const JOB_PREFIX: &str = "bench-";
/// Name of the chain Workflow.
const CHAIN_NAME: &str = "chain";
/// How long the clean-up between phases may take before the next phase starts anyway.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(120);

/// Options of `rlark bench controllers`.
#[derive(Clone, Debug, clap::Args, Serialize)]
pub struct ControllerBenchOptions {
    /// Jobs created in the placement phase.
    #[arg(long, default_value_t = 1000)]
    pub jobs: usize,
    /// Tasks (templates, one replica each) per Job.
    #[arg(long, default_value_t = 4)]
    pub tasks_per_job: usize,
    /// Depth of the Workflow chain (each Job depends on the previous one).
    #[arg(long, default_value_t = 100)]
    pub chain: usize,
    /// Nodes of the simulated cluster the placement phase places on.
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// Give up after this many seconds in total.
    #[arg(long, value_name = "SECONDS", default_value_t = 900)]
    pub timeout: u64,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Data directory of the server, kept afterwards (default: a temporary directory,
    /// removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
}

impl Default for ControllerBenchOptions {
    fn default() -> Self {
        Self {
            jobs: 1000,
            tasks_per_job: 4,
            chain: 100,
            nodes: 16,
            timeout: 900,
            json: false,
            data_dir: None,
        }
    }
}

impl ControllerBenchOptions {
    fn validate(&self) -> anyhow::Result<()> {
        if self.jobs == 0 || self.tasks_per_job == 0 || self.chain == 0 || self.nodes == 0 {
            bail!("--jobs, --tasks-per-job, --chain and --nodes must be at least 1");
        }
        if self.tasks_per_job > 64 {
            bail!("--tasks-per-job is limited to 64");
        }
        if self.chain > 999 {
            bail!("--chain is limited to 999 (template names have three digits)");
        }
        if self.timeout == 0 {
            bail!("--timeout must be at least 1 second");
        }
        Ok(())
    }
}

/// Where and how the benchmark ran.
#[derive(Clone, Debug, Serialize)]
pub struct BenchEnvironment {
    /// CPUs available to this process (server, controllers, agents and client share them).
    pub cpus: usize,
    /// `release` or `debug` (a debug build is several times slower).
    pub build: String,
    /// Data directory of the server.
    pub data_dir: String,
}

/// Raw API figures measured in the same run, before the controllers start.
#[derive(Clone, Debug, Serialize)]
pub struct CreateBaseline {
    /// Task objects created.
    pub creates: usize,
    /// Concurrent requests.
    pub concurrency: usize,
    /// Time for all of them.
    pub seconds: f64,
    /// Creates per second.
    pub creates_per_second: f64,
    /// Mean latency of one create when issued one after another.
    pub sequential_create_ms: f64,
    /// Process CPU (server, controllers, simulated agents and client: all in this process)
    /// per concurrent create, microseconds; `None` when `/proc` is unreadable.
    pub cpu_us_per_create: Option<f64>,
}

/// Placement phase figures.
#[derive(Clone, Debug, Serialize)]
pub struct PlacementFigures {
    /// Jobs created.
    pub jobs: usize,
    /// Tasks per Job.
    pub tasks_per_job: usize,
    /// Tasks placed (= jobs × tasks per job when complete).
    pub tasks_placed: usize,
    /// Nodes placed on.
    pub nodes: usize,
    /// Time to create every Job (`CONCURRENCY` concurrent requests).
    pub submit_seconds: f64,
    /// From the first Job create to the last Task seen placed.
    pub placed_seconds: f64,
    /// Tasks placed per second over `placed_seconds`.
    pub tasks_per_second: f64,
    /// Distinct Task names seen more than once as created (must be 0).
    pub duplicate_tasks: usize,
    /// Process CPU per Task placed, from the first Job create to the last Task placed
    /// (Job create, Task creates by the Job controller, placement, the watch), microseconds;
    /// `None` when `/proc` is unreadable.
    pub cpu_us_per_task_placed: Option<f64>,
}

/// Chain phase figures.
#[derive(Clone, Debug, Serialize)]
pub struct ChainFigures {
    /// Jobs in the chain.
    pub depth: usize,
    /// From the Workflow create to `Succeeded`.
    pub seconds: f64,
    /// `seconds / depth`: one step (Job created, Task placed, Pod reported, phases
    /// aggregated up to the Workflow).
    pub step_ms: f64,
}

/// The result of `rlark bench controllers`.
#[derive(Clone, Debug, Serialize)]
pub struct ControllerBenchReport {
    pub environment: BenchEnvironment,
    pub options: ControllerBenchOptions,
    pub baseline: CreateBaseline,
    pub placement: PlacementFigures,
    pub chain: ChainFigures,
    /// Target: [`TARGET_TASKS`] Tasks placed in under [`TARGET_SECONDS`].
    pub target_tasks: usize,
    pub target_seconds: f64,
    /// Whether the placement phase met the target (only meaningful when it placed at least
    /// [`TARGET_TASKS`]).
    pub target_met: Option<bool>,
    /// Things that make the figures less comparable (e.g. clean-up that timed out).
    pub notes: Vec<String>,
}

impl fmt::Display for ControllerBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.environment;
        let b = &self.baseline;
        let p = &self.placement;
        let c = &self.chain;
        writeln!(
            f,
            "rlark bench controllers — {} CPUs, {} build, data in {}",
            e.cpus, e.build, e.data_dir
        )?;
        writeln!(
            f,
            "(server, its in-process controllers, simulated agents and client share these CPUs)"
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "placement: {} Jobs × {} Tasks = {} Tasks on {} Nodes",
            p.jobs,
            p.tasks_per_job,
            p.jobs * p.tasks_per_job,
            p.nodes
        )?;
        writeln!(
            f,
            "  {:<46} {:>9.2} s",
            format!(
                "submit {} Jobs ({} concurrent creates)",
                p.jobs, CONCURRENCY
            ),
            p.submit_seconds
        )?;
        let verdict = match self.target_met {
            Some(true) => "met".to_string(),
            Some(false) => "NOT met".to_string(),
            None => format!("n/a (fewer than {} Tasks)", self.target_tasks),
        };
        writeln!(
            f,
            "  {:<46} {:>9.2} s  {:>8.0} Tasks/s   target {} in < {} s: {}",
            format!("creation → all {} Tasks placed", p.tasks_placed),
            p.placed_seconds,
            p.tasks_per_second,
            self.target_tasks,
            self.target_seconds,
            verdict
        )?;
        writeln!(
            f,
            "  {:<46} {:>9.2} s  {:>8.0} creates/s (bound: one create per placed Task)",
            format!(
                "baseline: {} raw Task creates, {} concurrent",
                b.creates, b.concurrency
            ),
            b.seconds,
            b.creates_per_second
        )?;
        if p.duplicate_tasks > 0 {
            writeln!(f, "  DUPLICATE Tasks seen: {}", p.duplicate_tasks)?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "workflow chain: {} Jobs, each depending on the previous, replicas succeed at once",
            c.depth
        )?;
        writeln!(
            f,
            "  {:<46} {:>9.2} s  {:>8.1} ms per step",
            "creation → Succeeded", c.seconds, c.step_ms
        )?;
        writeln!(
            f,
            "  {:<46} {:>9.2} ms",
            "baseline: one sequential Task create", b.sequential_create_ms
        )?;
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// The data directory: a temporary one (removed on drop) or the one given (kept).
struct DataDir {
    path: PathBuf,
    remove: bool,
}

impl DataDir {
    fn new(given: Option<&Path>) -> anyhow::Result<Self> {
        match given {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("create data directory {}", dir.display()))?;
                Ok(Self {
                    path: dir.to_path_buf(),
                    remove: false,
                })
            }
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                let path = std::env::temp_dir().join(format!(
                    "rlark-bench-controllers-{}-{nanos:09}",
                    std::process::id()
                ));
                std::fs::create_dir(&path)
                    .with_context(|| format!("create data directory {}", path.display()))?;
                Ok(Self { path, remove: true })
            }
        }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if self.remove
            && let Err(e) = std::fs::remove_dir_all(&self.path)
        {
            tracing::warn!(error = %e, dir = %self.path.display(), "could not remove data directory");
        }
    }
}

/// A server on `dir` listening on `127.0.0.1:0`, with or without its controllers.
async fn start_server(
    dir: PathBuf,
    controllers: bool,
) -> anyhow::Result<rlark_server::RunningServer> {
    let mut config = config_for(dir);
    config.controllers.enabled = controllers;
    super::server::start(config).await
}

/// Run the benchmark (see the module documentation).
pub async fn run_controllers(
    options: ControllerBenchOptions,
) -> anyhow::Result<ControllerBenchReport> {
    options.validate()?;
    let deadline = TokioInstant::now() + Duration::from_secs(options.timeout);
    let data_dir = DataDir::new(options.data_dir.as_deref())?;
    let mut notes = Vec::new();

    // 1. Baseline, on a server without controllers.
    let creates = options.jobs * options.tasks_per_job;
    let server = start_server(data_dir.path.join("baseline"), false).await?;
    let baseline = async {
        let client = admin_client(&server.kubeconfig_path).await?;
        within(deadline, "baseline", create_baseline(&client, creates)).await?
    }
    .await;
    server
        .shutdown()
        .await
        .context("shut the baseline server down")?;
    let baseline = baseline?;

    // 2.-4. The server with its controllers, and the simulated agents.
    let server = start_server(data_dir.path.join("server"), true).await?;
    let measured = measure(&options, &server.kubeconfig_path, deadline, &mut notes).await;
    let stopped = server.shutdown().await.context("shut the server down");
    let (placement, chain) = measured?;
    stopped?;

    let target_met = (placement.tasks_placed >= TARGET_TASKS)
        .then_some(placement.placed_seconds < TARGET_SECONDS);
    Ok(ControllerBenchReport {
        environment: BenchEnvironment {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
            .into(),
            data_dir: data_dir.path.display().to_string(),
        },
        options,
        baseline,
        placement,
        chain,
        target_tasks: TARGET_TASKS,
        target_seconds: TARGET_SECONDS,
        target_met,
        notes,
    })
}

async fn measure(
    options: &ControllerBenchOptions,
    kubeconfig: &Path,
    deadline: TokioInstant,
    notes: &mut Vec<String>,
) -> anyhow::Result<(PlacementFigures, ChainFigures)> {
    let client = admin_client(kubeconfig).await?;
    let mut placer = SimAgent::builder(PLACE_CLUSTER).run_tasks(false);
    for i in 0..options.nodes {
        placer = placer.node(
            SimNode::new(format!("place-{i:03}"))
                .resource("cpu", "256")
                .resource("memory", "1Ti"),
        );
    }
    let placer = placer.start(client.clone()).await?;
    let runner = SimAgent::builder(RUN_CLUSTER)
        .node(
            SimNode::new("run-0")
                .resource("cpu", "64")
                .resource("memory", "256Gi"),
        )
        .default_behaviour(Behaviour::succeed_after(Duration::ZERO))
        .start(client.clone())
        .await?;

    // The controllers have started, listed and act.
    within(deadline, "warm-up", warm_up(&client)).await??;

    // Placement.
    let placement = within(deadline, "placement", placement(&client, options)).await??;
    placer.stop().await?;
    if !within(
        deadline,
        "placement clean-up",
        delete_placement_jobs(&client),
    )
    .await??
    {
        notes.push("the placement phase's Tasks were not all gone before the chain phase".into());
    }

    // Chain.
    let chain = within(deadline, "chain", chain(&client, options.chain)).await??;
    runner.stop().await?;
    Ok((placement, chain))
}

/// `fut`, or an error naming `what` once `deadline` passed.
async fn within<T>(
    deadline: TokioInstant,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> anyhow::Result<T> {
    tokio::time::timeout_at(deadline, fut)
        .await
        .map_err(|_| anyhow::anyhow!("--timeout reached during the {what} phase"))
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn per_second(count: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        count as f64 / d.as_secs_f64()
    }
}

/// A placed Task object as an agent-less create (the baseline's unit of work).
fn baseline_task(name: &str) -> anyhow::Result<Task> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": BASELINE_NAMESPACE, "labels": {"bench": "baseline"}},
        "spec": {
            "agentType": "Raw",
            "role": "Actor",
            "nodeSelector": {"rlark.io/cluster-id": "baseline"},
            "raw": {"entrypoint": ["true"], "resources": {"requests": {"cpu": "10m"}}},
            "placement": {"clusterID": "baseline", "nodes": ["baseline-0"]},
        },
    }))?)
}

async fn create_baseline(client: &kube::Client, creates: usize) -> anyhow::Result<CreateBaseline> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(BASELINE_NAMESPACE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).context("create the baseline namespace"),
    }
    let api: Api<Task> = Api::namespaced(client.clone(), BASELINE_NAMESPACE);
    let objects = (0..creates)
        .map(|i| baseline_task(&format!("base-{i:05}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let clock = PhaseClock::start();
    futures::stream::iter(objects.iter())
        .map(|task| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), task).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("baseline create")?;
    let elapsed = started.elapsed();
    let cpu_us_per_create = cpu_per(&clock, creates);

    let sequential = (0..SEQUENTIAL_CREATES)
        .map(|i| baseline_task(&format!("seq-{i:05}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    for task in &sequential {
        api.create(&PostParams::default(), task)
            .await
            .context("sequential baseline create")?;
    }
    let sequential_elapsed = started.elapsed();
    Ok(CreateBaseline {
        creates,
        concurrency: CONCURRENCY,
        seconds: seconds(elapsed),
        creates_per_second: per_second(creates, elapsed),
        sequential_create_ms: sequential_elapsed.as_secs_f64() * 1000.0 / SEQUENTIAL_CREATES as f64,
        cpu_us_per_create,
    })
}

async fn delete_each<K>(api: &Api<K>, names: &[String]) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                match api.delete(name, &DeleteParams::background()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_for_each(|_| async { Ok(()) })
        .await
        .context("delete")?;
    Ok(())
}

async fn wait_until_empty<K>(api: &Api<K>, lp: &ListParams) -> anyhow::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + fmt::Debug,
{
    let until = TokioInstant::now() + CLEANUP_TIMEOUT;
    loop {
        if api.list(&lp.clone().limit(1)).await?.items.is_empty() {
            return Ok(true);
        }
        if TokioInstant::now() >= until {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn job_manifest(name: &str, cluster: &str, tasks: usize) -> anyhow::Result<Job> {
    let templates: Vec<Value> = (0..tasks)
        .map(|t| {
            json!({
                "name": format!("t{t}"),
                "head": t == 0,
                "agentType": "Raw",
                "role": "Actor",
                "nodeSelector": {"rlark.io/cluster-id": cluster},
                "raw": {
                    "entrypoint": ["python", "main.py"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                },
            })
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": templates},
    }))?)
}

fn is_placed(task: &Task) -> bool {
    task.spec
        .placement
        .as_ref()
        .is_some_and(|p| !p.nodes.is_empty())
}

/// One small Job placed and run end to end: the controllers are up and have synced.
async fn warm_up(client: &kube::Client) -> anyhow::Result<()> {
    let jobs: Api<Job> = Api::all(client.clone());
    jobs.create(
        &PostParams::default(),
        &job_manifest("warmup", RUN_CLUSTER, 1)?,
    )
    .await
    .context("create the warm-up Job")?;
    loop {
        let job = jobs.get("warmup").await?;
        let phase = job.status.and_then(|s| s.phase);
        if phase == Some(rlark_api::types::JobPhase::Succeeded) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn placement(
    client: &kube::Client,
    options: &ControllerBenchOptions,
) -> anyhow::Result<PlacementFigures> {
    let expected = options.jobs * options.tasks_per_job;
    let tasks: Api<Task> = Api::namespaced(
        client.clone(),
        &rlark_api::names::agent_namespace(PLACE_CLUSTER),
    );
    // Watch first, so no placement is missed; the clock starts once the watch is synced.
    let mut events = watcher(tasks, watcher::Config::default().labels("rlinf.io/job"))
        .default_backoff()
        .boxed();
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(_) => {}
            None => bail!("task watch ended before it synced"),
        }
    }

    let objects = (0..options.jobs)
        .map(|i| {
            job_manifest(
                &format!("{JOB_PREFIX}{i:05}"),
                PLACE_CLUSTER,
                options.tasks_per_job,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let jobs: Api<Job> = Api::all(client.clone());
    let started = Instant::now();
    let clock = PhaseClock::start();
    let submit = async {
        futures::stream::iter(objects.iter())
            .map(|job| {
                let jobs = jobs.clone();
                async move { jobs.create(&PostParams::default(), job).await }
            })
            .buffer_unordered(CONCURRENCY)
            .try_for_each(|_| async { Ok(()) })
            .await
            .context("create Jobs")?;
        anyhow::Ok(started.elapsed())
    };
    let observe = async {
        let mut placed: HashSet<String> = HashSet::with_capacity(expected);
        let mut uids: HashSet<String> = HashSet::with_capacity(expected);
        let mut duplicates = 0usize;
        while placed.len() < expected {
            let task = match events.next().await {
                Some(Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t))) => t,
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "task watch error (retrying)");
                    continue;
                }
                None => bail!("task watch ended"),
            };
            // A second object (another UID) under a name already placed is a duplicate.
            let uid = task.metadata.uid.clone().unwrap_or_default();
            if uids.insert(uid) && placed.contains(&task.name_any()) {
                duplicates += 1;
            }
            if is_placed(&task) {
                placed.insert(task.name_any());
            }
        }
        anyhow::Ok((started.elapsed(), placed.len(), duplicates))
    };
    let (submitted, (placed_in, placed, duplicates)) = tokio::try_join!(submit, observe)?;
    let cpu_us_per_task_placed = cpu_per(&clock, placed);
    Ok(PlacementFigures {
        jobs: options.jobs,
        tasks_per_job: options.tasks_per_job,
        tasks_placed: placed,
        nodes: options.nodes,
        submit_seconds: seconds(submitted),
        placed_seconds: seconds(placed_in),
        tasks_per_second: per_second(placed, placed_in),
        duplicate_tasks: duplicates,
        cpu_us_per_task_placed,
    })
}

/// This process's CPU since `clock` started, per operation of `count`, microseconds.
fn cpu_per(clock: &PhaseClock, count: usize) -> Option<f64> {
    let spent = clock.stop().cpu?;
    (count > 0).then(|| spent.as_secs_f64() * 1e6 / count as f64)
}

/// Delete the placement phase's Jobs (their Tasks follow by garbage collection) and wait
/// (bounded) until their Tasks are gone.
async fn delete_placement_jobs(client: &kube::Client) -> anyhow::Result<bool> {
    let jobs: Api<Job> = Api::all(client.clone());
    let names: Vec<String> = jobs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.starts_with(JOB_PREFIX))
        .collect();
    delete_each(&jobs, &names).await?;
    let tasks: Api<Task> = Api::namespaced(
        client.clone(),
        &rlark_api::names::agent_namespace(PLACE_CLUSTER),
    );
    wait_until_empty(&tasks, &ListParams::default()).await
}

fn chain_workflow(depth: usize) -> anyhow::Result<Workflow> {
    let templates: Vec<Value> = (0..depth)
        .map(|i| {
            let mut template = json!({
                "name": format!("s{i:03}"),
                "spec": {"tasks": [{
                    "name": "main",
                    "head": true,
                    "agentType": "Raw",
                    "role": "Actor",
                    "nodeSelector": {"rlark.io/cluster-id": RUN_CLUSTER},
                    "raw": {
                        "entrypoint": ["python", "step.py"],
                        "resources": {"requests": {"cpu": "100m"}},
                    },
                }]},
            });
            if i > 0 {
                template["dependencies"] = json!([format!("s{:03}", i - 1)]);
            }
            template
        })
        .collect();
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": CHAIN_NAME},
        "spec": {"jobTemplates": templates},
    }))?)
}

async fn chain(client: &kube::Client, depth: usize) -> anyhow::Result<ChainFigures> {
    let workflows: Api<Workflow> = Api::all(client.clone());
    let workflow = chain_workflow(depth)?;
    let started = Instant::now();
    workflows
        .create(&PostParams::default(), &workflow)
        .await
        .context("create the chain Workflow")?;
    loop {
        let phase = workflows
            .get(CHAIN_NAME)
            .await?
            .status
            .and_then(|s| s.phase);
        match phase {
            Some(WorkflowPhase::Succeeded) => break,
            Some(WorkflowPhase::Failed | WorkflowPhase::Stopped) => {
                bail!("the chain Workflow ended {phase:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    let elapsed = started.elapsed();
    Ok(ChainFigures {
        depth,
        seconds: seconds(elapsed),
        step_ms: elapsed.as_secs_f64() * 1000.0 / depth as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_are_valid_objects() {
        let job = job_manifest("bench-00001", PLACE_CLUSTER, 4).expect("job");
        assert_eq!(job.spec.tasks.len(), 4);
        assert!(job.spec.tasks[0].head && !job.spec.tasks[1].head);
        rlark_api::validation::validate_job(&job).expect("valid job");
        let wf = chain_workflow(3).expect("workflow");
        assert_eq!(wf.spec.job_templates[2].dependencies, ["s001"]);
        assert!(wf.spec.job_templates[0].dependencies.is_empty());
        let task = baseline_task("base-00000").expect("task");
        rlark_api::validation::validate_task(&task).expect("valid task");
    }

    #[test]
    fn report_prints_figures_next_to_the_target() {
        let report = ControllerBenchReport {
            environment: BenchEnvironment {
                cpus: 2,
                build: "debug".into(),
                data_dir: "/tmp/x".into(),
            },
            options: ControllerBenchOptions::default(),
            baseline: CreateBaseline {
                creates: 4000,
                concurrency: 64,
                seconds: 2.0,
                creates_per_second: 2000.0,
                sequential_create_ms: 1.5,
                cpu_us_per_create: Some(400.0),
            },
            placement: PlacementFigures {
                jobs: 1000,
                tasks_per_job: 4,
                tasks_placed: 4000,
                nodes: 16,
                submit_seconds: 1.0,
                placed_seconds: 5.0,
                tasks_per_second: 800.0,
                duplicate_tasks: 0,
                cpu_us_per_task_placed: Some(1200.0),
            },
            chain: ChainFigures {
                depth: 100,
                seconds: 10.0,
                step_ms: 100.0,
            },
            target_tasks: TARGET_TASKS,
            target_seconds: TARGET_SECONDS,
            target_met: Some(true),
            notes: vec![],
        };
        let text = report.to_string();
        assert!(text.contains("all 4000 Tasks placed"), "{text}");
        assert!(text.contains("target 4000 in < 10 s: met"), "{text}");
        assert!(text.contains("2000 creates/s"), "{text}");
        assert!(text.contains("100.0 ms per step"), "{text}");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["placement"]["tasks_placed"], 4000);
    }

    #[test]
    fn options_are_checked() {
        let mut o = ControllerBenchOptions::default();
        o.validate().expect("defaults are valid");
        o.jobs = 0;
        assert!(o.validate().is_err());
    }
}
