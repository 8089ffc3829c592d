//! The "must show" scenarios: the controller manager (`manager::run`, in-process)
//! against a real in-process API server, with simulated agents writing Nodes, Leases and
//! Pods exactly as real agents do.
//!
//! Every wait is bounded by [`DEADLINE`]; no test asserts how long anything took. Order is
//! checked through the simulated agents' run logs, never through wall-clock times.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::types::{
    Job, JobPhase, Node, NodeCategory, NodePhase, Pod, PodPhase, Task, TaskPhase, Workflow,
    WorkflowPhase,
};
use rlark_controllers::ControllerConfig;
use rlark_controllers::manager::{self, ManagerOptions};
use rlark_testkit::wait::eventually;
use rlark_testkit::{Behaviour, SimAgent, SimNode, TestServer};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound of every wait.
const DEADLINE: Duration = Duration::from_secs(60);
/// Namespace of the leader-election Lease.
const LEASE_NAMESPACE: &str = "rlark-system";
/// Name of the leader-election Lease.
const LEASE_NAME: &str = "rlark-controller-manager";

// ---------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------

/// Controller tunables for tests: fast requeues, a short node grace period.
fn test_config(identity: &str) -> ControllerConfig {
    ControllerConfig {
        node_grace_period: Duration::from_secs(2),
        node_check_interval: Duration::from_millis(200),
        unschedulable_requeue: Duration::from_secs(1),
        component: "rlark-controller-manager".into(),
        identity: identity.into(),
    }
}

/// Manager options; leader election with short timings, so a takeover after a crash
/// (which waits for the Lease to expire) is quick.
fn options(leader_election: bool) -> ManagerOptions {
    ManagerOptions {
        leader_election,
        lease_namespace: LEASE_NAMESPACE.into(),
        lease_name: LEASE_NAME.into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(500),
    }
}

/// A controller manager running in a Tokio task.
struct Manager {
    identity: String,
    shutdown: CancellationToken,
    join: JoinHandle<Result<(), rlark_controllers::Error>>,
}

impl Manager {
    fn start(client: &kube::Client, identity: &str, leader_election: bool) -> Manager {
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(manager::run(
            client.clone(),
            test_config(identity),
            options(leader_election),
            shutdown.clone(),
        ));
        Manager {
            identity: identity.into(),
            shutdown,
            join,
        }
    }

    /// Graceful stop: cancel and wait for `run` to return.
    async fn stop(self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let result = tokio::time::timeout(DEADLINE, self.join)
            .await
            .with_context(|| format!("manager {} did not stop", self.identity))?
            .context("manager task panicked")?;
        result.with_context(|| format!("manager {} failed", self.identity))
    }

    /// Crash: abort the task (no graceful shutdown, no lease release). The token is never
    /// cancelled, so anything the manager leaked would keep running and show up as
    /// duplicate work.
    async fn kill(self) {
        self.join.abort();
        let _ = self.join.await;
    }

    fn finished(&self) -> bool {
        self.join.is_finished()
    }
}

/// A server, its admin client, and the namespaces the manager needs.
struct Cluster {
    server: TestServer,
    client: kube::Client,
}

impl Cluster {
    async fn start() -> anyhow::Result<Cluster> {
        let server = TestServer::start().await?;
        let client = server.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &ns).await?;
        // The Domain every Job here names (a Job may only name one that exists).
        let domain: rlark_api::types::Domain = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
            "metadata": {"name": "d1"}, "spec": {"cidr": "10.98.0.0/16"},
        }))?;
        Api::<rlark_api::types::Domain>::all(client.clone())
            .create(&PostParams::default(), &domain)
            .await?;
        Ok(Cluster { server, client })
    }

    fn jobs(&self) -> Api<Job> {
        Api::all(self.client.clone())
    }

    fn workflows(&self) -> Api<Workflow> {
        Api::all(self.client.clone())
    }

    fn all_tasks(&self) -> Api<Task> {
        Api::all(self.client.clone())
    }

    fn all_pods(&self) -> Api<Pod> {
        Api::all(self.client.clone())
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.server.stop().await
    }

    async fn create_job(&self, job: Value) -> anyhow::Result<Job> {
        let job: Job = serde_json::from_value(job).context("job manifest")?;
        Ok(self.jobs().create(&PostParams::default(), &job).await?)
    }

    async fn patch_job(&self, name: &str, patch: Value) -> anyhow::Result<()> {
        self.jobs()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn tasks_of(&self, job: &str) -> anyhow::Result<Vec<Task>> {
        let lp = ListParams::default().labels(&format!("rlinf.io/job={job}"));
        let mut tasks = self.all_tasks().list(&lp).await?.items;
        tasks.sort_by_key(|t| t.name_any());
        Ok(tasks)
    }

    async fn pods_of(&self, task: &str) -> anyhow::Result<Vec<Pod>> {
        let lp = ListParams::default().labels(&format!("rlark.io/task-name={task}"));
        let mut pods = self.all_pods().list(&lp).await?.items;
        pods.sort_by_key(|p| p.name_any());
        Ok(pods)
    }

    /// Wait until the Job's phase is `phase`; returns the Job.
    async fn wait_job(&self, name: &str, phase: JobPhase) -> anyhow::Result<Job> {
        eventually(&format!("Job {name} {phase}"), || async {
            let job = self.jobs().get_opt(name).await?;
            Ok(match job {
                Some(job) if job_phase(&job) == Some(phase) => Ok(job),
                Some(job) => Err(describe_job(&job)),
                None => Err("no such Job".into()),
            })
        })
        .await
    }

    async fn wait_workflow(&self, name: &str, phase: WorkflowPhase) -> anyhow::Result<Workflow> {
        eventually(&format!("Workflow {name} {phase}"), || async {
            let wf = self.workflows().get_opt(name).await?;
            Ok(match wf {
                Some(wf) if wf.status.as_ref().and_then(|s| s.phase) == Some(phase) => Ok(wf),
                Some(wf) => Err(format!("{:?}", wf.status)),
                None => Err("no such Workflow".into()),
            })
        })
        .await
    }

    /// Wait until every Pod of `task` has one of `phases` and there are `count` of them.
    async fn wait_pods(&self, task: &str, count: usize, phase: PodPhase) -> anyhow::Result<()> {
        eventually(&format!("{count} Pods of {task} {phase}"), || async {
            let pods = self.pods_of(task).await?;
            let phases: Vec<_> = pods
                .iter()
                .map(|p| p.status.as_ref().and_then(|s| s.phase))
                .collect();
            Ok(
                if pods.len() == count && phases.iter().all(|p| *p == Some(phase)) {
                    Ok(())
                } else {
                    Err(format!("{phases:?}"))
                },
            )
        })
        .await
    }
}

