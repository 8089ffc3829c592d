//! `rlark up --demo`: apply the embedded `examples/demo/` manifests to the platform `up`
//! just started, follow the Workflow until it ends (Task phases, replica counts, reports as
//! they arrive), print a summary table and the learner's reward curve, and check that the
//! policy learned (docs/embodied.md, "The embodied RL demo").
//!
//! A Workflow `demo` left by an earlier run (same data directory) is deleted first, with
//! its Jobs and Tasks, so every run starts afresh. Task reports outlive their Task, so only
//! the reports of the current run (the Task's uid) are counted.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use rlark_api::labels;
use rlark_api::types::{Job, Node, Task, TaskPhase, Workflow, WorkflowPhase};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::ClientArgs;
use super::apply::place;
use super::client::Session;
use super::discovery::Catalog;
use super::manifest::{self, Manifest};
use super::table::align;

/// The demo's manifests, embedded so that `rlark up --demo` works from any directory.
const DEMO_MANIFESTS: [(&str, &str); 1] = [(
    "examples/demo/workflow.yaml",
    include_str!("../../../examples/demo/workflow.yaml"),
)];

/// The Python the demo's tasks import, embedded so that they run on a machine where none of
/// it is installed: the training SDK (`sdk/python/rlark`), the embodied SDK
/// (`sdk/python/rlark-embodied`) and the demo's programs (`examples/demo/rlark_demo`).
/// [`install_python`] writes them under the data directory and the tasks get that
/// directory on their `PYTHONPATH`. What they need beyond the standard library (numpy,
/// grpcio, protobuf) is found or made by [`super::demo_python::resolve`] before anything
/// starts.
const PYTHON_PACKAGES: [(&str, &str); 23] = [
    (
        "rlark/__init__.py",
        include_str!("../../../sdk/python/rlark/src/rlark/__init__.py"),
    ),
    (
        "rlark/_reporter.py",
        include_str!("../../../sdk/python/rlark/src/rlark/_reporter.py"),
    ),
    (
        "rlark/_task.py",
        include_str!("../../../sdk/python/rlark/src/rlark/_task.py"),
    ),
    ("rlark/py.typed", ""),
    (
        "rlark_embodied/__init__.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/__init__.py"),
    ),
    (
        "rlark_embodied/_enum.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_enum.py"),
    ),
    (
        "rlark_embodied/_transport.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_transport.py"),
    ),
    (
        "rlark_embodied/camera.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/camera.py"),
    ),
    (
        "rlark_embodied/errors.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/errors.py"),
    ),
    (
        "rlark_embodied/frame.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/frame.py"),
    ),
    ("rlark_embodied/py.typed", ""),
    (
        "rlark_embodied/robot.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/robot.py"),
    ),
    (
        "rlark_embodied/_gen/__init__.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/__init__.py"),
    ),
    (
        "rlark_embodied/_gen/camera_pb2.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/camera_pb2.py"),
    ),
    (
        "rlark_embodied/_gen/camera_pb2.pyi",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/camera_pb2.pyi"),
    ),
    (
        "rlark_embodied/_gen/camera_pb2_grpc.py",
        include_str!(
            "../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/camera_pb2_grpc.py"
        ),
    ),
    (
        "rlark_embodied/_gen/robot_pb2.py",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/robot_pb2.py"),
    ),
    (
        "rlark_embodied/_gen/robot_pb2.pyi",
        include_str!("../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/robot_pb2.pyi"),
    ),
    (
        "rlark_embodied/_gen/robot_pb2_grpc.py",
        include_str!(
            "../../../sdk/python/rlark-embodied/src/rlark_embodied/_gen/robot_pb2_grpc.py"
        ),
    ),
    (
        "rlark_demo/__init__.py",
        include_str!("../../../examples/demo/rlark_demo/__init__.py"),
    ),
    (
        "rlark_demo/cem.py",
        include_str!("../../../examples/demo/rlark_demo/cem.py"),
    ),
    (
        "rlark_demo/learner.py",
        include_str!("../../../examples/demo/rlark_demo/learner.py"),
    ),
    (
        "rlark_demo/rollout.py",
        include_str!("../../../examples/demo/rlark_demo/rollout.py"),
    ),
];

/// The Workflow the demo follows, unless `--demo-name` names another.
pub(crate) const WORKFLOW: &str = "demo";
/// The Domain its Job joins where the hosts have a pod network.
const DOMAIN: &str = "demo";
/// The task that learns, and the one whose replicas drive the arms.
const LEARNER_TASK: &str = "learner";
const ROLLOUT_TASK: &str = "rollout";
/// The Job template (of the Workflow) whose tasks learn and roll out.
const TRAIN_JOB: &str = "train";

