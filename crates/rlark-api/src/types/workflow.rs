//! `Workflow` (cluster-scoped): a DAG of Jobs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::string_enum;
use super::job::{JobPhase, JobSpec};

/// Lifecycle phase of a Workflow.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum WorkflowPhase {
    /// Created, no Job running yet.
    Pending,
    /// Jobs running.
    Running,
    /// Every Job succeeded.
    Succeeded,
    /// A Job failed.
    Failed,
    /// Stopped on request (`spec.stopped: true`).
    Stopped,
}
string_enum!(WorkflowPhase {
    Pending => "Pending",
    Running => "Running",
    Succeeded => "Succeeded",
    Failed => "Failed",
    Stopped => "Stopped",
});

/// Desired state of a Workflow.
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Workflow",
    status = "WorkflowStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "rlwf",
    category = "rlark",
    doc = "Workflow: a DAG of Jobs; each template becomes a Job named <workflow>-<template> once its dependencies succeeded.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowSpec {
    /// Job templates, in any order; dependencies form a DAG.
    #[serde(default)]
    pub job_templates: Vec<WorkflowJobTemplate>,
    /// True stops the running Jobs and starts no new one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

/// One node of the Workflow DAG.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowJobTemplate {
    /// Template name (DNS-1123 label); the Job is `<workflow>-<name>`.
    pub name: String,
    /// Names of the templates whose Jobs must succeed first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
    /// The Job's spec.
    pub spec: JobSpec,
}

/// Observed state of a Workflow, written by the Workflow controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<WorkflowPhase>,
    /// Phase of each template's Job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<WorkflowJobStatus>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the first Job started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Workflow finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
}

/// Phase of one template's Job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkflowJobStatus {
    /// Template name.
    pub name: String,
    /// The Job's phase (absent until the Job exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