/// The current time as `kubectl annotate ... restarted-at="$(date -u +%FT%TZ)"` writes it.
fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn job_phase(job: &Job) -> Option<JobPhase> {
    job.status.as_ref().and_then(|s| s.phase)
}

fn describe_job(job: &Job) -> String {
    match &job.status {
        None => "no status".into(),
        Some(s) => format!(
            "phase {:?}, tasks {:?}, conditions {:?}",
            s.phase,
            s.tasks
                .iter()
                .map(|t| (t.name.clone(), t.phase, t.message.clone()))
                .collect::<Vec<_>>(),
            s.conditions
                .iter()
                .map(|c| (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone()
                ))
                .collect::<Vec<_>>()
        ),
    }
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A `raw` task template: `replicas` replicas each requesting `requests`, selecting nodes
/// by `selector`.
fn raw_task(
    name: &str,
    head: bool,
    replicas: i32,
    selector: &[(&str, &str)],
    requests: &[(&str, &str)],
) -> Value {
    let selector: BTreeMap<&str, &str> = selector.iter().copied().collect();
    let requests: BTreeMap<&str, &str> = requests.iter().copied().collect();
    let mut raw = json!({"entrypoint": ["python", "main.py"], "replicas": replicas});
    if !requests.is_empty() {
        raw["resources"] = json!({ "requests": requests });
    }
    let mut task = json!({
        "name": name,
        "agentType": "Raw",
        "role": "Actor",
        "nodeSelector": selector,
        "raw": raw,
    });
    if head {
        task["head"] = json!(true);
    }
    task
}

fn job_manifest(name: &str, tasks: Vec<Value>) -> Value {
    json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"domain": "d1", "sshPublicKey": "ssh-ed25519 AAAA test", "tasks": tasks},
    })
}

fn gpu_node(name: &str, gpus: u32) -> SimNode {
    SimNode::new(name)
        .resource("nvidia.com/gpu", gpus.to_string())
        .resource("cpu", "16")
        .resource("memory", "64Gi")
}

