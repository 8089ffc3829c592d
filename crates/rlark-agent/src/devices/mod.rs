//! Robots and cameras of the node's embodied runtime on the agent's Node
//! (`rlark agent --embodied-socket-dir DIR`; docs/embodied.md, "Devices on Nodes").
//!
//! Every [`POLL_INTERVAL`] the reporter asks the runtime's sockets in DIR (`ros-ctrl.sock`
//! and `ros2-ctrl.sock`: ListRobots; `camera-ctrl.sock`: ListCameras; a socket file that is
//! not there has no devices), computes the device part of the Node ([`inventory`]) and,
//! when the Node does not show it yet, writes it: `status.capacity` / `status.allocatable`
//! entries `rlinf.io/...`, `status.devices`, and the model labels. It compares with the
//! stored Node, not with what it wrote last, so a Node registered again (which writes the
//! machine's resources) gets its devices back on the next poll.
//!
//! [`DeviceAccess`] also tells the runtime who may call which device: every replica of
//! this agent (holding devices or not), the processes that root it, and what it holds,
//! published in DIR's `holders.json` (`rlark_proto::holders`) whenever that changes; the
//! runtime decides every device call from it (docs/embodied.md, "Who may call a device").

pub mod allocator;
pub mod inventory;

use std::sync::{Arc, Mutex};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use rlark_api::types::{Node, NodeDevice};
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use rlark_proto::camera::v1::{CameraDescriptor, ListCamerasRequest};
use rlark_proto::holders::{Holders, ProcessRef, ReplicaHolder};
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use rlark_proto::robot::v1::{ListRobotsRequest, RobotInfo};
use rlark_proto::sockets::{CAMERA_SOCKET, REASON_METADATA, ROS_SOCKET, ROS2_SOCKET};
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::allocator::{Allocator, Offered};
use self::inventory::{Answer, NodeDevices};

/// Holder (a replica's Pod name) → the devices it holds that are unhealthy now (holders
/// whose devices are all healthy have an empty list).
pub type Problems = BTreeMap<String, Vec<NodeDevice>>;

/// What replicas need to get devices: the runtime's socket directory, the allocator the
/// reporter keeps up to date, the health of what each replica holds, and the replicas the
/// runtime is told of (module documentation).
#[derive(Clone, Debug)]
pub struct DeviceAccess {
    pub socket_dir: PathBuf,
    pub allocator: Arc<Mutex<Allocator>>,
    /// [`Allocator::problems`] as of the last poll; replicas whose Task says
    /// `onDeviceUnhealthy: Stop` follow it.
    problems: Arc<watch::Sender<Problems>>,
    /// Replica (Pod name) → what the runtime is told of it.
    replicas: Arc<Mutex<BTreeMap<String, Published>>>,
}

/// One replica as [`DeviceAccess`] publishes it.
#[derive(Clone, Debug)]
struct Published {
    /// `<namespace>/<pod>`.
    name: String,
    roots: Vec<ProcessRef>,
    /// Users only this replica runs as.
    uids: Vec<u32>,
    starting: bool,
    /// Left in the file by an earlier agent and not taken up by a worker yet: its devices
    /// as that agent published them. Dropped once its processes are gone.
    carried: Option<Vec<String>>,
}

impl DeviceAccess {
    /// The access to the runtime in `socket_dir`. The replicas an earlier agent published
    /// there are kept (they may still run, to be adopted) and the file is written now, so
    /// the runtime authorizes device calls from this agent's start on.
    pub fn new(socket_dir: PathBuf) -> Self {
        let carried = rlark_proto::holders::read(&socket_dir)
            .map(|h| h.replicas)
            .unwrap_or_default();
        let replicas = carried
            .into_iter()
            .filter_map(|r| {
                let pod = r.name.rsplit('/').next()?.to_string();
                let published = Published {
                    name: r.name,
                    roots: r.roots,
                    uids: r.uids,
                    starting: false,
                    carried: Some(r.devices),
                };
                Some((pod, published))
            })
            .collect();
        let access = Self {
            socket_dir,
            allocator: Arc::default(),
            problems: Arc::new(watch::Sender::new(Problems::new())),
            replicas: Arc::new(Mutex::new(replicas)),
        };
        access.publish();
        access
    }

