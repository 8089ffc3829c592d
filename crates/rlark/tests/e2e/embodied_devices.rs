//! Robots and cameras on rlark's own agents (issue 19, "Devices on Nodes" and placement):
//! a real `rlark embodied` process serving `examples/embodied/sim.yaml` (one `sim-arm`
//! robot, one `sim` camera), an agent of cluster `lab` given its socket directory
//! (`--embodied-socket-dir`), an agent of cluster `cloud` without one, and the server with
//! its controllers. Every wait is bounded; nothing asserts a duration.

use crate::embodied_common;
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
    let scratch = rlark_testkit::shared_tempdir()?;
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

/// A Job of one raw task holding the arm: `script` (sh) runs with the replica's
/// environment; `RLARK` is the rlark binary, `DIR` the runtime's socket directory (from
/// `RLINF_EMBODIED_ROS_SOCKET_PATH`).
fn arm_script_job(name: &str, script: &str, extra: Value) -> anyhow::Result<Job> {
    let script = format!(
        "RLARK={rlark}; DIR=$(dirname \"$RLINF_EMBODIED_ROS_SOCKET_PATH\"); {script}",
        rlark = embodied_common::RLARK
    );
    let mut task = json!({
        "name": "rollout",
        "agentType": "Raw",
        "role": "Rollout",
        "raw": {
            "entrypoint": ["sh", "-c", script],
            "resources": {"requests": {ARM: "1"}, "limits": {ARM: "1"}},
        },
    });
    if let (Some(task), Some(extra)) = (task.as_object_mut(), extra.as_object()) {
        task.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [task]},
    }))?)
}

/// `rlark robot status arm-0 -o json`.
async fn arm_status(embodied: &Embodied) -> anyhow::Result<Value> {
    let out = embodied_common::ok(
        embodied
            .cli("robot", &["status", "arm-0", "-o", "json"])
            .await?,
        "rlark robot status",
    )?;
    Ok(serde_json::from_str(&out)?)
}

/// Waits until arm-0 is in `state`; its status then.
async fn arm_in(embodied: &Embodied, state: &str) -> anyhow::Result<Value> {
    eventually(&format!("arm-0 {state}"), || async {
        let status = arm_status(embodied).await?;
        Ok((status["state"] == state).then_some(status))
    })
    .await
}

/// The Pod of `task`'s replica once it holds robot-arm-0.
async fn holder(pods: &Api<Pod>, task: &str) -> anyhow::Result<Pod> {
    eventually(&format!("{task}'s replica holds robot-arm-0"), || async {
        Ok(pods
            .list(&ListParams::default().labels(&format!("rlark.io/task-name={task}")))
            .await?
            .items
            .into_iter()
            .find(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.devices == ["robot-arm-0"])
            }))
    })
    .await
}

/// Waits until the file at `path` holds a line.
async fn line_in(path: &std::path::Path) -> anyhow::Result<String> {
    eventually(&format!("{} written", path.display()), || async {
        Ok(std::fs::read_to_string(path)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .map(|t| t.trim().to_string()))
    })
    .await
}

/// Stops Job `name` (`spec.stopped`): its Task ends `Stopped` and holds nothing for
/// placement any more (a deleted Task may be counted a while longer).
async fn stop_job(jobs: &Api<Job>, name: &str) -> anyhow::Result<()> {
    jobs.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"stopped": true}})),
    )
    .await?;
    Ok(())
}