// ---------------------------------------------------------------------------------------
// (a) a 3-task Job placed across two clusters by selector and capacity, runs, succeeds
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn a_job_is_placed_across_clusters_by_selector_and_capacity() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-a", false);
    let run = Behaviour::succeed_after(Duration::from_millis(300));
    // gpu-a comes first by name but has one GPU: first-match placement would pick it.
    let gpu = SimAgent::builder("gpu")
        .node(gpu_node("gpu-a", 1))
        .node(gpu_node("gpu-b", 2))
        .node(gpu_node("gpu-c", 2))
        .default_behaviour(run.clone())
        .start(cluster.client.clone())
        .await?;
    let edge = SimAgent::builder("edge")
        .node(
            SimNode::new("robot-0")
                .category(NodeCategory::Robot)
                .resource("cpu", "4")
                .resource("rlinf.io/device", "1"),
        )
        .node(
            SimNode::new("edge-box")
                .category(NodeCategory::Edge)
                .resource("cpu", "8"),
        )
        .default_behaviour(run)
        .start(cluster.client.clone())
        .await?;

    cluster
        .create_job(job_manifest(
            "rl",
            vec![
                raw_task(
                    "actor",
                    true,
                    2,
                    &[("rlark.io/cluster-id", "gpu")],
                    &[("nvidia.com/gpu", "2"), ("cpu", "4")],
                ),
                raw_task(
                    "rollout",
                    false,
                    1,
                    &[("rlark.io/cluster-id", "gpu")],
                    &[("cpu", "2")],
                ),
                raw_task(
                    "env",
                    false,
                    1,
                    // A comma list means any of these values.
                    &[("rlark.io/node-category", "robot,edge")],
                    &[("rlinf.io/device", "1")],
                ),
            ],
        ))
        .await?;

    let job = cluster.wait_job("rl", JobPhase::Succeeded).await?;
    let status = job.status.clone().context("job status")?;
    assert!(status.start_time.is_some() && status.end_time.is_some());
    assert_eq!(
        status
            .tasks
            .iter()
            .map(|t| (t.name.as_str(), t.phase))
            .collect::<Vec<_>>(),
        [
            ("actor", Some(TaskPhase::Succeeded)),
            ("rollout", Some(TaskPhase::Succeeded)),
            ("env", Some(TaskPhase::Succeeded)),
        ]
    );
    let complete = condition(&status.conditions, "Complete").context("Complete condition")?;
    assert_eq!(complete.status, "True");

    let tasks = cluster.tasks_of("rl").await?;
    let by_name: BTreeMap<String, Task> = tasks.into_iter().map(|t| (t.name_any(), t)).collect();
    assert_eq!(
        by_name.keys().map(String::as_str).collect::<Vec<_>>(),
        ["rl-actor", "rl-env", "rl-rollout"]
    );
    let placement = |name: &str| -> anyhow::Result<(String, Vec<String>)> {
        let task = &by_name[name];
        let p = task.spec.placement.clone().context("placement")?;
        Ok((p.cluster_id, p.nodes))
    };
    // Capacity: two replicas × 2 GPUs fit only on gpu-b and gpu-c, one each.
    let (actor_cluster, mut actor_nodes) = placement("rl-actor")?;
    assert_eq!(actor_cluster, "gpu");
    actor_nodes.sort();
    assert_eq!(actor_nodes, ["gpu-b", "gpu-c"]);
    assert_eq!(
        by_name["rl-actor"].namespace().as_deref(),
        Some("rlark-gpu")
    );
    assert_eq!(placement("rl-rollout")?.0, "gpu");
    // Selector with a comma list, and capacity: only robot-0 has the device.
    assert_eq!(
        placement("rl-env")?,
        ("edge".into(), vec!["robot-0".into()])
    );
    assert_eq!(by_name["rl-env"].namespace().as_deref(), Some("rlark-edge"));

    // What the Job controller stamps on every Task.
    let uid = job.metadata.uid.clone().context("job uid")?;
    let expect_ann = [
        ("rl-actor", "head", "0"),
        ("rl-rollout", "worker", "2"),
        ("rl-env", "worker", "3"),
    ];
    for (name, role, rank) in expect_ann {
        let task = &by_name[name];
        assert_eq!(task.labels()["rlinf.io/job"], "rl", "{name}");
        let owner = task.owner_references().first().context("owner reference")?;
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Job", uid.as_str())
        );
        assert_eq!(task.spec.domain.as_deref(), Some("d1"));
        assert_eq!(
            task.spec.ssh_public_key.as_deref(),
            Some("ssh-ed25519 AAAA test")
        );
        let ann = task.annotations();
        assert_eq!(ann["rlark.io/ray-role"], role, "{name}");
        assert_eq!(ann["rlark.io/ray-head-task-name"], "rl-actor", "{name}");
        assert_eq!(ann["rlark.io/ray-total-nodes"], "4", "{name}");
        assert_eq!(ann["rlark.io/ray-node-rank-start"], rank, "{name}");
        let task_status = task.status.clone().context("task status")?;
        assert_eq!(task_status.phase, Some(TaskPhase::Succeeded), "{name}");
        assert!(task_status.completion_time.is_some(), "{name}");
        assert!(!task_status.observed_nodes.is_empty(), "{name}");
    }
    cluster
        .wait_pods("rl-actor", 2, PodPhase::Succeeded)
        .await?;

    // Events explain what happened to the Job.
    let events: Api<Event> = Api::all(cluster.client.clone());
    let reasons: BTreeSet<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Job")
                && e.involved_object.name.as_deref() == Some("rl")
        })
        .filter_map(|e| e.reason)
        .collect();
    ensure!(!reasons.is_empty(), "no Event recorded about Job rl");

    gpu.stop().await?;
    edge.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (b) a failed task fails the Job; the restart annotation reruns it to success
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn b_failed_job_restarts_to_success() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-b", false);
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 2))
        .behaviour(
            "flaky-main",
            Behaviour::fail_after(Duration::from_millis(100), 3),
        )
        .default_behaviour(Behaviour::succeed_after(Duration::from_millis(100)))
        .start(cluster.client.clone())
        .await?;
    cluster
        .create_job(job_manifest(
            "flaky",
            vec![
                raw_task(
                    "main",
                    true,
                    1,
                    &[("rlark.io/cluster-id", "gpu")],
                    &[("cpu", "1")],
                ),
                raw_task(
                    "side",
                    false,
                    1,
                    &[("rlark.io/cluster-id", "gpu")],
                    &[("cpu", "1")],
                ),
            ],
        ))
        .await?;

    let failed = cluster.wait_job("flaky", JobPhase::Failed).await?;
    let status = failed.status.context("status")?;
    let main = status
        .tasks
        .iter()
        .find(|t| t.name == "main")
        .context("status of task main")?;
    assert_eq!(main.phase, Some(TaskPhase::Failed));
    let failed_condition = condition(&status.conditions, "Failed").context("Failed condition")?;
    assert_eq!(failed_condition.status, "True");
    assert!(status.end_time.is_some());
    let task = cluster.all_tasks().list(&ListParams::default()).await?;
    let main_task = task
        .items
        .iter()
        .find(|t| t.name_any() == "flaky-main")
        .context("task flaky-main")?;
    assert_eq!(
        main_task.status.as_ref().and_then(|s| s.phase),
        Some(TaskPhase::Failed)
    );

    // The fault is fixed; restart.
    agent.set_behaviour(
        "flaky-main",
        Behaviour::succeed_after(Duration::from_millis(100)),
    );
    cluster
        .patch_job(
            "flaky",
            json!({"metadata": {"annotations": {"rlark.io/restarted-at": now_rfc3339()}}}),
        )
        .await?;
    let job = cluster.wait_job("flaky", JobPhase::Succeeded).await?;
    let status = job.status.context("status")?;
    assert!(
        status
            .tasks
            .iter()
            .all(|t| t.phase == Some(TaskPhase::Succeeded)),
        "{:?}",
        status.tasks
    );
    // Each task ran exactly twice (once before and once after the restart); no duplicates.
    let log = agent.run_log();
    assert_eq!(
        log.iter().filter(|t| *t == "flaky-main").count(),
        2,
        "{log:?}"
    );
    assert_eq!(
        log.iter().filter(|t| *t == "flaky-side").count(),
        2,
        "{log:?}"
    );
    assert_eq!(cluster.tasks_of("flaky").await?.len(), 2);
    cluster
        .wait_pods("flaky-main", 1, PodPhase::Succeeded)
        .await?;

    agent.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (c) stop and resume
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn c_stop_and_resume() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-c", false);
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 2))
        .node(gpu_node("gpu-1", 2))
        .default_behaviour(Behaviour::run_forever())
        .start(cluster.client.clone())
        .await?;
    cluster
        .create_job(job_manifest(
            "pausable",
            vec![raw_task(
                "w",
                true,
                2,
                &[("rlark.io/cluster-id", "gpu")],
                &[("nvidia.com/gpu", "1")],
            )],
        ))
        .await?;
    cluster.wait_job("pausable", JobPhase::Running).await?;
    cluster
        .wait_pods("pausable-w", 2, PodPhase::Running)
        .await?;

    cluster
        .patch_job("pausable", json!({"spec": {"stopped": true}}))
        .await?;
    let stopped = cluster.wait_job("pausable", JobPhase::Stopped).await?;
    let tasks = cluster.tasks_of("pausable").await?;
    assert_eq!(tasks.len(), 1);
    assert!(tasks[0].spec.stopped, "the Task is told to stop");
    // Pods are ended by the agent; the Task ends Stopped.
    cluster.wait_pods("pausable-w", 2, PodPhase::Failed).await?;
    eventually("Task pausable-w Stopped", || async {
        let tasks = cluster.tasks_of("pausable").await?;
        let phase = tasks
            .first()
            .and_then(|t| t.status.as_ref())
            .and_then(|s| s.phase);
        Ok(if phase == Some(TaskPhase::Stopped) {
            Ok(())
        } else {
            Err(format!("{phase:?}"))
        })
    })
    .await?;
    assert_eq!(
        job_phase(&stopped),
        Some(JobPhase::Stopped),
        "{}",
        describe_job(&stopped)
    );

    // Resume: the run starts again, and this time it completes.
    agent.set_behaviour(
        "pausable-*",
        Behaviour::succeed_after(Duration::from_millis(300)),
    );
    cluster
        .patch_job("pausable", json!({"spec": {"stopped": false}}))
        .await?;
    cluster.wait_job("pausable", JobPhase::Succeeded).await?;
    let tasks = cluster.tasks_of("pausable").await?;
    assert_eq!(tasks.len(), 1, "no duplicate Task after resume");
    assert!(!tasks[0].spec.stopped);
    cluster
        .wait_pods("pausable-w", 2, PodPhase::Succeeded)
        .await?;
    assert_eq!(agent.run_log(), ["pausable-w", "pausable-w"]);

    agent.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (d) Workflow train → {eval-a, eval-b} → report, dependencies listed out of order
