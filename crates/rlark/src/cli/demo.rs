//! `rlark up --demo`: apply the embedded `examples/demo/` Workflow to the platform `up`
//! just started, follow it until it ends (Task phases, replica counts, reports as they
//! arrive) and print a summary table.
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
use rlark_api::types::{Job, Task, TaskPhase, Workflow, WorkflowPhase};
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
    include_str!("../../../../examples/demo/workflow.yaml"),
)];

/// The training-side Python SDK (`sdk/python/rlark`), embedded so that the demo's tasks
/// can `import rlark` on a machine where it is not installed: [`install_python_sdk`] writes
/// it under the data directory and the demo's tasks get it on their `PYTHONPATH`.
const PYTHON_SDK: [(&str, &str); 4] = [
    (
        "rlark/__init__.py",
        include_str!("../../../../sdk/python/rlark/src/rlark/__init__.py"),
    ),
    (
        "rlark/_reporter.py",
        include_str!("../../../../sdk/python/rlark/src/rlark/_reporter.py"),
    ),
    (
        "rlark/_task.py",
        include_str!("../../../../sdk/python/rlark/src/rlark/_task.py"),
    ),
    ("rlark/py.typed", ""),
];

/// The Workflow the demo follows.
const WORKFLOW: &str = "demo";

/// How often the demo's state is read.
const POLL: Duration = Duration::from_millis(250);

/// How long the removal of an earlier run may take.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The parsed embedded manifests.
fn manifests() -> anyhow::Result<Vec<Manifest>> {
    let mut all = Vec::new();
    for (source, text) in DEMO_MANIFESTS {
        all.extend(manifest::parse_documents(text, source)?);
    }
    Ok(all)
}

/// Run the demo against the server whose admin kubeconfig is `kubeconfig`: apply it, follow
/// it, print the summary. `Ok` when the Workflow succeeded; an error naming the failing
/// Task when it failed, did not end within `timeout`, or `shutdown` was cancelled.
pub(crate) async fn run(
    kubeconfig: &Path,
    data_dir: &Path,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    let args = ClientArgs {
        kubeconfig: Some(PathBuf::from(kubeconfig)),
        ..ClientArgs::default()
    };
    let session = Session::connect(&args).await?;
    let client = session.client.clone();
    let sdk = install_python_sdk(data_dir)?;
    let mut manifests = manifests()?;
    for manifest in &mut manifests {
        add_python_path(&mut manifest.object, &sdk);
    }
    let catalog = Catalog::discover(&client).await?;
    let jobs = job_names(&manifests);

    tokio::select! {
        result = remove_earlier_run(&client, &jobs) => result?,
        () = shutdown.cancelled() => bail!("interrupted"),
    }
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
        api.create(&PostParams::default(), &body)
            .await
            .with_context(|| format!("create {} {}", info.qualified_kind(), manifest.name()))?;
        println!("{}/{} created", info.qualified_kind(), manifest.name());
    }
    println!();
    tokio::select! {
        result = follow(&client, &jobs, timeout) => result,
        () = shutdown.cancelled() => bail!("interrupted before workflow {WORKFLOW} ended"),
    }
}

