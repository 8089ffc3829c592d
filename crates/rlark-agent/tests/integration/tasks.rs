//! The Task reconciler end to end: an in-process rlark server with its controllers, a Node
//! registered for cluster `a` (heartbeats renewed by the test), and
//! `rlark_agent::tasks::run_tasks` with the admin client running real processes.
//!
//! Every wait is bounded by [`DEADLINE`]; no test asserts how long anything took.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use rlark_agent::runtime::process;
use rlark_agent::tasks::{self, TaskContext, TaskError};
use rlark_api::types::{Job, JobPhase, Node, Pod, PodPhase, Task, TaskPhase};
use rlark_testkit::TestServer;
use rlark_testkit::wait::eventually;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Upper bound of every wait.
const DEADLINE: Duration = Duration::from_secs(60);
const CLUSTER: &str = "a";
const NAMESPACE: &str = "rlark-a";
const NODE: &str = "host-0";

/// A server with controllers, a registered Node, and the agent's reconciler.
struct Harness {
    server: TestServer,
    _server_dir: TempDir,
    client: kube::Client,
    agent_dir: TempDir,
    heartbeat: JoinHandle<()>,
    agent: Option<(CancellationToken, JoinHandle<Result<(), TaskError>>)>,
}

impl Harness {
    async fn start() -> anyhow::Result<Harness> {
        let server_dir = tempfile::tempdir()?;
        let mut config = TestServer::config_for(server_dir.path());
        config.controllers.enabled = true;
        config.controllers.leader_election = false;
        let server = TestServer::start_with(config).await?;
        let client = server.client().await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces.create(&PostParams::default(), &ns).await?;
        register_node(&client).await?;
        let heartbeat = tokio::spawn(heartbeats(client.clone()));
        let mut harness = Harness {
            server,
            _server_dir: server_dir,
            client,
            agent_dir: tempfile::tempdir()?,
            heartbeat,
            agent: None,
        };
        harness.start_agent(true);
        Ok(harness)
    }

    fn tasks_dir(&self) -> PathBuf {
        self.agent_dir.path().join("tasks")
    }

