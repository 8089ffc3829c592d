//! `Job` (cluster-scoped): a set of tasks that make one RL run.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::string_enum;
use super::task::{TaskPhase, TaskSpec};

/// Lifecycle phase of a Job.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum JobPhase {
    /// Tasks created, not all running.
    Pending,
    /// Tasks running.
    Running,
    /// Every task succeeded.
    Succeeded,
    /// A task failed.
    Failed,
    /// Stopped on request (`spec.stopped: true`).
    Stopped,
}
string_enum!(JobPhase {
    Pending => "Pending",
    Running => "Running",
    Succeeded => "Succeeded",
    Failed => "Failed",
    Stopped => "Stopped",
});

/// Desired state of a Job.
// Repeated `type_ = "string"` in the printcolumn(...) lists is not a mistake.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    crates(kube_core = ::kube_core),
    group = "rlinf.io",
    version = "v1alpha1",
    kind = "Job",
    status = "JobStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "rljob",
    category = "rlark",
    doc = "Job: the tasks of one RL run; each template becomes a Task named <job>-<task>.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Reward",
        type_ = "string",
        description = "The newest and the mean reward of the Job's tasks (last/mean).",
        json_path = ".status.reward.summary",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// Domain (virtual network) every task joins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// True stops every task; false (again) restarts them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
    /// Task templates; names are unique DNS-1123 labels, at most one is the head.
    #[serde(default)]
    pub tasks: Vec<JobTaskTemplate>,
    /// SSH public key copied into every task; its holder may `ssh` into this Job's tasks
    /// through the server's SSH endpoint (docs/ssh.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_public_key: Option<String>,
    /// Who besides admins may reach this Job's tasks — SSH sessions, `-L` forwards and the
    /// task HTTP proxy (docs/ssh.md): each entry names one user or one group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access: Vec<JobAccess>,
}

/// One grant of [`JobSpec::access`]: exactly one of `user` and `group`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobAccess {
    /// A user name (a certificate's CN, an SSH certificate's principal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A group (a certificate's O).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Most entries of [`JobSpec::access`].
pub const MAX_JOB_ACCESS_ENTRIES: usize = 256;

/// One task of a Job: a name, whether it is the Ray head, and a [`TaskSpec`] inline.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobTaskTemplate {
    /// Task name within the Job (DNS-1123 label); the Task is `<job>-<name>`.
    pub name: String,
    /// This task runs the Ray head (at most one per Job).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub head: bool,
    /// The task's spec, inline.
    #[serde(flatten)]
    pub spec: TaskSpec,
}

/// Observed state of a Job, written by the Job controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// Phase of each task, in template order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<JobTaskStatus>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the Job started running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the Job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
    /// Value of the `rlark.io/restarted-at` annotation the controller last acted on; a
    /// different value on a finished Job restarts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_restarted_at: Option<String>,
    /// The rewards of the Job's tasks together ([`super::RewardSummary::combine`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<super::RewardSummary>,
}

/// Phase of one task of a Job.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobTaskStatus {
    /// Template name.
    pub name: String,
    /// The Task's phase (absent until the Task reports one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TaskPhase>,
    /// The Task's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Task's reward summary (`status.reward`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<super::RewardSummary>,
}
