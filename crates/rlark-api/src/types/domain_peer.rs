//! `DomainPeer` (namespaced): what one agent namespace needs to know of a Domain.
//!
//! Unlike RLark's, it holds no key material: no private key is ever stored in a spec.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a DomainPeer (written by the Domain controller; name = domain name,
/// namespace = agent namespace).
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "DomainPeer",
    namespaced,
    status = "DomainPeerStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "rldpeer",
    category = "rlark",
    doc = "DomainPeer: the pods of a Domain as seen by one agent namespace.",
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.domain"),
    printcolumn(name = "Prefix", type_ = "integer", json_path = ".spec.prefixLen"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DomainPeerSpec {
    /// Name of the Domain.
    pub domain: String,
    /// The Domain's CIDR (`10.88.0.0/16`, `fd00:88::/64`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cidr: String,
    /// Prefix length of the Domain's CIDR (0..=128).
    pub prefix_len: i32,
    /// The members this agent namespace may reach (its own included), with their virtual
    /// addresses and where they run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<DomainPodInfo>,
    /// This namespace's replicas that have no address yet, and why (reason `NoDomainIP`
    /// when the Domain's pool is full).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<DomainPendingPod>,
}

/// A replica of this namespace waiting for an address.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainPendingPod {
    /// Pod name (`<task>-<i>`).
    pub name: String,
    /// Machine-readable reason (`NoDomainIP`).
    pub reason: String,
    /// Human-readable explanation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One pod of a Domain.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainPodInfo {
    /// Agent namespace of the pod (`rlark-<clusterID>`).
    #[serde(default)]
    pub global_namespace: String,
    /// Namespace of the pod in its own cluster.
    #[serde(default)]
    pub namespace: String,
    /// Name of the pod in its own cluster.
    #[serde(default)]
    pub name: String,
    /// Name of the control-plane Pod object.
    #[serde(default)]
    pub uid: String,
    /// Node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Virtual IP in the domain.
    pub ip: String,
    /// Real IP of the pod in its own cluster.
    #[serde(default, rename = "localIP", skip_serializing_if = "Option::is_none")]
    pub local_ip: Option<String>,
    /// Cluster ID of the agent running the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster: String,
    /// Task the pod is a replica of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// `host:port` where the pod's agent accepts direct (mTLS) agent-to-agent connections,
    /// as announced in its Node's `status.network.directAddress`; absent: relay only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_address: Option<String>,
}

/// Observed state of a DomainPeer, written by the namespace's agent: the paths its
/// members' connections took to each peer cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainPeerStatus {
    /// One entry per (peer cluster, path) this namespace's members used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<DomainPathStats>,
}

/// Traffic from this namespace's members to one peer cluster over one path.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainPathStats {
    /// Cluster ID of the destination members.
    pub peer: String,
    /// `local`, `direct` or `relay`.
    pub path: String,
    /// Connections opened (total since the agent started).
    #[serde(default)]
    pub connections: u64,
    /// Connections open now.
    #[serde(default)]
    pub active: u64,
    /// Bytes carried, both directions.
    #[serde(default)]
    pub bytes: u64,
    /// Connection attempts on this path that failed.
    #[serde(default)]
    pub failures: u64,
}
