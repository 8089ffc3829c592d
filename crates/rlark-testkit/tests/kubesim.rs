//! The simulated member cluster, driven with kube-rs as the Kubernetes runtime drives a
//! real one: an rlark server in member simulation plus `KubeSim`.

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use futures::{AsyncBufReadExt as _, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use rlark_testkit::kubesim::{MemberCluster, MemberNode, Phase, Policy};
use rlark_testkit::wait::{eventually, matching};
use serde_json::json;

const NS: &str = "work";

async fn cluster() -> Result<(MemberCluster, kube::Client)> {
    let cluster = MemberCluster::start().await?;
    let client = cluster.client().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await?;
    cluster
        .sim()
        .add_node(
            MemberNode::new("gpu-0")
                .gpus(4, "NVIDIA-A100-SXM4-80GB")
                .label("pool", "gpu"),
        )
        .await?;
    Ok((cluster, client))
}

fn template(labels: serde_json::Value, restart_policy: &str) -> serde_json::Value {
    json!({"metadata": {"labels": labels},
           "spec": {"restartPolicy": restart_policy,
                    "containers": [{"name": "main", "image": "rlark/worker:1", "command": ["python3", "train.py"]}]}})
}

fn stateful_set(name: &str, replicas: i32) -> Result<StatefulSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "rlark"}},
        "spec": {"replicas": replicas, "serviceName": name,
                 "selector": {"matchLabels": {"app": name}},
                 "template": template(json!({"app": name}), "Always")}
    }))?)
}

