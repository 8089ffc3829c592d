//! Pure: what a node's embodied runtime offers, as Node resources, labels and device
//! health (docs/embodied.md, "Devices on Nodes").
//!
//! Every robot and camera is one device: `robot-<id>` / `camera-<id>` (the device plugin's
//! IDs). Each counts under [`DEVICE_RESOURCE`] and under its model's resource —
//! `rlinf.io/robot-<type>` for a robot (its configured type), `rlinf.io/camera-<driver>`
//! for a camera — in `capacity`; only healthy ones in `allocatable`. A robot is unhealthy
//! in `ERROR`, a camera in `ERROR`; every device is unhealthy while its socket does not
//! answer. Each model with a device gets the label `rlinf.io/<model>: "true"`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use rlark_api::types::{NodeDevice, ResourceList};
use rlark_proto::camera::v1::{CameraDescriptor, CameraState};
use rlark_proto::robot::v1::{RobotInfo, RobotState};

/// Every robot and camera: `rlinf.io/device` (the device plugin's resource).
pub const DEVICE_RESOURCE: &str = "rlinf.io/device";
/// Prefix of the per-model resources and labels.
pub const PREFIX: &str = "rlinf.io/";
/// Health values, as the device plugin API spells them.
pub const HEALTHY: &str = "Healthy";
pub const UNHEALTHY: &str = "Unhealthy";

/// What the runtime answered on one socket: its devices, or why it did not answer.
#[derive(Clone, Debug)]
pub enum Answer<T> {
    Listed(Vec<T>),
    /// The socket is there but the call failed: its devices (as last seen) are unhealthy.
    Failed(String),
}

/// The device part of a Node: resources, labels and per-device health.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeDevices {
    pub capacity: ResourceList,
    pub allocatable: ResourceList,
    /// `rlinf.io/<model>` → `"true"` for each model present.
    pub labels: BTreeMap<String, String>,
    pub devices: Vec<NodeDevice>,
}

/// A model resource name part (`robot-<type>`): a Kubernetes qualified name's name part —
/// at most 63 characters, alphanumerics, `-`, `_`, `.`, starting and ending with an
/// alphanumeric. Configured names are already limited to those characters; `None` for
/// one that still does not fit (it then counts under [`DEVICE_RESOURCE`] only).
fn model_resource(kind: &str, model: &str) -> Option<String> {
    let name = format!("{kind}-{model}");
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let valid = name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && edge_ok(name.chars().next())
        && edge_ok(name.chars().last());
    valid.then(|| format!("{PREFIX}{name}"))
}

fn device(id: String, resource: Option<String>, problem: Option<String>) -> NodeDevice {
    NodeDevice {
        id,
        resource: resource.unwrap_or_else(|| DEVICE_RESOURCE.to_string()),
        health: if problem.is_none() {
            HEALTHY
        } else {
            UNHEALTHY
        }
        .to_string(),
        message: problem,
    }
}

/// The devices of the robots answered on one robot socket.
pub fn robot_devices(answer: &Answer<RobotInfo>, last: &[NodeDevice]) -> Vec<NodeDevice> {
    match answer {
        Answer::Listed(robots) => robots
            .iter()
            .map(|r| {
                let problem = (r.state == RobotState::Error as i32)
                    .then(|| format!("robot {} is in ERROR: {}", r.robot_id, r.message));
                device(
                    format!("robot-{}", r.robot_id),
                    model_resource("robot", &r.robot_type),
                    problem,
                )
            })
            .collect(),
        Answer::Failed(why) => unanswered(last, "robot-", why),
    }
}

/// The devices of the cameras answered on the camera socket.
pub fn camera_devices(answer: &Answer<CameraDescriptor>, last: &[NodeDevice]) -> Vec<NodeDevice> {
    match answer {
        Answer::Listed(cameras) => cameras
            .iter()
            .map(|c| {
                let problem = (c.state == CameraState::Error as i32)
                    .then(|| format!("camera {} is in ERROR: {}", c.camera_id, c.message));
                device(
                    format!("camera-{}", c.camera_id),
                    model_resource("camera", &c.camera_type),
                    problem,
                )
            })
            .collect(),
        Answer::Failed(why) => unanswered(last, "camera-", why),
    }
}

/// The devices of kind `prefix` last seen, unhealthy because their socket did not answer.
fn unanswered(last: &[NodeDevice], prefix: &str, why: &str) -> Vec<NodeDevice> {
    last.iter()
        .filter(|d| d.id.starts_with(prefix))
        .map(|d| NodeDevice {
            health: UNHEALTHY.to_string(),
            message: Some(format!("the embodied runtime does not answer: {why}")),
            ..d.clone()
        })
        .collect()
}

