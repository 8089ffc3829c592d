//! Job controller: the Job state machine, gang placement and creation of its Tasks,
//! stop / resume / restart. The contract is in `docs/concepts.md` (sections Job and
//! Placement); the cache and expectations rules in `docs/architecture.md` (Background work).
//!
//! - [`decide`] is the state machine, pure: `""` → `Pending` → `Running` → `Succeeded` or
//!   `Failed`; `spec.stopped` → `Stopped` and back to `Pending` (resume); a changed
//!   `rlark.io/restarted-at` on a finished Job deletes its Tasks and starts over (restart).
//! - Template `t` of Job `j` becomes Task `j-t` in namespace `rlark-<clusterID>` of the
//!   Nodes [`crate::scheduler`] chose, with RLark's Ray annotations ([`ray_annotations`]).
//! - A pass reads the Job and its Tasks from the watch caches when they show every write
//!   this controller made for the Job (`Expectations`), else fresh from the API server, so a
//!   pass killed at any point is completed by the next one. Placements are serialized by
//!   one mutex of this process, over the usage summed from a Task watch
//!   ([`scheduler::ClusterUsage`]) plus a ledger of Tasks being created.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource as _, ResourceExt as _};
use rlark_api::labels;
use rlark_api::names::task_name;
use rlark_api::types::{
    Job, JobPhase, JobStatus, JobTaskStatus, JobTaskTemplate, Node, Task, TaskPhase, TaskSpec,
};
use serde_json::{Value, json};
// Expectation and assumption TTLs follow tokio's clock, which tests may pause and advance.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::context::{Context, ErrorBackoff};
use crate::error::Error;
use crate::events::{EventType, Recorder};
use crate::scheduler::{self, ClusterUsage, TaskPlacementDecision, TaskUsage, Unschedulable};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "job";

/// Condition types of a Job.
pub mod condition {
    /// Every Task of the Job exists (placed).
    pub const SCHEDULED: &str = "Scheduled";
    /// The Job waits for capacity; the message says which task lacks what.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The Job is `Running`.
    pub const RUNNING: &str = "Running";
    /// Every Task succeeded.
    pub const COMPLETE: &str = "Complete";
    /// A Task failed.
    pub const FAILED: &str = "Failed";
}

/// How long an entry of the placement ledger is trusted after its Task was created
/// without the Task watch showing it (the Task was deleted before being seen).
const ASSUME_TTL: Duration = Duration::from_secs(60);
/// Periodic re-check of a Job with nothing else to wait for.
const RESYNC: Duration = Duration::from_secs(300);
/// Re-check while Tasks are being deleted (restart) or stopped; Task events usually come
/// first.
const SHORT_REQUEUE: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------
// Pure part: observation → decision → status.

/// What the controller saw of one template's Task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedTask {
    /// `status.phase` (None until someone reports it).
    pub phase: Option<TaskPhase>,
    /// `status.message`.
    pub message: Option<String>,
    /// `spec.stopped`.
    pub stopped: bool,
    /// Being deleted (`metadata.deletionTimestamp`).
    pub deleting: bool,
}

/// Input of [`decide`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Current `status.phase`.
    pub phase: Option<JobPhase>,
    /// `spec.stopped`.
    pub stopped: bool,
    /// The `rlark.io/restarted-at` value when it differs from `status.observedRestartedAt`.
    pub restart: Option<String>,
    /// Template names, in order.
    pub templates: Vec<String>,
    /// Per template (same order): its Task, `None` when it does not exist.
    pub tasks: Vec<Option<ObservedTask>>,
}

impl Observation {
    /// Builds the observation of `job` given its Tasks per template (see [`match_tasks`]).
    pub fn of(job: &Job, tasks: &[Option<Task>]) -> Self {
        let status = job.status.clone().unwrap_or_default();
        let annotation = job
            .annotations()
            .get(labels::RESTARTED_AT)
            .filter(|v| !v.is_empty());
        let restart = match annotation {
            Some(v) if status.observed_restarted_at.as_ref() != Some(v) => Some(v.clone()),
            _ => None,
        };
        Observation {
            phase: status.phase,
            stopped: job.spec.stopped,
            restart,
            templates: job.spec.tasks.iter().map(|t| t.name.clone()).collect(),
            tasks: tasks
                .iter()
                .map(|t| {
                    t.as_ref().map(|t| {
                        let status = t.status.clone().unwrap_or_default();
                        ObservedTask {
                            phase: status.phase,
                            message: status.message,
                            stopped: t.spec.stopped,
                            deleting: t.metadata.deletion_timestamp.is_some(),
                        }
                    })
                })
                .collect(),
        }
    }
}

/// What happens to a restart request in this pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Restart {
    /// None requested.
    None,
    /// The Job is new: the value is recorded, nothing to restart.
    Adopted(String),
    /// The Job is active: the value is recorded and the request ignored.
    Ignored(String),
    /// Tasks are being deleted; the request stays pending.
    Deleting,
    /// Tasks are gone: the status is reset and the value recorded.
    Done(String),
}

/// Output of [`decide`]: the phase after this pass and what to do to the Tasks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Phase to record.
    pub phase: JobPhase,
    /// Event reason for a phase change (and the `Failed` condition).
    pub reason: &'static str,
    /// Human-readable detail of the phase.
    pub message: String,
    /// Place and create the Tasks that do not exist.
    pub place_missing: bool,
    /// Template indices whose Task gets `spec.stopped: true`.
    pub stop: Vec<usize>,
    /// Template indices whose Task gets `spec.stopped: false`.
    pub resume: Vec<usize>,
    /// Delete every Task (restart).
    pub delete_all: bool,
    /// Restart handling.
    pub restart: Restart,
}

impl Decision {
    fn new(phase: JobPhase, reason: &'static str, message: impl Into<String>) -> Self {
        Decision {
            phase,
            reason,
            message: message.into(),
            place_missing: false,
            stop: Vec::new(),
            resume: Vec::new(),
            delete_all: false,
            restart: Restart::None,
        }
    }
}

fn finished_task(phase: Option<TaskPhase>) -> bool {
    matches!(phase, Some(TaskPhase::Succeeded | TaskPhase::Failed))
}

/// The Job state machine (see the module docs). Pure.
pub fn decide(obs: &Observation) -> Decision {
    let current = obs.phase;
    let finished = matches!(
        current,
        Some(JobPhase::Succeeded | JobPhase::Failed | JobPhase::Stopped)
    );
    let mut restart = Restart::None;
    if let Some(value) = &obs.restart {
        if current.is_none() {
            restart = Restart::Adopted(value.clone());
        } else if finished {
            let existing = obs.tasks.iter().flatten().count();
            if existing > 0 {
                let mut d = Decision::new(
                    current.unwrap_or(JobPhase::Pending),
                    "Restarting",
                    format!("restart requested at {value}: deleting {existing} tasks"),
                );
                d.delete_all = true;
                d.restart = Restart::Deleting;
                return d;
            }
            let (phase, message) = if obs.stopped {
                (
                    JobPhase::Stopped,
                    "restarted; stays stopped until spec.stopped is cleared",
                )
            } else {
                (JobPhase::Pending, "restarted: placing fresh tasks")
            };
            let mut d = Decision::new(phase, "Restarted", message);
            d.restart = Restart::Done(value.clone());
            return d;
        } else {
            restart = Restart::Ignored(value.clone());
        }
    }

    let present = || {
        obs.tasks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| Some((i, t.as_ref()?)))
    };
    let running: Vec<usize> = present()
        .filter(|(_, t)| t.phase == Some(TaskPhase::Running))
        .map(|(i, _)| i)
        .collect();
    let unstopped_unfinished = || -> Vec<usize> {
        present()
            .filter(|(_, t)| !t.stopped && !t.deleting && !finished_task(t.phase))
            .map(|(i, _)| i)
            .collect()
    };

    let mut d = if obs.stopped {
        if current == Some(JobPhase::Succeeded) {
            Decision::new(JobPhase::Succeeded, "Completed", all_succeeded(obs))
        } else {
            let mut d = if running.is_empty() {
                Decision::new(JobPhase::Stopped, "Stopped", "stopped on request")
            } else {
                Decision::new(
                    current.unwrap_or(JobPhase::Pending),
                    "Stopping",
                    format!(
                        "stopping: {} still running",
                        names_of(&obs.templates, &running)
                    ),
                )
            };
            d.stop = unstopped_unfinished();
            d
        }
    } else {
        match current {
            Some(JobPhase::Succeeded) => {
                Decision::new(JobPhase::Succeeded, "Completed", all_succeeded(obs))
            }
            Some(JobPhase::Failed) => {
                let mut d = Decision::new(JobPhase::Failed, "Failed", failed_message(obs));
                d.stop = unstopped_unfinished();
                d
            }
            // None (new), Pending, Running, Stopped (resume).
            _ => {
                let base = match current {
                    Some(JobPhase::Running) => JobPhase::Running,
                    _ => JobPhase::Pending,
                };
                let total = obs.tasks.len();
                let failed = present().any(|(_, t)| t.phase == Some(TaskPhase::Failed));
                let succeeded = present()
                    .filter(|(_, t)| t.phase == Some(TaskPhase::Succeeded))
                    .count();
                let mut d = if failed {
                    let mut d = Decision::new(JobPhase::Failed, "Failed", failed_message(obs));
                    d.stop = unstopped_unfinished();
                    d
                } else if total > 0 && succeeded == total {
                    Decision::new(JobPhase::Succeeded, "Completed", all_succeeded(obs))
                } else if !running.is_empty() || succeeded > 0 {
                    Decision::new(
                        JobPhase::Running,
                        "Running",
                        format!(
                            "{} of {total} tasks running, {succeeded} succeeded",
                            running.len()
                        ),
                    )
                } else {
                    let (reason, message) = match current {
                        Some(JobPhase::Stopped) => ("Resumed", "resumed: tasks restart"),
                        None => ("Pending", "accepted: placing tasks"),
                        _ => ("Pending", "waiting for tasks to start"),
                    };
                    Decision::new(base, reason, message)
                };
                if matches!(d.phase, JobPhase::Pending | JobPhase::Running) {
                    d.place_missing = obs.tasks.iter().any(Option::is_none);
                    d.resume = present()
                        .filter(|(_, t)| t.stopped && !t.deleting)
                        .map(|(i, _)| i)
                        .collect();
                }
                if current == Some(JobPhase::Stopped) && d.phase == JobPhase::Running {
                    d.reason = "Resumed";
                }
                d
            }
        }
    };
    d.restart = restart;
    d
}