async fn pod_names(pods: &Api<Pod>, selector: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    Ok(names)
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn stateful_set_pods_are_named_owned_scaled_and_cascade() -> Result<()> {
    let (cluster, client) = cluster().await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let sts = sets
        .create(&PostParams::default(), &stateful_set("actor", 2)?)
        .await?;
    let uid = sts.metadata.uid.clone().context("uid")?;
    eventually("actor's two pods run", || async {
        let ready = sets
            .get("actor")
            .await?
            .status
            .and_then(|s| s.ready_replicas);
        Ok(matching(
            (pod_names(&pods, "app=actor").await?, ready),
            |(names, ready)| names == &["actor-0", "actor-1"] && *ready == Some(2),
        ))
    })
    .await?;
    let pod = pods.get("actor-1").await?;
    let owner = &pod.metadata.owner_references.as_ref().context("owners")?[0];
    assert_eq!(
        (
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str(),
            owner.controller
        ),
        ("StatefulSet", "actor", uid.as_str(), Some(true))
    );
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("statefulset.kubernetes.io/pod-name")
            .map(String::as_str),
        Some("actor-1")
    );
    assert_eq!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some("gpu-0")
    );
    let status = pod.status.context("status")?;
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let container = &status.container_statuses.context("container statuses")?[0];
    assert!(
        container.ready && container.restart_count == 0,
        "{container:?}"
    );
    assert!(status.pod_ip.is_some());

    // Scale to 0 through the scale subresource: the Pods go, highest ordinal first.
    sets.patch_scale(
        "actor",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await?;
    eventually("actor scaled to 0", || async {
        Ok(matching(
            pod_names(&pods, "app=actor").await?,
            Vec::is_empty,
        ))
    })
    .await?;
    sets.patch(
        "actor",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await?;
    eventually("actor-0 back", || async {
        Ok(matching(pod_names(&pods, "app=actor").await?, |n| {
            n == &["actor-0"]
        }))
    })
    .await?;

    // A failed container under restartPolicy Always restarts, with its exit code kept.
    cluster
        .sim()
        .set_pod_phase(NS, "actor-0", Phase::Failed { exit_code: 137 })
        .await?;
    let container = pods
        .get("actor-0")
        .await?
        .status
        .and_then(|s| s.container_statuses)
        .context("statuses")?
        .remove(0);
    assert_eq!(container.restart_count, 1);
    let last = container
        .last_state
        .and_then(|s| s.terminated)
        .context("last state")?;
    assert_eq!(last.exit_code, 137);
    assert_eq!(
        container
            .state
            .and_then(|s| s.waiting)
            .and_then(|w| w.reason)
            .as_deref(),
        Some("CrashLoopBackOff")
    );

    // Deleting the StatefulSet cascades to its Pods (the server's garbage collector).
    sets.delete("actor", &DeleteParams::default()).await?;
    eventually("actor's pods gone", || async {
        Ok(matching(
            pod_names(&pods, "app=actor").await?,
            Vec::is_empty,
        ))
    })
    .await?;
    cluster.stop().await
}

#[tokio::test]
async fn jobs_succeed_fail_and_suspend_with_conditions() -> Result<()> {
    let (cluster, client) = cluster().await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let job = |name: &str, suspend: bool| -> Result<Job> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "suspend": suspend, "template": template(json!({"task": name}), "Never")}
        }))?)
    };
    jobs.create(&PostParams::default(), &job("eval", false)?)
        .await?;
    let pod = eventually("eval's pod", || async {
        Ok(pod_names(&pods, "batch.kubernetes.io/job-name=eval")
            .await?
            .pop())
    })
    .await?;
    let suffix = pod.strip_prefix("eval-").context("job pod name")?;
    assert_eq!(suffix.len(), 5, "{pod}");
    cluster.sim().write_log(NS, &pod, "main", "accuracy 0.93\n");
    cluster
        .sim()
        .set_pod_phase(NS, &pod, Phase::Succeeded)
        .await?;
    let status = jobs.get("eval").await?.status.context("job status")?;
    assert_eq!((status.succeeded, status.active), (Some(1), Some(0)));
    let conditions = status.conditions.context("conditions")?;
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"),
        "{conditions:?}"
    );
    assert!(status.completion_time.is_some());
    assert_eq!(
        pods.logs(&pod, &LogParams::default()).await?,
        "accuracy 0.93\n"
    );

    jobs.create(&PostParams::default(), &job("crash", false)?)
        .await?;
    let pod = eventually("crash's pod", || async {
        Ok(pod_names(&pods, "batch.kubernetes.io/job-name=crash")
            .await?
            .pop())
    })
    .await?;
    cluster
        .sim()
        .set_pod_phase(NS, &pod, Phase::Failed { exit_code: 3 })
        .await?;
    let failed = pods.get(&pod).await?;
    assert_eq!(phase(&failed), "Failed");
    let terminated = failed
        .status
        .and_then(|s| s.container_statuses)
        .context("statuses")?
        .remove(0)
        .state
        .and_then(|s| s.terminated)
        .context("terminated")?;
    assert_eq!(
        (terminated.exit_code, terminated.reason.as_deref()),
        (3, Some("Error"))
    );
    let conditions = jobs
        .get("crash")
        .await?
        .status
        .and_then(|s| s.conditions)
        .context("conditions")?;
    let failed = conditions
        .iter()
        .find(|c| c.type_ == "Failed")
        .context("Failed condition")?;
    assert_eq!(
        (failed.status.as_str(), failed.reason.as_deref()),
        ("True", Some("BackoffLimitExceeded"))
    );

    // A suspended Job has no Pods until resumed.
    jobs.create(&PostParams::default(), &job("later", true)?)
        .await?;
    cluster.sim().settle().await?;
    assert!(
        pod_names(&pods, "batch.kubernetes.io/job-name=later")
            .await?
            .is_empty()
    );
    jobs.patch(
        "later",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": false}})),
    )
    .await?;
    eventually("later resumed", || async {
        Ok(pod_names(&pods, "batch.kubernetes.io/job-name=later")
            .await?
            .len()
            == 1)
    })
    .await?;
    jobs.patch(
        "later",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"suspend": true}})),
    )
    .await?;
    eventually("later suspended again", || async {
        Ok(pod_names(&pods, "batch.kubernetes.io/job-name=later")
            .await?
            .is_empty())
    })
    .await?;
    cluster.stop().await
}