/// The Node's device resources, labels and list from `devices` (sorted by ID).
pub fn node_devices(mut devices: Vec<NodeDevice>) -> NodeDevices {
    devices.sort_by(|a, b| a.id.cmp(&b.id));
    devices.dedup_by(|a, b| a.id == b.id);
    let mut capacity: BTreeMap<String, u64> = BTreeMap::new();
    let mut allocatable: BTreeMap<String, u64> = BTreeMap::new();
    let mut labels = BTreeMap::new();
    for d in &devices {
        let healthy = d.health == HEALTHY;
        let mut names = vec![DEVICE_RESOURCE.to_string()];
        if d.resource != DEVICE_RESOURCE {
            names.push(d.resource.clone());
            labels.insert(d.resource.clone(), "true".to_string());
        }
        for name in names {
            *capacity.entry(name.clone()).or_default() += 1;
            *allocatable.entry(name).or_default() += u64::from(healthy);
        }
    }
    let list = |counts: BTreeMap<String, u64>| -> ResourceList {
        counts
            .into_iter()
            .map(|(k, v)| (k, Quantity(v.to_string())))
            .collect()
    };
    NodeDevices {
        capacity: list(capacity),
        allocatable: list(allocatable),
        labels,
        devices,
    }
}

/// Whether `name` is a resource or label this module owns (the agent's node registration
/// leaves them alone).
pub fn is_device_key(name: &str) -> bool {
    name.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn robot(id: &str, kind: &str, state: RobotState) -> RobotInfo {
        RobotInfo {
            robot_id: id.into(),
            robot_type: kind.into(),
            state: state as i32,
            message: "launch exited with status 1".into(),
            ..Default::default()
        }
    }

    fn camera(id: &str, driver: &str, state: CameraState) -> CameraDescriptor {
        CameraDescriptor {
            camera_id: id.into(),
            camera_type: driver.into(),
            state: state as i32,
            message: "capture failed".into(),
            ..Default::default()
        }
    }

    fn q(list: &ResourceList, name: &str) -> Option<String> {
        list.get(name).map(|q| q.0.clone())
    }

    #[test]
    fn devices_count_per_model_and_only_healthy_ones_are_allocatable() {
        let robots = Answer::Listed(vec![
            robot("arm-0", "sim-arm", RobotState::Stopped),
            robot("arm-1", "sim-arm", RobotState::Error),
            robot("x", "-bad-", RobotState::Running),
        ]);
        let cameras = Answer::Listed(vec![camera("cam-0", "sim", CameraState::Closed)]);
        let mut all = robot_devices(&robots, &[]);
        all.extend(camera_devices(&cameras, &[]));
        let node = node_devices(all);
        assert_eq!(q(&node.capacity, DEVICE_RESOURCE).as_deref(), Some("4"));
        assert_eq!(q(&node.allocatable, DEVICE_RESOURCE).as_deref(), Some("3"));
        assert_eq!(
            q(&node.capacity, "rlinf.io/robot-sim-arm").as_deref(),
            Some("2")
        );
        assert_eq!(
            q(&node.allocatable, "rlinf.io/robot-sim-arm").as_deref(),
            Some("1")
        );
        assert_eq!(
            q(&node.allocatable, "rlinf.io/camera-sim").as_deref(),
            Some("1")
        );
        assert_eq!(
            node.labels.keys().collect::<Vec<_>>(),
            ["rlinf.io/camera-sim", "rlinf.io/robot-sim-arm"],
            "a model whose name is no resource name gets no label"
        );
        let arm1 = node
            .devices
            .iter()
            .find(|d| d.id == "robot-arm-1")
            .expect("arm-1");
        assert_eq!(arm1.health, UNHEALTHY);
        assert_eq!(
            arm1.message.as_deref(),
            Some("robot arm-1 is in ERROR: launch exited with status 1")
        );
        let odd = node.devices.iter().find(|d| d.id == "robot-x").expect("x");
        assert_eq!(odd.resource, DEVICE_RESOURCE, "counted as a device only");
    }

    #[test]
    fn a_socket_that_stops_answering_makes_its_devices_unhealthy() {
        let listed = Answer::Listed(vec![camera("cam-0", "sim", CameraState::Open)]);
        let before = camera_devices(&listed, &[]);
        let after = camera_devices(&Answer::Failed("connection refused".into()), &before);
        assert_eq!(after.len(), 1);
        assert_eq!(after[0].health, UNHEALTHY);
        assert!(
            after[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("connection refused"))
        );
        let node = node_devices(after);
        assert_eq!(
            q(&node.capacity, "rlinf.io/camera-sim").as_deref(),
            Some("1")
        );
        assert_eq!(
            q(&node.allocatable, "rlinf.io/camera-sim").as_deref(),
            Some("0")
        );
        assert!(camera_devices(&Answer::Failed("x".into()), &[]).is_empty());
    }
}