fn all_succeeded(obs: &Observation) -> String {
    match obs.tasks.len() {
        1 => "the task succeeded".into(),
        n => format!("all {n} tasks succeeded"),
    }
}

fn names_of(templates: &[String], indices: &[usize]) -> String {
    let names: Vec<String> = indices
        .iter()
        .filter_map(|&i| templates.get(i))
        .map(|n| format!("{n:?}"))
        .collect();
    names.join(", ")
}

fn failed_message(obs: &Observation) -> String {
    let failed: Vec<String> = obs
        .tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let t = t.as_ref()?;
            if t.phase != Some(TaskPhase::Failed) {
                return None;
            }
            let name = obs.templates.get(i).cloned().unwrap_or_default();
            Some(match t.message.as_deref().filter(|m| !m.is_empty()) {
                Some(m) => format!("task {name:?} failed: {m}"),
                None => format!("task {name:?} failed"),
            })
        })
        .collect();
    if failed.is_empty() {
        "a task failed".into()
    } else {
        failed.join("; ")
    }
}

/// Result of the placement step of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementOutcome {
    /// No Task was missing (or placement was not due).
    NotAttempted,
    /// Missing Tasks were placed and created; the message lists where.
    Placed(String),
    /// The Job does not fit; the scheduler's message.
    Unschedulable(String),
}

/// The status after a pass: phase, per-task phases, conditions, times and the restart
/// bookkeeping. Pure (`now` is given).
pub fn next_status(
    job: &Job,
    obs: &Observation,
    decision: &Decision,
    placement: &PlacementOutcome,
    now: &Time,
) -> JobStatus {
    let old = job.status.clone().unwrap_or_default();
    let reset = matches!(decision.restart, Restart::Done(_));
    let mut status = if reset {
        JobStatus::default()
    } else {
        old.clone()
    };
    let generation = job.metadata.generation;
    let phase = decision.phase;
    let phase_changed = old.phase != Some(phase);
    status.phase = Some(phase);
    status.observed_restarted_at = match &decision.restart {
        Restart::Adopted(v) | Restart::Ignored(v) | Restart::Done(v) => Some(v.clone()),
        Restart::None | Restart::Deleting => old.observed_restarted_at.clone(),
    };
    status.tasks = obs
        .templates
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let task = obs.tasks.get(i).and_then(Option::as_ref);
            JobTaskStatus {
                name: name.clone(),
                phase: task.and_then(|t| t.phase),
                message: task.and_then(|t| t.message.clone()),
            }
        })
        .collect();
    match phase {
        JobPhase::Running | JobPhase::Succeeded | JobPhase::Failed => {
            if status.start_time.is_none() {
                status.start_time = Some(now.clone());
            }
        }
        JobPhase::Pending | JobPhase::Stopped => {}
    }
    match phase {
        JobPhase::Succeeded | JobPhase::Failed | JobPhase::Stopped => {
            if phase_changed || status.end_time.is_none() {
                status.end_time = Some(now.clone());
            }
        }
        JobPhase::Pending | JobPhase::Running => status.end_time = None,
    }

    let conds = &mut status.conditions;
    let all_exist = !obs.tasks.is_empty() && obs.tasks.iter().all(Option::is_some);
    match placement {
        PlacementOutcome::Placed(message) => {
            set_condition(
                conds,
                condition::SCHEDULED,
                true,
                "Placed",
                message,
                now,
                generation,
            );
            update_condition(
                conds,
                condition::UNSCHEDULABLE,
                false,
                "Placed",
                message,
                now,
                generation,
            );
        }
        PlacementOutcome::Unschedulable(message) => {
            set_condition(
                conds,
                condition::SCHEDULED,
                false,
                "Unschedulable",
                message,
                now,
                generation,
            );
            set_condition(
                conds,
                condition::UNSCHEDULABLE,
                true,
                "Unschedulable",
                message,
                now,
                generation,
            );
        }
        PlacementOutcome::NotAttempted => {
            if all_exist && !condition_is_true(conds, condition::SCHEDULED) && !reset {
                let message = format!("all {} tasks exist", obs.tasks.len());
                set_condition(
                    conds,
                    condition::SCHEDULED,
                    true,
                    "Placed",
                    &message,
                    now,
                    generation,
                );
                update_condition(
                    conds,
                    condition::UNSCHEDULABLE,
                    false,
                    "Placed",
                    &message,
                    now,
                    generation,
                );
            }
        }
    }
    if phase == JobPhase::Stopped {
        update_condition(
            conds,
            condition::UNSCHEDULABLE,
            false,
            "Stopped",
            "stopped on request",
            now,
            generation,
        );
    }
    let message = decision.message.as_str();
    let is = |p: JobPhase| phase == p;
    let other = phase.as_str();
    if is(JobPhase::Running) {
        set_condition(
            conds,
            condition::RUNNING,
            true,
            "TasksRunning",
            message,
            now,
            generation,
        );
    } else {
        update_condition(
            conds,
            condition::RUNNING,
            false,
            other,
            message,
            now,
            generation,
        );
    }
    if is(JobPhase::Succeeded) {
        set_condition(
            conds,
            condition::COMPLETE,
            true,
            "AllTasksSucceeded",
            message,
            now,
            generation,
        );
    } else {
        update_condition(
            conds,
            condition::COMPLETE,
            false,
            other,
            message,
            now,
            generation,
        );
    }
    if is(JobPhase::Failed) {
        set_condition(
            conds,
            condition::FAILED,
            true,
            "TaskFailed",
            message,
            now,
            generation,
        );
    } else {
        update_condition(
            conds,
            condition::FAILED,
            false,
            other,
            message,
            now,
            generation,
        );
    }
    status
}

pub(crate) fn condition_is_true(conds: &[Condition], type_: &str) -> bool {
    conds.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// Sets (adding if absent) condition `type_`; `lastTransitionTime` moves only when the
/// status changes.
pub(crate) fn set_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
    generation: Option<i64>,
) {
    let status = if status { "True" } else { "False" };
    match conds.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
                c.status = status.into();
            }
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: now.clone(),
            observed_generation: generation,
        }),
    }
}

/// Like [`set_condition`] but only when the condition is already present.
pub(crate) fn update_condition(
    conds: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
    generation: Option<i64>,
) {
    if conds.iter().any(|c| c.type_ == type_) {
        set_condition(conds, type_, status, reason, message, now, generation);
    }
}

/// RLark's Ray annotations for every template, in template order:
/// `rlark.io/ray-total-nodes` = Σ replicas over all templates, `rlark.io/ray-node-rank-start`
/// = Σ replicas of the templates before, `rlark.io/ray-role` = `head` | `worker`,
/// `rlark.io/ray-head-task-name` = `<job>-<first head template>` (absent without a head).
///
/// Replicas are [`TaskSpec::replicas`]: `kubernetes.workload.replicas` (1 when unset) and
/// 1 for `docker`, exactly as RLark counts; rlark's `raw` tasks (which RLark lacks) count
/// `raw.replicas`, since each raw replica is one Ray node. Negative counts count 0.
pub fn ray_annotations(
    job_name: &str,
    templates: &[JobTaskTemplate],
) -> Vec<BTreeMap<String, String>> {
    let replicas = |t: &JobTaskTemplate| i64::from(t.spec.replicas().max(0));
    let total: i64 = templates.iter().map(replicas).sum();
    let head = templates
        .iter()
        .find(|t| t.head)
        .map(|t| task_name(job_name, &t.name));
    let mut start = 0i64;
    templates
        .iter()
        .map(|t| {
            let mut a = BTreeMap::new();
            a.insert(labels::RAY_TOTAL_NODES.to_string(), total.to_string());
            a.insert(labels::RAY_NODE_RANK_START.to_string(), start.to_string());
            let role = if t.head {
                labels::RAY_ROLE_HEAD
            } else {
                labels::RAY_ROLE_WORKER
            };
            a.insert(labels::RAY_ROLE.to_string(), role.to_string());
            if let Some(head) = &head {
                a.insert(labels::RAY_HEAD_TASK_NAME.to_string(), head.clone());
            }
            start += replicas(t);
            a
        })
        .collect()
}