#[tokio::test]
async fn deployment_pods_are_watched_through_their_phases_and_logs_follow() -> Result<()> {
    let (cluster, client) = cluster().await?;
    cluster.sim().set_policy(Policy::Hold);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // Watch from the start: every phase change shows up as an event.
    let (phases, mut seen_phases) = tokio::sync::mpsc::unbounded_channel();
    let mut events = watcher(
        pods.clone(),
        watcher::Config::default().labels("app=rollout"),
    )
    .boxed();
    let watching = tokio::spawn(async move {
        while let Some(event) = events.try_next().await? {
            if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = event
                && phases.send(phase(&p)).is_err()
            {
                break;
            }
        }
        anyhow::Ok(())
    });
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "rollout"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rollout"}},
                         "template": template(json!({"app": "rollout"}), "Always")}
            }))?,
        )
        .await?;
    let rs = eventually("rollout's ReplicaSet", || async {
        Ok(replica_sets.list(&ListParams::default()).await?.items.pop())
    })
    .await?;
    let rs_name = rs.metadata.name.clone().context("rs name")?;
    assert!(rs_name.starts_with("rollout-"), "{rs_name}");
    let pod = eventually("rollout's pod", || async {
        Ok(pod_names(&pods, "app=rollout").await?.pop())
    })
    .await?;
    assert_eq!(
        pod.strip_prefix(&format!("{rs_name}-")).map(str::len),
        Some(5),
        "{pod}"
    );
    let owner = pods
        .get(&pod)
        .await?
        .metadata
        .owner_references
        .context("owners")?
        .remove(0);
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("ReplicaSet", rs_name.as_str())
    );

    // Held: Pending with the waiting reason the test sets, and no log yet.
    cluster
        .sim()
        .set_pod_phase(
            NS,
            &pod,
            Phase::Pending {
                reason: "ImagePullBackOff".into(),
            },
        )
        .await?;
    let waiting = pods.get(&pod).await?;
    assert_eq!(phase(&waiting), "Pending");
    let reason = waiting
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|mut c| c.remove(0).state)
        .and_then(|s| s.waiting)
        .and_then(|w| w.reason);
    assert_eq!(reason.as_deref(), Some("ImagePullBackOff"));
    let error = pods.logs(&pod, &LogParams::default()).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("is waiting to start: ImagePullBackOff"),
        "{error}"
    );

    cluster
        .sim()
        .set_pod_phase(NS, &pod, Phase::Running)
        .await?;
    let mut seen = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while let Some(phase) = seen_phases.recv().await {
            seen.push(phase);
            if seen.last().is_some_and(|p| p == "Running") {
                break;
            }
        }
    })
    .await
    .context("watch saw no Running pod")?;
    assert!(seen.contains(&"Pending".to_string()), "{seen:?}");
    assert_eq!(seen.last().map(String::as_str), Some("Running"), "{seen:?}");
    watching.abort();
    let ready = deployments
        .get("rollout")
        .await?
        .status
        .and_then(|s| s.ready_replicas);
    assert_eq!(ready, Some(1));

    // Logs: what the test writes, followed until the container restarts.
    cluster.sim().write_log(NS, &pod, "main", "step 1\n");
    let follow = pods
        .log_stream(
            &pod,
            &LogParams {
                follow: true,
                ..LogParams::default()
            },
        )
        .await?;
    let mut lines = follow.lines();
    assert_eq!(lines.next().await.transpose()?.as_deref(), Some("step 1"));
    cluster.sim().write_log(NS, &pod, "main", "step 2\n");
    assert_eq!(lines.next().await.transpose()?.as_deref(), Some("step 2"));
    cluster
        .sim()
        .set_pod_phase(NS, &pod, Phase::Failed { exit_code: 1 })
        .await?;
    let rest = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        let mut rest = Vec::new();
        while let Some(line) = lines.next().await {
            rest.push(line?);
        }
        anyhow::Ok(rest)
    })
    .await
    .context("follow did not end when the container restarted")??;
    assert!(rest.is_empty(), "{rest:?}");
    let previous = pods
        .logs(
            &pod,
            &LogParams {
                previous: true,
                ..LogParams::default()
            },
        )
        .await?;
    assert_eq!(previous, "step 1\nstep 2\n");
    cluster.stop().await
}

