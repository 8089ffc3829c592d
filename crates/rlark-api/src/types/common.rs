//! Types shared by several kinds.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Resource name (`cpu`, `memory`, `nvidia.com/gpu`, `rlinf.io/device`, ...) → quantity.
pub type ResourceList = BTreeMap<String, Quantity>;

/// Defines `as_str`, `Display`, `FromStr` and `ALL` for a unit-only enum whose JSON names
/// are given.
macro_rules! string_enum {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The JSON (and label-value) spelling.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = crate::types::UnknownVariant;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(crate::types::UnknownVariant {
                        value: s.to_string(),
                        supported: &[$($name),+],
                    }),
                }
            }
        }
    };
}
pub(crate) use string_enum;

/// A string that names no variant of an enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Unsupported value: {value:?}: supported values: {}",
    quoted_list(supported)
)]
pub struct UnknownVariant {
    /// The string given.
    pub value: String,
    /// The spellings accepted.
    pub supported: &'static [&'static str],
}

/// `"a", "b", "c"` (Kubernetes' spelling of a list of supported values).
pub(crate) fn quoted_list(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which runtime executes a task, and which kind of agent a node runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum AgentType {
    /// Kubernetes workloads (Deployment, StatefulSet, DaemonSet, Job) in the agent's cluster.
    Kubernetes,
    /// Containers through the Docker API on the node.
    Docker,
    /// Plain processes on the node.
    Raw,
}
string_enum!(AgentType { Kubernetes => "Kubernetes", Docker => "Docker", Raw => "Raw" });

impl AgentType {
    /// Name of the runtime block (`kubernetes`, `docker`, `raw`) this agent type requires.
    pub fn block_name(&self) -> &'static str {
        match self {
            AgentType::Kubernetes => "kubernetes",
            AgentType::Docker => "docker",
            AgentType::Raw => "raw",
        }
    }
}

/// One environment variable.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct EnvVar {
    /// Variable name (printable ASCII, no `=`).
    pub name: String,
    /// Value (empty when absent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub value: String,
}

/// Compute resources a task (replica) asks for and may not exceed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ResourceRequirements {
    /// Minimum amounts the scheduler reserves on the node.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: ResourceList,
    /// Maximum amounts; each request must not exceed its limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: ResourceList,
}

/// An event about a node or one of its pods, as agents report it (RLark's `NodeEvent`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeEvent {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Short CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last time the event happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_time: Option<Time>,
    /// How many times it happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// Component that reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `Node` or `Pod`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_kind: Option<String>,
    /// Name of the object it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_name: Option<String>,
}

/// Progress of one image pull on a node (RLark's `PullProgress`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullProgress {
    /// Image reference.
    pub image: String,
    /// Bytes downloaded so far.
    pub downloaded: i64,
    /// Total bytes (0 when unknown).
    pub total: i64,
    /// Bytes per second.
    pub speed: f64,
    /// Pull state, e.g. `Pulling`, `Done`, `Failed`.
    pub status: String,
    /// Detail, e.g. the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
