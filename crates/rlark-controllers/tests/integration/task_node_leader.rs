//! The Task and Node controllers and leader election against a real in-process server,
//! with hand-written Pods, Nodes and Leases (what an agent would write).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Event, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, MicroTime, ObjectMeta, OwnerReference, Time,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rlark_api::types::{
    AgentType, Job, Node, NodeLostPolicy, NodePhase, NodeSpec, Pod, PodSpec, Task, TaskPhase,
    TaskPlacement,
};
use rlark_controllers::leader::LeaderElector;
use rlark_controllers::manager::{Manager, ManagerOptions};
use rlark_controllers::{Context, ControllerConfig, node, task};
use rlark_testkit::TestServer;
use rlark_testkit::wait::eventually;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NS: &str = "rlark-c1";

async fn namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .context("create namespace")?;
    Ok(())
}

fn raw_task(name: &str, replicas: i32, nodes: &[&str]) -> Task {
    let mut task = Task::new(
        name,
        serde_json::from_value(json!({
            "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": ["train"], "replicas": replicas}
        }))
        .expect("task spec"),
    );
    task.metadata.namespace = Some(NS.into());
    task.spec.placement = Some(TaskPlacement {
        cluster_id: "c1".into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    });
    task
}

async fn create_pod(
    client: &kube::Client,
    task: &str,
    index: i32,
    status: serde_json::Value,
) -> anyhow::Result<()> {
    let name = format!("{task}-{index}");
    let mut pod = Pod::new(
        &name,
        PodSpec {
            task_namespace: Some(NS.into()),
            task_name: Some(task.into()),
            replica_index: Some(index),
            ..Default::default()
        },
    );
    pod.metadata.namespace = Some(NS.into());
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.create(&PostParams::default(), &pod).await?;
    set_pod(client, task, index, status).await
}

async fn set_pod(
    client: &kube::Client,
    task: &str,
    index: i32,
    status: serde_json::Value,
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    api.patch_status(
        &format!("{task}-{index}"),
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await?;
    Ok(())
}

async fn task_where(
    client: &kube::Client,
    name: &str,
    what: &str,
    pred: impl Fn(&Task) -> bool,
) -> anyhow::Result<Task> {
    let api: Api<Task> = Api::namespaced(client.clone(), NS);
    let pred = &pred;
    eventually(what, || {
        let api = api.clone();
        async move { Ok(api.get_opt(name).await?.filter(|t| pred(t))) }
    })
    .await
}

fn phase(task: &Task) -> Option<TaskPhase> {
    task.status.as_ref().and_then(|s| s.phase)
}

async fn events_of(client: &kube::Client, name: &str) -> anyhow::Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list.items)
}

fn start(
    client: &kube::Client,
    config: ControllerConfig,
) -> (
    Arc<Context>,
    CancellationToken,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let ctx = Arc::new(Context::new(client.clone(), config));
    let token = CancellationToken::new();
    let handles = vec![
        tokio::spawn(task::run(ctx.clone(), token.clone())),
        tokio::spawn(node::run(ctx.clone(), token.clone())),
    ];
    (ctx, token, handles)
}

async fn stop(token: CancellationToken, handles: Vec<tokio::task::JoinHandle<()>>) {
    token.cancel();
    for handle in handles {
        let _ = tokio::time::timeout(Duration::from_secs(10), handle).await;
    }
}