// ---------------------------------------------------------------------------------------

fn diamond_workflow(name: &str) -> anyhow::Result<Workflow> {
    let spec = |task: &str| json!({"tasks": [raw_task(task, true, 1, &[("rlark.io/cluster-id", "gpu")], &[("cpu", "1")])]});
    let wf = json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": name},
        "spec": {"jobTemplates": [
            {"name": "report", "dependencies": ["eval-b", "eval-a"], "spec": spec("summarize")},
            {"name": "eval-a", "dependencies": ["train"], "spec": spec("eval")},
            {"name": "eval-b", "dependencies": ["train"], "spec": spec("eval")},
            {"name": "train", "spec": spec("learner")},
        ]},
    });
    Ok(serde_json::from_value(wf)?)
}

/// Start positions in `log` of the first run of each task.
fn first_runs(log: &[String]) -> BTreeMap<String, usize> {
    let mut first = BTreeMap::new();
    for (i, name) in log.iter().enumerate() {
        first.entry(name.clone()).or_insert(i);
    }
    first
}

fn assert_diamond_order(wf: &str, log: &[String]) -> anyhow::Result<()> {
    let first = first_runs(log);
    let at = |tpl: &str, task: &str| {
        first
            .get(&format!("{wf}-{tpl}-{task}"))
            .copied()
            .with_context(|| format!("{wf}-{tpl}-{task} never ran: {log:?}"))
    };
    let train = at("train", "learner")?;
    let eval_a = at("eval-a", "eval")?;
    let eval_b = at("eval-b", "eval")?;
    let report = at("report", "summarize")?;
    ensure!(
        train < eval_a && train < eval_b,
        "evals before train: {log:?}"
    );
    ensure!(
        eval_a < report && eval_b < report,
        "report before evals: {log:?}"
    );
    Ok(())
}