    fn start_agent(&mut self, stop_tasks_on_exit: bool) {
        let ctx = TaskContext {
            cluster_id: CLUSTER.into(),
            node_name: NODE.into(),
            data_dir: self.tasks_dir(),
            server_url: self.server.url(),
            ca_file: self.agent_dir.path().join("identity/ca.crt"),
            stop_tasks_on_exit,
            supervisor: vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()],
            network: Default::default(),
            docker: None,
            devices: None,
            // The reconciler's own behaviour; isolation is tested in tests/isolation.rs.
            isolation: None,
        };
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(tasks::run_tasks(self.client.clone(), ctx, shutdown.clone()));
        self.agent = Some((shutdown, join));
    }

    async fn stop_agent(&mut self) -> anyhow::Result<()> {
        if let Some((shutdown, join)) = self.agent.take() {
            shutdown.cancel();
            tokio::time::timeout(DEADLINE, join)
                .await
                .context("the agent did not stop")?
                .context("the agent panicked")?
                .context("the agent failed")?;
        }
        Ok(())
    }

    /// End the agent as `kill -9` would: its tasks are aborted mid-flight, nothing of its
    /// shutdown path runs, the replicas' supervisor processes carry on.
    async fn crash_agent(&mut self) -> anyhow::Result<()> {
        if let Some((_, join)) = self.agent.take() {
            join.abort();
            match tokio::time::timeout(DEADLINE, join).await {
                Ok(Err(e)) if e.is_cancelled() => {}
                Ok(other) => bail!("the agent ended before the crash: {other:?}"),
                Err(_) => bail!("the aborted agent did not end"),
            }
        }
        Ok(())
    }

    /// The directory of replica `index` of Task `task` (its current UID).
    async fn replica_dir_of(&self, task: &str, index: usize) -> anyhow::Result<PathBuf> {
        let task = self.tasks().get(task).await?;
        Ok(tasks::replica_dir(
            &self.tasks_dir(),
            NAMESPACE,
            &task.name_any(),
            &task.uid().unwrap_or_default(),
            index,
        ))
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.stop_agent().await?;
        self.heartbeat.abort();
        self.server.stop().await
    }

    fn jobs(&self) -> Api<Job> {
        Api::all(self.client.clone())
    }

    fn tasks(&self) -> Api<Task> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    async fn create_job(&self, name: &str, raw: Value) -> anyhow::Result<()> {
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [{
                "name": "main",
                "agentType": "Raw",
                "role": "Actor",
                "raw": raw,
            }]},
        }))
        .context("job manifest")?;
        self.jobs().create(&PostParams::default(), &job).await?;
        Ok(())
    }

    async fn wait_job(&self, name: &str, phase: JobPhase) -> anyhow::Result<Job> {
        eventually(&format!("Job {name} {phase}"), || async {
            let job = self.jobs().get(name).await?;
            let status = job.status.clone().unwrap_or_default();
            Ok(if status.phase == Some(phase) {
                Ok(job)
            } else {
                Err(format!(
                    "{:?}: {:?}",
                    status.phase,
                    status
                        .tasks
                        .iter()
                        .map(|t| (t.phase, t.message.clone()))
                        .collect::<Vec<_>>()
                ))
            })
        })
        .await
    }

    async fn wait_task(&self, name: &str, phase: TaskPhase) -> anyhow::Result<Task> {
        eventually(&format!("Task {name} {phase}"), || async {
            let Some(task) = self.tasks().get_opt(name).await? else {
                return Ok(Err("no such Task".into()));
            };
            let status = task.status.clone().unwrap_or_default();
            Ok(if status.phase == Some(phase) {
                Ok(task)
            } else {
                Err(format!("{:?}: {:?}", status.phase, status.message))
            })
        })
        .await
    }

    /// Wait until Pod `name` satisfies `pred`; returns it.
    async fn wait_pod(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Pod) -> bool,
    ) -> anyhow::Result<Pod> {
        eventually(&format!("Pod {name} {what}"), || async {
            Ok(match self.pods().get_opt(name).await? {
                Some(pod) if pred(&pod) => Ok(pod),
                Some(pod) => Err(format!("{:?}", pod.status)),
                None => Err("no such Pod".into()),
            })
        })
        .await
    }

    async fn wait_pod_phase(&self, name: &str, phase: PodPhase) -> anyhow::Result<Pod> {
        self.wait_pod(name, &format!("{phase}"), |p| phase_of(p) == Some(phase))
            .await
    }

    /// `logs/current.log` of replica `index` of Task `task`.
    async fn log_of(&self, task: &str, index: usize) -> anyhow::Result<String> {
        let task = self.tasks().get(task).await?;
        let path = tasks::replica_dir(
            &self.tasks_dir(),
            NAMESPACE,
            &task.name_any(),
            &task.uid().unwrap_or_default(),
            index,
        )
        .join("logs/current.log");
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
    }
}

async fn register_node(client: &kube::Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::namespaced(client.clone(), NAMESPACE);
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "namespace": NAMESPACE,
            "labels": {
                "rlark.io/cluster-id": CLUSTER,
                "kubernetes.io/hostname": NODE,
                "rlark.io/node-category": "cloud",
                "rlark.io/agent-type": "Raw",
            },
        },
        "spec": {"agentType": "Raw"},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let resources = json!({"cpu": "16", "memory": "64Gi"});
    let status = json!({"status": {
        "phase": "Online",
        "reason": "AgentReady",
        "capacity": resources,
        "allocatable": resources,
        "heartbeatTime": Time(Timestamp::now()),
    }});
    nodes
        .patch_status(NODE, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    renew_lease(client).await
}

async fn renew_lease(client: &kube::Client) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let name = format!("node-{NODE}");
    let spec = LeaseSpec {
        holder_identity: Some(NODE.into()),
        lease_duration_seconds: Some(40),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..Default::default()
    };
    if leases.get_opt(&name).await?.is_none() {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(NAMESPACE.into()),
                ..Default::default()
            },
            spec: Some(spec.clone()),
        };
        leases.create(&PostParams::default(), &lease).await?;
        return Ok(());
    }
    leases
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await?;
    Ok(())
}

async fn heartbeats(client: kube::Client) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Err(error) = renew_lease(&client).await {
            eprintln!("heartbeat failed: {error:#}");
        }
    }
}

fn phase_of(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

fn reason_of(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.reason.as_deref())
}

