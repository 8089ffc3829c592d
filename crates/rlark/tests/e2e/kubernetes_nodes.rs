//! The Kubernetes runtime's member nodes (docs/tasks.md, "Member nodes"): a simulated
//! member cluster (`rlark_testkit::kubesim`), an rlark control plane with its controllers,
//! an agent identity joined to it, and the node mirror (`rlark_agent::kubernetes::member::nodes`) run
//! with the agent's client. `rlark cordon` / `uncordon` are the real binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node as MemberNode, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use rlark_agent::kubernetes::member::nodes::{
    CORDONED_BY_RLARK_ANNOTATION, MirrorConfig, NodeMirror, REASON_MEMBER_NODE_NOT_READY,
    REASON_MEMBER_NODE_READY, REASON_MEMBER_NODE_UNSCHEDULABLE,
};
use rlark_api::types::{AgentType, Node, NodeCategory, NodePhase};
use rlark_testkit::TestServer;
use rlark_testkit::kubesim::{MemberCluster, MemberNode as SimNode};
use rlark_testkit::tunnel_agent::TunnelAgent;
use rlark_testkit::wait::{eventually, matching};
use serde_json::json;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "k1";
const NS: &str = "rlark-k1";

/// Run the rlark binary (asynchronously: the servers run on this test's runtime).
async fn rlark(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_rlark"))
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .await
        .context("run rlark")?;
    ensure!(
        out.status.success(),
        "rlark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn member_node(api: &Api<MemberNode>, name: &str) -> Result<(bool, bool)> {
    let node = api.get(name).await?;
    let unschedulable = node.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let ours = node
        .metadata
        .annotations
        .is_some_and(|a| a.contains_key(CORDONED_BY_RLARK_ANNOTATION));
    Ok((unschedulable, ours))
}

fn phase(node: &Node) -> (Option<NodePhase>, Option<String>) {
    let status = node.status.as_ref();
    (
        status.and_then(|s| s.phase),
        status.and_then(|s| s.reason.clone()),
    )
}

#[tokio::test]
async fn member_nodes_are_mirrored_and_cordons_pushed_down() -> Result<()> {
    let control = TestServer::start().await?;
    let admin = control.client().await?;
    let member = MemberCluster::start().await?;
    let member_client = member.client().await?;
    let sim = member.sim();
    sim.add_node(
        SimNode::new("gpu-0")
            .gpus(8, "NVIDIA-A100-SXM4-80GB")
            .label("pool", "gpu"),
    )
    .await?;
    sim.add_node(SimNode::new("cpu-0").cpu("16")).await?;
    let agent = TunnelAgent::start(&[&control], CLUSTER).await?;
    let agent_client =
        rlark_testkit::client_from_kubeconfig(&agent.dir().join("agent.kubeconfig")).await?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces.get_opt(NS).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
            )
            .await?;
    }
    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    let mirror = NodeMirror::new(
        member_client.clone(),
        agent_client,
        MirrorConfig {
            cluster_id: CLUSTER.into(),
            category: NodeCategory::Cloud,
            labels: BTreeMap::from([("site".to_string(), "lab".to_string())]),
            heartbeat_interval: Duration::from_millis(300),
            agent_node: Some("k1-agent".into()),
            serves_cloneset: false,
        },
    );
    let running = tokio::spawn(mirror.run(stop.clone()));

    let nodes: Api<Node> = Api::namespaced(admin.clone(), NS);
    let gpu = eventually("gpu-0 mirrored Online", || async {
        Ok(matching(nodes.get_opt("gpu-0").await?, |n| {
            n.as_ref()
                .is_some_and(|n| phase(n).0 == Some(NodePhase::Online))
        }))
    })
    .await?
    .context("gpu-0")?;
    assert_eq!(gpu.spec.agent_type, AgentType::Kubernetes);
    let labels = gpu.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["rlark.io/cluster-id"], CLUSTER);
    assert_eq!(labels["rlark.io/agent-type"], "Kubernetes");
    assert_eq!(labels["kubernetes.io/hostname"], "gpu-0");
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(labels["pool"], "gpu");
    assert_eq!(labels["site"], "lab");
    let status = gpu.status.clone().unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some(REASON_MEMBER_NODE_READY));
    assert_eq!(status.capacity["nvidia.com/gpu"].0, "8");
    assert_eq!(status.allocatable["nvidia.com/gpu"].0, "8");
    assert!(status.heartbeat_time.is_some());
    assert!(
        status.addresses.iter().any(|a| a.type_ == "InternalIP"),
        "{:?}",
        status.addresses
    );
    eventually("cpu-0 mirrored with its capacity", || async {
        let cpu = nodes.get_opt("cpu-0").await?.and_then(|n| n.status);
        Ok(matching(cpu.map(|s| s.capacity), |c| {
            c.as_ref()
                .and_then(|c| c.get("cpu"))
                .is_some_and(|q| q.0 == "16")
        }))
    })
    .await?;
    // The Lease is renewed at every heartbeat (written just after its Node: it may not
    // exist yet when the Node first shows Online).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), NS);
    let first = eventually("the lease of gpu-0 exists", || async {
        Ok(leases
            .get_opt("node-gpu-0")
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.renew_time))
    })
    .await?;
    eventually("the lease of gpu-0 is renewed", || async {
        let renewed = leases
            .get("node-gpu-0")
            .await?
            .spec
            .and_then(|s| s.renew_time);
        Ok(renewed.is_some_and(|t| t.0 > first.0))
    })
    .await?;

    // `used`: the requests of the member Pods bound to the node.
    let member_ns: Api<Namespace> = Api::all(member_client.clone());
    member_ns
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "work"}}))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(member_client.clone(), "work");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "trainer"},
        "spec": {"nodeName": "gpu-0", "restartPolicy": "Never", "containers": [{
            "name": "main", "image": "rlark/worker:1",
            "resources": {"requests": {"cpu": "1500m", "nvidia.com/gpu": "2"},
                          "limits": {"nvidia.com/gpu": "2"}}}]}
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    eventually("gpu-0 reports what the pod uses", || async {
        let used = nodes.get("gpu-0").await?.status.unwrap_or_default().used;
        Ok(matching(used, |u| {
            u.get("nvidia.com/gpu").is_some_and(|q| q.0 == "2")
                && u.get("cpu").is_some_and(|q| q.0 == "1500m")
        }))
    })
    .await?;
    // `pullProgress`: a Pod waiting on its image shows on its node, until it runs.
    sim.set_pod_phase(
        "work",
        "trainer",
        rlark_testkit::kubesim::Phase::Pending {
            reason: "ErrImagePull".into(),
        },
    )
    .await?;
    eventually("gpu-0 reports the failed pull", || async {
        let pulls = nodes
            .get("gpu-0")
            .await?
            .status
            .unwrap_or_default()
            .pull_progress;
        Ok(matching(pulls, |p| {
            p.len() == 1 && p[0].image == "rlark/worker:1" && p[0].status == "Failed"
        }))
    })
    .await?;
    sim.set_pod_phase("work", "trainer", rlark_testkit::kubesim::Phase::Running)
        .await?;
    eventually("gpu-0 reports no pull once the pod runs", || async {
        let pulls = nodes
            .get("gpu-0")
            .await?
            .status
            .unwrap_or_default()
            .pull_progress;
        Ok(matching(pulls, |p| p.is_empty()))
    })
    .await?;
    pods.delete("trainer", &DeleteParams::default()).await?;
    eventually("gpu-0 uses nothing once the pod is gone", || async {
        let used = nodes.get("gpu-0").await?.status.unwrap_or_default().used;
        Ok(matching(used, |u| u.is_empty()))
    })
    .await?;

    // Ready → phase.
    sim.set_node_ready("gpu-0", false).await?;
    eventually("gpu-0 Offline while NotReady", || async {
        let node = nodes.get("gpu-0").await?;
        Ok(matching(phase(&node), |p| {
            *p == (
                Some(NodePhase::Offline),
                Some(REASON_MEMBER_NODE_NOT_READY.to_string()),
            )
        }))
    })
    .await?;
    sim.set_node_ready("gpu-0", true).await?;
    eventually("gpu-0 Online again", || async {
        let node = nodes.get("gpu-0").await?;
        Ok(matching(phase(&node), |p| p.0 == Some(NodePhase::Online)))
    })
    .await?;

    // `rlark cordon` of the mirrored Node cordons the member node; uncordon undoes it.
    let member_nodes: Api<MemberNode> = Api::all(member_client.clone());
    let kubeconfig = control.kubeconfig_path().to_path_buf();
    rlark(&kubeconfig, &["cordon", &format!("{NS}/gpu-0")]).await?;
    eventually("member gpu-0 cordoned by rlark", || async {
        Ok(matching(member_node(&member_nodes, "gpu-0").await?, |s| {
            *s == (true, true)
        }))
    })
    .await?;
    let node = nodes.get("gpu-0").await?;
    assert_eq!(
        phase(&node).0,
        Some(NodePhase::Online),
        "rlark's own cordon is spec.unschedulable, not an Offline phase"
    );
    rlark(&kubeconfig, &["uncordon", &format!("{NS}/gpu-0")]).await?;
    eventually("member gpu-0 uncordoned", || async {
        Ok(matching(member_node(&member_nodes, "gpu-0").await?, |s| {
            *s == (false, false)
        }))
    })
    .await?;

    // A cordon by the member's admin: the mirrored Node goes Offline, and rlark's
    // uncordon does not undo it.
    member_nodes
        .patch(
            "cpu-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await?;
    eventually("cpu-0 Offline while its admin cordons it", || async {
        let node = nodes.get("cpu-0").await?;
        Ok(matching(phase(&node), |p| {
            p.1.as_deref() == Some(REASON_MEMBER_NODE_UNSCHEDULABLE)
        }))
    })
    .await?;
    rlark(&kubeconfig, &["cordon", &format!("{NS}/cpu-0")]).await?;
    rlark(&kubeconfig, &["uncordon", &format!("{NS}/cpu-0")]).await?;
    // Wait for a full pass after the uncordon (the heartbeat renews the Lease), then check.
    let before = leases
        .get("node-cpu-0")
        .await?
        .spec
        .and_then(|s| s.renew_time)
        .context("renewTime")?;
    eventually("a pass after the uncordon", || async {
        let now = leases
            .get("node-cpu-0")
            .await?
            .spec
            .and_then(|s| s.renew_time);
        Ok(now.is_some_and(|t| t.0 > before.0))
    })
    .await?;
    assert_eq!(
        member_node(&member_nodes, "cpu-0").await?,
        (true, false),
        "the admin's cordon stays"
    );

    // A member node deleted: its rlark Node and Lease go.
    member_nodes
        .delete("cpu-0", &DeleteParams::default())
        .await?;
    eventually("cpu-0 deleted", || async {
        Ok(
            nodes.get_opt("cpu-0").await?.is_none()
                && leases.get_opt("node-cpu-0").await?.is_none(),
        )
    })
    .await?;
    assert!(nodes.get_opt("gpu-0").await?.is_some());

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .context("the mirror stops")??;
    agent.stop().await;
    member.stop().await?;
    control.stop().await?;
    Ok(())
}

