//! The simulated agent against a real in-process server, without controllers: Tasks are
//! placed by hand here.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rlark_api::types::{NodePhase, Pod, PodPhase, Task};
use rlark_sim::{Behaviour, SimAgent, SimNode};
use rlark_testkit::TestServer;
use rlark_testkit::wait::eventually;
use serde_json::json;

fn placed_task(name: &str, nodes: &[&str]) -> anyhow::Result<Task> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Task",
        "metadata": {"name": name, "namespace": "rlark-a"},
        "spec": {
            "agentType": "Raw",
            "role": "Actor",
            "raw": {"entrypoint": ["true"], "replicas": nodes.len()},
            "placement": {"clusterID": "a", "nodes": nodes},
        }
    }))?)
}

async fn pod_phases(pods: &Api<Pod>, task: &str) -> anyhow::Result<Vec<Option<PodPhase>>> {
    let list = pods
        .list(&ListParams::default().labels(&format!("rlark.io/task-name={task}")))
        .await?;
    Ok(list
        .items
        .iter()
        .map(|p| p.status.as_ref().and_then(|s| s.phase))
        .collect())
}

async fn wait_phases(pods: &Api<Pod>, task: &str, want: &[Option<PodPhase>]) -> anyhow::Result<()> {
    eventually(&format!("pods of {task} to be {want:?}"), || async {
        let phases = pod_phases(pods, task).await?;
        Ok((phases == want).then_some(()))
    })
    .await
}

#[tokio::test]
async fn sim_agent_speaks_the_agent_protocol() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let agent = SimAgent::builder("a")
        .node(
            SimNode::new("n1")
                .resource("nvidia.com/gpu", "2")
                .resource("cpu", "8"),
        )
        .heartbeat_interval(Duration::from_millis(100))
        .behaviour("t-ok", Behaviour::succeed_after(Duration::from_millis(100)))
        .behaviour("t-fail", Behaviour::fail_after(Duration::ZERO, 3))
        .behaviour("t-run*", Behaviour::run_forever())
        .start(client.clone())
        .await?;

    // Node registered Online with its resources; Lease renewed.
    let nodes: Api<rlark_api::types::Node> = Api::namespaced(client.clone(), "rlark-a");
    let node = nodes.get("n1").await?;
    let status = node.status.context("node status")?;
    assert_eq!(status.phase, Some(NodePhase::Online));
    assert_eq!(status.allocatable["nvidia.com/gpu"].0, "2");
    assert_eq!(
        node.metadata.labels.context("labels")?["rlark.io/cluster-id"],
        "a"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "rlark-a");
    let renew = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let first = renew(leases.get("node-n1").await?).context("renewTime")?;
    eventually("lease renewed", || async {
        let now = renew(leases.get("node-n1").await?);
        Ok(now.filter(|t| *t > first))
    })
    .await?;

    let tasks: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rlark-a");
    let pp = PostParams::default();
    tasks
        .create(&pp, &placed_task("t-ok", &["n1", "n1"])?)
        .await?;
    tasks.create(&pp, &placed_task("t-fail", &["n1"])?).await?;
    tasks.create(&pp, &placed_task("t-run", &["n1"])?).await?;
    // A Task placed elsewhere is not this agent's.
    let mut other = placed_task("t-other", &["x"])?;
    other
        .spec
        .placement
        .as_mut()
        .context("placement")?
        .cluster_id = "b".into();
    tasks.create(&pp, &other).await?;

    let ok = Some(PodPhase::Succeeded);
    wait_phases(&pods, "t-ok", &[ok, ok]).await?;
    wait_phases(&pods, "t-fail", &[Some(PodPhase::Failed)]).await?;
    let failed = pods.get("t-fail-0").await?.status.context("status")?;
    assert_eq!(failed.exit_code, Some(3));
    assert_eq!(failed.node.as_deref(), Some("n1"));
    wait_phases(&pods, "t-run", &[Some(PodPhase::Running)]).await?;
    let running = pods.get("t-run-0").await?;
    assert_eq!(running.spec.replica_index, Some(0));
    assert!(running.status.context("status")?.start_time.is_some());
    assert!(pod_phases(&pods, "t-other").await?.is_empty());

    // Stop ends the replica as Failed/Stopped; resume starts a fresh run.
    let runs_before = agent.runs_started();
    let stop = |stopped: bool| json!({"spec": {"stopped": stopped}});
    let params = PatchParams::default();
    tasks
        .patch("t-run", &params, &Patch::Merge(&stop(true)))
        .await?;
    wait_phases(&pods, "t-run", &[Some(PodPhase::Failed)]).await?;
    let stopped = pods.get("t-run-0").await?.status.context("status")?;
    assert_eq!(stopped.reason.as_deref(), Some("Stopped"));
    tasks
        .patch("t-run", &params, &Patch::Merge(&stop(false)))
        .await?;
    wait_phases(&pods, "t-run", &[Some(PodPhase::Running)]).await?;
    assert_eq!(agent.runs_started(), runs_before + 1);

    // A restart annotation reruns a finished Task.
    let restart =
        json!({"metadata": {"annotations": {"rlark.io/restarted-at": "2030-01-01T00:00:00Z"}}});
    agent.set_behaviour("t-fail", Behaviour::succeed_after(Duration::ZERO));
    tasks
        .patch("t-fail", &params, &Patch::Merge(&restart))
        .await?;
    wait_phases(&pods, "t-fail", &[Some(PodPhase::Succeeded)]).await?;

    // Deleting a Task deletes its Pods.
    tasks.delete("t-run", &DeleteParams::default()).await?;
    wait_phases(&pods, "t-run", &[]).await?;

    // A node added at run time is registered at once.
    agent
        .add_node(SimNode::new("n2").resource("nvidia.com/gpu", "1"))
        .await?;
    assert!(nodes.get("n2").await?.status.is_some());

    // Paused heartbeats stop the Lease.
    agent.pause_heartbeats();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let frozen = renew(leases.get("node-n1").await?);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(renew(leases.get("node-n1").await?), frozen);

    agent.stop().await?;
    server.stop().await?;
    Ok(())
}

