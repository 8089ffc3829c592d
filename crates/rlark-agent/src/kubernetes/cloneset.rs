//! OpenKruise's CloneSet (`apps.kruise.io/v1alpha1`), the fields the runtime writes and
//! reads: a Deployment-like workload whose Pods the CloneSet controller creates directly
//! (no ReplicaSets). RLark's KubernetesTaskSpec names it among its workload kinds; rlark
//! creates it only on member clusters that serve the CRD ([`SERVED_RESOURCE`], found by
//! discovery when the agent starts).
//!
//! Status → Task phase, as for a Deployment: desired 0 → `Stopped`; a `FailedScale`
//! condition (`True`) → `Failed` with its message; a status the controller has not caught
//! up with (`observedGeneration` < `generation`) → `Pending`; ready ≥ desired → `Running`;
//! else `Pending`.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube_derive::CustomResource;
use serde::{Deserialize, Serialize};

/// Group and version of the CloneSet CRD.
pub const API_VERSION: &str = "apps.kruise.io/v1alpha1";
/// The plural resource name discovery lists under [`API_VERSION`].
pub const SERVED_RESOURCE: &str = "clonesets";

/// The CloneSet spec rlark writes (the fields it sets; the member's defaults fill the rest).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    crates(kube_core = ::kube::core),
    group = "apps.kruise.io",
    version = "v1alpha1",
    kind = "CloneSet",
    namespaced,
    status = "CloneSetStatus",
    derive = "PartialEq",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CloneSetSpec {
    /// Desired Pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Which Pods are the CloneSet's.
    pub selector: LabelSelector,
    /// The Pods' template.
    pub template: PodTemplateSpec,
}

/// The CloneSet status fields the runtime reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CloneSetStatus {
    /// The generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pods the CloneSet has.
    #[serde(default)]
    pub replicas: i32,
    /// Pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Pods of the current revision.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Why the controller could not act (`FailedScale`, `FailedUpdate`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CloneSetCondition>,
}

/// One CloneSet condition.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CloneSetCondition {
    /// `FailedScale` or `FailedUpdate`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
