//! What the device plugin advertises and allocates: one device per configured robot
//! (`robot-<id>`) and camera (`camera-<id>`), their health from the controllers, and the
//! environment and mounts an allocated container gets.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rlark_proto::camera::v1::CameraState;
use rlark_proto::deviceplugin::v1beta1 as api;
use rlark_proto::robot::v1::RobotState;

use crate::camera::CameraController;
use crate::config::{Backend, CameraDriver, EmbodiedConfig};
use crate::robot::RobotController;

use super::{CONTAINER_BIN_DIR, DEVICES_ANNOTATION, HEALTHY, UNHEALTHY};

pub use crate::access::{camera_device_id, robot_device_id};

/// What a device stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Robot(String),
    Camera(String),
}

/// A device and why it is (un)healthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub id: String,
    /// `None` = healthy; else why not.
    pub problem: Option<String>,
}

/// The devices of one runtime, read from its configuration and controllers.
pub struct Inventory {
    config: Arc<EmbodiedConfig>,
    robots: Arc<RobotController>,
    cameras: Arc<CameraController>,
    /// Absolute socket directory (mounted at the same path in containers).
    socket_dir: PathBuf,
    /// Host directory mounted at [`CONTAINER_BIN_DIR`].
    bin_dir: PathBuf,
    /// Device ID -> subject, in advertising order (robots, then cameras).
    devices: Vec<(String, Subject)>,
}

impl Inventory {
    pub fn new(
        config: Arc<EmbodiedConfig>,
        robots: Arc<RobotController>,
        cameras: Arc<CameraController>,
        socket_dir: &Path,
    ) -> Self {
        let devices = config
            .robots
            .iter()
            .map(|r| (robot_device_id(&r.id), Subject::Robot(r.id.clone())))
            .chain(
                config
                    .cameras
                    .iter()
                    .map(|c| (camera_device_id(&c.id), Subject::Camera(c.id.clone()))),
            )
            .collect();
        Self {
            bin_dir: config.device_plugin.bin_dir.clone(),
            config,
            robots,
            cameras,
            socket_dir: socket_dir.to_path_buf(),
            devices,
        }
    }