/// The protocol's replica state machine decides what a simulated replica does after its
/// process ends: with `restartPolicy: OnFailure` a failing replica stays `Running` with
/// reason `BackOff` and restarts (1 s later), as a real agent's would.
#[tokio::test]
async fn sim_replicas_restart_as_their_restart_policy_says() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let client = server.client().await?;
    let agent = SimAgent::builder("a")
        .node(SimNode::new("n1").resource("cpu", "8"))
        .behaviour("t-crash", Behaviour::fail_after(Duration::ZERO, 2))
        .start(client.clone())
        .await?;
    let mut task = placed_task("t-crash", &["n1"])?;
    task.spec.raw.as_mut().context("raw spec")?.restart_policy =
        rlark_api::types::RestartPolicy::OnFailure;
    let tasks: Api<Task> = Api::namespaced(client.clone(), "rlark-a");
    tasks.create(&PostParams::default(), &task).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "rlark-a");
    let backoff = eventually("t-crash-0 backing off", || async {
        Ok(pods
            .get_opt("t-crash-0")
            .await?
            .and_then(|p| p.status)
            .filter(|s| s.reason.as_deref() == Some("BackOff")))
    })
    .await?;
    assert_eq!(backoff.phase, Some(PodPhase::Running));
    assert_eq!(backoff.exit_code, Some(2));
    eventually("t-crash-0 restarted", || async {
        Ok(pods
            .get_opt("t-crash-0")
            .await?
            .and_then(|p| p.status)
            .filter(|s| s.restart_count.is_some_and(|n| n >= 1)))
    })
    .await?;
    assert_eq!(agent.runs_started(), 1, "a restart is not a new run");
    agent.stop().await?;
    server.stop().await?;
    Ok(())
}