async fn assert_diamond_objects(cluster: &Cluster, wf: &str) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("rlinf.io/workflow={wf}"));
    let jobs = cluster.jobs().list(&lp).await?.items;
    let mut names: Vec<String> = jobs.iter().map(|j| j.name_any()).collect();
    names.sort();
    let expected: Vec<String> = ["eval-a", "eval-b", "report", "train"]
        .iter()
        .map(|t| format!("{wf}-{t}"))
        .collect();
    assert_eq!(names, expected);
    let workflow = cluster.workflows().get(wf).await?;
    let uid = workflow.meta().uid.clone().context("workflow uid")?;
    for job in &jobs {
        assert_eq!(
            job_phase(job),
            Some(JobPhase::Succeeded),
            "{}",
            job.name_any()
        );
        let owner = job.owner_references().first().context("owner reference")?;
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Workflow", uid.as_str())
        );
        // Exactly one Task per Job and one Pod per Task.
        let tasks = cluster.tasks_of(&job.name_any()).await?;
        assert_eq!(tasks.len(), 1, "tasks of {}", job.name_any());
        let pods = cluster.pods_of(&tasks[0].name_any()).await?;
        assert_eq!(pods.len(), 1, "pods of {}", tasks[0].name_any());
    }
    assert_eq!(
        cluster
            .jobs()
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        4
    );
    assert_eq!(
        cluster
            .all_tasks()
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        4
    );
    assert_eq!(
        cluster
            .all_pods()
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        4
    );
    let status = workflow.status.context("workflow status")?;
    let mut job_status: Vec<_> = status
        .jobs
        .iter()
        .map(|j| (j.name.clone(), j.phase))
        .collect();
    job_status.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        job_status,
        ["eval-a", "eval-b", "report", "train"].map(|n| (n.to_string(), Some(JobPhase::Succeeded)))
    );
    Ok(())
}

#[tokio::test]
async fn d_workflow_diamond_with_unordered_dependencies_succeeds() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-d", false);
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 2))
        .default_behaviour(Behaviour::succeed_after(Duration::from_millis(200)))
        .start(cluster.client.clone())
        .await?;
    cluster
        .workflows()
        .create(&PostParams::default(), &diamond_workflow("wf")?)
        .await?;
    cluster
        .wait_workflow("wf", WorkflowPhase::Succeeded)
        .await?;
    assert_diamond_objects(&cluster, "wf").await?;
    assert_diamond_order("wf", &agent.run_log())?;
    assert_eq!(agent.runs_started(), 4);

    agent.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (e) gang: a Job needing 3 GPUs where 2 are free stays Pending, Unschedulable, with no