fn message_of(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .unwrap_or_default()
}

fn exit_code_of(pod: &Pod) -> Option<i32> {
    pod.status.as_ref().and_then(|s| s.exit_code)
}

fn sh(script: &str) -> Value {
    json!(["sh", "-c", script])
}

/// Pids in a file written by a replica's script (whitespace-separated).
async fn read_pids(path: &Path) -> anyhow::Result<Vec<u32>> {
    eventually(&format!("pids in {}", path.display()), || async {
        Ok(match std::fs::read_to_string(path) {
            Ok(text) if text.ends_with('\n') => Ok(text
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<Vec<u32>, _>>()?),
            Ok(text) => Err(format!("incomplete: {text:?}")),
            Err(e) => Err(e.to_string()),
        })
    })
    .await
}

/// Live (non-zombie) processes of process group `pgid`.
fn group_members(pgid: i32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            process::proc_stat(*pid)
                .is_some_and(|s| s.pgrp == pgid && !matches!(s.state, 'Z' | 'X'))
        })
        .collect()
}

/// Wait until none of `pids` runs and their groups have no live member.
async fn wait_gone(pids: &[u32], groups: &[i32]) -> anyhow::Result<()> {
    eventually("processes gone", || async {
        let running: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|pid| process::process_running(*pid, None))
            .collect();
        let members: Vec<u32> = groups.iter().flat_map(|g| group_members(*g)).collect();
        Ok(if running.is_empty() && members.is_empty() {
            Ok(())
        } else {
            Err(format!("running {running:?}, group members {members:?}"))
        })
    })
    .await
}

// ---------------------------------------------------------------------------------------