#[tokio::test]
async fn task_status_is_aggregated_from_its_pods() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    namespace(&client, NS).await?;
    let tasks: Api<Task> = Api::namespaced(client.clone(), NS);
    tasks
        .create(&PostParams::default(), &raw_task("ok", 2, &["n1", "n2"]))
        .await?;
    tasks
        .create(&PostParams::default(), &raw_task("bad", 1, &["n1"]))
        .await?;
    // Someone else's condition, to be kept.
    let foreign = Condition {
        type_: "Scheduled".into(),
        status: "True".into(),
        reason: "Placed".into(),
        message: "placed on n1, n2".into(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    };
    tasks
        .patch_status(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [foreign]}})),
        )
        .await?;

    let (ctx, token, handles) = start(&client, ControllerConfig::default());

    // A new Task is Pending from its creation (the API server's initial status); the
    // controller's first write adds the replica counts.
    let t = task_where(&client, "ok", "ok Pending with its replicas counted", |t| {
        phase(t) == Some(TaskPhase::Pending) && t.status.as_ref().and_then(|s| s.replicas).is_some()
    })
    .await?;
    let status = t.status.clone().unwrap_or_default();
    assert_eq!(status.replicas, Some(2));
    assert_eq!(status.ready_replicas, Some(0));

    let now = Timestamp::now();
    for (index, node) in [(0, "n1"), (1, "n2")] {
        create_pod(
            &client,
            "ok",
            index,
            json!({"phase": "Running", "node": node, "startTime": Time(now), "restartCount": index}),
        )
        .await?;
    }
    let t = task_where(&client, "ok", "ok Running with 2 ready", |t| {
        phase(t) == Some(TaskPhase::Running)
            && t.status.as_ref().and_then(|s| s.ready_replicas) == Some(2)
    })
    .await?;
    let status = t.status.clone().unwrap_or_default();
    assert_eq!(status.observed_nodes, ["n1", "n2"]);
    assert_eq!(status.retry_count, Some(1));
    assert!(status.start_time.is_some());
    assert_eq!(status.conditions.len(), 1, "{:?}", status.conditions);
    assert_eq!(status.conditions[0].type_, "Scheduled");

    for index in [0, 1] {
        set_pod(
            &client,
            "ok",
            index,
            json!({"phase": "Succeeded", "exitCode": 0, "finishTime": Time(Timestamp::now())}),
        )
        .await?;
    }
    let t = task_where(&client, "ok", "ok Succeeded", |t| {
        phase(t) == Some(TaskPhase::Succeeded)
    })
    .await?;
    let status = t.status.clone().unwrap_or_default();
    assert_eq!(status.succeeded_replicas, Some(2));
    assert!(status.completion_time.is_some());
    assert_eq!(status.conditions[0].type_, "Scheduled");

    create_pod(
        &client,
        "bad",
        0,
        json!({"phase": "Failed", "node": "n1", "exitCode": 3, "message": "CUDA out of memory"}),
    )
    .await?;
    let t = task_where(&client, "bad", "bad Failed", |t| {
        phase(t) == Some(TaskPhase::Failed)
    })
    .await?;
    let message = t.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("exit code 3"), "{message}");
    assert!(message.contains("CUDA out of memory"), "{message}");
    assert!(message.contains("n1"), "{message}");

    // Events on the transitions, visible by field selector (as `describe` reads them).
    let reasons = |events: Vec<Event>| -> Vec<String> {
        events.into_iter().filter_map(|e| e.reason).collect()
    };
    let ok_events = eventually("events of ok", || async {
        let r = reasons(events_of(&client, "ok").await?);
        Ok(
            (r.contains(&"Running".to_string()) && r.contains(&"Succeeded".to_string()))
                .then_some(r),
        )
    })
    .await?;
    assert!(!ok_events.contains(&"Failed".to_string()), "{ok_events:?}");
    let bad = eventually("events of bad", || async {
        let events = events_of(&client, "bad").await?;
        Ok(events
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Failed")))
    })
    .await?;
    assert_eq!(bad.type_.as_deref(), Some("Warning"));
    assert!(ctx.metrics.reconciles(task::CONTROLLER, "success") > 0);

    stop(token, handles).await;
    server.stop().await
}

async fn heartbeat(client: &kube::Client, node: &str, at: Timestamp) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);
    let name = format!("node-{node}");
    let spec = LeaseSpec {
        holder_identity: Some(node.into()),
        lease_duration_seconds: Some(2),
        renew_time: Some(MicroTime(at)),
        ..Default::default()
    };
    match leases.get_opt(&name).await? {
        Some(_) => {
            leases
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": spec})),
                )
                .await?;
        }
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: Some(NS.into()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await?;
        }
    }
    Ok(())
}