//     Task at all, and starts when a third GPU appears
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn e_gang_job_waits_unschedulable_until_capacity_appears() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-e", false);
    let agent = SimAgent::builder("small")
        .node(gpu_node("s-0", 2))
        .default_behaviour(Behaviour::succeed_after(Duration::from_millis(200)))
        .start(cluster.client.clone())
        .await?;
    cluster
        .create_job(job_manifest(
            "big",
            vec![
                // Fits on its own; must not start without its gang.
                raw_task(
                    "helper",
                    false,
                    1,
                    &[("rlark.io/cluster-id", "small")],
                    &[("cpu", "1")],
                ),
                raw_task(
                    "train",
                    true,
                    3,
                    &[("rlark.io/cluster-id", "small")],
                    &[("nvidia.com/gpu", "1")],
                ),
            ],
        ))
        .await?;

    let unschedulable = eventually("Job big Unschedulable", || async {
        let job = cluster.jobs().get("big").await?;
        let status = job.status.clone().unwrap_or_default();
        Ok(match condition(&status.conditions, "Unschedulable") {
            Some(c) if c.status == "True" => Ok((status.phase, c.message.clone())),
            _ => Err(describe_job(&job)),
        })
    })
    .await?;
    let (phase, message) = unschedulable;
    assert_eq!(phase, Some(JobPhase::Pending));
    assert!(
        message.contains("train") && message.contains("nvidia.com/gpu"),
        "the message says which task lacks what: {message:?}"
    );
    // Gang: not even the task that would fit was created.
    assert!(cluster.tasks_of("big").await?.is_empty());
    assert!(
        cluster
            .all_tasks()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    // A third GPU appears.
    agent.add_node(gpu_node("s-1", 1)).await?;
    let job = cluster.wait_job("big", JobPhase::Succeeded).await?;
    let status = job.status.context("status")?;
    if let Some(c) = condition(&status.conditions, "Unschedulable") {
        assert_ne!(
            c.status, "True",
            "still Unschedulable after placement: {c:?}"
        );
    }
    let tasks = cluster.tasks_of("big").await?;
    assert_eq!(tasks.len(), 2);
    let train = tasks
        .iter()
        .find(|t| t.name_any() == "big-train")
        .context("big-train")?;
    let mut nodes = train.spec.placement.clone().context("placement")?.nodes;
    nodes.sort();
    assert_eq!(nodes, ["s-0", "s-0", "s-1"]);

    agent.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (f) heartbeat loss: Node Offline, its Task NodeLost
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn f_heartbeat_loss_marks_node_offline_and_task_node_lost() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-f", false);
    let agent = SimAgent::builder("lossy")
        .node(gpu_node("l-0", 1))
        .heartbeat_interval(Duration::from_millis(200))
        .lease_duration(Duration::from_secs(2))
        .default_behaviour(Behaviour::run_forever())
        .start(cluster.client.clone())
        .await?;
    cluster
        .create_job(job_manifest(
            "lost",
            vec![raw_task(
                "w",
                true,
                1,
                &[("rlark.io/cluster-id", "lossy")],
                &[("nvidia.com/gpu", "1")],
            )],
        ))
        .await?;
    cluster.wait_job("lost", JobPhase::Running).await?;
    let nodes: Api<Node> = Api::namespaced(cluster.client.clone(), "rlark-lossy");
    assert_eq!(
        nodes.get("l-0").await?.status.and_then(|s| s.phase),
        Some(NodePhase::Online)
    );

    // The agent dies: heartbeats stop.
    agent.stop().await?;
    eventually("Node l-0 Offline", || async {
        let phase = nodes.get("l-0").await?.status.and_then(|s| s.phase);
        Ok(if phase == Some(NodePhase::Offline) {
            Ok(())
        } else {
            Err(format!("{phase:?}"))
        })
    })
    .await?;
    let tasks: Api<Task> = Api::namespaced(cluster.client.clone(), "rlark-lossy");
    eventually("Task lost-w NodeLost", || async {
        let status = tasks.get("lost-w").await?.status.unwrap_or_default();
        Ok(match condition(&status.conditions, "NodeLost") {
            Some(c) if c.status == "True" => Ok(()),
            _ => Err(format!("{:?} {:?}", status.phase, status.conditions)),
        })
    })
    .await?;
    // Default policy `Fail`: the Task, then its Job, fail.
    let job = cluster.wait_job("lost", JobPhase::Failed).await?;
    let task = tasks.get("lost-w").await?;
    assert_eq!(
        task.status.and_then(|s| s.phase),
        Some(TaskPhase::Failed),
        "{}",
        describe_job(&job)
    );

    manager.stop().await?;
    cluster.stop().await
}

#[tokio::test]
async fn f2_node_loss_with_reschedule_policy_places_the_task_again() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let manager = Manager::start(&cluster.client, "m-f2", false);
    let agent = SimAgent::builder("lossy")
        .node(gpu_node("l-0", 1))
        .heartbeat_interval(Duration::from_millis(200))
        .lease_duration(Duration::from_secs(2))
        .default_behaviour(Behaviour::run_forever())
        .start(cluster.client.clone())
        .await?;
    let mut task = raw_task(
        "w",
        true,
        1,
        &[("rlark.io/cluster-id", "lossy")],
        &[("nvidia.com/gpu", "1")],
    );
    task["nodeLostPolicy"] = json!("Reschedule");
    cluster
        .create_job(job_manifest("moving", vec![task]))
        .await?;
    cluster.wait_job("moving", JobPhase::Running).await?;
    let tasks: Api<Task> = Api::namespaced(cluster.client.clone(), "rlark-lossy");
    let placed_on = |t: &Task| t.spec.placement.as_ref().map(|p| p.nodes.clone());
    assert_eq!(
        placed_on(&tasks.get("moving-w").await?),
        Some(vec!["l-0".into()])
    );

    // A second machine appears; the first one's heartbeat stops.
    agent.add_node(gpu_node("l-1", 1)).await?;
    agent.pause_node_heartbeat("l-0");
    // Policy `Reschedule`: placed again on the Node that is left, and running there.
    eventually("Task moving-w running on l-1", || async {
        let task = tasks.get("moving-w").await?;
        let pod = cluster.pods_of("moving-w").await?.into_iter().next();
        let pod_on = pod
            .and_then(|p| p.status)
            .map(|s| (s.phase, s.node.unwrap_or_default()));
        Ok(match (placed_on(&task), pod_on) {
            (Some(nodes), Some((Some(PodPhase::Running), node)))
                if nodes == ["l-1"] && node == "l-1" =>
            {
                Ok(())
            }
            (placement, pod) => Err(format!(
                "placement {placement:?}, pod {pod:?}, status {:?}",
                task.status
            )),
        })
    })
    .await?;
    let nodes: Api<Node> = Api::namespaced(cluster.client.clone(), "rlark-lossy");
    assert_eq!(
        nodes.get("l-0").await?.status.and_then(|s| s.phase),
        Some(NodePhase::Offline)
    );
    // The loss is on record (the condition itself may already be cleared by the new run).
    let events: Api<Event> = Api::all(cluster.client.clone());
    let lost = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|e| {
            e.involved_object.name.as_deref() == Some("moving-w")
                && e.reason.as_deref() == Some("NodeLost")
        });
    ensure!(lost, "no NodeLost Event about Task moving-w");
    assert_eq!(cluster.tasks_of("moving").await?.len(), 1);
    assert_eq!(
        job_phase(&cluster.jobs().get("moving").await?),
        Some(JobPhase::Running)
    );

    agent.stop().await?;
    manager.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (g) two managers with leader election: kill the leader, the other takes over, no