/// `rlark logs` of a Pod the Kubernetes runtime mirrors (the annotation
/// `rlark.io/member-pod`): the CLI → the server → the agent's tunnel → the agent's local API
/// → the member API's `pods/{name}/log`.
#[tokio::test]
async fn rlark_logs_of_a_mirrored_pod_read_the_member_api() -> Result<()> {
    let control = TestServer::start().await?;
    let admin = control.client().await?;
    let member = MemberCluster::start().await?;
    let member_client = member.client().await?;
    let sim = member.sim();
    sim.add_node(SimNode::new("gpu-0")).await?;
    let member_ns: Api<Namespace> = Api::all(member_client.clone());
    member_ns
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "work"}}))?,
        )
        .await?;
    let member_pods: Api<Pod> = Api::namespaced(member_client.clone(), "work");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "actor-0"},
        "spec": {"nodeName": "gpu-0", "restartPolicy": "Never", "containers": [
            {"name": "main", "image": "rlark/worker:1"},
            {"name": "tensorboard", "image": "rlark/tb:1"}]}
    }))?;
    member_pods.create(&PostParams::default(), &pod).await?;
    sim.settle().await?;
    sim.write_log("work", "actor-0", "main", "hello\nworld\n");
    sim.write_log("work", "actor-0", "tensorboard", "not this one\n");

    let dir = tempfile::tempdir()?;
    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    let api = rlark_agent::api::LocalApi::new(dir.path(), "k1-agent", stop.clone());
    let served = api.clone();
    let agent = TunnelAgent::start_with(&[&control], CLUSTER, move |config| {
        config.agent.agent_api = Some(std::sync::Arc::new(served));
    })
    .await?;
    let agent_client =
        rlark_testkit::client_from_kubeconfig(&agent.dir().join("agent.kubeconfig")).await?;
    assert!(
        api.set_member(rlark_agent::kubernetes::member::logs::MemberPods::new(
            agent_client,
            member_client.clone()
        ))
    );
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces.get_opt(NS).await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
            )
            .await?;
    }
    // The rlark Pods the runtime would mirror (the annotation is the contract).
    let rlark_pods: Api<rlark_api::types::Pod> = Api::namespaced(admin.clone(), NS);
    for (name, target) in [("actor-0", "work/actor-0"), ("ghost-0", "work/ghost-0")] {
        let pod = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {
                rlark_agent::kubernetes::member::logs::MEMBER_POD_ANNOTATION: target}},
            "spec": {"taskName": "actor", "taskNamespace": NS, "replicaIndex": 0},
        }))?;
        rlark_pods.create(&PostParams::default(), &pod).await?;
    }

    let kubeconfig = control.kubeconfig_path().to_path_buf();
    let all = rlark(&kubeconfig, &["logs", "pod/actor-0", "-n", NS]).await?;
    assert_eq!(all, "hello\nworld\n", "the default container's log");
    let tail = rlark(
        &kubeconfig,
        &["logs", "pod/actor-0", "-n", NS, "--tail", "1"],
    )
    .await?;
    assert_eq!(tail, "world\n");
    let limited = rlark(
        &kubeconfig,
        &["logs", "pod/actor-0", "-n", NS, "--limit-bytes", "3"],
    )
    .await?;
    assert_eq!(limited, "hel");
    let sidecar = rlark(
        &kubeconfig,
        &["logs", "pod/actor-0", "-n", NS, "-c", "tensorboard"],
    )
    .await?;
    assert_eq!(sidecar, "not this one\n", "-c names the container");

    // -f: streams until the container ends.
    let follow = tokio::spawn({
        let kubeconfig = kubeconfig.clone();
        async move { rlark(&kubeconfig, &["logs", "pod/actor-0", "-n", NS, "-f"]).await }
    });
    sim.write_log("work", "actor-0", "main", "more\n");
    sim.set_pod_phase("work", "actor-0", rlark_testkit::kubesim::Phase::Succeeded)
        .await?;
    let followed = tokio::time::timeout(Duration::from_secs(60), follow)
        .await
        .context("the follow ends with the container")???;
    assert_eq!(followed, "hello\nworld\nmore\n");

    // The member API's refusal comes back with its message.
    let missing = rlark(&kubeconfig, &["logs", "pod/ghost-0", "-n", NS])
        .await
        .expect_err("no member pod");
    assert!(format!("{missing:#}").contains("ghost-0"), "{missing:#}");

    stop.cancel();
    agent.stop().await;
    member.stop().await?;
    control.stop().await?;
    Ok(())
}