fn node_phase(node: &Node) -> (Option<NodePhase>, Option<String>) {
    let status = node.status.clone().unwrap_or_default();
    (status.phase, status.reason)
}

#[tokio::test]
async fn lost_node_goes_offline_and_its_tasks_get_node_lost() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    namespace(&client, NS).await?;
    let nodes: Api<Node> = Api::namespaced(client.clone(), NS);
    let tasks: Api<Task> = Api::namespaced(client.clone(), NS);

    for name in ["n1", "n2"] {
        let mut node = Node::new(
            name,
            NodeSpec {
                agent_type: AgentType::Raw,
                unschedulable: false,
            },
        );
        node.metadata.namespace = Some(NS.into());
        nodes.create(&PostParams::default(), &node).await?;
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"phase": "Online", "heartbeatTime": Time(Timestamp::now())}}),
                ),
            )
            .await?;
        heartbeat(&client, name, Timestamp::now()).await?;
    }
    // On the node that will be lost: a running Task (default policy Fail), one with policy
    // Reschedule, and a finished one (left alone). On the healthy node: one running Task.
    tasks
        .create(&PostParams::default(), &raw_task("fail", 1, &["n1"]))
        .await?;
    // Reschedule, owned by a Job (whose controller, not running here, would recreate it),
    // and Reschedule without a Job (nothing would recreate it: it fails instead).
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Job", "metadata": {"name": "j"},
        "spec": {"tasks": [{"name": "resched", "role": "Actor", "agentType": "Raw",
                            "raw": {"entrypoint": ["train"]}}]}
    }))?;
    let job = Api::<Job>::all(client.clone())
        .create(&PostParams::default(), &job)
        .await?;
    let mut reschedule = raw_task("resched", 1, &["n1"]);
    reschedule.spec.node_lost_policy = Some(NodeLostPolicy::Reschedule);
    reschedule.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "rlinf.io/v1alpha1".into(),
        kind: "Job".into(),
        name: "j".into(),
        uid: job.metadata.uid.clone().context("job uid")?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    tasks.create(&PostParams::default(), &reschedule).await?;
    let mut orphan = raw_task("orphan", 1, &["n1"]);
    orphan.spec.node_lost_policy = Some(NodeLostPolicy::Reschedule);
    tasks.create(&PostParams::default(), &orphan).await?;
    tasks
        .create(&PostParams::default(), &raw_task("done", 1, &["n1"]))
        .await?;
    tasks
        .create(&PostParams::default(), &raw_task("healthy", 1, &["n2"]))
        .await?;
    let running = json!({"phase": "Running", "node": "n1", "startTime": Time(Timestamp::now())});
    create_pod(&client, "fail", 0, running.clone()).await?;
    create_pod(&client, "resched", 0, running.clone()).await?;
    create_pod(&client, "orphan", 0, running).await?;
    create_pod(
        &client,
        "done",
        0,
        json!({"phase": "Succeeded", "node": "n1", "exitCode": 0}),
    )
    .await?;
    create_pod(
        &client,
        "healthy",
        0,
        json!({"phase": "Running", "node": "n2"}),
    )
    .await?;

    let config = ControllerConfig {
        node_grace_period: Duration::from_secs(2),
        node_check_interval: Duration::from_millis(200),
        ..Default::default()
    };
    let (_ctx, token, handles) = start(&client, config);
    task_where(&client, "fail", "fail Running", |t| {
        phase(t) == Some(TaskPhase::Running)
    })
    .await?;
    task_where(&client, "done", "done Succeeded", |t| {
        phase(t) == Some(TaskPhase::Succeeded)
    })
    .await?;

    // n2 keeps heartbeating (through its Lease only); n1 has stopped.
    let beating = CancellationToken::new();
    let beat = {
        let client = client.clone();
        let beating = beating.clone();
        tokio::spawn(async move {
            while !beating.is_cancelled() {
                let _ = heartbeat(&client, "n2", Timestamp::now()).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };

    let n1 = eventually("n1 Offline", || async {
        let node = nodes.get("n1").await?;
        Ok((node_phase(&node).0 == Some(NodePhase::Offline)).then_some(node))
    })
    .await?;
    assert_eq!(
        node_phase(&n1).1.as_deref(),
        Some(node::REASON_HEARTBEAT_LOST)
    );

    let failed = task_where(&client, "fail", "fail Failed with NodeLost", |t| {
        phase(t) == Some(TaskPhase::Failed)
    })
    .await?;
    let status = failed.status.clone().unwrap_or_default();
    let lost = status
        .conditions
        .iter()
        .find(|c| c.type_ == node::CONDITION_NODE_LOST)
        .context("NodeLost condition")?;
    assert_eq!(lost.status, "True");
    assert!(lost.message.contains("n1"), "{}", lost.message);
    assert!(
        status.message.unwrap_or_default().contains("rlark-c1/n1"),
        "message names the node"
    );

    // Reschedule: the Task is deleted, for its Job to place it again.
    eventually("resched deleted", || async {
        Ok(tasks.get_opt("resched").await?.is_none().then_some(()))
    })
    .await?;
    let orphan = task_where(&client, "orphan", "orphan Failed", |t| {
        phase(t) == Some(TaskPhase::Failed)
    })
    .await?;
    let message = orphan.status.and_then(|s| s.message).unwrap_or_default();
    assert!(message.contains("no Job owns"), "{message}");

    // The Task controller does not undo the failure although the (stale) Pod says Running,
    // and the finished and the healthy Tasks are untouched.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(phase(&tasks.get("fail").await?), Some(TaskPhase::Failed));
    let done = tasks.get("done").await?;
    assert_eq!(phase(&done), Some(TaskPhase::Succeeded));
    assert!(done.status.unwrap_or_default().conditions.is_empty());
    let healthy = tasks.get("healthy").await?;
    assert_eq!(phase(&healthy), Some(TaskPhase::Running));
    assert_eq!(
        node_phase(&nodes.get("n2").await?).0,
        Some(NodePhase::Online)
    );

    let events = events_of(&client, "n1").await?;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodeNotReady")),
        "{events:?}"
    );
    for task in ["fail", "resched", "orphan"] {
        let events = events_of(&client, task).await?;
        assert!(
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some(node::CONDITION_NODE_LOST)),
            "{task}: {events:?}"
        );
    }

    // n1 comes back: Online again, with an Event.
    heartbeat(&client, "n1", Timestamp::now()).await?;
    let n1 = eventually("n1 Online again", || async {
        let node = nodes.get("n1").await?;
        Ok((node_phase(&node).0 == Some(NodePhase::Online)).then_some(node))
    })
    .await?;
    assert_eq!(
        node_phase(&n1).1.as_deref(),
        Some(node::REASON_HEARTBEAT_RESTORED)
    );
    eventually("NodeReady event", || async {
        let events = events_of(&client, "n1").await?;
        Ok(events
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("NodeReady")))
    })
    .await?;

    beating.cancel();
    let _ = beat.await;
    stop(token, handles).await;
    server.stop().await
}