/// Success, failure, a start error the agent survives, the environment contract, and two
/// replicas on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_jobs_run_to_completion_and_report_their_pods() -> anyhow::Result<()> {
    let h = Harness::start().await?;

    // exit 0: Pod Succeeded, Task and Job Succeeded, output in the log.
    h.create_job(
        "hello",
        json!({"entrypoint": sh("echo hello; echo oops >&2; exit 0")}),
    )
    .await?;
    let pod = h
        .wait_pod_phase("hello-main-0", PodPhase::Succeeded)
        .await?;
    let status = pod.status.clone().context("status")?;
    assert_eq!(status.exit_code, Some(0));
    assert_eq!(status.reason.as_deref(), Some("Completed"));
    assert_eq!(status.node.as_deref(), Some(NODE));
    assert!(status.start_time.is_some() && status.finish_time.is_some());
    assert_eq!(pod.labels()["rlark.io/task-name"], "hello-main");
    assert_eq!(pod.spec.replica_index, Some(0));
    assert_eq!(pod.spec.task_name.as_deref(), Some("hello-main"));
    let task = h.wait_task("hello-main", TaskPhase::Succeeded).await?;
    assert_eq!(
        pod.annotations()["rlark.io/task-uid"],
        task.uid().unwrap_or_default()
    );
    h.wait_job("hello", JobPhase::Succeeded).await?;
    let log = h.log_of("hello-main", 0).await?;
    assert!(log.contains("hello") && log.contains("oops"), "{log}");

    // A missing program: Failed with a message naming it; the agent goes on.
    h.create_job("missing", json!({"entrypoint": ["/nonexistent/bin", "x"]}))
        .await?;
    let pod = h.wait_pod_phase("missing-main-0", PodPhase::Failed).await?;
    assert_eq!(reason_of(&pod), Some("StartError"));
    assert!(
        message_of(&pod).contains("/nonexistent/bin"),
        "{}",
        message_of(&pod)
    );
    let task = h.wait_task("missing-main", TaskPhase::Failed).await?;
    let message = task.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("/nonexistent/bin"), "{message}");

    // The environment contract, with two replicas on this node: two Pods, both Succeeded.
    h.create_job(
        "env",
        json!({
            "entrypoint": sh("echo \"$RLARK_TASK $RLARK_REPLICA_INDEX $RLARK_TOTAL_NODES \
                             $RLARK_JOB $RLARK_TASK_ROLE $RLARK_CLUSTER_ID $RLARK_NODE_NAME $MINE\""),
            "replicas": 2,
            "environment": [{"name": "MINE", "value": "mine"}],
        }),
    )
    .await?;
    for index in 0..2 {
        let pod = h
            .wait_pod_phase(&format!("env-main-{index}"), PodPhase::Succeeded)
            .await?;
        assert_eq!(pod.spec.replica_index, Some(index));
    }
    h.wait_task("env-main", TaskPhase::Succeeded).await?;
    for index in 0..2 {
        let log = h.log_of("env-main", index).await?;
        let expected = format!("env-main {index} 2 env Actor {CLUSTER} {NODE} mine");
        assert!(log.contains(&expected), "replica {index}: {log:?}");
    }

    // Artifacts: an http one that cannot be fetched fails with the cause (nothing listens on
    // port 1 of the loopback); a file:// one is checked against its digest. (HTTP fetches
    // that work: tests/artifacts_env.rs.)
    h.create_job(
        "web",
        json!({"entrypoint": ["true"], "artifact": "http://127.0.0.1:1/app.tar.gz"}),
    )
    .await?;
    let pod = h.wait_pod_phase("web-main-0", PodPhase::Failed).await?;
    assert_eq!(reason_of(&pod), Some("ArtifactError"));
    assert!(
        message_of(&pod).contains("artifact http://127.0.0.1:1/app.tar.gz: download failed"),
        "{}",
        message_of(&pod)
    );
    let scratch = tempfile::tempdir()?;
    let artifact = scratch.path().join("app.sh");
    std::fs::write(&artifact, "echo from-artifact\n")?;
    let wrong = "0".repeat(64);
    h.create_job(
        "digest",
        json!({
            "entrypoint": ["sh", "app.sh"],
            "artifact": format!("file://{}", artifact.display()),
            "artifactSha256": wrong,
        }),
    )
    .await?;
    let pod = h.wait_pod_phase("digest-main-0", PodPhase::Failed).await?;
    assert_eq!(reason_of(&pod), Some("ArtifactChecksumMismatch"));
    assert!(message_of(&pod).contains(&wrong), "{}", message_of(&pod));
    h.create_job(
        "artifact",
        json!({
            "entrypoint": ["sh", "app.sh"],
            "artifact": format!("file://{}", artifact.display()),
        }),
    )
    .await?;
    h.wait_pod_phase("artifact-main-0", PodPhase::Succeeded)
        .await?;
    let log = h.log_of("artifact-main", 0).await?;
    assert!(log.contains("from-artifact"), "{log}");

    // A non-zero exit: Failed with its exit code.
    h.create_job("three", json!({"entrypoint": sh("exit 3")}))
        .await?;
    let pod = h.wait_pod_phase("three-main-0", PodPhase::Failed).await?;
    assert_eq!(exit_code_of(&pod), Some(3));
    assert_eq!(reason_of(&pod), Some("Error"));
    h.wait_job("three", JobPhase::Failed).await?;

    h.stop().await
}