    /// Gives `holder` devices ([`Allocator::allocate`]) and tells the runtime.
    pub fn allocate(
        &self,
        holder: &str,
        wants: &BTreeMap<String, u64>,
        prefer: &[String],
    ) -> Result<Vec<Offered>, String> {
        let taken = self.lock().allocate(holder, wants, prefer);
        self.publish();
        taken
    }

    /// Frees `holder`'s devices ([`Allocator::release`]); the runtime is told when
    /// `publish` (not when the agent leaves the replica running for the next one: it
    /// keeps calling its devices meanwhile).
    pub fn release(&self, holder: &str, publish: bool) {
        self.lock().release(holder);
        if publish {
            self.publish();
        }
    }

    /// Replica `pod` (`name`: `<namespace>/<pod>`) is about to start: calls from processes
    /// the runtime cannot place may wait for it ([`Self::replica_running`]).
    pub fn replica_starting(&self, pod: &str, name: &str) {
        self.set_replica(pod, name, Vec::new(), Vec::new(), true);
    }

    /// Replica `pod` runs with `roots` (empty: it is not running, or its processes
    /// cannot be told) and, when it runs as a user no other replica has, `uids` (its exec
    /// and SSH sessions, which the agent starts beside it, are its by their user).
    pub fn replica_running(&self, pod: &str, name: &str, roots: Vec<ProcessRef>, uids: Vec<u32>) {
        self.set_replica(pod, name, roots, uids, false);
    }

    /// Replica `pod`'s run is over: forgotten.
    pub fn replica_ended(&self, pod: &str) {
        let removed = self.replicas().remove(pod).is_some();
        if removed {
            self.publish();
        }
    }

    fn set_replica(
        &self,
        pod: &str,
        name: &str,
        roots: Vec<ProcessRef>,
        uids: Vec<u32>,
        starting: bool,
    ) {
        self.replicas().insert(
            pod.to_string(),
            Published {
                name: name.to_string(),
                roots,
                uids,
                starting,
                carried: None,
            },
        );
        self.publish();
    }