/// The Task spec template `index` of `job` asks for, without placement and not stopped:
/// the template with the Job's `domain` and `sshPublicKey` (when the Job sets them).
pub fn desired_spec(job: &Job, template: &JobTaskTemplate) -> TaskSpec {
    let mut spec = template.spec.clone();
    if job.spec.domain.is_some() {
        spec.domain = job.spec.domain.clone();
    }
    if job.spec.ssh_public_key.is_some() {
        spec.ssh_public_key = job.spec.ssh_public_key.clone();
    }
    spec.placement = None;
    spec.stopped = false;
    spec
}

/// Stable fingerprint (FNV-1a 64, hex) of a desired spec, stored in the
/// `rlark.io/template-hash` annotation to notice template changes without comparing specs
/// the server may have normalized.
pub fn spec_fingerprint(spec: &TaskSpec) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The Task to create for template `index` of `job`, placed as `decision` says.
///
/// `Err` when the Job has no name or uid (not read from the API server).
pub fn build_task(
    job: &Job,
    index: usize,
    decision: &TaskPlacementDecision,
    ray: &BTreeMap<String, String>,
) -> Result<Task, Error> {
    let template = job
        .spec
        .tasks
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("job has no task template #{index}")))?;
    let job_name = job
        .metadata
        .name
        .clone()
        .ok_or_else(|| Error::MissingName("Job".into()))?;
    let mut owner = job
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Invalid(format!("job {job_name} has no uid")))?;
    owner.block_owner_deletion = Some(true);
    let mut spec = desired_spec(job, template);
    let mut annotations = ray.clone();
    annotations.insert(labels::TEMPLATE_HASH.to_string(), spec_fingerprint(&spec));
    spec.placement = Some(decision.placement.clone());
    spec.stopped = job.spec.stopped;
    Ok(Task {
        metadata: ObjectMeta {
            name: Some(task_name(&job_name, &template.name)),
            namespace: Some(decision.namespace.clone()),
            labels: Some([(labels::JOB.to_string(), job_name.clone())].into()),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec,
        status: None,
    })
}