/// `activeDeadlineSeconds` and `spec.stopped` kill whole process groups, a deleted Job's
/// replicas are killed and their Pods deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_stops_and_deletions_kill_the_whole_process_group() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    let scratch = tempfile::tempdir()?;

    // A deadline on a tree that ignores SIGTERM: SIGKILL after the 1 s grace period.
    let pidfile = scratch.path().join("deadline.pids");
    h.create_job(
        "deadline",
        json!({
            "entrypoint": sh("sh -c 'trap \"\" TERM; sleep 300' & echo $$ $! > \"$PIDFILE\"; \
                              trap '' TERM; sleep 300"),
            "environment": [{"name": "PIDFILE", "value": pidfile.display().to_string()}],
            "activeDeadlineSeconds": 1,
            "terminationGracePeriodSeconds": 1,
        }),
    )
    .await?;
    let pids = read_pids(&pidfile).await?;
    ensure!(
        pids.len() == 2,
        "expected the shell's and the grandchild's pid: {pids:?}"
    );
    let pod = h
        .wait_pod_phase("deadline-main-0", PodPhase::Failed)
        .await?;
    assert_eq!(reason_of(&pod), Some("DeadlineExceeded"));
    assert_eq!(exit_code_of(&pod), Some(137), "{:?}", pod.status);
    assert!(message_of(&pod).contains("SIGKILL"), "{}", message_of(&pod));
    let group = i32::try_from(pids[0])?;
    wait_gone(&pids, &[group]).await?;
    h.wait_task("deadline-main", TaskPhase::Failed).await?;

    // Stop the Job: both replicas get SIGTERM and die of it (within the grace period).
    h.create_job(
        "stopme",
        json!({
            "entrypoint": sh("echo $$ > \"$PIDDIR/$RLARK_REPLICA_INDEX\"; sleep 300 & wait"),
            "environment": [{"name": "PIDDIR", "value": scratch.path().display().to_string()}],
            "replicas": 2,
            "terminationGracePeriodSeconds": 20,
        }),
    )
    .await?;
    let mut pids = Vec::new();
    for index in 0..2 {
        h.wait_pod_phase(&format!("stopme-main-{index}"), PodPhase::Running)
            .await?;
        pids.extend(read_pids(&scratch.path().join(index.to_string())).await?);
    }
    h.jobs()
        .patch(
            "stopme",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    for index in 0..2 {
        let pod = h
            .wait_pod_phase(&format!("stopme-main-{index}"), PodPhase::Failed)
            .await?;
        assert_eq!(reason_of(&pod), Some("Stopped"), "{:?}", pod.status);
        assert_eq!(exit_code_of(&pod), Some(143), "{:?}", pod.status);
    }
    let groups: Vec<i32> = pids
        .iter()
        .map(|p| i32::try_from(*p))
        .collect::<Result<_, _>>()?;
    wait_gone(&pids, &groups).await?;
    h.wait_task("stopme-main", TaskPhase::Stopped).await?;
    h.wait_job("stopme", JobPhase::Stopped).await?;

    // Resume: fresh replicas (new Pods) run again.
    let old_uid = h.pods().get("stopme-main-0").await?.uid();
    for index in 0..2 {
        let _ = std::fs::remove_file(scratch.path().join(index.to_string()));
    }
    h.jobs()
        .patch(
            "stopme",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": false}})),
        )
        .await?;
    let pod = h
        .wait_pod("stopme-main-0", "recreated and Running", |p| {
            p.uid() != old_uid && phase_of(p) == Some(PodPhase::Running)
        })
        .await?;
    assert_eq!(pod.status.and_then(|s| s.restart_count), Some(0));
    let pids = read_pids(&scratch.path().join("0")).await?;

    // Delete the Job: its Task goes, the replicas are killed and their Pods deleted.
    h.jobs().delete("stopme", &DeleteParams::default()).await?;
    eventually("stopme Pods deleted", || async {
        let left: Vec<String> = h
            .pods()
            .list(&Default::default())
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .filter(|n| n.starts_with("stopme-"))
            .collect();
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        })
    })
    .await?;
    let groups: Vec<i32> = pids
        .iter()
        .map(|p| i32::try_from(*p))
        .collect::<Result<_, _>>()?;
    wait_gone(&pids, &groups).await?;

    h.stop().await
}