    fn replicas(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Published>> {
        // A plain table: a panic elsewhere leaves it consistent.
        self.replicas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Write `holders.json` from the table and the allocator (under the table's lock, so
    /// the last write is the latest state). Failures are logged: the runtime keeps the
    /// last table it read.
    pub fn publish(&self) {
        let mut replicas = self.replicas();
        // Carried entries whose processes are gone are over.
        replicas.retain(|_, r| {
            r.carried.is_none()
                || r.roots
                    .iter()
                    .any(|root| rlark_process::start_ticks(root.pid) == Some(root.start_ticks))
        });
        let holders = {
            let allocator = self.lock();
            Holders {
                replicas: replicas
                    .iter()
                    .map(|(pod, r)| ReplicaHolder {
                        name: r.name.clone(),
                        roots: r.roots.clone(),
                        uids: r.uids.clone(),
                        starting: r.starting,
                        devices: match &r.carried {
                            Some(devices) => devices.clone(),
                            None => allocator
                                .held_by(pod)
                                .into_iter()
                                .map(|o| o.device.id)
                                .collect(),
                        },
                    })
                    .collect(),
            }
        };
        if let Err(error) = rlark_proto::holders::publish(&self.socket_dir, &holders) {
            tracing::warn!(%error, "cannot tell the embodied runtime who holds which device");
        }
    }

    /// Replace what the runtime offers ([`Allocator::set_offered`]) and publish the
    /// holders' problems when they changed.
    pub fn set_offered(&self, offered: Vec<Offered>) {
        let problems = {
            let mut allocator = self.lock();
            allocator.set_offered(offered);
            allocator.problems()
        };
        self.problems.send_if_modified(|current| {
            let changed = *current != problems;
            if changed {
                *current = problems;
            }
            changed
        });
    }

    /// Follows the holders' problems (marked changed at each change).
    pub fn problems(&self) -> watch::Receiver<Problems> {
        self.problems.subscribe()
    }

    /// The allocator (a plain table: a panic elsewhere leaves it consistent).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Allocator> {
        self.allocator
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How often the runtime is asked: a device that goes unhealthy leaves `allocatable`
/// within this (plus one Node write).
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How long one list call may take before the socket counts as not answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Reports the devices of the runtime at `socket_dir` on Node `node` (in `nodes`' namespace).
pub struct DeviceReporter {
    nodes: Api<Node>,
    node: String,
    access: DeviceAccess,
    /// Per socket, the devices of the last poll (a socket that stops answering keeps
    /// them, unhealthy).
    last: BTreeMap<&'static str, Vec<NodeDevice>>,
    /// Robot ID → (ROS master URI, ROS 2 domain), from the last answers.
    ros: BTreeMap<String, (String, i32)>,
    /// Pod → the unhealthy devices last written into its status.
    written: BTreeMap<String, Vec<NodeDevice>>,
}

impl DeviceReporter {
    pub fn new(nodes: Api<Node>, node: &str, access: DeviceAccess) -> Self {
        Self {
            nodes,
            node: node.to_string(),
            access,
            last: BTreeMap::new(),
            ros: BTreeMap::new(),
            written: BTreeMap::new(),
        }
    }

    /// Poll until `shutdown`. Failures are logged and retried at the next poll.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let devices = self.poll().await;
            if let Err(error) = self.write(&devices).await {
                tracing::warn!(%error, node = %self.node, "write the node's devices (retried next poll)");
            }
            self.write_holders().await;
        }
    }

    /// Ask every socket; the Node's device part. What is on offer goes to the allocator.
    pub async fn poll(&mut self) -> NodeDevices {
        let dir = self.access.socket_dir.clone();
        for socket in [ROS_SOCKET, ROS2_SOCKET] {
            let last = self.last.remove(socket).unwrap_or_default();
            let devices = match ask_robots(&dir.join(socket)).await {
                None => Vec::new(),
                Some(answer) => {
                    if let Answer::Listed(robots) = &answer {
                        for r in robots {
                            let ros = (r.ros_master_uri.clone(), r.ros_domain_id);
                            self.ros.insert(r.robot_id.clone(), ros);
                        }
                    }
                    inventory::robot_devices(&answer, &last)
                }
            };
            self.last.insert(socket, devices);
        }
        let socket = CAMERA_SOCKET;
        let last = self.last.remove(socket).unwrap_or_default();
        let devices = match ask_cameras(&dir.join(socket)).await {
            None => Vec::new(),
            Some(answer) => inventory::camera_devices(&answer, &last),
        };
        self.last.insert(socket, devices);
        let mut offered = Vec::new();
        for (socket, devices) in &self.last {
            for device in devices {
                let robot = device
                    .id
                    .strip_prefix("robot-")
                    .and_then(|id| self.ros.get(id));
                offered.push(Offered {
                    device: device.clone(),
                    socket,
                    ros_master_uri: robot.map(|r| r.0.clone()).filter(|u| !u.is_empty()),
                    ros_domain_id: robot.filter(|_| *socket == ROS2_SOCKET).map(|r| r.1),
                });
            }
        }
        let all: Vec<NodeDevice> = offered.iter().map(|o| o.device.clone()).collect();
        self.access.set_offered(offered);
        inventory::node_devices(all)
    }

    /// Make the stored Node show `devices` (no write when it does).
    async fn write(&self, devices: &NodeDevices) -> Result<(), kube::Error> {
        let Some(node) = self.nodes.get_opt(&self.node).await? else {
            // Not registered (yet, or again): the node reporter does that.
            return Ok(());
        };
        let (status, labels) = patches(&node, devices);
        let params = PatchParams::default();
        if let Some(labels) = labels {
            let body = json!({"metadata": {"labels": labels}});
            self.nodes
                .patch(&self.node, &params, &Patch::Merge(&body))
                .await?;
        }
        if let Some(status) = status {
            let body = json!({ "status": status });
            self.nodes
                .patch_status(&self.node, &params, &Patch::Merge(&body))
                .await?;
            tracing::info!(node = %self.node, devices = devices.devices.len(), allocatable = ?devices.allocatable, "node devices written");
        }
        Ok(())
    }
}

impl DeviceReporter {
    /// Tell every replica holding devices which of them are unhealthy now (Pod
    /// `status.unhealthyDevices`), when that changed.
    async fn write_holders(&mut self) {
        let problems = self.access.lock().problems();
        let pods: Api<rlark_api::types::Pod> =
            Api::namespaced(self.nodes.clone().into_client(), &self.namespace());
        let gone: Vec<String> = self
            .written
            .keys()
            .filter(|pod| !problems.contains_key(*pod))
            .cloned()
            .collect();
        for pod in gone {
            // Released: its record no longer applies.
            self.written.remove(&pod);
        }
        for (pod, unhealthy) in problems {
            if self.written.get(&pod).unwrap_or(&Vec::new()) == &unhealthy {
                continue;
            }
            let list = if unhealthy.is_empty() {
                Value::Null
            } else {
                json!(unhealthy)
            };
            let body = json!({"status": {"unhealthyDevices": list}});
            match pods
                .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    tracing::info!(%pod, unhealthy = unhealthy.len(), "replica's device health written");
                    self.written.insert(pod, unhealthy);
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, %pod, "write the replica's device health (retried next poll)");
                }
            }
        }
    }