//     duplicate Tasks
// ---------------------------------------------------------------------------------------

async fn lease_holder(client: &kube::Client) -> anyhow::Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    Ok(leases
        .get_opt(LEASE_NAME)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

#[tokio::test]
async fn g_leader_election_fails_over_without_duplicates() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 8))
        .node(gpu_node("gpu-1", 8))
        .default_behaviour(Behaviour::run_forever())
        .start(cluster.client.clone())
        .await?;
    let mut managers = vec![
        Manager::start(&cluster.client, "m-g-1", true),
        Manager::start(&cluster.client, "m-g-2", true),
    ];
    let tasks = || {
        vec![
            raw_task(
                "actor",
                true,
                2,
                &[("rlark.io/cluster-id", "gpu")],
                &[("nvidia.com/gpu", "1")],
            ),
            raw_task(
                "rollout",
                false,
                1,
                &[("rlark.io/cluster-id", "gpu")],
                &[("cpu", "1")],
            ),
        ]
    };
    cluster.create_job(job_manifest("ha", tasks())).await?;
    cluster.wait_job("ha", JobPhase::Running).await?;

    let leader = eventually("a leader", || async {
        Ok(match lease_holder(&cluster.client).await? {
            Some(h) if managers.iter().any(|m| m.identity == h) => Ok(h),
            other => Err(format!("holder {other:?}")),
        })
    })
    .await?;
    let index = managers
        .iter()
        .position(|m| m.identity == leader)
        .context("leader is one of ours")?;
    let killed = managers.remove(index);
    let survivor = managers.pop().context("the other manager")?;
    assert!(!survivor.finished(), "the follower is still running");
    killed.kill().await;

    let new_leader = eventually("takeover", || async {
        Ok(match lease_holder(&cluster.client).await? {
            Some(h) if h == survivor.identity => Ok(h),
            other => Err(format!("holder {other:?}")),
        })
    })
    .await?;
    assert_eq!(new_leader, survivor.identity);

    // The new leader acts: a new Job runs, and the old one keeps its Tasks.
    cluster.create_job(job_manifest("ha2", tasks())).await?;
    cluster.wait_job("ha2", JobPhase::Running).await?;
    cluster
        .patch_job("ha", json!({"spec": {"stopped": true}}))
        .await?;
    cluster.wait_job("ha", JobPhase::Stopped).await?;

    for job in ["ha", "ha2"] {
        let tasks = cluster.tasks_of(job).await?;
        assert_eq!(
            tasks.iter().map(|t| t.name_any()).collect::<Vec<_>>(),
            [format!("{job}-actor"), format!("{job}-rollout")],
            "exactly one Task per template"
        );
        assert_eq!(cluster.pods_of(&format!("{job}-actor")).await?.len(), 2);
    }
    assert_eq!(
        cluster
            .all_tasks()
            .list(&ListParams::default())
            .await?
            .items
            .len(),
        4
    );
    // Every Task ran once: no Task was created twice.
    let log = agent.run_log();
    for name in ["ha-actor", "ha-rollout", "ha2-actor", "ha2-rollout"] {
        assert_eq!(
            log.iter().filter(|t| *t == name).count(),
            1,
            "{name}: {log:?}"
        );
    }

    agent.stop().await?;
    survivor.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (h) convergence: the manager is killed and restarted between every step of a Workflow
// ---------------------------------------------------------------------------------------

