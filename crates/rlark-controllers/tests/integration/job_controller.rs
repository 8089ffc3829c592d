//! The Job and Workflow controllers against a real in-process API server, with
//! hand-written Nodes and hand-patched Task statuses (no agent, no Task controller): only
//! `job::run` and `workflow::run` act. Every wait polls with a deadline.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use rlark_api::labels;
use rlark_api::types::{Job, JobPhase, Node, Task, TaskPhase, Workflow, WorkflowPhase};
use rlark_controllers::{Context, ControllerConfig, job, workflow};
use rlark_testkit::TestServer;
use rlark_testkit::wait::eventually;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Upper bound of every wait.
const DEADLINE: Duration = Duration::from_secs(30);

struct Harness {
    server: Option<TestServer>,
    client: Client,
    config: ControllerConfig,
    shutdown: CancellationToken,
    controllers: Vec<tokio::task::JoinHandle<()>>,
}

impl Harness {
    async fn start(config: ControllerConfig) -> anyhow::Result<Harness> {
        rlark_testkit::init_tracing();
        let server = TestServer::start().await?;
        let client = server.client().await?;
        // The Domain the Jobs here name (a Job may only name one that exists).
        let domain: rlark_api::types::Domain = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Domain",
            "metadata": {"name": "d1"}, "spec": {"cidr": "10.98.0.0/16"},
        }))?;
        Api::<rlark_api::types::Domain>::all(client.clone())
            .create(&PostParams::default(), &domain)
            .await?;
        let mut h = Harness {
            server: Some(server),
            client,
            config,
            shutdown: CancellationToken::new(),
            controllers: Vec::new(),
        };
        h.spawn_controllers();
        Ok(h)
    }

    /// Starts a fresh Job and Workflow controller (new caches, new ledger).
    fn spawn_controllers(&mut self) {
        let ctx = Arc::new(Context::new(self.client.clone(), self.config.clone()));
        self.shutdown = CancellationToken::new();
        self.controllers = vec![
            tokio::spawn(job::run(ctx.clone(), self.shutdown.clone())),
            tokio::spawn(workflow::run(ctx, self.shutdown.clone())),
        ];
    }

    /// Kills the controllers wherever they are (no graceful shutdown).
    async fn kill_controllers(&mut self) {
        for handle in self.controllers.drain(..) {
            handle.abort();
            let _ = handle.await;
        }
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        for handle in self.controllers.drain(..) {
            tokio::time::timeout(DEADLINE, handle)
                .await
                .context("controller did not stop")??;
        }
        if let Some(server) = self.server.take() {
            server.stop().await?;
        }
        Ok(())
    }

    fn jobs(&self) -> Api<Job> {
        Api::all(self.client.clone())
    }

    fn tasks(&self, namespace: &str) -> Api<Task> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// A Raw Node `name` of cluster `cluster` (namespace `rlark-<cluster>`), Online, with
    /// `labels` and `allocatable`.
    async fn node(
        &self,
        cluster: &str,
        name: &str,
        node_labels: &[(&str, &str)],
        allocatable: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let namespace = format!("rlark-{cluster}");
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let mut all_labels: BTreeMap<String, String> = node_labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all_labels.insert(labels::CLUSTER_ID.into(), cluster.into());
        let api: Api<Node> = Api::namespaced(self.client.clone(), &namespace);
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Node",
            "metadata": {"name": name, "namespace": namespace, "labels": all_labels},
            "spec": {"agentType": "Raw"},
        }))?;
        api.create(&PostParams::default(), &node).await?;
        let allocatable: BTreeMap<&str, &str> = allocatable.iter().copied().collect();
        let status = json!({"status": {"phase": "Online", "allocatable": allocatable, "capacity": allocatable}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(())
    }

    async fn create_job(&self, body: Value) -> anyhow::Result<Job> {
        let job: Job = serde_json::from_value(body)?;
        Ok(self.jobs().create(&PostParams::default(), &job).await?)
    }

    /// Sets a Task's status phase (and message), as an agent would.
    async fn set_task_phase(
        &self,
        namespace: &str,
        name: &str,
        phase: TaskPhase,
        message: Option<&str>,
    ) -> anyhow::Result<()> {
        let patch = json!({"status": {"phase": phase.as_str(), "message": message}});
        self.tasks(namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("set {namespace}/{name} {phase}"))?;
        Ok(())
    }

    /// Tasks of Job `job` in every namespace (`namespace/name` sorted).
    async fn tasks_of(&self, job: &str) -> anyhow::Result<Vec<Task>> {
        let api: Api<Task> = Api::all(self.client.clone());
        let mut tasks = api
            .list(&ListParams::default().labels(&format!("{}={job}", labels::JOB)))
            .await?
            .items;
        tasks.sort_by_key(|t| (t.namespace(), t.name_any()));
        Ok(tasks)
    }

    async fn wait_job(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Job) -> bool,
    ) -> anyhow::Result<Job> {
        let api = self.jobs();
        eventually(&format!("job {name}: {what}"), || async {
            Ok(api.get_opt(name).await?.filter(|j| check(j)))
        })
        .await
    }

    async fn wait_job_phase(&self, name: &str, phase: JobPhase) -> anyhow::Result<Job> {
        self.wait_job(name, phase.as_str(), |j| job_phase(j) == Some(phase))
            .await
    }

    async fn wait_tasks(&self, job: &str, count: usize) -> anyhow::Result<Vec<Task>> {
        eventually(&format!("{count} tasks of job {job}"), || async {
            let tasks = self.tasks_of(job).await?;
            Ok((tasks.len() == count).then_some(tasks))
        })
        .await
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn job_phase(job: &Job) -> Option<JobPhase> {
    job.status.as_ref().and_then(|s| s.phase)
}

fn condition<'a>(
    job: &'a Job,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    job.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

fn annotation(task: &Task, key: &str) -> String {
    task.annotations().get(key).cloned().unwrap_or_default()
}

fn placement_nodes(task: &Task) -> Vec<String> {
    task.spec
        .placement
        .as_ref()
        .map(|p| p.nodes.clone())
        .unwrap_or_default()
}

fn raw_template(name: &str, replicas: i32, requests: Value, selector: Value) -> Value {
    json!({
        "name": name,
        "agentType": "Raw",
        "role": "Rollout",
        "nodeSelector": selector,
        "raw": {"entrypoint": ["/bin/true"], "replicas": replicas, "resources": {"requests": requests}},
    })
}

fn config() -> ControllerConfig {
    ControllerConfig {
        unschedulable_requeue: Duration::from_secs(2),
        component: "test".into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_task_job_placed_across_two_clusters_runs_and_succeeds() -> anyhow::Result<()> {
    let h = Harness::start(config()).await?;
    for n in ["a1", "a2"] {
        h.node(
            "a",
            n,
            &[("gpu", "a100")],
            &[("cpu", "8"), ("memory", "32Gi"), ("nvidia.com/gpu", "2")],
        )
        .await?;
    }
    h.node("b", "b1", &[("site", "lab")], &[("cpu", "16")])
        .await?;
    h.node("b", "b2", &[("site", "lab")], &[("cpu", "4")])
        .await?;

    let mut actor = raw_template(
        "actor",
        2,
        json!({"nvidia.com/gpu": "2", "memory": "16Gi"}),
        json!({"gpu": "h100,a100"}),
    );
    actor["head"] = json!(true);
    actor["role"] = json!("Actor");
    let rollout = raw_template("rollout", 3, json!({"cpu": "4"}), json!({"site": "lab"}));
    let env = raw_template("env", 1, json!({"cpu": "6"}), json!({}));
    let created = h
        .create_job(json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
            "metadata": {"name": "rl"},
            "spec": {"domain": "d1", "sshPublicKey": "ssh-ed25519 AAAAtest", "tasks": [actor, rollout, env]},
        }))
        .await?;

    let tasks = h.wait_tasks("rl", 3).await?;
    let by_name: BTreeMap<String, &Task> = tasks.iter().map(|t| (t.name_any(), t)).collect();
    let (actor, rollout, env) = (
        by_name["rl-actor"],
        by_name["rl-rollout"],
        by_name["rl-env"],
    );
    assert_eq!(actor.namespace().as_deref(), Some("rlark-a"));
    assert_eq!(placement_nodes(actor), vec!["a1", "a2"]);
    assert_eq!(rollout.namespace().as_deref(), Some("rlark-b"));
    assert_eq!(
        placement_nodes(rollout),
        vec!["b1", "b2", "b1"],
        "spread, b2 holds one"
    );
    assert_eq!(
        env.namespace().as_deref(),
        Some("rlark-a"),
        "clusters the job uses, in ID order"
    );
    assert_eq!(placement_nodes(env), vec!["a1"]);
    for task in [actor, rollout, env] {
        assert_eq!(
            task.labels().get(labels::JOB).map(String::as_str),
            Some("rl")
        );
        let owner = &task.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Job", "rl"));
        assert_eq!(Some(owner.uid.as_str()), created.metadata.uid.as_deref());
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(task.spec.domain.as_deref(), Some("d1"));
        assert_eq!(
            task.spec.ssh_public_key.as_deref(),
            Some("ssh-ed25519 AAAAtest")
        );
        assert_eq!(annotation(task, labels::RAY_TOTAL_NODES), "6");
        assert_eq!(annotation(task, labels::RAY_HEAD_TASK_NAME), "rl-actor");
        let cluster = task.spec.placement.as_ref().map(|p| p.cluster_id.clone());
        assert_eq!(cluster.map(|c| format!("rlark-{c}")), task.namespace());
    }
    assert_eq!(annotation(actor, labels::RAY_ROLE), "head");
    assert_eq!(annotation(rollout, labels::RAY_ROLE), "worker");
    assert_eq!(annotation(actor, labels::RAY_NODE_RANK_START), "0");
    assert_eq!(annotation(rollout, labels::RAY_NODE_RANK_START), "2");
    assert_eq!(annotation(env, labels::RAY_NODE_RANK_START), "5");

    let job = h
        .wait_job("rl", "scheduled", |j| {
            condition(j, "Scheduled").is_some_and(|c| c.status == "True")
        })
        .await?;
    assert_eq!(job_phase(&job), Some(JobPhase::Pending));
    assert!(
        condition(&job, "Scheduled")
            .unwrap()
            .message
            .contains("actor → cluster \"a\" (a1, a2)")
    );

    h.set_task_phase("rlark-a", "rl-actor", TaskPhase::Running, None)
        .await?;
    let job = h.wait_job_phase("rl", JobPhase::Running).await?;
    let status = job.status.clone().unwrap_or_default();
    assert!(status.start_time.is_some());
    assert_eq!(status.tasks.len(), 3);
    assert_eq!(status.tasks[0].name, "actor");

    h.set_task_phase("rlark-a", "rl-actor", TaskPhase::Succeeded, Some("done"))
        .await?;
    h.set_task_phase("rlark-b", "rl-rollout", TaskPhase::Succeeded, None)
        .await?;
    h.set_task_phase("rlark-a", "rl-env", TaskPhase::Succeeded, None)
        .await?;
    let job = h.wait_job_phase("rl", JobPhase::Succeeded).await?;
    let status = job.status.clone().unwrap_or_default();
    assert!(status.end_time.is_some());
    assert_eq!(status.tasks[0].message.as_deref(), Some("done"));
    assert!(
        status
            .tasks
            .iter()
            .all(|t| t.phase == Some(TaskPhase::Succeeded))
    );
    assert_eq!(
        condition(&job, "Complete").map(|c| c.status.as_str()),
        Some("True")
    );

    // Events explain it.
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    let reasons = eventually("job events", || async {
        let list = events.list(&ListParams::default()).await?.items;
        let reasons: Vec<String> = list
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("rl"))
            .filter_map(|e| e.reason.clone())
            .collect();
        Ok(reasons.iter().any(|r| r == "Completed").then_some(reasons))
    })
    .await?;
    for reason in ["Pending", "Scheduled", "Running", "Completed"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} missing from {reasons:?}"
        );
    }
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_task_fails_the_job_and_restart_reruns_it() -> anyhow::Result<()> {
    let h = Harness::start(config()).await?;
    h.node("a", "a1", &[], &[("cpu", "4")]).await?;
    h.create_job(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": "fx"},
        "spec": {"tasks": [
            raw_template("a", 1, json!({"cpu": "1"}), json!({})),
            raw_template("b", 1, json!({"cpu": "1"}), json!({})),
        ]},
    }))
    .await?;
    let first = h.wait_tasks("fx", 2).await?;
    h.set_task_phase("rlark-a", "fx-a", TaskPhase::Running, None)
        .await?;
    h.set_task_phase("rlark-a", "fx-b", TaskPhase::Failed, Some("exit code 1"))
        .await?;
    let job = h.wait_job_phase("fx", JobPhase::Failed).await?;
    let failed = condition(&job, "Failed").context("Failed condition")?;
    assert_eq!(failed.status, "True");
    assert_eq!(failed.message, "task \"b\" failed: exit code 1");
    assert!(
        job.status
            .as_ref()
            .and_then(|s| s.end_time.as_ref())
            .is_some()
    );
    // The rest of the broken gang is stopped.
    eventually("fx-a stopped", || async {
        Ok(h.tasks("rlark-a")
            .get("fx-a")
            .await?
            .spec
            .stopped
            .then_some(()))
    })
    .await?;

    // Restart.
    let patch =
        json!({"metadata": {"annotations": {labels::RESTARTED_AT: "2030-01-01T00:00:00Z"}}});
    h.jobs()
        .patch("fx", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let old_uids: Vec<String> = first
        .iter()
        .filter_map(|t| t.metadata.uid.clone())
        .collect();
    let fresh = eventually("fresh tasks of fx", || async {
        let tasks = h.tasks_of("fx").await?;
        let fresh = tasks.len() == 2
            && tasks.iter().all(|t| {
                t.metadata
                    .uid
                    .as_ref()
                    .is_some_and(|u| !old_uids.contains(u))
            });
        Ok(fresh.then_some(tasks))
    })
    .await?;
    assert!(fresh.iter().all(|t| !t.spec.stopped
        && matches!(
            t.status.as_ref().and_then(|s| s.phase),
            None | Some(TaskPhase::Pending)
        )));
    let job = h
        .wait_job("fx", "restarted and placed", |j| {
            job_phase(j) == Some(JobPhase::Pending)
                && condition(j, "Scheduled").is_some_and(|c| c.status == "True")
        })
        .await?;
    let status = job.status.clone().unwrap_or_default();
    assert_eq!(
        status.observed_restarted_at.as_deref(),
        Some("2030-01-01T00:00:00Z")
    );
    assert!(status.end_time.is_none() && status.start_time.is_none());
    assert!(condition(&job, "Failed").is_none());

    for t in ["fx-a", "fx-b"] {
        h.set_task_phase("rlark-a", t, TaskPhase::Succeeded, None)
            .await?;
    }
    h.wait_job_phase("fx", JobPhase::Succeeded).await?;
    assert_eq!(h.tasks_of("fx").await?.len(), 2, "no duplicate tasks");
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_resume() -> anyhow::Result<()> {
    let h = Harness::start(config()).await?;
    h.node("a", "a1", &[], &[("cpu", "4")]).await?;
    h.create_job(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": "st"},
        "spec": {"tasks": [raw_template("w", 2, json!({"cpu": "1"}), json!({}))]},
    }))
    .await?;
    h.wait_tasks("st", 1).await?;
    h.set_task_phase("rlark-a", "st-w", TaskPhase::Running, None)
        .await?;
    h.wait_job_phase("st", JobPhase::Running).await?;

    let stop = json!({"spec": {"stopped": true}});
    h.jobs()
        .patch("st", &PatchParams::default(), &Patch::Merge(&stop))
        .await?;
    eventually("st-w told to stop", || async {
        Ok(h.tasks("rlark-a")
            .get("st-w")
            .await?
            .spec
            .stopped
            .then_some(()))
    })
    .await?;
    // Still Running while the task runs.
    let job = h.jobs().get("st").await?;
    assert_eq!(job_phase(&job), Some(JobPhase::Running));
    h.set_task_phase("rlark-a", "st-w", TaskPhase::Stopped, None)
        .await?;
    let job = h.wait_job_phase("st", JobPhase::Stopped).await?;
    assert!(
        job.status
            .as_ref()
            .and_then(|s| s.end_time.as_ref())
            .is_some()
    );

    let resume = json!({"spec": {"stopped": false}});
    h.jobs()
        .patch("st", &PatchParams::default(), &Patch::Merge(&resume))
        .await?;
    let job = h.wait_job_phase("st", JobPhase::Pending).await?;
    assert!(
        job.status
            .as_ref()
            .and_then(|s| s.end_time.as_ref())
            .is_none()
    );
    eventually("st-w resumed", || async {
        Ok((!h.tasks("rlark-a").get("st-w").await?.spec.stopped).then_some(()))
    })
    .await?;
    h.set_task_phase("rlark-a", "st-w", TaskPhase::Running, None)
        .await?;
    h.wait_job_phase("st", JobPhase::Running).await?;
    assert_eq!(h.tasks_of("st").await?.len(), 1);
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_job_waits_unschedulable_then_starts_when_a_gpu_appears() -> anyhow::Result<()> {
    // A long requeue: only the Node watch can wake the Job in time.
    let h = Harness::start(ControllerConfig {
        unschedulable_requeue: Duration::from_secs(3600),
        ..config()
    })
    .await?;
    for n in ["g1", "g2"] {
        h.node(
            "gpu-a",
            n,
            &[("pool", "gpu")],
            &[("nvidia.com/gpu", "1"), ("cpu", "8")],
        )
        .await?;
    }
    h.node("gpu-a", "c1", &[("pool", "cpu")], &[("cpu", "8")])
        .await?;
    h.create_job(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
        "metadata": {"name": "big"},
        "spec": {"tasks": [
            // Fits alone; the gang must not start it.
            raw_template("actor", 1, json!({"cpu": "1"}), json!({})),
            raw_template("rollout", 3, json!({"nvidia.com/gpu": "1"}), json!({"pool": "gpu"})),
        ]},
    }))
    .await?;
    let job = h
        .wait_job("big", "unschedulable", |j| {
            condition(j, "Unschedulable").is_some_and(|c| c.status == "True")
        })
        .await?;
    assert_eq!(job_phase(&job), Some(JobPhase::Pending));
    let message = &condition(&job, "Unschedulable").unwrap().message;
    assert_eq!(
        message,
        "task \"rollout\" (3 replicas) does not fit: needs nvidia.com/gpu=1 per replica; \
         cluster \"gpu-a\" fits 2 (nvidia.com/gpu: 2 free on 2 eligible nodes); \
         1 node excluded by nodeSelector pool=gpu"
    );
    assert_eq!(
        condition(&job, "Scheduled").map(|c| c.status.as_str()),
        Some("False")
    );
    assert!(
        h.tasks_of("big").await?.is_empty(),
        "gang: no task of a job that does not fit"
    );
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    eventually("FailedScheduling event", || async {
        let list = events.list(&ListParams::default()).await?.items;
        Ok(list
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.message.as_deref() == Some(message.as_str())
            })
            .then_some(()))
    })
    .await?;
    // Still nothing a moment later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(h.tasks_of("big").await?.is_empty());

    h.node(
        "gpu-a",
        "g3",
        &[("pool", "gpu")],
        &[("nvidia.com/gpu", "1")],
    )
    .await?;
    let tasks = h.wait_tasks("big", 2).await?;
    let rollout = tasks
        .iter()
        .find(|t| t.name_any() == "big-rollout")
        .context("rollout")?;
    assert_eq!(placement_nodes(rollout), vec!["g1", "g2", "g3"]);
    let job = h
        .wait_job("big", "scheduled", |j| {
            condition(j, "Scheduled").is_some_and(|c| c.status == "True")
        })
        .await?;
    assert_eq!(
        condition(&job, "Unschedulable").map(|c| c.status.as_str()),
        Some("False")
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_diamond_listed_out_of_order_succeeds() -> anyhow::Result<()> {
    let h = Harness::start(config()).await?;
    h.node("a", "a1", &[], &[("cpu", "64")]).await?;
    let job_spec = json!({"tasks": [raw_template("main", 1, json!({"cpu": "1"}), json!({}))]});
    let wf: Workflow = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "wf"},
        "spec": {"jobTemplates": [
            {"name": "report", "dependencies": ["eval-a", "eval-b"], "spec": job_spec},
            {"name": "eval-b", "dependencies": ["train"], "spec": job_spec},
            {"name": "train", "spec": job_spec},
            {"name": "eval-a", "dependencies": ["train"], "spec": job_spec},
        ]},
    }))?;
    let workflows: Api<Workflow> = Api::all(h.client.clone());
    let wf = workflows.create(&PostParams::default(), &wf).await?;

    let job_names = || async {
        let mut names: Vec<String> = h
            .jobs()
            .list(&ListParams::default().labels(&format!("{}=wf", labels::WORKFLOW)))
            .await?
            .items
            .iter()
            .map(|j| j.name_any())
            .collect();
        names.sort();
        anyhow::Ok(names)
    };
    let succeed = |job: &'static str| {
        let h = &h;
        async move {
            h.wait_tasks(job, 1).await?;
            h.set_task_phase(
                "rlark-a",
                &format!("{job}-main"),
                TaskPhase::Succeeded,
                None,
            )
            .await?;
            h.wait_job_phase(job, JobPhase::Succeeded).await?;
            anyhow::Ok(())
        }
    };

    let train = h.wait_job("wf-train", "created", |_| true).await?;
    assert_eq!(
        train.labels().get(labels::WORKFLOW).map(String::as_str),
        Some("wf")
    );
    assert_eq!(
        train.owner_references()[0].uid,
        wf.metadata.uid.clone().unwrap_or_default()
    );
    assert_eq!(job_names().await?, vec!["wf-train"]);
    let status = eventually("workflow running", || async {
        let w = workflows.get("wf").await?;
        Ok(w.status.filter(|s| s.phase == Some(WorkflowPhase::Running)))
    })
    .await?;
    assert_eq!(
        status.jobs[0].message.as_deref(),
        Some("waiting for \"eval-a\", \"eval-b\"")
    );

    succeed("wf-train").await?;
    eventually("evals created", || async {
        let names = job_names().await?;
        Ok((names.len() == 3).then_some(names))
    })
    .await?;
    assert_eq!(
        job_names().await?,
        vec!["wf-eval-a", "wf-eval-b", "wf-train"]
    );
    succeed("wf-eval-a").await?;
    // report waits for eval-b.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(job_names().await?.len(), 3);
    succeed("wf-eval-b").await?;
    succeed("wf-report").await?;

    let status = eventually("workflow succeeded", || async {
        let w = workflows.get("wf").await?;
        Ok(w.status
            .filter(|s| s.phase == Some(WorkflowPhase::Succeeded)))
    })
    .await?;
    assert!(
        status
            .jobs
            .iter()
            .all(|j| j.phase == Some(JobPhase::Succeeded))
    );
    assert!(status.start_time.is_some() && status.end_time.is_some());
    assert_eq!(job_names().await?.len(), 4, "no duplicate jobs");
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_stops_its_running_jobs_and_resumes() -> anyhow::Result<()> {
    let h = Harness::start(config()).await?;
    h.node("a", "a1", &[], &[("cpu", "64")]).await?;
    let job_spec = json!({"tasks": [raw_template("main", 1, json!({"cpu": "1"}), json!({}))]});
    let wf: Workflow = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Workflow",
        "metadata": {"name": "sw"},
        "spec": {"jobTemplates": [
            {"name": "next", "dependencies": ["first"], "spec": job_spec},
            {"name": "first", "spec": job_spec},
        ]},
    }))?;
    let workflows: Api<Workflow> = Api::all(h.client.clone());
    workflows.create(&PostParams::default(), &wf).await?;
    h.wait_tasks("sw-first", 1).await?;
    h.set_task_phase("rlark-a", "sw-first-main", TaskPhase::Running, None)
        .await?;
    h.wait_job_phase("sw-first", JobPhase::Running).await?;

    let stop = json!({"spec": {"stopped": true}});
    workflows
        .patch("sw", &PatchParams::default(), &Patch::Merge(&stop))
        .await?;
    h.wait_job("sw-first", "stopped by the workflow", |j| j.spec.stopped)
        .await?;
    eventually("task told to stop", || async {
        Ok(h.tasks("rlark-a")
            .get("sw-first-main")
            .await?
            .spec
            .stopped
            .then_some(()))
    })
    .await?;
    h.set_task_phase("rlark-a", "sw-first-main", TaskPhase::Stopped, None)
        .await?;
    h.wait_job_phase("sw-first", JobPhase::Stopped).await?;
    eventually("workflow stopped", || async {
        let w = workflows.get("sw").await?;
        Ok(w.status.filter(|s| s.phase == Some(WorkflowPhase::Stopped)))
    })
    .await?;

    let resume = json!({"spec": {"stopped": false}});
    workflows
        .patch("sw", &PatchParams::default(), &Patch::Merge(&resume))
        .await?;
    h.wait_job("sw-first", "resumed", |j| !j.spec.stopped)
        .await?;
    h.wait_job_phase("sw-first", JobPhase::Pending).await?;
    h.set_task_phase("rlark-a", "sw-first-main", TaskPhase::Succeeded, None)
        .await?;
    h.wait_job_phase("sw-first", JobPhase::Succeeded).await?;
    h.wait_tasks("sw-next", 1).await?;
    h.set_task_phase("rlark-a", "sw-next-main", TaskPhase::Succeeded, None)
        .await?;
    eventually("workflow succeeded", || async {
        let w = workflows.get("sw").await?;
        Ok(w.status
            .filter(|s| s.phase == Some(WorkflowPhase::Succeeded)))
    })
    .await?;
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_jobs_never_share_capacity() -> anyhow::Result<()> {
    // A long requeue: only a finished Task can wake the waiting Job in time.
    let h = Harness::start(ControllerConfig {
        unschedulable_requeue: Duration::from_secs(3600),
        ..config()
    })
    .await?;
    for n in ["g1", "g2", "g3"] {
        h.node("a", n, &[], &[("nvidia.com/gpu", "1")]).await?;
    }
    let job = |name: &str| {
        json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [raw_template("r", 2, json!({"nvidia.com/gpu": "1"}), json!({}))]},
        })
    };
    let (a, b) = tokio::join!(h.create_job(job("one")), h.create_job(job("two")));
    a?;
    b?;
    let settled = |j: &Job| {
        condition(j, "Scheduled").is_some_and(|c| c.status == "True")
            || condition(j, "Unschedulable").is_some_and(|c| c.status == "True")
    };
    let one = h
        .wait_job("one", "placed or unschedulable", settled)
        .await?;
    let two = h
        .wait_job("two", "placed or unschedulable", settled)
        .await?;
    let placed = |j: &Job| condition(j, "Scheduled").is_some_and(|c| c.status == "True");
    assert!(placed(&one) != placed(&two), "exactly one of the two fits");
    let (winner, loser) = if placed(&one) {
        ("one", "two")
    } else {
        ("two", "one")
    };
    assert_eq!(h.tasks_of(winner).await?.len(), 1);
    assert!(h.tasks_of(loser).await?.is_empty());

    // The winner finishes: its GPUs free up and the loser is placed.
    h.set_task_phase(
        "rlark-a",
        &format!("{winner}-r"),
        TaskPhase::Succeeded,
        None,
    )
    .await?;
    let tasks = h.wait_tasks(loser, 1).await?;
    assert_eq!(placement_nodes(&tasks[0]).len(), 2);
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_controllers_converge_without_duplicates() -> anyhow::Result<()> {
    let mut h = Harness::start(config()).await?;
    h.node("a", "a1", &[], &[("cpu", "64")]).await?;
    h.node("b", "b1", &[("zone", "b")], &[("cpu", "64")])
        .await?;
    let names: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    for name in &names {
        h.create_job(json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [
                raw_template("x", 2, json!({"cpu": "1"}), json!({})),
                raw_template("y", 1, json!({"cpu": "1"}), json!({"zone": "b"})),
                raw_template("z", 1, json!({"cpu": "1"}), json!({})),
            ]},
        }))
        .await?;
    }
    // Kill the controllers at varied points of their work, restart them each time.
    for pause_ms in [5, 15, 30, 60, 120] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        h.kill_controllers().await;
        h.spawn_controllers();
    }
    for name in &names {
        h.wait_job(name, "scheduled", |j| {
            condition(j, "Scheduled").is_some_and(|c| c.status == "True")
        })
        .await?;
        let tasks = h.tasks_of(name).await?;
        let mut task_names: Vec<String> = tasks.iter().map(|t| t.name_any()).collect();
        task_names.sort();
        assert_eq!(
            task_names,
            vec![
                format!("{name}-x"),
                format!("{name}-y"),
                format!("{name}-z")
            ]
        );
        let y = tasks
            .iter()
            .find(|t| t.name_any() == format!("{name}-y"))
            .context("y")?;
        assert_eq!(y.namespace().as_deref(), Some("rlark-b"));
    }
    // And they still drive the Jobs to the end.
    h.kill_controllers().await;
    h.spawn_controllers();
    for name in &names {
        for task in h.tasks_of(name).await? {
            let ns = task.namespace().unwrap_or_default();
            h.set_task_phase(&ns, &task.name_any(), TaskPhase::Succeeded, None)
                .await?;
        }
    }
    for name in &names {
        h.wait_job_phase(name, JobPhase::Succeeded).await?;
        assert_eq!(h.tasks_of(name).await?.len(), 3);
    }
    h.stop().await
}