    fn namespace(&self) -> String {
        self.nodes.namespace().unwrap_or_default().to_string()
    }
}

/// `devices` (what a replica held) as `id: why` for messages: `robot-arm-0: simulated
/// arm fault: boom; camera-cam-0: ...`.
pub fn describe_unhealthy(devices: &[NodeDevice]) -> String {
    devices
        .iter()
        .map(|d| match d.message.as_deref().filter(|m| !m.is_empty()) {
            Some(why) => format!("{}: {why}", d.id),
            None => d.id.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The backstop of the safety watchdog (docs/embodied.md, "Safety watchdog"): when a
/// replica's run ends, stop every robot among the `devices` it held that still runs
/// something and has an owner (`owner_pid` not 0: not started detached). `holder` names the
/// replica in the robots' stop message. Each call is bounded by [`CALL_TIMEOUT`]; failures
/// are logged (the runtime's own watchdog is the first line).
pub async fn stop_held_robots(socket_dir: &Path, devices: &[Offered], holder: &str) {
    for offered in devices {
        let Some(robot) = offered.device.id.strip_prefix("robot-") else {
            continue;
        };
        let path = socket_dir.join(offered.socket);
        let reason = format!("replica {holder}, which held it, ended");
        let call = stop_if_owned(&path, robot, &reason);
        match tokio::time::timeout(CALL_TIMEOUT, call).await {
            Ok(Ok(true)) => {
                tracing::info!(robot, replica = %holder, "stopped a robot the ended replica held");
            }
            Ok(Ok(false)) => {
                tracing::debug!(robot, replica = %holder, "robot stopped already or detached; left alone");
            }
            Ok(Err(error)) => {
                tracing::warn!(robot, replica = %holder, %error, "could not stop a robot the ended replica held");
            }
            Err(_) => {
                tracing::warn!(robot, replica = %holder, "the embodied runtime did not answer within {CALL_TIMEOUT:?}; robot not stopped");
            }
        }
    }
}

/// StopRobot on `robot` (with `reason`) unless it is STOPPED or has no owner. Ok(whether
/// it was stopped).
async fn stop_if_owned(path: &Path, robot: &str, reason: &str) -> Result<bool, String> {
    use rlark_proto::robot::v1::{GetRobotStatusRequest, RobotState, StopRobotRequest};
    let channel = rlark_proto::client::connect(path)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = RobotControllerClient::new(channel);
    let status = client
        .get_robot_status(GetRobotStatusRequest {
            robot_id: robot.to_string(),
        })
        .await
        .map_err(|s| format!("GetRobotStatus: {}", s.message()))?
        .into_inner();
    if status.state == RobotState::Stopped as i32 || status.owner_pid == 0 {
        return Ok(false);
    }
    let mut request = tonic::Request::new(StopRobotRequest {
        robot_id: robot.to_string(),
    });
    if let Ok(value) = reason.parse() {
        request.metadata_mut().insert(REASON_METADATA, value);
    }
    client
        .stop_robot(request)
        .await
        .map_err(|s| format!("StopRobot: {}", s.message()))?;
    Ok(true)
}

/// ListRobots on the socket at `path`; `None` when there is no socket file.
async fn ask_robots(path: &Path) -> Option<Answer<RobotInfo>> {
    ask(path, |channel| async move {
        let reply = RobotControllerClient::new(channel)
            .list_robots(ListRobotsRequest::default())
            .await
            .map_err(|s| format!("ListRobots: {}", s.message()))?;
        Ok(reply.into_inner().robots)
    })
    .await
}

/// ListCameras on the socket at `path`; `None` when there is no socket file.
async fn ask_cameras(path: &Path) -> Option<Answer<CameraDescriptor>> {
    ask(path, |channel| async move {
        let reply = CameraControllerClient::new(channel)
            .list_cameras(ListCamerasRequest::default())
            .await
            .map_err(|s| format!("ListCameras: {}", s.message()))?;
        Ok(reply.into_inner().cameras)
    })
    .await
}

/// `list` over a channel to the socket at `path`, within [`CALL_TIMEOUT`]; `None` when
/// there is no socket file, [`Answer::Failed`] when the connection or the call fails.
async fn ask<T, F, Fut>(path: &Path, list: F) -> Option<Answer<T>>
where
    F: FnOnce(tonic::transport::Channel) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, String>>,
{
    if !path.exists() {
        return None;
    }
    let call = async {
        let channel = rlark_proto::client::connect(path)
            .await
            .map_err(|e| e.to_string())?;
        list(channel).await
    };
    Some(match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(found)) => Answer::Listed(found),
        Ok(Err(why)) => Answer::Failed(why),
        Err(_) => Answer::Failed(format!("no answer within {CALL_TIMEOUT:?}")),
    })
}

/// Merge patches that make `node` show `devices`: (status, labels), each `None` when
/// nothing there changes. Only keys under `rlinf.io/` are touched: the machine's resources
/// and other labels belong to the node reporter and the user.
pub fn patches(node: &Node, devices: &NodeDevices) -> (Option<Value>, Option<Value>) {
    let status = node.status.clone().unwrap_or_default();
    let mut status_patch = Map::new();
    for (field, current, desired) in [
        ("capacity", &status.capacity, &devices.capacity),
        ("allocatable", &status.allocatable, &devices.allocatable),
    ] {
        let mut changes = Map::new();
        for (name, quantity) in current.iter().filter(|(k, _)| inventory::is_device_key(k)) {
            match desired.get(name) {
                None => {
                    changes.insert(name.clone(), Value::Null);
                }
                Some(q) if q != quantity => {
                    changes.insert(name.clone(), json!(q));
                }
                Some(_) => {}
            }
        }
        for (name, quantity) in desired.iter().filter(|(k, _)| !current.contains_key(*k)) {
            changes.insert(name.clone(), json!(quantity));
        }
        if !changes.is_empty() {
            status_patch.insert(field.to_string(), Value::Object(changes));
        }
    }
    if status.devices != devices.devices {
        let list = if devices.devices.is_empty() {
            Value::Null
        } else {
            json!(devices.devices)
        };
        status_patch.insert("devices".to_string(), list);
    }
    let current_labels = node.metadata.labels.clone().unwrap_or_default();
    let mut label_patch = Map::new();
    for name in current_labels
        .keys()
        .filter(|k| inventory::is_device_key(k))
    {
        if !devices.labels.contains_key(name) {
            label_patch.insert(name.clone(), Value::Null);
        }
    }
    for (name, value) in &devices.labels {
        if current_labels.get(name) != Some(value) {
            label_patch.insert(name.clone(), json!(value));
        }
    }
    (
        (!status_patch.is_empty()).then_some(Value::Object(status_patch)),
        (!label_patch.is_empty()).then_some(Value::Object(label_patch)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use inventory::{Answer, camera_devices, node_devices};
    use rlark_proto::camera::v1::CameraState;

    fn cams(state: CameraState) -> NodeDevices {
        node_devices(camera_devices(
            &Answer::Listed(vec![CameraDescriptor {
                camera_id: "cam-0".into(),
                camera_type: "sim".into(),
                state: state as i32,
                ..Default::default()
            }]),
            &[],
        ))
    }

    #[test]
    fn patches_touch_only_device_keys_and_only_what_differs() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"rlark.io/cluster-id": "c", "rlinf.io/robot-old": "true"}},
            "spec": {"agentType": "Raw"},
            "status": {"capacity": {"cpu": "2", "rlinf.io/robot-old": "1"},
                       "allocatable": {"cpu": "2", "rlinf.io/robot-old": "1"}},
        }))
        .expect("node");
        let healthy = cams(CameraState::Closed);
        let (status, labels) = patches(&node, &healthy);
        let status = status.expect("a status patch");
        assert_eq!(status["capacity"]["rlinf.io/robot-old"], Value::Null);
        assert_eq!(status["capacity"]["rlinf.io/camera-sim"], "1");
        assert_eq!(status["allocatable"]["rlinf.io/device"], "1");
        assert!(
            status["capacity"].get("cpu").is_none(),
            "not ours: {status}"
        );
        assert_eq!(status["devices"][0]["id"], "camera-cam-0");
        let labels = labels.expect("a label patch");
        assert_eq!(
            labels,
            json!({"rlinf.io/robot-old": null, "rlinf.io/camera-sim": "true"})
        );

        // Applied: nothing more to write.
        let mut stored = node.status.take().unwrap_or_default();
        stored.capacity.retain(|k, _| !inventory::is_device_key(k));
        stored
            .allocatable
            .retain(|k, _| !inventory::is_device_key(k));
        stored.capacity.extend(healthy.capacity.clone());
        stored.allocatable.extend(healthy.allocatable.clone());
        stored.devices = healthy.devices.clone();
        node.status = Some(stored);
        let mut labels = node.metadata.labels.take().unwrap_or_default();
        labels.remove("rlinf.io/robot-old");
        labels.extend(healthy.labels.clone());
        node.metadata.labels = Some(labels);
        assert_eq!(patches(&node, &healthy), (None, None));

        // The camera fails: allocatable drops, the list says why; labels stay.
        let failed = cams(CameraState::Error);
        let (status, labels) = patches(&node, &failed);
        let status = status.expect("a status patch");
        assert_eq!(
            status["allocatable"],
            json!({"rlinf.io/camera-sim": "0", "rlinf.io/device": "0"})
        );
        assert!(status.get("capacity").is_none());
        assert_eq!(status["devices"][0]["health"], "Unhealthy");
        assert_eq!(labels, None);
    }
}