/// Whether `task`'s controller ownerReference is the object with `uid`.
pub fn controlled_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// Splits the Tasks listed for `job` into one per template (by name `<job>-<template>`,
/// controlled by this Job's uid; with several, the oldest, then by namespace) and the
/// rest it controls, which must go (duplicates, removed templates). Tasks controlled by
/// something else are ignored.
pub fn match_tasks(job: &Job, tasks: Vec<Task>) -> (Vec<Option<Task>>, Vec<Task>) {
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let job_name = job.name_any();
    let mut owned: Vec<Task> = tasks
        .into_iter()
        .filter(|t| controlled_by(&t.metadata, &uid))
        .collect();
    owned.sort_by(|a, b| {
        let key = |t: &Task| {
            (
                t.metadata.creation_timestamp.clone().map(|t| t.0),
                t.namespace().unwrap_or_default(),
                t.name_any(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut per_template: Vec<Option<Task>> = vec![None; job.spec.tasks.len()];
    let index: HashMap<String, usize> = job
        .spec
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| (task_name(&job_name, &t.name), i))
        .collect();
    let mut extra = Vec::new();
    for task in owned {
        match index.get(&task.name_any()) {
            Some(&i) if per_template[i].is_none() => per_template[i] = Some(task),
            _ => extra.push(task),
        }
    }
    (per_template, extra)
}

/// `actor → cluster "a" (a1, a2); rollout → cluster "b" (b1)`.
pub fn describe_placements(decisions: &[TaskPlacementDecision]) -> String {
    decisions
        .iter()
        .map(|d| {
            format!(
                "{} → cluster {:?} ({})",
                d.template,
                d.placement.cluster_id,
                if d.placement.nodes.is_empty() {
                    "no replicas".to_string()
                } else {
                    d.placement.nodes.join(", ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A Job is waiting for capacity: not stopped, `Pending` (or new), not yet fully placed.
pub fn waiting_for_capacity(job: &Job) -> bool {
    let status = job.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    !job.spec.stopped
        && matches!(phase, None | Some(JobPhase::Pending))
        && !status.is_some_and(|s| condition_is_true(&s.conditions, condition::SCHEDULED))
}

/// The merge patch turning `old` into `new` (every field of `new`, `null` for the fields
/// it dropped), preconditioned on `resource_version`.
pub(crate) fn status_patch<S: serde::Serialize>(
    old: &S,
    new: &S,
    resource_version: Option<&str>,
) -> Result<Value, Error> {
    let encode = |s: &S| {
        serde_json::to_value(s).map_err(|source| Error::Decode {
            what: "status".into(),
            source,
        })
    };
    let (old, mut new) = (encode(old)?, encode(new)?);
    if let (Some(old), Some(new)) = (old.as_object(), new.as_object_mut()) {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    let mut patch = json!({ "status": new });
    if let Some(rv) = resource_version {
        patch["metadata"] = json!({ "resourceVersion": rv });
    }
    Ok(patch)
}

// ---------------------------------------------------------------------------------------
// Controller.

/// Tasks this process is creating or has created but not yet seen in the Task watch.
#[derive(Default)]
struct Ledger {
    assumed: BTreeMap<(String, String), Assumed>,
}

struct Assumed {
    usage: Option<TaskUsage>,
    uid: Option<String>,
    since: Instant,
}

impl Ledger {
    /// Forget entries the index has seen (same uid) or that are too old to trust.
    fn prune(&mut self, index: &UsageIndex, now: Instant) {
        self.assumed.retain(|_, a| match &a.uid {
            None => true,
            Some(uid) => {
                !index.by_uid.contains_key(uid) && now.duration_since(a.since) < ASSUME_TTL
            }
        });
    }

    /// `base` plus the assumed Tasks whose uid is not in `seen`.
    fn overlay(&self, mut base: ClusterUsage, seen: impl Fn(&str) -> bool) -> ClusterUsage {
        for a in self.assumed.values() {
            if a.uid.as_deref().is_none_or(|u| !seen(u))
                && let Some(usage) = &a.usage
            {
                base.add(usage);
            }
        }
        base
    }
}

/// What every placed Task holds, kept up to date incrementally from the Task watch, so a
/// placement costs O(Nodes) rather than O(Tasks).
#[derive(Default)]
struct UsageIndex {
    /// Every Task seen, by uid, and what it holds.
    by_uid: HashMap<String, Option<TaskUsage>>,
    total: ClusterUsage,
    /// Filled during a (re)list, swapped in when it is complete.
    relist: Option<HashMap<String, Option<TaskUsage>>>,
}

impl UsageIndex {
    /// Applies one watch event; returns true when a (re)list completed.
    fn apply(&mut self, event: &watcher::Event<Task>) -> bool {
        match event {
            watcher::Event::Apply(task) => {
                let Some(uid) = task.metadata.uid.clone() else {
                    return false;
                };
                if let Some(Some(old)) = self.by_uid.get(&uid) {
                    self.total.remove(old);
                }
                let usage = TaskUsage::of(task);
                if let Some(u) = &usage {
                    self.total.add(u);
                }
                self.by_uid.insert(uid, usage);
                false
            }
            watcher::Event::Delete(task) => {
                if let Some(Some(old)) = task
                    .metadata
                    .uid
                    .as_ref()
                    .and_then(|u| self.by_uid.remove(u))
                {
                    self.total.remove(&old);
                }
                false
            }
            watcher::Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            watcher::Event::InitApply(task) => {
                if let (Some(relist), Some(uid)) = (self.relist.as_mut(), task.metadata.uid.clone())
                {
                    relist.insert(uid, TaskUsage::of(task));
                }
                false
            }
            watcher::Event::InitDone => {
                let by_uid = self.relist.take().unwrap_or_default();
                let mut total = ClusterUsage::default();
                for usage in by_uid.values().flatten() {
                    total.add(usage);
                }
                self.by_uid = by_uid;
                self.total = total;
                true
            }
        }
    }
}

struct JobState {
    ctx: Arc<Context>,
    usage: Arc<StdMutex<UsageIndex>>,
    /// True once the usage index holds a complete list.
    usage_ready: tokio::sync::watch::Receiver<bool>,
    nodes: Store<Node>,
    /// True once the Node cache holds a complete list.
    nodes_ready: tokio::sync::watch::Receiver<bool>,
    /// Serializes placement; guards the ledger.
    placement: tokio::sync::Mutex<Ledger>,
    namespaces: StdMutex<HashSet<String>>,
    backoff: ErrorBackoff,
    /// The Jobs as watched (the controller's own cache).
    jobs: Store<Job>,
    /// The Tasks as watched (ready with `usage_ready`).
    tasks: Store<Task>,
    /// Per Job: this controller's writes the caches must show before a pass reads them.
    expectations: StdMutex<HashMap<String, Expectations>>,
}

/// How long unmet expectations make a Job's passes read the API server instead of the
/// caches (a Task created and deleted by someone else before the cache saw it would
/// otherwise keep them unmet forever).
const EXPECTATION_TTL: Duration = Duration::from_secs(30);

/// What this controller wrote for one Job that its caches must reflect before a pass may
/// read them instead of the API server — kube-controller-manager's "expectations". Until
/// then a pass reads fresh (a GET of the Job, a list of its Tasks), so a trailing cache
/// never makes it place, delete or restart twice.
#[derive(Debug, Default)]
struct Expectations {
    /// The Job's resourceVersion after the last status write.
    job: Option<u64>,
    /// Tasks created (UIDs), to appear in the Task cache.
    created: HashSet<String>,
    /// Tasks deleted (UIDs), to disappear from it (or show their deletion).
    deleted: HashSet<String>,
    /// Tasks updated: UID → the resourceVersion the cache must reach.
    updated: HashMap<String, u64>,
    /// The last write recorded.
    since: Option<Instant>,
}

impl Expectations {
    fn expired(&self) -> bool {
        self.since.is_some_and(|t| t.elapsed() >= EXPECTATION_TTL)
    }

    fn tasks_pending(&self) -> bool {
        !(self.created.is_empty() && self.deleted.is_empty() && self.updated.is_empty())
    }

    /// Whether `cached` (the Job's Tasks in the cache) shows every Task write.
    fn tasks_met_by(&self, cached: &[Arc<Task>]) -> bool {
        let by_uid: HashMap<&str, &Task> = cached
            .iter()
            .filter_map(|t| Some((t.metadata.uid.as_deref()?, t.as_ref())))
            .collect();
        self.created
            .iter()
            .all(|uid| by_uid.contains_key(uid.as_str()))
            && self.deleted.iter().all(|uid| {
                by_uid
                    .get(uid.as_str())
                    .is_none_or(|t| t.metadata.deletion_timestamp.is_some())
            })
            && self.updated.iter().all(|(uid, rv)| {
                by_uid
                    .get(uid.as_str())
                    .and_then(|t| revision_of(&t.metadata))
                    .is_some_and(|seen| seen >= *rv)
            })
    }
}

/// An object's resourceVersion as a number (rlark's are store revisions); `None` when
/// absent or not numeric (then caches are never trusted for it).
fn revision_of(meta: &ObjectMeta) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

impl JobState {
    fn expect(&self, job: &str, record: impl FnOnce(&mut Expectations)) {
        let mut all = lock(&self.expectations);
        let e = all.entry(job.to_string()).or_default();
        record(e);
        e.since = Some(Instant::now());
    }

    fn expect_job(&self, job: &Job) {
        if let Some(rv) = revision_of(&job.metadata) {
            self.expect(&job.name_any(), |e| e.job = Some(rv));
        } else {
            // Not comparable: read fresh until the expectation expires.
            self.expect(&job.name_any(), |e| e.job = Some(u64::MAX));
        }
    }

    fn expect_created(&self, job: &str, uid: &str) {
        self.expect(job, |e| {
            e.created.insert(uid.to_string());
        });
    }

    fn expect_deleted(&self, job: &str, task: &Task) {
        if let Some(uid) = task.metadata.uid.clone() {
            self.expect(job, |e| {
                e.deleted.insert(uid);
            });
        }
    }

    fn expect_updated(&self, job: &str, task: &Task) {
        if let Some(uid) = task.metadata.uid.clone() {
            let rv = revision_of(&task.metadata).unwrap_or(u64::MAX);
            self.expect(job, |e| {
                e.updated.insert(uid, rv);
            });
        }
    }

    /// The Job from the cache, when it shows this controller's last status write.
    fn cached_job(&self, name: &str) -> Option<Arc<Job>> {
        let job = self.jobs.get(&ObjectRef::new(name))?;
        let expected = lock(&self.expectations)
            .get(name)
            .filter(|e| !e.expired())
            .and_then(|e| e.job);
        match expected {
            Some(expected) => revision_of(&job.metadata)
                .is_some_and(|seen| seen >= expected)
                .then_some(job),
            None => Some(job),
        }
    }

    /// The Job's Tasks (label `rlark.io/job`) from the cache, when it is synced and shows
    /// every Task write of this controller for the Job (those expectations are then met).
    fn cached_tasks(&self, name: &str) -> Option<Vec<Task>> {
        if !*self.usage_ready.borrow() {
            return None;
        }
        let cached: Vec<Arc<Task>> = self
            .tasks
            .state()
            .into_iter()
            .filter(|t| t.labels().get(labels::JOB).map(String::as_str) == Some(name))
            .collect();
        let mut all = lock(&self.expectations);
        if let Some(e) = all.get_mut(name)
            && e.tasks_pending()
        {
            if !e.expired() && !e.tasks_met_by(&cached) {
                return None;
            }
            e.created.clear();
            e.deleted.clear();
            e.updated.clear();
        }
        drop(all);
        let mut tasks: Vec<Task> = cached.iter().map(|t| t.as_ref().clone()).collect();
        // As a list returns them.
        tasks.sort_by_key(|t| (t.namespace(), t.name_any()));
        Some(tasks)
    }

    fn forget(&self, name: &str) {
        lock(&self.expectations).remove(name);
    }
}

/// Run the Job controller until `shutdown` is cancelled (in-flight reconciles finish).
///
/// Watches Jobs; Tasks (each mapped to its controlling Job, as `owns` would, and a Task
/// seen finished for the first time also wakes every Job waiting for capacity); Nodes (a
/// Node that appears or changes labels, agent type, cordon, phase or capacity wakes every
/// Job waiting for capacity, see [`waiting_for_capacity`]). Keeps, for placement, a cache
/// of Nodes and a usage index fed by its own Task watch.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let client = ctx.client.clone();
    let jobs: Api<Job> = Api::all(client.clone());
    let tasks: Api<Task> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());

    let usage: Arc<StdMutex<UsageIndex>> = Arc::default();
    let (ready_tx, usage_ready) = tokio::sync::watch::channel(false);
    let (task_cache, task_writer) = reflector::store::<Task>();
    // One Task watch feeds the Task cache, the usage index and the Controller's Task
    // triggers, in that order: a pass woken by a Task change finds that change in the
    // cache (with two watches, a trigger could outrun the cache, and the pass would settle
    // on the Task's old state until the next resync).
    let task_changes = {
        let usage = Arc::clone(&usage);
        reflector::reflector(task_writer, watcher(tasks, watcher::Config::default()))
            .default_backoff()
            .inspect(move |event| {
                if let Ok(event) = event
                    && lock(&usage).apply(event)
                {
                    ready_tx.send_replace(true);
                }
            })
            .touched_objects()
    };
    let (node_cache, node_writer) = reflector::store::<Node>();
    // Readiness of the Node cache as a watch channel: kube-runtime's
    // `Store::wait_until_ready` keeps only the last waiter's waker, so concurrent
    // reconciles waiting on it could hang forever.
    let (nodes_ready_tx, nodes_ready) = tokio::sync::watch::channel(false);
    let node_reflector = reflector::reflector(
        node_writer,
        watcher(nodes.clone(), watcher::Config::default()),
    )
    .default_backoff()
    .for_each(move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) {
            nodes_ready_tx.send_replace(true);
        }
        futures::future::ready(())
    });

    // A Job's own status writes (this controller's) do not trigger another reconcile: each
    // pass already acts on the status it computes, and the Tasks' changes, requeues and
    // spec/metadata changes cover everything else. Half of the passes (each a fresh read
    // of the Job and a Task list) went to reacting to those writes.
    let (job_cache, job_writer) = reflector::store::<Job>();
    let job_changes = reflector::reflector(job_writer, watcher(jobs, watcher::Config::default()))
        .default_backoff()
        .touched_objects()
        .predicate_filter(job_trigger, Default::default());
    let controller = Controller::for_stream(job_changes, job_cache.clone());
    let state = Arc::new(JobState {
        ctx,
        usage,
        usage_ready,
        nodes: node_cache,
        nodes_ready,
        placement: tokio::sync::Mutex::new(Ledger::default()),
        namespaces: StdMutex::default(),
        backoff: ErrorBackoff::default(),
        jobs: job_cache.clone(),
        tasks: task_cache,
        expectations: StdMutex::default(),
    });

    let waiting = {
        let cache = job_cache.clone();
        move || -> Vec<ObjectRef<Job>> {
            cache
                .state()
                .iter()
                .filter(|j| waiting_for_capacity(j))
                .map(|j| ObjectRef::from_obj(j.as_ref()))
                .collect()
        }
    };
    let finished_seen: Arc<StdMutex<HashSet<String>>> = Arc::default();
    let task_mapper = {
        let waiting = waiting.clone();
        move |task: Task| -> Vec<ObjectRef<Job>> {
            let mut refs: Vec<ObjectRef<Job>> = task
                .owner_references()
                .iter()
                .filter(|o| {
                    o.controller == Some(true)
                        && o.kind == "Job"
                        && o.api_version == rlark_api::API_VERSION
                })
                .map(|o| ObjectRef::new(&o.name))
                .collect();
            let phase = task.status.as_ref().and_then(|s| s.phase);
            if scheduler::is_terminal(phase)
                && let Some(uid) = task.metadata.uid.clone()
            {
                let mut seen = lock(&finished_seen);
                if seen.len() > 100_000 {
                    // Forgetting only costs extra wake-ups.
                    seen.clear();
                }
                if seen.insert(uid) {
                    drop(seen);
                    refs.extend(waiting());
                }
            }
            refs
        }
    };
    let node_prints: Arc<StdMutex<HashMap<String, String>>> = Arc::default();
    let node_mapper = move |node: Node| -> Vec<ObjectRef<Job>> {
        let key = format!(
            "{}/{}",
            node.namespace().unwrap_or_default(),
            node.name_any()
        );
        let print = node_fingerprint(&node);
        let changed = lock(&node_prints).insert(key, print.clone()).as_ref() != Some(&print);
        if !changed {
            return Vec::new();
        }
        if let Some(problem) = scheduler::node_identity_problem(&node) {
            tracing::warn!(node = %crate::events::display_name(&node), %problem, "node ignored for placement");
            return Vec::new();
        }
        waiting()
    };

    let controller = controller
        .watches_stream(task_changes, task_mapper)
        .watches(nodes, watcher::Config::default(), node_mapper)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, state)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(controller = CONTROLLER, %error, "reconcile failed");
            }
        });
    tokio::select! {
        () = controller => {}
        () = node_reflector => tracing::error!(controller = CONTROLLER, "node cache stopped"),
    }
}

/// What about a Job triggers a reconcile: anything but its status (spec through
/// `generation`, the restart annotation, labels, deletion, finalizers).
fn job_trigger(job: &Job) -> Option<u64> {
    use std::hash::{Hash as _, Hasher as _};
    let meta = &job.metadata;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp
        .as_ref()
        .map(|t| t.0.to_string())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// The Nodes placement may consider: those without a [`scheduler::node_identity_problem`].
/// The scheduler never places on the others either; dropping them where the Nodes are
/// collected keeps a Node that claims another cluster out of every use of the list.
fn trusted_nodes<N: std::borrow::Borrow<Node>>(mut nodes: Vec<N>) -> Vec<N> {
    nodes.retain(|node| scheduler::node_identity_problem(node.borrow()).is_none());
    nodes
}

/// What about a Node matters to placement: labels, agent type, cordon, phase, capacity.
fn node_fingerprint(node: &Node) -> String {
    let status = node.status.clone().unwrap_or_default();
    json!([
        node.labels(),
        node.spec,
        status.phase,
        status.capacity,
        status.allocatable
    ])
    .to_string()
}

pub(crate) fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Plain caches: a poisoned one is still consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn reconcile(job: Arc<Job>, state: Arc<JobState>) -> Result<Action, Error> {
    let name = job.name_any();
    let span = tracing::info_span!("reconcile", controller = CONTROLLER, name = %name);
    let result = state
        .ctx
        .metrics
        .measure(CONTROLLER, reconcile_job(&name, &state).instrument(span))
        .await;
    if result.is_ok() {
        state.backoff.reset(&name);
    }
    result
}

fn error_policy(job: Arc<Job>, error: &Error, state: Arc<JobState>) -> Action {
    let name = job.name_any();
    if error.is_conflict() {
        tracing::debug!(job = %name, "write conflicted; retrying");
        return Action::requeue(Duration::from_millis(100));
    }
    if error.is_not_found() {
        // The Job (or a Task it was writing) was deleted while the reconcile ran; the
        // recheck sees the deletion and stops. Not worth a warning.
        tracing::debug!(job = %name, %error, "object vanished during reconcile; rechecking");
        return Action::requeue(Duration::from_millis(500));
    }
    let delay = state.backoff.next(&name);
    tracing::warn!(job = %name, %error, retry_in_ms = delay.as_millis() as u64, "job reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_job(name: &str, state: &JobState) -> Result<Action, Error> {
    let client = &state.ctx.client;
    let jobs: Api<Job> = Api::all(client.clone());
    // The caches when they show this controller's own writes (expectations), else a
    // fresh read: acting on a cache that trails those writes would repeat them.
    let job = match state.cached_job(name) {
        Some(job) => job.as_ref().clone(),
        None => match jobs.get_opt(name).await? {
            Some(job) => job,
            None => {
                state.forget(name);
                return Ok(Action::await_change());
            }
        },
    };
    if job.metadata.deletion_timestamp.is_some() {
        // Garbage collection removes the Tasks.
        state.forget(name);
        return Ok(Action::await_change());
    }
    let recorder = &state.ctx.recorder;
    let reference = Recorder::reference(&job);

    let listed = match state.cached_tasks(name) {
        Some(tasks) => tasks,
        None => {
            Api::<Task>::all(client.clone())
                .list(&ListParams::default().labels(&format!("{}={name}", labels::JOB)))
                .await?
                .items
        }
    };
    let (tasks, extra) = match_tasks(&job, listed);
    for task in &extra {
        tracing::info!(task = %crate::events::display_name(task), "deleting task not matching a template");
        delete_task(client, task).await?;
        state.expect_deleted(name, task);
    }
    let obs = Observation::of(&job, &tasks);
    let decision = decide(&obs);

    // Act on the Tasks.
    let mut requeue = RESYNC;
    if decision.delete_all {
        let mut started = 0;
        for task in tasks.iter().flatten() {
            if task.metadata.deletion_timestamp.is_none() {
                started += 1;
            }
            delete_task(client, task).await?;
            state.expect_deleted(name, task);
            lock_ledger_forget(state, task).await;
        }
        if started > 0 {
            recorder
                .record(
                    &reference,
                    EventType::Normal,
                    decision.reason,
                    &decision.message,
                )
                .await;
        }
        requeue = SHORT_REQUEUE;
    }
    let set_stopped = |i: usize, stopped: bool| {
        let task = tasks[i].clone();
        async move {
            let Some(task) = task else {
                return Ok::<(), Error>(());
            };
            let api: Api<Task> =
                Api::namespaced(client.clone(), &task.namespace().unwrap_or_default());
            let patch = json!({"spec": {"stopped": stopped}});
            match api
                .patch(
                    &task.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                Ok(patched) => {
                    state.expect_updated(name, &patched);
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    };
    for &i in &decision.stop {
        set_stopped(i, true).await?;
    }
    if !decision.stop.is_empty() {
        recorder
            .record(
                &reference,
                EventType::Normal,
                "Stopping",
                &format!("stopping {}", names_of(&obs.templates, &decision.stop)),
            )
            .await;
    }
    for &i in &decision.resume {
        set_stopped(i, false).await?;
    }
    if decision.reason == "Stopping" {
        requeue = SHORT_REQUEUE;
    }
    if matches!(
        decision.phase,
        JobPhase::Pending | JobPhase::Running | JobPhase::Stopped
    ) && !decision.delete_all
    {
        update_drifted_tasks(state, &job, &tasks).await?;
    }
    let placement = if decision.place_missing {
        place_missing(state, &job, &tasks).await?
    } else {
        PlacementOutcome::NotAttempted
    };
    if let PlacementOutcome::Placed(message) = &placement {
        // Recorded now: the Tasks exist even if the status write below fails.
        recorder
            .record(&reference, EventType::Normal, "Scheduled", message)
            .await;
    }

    // Record.
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let old_status = job.status.clone().unwrap_or_default();
    let status = next_status(&job, &obs, &decision, &placement, &now);
    if status != old_status {
        let patch = status_patch(
            &old_status,
            &status,
            job.metadata.resource_version.as_deref(),
        )?;
        let patched = jobs
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        state.expect_job(&patched);
    }
    match &placement {
        PlacementOutcome::Unschedulable(message) => {
            let before = old_status
                .conditions
                .iter()
                .find(|c| c.type_ == condition::UNSCHEDULABLE && c.status == "True")
                .map(|c| c.message.as_str());
            if before != Some(message.as_str()) {
                recorder
                    .record(&reference, EventType::Warning, "FailedScheduling", message)
                    .await;
            }
            requeue = requeue.min(state.ctx.config.unschedulable_requeue);
        }
        PlacementOutcome::Placed(_) | PlacementOutcome::NotAttempted => {}
    }
    if let Restart::Ignored(value) = &decision.restart {
        let message = format!(
            "restart requested at {value} ignored: the job is {}; stop it or let it finish first",
            obs.phase.map_or("new", |p| p.as_str())
        );
        recorder
            .record(&reference, EventType::Warning, "RestartIgnored", &message)
            .await;
    }
    if old_status.phase != Some(decision.phase) {
        let type_ = if decision.phase == JobPhase::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        tracing::info!(
            from = old_status.phase.map_or("", |p| p.as_str()),
            to = decision.phase.as_str(),
            reason = decision.reason,
            "job phase changed"
        );
        recorder
            .record(&reference, type_, decision.reason, &decision.message)
            .await;
    }
    if matches!(decision.restart, Restart::Done(_)) {
        // The next pass (on fresh status) places the new Tasks.
        requeue = Duration::ZERO;
    }
    Ok(Action::requeue(requeue))
}

async fn lock_ledger_forget(state: &JobState, task: &Task) {
    let key = (task.namespace().unwrap_or_default(), task.name_any());
    state.placement.lock().await.assumed.remove(&key);
}

async fn delete_task(client: &kube::Client, task: &Task) -> Result<(), Error> {
    let api: Api<Task> = Api::namespaced(client.clone(), &task.namespace().unwrap_or_default());
    let mut params = DeleteParams::background();
    if let Some(uid) = &task.metadata.uid {
        params = params.preconditions(kube::api::Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        });
    }
    match api.delete(&task.name_any(), &params).await {
        Ok(_) => Ok(()),
        // Gone already, or replaced by a newer incarnation (uid precondition).
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Updates the spec (keeping placement and `stopped`) and Ray annotations of Tasks whose
/// template changed.
async fn update_drifted_tasks(
    state: &JobState,
    job: &Job,
    tasks: &[Option<Task>],
) -> Result<(), Error> {
    let client = &state.ctx.client;
    let ray = ray_annotations(&job.name_any(), &job.spec.tasks);
    for (i, task) in tasks.iter().enumerate() {
        let (Some(task), Some(template), Some(ray)) = (task, job.spec.tasks.get(i), ray.get(i))
        else {
            continue;
        };
        if task.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let desired = desired_spec(job, template);
        let print = spec_fingerprint(&desired);
        let annotations = task.annotations();
        let drifted = annotations.get(labels::TEMPLATE_HASH) != Some(&print)
            || ray.iter().any(|(k, v)| annotations.get(k) != Some(v));
        if !drifted {
            continue;
        }
        let mut updated = task.clone();
        updated.spec = TaskSpec {
            placement: task.spec.placement.clone(),
            stopped: task.spec.stopped,
            ..desired
        };
        let annotations = updated.annotations_mut();
        annotations.extend(ray.clone());
        annotations.insert(labels::TEMPLATE_HASH.to_string(), print);
        updated.status = None;
        let api: Api<Task> = Api::namespaced(client.clone(), &task.namespace().unwrap_or_default());
        tracing::info!(task = %crate::events::display_name(task), "template changed; updating task spec");
        let replaced = api
            .replace(&task.name_any(), &PostParams::default(), &updated)
            .await?;
        state.expect_updated(&job.name_any(), &replaced);
    }
    Ok(())
}

/// Places the templates whose Task is missing and creates those Tasks.
async fn place_missing(
    state: &JobState,
    job: &Job,
    tasks: &[Option<Task>],
) -> Result<PlacementOutcome, Error> {
    let client = &state.ctx.client;
    let missing: Vec<usize> = (0..job.spec.tasks.len())
        .filter(|&i| tasks.get(i).is_none_or(Option::is_none))
        .collect();
    if missing.is_empty() {
        return Ok(PlacementOutcome::NotAttempted);
    }
    let templates: Vec<&JobTaskTemplate> = missing.iter().map(|&i| &job.spec.tasks[i]).collect();
    state
        .usage_ready
        .clone()
        .wait_for(|ready| *ready)
        .await
        .map_err(|_| Error::CacheUnavailable("tasks".into()))?;
    state
        .nodes_ready
        .clone()
        .wait_for(|ready| *ready)
        .await
        .map_err(|_| Error::CacheUnavailable("nodes".into()))?;
    let ray = ray_annotations(&job.name_any(), &job.spec.tasks);

    let (decisions, to_create) = {
        let mut ledger = state.placement.lock().await;
        let usage = {
            let index = lock(&state.usage);
            ledger.prune(&index, Instant::now());
            ledger.overlay(index.total.clone(), |uid| index.by_uid.contains_key(uid))
        };
        let nodes = trusted_nodes(state.nodes.state());
        let decisions = match scheduler::place_with_usage(&templates, &nodes, &usage) {
            Ok(d) => d,
            Err(_) => {
                // The watches may trail (a Node just appeared, a Task just finished):
                // decide on fresh lists before declaring the Job unschedulable.
                let nodes = trusted_nodes(
                    Api::<Node>::all(client.clone())
                        .list(&ListParams::default())
                        .await?
                        .items,
                );
                let listed = Api::<Task>::all(client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items;
                let uids: HashSet<&str> = listed
                    .iter()
                    .filter_map(|t| t.metadata.uid.as_deref())
                    .collect();
                let usage =
                    ledger.overlay(ClusterUsage::from_tasks(&listed), |uid| uids.contains(uid));
                match scheduler::place_with_usage(&templates, &nodes, &usage) {
                    Ok(d) => d,
                    Err(Unschedulable { message, .. }) => {
                        return Ok(PlacementOutcome::Unschedulable(message));
                    }
                }
            }
        };
        let mut to_create = Vec::with_capacity(decisions.len());
        for (decision, &index) in decisions.iter().zip(&missing) {
            let ray = ray.get(index).cloned().unwrap_or_default();
            let task = build_task(job, index, decision, &ray)?;
            ledger.assumed.insert(
                (decision.namespace.clone(), task.name_any()),
                Assumed {
                    usage: TaskUsage::of(&task),
                    uid: None,
                    since: Instant::now(),
                },
            );
            to_create.push(task);
        }
        (decisions, to_create)
    };

    let results =
        futures::future::join_all(to_create.iter().map(|task| create_task(state, job, task))).await;
    let mut first_error = None;
    {
        let mut ledger = state.placement.lock().await;
        for (task, result) in to_create.iter().zip(results) {
            let key = (task.namespace().unwrap_or_default(), task.name_any());
            match result {
                Ok(Some(uid)) => {
                    state.expect_created(&job.name_any(), &uid);
                    if let Some(a) = ledger.assumed.get_mut(&key) {
                        a.uid = Some(uid);
                        a.since = Instant::now();
                    }
                }
                Ok(None) => {
                    ledger.assumed.remove(&key);
                }
                Err(e) => {
                    ledger.assumed.remove(&key);
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(PlacementOutcome::Placed(format!(
        "placed {} {}: {}",
        decisions.len(),
        if decisions.len() == 1 {
            "task"
        } else {
            "tasks"
        },
        describe_placements(&decisions)
    )))
}

/// Creates `task` (and its namespace). `Ok(Some(uid))` when created, `Ok(None)` when this
/// Job's Task already existed (an earlier attempt made it).
async fn create_task(state: &JobState, job: &Job, task: &Task) -> Result<Option<String>, Error> {
    let client = &state.ctx.client;
    let namespace = task.namespace().unwrap_or_default();
    ensure_namespace(state, &namespace).await?;
    let api: Api<Task> = Api::namespaced(client.clone(), &namespace);
    match api.create(&PostParams::default(), task).await {
        Ok(created) => Ok(Some(created.metadata.uid.unwrap_or_default())),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api.get(&task.name_any()).await?;
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            if controlled_by(&existing.metadata, uid) {
                Ok(None)
            } else {
                Err(Error::Invalid(format!(
                    "task {namespace}/{} exists and is not controlled by this job (an earlier job of the same name?); waiting for it to go",
                    task.name_any()
                )))
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            // The namespace went away since it was cached.
            lock(&state.namespaces).remove(&namespace);
            Err(kube::Error::Api(s).into())
        }
        Err(e) => Err(e.into()),
    }
}

async fn ensure_namespace(state: &JobState, namespace: &str) -> Result<(), Error> {
    if lock(&state.namespaces).contains(namespace) {
        return Ok(());
    }
    let api: Api<Namespace> = Api::all(state.ctx.client.clone());
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    lock(&state.namespaces).insert(namespace.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_api::types::{JobSpec, TaskPlacement};

    fn obs(phase: Option<JobPhase>, tasks: Vec<Option<ObservedTask>>) -> Observation {
        Observation {
            phase,
            stopped: false,
            restart: None,
            templates: (0..tasks.len()).map(|i| format!("t{i}")).collect(),
            tasks,
        }
    }

    fn t(phase: Option<TaskPhase>) -> Option<ObservedTask> {
        Some(ObservedTask {
            phase,
            ..Default::default()
        })
    }

    fn stopped_t(phase: Option<TaskPhase>) -> Option<ObservedTask> {
        Some(ObservedTask {
            phase,
            stopped: true,
            ..Default::default()
        })
    }

    use JobPhase as J;
    use TaskPhase as T;

    #[test]
    fn new_job_goes_pending_and_places() {
        let d = decide(&obs(None, vec![None, None]));
        assert_eq!(d.phase, J::Pending);
        assert!(d.place_missing);
        assert_eq!(d.reason, "Pending");
        // Partially created (killed mid-way): place the rest.
        let d = decide(&obs(Some(J::Pending), vec![t(None), None]));
        assert_eq!(d.phase, J::Pending);
        assert!(d.place_missing);
        let d = decide(&obs(Some(J::Pending), vec![t(None), t(Some(T::Pending))]));
        assert!(!d.place_missing);
        assert_eq!(d.phase, J::Pending);
    }

    #[test]
    fn progress_from_task_phases() {
        let cases = [
            (
                J::Pending,
                vec![Some(T::Running), Some(T::Pending)],
                J::Running,
            ),
            (
                J::Pending,
                vec![Some(T::Succeeded), Some(T::Pending)],
                J::Running,
            ),
            (
                J::Pending,
                vec![Some(T::Succeeded), Some(T::Succeeded)],
                J::Succeeded,
            ),
            (
                J::Running,
                vec![Some(T::Succeeded), Some(T::Succeeded)],
                J::Succeeded,
            ),
            (
                J::Running,
                vec![Some(T::Failed), Some(T::Running)],
                J::Failed,
            ),
            (J::Pending, vec![Some(T::Failed), None], J::Failed),
            // Running never goes back to Pending.
            (
                J::Running,
                vec![Some(T::Pending), Some(T::Pending)],
                J::Running,
            ),
            // A Stopped Task of a running Job is being resumed: pending.
            (
                J::Pending,
                vec![Some(T::Stopped), Some(T::Pending)],
                J::Pending,
            ),
            // Terminal phases stay.
            (
                J::Succeeded,
                vec![Some(T::Failed), Some(T::Running)],
                J::Succeeded,
            ),
            (
                J::Failed,
                vec![Some(T::Succeeded), Some(T::Succeeded)],
                J::Failed,
            ),
        ];
        for (from, phases, to) in cases {
            let d = decide(&obs(Some(from), phases.iter().map(|p| t(*p)).collect()));
            assert_eq!(d.phase, to, "{from:?} with {phases:?}");
        }
        let empty = decide(&obs(Some(J::Pending), vec![]));
        assert_eq!(
            empty.phase,
            J::Pending,
            "a Job without tasks never completes"
        );
    }

    #[test]
    fn failure_stops_the_rest_and_explains() {
        let mut o = obs(
            Some(J::Running),
            vec![
                Some(ObservedTask {
                    phase: Some(T::Failed),
                    message: Some("exit code 3".into()),
                    ..Default::default()
                }),
                t(Some(T::Running)),
                t(Some(T::Succeeded)),
                stopped_t(Some(T::Running)),
            ],
        );
        o.templates = vec!["actor".into(), "rollout".into(), "env".into(), "x".into()];
        let d = decide(&o);
        assert_eq!(d.phase, J::Failed);
        assert_eq!(d.reason, "Failed");
        assert_eq!(d.message, "task \"actor\" failed: exit code 3");
        assert_eq!(d.stop, vec![1], "only unfinished, not yet stopped tasks");
        assert!(!d.place_missing);
    }

    #[test]
    fn stop_and_resume() {
        let mut o = obs(
            Some(J::Running),
            vec![t(Some(T::Running)), t(Some(T::Succeeded)), t(None)],
        );
        o.stopped = true;
        let d = decide(&o);
        assert_eq!(d.phase, J::Running, "stays Running while a task runs");
        assert_eq!(d.reason, "Stopping");
        assert_eq!(d.stop, vec![0, 2]);
        // Tasks acknowledged: none running any more.
        let mut o = obs(
            Some(J::Running),
            vec![
                stopped_t(Some(T::Stopped)),
                t(Some(T::Succeeded)),
                stopped_t(Some(T::Pending)),
            ],
        );
        o.stopped = true;
        let d = decide(&o);
        assert_eq!(d.phase, J::Stopped);
        assert!(d.stop.is_empty());
        // Pending without tasks (unschedulable): stopped at once, nothing placed.
        let mut o = obs(Some(J::Pending), vec![None]);
        o.stopped = true;
        let d = decide(&o);
        assert_eq!(d.phase, J::Stopped);
        assert!(!d.place_missing);
        // A new Job created stopped.
        let mut o = obs(None, vec![None]);
        o.stopped = true;
        assert_eq!(decide(&o).phase, J::Stopped);
        // Failed → Stopped.
        let mut o = obs(Some(J::Failed), vec![t(Some(T::Failed))]);
        o.stopped = true;
        assert_eq!(decide(&o).phase, J::Stopped);
        // Succeeded stays.
        let mut o = obs(Some(J::Succeeded), vec![t(Some(T::Succeeded))]);
        o.stopped = true;
        assert_eq!(decide(&o).phase, J::Succeeded);

        // Resume: clear stopped, place what is missing.
        let o = obs(Some(J::Stopped), vec![stopped_t(Some(T::Stopped)), None]);
        let d = decide(&o);
        assert_eq!(d.phase, J::Pending);
        assert_eq!(d.reason, "Resumed");
        assert_eq!(d.resume, vec![0]);
        assert!(d.place_missing);
        // Resume of a Job whose task failed: Failed again, nothing restarted.
        let o = obs(
            Some(J::Stopped),
            vec![stopped_t(Some(T::Failed)), stopped_t(Some(T::Stopped))],
        );
        let d = decide(&o);
        assert_eq!(d.phase, J::Failed);
        assert!(d.resume.is_empty());
    }

    #[test]
    fn restart_deletes_then_resets() {
        for from in [J::Succeeded, J::Failed, J::Stopped] {
            let mut o = obs(Some(from), vec![t(Some(T::Succeeded)), t(Some(T::Failed))]);
            o.restart = Some("2026-01-01T00:00:00Z".into());
            let d = decide(&o);
            assert_eq!(d.phase, from, "phase kept while deleting");
            assert!(d.delete_all);
            assert_eq!(d.restart, Restart::Deleting);
            assert!(!d.place_missing);

            let mut o = obs(Some(from), vec![None, None]);
            o.restart = Some("2026-01-01T00:00:00Z".into());
            let d = decide(&o);
            assert_eq!(d.phase, J::Pending);
            assert_eq!(d.reason, "Restarted");
            assert_eq!(d.restart, Restart::Done("2026-01-01T00:00:00Z".into()));
            assert!(
                !d.place_missing,
                "placed by the next pass, on the reset status"
            );
        }
        // Restart of a Job still stopped: tasks go, it stays Stopped.
        let mut o = obs(Some(J::Stopped), vec![None]);
        o.restart = Some("r".into());
        o.stopped = true;
        assert_eq!(decide(&o).phase, J::Stopped);
        // Active Job: ignored (recorded).
        let mut o = obs(Some(J::Running), vec![t(Some(T::Running))]);
        o.restart = Some("r".into());
        let d = decide(&o);
        assert_eq!(d.restart, Restart::Ignored("r".into()));
        assert_eq!(d.phase, J::Running);
        assert!(!d.delete_all);
        // New Job with the annotation: adopted.
        let mut o = obs(None, vec![None]);
        o.restart = Some("r".into());
        let d = decide(&o);
        assert_eq!(d.restart, Restart::Adopted("r".into()));
        assert!(d.place_missing);
    }

    fn job_with(templates: serde_json::Value) -> Job {
        let mut job = Job::new(
            "train",
            JobSpec {
                tasks: serde_json::from_value(templates).unwrap(),
                domain: Some("d1".into()),
                ssh_public_key: Some("ssh-ed25519 AAAA".into()),
                stopped: false,
                access: Vec::new(),
            },
        );
        job.metadata.uid = Some("job-uid".into());
        job.metadata.generation = Some(3);
        job
    }

    fn three_templates() -> Job {
        job_with(json!([
            {"name": "actor", "head": true, "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["a"], "replicas": 2}},
            {"name": "rollout", "agentType": "Kubernetes", "role": "Rollout", "kubernetes": {"workload": {"kind": "Deployment", "replicas": 3, "template": {}}}},
            {"name": "env", "agentType": "Docker", "role": "Env", "docker": {"containers": []}},
            {"name": "sim", "agentType": "Kubernetes", "role": "Env", "kubernetes": {"workload": {"kind": "Job", "template": {}}}},
        ]))
    }

    #[test]
    fn ray_annotations_like_rlark() {
        let job = three_templates();
        let a = ray_annotations("train", &job.spec.tasks);
        let get = |i: usize, k: &str| a[i].get(k).cloned().unwrap_or_default();
        // 2 (raw) + 3 (k8s) + 1 (docker) + 1 (k8s without replicas).
        for i in 0..4 {
            assert_eq!(get(i, labels::RAY_TOTAL_NODES), "7");
            assert_eq!(get(i, labels::RAY_HEAD_TASK_NAME), "train-actor");
        }
        assert_eq!(get(0, labels::RAY_NODE_RANK_START), "0");
        assert_eq!(get(1, labels::RAY_NODE_RANK_START), "2");
        assert_eq!(get(2, labels::RAY_NODE_RANK_START), "5");
        assert_eq!(get(3, labels::RAY_NODE_RANK_START), "6");
        assert_eq!(get(0, labels::RAY_ROLE), "head");
        assert_eq!(get(1, labels::RAY_ROLE), "worker");
        // No head: no head task name.
        let mut no_head = job.spec.tasks.clone();
        no_head[0].head = false;
        assert!(!ray_annotations("train", &no_head)[0].contains_key(labels::RAY_HEAD_TASK_NAME));
    }

    #[test]
    fn built_task_carries_input_and_env_from() {
        let mut job = three_templates();
        let template: JobTaskTemplate = serde_json::from_value(serde_json::json!({
            "name": "rollout", "agentType": "Raw", "role": "Rollout",
            "raw": {"entrypoint": ["x"]},
            "input": {"question": "2+2", "samples": [1, 2]},
            "envFrom": {"input": [{"name": "QUESTION", "path": "$.question"}]},
        }))
        .unwrap();
        job.spec.tasks[1] = template.clone();
        let spec = desired_spec(&job, &job.spec.tasks[1]);
        assert_eq!(spec.input, template.spec.input);
        assert_eq!(spec.env_from, template.spec.env_from);
        assert_eq!(
            spec.input_env().0,
            [("QUESTION".to_string(), "2+2".to_string())]
        );
    }

    #[test]
    fn built_task_carries_everything() {
        let job = three_templates();
        let decision = TaskPlacementDecision {
            template: "actor".into(),
            namespace: "rlark-a".into(),
            placement: TaskPlacement {
                cluster_id: "a".into(),
                nodes: vec!["n1".into(), "n2".into()],
            },
        };
        let ray = ray_annotations("train", &job.spec.tasks);
        let task = build_task(&job, 0, &decision, &ray[0]).unwrap();
        assert_eq!(task.name_any(), "train-actor");
        assert_eq!(task.namespace().as_deref(), Some("rlark-a"));
        assert_eq!(
            task.labels().get(labels::JOB).map(String::as_str),
            Some("train")
        );
        assert_eq!(
            task.annotations().get(labels::RAY_ROLE).map(String::as_str),
            Some("head")
        );
        assert!(task.annotations().contains_key(labels::TEMPLATE_HASH));
        let owner = &task.owner_references()[0];
        assert_eq!(owner.kind, "Job");
        assert_eq!(owner.name, "train");
        assert_eq!(owner.uid, "job-uid");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(task.spec.domain.as_deref(), Some("d1"));
        assert_eq!(
            task.spec.ssh_public_key.as_deref(),
            Some("ssh-ed25519 AAAA")
        );
        assert_eq!(task.spec.placement, Some(decision.placement.clone()));
        assert!(!task.spec.stopped);
        // The fingerprint ignores placement and stopped, follows the template.
        let mut spec = task.spec.clone();
        spec.placement = None;
        assert_eq!(
            spec_fingerprint(&spec),
            task.annotations()[labels::TEMPLATE_HASH]
        );
        let mut changed = job.clone();
        changed.spec.tasks[0].spec.raw.as_mut().unwrap().entrypoint = vec!["b".into()];
        assert_ne!(
            spec_fingerprint(&desired_spec(&changed, &changed.spec.tasks[0])),
            task.annotations()[labels::TEMPLATE_HASH]
        );
        // No uid: refused.
        let mut anonymous = job.clone();
        anonymous.metadata.uid = None;
        assert!(build_task(&anonymous, 0, &decision, &ray[0]).is_err());
    }

    #[test]
    fn tasks_matched_to_templates() {
        let job = three_templates();
        let decision = |ns: &str| TaskPlacementDecision {
            template: "actor".into(),
            namespace: ns.into(),
            placement: TaskPlacement::default(),
        };
        let ray = BTreeMap::new();
        let mut a_old = build_task(&job, 0, &decision("rlark-a"), &ray).unwrap();
        a_old.metadata.creation_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::from_second(1).unwrap()));
        let mut a_dup = build_task(&job, 0, &decision("rlark-b"), &ray).unwrap();
        a_dup.metadata.creation_timestamp =
            Some(Time(k8s_openapi::jiff::Timestamp::from_second(2).unwrap()));
        let env = build_task(&job, 2, &decision("rlark-a"), &ray).unwrap();
        let mut foreign = build_task(&job, 1, &decision("rlark-a"), &ray).unwrap();
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "other".into();
        let mut removed = env.clone();
        removed.metadata.name = Some("train-gone".into());
        let (per, extra) = match_tasks(
            &job,
            vec![a_dup.clone(), foreign, env.clone(), a_old.clone(), removed],
        );
        assert_eq!(
            per[0].as_ref().and_then(|t| t.namespace()).as_deref(),
            Some("rlark-a")
        );
        assert!(per[1].is_none(), "a task of another owner is not ours");
        assert_eq!(
            per[2].as_ref().map(|t| t.name_any()).as_deref(),
            Some("train-env")
        );
        assert!(per[3].is_none());
        let extra: Vec<String> = extra
            .iter()
            .map(|t| format!("{}/{}", t.namespace().unwrap(), t.name_any()))
            .collect();
        assert_eq!(extra, vec!["rlark-a/train-gone", "rlark-b/train-actor"]);
    }

    fn now(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
    }

    fn cond<'a>(s: &'a JobStatus, t: &str) -> Option<&'a Condition> {
        s.conditions.iter().find(|c| c.type_ == t)
    }

    #[test]
    fn status_times_conditions_and_tasks() {
        let mut job = job_with(json!([
            {"name": "a", "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["a"]}},
        ]));
        // New → Pending, placement fails.
        let o = Observation::of(&job, &[None]);
        let d = decide(&o);
        let s = next_status(
            &job,
            &o,
            &d,
            &PlacementOutcome::Unschedulable("no room".into()),
            &now(0),
        );
        assert_eq!(s.phase, Some(J::Pending));
        assert_eq!(s.start_time, None);
        assert_eq!(
            s.tasks,
            vec![JobTaskStatus {
                name: "a".into(),
                phase: None,
                message: None
            }]
        );
        let u = cond(&s, condition::UNSCHEDULABLE).unwrap();
        assert_eq!((u.status.as_str(), u.message.as_str()), ("True", "no room"));
        assert_eq!(cond(&s, condition::SCHEDULED).unwrap().status, "False");
        assert!(cond(&s, condition::RUNNING).is_none());
        assert_eq!(u.observed_generation, Some(3));
        job.status = Some(s);
        assert!(waiting_for_capacity(&job));

        // Placed.
        let o = Observation::of(&job, &[None]);
        let d = decide(&o);
        let s = next_status(
            &job,
            &o,
            &d,
            &PlacementOutcome::Placed("placed".into()),
            &now(1),
        );
        assert_eq!(cond(&s, condition::UNSCHEDULABLE).unwrap().status, "False");
        let sched = cond(&s, condition::SCHEDULED).unwrap();
        assert_eq!(sched.status, "True");
        assert_eq!(sched.last_transition_time, now(1));
        job.status = Some(s);
        assert!(!waiting_for_capacity(&job));

        // Running: start time.
        let mut task = Task::new("train-a", job.spec.tasks[0].spec.clone());
        task.status = Some(rlark_api::types::TaskStatus {
            phase: Some(T::Running),
            message: Some("2/2 ready".into()),
            ..Default::default()
        });
        let o = Observation::of(&job, &[Some(task.clone())]);
        let d = decide(&o);
        let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(2));
        assert_eq!(s.phase, Some(J::Running));
        assert_eq!(s.start_time, Some(now(2)));
        assert_eq!(s.tasks[0].phase, Some(T::Running));
        assert_eq!(s.tasks[0].message.as_deref(), Some("2/2 ready"));
        assert_eq!(cond(&s, condition::RUNNING).unwrap().status, "True");
        assert_eq!(
            cond(&s, condition::SCHEDULED).unwrap().last_transition_time,
            now(1)
        );
        job.status = Some(s);

        // Succeeded: end time, Complete, Running false.
        task.status.as_mut().unwrap().phase = Some(T::Succeeded);
        let o = Observation::of(&job, &[Some(task.clone())]);
        let d = decide(&o);
        let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(3));
        assert_eq!(s.phase, Some(J::Succeeded));
        assert_eq!(s.start_time, Some(now(2)));
        assert_eq!(s.end_time, Some(now(3)));
        assert_eq!(cond(&s, condition::COMPLETE).unwrap().status, "True");
        assert_eq!(cond(&s, condition::RUNNING).unwrap().status, "False");
        assert!(cond(&s, condition::FAILED).is_none());
        job.status = Some(s.clone());
        // Steady: same status again (no write).
        let o = Observation::of(&job, &[Some(task.clone())]);
        let d = decide(&o);
        assert_eq!(
            next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(9)),
            s
        );

        // Restart: annotation; tasks gone → reset.
        job.annotations_mut()
            .insert(labels::RESTARTED_AT.into(), "r1".into());
        let o = Observation::of(&job, &[None]);
        assert_eq!(o.restart.as_deref(), Some("r1"));
        let d = decide(&o);
        let s = next_status(&job, &o, &d, &PlacementOutcome::NotAttempted, &now(10));
        assert_eq!(s.phase, Some(J::Pending));
        assert_eq!(s.start_time, None);
        assert_eq!(s.end_time, None);
        assert!(s.conditions.is_empty());
        assert_eq!(s.observed_restarted_at.as_deref(), Some("r1"));
        job.status = Some(s);
        assert_eq!(Observation::of(&job, &[None]).restart, None, "handled once");
    }

    #[test]
    fn status_patch_nulls_dropped_fields() {
        let old = JobStatus {
            phase: Some(J::Succeeded),
            end_time: Some(now(1)),
            ..Default::default()
        };
        let new = JobStatus {
            phase: Some(J::Pending),
            ..Default::default()
        };
        let patch = status_patch(&old, &new, Some("42")).unwrap();
        assert_eq!(patch["status"]["phase"], "Pending");
        assert_eq!(patch["status"]["endTime"], Value::Null);
        assert!(patch["status"].as_object().unwrap().contains_key("endTime"));
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
    }

    #[test]
    fn placement_description() {
        let d = vec![
            TaskPlacementDecision {
                template: "actor".into(),
                namespace: "rlark-a".into(),
                placement: TaskPlacement {
                    cluster_id: "a".into(),
                    nodes: vec!["a1".into(), "a2".into()],
                },
            },
            TaskPlacementDecision {
                template: "none".into(),
                namespace: "rlark-b".into(),
                placement: TaskPlacement {
                    cluster_id: "b".into(),
                    nodes: vec![],
                },
            },
        ];
        assert_eq!(
            describe_placements(&d),
            "actor → cluster \"a\" (a1, a2); none → cluster \"b\" (no replicas)"
        );
    }

    fn cached_task(uid: &str, rv: &str, deleting: bool) -> Arc<Task> {
        let job = three_templates();
        let mut task = Task::new(uid, job.spec.tasks[0].spec.clone());
        task.metadata.namespace = Some("rlark-a".into());
        task.metadata.uid = Some(uid.into());
        task.metadata.resource_version = Some(rv.into());
        if deleting {
            task.metadata.deletion_timestamp = Some(now(1));
        }
        Arc::new(task)
    }

    #[test]
    fn expectations_hold_until_the_cache_shows_every_write() {
        let mut e = Expectations::default();
        assert!(!e.tasks_pending());
        e.created.insert("new".into());
        e.deleted.insert("old".into());
        e.updated.insert("kept".into(), 7);
        e.since = Some(Instant::now());
        assert!(e.tasks_pending());

        // The cache before any of the writes.
        let before = vec![
            cached_task("old", "3", false),
            cached_task("kept", "5", false),
        ];
        assert!(!e.tasks_met_by(&before));
        // Created and deleted seen, the update not yet.
        let partly = vec![
            cached_task("new", "6", false),
            cached_task("kept", "5", false),
        ];
        assert!(!e.tasks_met_by(&partly));
        // Everything seen; a deletion in progress counts as seen.
        let after = vec![
            cached_task("new", "6", false),
            cached_task("old", "8", true),
            cached_task("kept", "7", false),
        ];
        assert!(e.tasks_met_by(&after));
        // A resourceVersion that is not a number is never trusted.
        let opaque = vec![
            cached_task("new", "6", false),
            cached_task("kept", "x", false),
        ];
        assert!(!e.tasks_met_by(&opaque));

        assert!(!e.expired());
        e.since = Instant::now().checked_sub(EXPECTATION_TTL + Duration::from_secs(1));
        assert!(e.expired());
    }
}