/// The direct children of process `pid` (from `/proc/PID/task/PID/children`).
fn children(pid: i64) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_owns_its_robots_and_an_unhealthy_device_can_stop_it() -> anyhow::Result<()> {
    let mut embodied = Embodied::start()?;
    embodied.first_list("robot").await?;
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let lab_dir = tempfile::tempdir()?;
    let socket_dir = embodied.socket_dir.clone();
    let lab = start_agent_configured(&server, "lab", "lab-0", lab_dir.path(), |config| {
        config.embodied_socket_dir = Some(socket_dir);
    })
    .await?;
    let jobs: Api<Job> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "rlark-lab");
    let scratch = rlark_testkit::shared_tempdir()?;
    let create = PostParams::default();

    // 1. A short-lived child of the replica (the CLI) starts the arm and exits; the
    //    replica lives on, and so does the arm, well past the watchdog (sim.yaml: 2 s).
    let out = scratch.path().join("owner.out");
    let script = format!(
        "\"$RLARK\" robot --socket-dir \"$DIR\" start arm-0 && echo \"$RLINF_EMBODIED_OWNER\" > {}; exec sleep 300",
        out.display()
    );
    let always = json!({"raw": {
        "entrypoint": ["sh", "-c", format!(
            "RLARK={rlark}; DIR=$(dirname \"$RLINF_EMBODIED_ROS_SOCKET_PATH\"); {script}",
            rlark = embodied_common::RLARK
        )],
        "restartPolicy": "Always",
        "resources": {"requests": {ARM: "1"}, "limits": {ARM: "1"}},
    }});
    jobs.create(&create, &arm_script_job("owner", &script, always)?)
        .await?;
    let pod = holder(&pods, "owner-rollout").await?;
    let label = line_in(&out).await?;
    assert_eq!(label, format!("rlark-lab/{}", pod.name_any()));
    let status = arm_status(&embodied).await?;
    assert_eq!(status["state"], "RUNNING", "{status}");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let status = arm_status(&embodied).await?;
    assert_eq!(
        status["state"], "RUNNING",
        "the CLI that started it exited, the replica did not: {status}"
    );
    let leader = status["ownerPid"].as_i64().context("ownerPid")?;
    ensure!(leader > 0, "an owner: {status}");
    let logs = embodied_common::ok(
        embodied.cli("robot", &["logs", "arm-0"]).await?,
        "rlark robot logs",
    )?;
    ensure!(
        logs.contains(&format!(
            "for replica {label} (session leader process {leader})"
        )),
        "{logs}"
    );
    // Kill the replica's main process (the session leader is its supervisor): the
    // replica dies, and the runtime's watchdog stops the arm. The run goes on
    // (restartPolicy Always), so this is not the agent's end-of-run backstop.
    let main = children(leader);
    ensure!(!main.is_empty(), "the supervisor {leader} has a child");
    for pid in main {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )?;
    }
    let safety_stop = format!(
        "safety stop: owner replica {label} ended (its session leader, process {leader}, exited)"
    );
    eventually(
        "the watchdog stopped the arm for the dead replica",
        || async {
            let logs = embodied_common::ok(
                embodied.cli("robot", &["logs", "arm-0"]).await?,
                "rlark robot logs",
            )?;
            Ok(logs.contains(&safety_stop).then_some(()))
        },
    )
    .await?;
    // The restarted replica starts it again; the end of the run stops it for good.
    eventually("the restarted replica runs the arm", || async {
        let status = arm_status(&embodied).await?;
        Ok((status["state"] == "RUNNING" && status["ownerPid"] != leader).then_some(()))
    })
    .await?;
    stop_job(&jobs, "owner").await?;
    let stopped = arm_in(&embodied, "STOPPED").await?;
    let message = stopped["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&label),
        "stopped for the replica {label}: {message}"
    );

    // 2. The backstop: the arm runs for a live, connected process outside the replica
    //    (this test); when the replica holding it ends, its agent stops it.
    let out = scratch.path().join("backstop.out");
    let script = format!("echo ready > {}; exec sleep 300", out.display());
    jobs.create(&create, &arm_script_job("backstop", &script, json!({}))?)
        .await?;
    let pod = holder(&pods, "backstop-rollout").await?;
    line_in(&out).await?;
    let channel = rlark_proto::client::connect(embodied.socket_dir.join("ros-ctrl.sock")).await?;
    let mut client =
        rlark_proto::robot::v1::robot_controller_client::RobotControllerClient::new(channel);
    let started = client
        .start_robot(rlark_proto::robot::v1::StartRobotRequest {
            robot_id: "arm-0".into(),
            mode: String::new(),
            mode_config: None,
        })
        .await?
        .into_inner();
    assert_eq!(started.owner_pid, i32::try_from(std::process::id())?);
    stop_job(&jobs, "backstop").await?;
    let stopped = arm_in(&embodied, "STOPPED").await?;
    let message = stopped["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "replica rlark-lab/{}, which held it, ended",
            pod.name_any()
        )),
        "{message}"
    );
    drop(client);

    // 3. A detached start survives its replica: the next replica gets the arm still running.
    let out = scratch.path().join("detached.out");
    let script = format!(
        "\"$RLARK\" robot --socket-dir \"$DIR\" start arm-0 --detach && echo started > {}; exec sleep 300",
        out.display()
    );
    jobs.create(&create, &arm_script_job("detached", &script, json!({}))?)
        .await?;
    holder(&pods, "detached-rollout").await?;
    line_in(&out).await?;
    let status = arm_status(&embodied).await?;
    assert_eq!(
        (&status["state"], &status["ownerPid"]),
        (&json!("RUNNING"), &json!(0))
    );
    stop_job(&jobs, "detached").await?;
    // Once another replica holds the arm, the first one's run is over (devices are freed
    // after the backstop ran).
    let out = scratch.path().join("next.out");
    let script = format!("echo ready > {}; exec sleep 300", out.display());
    jobs.create(&create, &arm_script_job("next", &script, json!({}))?)
        .await?;
    holder(&pods, "next-rollout").await?;
    let status = arm_status(&embodied).await?;
    assert_eq!(status["state"], "RUNNING", "detached: left alone: {status}");
    embodied_common::ok(
        embodied.cli("robot", &["stop", "arm-0"]).await?,
        "rlark robot stop",
    )?;
    stop_job(&jobs, "next").await?;

    // 4. onDeviceUnhealthy: Stop — the replica's arm faults: the agent stops the replica,
    //    its Pod ends Failed (DeviceUnhealthy) naming the device, and the Task fails.
    let out = scratch.path().join("faulty.out");
    let script = format!(
        "\"$RLARK\" robot --socket-dir \"$DIR\" start arm-0 --arg fault=boom && echo started > {}; exec sleep 300",
        out.display()
    );
    let policy = json!({"onDeviceUnhealthy": "Stop", "raw": {
        "entrypoint": ["sh", "-c", format!(
            "RLARK={rlark}; DIR=$(dirname \"$RLINF_EMBODIED_ROS_SOCKET_PATH\"); {script}",
            rlark = embodied_common::RLARK
        )],
        "restartPolicy": "Always",
        "resources": {"requests": {ARM: "1"}, "limits": {ARM: "1"}},
    }});
    jobs.create(&create, &arm_script_job("faulty", &script, policy)?)
        .await?;
    holder(&pods, "faulty-rollout").await?;
    let failed = eventually("faulty's replica Failed", || async {
        Ok(pods
            .list(&ListParams::default().labels("rlark.io/task-name=faulty-rollout"))
            .await?
            .items
            .into_iter()
            .find(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.phase == Some(rlark_api::types::PodPhase::Failed))
            }))
    })
    .await?;
    let status = failed.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some("DeviceUnhealthy"));
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("robot-arm-0") && message.contains("simulated arm fault: boom"),
        "{message}"
    );
    let tasks: Api<Task> = Api::namespaced(admin.clone(), "rlark-lab");
    eventually("faulty-rollout Failed", || async {
        let task = tasks.get("faulty-rollout").await?;
        let phase = task.status.as_ref().and_then(|s| s.phase);
        Ok((phase == Some(rlark_api::types::TaskPhase::Failed)).then_some(task))
    })
    .await?;

    lab.stop().await?;
    server.stop().await
}