    /// The device IDs, in advertising order.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|(id, _)| id.as_str())
    }

    fn subject(&self, id: &str) -> Option<&Subject> {
        self.devices.iter().find(|(d, _)| d == id).map(|(_, s)| s)
    }

    /// The health of every device now: a robot in ERROR, a camera in ERROR (its capture
    /// failed) or a V4L2 camera whose device node is gone (unplugged) is unhealthy.
    pub fn health(&self) -> Vec<Health> {
        self.devices
            .iter()
            .map(|(id, subject)| Health {
                id: id.clone(),
                problem: match subject {
                    Subject::Robot(robot) => self.robot_problem(robot),
                    Subject::Camera(camera) => self.camera_problem(camera),
                },
            })
            .collect()
    }

    fn robot_problem(&self, id: &str) -> Option<String> {
        let Ok(info) = self.robots.status(id) else {
            return Some(format!("robot {id} is not known to the controller"));
        };
        (info.state == RobotState::Error as i32)
            .then(|| format!("robot {id} is in ERROR: {}", info.message))
    }

    fn camera_problem(&self, id: &str) -> Option<String> {
        let spec = self.config.cameras.iter().find(|c| c.id == id)?;
        if spec.driver == CameraDriver::V4l2
            && let Some(device) = &spec.device
            && !device.exists()
        {
            return Some(format!(
                "camera {id}: device {} is missing (unplugged?)",
                device.display()
            ));
        }
        match self.cameras.info(id) {
            Ok(info) if info.state == CameraState::Error as i32 => {
                Some(format!("camera {id} is in ERROR: {}", info.message))
            }
            Ok(_) => None,
            Err(e) => Some(format!("camera {id}: {e}")),
        }
    }

    /// The ListAndWatch view of `health`.
    pub fn to_devices(health: &[Health]) -> Vec<api::Device> {
        health
            .iter()
            .map(|h| api::Device {
                id: h.id.clone(),
                health: if h.problem.is_none() {
                    HEALTHY
                } else {
                    UNHEALTHY
                }
                .into(),
                topology: None,
            })
            .collect()
    }

    /// What a container allocated `ids` gets. Unknown IDs are an error naming them.
    pub fn allocate(&self, ids: &[String]) -> Result<api::ContainerAllocateResponse, String> {
        let unknown: Vec<&str> = ids
            .iter()
            .map(String::as_str)
            .filter(|id| self.subject(id).is_none())
            .collect();
        if !unknown.is_empty() {
            return Err(format!(
                "unknown device ID(s) {} (this plugin has: {})",
                unknown.join(", "),
                self.ids().collect::<Vec<_>>().join(", ")
            ));
        }
        let robots: BTreeSet<&str> = ids
            .iter()
            .filter_map(|id| match self.subject(id) {
                Some(Subject::Robot(robot)) => Some(robot.as_str()),
                _ => None,
            })
            .collect();

        let config = &self.config;
        let socket = |name: &str| self.socket_dir.join(name).display().to_string();
        let mut envs = BTreeMap::new();
        let mut set = |key: &str, value: String| {
            envs.insert(key.to_string(), value);
        };
        set("RLINF_EMBODIED_RUNTIME_ENABLED", "1".into());
        set("RLINF_EMBODIED_PATH", CONTAINER_BIN_DIR.into());
        let has =
            |backends: &[Backend]| config.robots.iter().any(|r| backends.contains(&r.backend));
        if has(&[Backend::Ros1, Backend::Sim]) {
            set("RLINF_EMBODIED_ROS_ENABLED", "1".into());
            set("RLINF_EMBODIED_ROS_SOCKET_PATH", socket(crate::ROS_SOCKET));
        }
        if has(&[Backend::Ros2]) {
            set("RLINF_EMBODIED_ROS2_ENABLED", "1".into());
            set(
                "RLINF_EMBODIED_ROS2_SOCKET_PATH",
                socket(crate::ROS2_SOCKET),
            );
        }
        if self.cameras.has_cameras() {
            set("RLINF_EMBODIED_CAMERA_ENABLED", "1".into());
            set(
                "RLINF_EMBODIED_CAMERA_SOCKET_PATH",
                socket(crate::CAMERA_SOCKET),
            );
        }
        if !config.macvlans.is_empty() {
            set("RLINF_EMBODIED_DEVINIT_ENABLED", "1".into());
            set(
                "RLINF_EMBODIED_DEVINIT_SOCKET_PATH",
                socket(crate::DEVINIT_SOCKET),
            );
        }
        // Exactly one robot: the container's ROS tools reach it without configuration.
        if let [robot] = robots.iter().collect::<Vec<_>>()[..]
            && let Some(robot) = config.robot(robot)
        {
            match robot.backend {
                Backend::Ros1 => {
                    if let Some(port) = robot.master_port {
                        set(
                            "ROS_MASTER_URI",
                            crate::robot::ros::master_uri(&config.ros.master_host, port),
                        );
                    }
                }
                Backend::Ros2 => {
                    if let Some(domain) = robot.domain_id {
                        set("ROS_DOMAIN_ID", domain.to_string());
                    }
                }
                Backend::Sim => {}
            }
        }

        let mut mounts = vec![api::Mount {
            container_path: self.socket_dir.display().to_string(),
            host_path: self.socket_dir.display().to_string(),
            read_only: true,
        }];
        // A missing host directory would fail the container's start: mount only what exists.
        if self.bin_dir.is_dir() {
            mounts.push(api::Mount {
                container_path: CONTAINER_BIN_DIR.into(),
                host_path: self.bin_dir.display().to_string(),
                read_only: true,
            });
        }
        Ok(api::ContainerAllocateResponse {
            envs,
            mounts,
            devices: Vec::new(),
            annotations: BTreeMap::from([(DEVICES_ANNOTATION.to_string(), ids.join(","))]),
            cdi_devices: Vec::new(),
        })
    }

    /// A preferred allocation of `size` devices from `available`, with `must_include`:
    /// robots before cameras, each in configuration order (so a pod asking for one device
    /// gets a robot, and with it ROS_MASTER_URI or ROS_DOMAIN_ID).
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Vec<String> {
        let mut chosen: Vec<String> = Vec::new();
        for id in must_include {
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        for (id, _) in &self.devices {
            if chosen.len() >= size {
                break;
            }
            if available.contains(id) && !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        // IDs the kubelet offers that this plugin does not know come last.
        for id in available {
            if chosen.len() >= size {
                break;
            }
            if !chosen.contains(id) {
                chosen.push(id.clone());
            }
        }
        chosen
    }
}