/// The Task whose reports are the reward curve: `<workflow>-train-learner`.
fn learner(workflow: &str) -> String {
    format!("{workflow}-{TRAIN_JOB}-{LEARNER_TASK}")
}

/// How much the learner's mean return must rise from the first iteration to the last for
/// the demo to count as having learned (returns are minus radians of distance to the goal;
/// docs/embodied.md states this margin and why).
pub(crate) const LEARNING_MARGIN: f64 = 0.3;

/// How often the demo's state is read.
const POLL: Duration = Duration::from_millis(250);

/// At most one progress line per Task in this time when only its reports changed.
const REPORT_LINES_EVERY: Duration = Duration::from_secs(2);

/// How long the removal of an earlier run may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `--demo-network auto` waits for both Nodes to report their pod network.
const NETWORK_WAIT: Duration = Duration::from_secs(20);

/// How the rollouts reach the learner (`--demo-network`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DemoNetwork {
    /// The Domain where both local Nodes have a pod network (root, netfilter or TUN), else
    /// the host's loopback.
    Auto,
    /// The Domain `demo`: the rollouts reach the learner by name (`RLARK_HEAD_ADDRESS`).
    Domain,
    /// No Domain: the learner listens on the host's loopback, where the rollouts reach it
    /// (`rlark up`'s clusters share one host).
    Host,
}

/// What `rlark up --demo` was asked for.
#[derive(Clone, Debug)]
pub(crate) struct DemoOptions {
    /// How long the Workflow may take.
    pub timeout: Duration,
    /// How the rollouts reach the learner.
    pub network: DemoNetwork,
    /// The interpreter of the tasks, as [`super::demo_python::resolve`] returned it.
    pub python: PathBuf,
    /// The Workflow's name (`--demo-name`): a run replaces the earlier run of its name
    /// only, so runs of different names stay side by side (`rlark reports --compare`).
    pub name: String,
}

/// The network the demo runs on, once chosen.
#[derive(Clone, Debug, PartialEq)]
enum Network {
    Domain,
    /// The learner's loopback port.
    Host(u16),
}

/// The parsed embedded manifests.
fn manifests() -> anyhow::Result<Vec<Manifest>> {
    let mut all = Vec::new();
    for (source, text) in DEMO_MANIFESTS {
        all.extend(manifest::parse_documents(text, source)?);
    }
    Ok(all)
}

/// Run the demo against the server whose admin kubeconfig is `kubeconfig`: apply it, follow
/// it, print the summary and the reward curve. `Ok` when the Workflow succeeded and the
/// mean return rose by [`LEARNING_MARGIN`]; an error naming the failing Task, or the curve
/// that did not rise, otherwise, and when it did not end within the timeout or `shutdown`
/// was cancelled.
pub(crate) async fn run(
    kubeconfig: &Path,
    data_dir: &Path,
    options: &DemoOptions,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let args = ClientArgs {
        kubeconfig: Some(PathBuf::from(kubeconfig)),
        ..ClientArgs::default()
    };
    let session = Session::connect(&args).await?;
    let client = session.client.clone();
    let python_path = install_python(data_dir)?;
    let catalog = Catalog::discover(&client).await?;
    let workflow = options.name.as_str();
    let mut manifests = manifests()?;
    rename_workflow(&mut manifests, workflow);
    let jobs = job_names(&manifests, workflow);

    tokio::select! {
        result = remove_earlier_run(&client, workflow, &jobs) => result?,
        () = shutdown.cancelled() => bail!("interrupted"),
    }
    let network = tokio::select! {
        result = choose_network(&client, options.network) => result?,
        () = shutdown.cancelled() => bail!("interrupted"),
    };
    prepare(&mut manifests, &python_path, &options.python, &network);
    for manifest in &manifests {
        let (info, namespace, object) = place(
            &catalog,
            manifest,
            &session.namespace,
            session.namespace_explicit,
        )?;
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &info.ar),
            None => Api::all_with(client.clone(), &info.ar),
        };
        let body: DynamicObject = serde_json::from_value(object)
            .with_context(|| format!("{}: object is malformed", manifest.source))?;
        match api.create(&PostParams::default(), &body).await {
            Ok(_) => println!("{}/{} created", info.qualified_kind(), manifest.name()),
            // The Domain of an earlier run stays (it is not deleted with the Workflow).
            Err(kube::Error::Api(status)) if status.code == 409 && manifest.kind() == "Domain" => {
                println!("{}/{} unchanged", info.qualified_kind(), manifest.name())
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "create {} {}",
                    info.qualified_kind(),
                    manifest.name()
                )));
            }
        }
    }
    println!();
    tokio::select! {
        result = follow(&client, workflow, &jobs, options.timeout) => result,
        () = shutdown.cancelled() => bail!("interrupted before workflow {workflow} ended"),
    }
}

