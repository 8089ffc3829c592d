//! `Domain` (cluster-scoped): a virtual IPv4/IPv6 network spanning clusters.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a Domain.
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Domain",
    status = "DomainStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "rldomain",
    category = "rlark",
    doc = "Domain: a virtual IPv4/IPv6 network across clusters; pods of tasks in the domain get stable addresses from its CIDR.",
    printcolumn(name = "CIDR", type_ = "string", json_path = ".spec.cidr"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// Network address and prefix, e.g. `10.88.0.0/16` or `fd00:88::/64`; host bits zero.
    pub cidr: String,
}

/// Observed state of a Domain, written by the Domain controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainStatus {
    /// Addresses handed out (and recently released ones kept for reuse).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_allocations: Vec<DomainIpAllocation>,
}

/// One address of a Domain and who holds it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainIpAllocation {
    /// The virtual IP.
    pub ip: String,
    /// Job of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Task of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Holder: `<agentNamespace>/<podNamespace>/<podName>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
}
