//! Robots and cameras on rlark's own agents (issue 19, "Devices on Nodes" and placement):
//! a real `rlark embodied` process serving `examples/embodied/sim.yaml` (one `sim-arm`
//! robot, one `sim` camera), an agent of cluster `lab` given its socket directory
//! (`--embodied-socket-dir`), an agent of cluster `cloud` without one, and the server with
//! its controllers. Every wait is bounded; nothing asserts a duration.

#[allow(dead_code)] // shared with the embodied CLI suites, which use all of it
mod embodied_common;

use std::collections::BTreeMap;

use anyhow::{Context as _, ensure};
use embodied_common::Embodied;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, PostParams};
use rlark_api::types::{Job, Node, Pod, Task};
use rlark_testkit::real_agent::{
    eventually, start_agent_configured, start_server_with_controllers,
};
use serde_json::{Value, json};

const ARM: &str = "rlinf.io/robot-sim-arm";

fn quantity(
    list: &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    name: &str,
) -> Option<String> {
    list.get(name).map(|q| q.0.clone())
}

/// A Job of one raw task asking for one simulated arm; its replica writes what it was
/// given to `out`.
fn arm_job(name: &str, out: &std::path::Path) -> anyhow::Result<Job> {
    let script = format!(
        "echo \"$RLINF_EMBODIED_DEVICES $RLINF_EMBODIED_ROS_SOCKET_PATH\" > {}; exec sleep 300",
        out.display()
    );
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "rollout",
            "agentType": "Raw",
            "role": "Rollout",
            "raw": {
                "entrypoint": ["sh", "-c", script],
                "resources": {"requests": {ARM: "1"}, "limits": {ARM: "1"}},
            },
        }]},
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn robots_and_cameras_are_node_resources_that_placement_counts() -> anyhow::Result<()> {
    let mut embodied = Embodied::start()?;
    embodied.first_list("robot").await?;
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let lab_dir = tempfile::tempdir()?;
    let cloud_dir = tempfile::tempdir()?;
    let socket_dir = embodied.socket_dir.clone();
    let lab = start_agent_configured(&server, "lab", "lab-0", lab_dir.path(), |config| {
        config.embodied_socket_dir = Some(socket_dir);
    })
    .await?;
    let cloud =
        start_agent_configured(&server, "cloud", "cloud-0", cloud_dir.path(), |_| {}).await?;

    // The lab Node offers the arm and the camera; the cloud Node nothing of the kind.
    let lab_nodes: Api<Node> = Api::namespaced(admin.clone(), "rlark-lab");
    let node = eventually("lab-0 offers its devices", || async {
        Ok(lab_nodes.get_opt("lab-0").await?.filter(|n| {
            n.status
                .as_ref()
                .is_some_and(|s| quantity(&s.allocatable, ARM).as_deref() == Some("1"))
        }))
    })
    .await?;
    let status = node.status.clone().context("status")?;
    assert_eq!(
        quantity(&status.capacity, "rlinf.io/device").as_deref(),
        Some("2")
    );
    assert_eq!(
        quantity(&status.allocatable, "rlinf.io/camera-sim").as_deref(),
        Some("1")
    );
    assert_eq!(node.labels().get(ARM).map(String::as_str), Some("true"));
    let ids: Vec<(&str, &str)> = status
        .devices
        .iter()
        .map(|d| (d.id.as_str(), d.health.as_str()))
        .collect();
    assert_eq!(
        ids,
        [("camera-cam-0", "Healthy"), ("robot-arm-0", "Healthy")]
    );
    assert!(
        status.capacity.contains_key("cpu"),
        "the machine's resources stay beside the devices"
    );
    let cloud_node = Api::<Node>::namespaced(admin.clone(), "rlark-cloud")
        .get("cloud-0")
        .await?;
    let cloud_status = cloud_node.status.unwrap_or_default();
    ensure!(!cloud_status.capacity.contains_key("rlinf.io/device"));

    // A task asking for an arm goes where the arm is.
    let jobs: Api<Job> = Api::all(admin.clone());
    let scratch = tempfile::tempdir()?;
    let given = scratch.path().join("first.env");
    jobs.create(&PostParams::default(), &arm_job("first", &given)?)
        .await?;
    let tasks: Api<Task> = Api::namespaced(admin.clone(), "rlark-lab");
    let task = eventually("first-rollout placed on lab", || async {
        Ok(tasks.get_opt("first-rollout").await?.filter(|t| {
            t.spec
                .placement
                .as_ref()
                .is_some_and(|p| p.cluster_id == "lab" && p.nodes == ["lab-0"])
        }))
    })
    .await?;
    assert_eq!(task.namespace().as_deref(), Some("rlark-lab"));

    // Its replica holds the arm (recorded on its Pod) and got the runtime's socket.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "rlark-lab");
    eventually("first's replica holds robot-arm-0", || async {
        Ok(pods
            .list(&ListParams::default().labels("rlark.io/task-name=first-rollout"))
            .await?
            .items
            .into_iter()
            .find(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.devices == ["robot-arm-0"])
            }))
    })
    .await?;
    let env = eventually("the replica wrote its environment", || async {
        Ok(std::fs::read_to_string(&given)
            .ok()
            .filter(|t| t.ends_with('\n')))
    })
    .await?;
    let ros_socket = embodied.socket_dir.join("ros-ctrl.sock");
    assert_eq!(env.trim(), format!("robot-arm-0 {}", ros_socket.display()));

    // A second one does not fit: the only arm is taken. The Job says which resource.
    jobs.create(
        &PostParams::default(),
        &arm_job("second", &scratch.path().join("second.env"))?,
    )
    .await?;
    let message = eventually("second is unschedulable", || async {
        let job = jobs.get("second").await?;
        let value = serde_json::to_value(&job)?;
        let conditions = value
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok(conditions
            .iter()
            .find(|c| c["type"] == "Unschedulable" && c["status"] == "True")
            .and_then(|c| c["message"].as_str().map(str::to_string)))
    })
    .await?;
    assert!(message.contains(ARM), "{message}");

    // The runtime dies: its devices are unhealthy, out of allocatable, and the Node says why.
    embodied.process.kill().await?;
    let node = eventually("lab-0's devices unhealthy", || async {
        Ok(lab_nodes.get_opt("lab-0").await?.filter(|n| {
            n.status.as_ref().is_some_and(|s| {
                quantity(&s.allocatable, ARM).as_deref() == Some("0")
                    && s.devices.iter().all(|d| d.health == "Unhealthy")
            })
        }))
    })
    .await?;
    let status = node.status.context("status")?;
    assert_eq!(
        quantity(&status.capacity, ARM).as_deref(),
        Some("1"),
        "still there, not usable"
    );
    let why = status.devices[0].message.clone().unwrap_or_default();
    assert!(why.contains("does not answer"), "{why}");

    // The replica holding the arm is told, and its Task is conditioned (and kept running).
    let task = eventually("first-rollout has DeviceUnhealthy", || async {
        let task = tasks.get("first-rollout").await?;
        let unhealthy = task.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "DeviceUnhealthy" && c.status == "True")
        });
        Ok(unhealthy.then_some(task))
    })
    .await?;
    let condition = task
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "DeviceUnhealthy"))
        .context("the condition")?;
    assert_eq!(condition.status, "True");
    assert!(
        condition.message.contains("robot-arm-0") && condition.message.contains("does not answer"),
        "{}",
        condition.message
    );

    lab.stop().await?;
    cloud.stop().await?;
    server.stop().await
}