/// Pick the network: `--demo-network auto` reads the local Nodes' `status.network` (waiting
/// up to [`NETWORK_WAIT`] for the agents to report it) and takes the Domain when every Node
/// has a pod network. Prints the choice and why.
async fn choose_network(client: &kube::Client, wanted: DemoNetwork) -> anyhow::Result<Network> {
    let host = || -> anyhow::Result<Network> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .context("find a free loopback port for the learner")?
            .port();
        Ok(Network::Host(port))
    };
    match wanted {
        DemoNetwork::Domain => {
            println!("Network: the Domain {DOMAIN} (--demo-network domain)");
            return Ok(Network::Domain);
        }
        DemoNetwork::Host => {
            let network = host()?;
            println!("Network: the host's loopback (--demo-network host)");
            return Ok(network);
        }
        DemoNetwork::Auto => {}
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + NETWORK_WAIT;
    loop {
        let listed = nodes
            .list(&ListParams::default())
            .await
            .context("list nodes")?;
        let mut modes = BTreeMap::new();
        for node in &listed.items {
            let Some(cluster) = node.labels().get(labels::CLUSTER_ID) else {
                continue;
            };
            if cluster != "cloud" && cluster != "edge" {
                continue;
            }
            let network = node.status.as_ref().and_then(|s| s.network.clone());
            modes.insert(cluster.clone(), network);
        }
        let reported = modes.len() == 2 && modes.values().all(Option::is_some);
        if reported || Instant::now() >= deadline {
            let without: Vec<String> = ["cloud", "edge"]
                .iter()
                .filter_map(|cluster| match modes.get(*cluster).cloned().flatten() {
                    Some(n) if n.mode == "kernel" || n.mode == "tun" => None,
                    Some(n) => Some(format!(
                        "{cluster}: {}",
                        n.message.unwrap_or_else(|| format!("mode {}", n.mode))
                    )),
                    None => Some(format!("{cluster}: no pod network reported")),
                })
                .collect();
            if without.is_empty() {
                println!(
                    "Network: the Domain {DOMAIN} (both clusters have a pod network; the \
                     rollouts reach the learner by name)"
                );
                return Ok(Network::Domain);
            }
            let network = host()?;
            println!(
                "Network: the host's loopback, not the Domain {DOMAIN}: no pod network ({})",
                without.join("; ")
            );
            return Ok(network);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Where [`install_python`] writes, under the data directory.
pub(crate) const PYTHON_DIR: &str = "demo/python";

/// Write [`PYTHON_PACKAGES`] to `DATA_DIR/demo/python/` (replacing an earlier copy, which
/// may be of another version) and return that directory, absolute.
fn install_python(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let root =
        std::path::absolute(data_dir.join(PYTHON_DIR)).context("resolve the data directory")?;
    match std::fs::remove_dir_all(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove {}", root.display())),
    }
    for (file, text) in PYTHON_PACKAGES {
        let path = root.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(root)
}

/// Make the manifests run here: every raw task gets `python_path` first on its
/// `PYTHONPATH` and runs `python` for `python3`; on [`Network::Host`] the Domain goes, the
/// Job joins none, the learner listens on the loopback port and the rollouts dial it.
fn prepare(manifests: &mut Vec<Manifest>, python_path: &Path, python: &Path, network: &Network) {
    if matches!(network, Network::Host(_)) {
        manifests.retain(|m| m.kind() != "Domain");
    }
    for manifest in manifests.iter_mut() {
        // `pointer_mut`, not indexing: `value["key"]` on an object inserts a null under a
        // missing key, which the server then warns about (`unknown field
        // "spec.jobTemplates"` on the Domain).
        let Some(templates) = manifest
            .object
            .pointer_mut("/spec/jobTemplates")
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for template in templates {
            if matches!(network, Network::Host(_))
                && let Some(spec) = template["spec"].as_object_mut()
            {
                spec.remove("domain");
            }
            let Some(tasks) = template
                .pointer_mut("/spec/tasks")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for task in tasks {
                let name = task["name"].as_str().unwrap_or_default().to_string();
                let Some(raw) = task.get_mut("raw").and_then(Value::as_object_mut) else {
                    continue;
                };
                if let Some(entrypoint) = raw.get_mut("entrypoint").and_then(Value::as_array_mut)
                    && entrypoint.first().and_then(Value::as_str) == Some("python3")
                {
                    entrypoint[0] = Value::String(python.display().to_string());
                }
                let mut env = vec![("PYTHONPATH".to_string(), python_path.display().to_string())];
                if let Network::Host(port) = network {
                    match name.as_str() {
                        LEARNER_TASK => {
                            env.push(("DEMO_LEARNER_HOST".into(), "127.0.0.1".into()));
                            env.push(("DEMO_LEARNER_PORT".into(), port.to_string()));
                        }
                        ROLLOUT_TASK => env.push((
                            "DEMO_LEARNER_URL".into(),
                            format!("http://127.0.0.1:{port}"),
                        )),
                        _ => {}
                    }
                }
                let environment = raw
                    .entry("environment")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(list) = environment.as_array_mut() {
                    for (name, value) in env {
                        list.retain(|e| e["name"] != name.as_str());
                        list.push(serde_json::json!({"name": name, "value": value}));
                    }
                }
            }
        }
    }
}

/// Name the embedded Workflow `workflow` (its Jobs become `<workflow>-<template>`).
fn rename_workflow(manifests: &mut [Manifest], workflow: &str) {
    for manifest in manifests.iter_mut().filter(|m| m.kind() == "Workflow") {
        if let Some(name) = manifest.object.pointer_mut("/metadata/name") {
            *name = Value::String(workflow.to_string());
        }
    }
}

/// Names of the Jobs the demo Workflow creates: `<workflow>-<template>`.
fn job_names(manifests: &[Manifest], workflow: &str) -> Vec<String> {
    manifests
        .iter()
        .filter(|m| m.kind() == "Workflow" && m.name() == workflow)
        .flat_map(|m| {
            m.object["spec"]["jobTemplates"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|t| t["name"].as_str().map(|n| format!("{workflow}-{n}")))
        .collect()
}

/// Delete the Workflow `workflow` of an earlier run and wait until it, its Jobs and their
/// Tasks are gone.
async fn remove_earlier_run(
    client: &kube::Client,
    workflow: &str,
    jobs: &[String],
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::all(client.clone());
    if workflows
        .get_opt(workflow)
        .await
        .context("get the demo workflow")?
        .is_none()
    {
        return Ok(());
    }
    println!("Removing workflow {workflow} of an earlier run...");
    match workflows.delete(workflow, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(anyhow::Error::new(e).context("delete the earlier demo workflow")),
    }
    let deadline = Instant::now() + CLEANUP_TIMEOUT;
    loop {
        let workflow_left = workflows.get_opt(workflow).await?.is_some();
        let jobs_left = Api::<Job>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .any(|j| jobs.contains(&j.name_any()));
        let tasks_left = !demo_tasks(client, jobs).await?.is_empty();
        if !workflow_left && !jobs_left && !tasks_left {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the workflow {workflow} of an earlier run is still being deleted after {}s",
                CLEANUP_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The Tasks of the demo's Jobs, by name.
async fn demo_tasks(client: &kube::Client, jobs: &[String]) -> anyhow::Result<Vec<Task>> {
    let mut tasks: Vec<Task> = Api::<Task>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("list tasks")?
        .items
        .into_iter()
        .filter(|t| {
            t.labels()
                .get(labels::JOB)
                .is_some_and(|job| jobs.contains(job))
        })
        .collect();
    tasks.sort_by_key(|t| t.name_any());
    Ok(tasks)
}

/// What the demo shows of one Task.
#[derive(Clone, Debug, PartialEq)]
struct TaskView {
    name: String,
    role: String,
    cluster: String,
    nodes: String,
    phase: String,
    replicas: i32,
    running: i32,
    succeeded: i32,
    failed: i32,
    message: String,
    reports: usize,
    last_reward: Option<String>,
    /// The reward reports of this run: (step, value, best), in step order.
    rewards: Vec<CurvePoint>,
}

/// One reward report: the learner's mean return of an iteration (`step`) and the best.
#[derive(Clone, Debug, PartialEq)]
struct CurvePoint {
    step: i64,
    reward: f64,
    best: Option<f64>,
}

impl TaskView {
    /// Whether `self` and `other` differ in their reports only (then a progress line waits
    /// for [`REPORT_LINES_EVERY`]: 80 episode reports would otherwise be 80 lines).
    fn reports_only_differ(&self, other: &TaskView) -> bool {
        let strip = |v: &TaskView| TaskView {
            reports: 0,
            last_reward: None,
            rewards: Vec::new(),
            ..v.clone()
        };
        self != other && strip(self) == strip(other)
    }

    fn progress_line(&self) -> String {
        let mut line = format!(
            "task {} ({} on {}): {}, replicas {} running / {} succeeded / {} failed of {}, {} report{}",
            self.name,
            self.role,
            if self.cluster.is_empty() {
                "-"
            } else {
                &self.cluster
            },
            self.phase,
            self.running,
            self.succeeded,
            self.failed,
            self.replicas,
            self.reports,
            if self.reports == 1 { "" } else { "s" },
        );
        if let Some(reward) = &self.last_reward {
            line.push_str(&format!(", last reward {reward}"));
        }
        line
    }
}

/// Read one Task's view, with the reports of its current run.
async fn task_view(client: &kube::Client, task: &Task) -> anyhow::Result<TaskView> {
    let name = task.name_any();
    let namespace = task.namespace().unwrap_or_default();
    let uid = task.uid().unwrap_or_default();
    let status = task.status.clone().unwrap_or_default();
    let placement = task.spec.placement.clone().unwrap_or_default();
    let cluster = if placement.cluster_id.is_empty() {
        namespace
            .strip_prefix("rlark-")
            .unwrap_or_default()
            .to_string()
    } else {
        placement.cluster_id.clone()
    };
    let mut nodes: Vec<String> = if status.observed_nodes.is_empty() {
        placement.nodes.clone()
    } else {
        status.observed_nodes.clone()
    };
    nodes.sort();
    nodes.dedup();
    let request = http::Request::get(format!(
        "/rlark/v1/namespaces/{namespace}/tasks/{name}/reports"
    ))
    .body(Vec::new())?;
    let list: Value = client
        .request(request)
        .await
        .with_context(|| format!("list the reports of task {namespace}/{name}"))?;
    let reports: Vec<&Value> = list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter(|r| r["spec"]["taskUID"].as_str() == Some(uid.as_str()))
                .collect()
        })
        .unwrap_or_default();
    let mut rewards: Vec<CurvePoint> = reports
        .iter()
        .map(|r| &r["spec"]["report"])
        .filter(|e| e["type"] == "reward")
        .filter_map(|e| {
            Some(CurvePoint {
                step: e["step"].as_i64()?,
                reward: e["value"].as_f64()?,
                best: e["best"].as_f64(),
            })
        })
        .collect();
    rewards.sort_by_key(|p| p.step);
    let last_reward = reports
        .iter()
        .rev()
        .map(|r| &r["spec"]["report"])
        .find(|e| e["type"] == "reward")
        .map(|e| match &e["value"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    Ok(TaskView {
        name,
        role: task.spec.role.to_string(),
        cluster,
        nodes: nodes.join(","),
        phase: status
            .phase
            .map(|p| p.to_string())
            .unwrap_or_else(|| "Pending".to_string()),
        replicas: status.replicas.unwrap_or_else(|| task.spec.replicas()),
        running: status.ready_replicas.unwrap_or(0),
        succeeded: status.succeeded_replicas.unwrap_or(0),
        failed: status.failed_replicas.unwrap_or(0),
        message: status.message.unwrap_or_default(),
        reports: reports.len(),
        last_reward,
        rewards,
    })
}

/// Follow the Workflow until it ends or `timeout` passes, printing each change.
async fn follow(
    client: &kube::Client,
    name: &str,
    jobs: &[String],
    timeout: Duration,
) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::all(client.clone());
    let started = Instant::now();
    let mut shown_phase = String::new();
    let mut shown: BTreeMap<String, (TaskView, Instant)> = BTreeMap::new();
    let mut stdout = std::io::stdout();
    loop {
        let workflow = workflows
            .get(name)
            .await
            .with_context(|| format!("get workflow {name}"))?;
        let status = workflow.status.clone().unwrap_or_default();
        let phase = status.phase.unwrap_or(WorkflowPhase::Pending);
        let mut views = Vec::new();
        for task in demo_tasks(client, jobs).await? {
            views.push(task_view(client, &task).await?);
        }
        let elapsed = format!("[{:5.1}s]", started.elapsed().as_secs_f64());
        if phase.to_string() != shown_phase {
            shown_phase = phase.to_string();
            writeln!(stdout, "{elapsed} workflow {name}: {shown_phase}")?;
        }
        for view in &views {
            let due = match shown.get(&view.name) {
                None => true,
                Some((_, at)) if view.reports_only_differ(&shown[&view.name].0) => {
                    at.elapsed() >= REPORT_LINES_EVERY
                }
                Some((before, _)) => before != view,
            };
            if due {
                writeln!(stdout, "{elapsed} {}", view.progress_line())?;
                shown.insert(view.name.clone(), (view.clone(), Instant::now()));
            }
        }
        stdout.flush()?;
        let finished = matches!(
            phase,
            WorkflowPhase::Succeeded | WorkflowPhase::Failed | WorkflowPhase::Stopped
        );
        if finished {
            print_summary(name, &views, phase, started.elapsed());
            let learner = learner(name);
            let curve = views
                .iter()
                .find(|v| v.name == learner)
                .map(|v| v.rewards.as_slice())
                .unwrap_or_default();
            print_curve(&learner, curve);
            if phase == WorkflowPhase::Succeeded {
                return check_learning(curve);
            }
            bail!("{}", failure_message(name, phase, &status, &views));
        }
        if started.elapsed() >= timeout {
            print_summary(name, &views, phase, started.elapsed());
            let mut message = format!(
                "workflow {name} did not finish within {}s (phase {phase})",
                timeout.as_secs()
            );
            if let Some(detail) = task_problem(&views) {
                message.push_str(&format!("; {detail}"));
            }
            bail!("{message}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The first Task that failed or is stuck, with its message.
fn task_problem(views: &[TaskView]) -> Option<String> {
    views
        .iter()
        .find(|v| v.phase == TaskPhase::Failed.to_string() || v.failed > 0)
        .or_else(|| views.iter().find(|v| !v.message.is_empty()))
        .map(|v| {
            format!(
                "task {} {}: {}",
                v.name,
                v.phase,
                if v.message.is_empty() {
                    "no message"
                } else {
                    &v.message
                }
            )
        })
}

fn failure_message(
    workflow: &str,
    phase: WorkflowPhase,
    status: &rlark_api::types::WorkflowStatus,
    views: &[TaskView],
) -> String {
    let mut message = format!("workflow {workflow} {phase}");
    if let Some(detail) = task_problem(views) {
        message.push_str(&format!(": {detail}"));
    } else if let Some(job) = status.jobs.iter().find(|j| j.message.is_some()) {
        message.push_str(&format!(
            ": job template {}: {}",
            job.name,
            job.message.as_deref().unwrap_or_default()
        ));
    }
    message
}

fn print_summary(workflow: &str, views: &[TaskView], phase: WorkflowPhase, elapsed: Duration) {
    let mut lines = vec![
        [
            "TASK",
            "ROLE",
            "CLUSTER",
            "NODE",
            "PHASE",
            "REPLICAS",
            "REPORTS",
            "LAST REWARD",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
    ];
    for v in views {
        lines.push(vec![
            v.name.clone(),
            v.role.clone(),
            v.cluster.clone(),
            v.nodes.clone(),
            v.phase.clone(),
            format!("{}/{}", v.succeeded, v.replicas),
            v.reports.to_string(),
            v.last_reward.clone().unwrap_or_else(|| "-".to_string()),
        ]);
    }
    let replicas: i32 = views.iter().map(|v| v.replicas).sum();
    let succeeded: i32 = views.iter().map(|v| v.succeeded).sum();
    let reports: usize = views.iter().map(|v| v.reports).sum();
    println!();
    print!("{}", align(&lines));
    println!(
        "\nWorkflow {workflow} {phase} after {:.1}s: {succeeded}/{replicas} replicas Succeeded, \
         {reports} reports.",
        elapsed.as_secs_f64()
    );
    println!(
        "Reports: rlark reports task/NAME    Logs: rlark logs task/NAME    (with \
         KUBECONFIG set as above)"
    );
}

/// Print the learner's curve: one row per iteration, with a bar from the worst return.
fn print_curve(learner: &str, curve: &[CurvePoint]) {
    if curve.is_empty() {
        println!("\nNo reward curve: the learner reported no iteration.");
        return;
    }
    let low = curve.iter().map(|p| p.reward).fold(f64::INFINITY, f64::min);
    let high = curve
        .iter()
        .map(|p| p.reward)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut lines = vec![
        ["ITERATION", "MEAN RETURN", "BEST", ""]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    ];
    for point in curve {
        let width = if high > low {
            (1.0 + 39.0 * (point.reward - low) / (high - low)).round() as usize
        } else {
            40
        };
        lines.push(vec![
            point.step.to_string(),
            format!("{:+.3}", point.reward),
            point
                .best
                .map(|b| format!("{b:+.3}"))
                .unwrap_or_else(|| "-".to_string()),
            "#".repeat(width),
        ]);
    }
    println!(
        "\nReward curve (task {learner}: mean return of each iteration's episodes; minus the \
         arm's distance to the goal in radians, 0 is perfect):\n"
    );
    print!("{}", align(&lines));
}

/// `Ok` when the last iteration's mean return exceeds the first's by [`LEARNING_MARGIN`].
fn check_learning(curve: &[CurvePoint]) -> anyhow::Result<()> {
    let (Some(first), Some(last)) = (curve.first(), curve.last()) else {
        bail!("the learner reported no iteration: no reward curve to check");
    };
    if curve.len() < 2 {
        bail!("the learner reported one iteration only: no learning to check");
    }
    let gain = last.reward - first.reward;
    if gain < LEARNING_MARGIN {
        bail!(
            "the policy did not learn: the mean return went from {:+.3} (iteration {}) to \
             {:+.3} (iteration {}), {gain:+.3}, less than the margin {LEARNING_MARGIN}",
            first.reward,
            first.step,
            last.reward,
            last.step
        );
    }
    println!(
        "\nLearned: the mean return rose from {:+.3} to {:+.3} ({gain:+.3}; the demo asks for \
         at least +{LEARNING_MARGIN}).",
        first.reward, last.reward
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workflow(manifests: &[Manifest]) -> Workflow {
        let object = &manifests
            .iter()
            .find(|m| m.kind() == "Workflow")
            .expect("a Workflow")
            .object;
        serde_json::from_value(object.clone()).expect("a Workflow")
    }

    #[test]
    fn embedded_manifests_parse_and_pin_the_tasks_to_the_up_clusters() {
        let manifests = manifests().expect("parse the demo");
        assert_eq!(job_names(&manifests, WORKFLOW), ["demo-train"]);
        let kinds: Vec<&str> = manifests.iter().map(|m| m.kind()).collect();
        assert_eq!(kinds, ["Domain", "Workflow"]);
        let workflow = workflow(&manifests);
        let job = &workflow.spec.job_templates[0].spec;
        assert_eq!(job.domain.as_deref(), Some(DOMAIN));
        let pinned: Vec<(String, String, i32)> = job
            .tasks
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.spec.node_selector[labels::CLUSTER_ID].clone(),
                    t.spec.replicas(),
                )
            })
            .collect();
        assert_eq!(
            pinned,
            [
                (LEARNER_TASK.to_string(), "cloud".to_string(), 1),
                (ROLLOUT_TASK.to_string(), "edge".to_string(), 2)
            ]
        );
        assert_eq!(learner(WORKFLOW), "demo-train-learner");
        assert_eq!(job.tasks[0].name, LEARNER_TASK);
        assert_eq!(workflow.spec.job_templates[0].name, TRAIN_JOB);
        // Another name: its own Workflow, Jobs and learner.
        let mut renamed = manifests.clone();
        rename_workflow(&mut renamed, "demo-b");
        assert_eq!(job_names(&renamed, "demo-b"), ["demo-b-train"]);
        assert_eq!(job_names(&renamed, WORKFLOW), Vec::<String>::new());
        assert_eq!(learner("demo-b"), "demo-b-train-learner");
    }

    /// Every file of the packages on disk is embedded, and nothing else.
    #[test]
    fn the_embedded_python_is_the_whole_of_each_package() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let packages = [
            ("rlark", root.join("sdk/python/rlark/src/rlark")),
            (
                "rlark_embodied",
                root.join("sdk/python/rlark-embodied/src/rlark_embodied"),
            ),
            ("rlark_demo", root.join("examples/demo/rlark_demo")),
        ];
        let mut on_disk = Vec::new();
        for (name, dir) in packages {
            let mut stack = vec![(dir, name.to_string())];
            while let Some((dir, prefix)) = stack.pop() {
                for entry in std::fs::read_dir(&dir).expect("read a package") {
                    let entry = entry.expect("entry");
                    let file = entry.file_name().to_string_lossy().into_owned();
                    if entry.file_type().expect("type").is_dir() {
                        if file != "__pycache__" {
                            stack.push((entry.path(), format!("{prefix}/{file}")));
                        }
                    } else if file.ends_with(".py") || file.ends_with(".pyi") || file == "py.typed"
                    {
                        let text = std::fs::read_to_string(entry.path()).expect("read");
                        on_disk.push((format!("{prefix}/{file}"), text));
                    }
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<(String, String)> = PYTHON_PACKAGES
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect();
        embedded.sort();
        let names = |files: &[(String, String)]| -> Vec<String> {
            files.iter().map(|(f, _)| f.clone()).collect()
        };
        assert_eq!(names(&embedded), names(&on_disk), "update PYTHON_PACKAGES");
        assert!(embedded == on_disk, "PYTHON_PACKAGES is stale: rebuild");
    }

    fn env_of(workflow: &Workflow, task: &str) -> BTreeMap<String, String> {
        let task = workflow.spec.job_templates[0]
            .spec
            .tasks
            .iter()
            .find(|t| t.name == task)
            .expect("task");
        let raw = task.spec.raw.as_ref().expect("raw");
        let mut env = BTreeMap::new();
        for e in &raw.environment {
            assert!(
                env.insert(e.name.clone(), e.value.clone()).is_none(),
                "{} twice",
                e.name
            );
        }
        env
    }

    #[test]
    fn on_the_domain_the_tasks_get_the_python_and_keep_the_domain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = install_python(dir.path()).expect("install");
        assert!(path.is_absolute());
        let installed = std::fs::read_to_string(path.join("rlark_demo/cem.py")).expect("read");
        assert!(installed.contains("class CrossEntropy"));
        // A second install replaces the first, stale files included.
        std::fs::write(path.join("rlark_demo/stale.py"), "").expect("write");
        install_python(dir.path()).expect("install again");
        assert!(!path.join("rlark_demo/stale.py").exists());

        let mut manifests = manifests().expect("parse the demo");
        let python = Path::new("/opt/venv/bin/python");
        prepare(&mut manifests, &path, python, &Network::Domain);
        prepare(&mut manifests, &path, python, &Network::Domain); // idempotent
        assert_eq!(manifests.len(), 2, "the Domain stays");
        // The Domain is sent as written: nothing added to its spec (a null `jobTemplates`
        // made the server warn `unknown field "spec.jobTemplates"`).
        let domain = manifests
            .iter()
            .find(|m| m.kind() == "Domain")
            .expect("Domain");
        assert_eq!(
            domain.object["spec"],
            serde_json::json!({"cidr": "10.89.0.0/24"})
        );
        let workflow = workflow(&manifests);
        assert_eq!(
            workflow.spec.job_templates[0].spec.domain.as_deref(),
            Some(DOMAIN)
        );
        for task in [LEARNER_TASK, ROLLOUT_TASK] {
            let env = env_of(&workflow, task);
            assert_eq!(env["PYTHONPATH"], path.display().to_string());
            assert!(!env.contains_key("DEMO_LEARNER_URL"), "{task}");
        }
        for task in &workflow.spec.job_templates[0].spec.tasks {
            let raw = task.spec.raw.as_ref().expect("raw");
            assert_eq!(raw.entrypoint[0], "/opt/venv/bin/python", "{}", task.name);
        }
    }

    #[test]
    fn on_the_host_the_domain_goes_and_the_rollouts_dial_the_learners_loopback_port() {
        let mut manifests = manifests().expect("parse the demo");
        prepare(
            &mut manifests,
            Path::new("/data/demo/python"),
            Path::new("/usr/bin/python3"),
            &Network::Host(40123),
        );
        let kinds: Vec<&str> = manifests.iter().map(|m| m.kind()).collect();
        assert_eq!(kinds, ["Workflow"]);
        let workflow = workflow(&manifests);
        assert_eq!(workflow.spec.job_templates[0].spec.domain, None);
        let learner = env_of(&workflow, LEARNER_TASK);
        assert_eq!(learner["DEMO_LEARNER_HOST"], "127.0.0.1");
        assert_eq!(learner["DEMO_LEARNER_PORT"], "40123");
        let rollout = env_of(&workflow, ROLLOUT_TASK);
        assert_eq!(rollout["DEMO_LEARNER_URL"], "http://127.0.0.1:40123");
    }

    fn point(step: i64, reward: f64) -> CurvePoint {
        CurvePoint {
            step,
            reward,
            best: None,
        }
    }

    #[test]
    fn learning_is_a_rise_of_the_margin_from_the_first_iteration_to_the_last() {
        assert!(check_learning(&[point(1, -1.2), point(2, -0.9), point(3, -0.8)]).is_ok());
        let flat = check_learning(&[point(1, -1.2), point(2, -0.5), point(3, -1.0)])
            .expect_err("+0.2 is under the margin");
        assert!(
            flat.to_string().contains("did not learn")
                && flat.to_string().contains("-1.200 (iteration 1)"),
            "{flat}"
        );
        assert!(check_learning(&[]).is_err());
        assert!(check_learning(&[point(1, 0.0)]).is_err());
    }
}
