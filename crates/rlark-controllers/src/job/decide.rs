//! The pure part of the Job controller: an [`Observation`] of a Job and its Tasks becomes a
//! [`Decision`] ([`decide`], the state machine) and the Job's next status ([`next_status`]),
//! with the condition helpers the Workflow controller shares.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;
use rlark_api::labels;
use rlark_api::types::{Job, JobPhase, JobStatus, JobTaskStatus, RewardSummary, Task, TaskPhase};
// Expectation and assumption TTLs follow tokio's clock, which tests may pause and advance.

use super::condition;

/// What the controller saw of one template's Task.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedTask {
    /// `status.phase` (None until someone reports it).
    pub phase: Option<TaskPhase>,
    /// `status.message`.
    pub message: Option<String>,
    /// `spec.stopped`.
    pub stopped: bool,
    /// Being deleted (`metadata.deletionTimestamp`).
    pub deleting: bool,
    /// `status.reward`.
    pub reward: Option<RewardSummary>,
}

/// The phase this controller last wrote: `None` for a Job it has not acted on yet, whose
/// status is the API server's initial `Pending` (no per-task `tasks` list, which every
/// write of this controller sets), so a new Job is seen as new.
pub fn written_phase(status: &JobStatus) -> Option<JobPhase> {
    status.phase.filter(|_| !status.tasks.is_empty())
}

/// Input of [`decide`].
#[derive(Clone, Debug, Default, PartialEq)]
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
            phase: written_phase(&status),
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
                            reward: status.reward,
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

pub(super) fn names_of(templates: &[String], indices: &[usize]) -> String {
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
    let phase_changed = written_phase(&old) != Some(phase);
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
                reward: task.and_then(|t| t.reward.clone()),
            }
        })
        .collect();
    status.reward = RewardSummary::combine(status.tasks.iter().filter_map(|t| t.reward.as_ref()));
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