/// `restartPolicy: OnFailure` restarts with backoff; an agent killed while replicas run
/// (the must-show of crash safety): on restart the running replica is adopted (same
/// process, Pod `Running` with its start time, its log keeps growing, a later stop ends
/// it `Stopped`), the ones that ended meanwhile are reported with their real exit codes,
/// one whose supervisor was killed too is `AgentLost`, and no Pod stays `Running`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_back_off_and_a_crashed_agent_adopts_or_reports_its_replicas() -> anyhow::Result<()>
{
    let mut h = Harness::start().await?;

    h.create_job(
        "flaky",
        json!({"entrypoint": sh("echo run; exit 1"), "restartPolicy": "OnFailure"}),
    )
    .await?;
    let pod = h
        .wait_pod("flaky-main-0", "restarted twice", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.restart_count)
                .is_some_and(|n| n >= 2)
        })
        .await?;
    assert_eq!(phase_of(&pod), Some(PodPhase::Running), "{:?}", pod.status);
    let task = h.tasks().get("flaky-main").await?;
    let status = task.status.clone().unwrap_or_default();
    assert_ne!(status.phase, Some(TaskPhase::Failed), "{status:?}");
    let log = h.log_of("flaky-main", 0).await?;
    assert!(log.matches("run").count() >= 2, "{log}");
    // Each start after the first is marked in the log, so a follower sees where it begins.
    assert!(
        log.contains("\n--- rlark: the replica started again at ")
            && log.lines().next() == Some("run"),
        "{log}"
    );
    // Backing off: the reason says so.
    h.wait_pod("flaky-main-0", "backing off", |p| {
        reason_of(p) == Some("BackOff") && message_of(p).contains("exited with code 1")
    })
    .await?;
    h.jobs()
        .patch(
            "flaky",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    h.wait_pod("flaky-main-0", "Failed Stopped", |p| {
        phase_of(p) == Some(PodPhase::Failed) && reason_of(p) == Some("Stopped")
    })
    .await?;

    // An agent that exits without stopping its tasks and one killed outright both leave
    // their replicas running under their supervisors.
    h.stop_agent().await?;
    h.start_agent(false);
    let scratch = tempfile::tempdir()?;
    let gate = scratch.path().join("gate");
    let pidfile = scratch.path().join("long.pid");
    h.create_job(
        "long",
        json!({
            "entrypoint": sh("echo $$ > \"$PIDFILE\"; i=0; while true; do echo tick $i; \
                              i=$((i+1)); sleep 0.1; done"),
            "environment": [{"name": "PIDFILE", "value": pidfile.display().to_string()}],
            "terminationGracePeriodSeconds": 5,
        }),
    )
    .await?;
    for (name, code) in [("zero", 0), ("three", 3), ("orphan", 4)] {
        h.create_job(
            name,
            json!({
                "entrypoint": sh(&format!(
                    "echo waiting; while [ ! -e \"$GATE\" ]; do sleep 0.05; done; exit {code}"
                )),
                "environment": [{"name": "GATE", "value": gate.display().to_string()}],
                "terminationGracePeriodSeconds": 1,
            }),
        )
        .await?;
    }
    // A replica that keeps failing and restarting (mostly waiting in its backoff).
    h.create_job(
        "again",
        json!({"entrypoint": sh("exit 1"), "restartPolicy": "Always"}),
    )
    .await?;
    let mut start_times = Vec::new();
    for name in ["long", "zero", "three", "orphan"] {
        let pod = h
            .wait_pod_phase(&format!("{name}-main-0"), PodPhase::Running)
            .await?;
        start_times.push(pod.status.and_then(|s| s.start_time).context("startTime")?);
    }
    let again = h
        .wait_pod("again-main-0", "restarted", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.restart_count)
                .is_some_and(|n| n >= 1)
        })
        .await?;
    let long_pid = read_pids(&pidfile).await?[0];
    let orphan_dir = h.replica_dir_of("orphan-main", 0).await?;
    let orphan: Value = serde_json::from_slice(&std::fs::read(orphan_dir.join("pid.json"))?)?;
    let orphan_pgid = i32::try_from(orphan["pgid"].as_i64().context("pgid")?)?;
    let orphan_supervisor = i32::try_from(orphan["supervisorPid"].as_i64().context("pid")?)?;

    h.crash_agent().await?;
    let again_restarts = h
        .pods()
        .get("again-main-0")
        .await?
        .status
        .and_then(|s| s.restart_count)
        .context("restartCount")?;
    // While no agent runs: two replicas end, and one loses its supervisor (SIGKILL).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(orphan_supervisor),
        nix::sys::signal::Signal::SIGKILL,
    )?;
    std::fs::write(&gate, "")?;
    for name in ["zero-main", "three-main"] {
        let exit_file = h.replica_dir_of(name, 0).await?.join("exit.json");
        eventually(&format!("{name} exited"), || async {
            Ok(if exit_file.exists() {
                Ok(())
            } else {
                Err("no exit.json".into())
            })
        })
        .await?;
    }
    for name in ["long", "zero", "three", "orphan"] {
        assert_eq!(
            phase_of(&h.pods().get(&format!("{name}-main-0")).await?),
            Some(PodPhase::Running),
            "nothing reported {name} while no agent ran"
        );
    }
    let log_before = h.log_of("long-main", 0).await?.len();

    h.start_agent(true);
    let pod = h.wait_pod_phase("zero-main-0", PodPhase::Succeeded).await?;
    assert_eq!(exit_code_of(&pod), Some(0));
    assert_eq!(reason_of(&pod), Some("Completed"));
    let pod = h.wait_pod_phase("three-main-0", PodPhase::Failed).await?;
    assert_eq!(exit_code_of(&pod), Some(3), "{:?}", pod.status);
    assert_eq!(reason_of(&pod), Some("Error"));
    let pod = h.wait_pod_phase("orphan-main-0", PodPhase::Failed).await?;
    assert_eq!(reason_of(&pod), Some("AgentLost"), "{:?}", pod.status);
    assert!(message_of(&pod).contains("unknown"), "{}", message_of(&pod));
    wait_gone(&[], &[orphan_pgid]).await?;

    // The long one is adopted: the same process, its Pod untouched, its log growing.
    eventually("long's log grows after the restart", || async {
        let len = h.log_of("long-main", 0).await?.len();
        Ok(if len > log_before + 20 {
            Ok(())
        } else {
            Err(format!("{len} bytes (was {log_before})"))
        })
    })
    .await?;
    assert!(
        process::process_running(long_pid, None),
        "not restarted, not killed"
    );
    assert_eq!(read_pids(&pidfile).await?, [long_pid], "started once");
    let pod = h.pods().get("long-main-0").await?;
    let status = pod.status.clone().context("status")?;
    assert_eq!(status.phase, Some(PodPhase::Running), "{status:?}");
    assert_eq!(status.start_time.as_ref(), Some(&start_times[0]));
    assert_eq!(status.restart_count, Some(0));
    // The restarting one goes on restarting (whether it was running, had exited unseen, or
    // was waiting in its backoff when the agent died), counting on from its Pod.
    let pod = h
        .wait_pod("again-main-0", "restarted after the agent restart", |p| {
            p.status
                .as_ref()
                .and_then(|s| s.restart_count)
                .is_some_and(|n| n > again_restarts)
        })
        .await?;
    assert_eq!(phase_of(&pod), Some(PodPhase::Running), "{:?}", pod.status);
    assert_ne!(reason_of(&pod), Some("AgentLost"));
    assert_eq!(
        pod.status.and_then(|s| s.start_time),
        again.status.and_then(|s| s.start_time)
    );
    for name in ["zero", "three", "orphan"] {
        assert_ne!(
            phase_of(&h.pods().get(&format!("{name}-main-0")).await?),
            Some(PodPhase::Running),
            "{name} stuck Running"
        );
    }
    // Stopping it later goes through the adopted supervisor.
    h.jobs()
        .patch(
            "long",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    let pod = h.wait_pod_phase("long-main-0", PodPhase::Failed).await?;
    assert_eq!(reason_of(&pod), Some("Stopped"), "{:?}", pod.status);
    assert_eq!(exit_code_of(&pod), Some(143), "{:?}", pod.status);
    let group = i32::try_from(long_pid)?;
    wait_gone(&[long_pid], &[group]).await?;
    h.wait_task("long-main", TaskPhase::Stopped).await?;

    h.stop().await
}