/// Write [`PYTHON_SDK`] to `DATA_DIR/demo/python/` (replacing an earlier copy, which may
/// be of another version) and return that directory, absolute.
fn install_python_sdk(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let root = std::path::absolute(data_dir.join("demo").join("python"))
        .context("resolve the data directory")?;
    for (file, text) in PYTHON_SDK {
        let path = root.join(file);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(root)
}

/// Put `sdk` first on the `PYTHONPATH` of every raw task of a Workflow's job templates.
fn add_python_path(object: &mut Value, sdk: &Path) {
    let Some(templates) = object["spec"]["jobTemplates"].as_array_mut() else {
        return;
    };
    let tasks = templates
        .iter_mut()
        .filter_map(|t| t["spec"]["tasks"].as_array_mut())
        .flatten();
    for task in tasks {
        let Some(raw) = task.get_mut("raw").and_then(Value::as_object_mut) else {
            continue;
        };
        let environment = raw
            .entry("environment")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Some(list) = environment.as_array_mut() {
            list.retain(|e| e["name"] != "PYTHONPATH");
            list.push(serde_json::json!({
                "name": "PYTHONPATH",
                "value": sdk.display().to_string(),
            }));
        }
    }
}

/// Names of the Jobs the demo Workflow creates: `<workflow>-<template>`.
fn job_names(manifests: &[Manifest]) -> Vec<String> {
    manifests
        .iter()
        .filter(|m| m.kind() == "Workflow" && m.name() == WORKFLOW)
        .flat_map(|m| {
            m.object["spec"]["jobTemplates"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|t| t["name"].as_str().map(|n| format!("{WORKFLOW}-{n}")))
        .collect()
}

/// Delete a Workflow `demo` of an earlier run and wait until it, its Jobs and their Tasks
/// are gone.
async fn remove_earlier_run(client: &kube::Client, jobs: &[String]) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::all(client.clone());
    if workflows
        .get_opt(WORKFLOW)
        .await
        .context("get the demo workflow")?
        .is_none()
    {
        return Ok(());
    }
    println!("Removing workflow {WORKFLOW} of an earlier run...");
    match workflows.delete(WORKFLOW, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(anyhow::Error::new(e).context("delete the earlier demo workflow")),
    }
    let deadline = Instant::now() + CLEANUP_TIMEOUT;
    loop {
        let workflow_left = workflows.get_opt(WORKFLOW).await?.is_some();
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
                "the workflow {WORKFLOW} of an earlier run is still being deleted after {}s",
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
}

impl TaskView {
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
    })
}

/// Follow the Workflow until it ends or `timeout` passes, printing each change.
async fn follow(client: &kube::Client, jobs: &[String], timeout: Duration) -> anyhow::Result<()> {
    let workflows: Api<Workflow> = Api::all(client.clone());
    let started = Instant::now();
    let mut shown_phase = String::new();
    let mut shown: BTreeMap<String, TaskView> = BTreeMap::new();
    let mut stdout = std::io::stdout();
    loop {
        let workflow = workflows
            .get(WORKFLOW)
            .await
            .with_context(|| format!("get workflow {WORKFLOW}"))?;
        let status = workflow.status.clone().unwrap_or_default();
        let phase = status.phase.unwrap_or(WorkflowPhase::Pending);
        let mut views = Vec::new();
        for task in demo_tasks(client, jobs).await? {
            views.push(task_view(client, &task).await?);
        }
        let elapsed = format!("[{:5.1}s]", started.elapsed().as_secs_f64());
        if phase.to_string() != shown_phase {
            shown_phase = phase.to_string();
            writeln!(stdout, "{elapsed} workflow {WORKFLOW}: {shown_phase}")?;
        }
        for view in &views {
            if shown.get(&view.name) != Some(view) {
                writeln!(stdout, "{elapsed} {}", view.progress_line())?;
                shown.insert(view.name.clone(), view.clone());
            }
        }
        stdout.flush()?;
        let finished = matches!(
            phase,
            WorkflowPhase::Succeeded | WorkflowPhase::Failed | WorkflowPhase::Stopped
        );
        if finished {
            print_summary(&views, phase, started.elapsed());
            if phase == WorkflowPhase::Succeeded {
                return Ok(());
            }
            bail!("{}", failure_message(phase, &status, &views));
        }
        if started.elapsed() >= timeout {
            print_summary(&views, phase, started.elapsed());
            let mut message = format!(
                "workflow {WORKFLOW} did not finish within {}s (phase {phase})",
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
    phase: WorkflowPhase,
    status: &rlark_api::types::WorkflowStatus,
    views: &[TaskView],
) -> String {
    let mut message = format!("workflow {WORKFLOW} {phase}");
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

fn print_summary(views: &[TaskView], phase: WorkflowPhase, elapsed: Duration) {
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
        "\nWorkflow {WORKFLOW} {phase} after {:.1}s: {succeeded}/{replicas} replicas Succeeded, \
         {reports} reports.",
        elapsed.as_secs_f64()
    );
    println!(
        "Reports: rlark reports task/NAME    Logs: rlark logs task/NAME    (with \
         KUBECONFIG set as above)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_manifests_parse_and_pin_the_tasks_to_the_up_clusters() {
        let manifests = manifests().expect("parse the demo");
        assert_eq!(job_names(&manifests), ["demo-train"]);
        let workflow: Workflow =
            serde_json::from_value(manifests[0].object.clone()).expect("a Workflow");
        let tasks = &workflow.spec.job_templates[0].spec.tasks;
        let pinned: Vec<(String, String, i32)> = tasks
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
                ("actor".to_string(), "cloud".to_string(), 1),
                ("rollout".to_string(), "edge".to_string(), 2)
            ]
        );
    }

    #[test]
    fn the_embedded_python_sdk_is_the_whole_package() {
        let package =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/python/rlark/src/rlark");
        let mut on_disk: Vec<String> = std::fs::read_dir(&package)
            .expect("read the SDK's package")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".py") || name == "py.typed")
            .map(|name| format!("rlark/{name}"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = PYTHON_SDK.iter().map(|(f, _)| f.to_string()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add the new module to PYTHON_SDK");
    }

    #[test]
    fn the_demo_tasks_get_the_installed_sdk_on_their_python_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sdk = install_python_sdk(dir.path()).expect("install");
        assert!(sdk.is_absolute());
        let installed = std::fs::read_to_string(sdk.join("rlark/_task.py")).expect("read");
        assert_eq!(installed, PYTHON_SDK[2].1);
        let mut manifests = manifests().expect("parse the demo");
        add_python_path(&mut manifests[0].object, &sdk);
        add_python_path(&mut manifests[0].object, &sdk); // idempotent
        let workflow: Workflow =
            serde_json::from_value(manifests[0].object.clone()).expect("a Workflow");
        for task in &workflow.spec.job_templates[0].spec.tasks {
            let env = &task.spec.raw.as_ref().expect("raw").environment;
            let paths: Vec<_> = env.iter().filter(|e| e.name == "PYTHONPATH").collect();
            assert_eq!(paths.len(), 1, "{}", task.name);
            assert_eq!(paths[0].value.as_str(), sdk.to_str().expect("utf-8"));
        }
    }
}