/// Two simulated arms, for [`a_replica_cannot_call_the_arm_another_replica_holds`].
const TWO_ARMS: &str = r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch, argFrom: {joints: dof}}
robots:
  - {id: arm-0, type: sim-arm, params: {dof: 6}}
  - {id: arm-1, type: sim-arm, params: {dof: 6}}
allowedLaunchPackages: []
watchdog: 60s
"#;

/// Issue 38, "a replica holding arm-0 cannot call arm-1" (before the fix any process on
/// the host drove any robot): two raw replicas of a real agent, under the real
/// supervisor, each holding one arm. Each calls both arms through `rlark robot`; its own
/// answers, the other's is refused naming its holder. The agent's own calls and this
/// test's (root, in no replica) reach both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cannot_call_the_arm_another_replica_holds() -> anyhow::Result<()> {
    let config_dir = tempfile::tempdir()?;
    let config = config_dir.path().join("two-arms.yaml");
    std::fs::write(&config, TWO_ARMS)?;
    let mut embodied = Embodied::start_config(&config)?;
    embodied.first_list("robot").await?;
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let lab_dir = tempfile::tempdir()?;
    let socket_dir = embodied.socket_dir.clone();
    let lab = start_agent_configured(&server, "lab", "lab-0", lab_dir.path(), |config| {
        config.embodied_socket_dir = Some(socket_dir);
    })
    .await?;
    let lab_nodes: Api<Node> = Api::namespaced(admin.clone(), "rlark-lab");
    eventually("lab-0 offers both arms", || async {
        Ok(lab_nodes.get_opt("lab-0").await?.filter(|n| {
            n.status
                .as_ref()
                .is_some_and(|s| quantity(&s.allocatable, ARM).as_deref() == Some("2"))
        }))
    })
    .await?;
    let jobs: Api<Job> = Api::all(admin.clone());
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "rlark-lab");
    let scratch = rlark_testkit::shared_tempdir()?;
    // Each replica waits until the runtime knows it (its list no longer shows the other
    // arm), then calls both arms; `OUT` gets one line per arm: `ARM rc=N MESSAGE`.
    let script = |out: &std::path::Path| {
        format!(
            "ME=${{RLINF_EMBODIED_DEVICES#robot-}}; \
             if [ \"$ME\" = arm-0 ]; then OTHER=arm-1; else OTHER=arm-0; fi; \
             until ! \"$RLARK\" robot --socket-dir \"$DIR\" list | grep -q \"^$OTHER \"; do sleep 0.1; done; \
             for ARM in $ME $OTHER; do \
               MSG=$(\"$RLARK\" robot --socket-dir \"$DIR\" status $ARM 2>&1); RC=$?; \
               echo \"$ARM rc=$RC\" $MSG >> {out}.tmp; \
             done; mv {out}.tmp {out}; exec sleep 300",
            out = out.display()
        )
    };
    let mut outs = Vec::new();
    for name in ["first", "second"] {
        let out = scratch.path().join(format!("{name}.out"));
        jobs.create(
            &PostParams::default(),
            &arm_script_job(name, &script(&out), json!({}))?,
        )
        .await?;
        outs.push(out);
    }
    let mut holders = BTreeMap::new();
    for (name, out) in ["first", "second"].iter().zip(&outs) {
        let pod = eventually(&format!("{name}'s replica holds an arm"), || async {
            Ok(pods
                .list(&ListParams::default().labels(&format!("rlark.io/task-name={name}-rollout")))
                .await?
                .items
                .into_iter()
                .find(|p| p.status.as_ref().is_some_and(|s| s.devices.len() == 1)))
        })
        .await?;
        let held = pod
            .status
            .as_ref()
            .map(|s| s.devices[0].clone())
            .unwrap_or_default();
        let text = eventually(&format!("{} written", out.display()), || async {
            Ok(std::fs::read_to_string(out).ok())
        })
        .await?;
        holders.insert(held, (pod.name_any(), text));
    }
    assert_eq!(
        holders.keys().collect::<Vec<_>>(),
        ["robot-arm-0", "robot-arm-1"],
        "one arm each"
    );
    for (held, (pod, text)) in &holders {
        let mine = held.trim_start_matches("robot-");
        let other = if mine == "arm-0" { "arm-1" } else { "arm-0" };
        let (other_holder, _) = &holders[&format!("robot-{other}")];
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with(&format!("{mine} rc=0 ")),
            "{pod} calls its own {mine}: {text}"
        );
        assert!(
            lines[1].starts_with(&format!("{other} rc=1 "))
                && lines[1].contains("PermissionDenied")
                && lines[1].contains(&format!(
                    "robot-{other} is held by replica rlark-lab/{other_holder}"
                )),
            "{pod} may not call {other}: {text}"
        );
    }
    // Root outside the replicas (this test, like an admin or the agent): both arms.
    for arm in ["arm-0", "arm-1"] {
        embodied_common::ok(
            embodied.cli("robot", &["status", arm]).await?,
            "rlark robot status",
        )?;
    }
    lab.stop().await?;
    server.stop().await
}