/// Sum of the server's `rlark_apiserver_requests_total` samples for `verb` on `resource`.
async fn requests_total(client: &kube::Client, verb: &str, resource: &str) -> anyhow::Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    let prefix =
        format!("rlark_apiserver_requests_total{{verb=\"{verb}\",resource=\"{resource}\",");
    Ok(text
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Wait for Pod `name` to satisfy `pred` by listing (a GET would count as the agent's).
async fn list_until(h: &Harness, name: &str, pred: impl Fn(&Pod) -> bool) -> anyhow::Result<Pod> {
    eventually(&format!("Pod {name}"), || async {
        let pods = h.pods().list(&Default::default()).await?;
        Ok(
            match pods.items.into_iter().find(|p| p.name_any() == name) {
                Some(pod) if pred(&pod) => Ok(pod),
                Some(pod) => Err(format!("{:?}", pod.status)),
                None => Err("no such Pod".into()),
            },
        )
    })
    .await
}

/// One HTTP response after `delay`: a shell script as the artifact body.
async fn slow_artifact_server(delay: Duration) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                tokio::time::sleep(delay).await;
                let body = "echo slow-artifact\n";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    Ok(format!("http://{addr}/app.sh"))
}

/// A replica of a Task that appeared after the agent's listing gets its Pod created without
/// a read first; a Pod of another run found in the way by that create is replaced; a
/// replica that starts slowly (artifact download) is reported `Pending` on its node first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_replicas_create_their_pods_and_report_pending_only_while_starting_is_slow()
-> anyhow::Result<()> {
    let h = Harness::start().await?;
    // The agent has listed (it ran something) before anything below appears.
    h.create_job("first", json!({"entrypoint": ["true"]}))
        .await?;
    list_until(&h, "first-main-0", |p| {
        phase_of(p) == Some(PodPhase::Succeeded)
    })
    .await?;

    // No Pod read on the way of a new replica.
    let gets_before = requests_total(&h.client, "get", "pods").await?;
    h.create_job("fresh", json!({"entrypoint": ["true"]}))
        .await?;
    let pod = list_until(&h, "fresh-main-0", |p| {
        phase_of(p) == Some(PodPhase::Succeeded)
    })
    .await?;
    assert_eq!(pod.status.and_then(|s| s.node).as_deref(), Some(NODE));
    let gets = requests_total(&h.client, "get", "pods").await? - gets_before;
    assert_eq!(
        gets, 0.0,
        "the agent read the Pod of a replica it never saw"
    );

    // A Pod of another run under the replica's name, created after the listing: the
    // agent's create finds it, reads it, replaces it.
    let squatter: Pod = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Pod",
        "metadata": {
            "name": "squat-main-0",
            "labels": {"rlark.io/task-name": "squat-main"},
            "annotations": {"rlark.io/task-uid": "an-earlier-task", "rlark.io/run-key": "stale"},
        },
        "spec": {"taskName": "squat-main", "taskNamespace": NAMESPACE, "replicaIndex": 0},
    }))?;
    let squatter = h.pods().create(&PostParams::default(), &squatter).await?;
    h.create_job("squat", json!({"entrypoint": ["true"]}))
        .await?;
    let task = h.wait_task("squat-main", TaskPhase::Succeeded).await?;
    let pod = h
        .wait_pod_phase("squat-main-0", PodPhase::Succeeded)
        .await?;
    assert_ne!(pod.uid(), squatter.uid(), "the stale Pod was not replaced");
    assert_eq!(
        pod.annotations()["rlark.io/task-uid"],
        task.uid().unwrap_or_default()
    );

    // A slow start (the artifact answers after 2 s): Pending on this node, then Running.
    let url = slow_artifact_server(Duration::from_secs(2)).await?;
    let watch_api = h.pods();
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let phases = tokio::spawn(async move {
        use futures::StreamExt as _;
        use kube::runtime::watcher;
        let mut seen: Vec<(Option<PodPhase>, Option<String>)> = Vec::new();
        let stream = watcher(
            watch_api,
            watcher::Config::default().fields("metadata.name=slow-main-0"),
        );
        let mut stream = std::pin::pin!(stream);
        let mut listed_tx = Some(listed_tx);
        while let Some(Ok(event)) = stream.next().await {
            let pod = match event {
                watcher::Event::InitDone => {
                    if let Some(tx) = listed_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => pod,
                watcher::Event::Init | watcher::Event::Delete(_) => continue,
            };
            let status = pod.status.unwrap_or_default();
            let entry = (status.phase, status.node);
            if seen.last() != Some(&entry) {
                seen.push(entry);
            }
            if status.phase == Some(PodPhase::Succeeded) {
                break;
            }
        }
        seen
    });
    // Watching before the Job exists: every phase the Pod goes through is seen.
    tokio::time::timeout(DEADLINE, listed)
        .await
        .context("the Pod watch did not start")??;
    h.create_job(
        "slow",
        json!({"entrypoint": ["sh", "app.sh"], "artifact": url}),
    )
    .await?;
    let seen = tokio::time::timeout(DEADLINE, phases)
        .await
        .context("the slow replica did not succeed")??;
    let pending = seen.iter().position(|(phase, node)| {
        *phase == Some(PodPhase::Pending) && node.as_deref() == Some(NODE)
    });
    let running = seen
        .iter()
        .position(|(phase, _)| *phase == Some(PodPhase::Running));
    assert!(
        matches!((pending, running), (Some(p), Some(r)) if p < r),
        "expected Pending on {NODE} before Running: {seen:?}"
    );
    assert!(h.log_of("slow-main", 0).await?.contains("slow-artifact"));

    h.stop().await
}
