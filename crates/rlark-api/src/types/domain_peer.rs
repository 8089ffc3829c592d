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
    /// Prefix length of the Domain's CIDR (0..=128).
    pub prefix_len: i32,
    /// Pods of the domain with their virtual and real addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<DomainPodInfo>,
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
}

/// Observed state of a DomainPeer (empty).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct DomainPeerStatus {}
