//! `Node` (namespaced): a machine an agent runs tasks on (namespace = agent namespace).

use k8s_openapi::api::core::v1::NodeAddress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{AgentType, NodeEvent, PullProgress, ResourceList, string_enum};

/// Whether a node is reachable and accepts tasks.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum NodePhase {
    /// Agent connected, node healthy.
    Online,
    /// Agent gone, node not ready, or cordoned.
    Offline,
}
string_enum!(NodePhase { Online => "Online", Offline => "Offline" });

/// Where a node sits; value of the `rlark.io/node-category` label.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeCategory {
    /// A GPU/CPU server in a data center.
    Cloud,
    /// A machine at an edge site.
    Edge,
    /// A robot's own computer.
    Robot,
}
string_enum!(NodeCategory { Cloud => "cloud", Edge => "edge", Robot => "robot" });

/// Desired state of a Node.
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Node",
    namespaced,
    status = "NodeStatus",
    derive = "PartialEq",
    shortname = "rlnode",
    category = "rlark",
    doc = "Node: a machine of a cluster where the cluster's agent runs tasks.",
    printcolumn(
        name = "Agent",
        type_ = "string",
        description = "The agent (cluster ID) that reports the node.",
        json_path = ".metadata.labels.rlark\\.io/cluster-id"
    ),
    printcolumn(
        name = "Type",
        type_ = "string",
        description = "Runtime of the node's agent (Raw, Docker, Kubernetes).",
        json_path = ".spec.agentType"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "CPU",
        type_ = "string",
        description = "CPUs of the machine (status.capacity).",
        json_path = ".status.capacity.cpu"
    ),
    printcolumn(
        name = "Memory",
        type_ = "string",
        description = "Memory of the machine (status.capacity).",
        json_path = ".status.capacity.memory"
    ),
    printcolumn(
        name = "GPU",
        type_ = "string",
        description = "NVIDIA GPUs of the machine (status.capacity; empty: none).",
        json_path = ".status.capacity.nvidia\\.com/gpu"
    ),
    printcolumn(
        name = "Category",
        type_ = "string",
        description = "cloud, edge or robot.",
        json_path = ".metadata.labels.rlark\\.io/node-category",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Runtime of the node's agent.
    pub agent_type: AgentType,
    /// Cordon: no new task is placed on the node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
}

/// Observed state of a Node, reported by its agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Online or Offline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodePhase>,
    /// Why the node is in its phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Facts about the machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
    /// Addresses of the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<NodeAddress>,
    /// The node's disk is nearly full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_pressure: Option<bool>,
    /// Total resources of the machine.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    pub capacity: ResourceList,
    /// Resources available to tasks.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    pub allocatable: ResourceList,
    /// Resources requested by the tasks on the node.
    #[serde(default, skip_serializing_if = "ResourceList::is_empty")]
    pub used: ResourceList,
    /// Last time the agent reported the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_time: Option<Time>,
    /// Image pulls in progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_progress: Vec<PullProgress>,
    /// Recent events of the node and its pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<NodeEvent>,
    /// The pod network on this node (absent: the agent runs no domain data path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NodeNetwork>,
    /// The robots and cameras of the node's embodied runtime, with their health (an
    /// unhealthy one is not in `allocatable`; its `message` says why).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<NodeDevice>,
}

/// A robot or camera a node's agent found in its embodied runtime.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDevice {
    /// `robot-<id>` or `camera-<id>` (the IDs the device plugin uses too).
    pub id: String,
    /// The resource it counts under besides `rlinf.io/device`, e.g.
    /// `rlinf.io/robot-sim-arm`, `rlinf.io/camera-sim`.
    pub resource: String,
    /// `Healthy` or `Unhealthy`.
    pub health: String,
    /// Why it is unhealthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How a node's agent carries domain (pod network) traffic.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeNetwork {
    /// `kernel` (netfilter REDIRECT, kernel TCP) or `tun` (TUN device, userspace TCP/IP).
    pub mode: String,
    /// `host:port` where the agent accepts direct mTLS connections from other agents;
    /// absent: peers reach this node's members through the hub only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_address: Option<String>,
    /// Why the mode was chosen, or why the data path is not available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Facts about a node's machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// CPU architecture (`amd64`, `arm64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Kernel release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_version: Option<String>,
    /// Version of the rlark agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Operating system (`linux`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_system: Option<String>,
}