#[tokio::test]
async fn nodes_carry_capacity_gpu_model_and_conditions_and_gate_scheduling() -> Result<()> {
    let (cluster, client) = cluster().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("gpu-0").await?;
    let labels: BTreeMap<String, String> = node.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-A100-SXM4-80GB")
    );
    let status = node.status.context("node status")?;
    let gpus = status
        .allocatable
        .as_ref()
        .and_then(|a| a.get("nvidia.com/gpu"))
        .context("gpus")?;
    assert_eq!(gpus.0, "4");
    assert_eq!(
        status
            .capacity
            .as_ref()
            .and_then(|c| c.get("memory"))
            .map(|q| q.0.as_str()),
        Some("32Gi")
    );
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .context("Ready")?;
    assert_eq!(ready.status, "True");

    // More GPUs than any Node has: Pending, PodScheduled=False with the scheduler's message.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut big = template(json!({"app": "big"}), "Never");
    big["metadata"]["name"] = json!("big");
    big["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
    pods.create(&PostParams::default(), &serde_json::from_value(big)?)
        .await?;
    cluster.sim().settle().await?;
    let conditions = pods
        .get("big")
        .await?
        .status
        .and_then(|s| s.conditions)
        .context("conditions")?;
    let scheduled = conditions
        .iter()
        .find(|c| c.type_ == "PodScheduled")
        .context("PodScheduled")?;
    assert_eq!(
        (scheduled.status.as_str(), scheduled.reason.as_deref()),
        ("False", Some("Unschedulable"))
    );
    assert_eq!(
        scheduled.message.as_deref(),
        Some("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    );

    // A NotReady Node takes no new Pod; a new Ready one does.
    cluster.sim().set_node_ready("gpu-0", false).await?;
    let mut small = template(json!({"app": "small"}), "Never");
    small["metadata"]["name"] = json!("small");
    pods.create(&PostParams::default(), &serde_json::from_value(small)?)
        .await?;
    cluster.sim().settle().await?;
    assert_eq!(
        pods.get("small").await?.spec.and_then(|s| s.node_name),
        None
    );
    cluster.sim().add_node(MemberNode::new("cpu-0")).await?;
    let bound = pods.get("small").await?;
    assert_eq!(
        bound.spec.and_then(|s| s.node_name).as_deref(),
        Some("cpu-0")
    );
    cluster.stop().await
}

/// kubectl resolves `pods` to the core kind on a member server, and rlark's own Pods stay
/// reachable by their short name. (Two worker threads: kubectl runs blocking, the server
/// runs in this process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_resolves_core_pods_and_rlark_pods_apart() -> Result<()> {
    let available = std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        missing_tool::skip_or_fail("kubectl is not on PATH");
        return Ok(());
    }
    let (cluster, client) = cluster().await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    sets.create(&PostParams::default(), &stateful_set("head", 1)?)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    eventually("head-0", || async {
        Ok(pods.get_opt("head-0").await?.is_some())
    })
    .await?;
    let cache = tempfile::tempdir()?;
    let kubectl = |args: &[&str]| -> Result<String> {
        let output = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .arg("--cache-dir")
            .arg(cache.path())
            .env("HOME", cache.path())
            .args(args)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8(output.stdout)?)
    };
    let out = kubectl(&["get", "pods", "-n", NS, "-o", "name"])?;
    assert_eq!(out.trim(), "pod/head-0");
    let out = kubectl(&[
        "get",
        "po",
        "-n",
        NS,
        "-o",
        "jsonpath={.items[0].apiVersion}",
    ])?;
    assert_eq!(out, "v1");
    let out = kubectl(&["get", "sts,deploy,jobs", "-n", NS, "-o", "name"])?;
    assert_eq!(out.trim(), "statefulset.apps/head");
    // rlark's kinds are still there under their own names.
    let out = kubectl(&["get", "rlpod", "-A", "-o", "name"])?;
    assert_eq!(out.trim(), "");
    let out = kubectl(&["get", "pods.rlinf.io", "-A", "-o", "name"])?;
    assert_eq!(out.trim(), "");
    cluster.stop().await
}
