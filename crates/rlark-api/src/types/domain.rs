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
        name = "Members",
        type_ = "integer",
        json_path = ".status.allocated",
        priority = 1
    ),
    printcolumn(
        name = "Capacity",
        type_ = "string",
        json_path = ".status.capacity",
        priority = 1
    ),
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
    /// Which Jobs may join the Domain (by their labels); absent: every Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

/// Observed state of a Domain, written by the Domain controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainStatus {
    /// Addresses handed out (and recently released ones kept for reuse).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_allocations: Vec<DomainIpAllocation>,
    /// Addresses held by live replicas (allocations without `releasedAt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<i64>,
    /// Usable addresses of the CIDR, in decimal (a string: an IPv6 pool exceeds 64 bits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
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
    /// Replica index within the task (the `<i>` of the Pod `<task>-<i>`). With job and
    /// task it is the allocation's key: a restarted or rescheduled replica keeps its IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<i32>,
    /// Cluster ID the replica is placed on (agent namespace `rlark-<cluster>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Holder: `<agentNamespace>/<podName>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// When the holder went away (its Task was deleted or shrank); a released address is
    /// kept for a while so a replica that comes back gets it again, then reused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}