/// Everything the controllers write that marks progress, as one comparable value.
async fn fingerprint(cluster: &Cluster, wf: &str) -> anyhow::Result<String> {
    let workflow = cluster.workflows().get(wf).await?;
    let mut parts = vec![format!(
        "wf={:?}",
        workflow.status.as_ref().and_then(|s| s.phase)
    )];
    let mut jobs = cluster.jobs().list(&ListParams::default()).await?.items;
    jobs.sort_by_key(|j| j.name_any());
    for job in jobs {
        parts.push(format!("{}={:?}", job.name_any(), job_phase(&job)));
    }
    let mut tasks = cluster
        .all_tasks()
        .list(&ListParams::default())
        .await?
        .items;
    tasks.sort_by_key(|t| t.name_any());
    for task in tasks {
        parts.push(format!(
            "{}={:?}/{}",
            task.name_any(),
            task.status.as_ref().and_then(|s| s.phase),
            task.spec.placement.is_some()
        ));
    }
    let mut pods = cluster.all_pods().list(&ListParams::default()).await?.items;
    pods.sort_by_key(|p| p.name_any());
    for pod in pods {
        parts.push(format!(
            "{}={:?}",
            pod.name_any(),
            pod.status.as_ref().and_then(|s| s.phase)
        ));
    }
    Ok(parts.join(" "))
}

#[tokio::test]
async fn h_workflow_converges_across_manager_restarts() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 2))
        .default_behaviour(Behaviour::succeed_after(Duration::from_millis(300)))
        .start(cluster.client.clone())
        .await?;
    cluster
        .workflows()
        .create(&PostParams::default(), &diamond_workflow("conv")?)
        .await?;

    let mut seen = fingerprint(&cluster, "conv").await?;
    let mut restarts = 0usize;
    let deadline = tokio::time::Instant::now() + DEADLINE * 3;
    loop {
        let manager = Manager::start(&cluster.client, &format!("m-h-{restarts}"), false);
        // Run until the state moves on by one step (or the Workflow is done).
        let next = eventually("a step of the Workflow", || async {
            let now = fingerprint(&cluster, "conv").await?;
            Ok(if now != seen { Ok(now) } else { Err(now) })
        })
        .await?;
        // Alternate crash and graceful stop.
        if restarts.is_multiple_of(2) {
            manager.kill().await;
        } else {
            manager.stop().await?;
        }
        restarts += 1;
        seen = next;
        let phase = cluster
            .workflows()
            .get("conv")
            .await?
            .status
            .and_then(|s| s.phase);
        if phase == Some(WorkflowPhase::Succeeded) {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no convergence after {restarts} restarts; state: {seen}"
        );
    }
    // One more manager over the final state must change nothing.
    let before = fingerprint(&cluster, "conv").await?;
    let manager = Manager::start(&cluster.client, "m-h-final", false);
    tokio::time::sleep(Duration::from_secs(1)).await;
    manager.stop().await?;
    assert_eq!(fingerprint(&cluster, "conv").await?, before);

    println!("converged after {restarts} manager restarts");
    assert!(restarts >= 4, "only {restarts} restarts");
    assert_diamond_objects(&cluster, "conv").await?;
    assert_diamond_order("conv", &agent.run_log())?;
    assert_eq!(
        agent.runs_started(),
        4,
        "every Task ran exactly once: {:?}",
        agent.run_log()
    );

    agent.stop().await?;
    cluster.stop().await
}

// ---------------------------------------------------------------------------------------
// (i) a graceful stop completes whenever it comes, even during start-up
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn i_manager_stops_gracefully_at_any_point() -> anyhow::Result<()> {
    /// A stop must not take longer than this (the manager's own bound is 10 s).
    const STOP_BOUND: Duration = Duration::from_secs(15);
    let cluster = Cluster::start().await?;
    let agent = SimAgent::builder("gpu")
        .node(gpu_node("gpu-0", 8))
        .default_behaviour(Behaviour::run_forever())
        .start(cluster.client.clone())
        .await?;
    // Some state for the controllers to list and reconcile.
    let manager = Manager::start(&cluster.client, "m-i-setup", false);
    for i in 0..5 {
        cluster
            .create_job(job_manifest(
                &format!("busy-{i}"),
                vec![raw_task("w", true, 1, &[], &[("cpu", "100m")])],
            ))
            .await?;
    }
    cluster.wait_job("busy-4", JobPhase::Running).await?;
    manager.stop().await?;

    let mut hung = Vec::new();
    for (i, after_ms) in [0u64, 20, 500].into_iter().enumerate() {
        for leader_election in [false, true] {
            let identity = format!("m-i-{i}-{leader_election}");
            let manager = Manager::start(&cluster.client, &identity, leader_election);
            tokio::time::sleep(Duration::from_millis(after_ms)).await;
            manager.shutdown.cancel();
            match tokio::time::timeout(STOP_BOUND, manager.join).await {
                Ok(joined) => joined
                    .context("manager task panicked")?
                    .with_context(|| format!("manager {identity} failed"))?,
                Err(_) => hung.push(format!(
                    "stop {after_ms} ms after start (leader election {leader_election})"
                )),
            }
        }
    }
    ensure!(
        hung.is_empty(),
        "manager::run did not return within {STOP_BOUND:?} of cancellation: {hung:?}"
    );

    agent.stop().await?;
    cluster.stop().await
}