fn elector(client: &kube::Client, identity: &str) -> anyhow::Result<LeaderElector> {
    Ok(
        LeaderElector::new(client.clone(), "default", "test-election", identity).with_timings(
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_millis(200),
        )?,
    )
}

#[tokio::test]
async fn exactly_one_leader_and_failover_after_expiry() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let shutdown = CancellationToken::new();
    let a = elector(&client, "a")?;
    let b = elector(&client, "b")?;

    // Both campaign at once; exactly one wins.
    let (won_a, won_b) = {
        let (sa, sb) = (shutdown.clone(), shutdown.clone());
        let a = a.clone();
        let b = b.clone();
        let ta = tokio::spawn(async move { a.acquire(&sa).await });
        let tb = tokio::spawn(async move { b.acquire(&sb).await });
        // The winner returns at once; give the loser a few retry periods to (wrongly) win.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let finished = [ta.is_finished(), tb.is_finished()];
        assert_eq!(
            finished.iter().filter(|f| **f).count(),
            1,
            "exactly one leader: {finished:?}"
        );
        (ta, tb)
    };
    let (leader, mut standby, standby_name) = if won_a.is_finished() {
        (won_a.await?.context("a leads")?, won_b, "b")
    } else {
        (won_b.await?.context("b leads")?, won_a, "a")
    };
    assert!(leader.is_leader());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = leases.get("test-election").await?;
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_ne!(holder.as_deref(), Some(standby_name));

    // The leader keeps renewing: the standby does not take over meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(leader.is_leader());
    assert!(!standby.is_finished());

    // The leader dies without releasing: the standby takes over once the lease expires
    // (3 s after the last renewal).
    let died = tokio::time::Instant::now();
    drop(leader);
    let successor = tokio::time::timeout(Duration::from_secs(10), &mut standby)
        .await
        .context("standby took over")??
        .context("standby leads")?;
    let waited = died.elapsed();
    assert!(
        waited >= Duration::from_millis(2500),
        "took over before expiry: {waited:?}"
    );
    let lease = leases.get("test-election").await?;
    let spec = lease.spec.unwrap_or_default();
    assert_eq!(spec.holder_identity.as_deref(), Some(standby_name));
    assert_eq!(spec.lease_transitions, Some(1));

    // A graceful release lets the next candidate in at once.
    successor.release().await?;
    let c = elector(&client, "c")?;
    let started = tokio::time::Instant::now();
    let c_leads = tokio::time::timeout(Duration::from_secs(2), c.acquire(&shutdown))
        .await
        .context("c acquires a released lease at once")?
        .context("c leads")?;
    assert!(started.elapsed() < Duration::from_secs(2));
    c_leads.release().await?;

    shutdown.cancel();
    server.stop().await
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let shutdown = CancellationToken::new();
    let a = elector(&client, "a")?;
    let leadership = a.acquire(&shutdown).await.context("a leads")?;
    // Someone takes the lease over behind a's back (as after a long pause of a).
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .patch(
            "test-election",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "intruder", "renewTime": MicroTime(Timestamp::now())}})),
        )
        .await?;
    tokio::time::timeout(Duration::from_secs(5), leadership.lost())
        .await
        .context("leadership lost")?;
    assert!(!leadership.is_leader());
    assert!(!*leadership.watch().borrow());
    shutdown.cancel();
    server.stop().await
}

#[tokio::test]
async fn two_managers_one_leader() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let options = ManagerOptions {
        lease_name: "test-managers".into(),
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..Default::default()
    };
    let config = |id: &str| ControllerConfig {
        identity: id.into(),
        ..Default::default()
    };
    let first = Manager::new(client.clone(), config("m1"), options.clone());
    let second = Manager::new(client.clone(), config("m2"), options);
    let (lead1, lead2) = (first.leading(), second.leading());
    let (stop1, stop2) = (CancellationToken::new(), CancellationToken::new());
    let run1 = tokio::spawn(first.run(stop1.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let run2 = tokio::spawn(second.run(stop2.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(*lead1.borrow(), "the first manager leads");
    assert!(!*lead2.borrow(), "the second one waits");

    // The leader shuts down gracefully: it releases, the other takes over at once.
    stop1.cancel();
    run1.await??;
    assert!(!*lead1.borrow());
    let mut lead2w = lead2.clone();
    tokio::time::timeout(Duration::from_secs(3), lead2w.wait_for(|l| *l))
        .await
        .context("second manager takes over")??;
    stop2.cancel();
    run2.await??;
    server.stop().await
}
