//! `Pod` (namespaced): control-plane mirror of one replica of a Task.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{PullProgress, string_enum};
use super::node::NodeDevice;

/// Phase of a Pod.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum PodPhase {
    /// Created, not running yet.
    Pending,
    /// Running.
    Running,
    /// Exited 0.
    Succeeded,
    /// Exited non-zero, killed, or lost.
    Failed,
}
string_enum!(PodPhase {
    Pending => "Pending",
    Running => "Running",
    Succeeded => "Succeeded",
    Failed => "Failed",
});

/// Desired state of a Pod (written by the agent; namespace = agent namespace).
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Pod",
    namespaced,
    status = "PodStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "rlpod",
    category = "rlark",
    doc = "Pod: control-plane mirror of one replica (pod, container or process group) of a Task.",
    printcolumn(name = "Task", type_ = "string", json_path = ".spec.taskName"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Domain the pod joins (from its Task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Namespace of the Task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_namespace: Option<String>,
    /// Name of the Task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_name: Option<String>,
    /// Namespace of the pod in its own cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    /// Name of the pod (or process group) in its own cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// Index of this replica within the Task (0-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_index: Option<i32>,
}

/// Observed state of a Pod, reported by the agent.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// Phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<PodPhase>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Short CamelCase reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Real IP of the pod in its own cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Exit code of the (main) process once finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Times the pod's processes were restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_count: Option<i32>,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Time>,
    /// The image pulls of the pod's containers while it is Pending (runtimes that pull
    /// images: Kubernetes), one per container image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pull_progress: Vec<PullProgress>,
    /// The robots and cameras the replica holds (`robot-<id>`, `camera-<id>`), given by
    /// its agent when it started; they are its alone until it ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Those of `devices` that are unhealthy now, with why (written by the agent while the
    /// replica holds them; the Task gets the condition `DeviceUnhealthy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_devices: Vec<NodeDevice>,
    /// The TensorBoard the agent runs beside the replica for its Task's `tensorBoardDir`
    /// (raw replicas; a sidecar in member Pods), while the replica runs: its port, or why
    /// none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_board: Option<PodTensorBoard>,
}

/// The TensorBoard of a replica (`PodStatus.tensorBoard`). Unset fields serialize as
/// `null`, so that in the agent's merge patches a new value replaces the whole object
/// (a port reported by an earlier agent does not stay beside a new `message`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTensorBoard {
    /// The port it serves on: on the replica's node's loopback (raw replicas) or the Pod's
    /// IP (member Pods); reach it through the task proxy,
    /// `/rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/`. Unset when it could not be
    /// started.
    #[serde(default)]
    pub port: Option<i32>,
    /// The log directory it reads (`tensorBoardDir` resolved against the working
    /// directory).
    #[serde(default)]
    pub log_dir: Option<String>,
    /// Why it does not run (when `port` is unset).
    #[serde(default)]
    pub message: Option<String>,
}
