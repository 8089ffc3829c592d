//! Workflow controller: a DAG of Jobs.
//!
//! # Rules ([`decide`], pure)
//!
//! - The DAG is `jobTemplates[].dependencies`, listed in any order ([`dag_order`]). An
//!   unknown dependency or a cycle (admission already refuses both) fails the Workflow
//!   with reason `InvalidDAG` naming it; no Job is created.
//! - Template `t` of Workflow `w` becomes Job `w-t` (label `rlinf.io/workflow=w`,
//!   controller ownerReference with `blockOwnerDeletion`, spec = the template's) once the
//!   Jobs of all its dependencies are `Succeeded`. Roots start at once.
//! - The phase is recomputed from the Jobs on every pass (level-triggered):
//!   any Job `Failed` → `Failed`, and no new Job starts (Jobs already running are left to
//!   finish); every Job `Succeeded` → `Succeeded`; some Job exists → `Running`; else
//!   `Pending`. So restarting a failed Job (its `rlark.io/restarted-at` annotation) lets
//!   the Workflow continue.
//! - `spec.stopped: true` (from any phase but `Succeeded`): no new Job starts, every
//!   unfinished Job gets `spec.stopped: true`; the Workflow is `Stopped` once none of its
//!   Jobs is `Running`. Clearing it resumes: the Jobs it stopped get `spec.stopped: false`
//!   (a template that itself says `stopped: true` is left alone) and the DAG continues.
//! - `status.jobs[]`, per template in order: the Job's phase, and as message why it fails
//!   or waits (its `Failed` / `Unschedulable` condition), or which dependencies a Job not
//!   yet created waits for.
//! - `startTime` when the first Job is created (phase `Running` the first time);
//!   `endTime` on `Succeeded`, `Failed`, `Stopped`, cleared when active again. Conditions
//!   `Running`, `Complete`, `Failed` as for Jobs; every phase change and every created Job
//!   records an Event.
//!
//! Like the Job controller it reads the Workflow fresh and lists its Jobs by label on
//! every pass, so it converges after a restart at any point without duplicate Jobs
//! (creating an existing Job of this Workflow is fine).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use rlark_api::labels;
use rlark_api::names::workflow_job_name;
use rlark_api::types::{
    Job, JobPhase, Workflow, WorkflowJobStatus, WorkflowJobTemplate, WorkflowPhase, WorkflowStatus,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Error;
use crate::events::{EventType, Recorder};
use crate::job::{condition, controlled_by, set_condition, status_patch, update_condition};
use crate::runner::{self, Reconciler};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "workflow";

/// Periodic re-check of a Workflow with nothing else to wait for.
const RESYNC: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------
// Pure part.

/// Indices of `templates` in an order where every template comes after its dependencies
/// (Kahn's algorithm; ties in listing order). `Err` names an unknown dependency or the
/// templates of a cycle (`a → b → a`).
pub fn dag_order(templates: &[WorkflowJobTemplate]) -> Result<Vec<usize>, String> {
    let index: HashMap<&str, usize> = templates
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    let mut indegree = vec![0usize; templates.len()];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); templates.len()];
    for (i, t) in templates.iter().enumerate() {
        for dep in &t.dependencies {
            let Some(&d) = index.get(dep.as_str()) else {
                return Err(format!(
                    "job template {:?} depends on unknown template {dep:?}",
                    t.name
                ));
            };
            indegree[i] += 1;
            dependents[d].push(i);
        }
    }
    let mut ready: std::collections::BTreeSet<usize> =
        (0..templates.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(templates.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &next in &dependents[i] {
            indegree[next] -= 1;
            if indegree[next] == 0 {
                ready.insert(next);
            }
        }
    }
    if order.len() == templates.len() {
        return Ok(order);
    }
    // Walk dependencies from a template left in the cycle until one repeats.
    let left: Vec<usize> = (0..templates.len()).filter(|&i| indegree[i] > 0).collect();
    let mut path: Vec<usize> = Vec::new();
    let mut at = left[0];
    loop {
        if let Some(pos) = path.iter().position(|&p| p == at) {
            let mut cycle: Vec<&str> = path[pos..]
                .iter()
                .map(|&i| templates[i].name.as_str())
                .collect();
            cycle.push(&templates[at].name);
            return Err(format!("dependency cycle: {}", cycle.join(" → ")));
        }
        path.push(at);
        // Some dependency of a template in a cycle is itself unresolved.
        at = templates[at]
            .dependencies
            .iter()
            .filter_map(|d| index.get(d.as_str()).copied())
            .find(|&d| indegree[d] > 0)
            .unwrap_or(at);
    }
}

/// What the controller saw of one template's Job.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedJob {
    /// `status.phase`.
    pub phase: Option<JobPhase>,
    /// `spec.stopped`.
    pub stopped: bool,
    /// Why it failed or waits (its `Failed` or `Unschedulable` condition).
    pub message: Option<String>,
}

/// Input of [`decide`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkflowObservation {
    /// Current `status.phase`.
    pub phase: Option<WorkflowPhase>,
    /// `spec.stopped`.
    pub stopped: bool,
    /// The templates, as listed.
    pub templates: Vec<WorkflowJobTemplate>,
    /// Per template: its Job, `None` when not created.
    pub jobs: Vec<Option<ObservedJob>>,
}

/// Output of [`decide`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkflowDecision {
    /// Phase to record.
    pub phase: WorkflowPhase,
    /// Event reason of a phase change.
    pub reason: &'static str,
    /// Detail of the phase.
    pub message: String,
    /// Templates whose Job to create now.
    pub create: Vec<usize>,
    /// Templates whose Job gets `spec.stopped: true`.
    pub stop: Vec<usize>,
    /// Templates whose Job gets `spec.stopped: false`.
    pub resume: Vec<usize>,
    /// Per template: the message for `status.jobs[]`.
    pub job_messages: Vec<Option<String>>,
}

/// The Workflow rules (see the module docs). Pure.
pub fn decide(obs: &WorkflowObservation) -> WorkflowDecision {
    let n = obs.templates.len();
    let job = |i: usize| obs.jobs.get(i).and_then(Option::as_ref);
    let phase_of = |i: usize| job(i).and_then(|j| j.phase);
    let name = |i: usize| obs.templates[i].name.as_str();
    let mut d = WorkflowDecision {
        phase: WorkflowPhase::Pending,
        reason: "Pending",
        message: String::new(),
        create: Vec::new(),
        stop: Vec::new(),
        resume: Vec::new(),
        job_messages: (0..n)
            .map(|i| job(i).and_then(|j| j.message.clone()))
            .collect(),
    };
    if let Err(why) = dag_order(&obs.templates) {
        d.phase = WorkflowPhase::Failed;
        d.reason = "InvalidDAG";
        d.message = why;
        return d;
    }
    let index: HashMap<&str, usize> = (0..n).map(|i| (name(i), i)).collect();
    let succeeded = |i: usize| phase_of(i) == Some(JobPhase::Succeeded);
    let unmet = |i: usize| -> Vec<&str> {
        obs.templates[i]
            .dependencies
            .iter()
            .filter(|dep| !index.get(dep.as_str()).is_some_and(|&j| succeeded(j)))
            .map(String::as_str)
            .collect()
    };
    for i in (0..n).filter(|&i| job(i).is_none()) {
        let waiting = unmet(i);
        if !waiting.is_empty() {
            let list: Vec<String> = waiting.iter().map(|w| format!("{w:?}")).collect();
            d.job_messages[i] = Some(format!("waiting for {}", list.join(", ")));
        }
    }
    let running: Vec<usize> = (0..n)
        .filter(|&i| phase_of(i) == Some(JobPhase::Running))
        .collect();
    let all_succeeded = n > 0 && (0..n).all(succeeded);
    let failed: Vec<usize> = (0..n)
        .filter(|&i| phase_of(i) == Some(JobPhase::Failed))
        .collect();
    let finished_job =
        |i: usize| matches!(phase_of(i), Some(JobPhase::Succeeded | JobPhase::Failed));

    if obs.stopped && !(obs.phase == Some(WorkflowPhase::Succeeded) && all_succeeded) {
        d.stop = (0..n)
            .filter(|&i| job(i).is_some_and(|j| !j.stopped) && !finished_job(i))
            .collect();
        for i in (0..n).filter(|&i| job(i).is_none()) {
            d.job_messages[i] = Some("not started: the workflow is stopped".into());
        }
        if running.is_empty() {
            d.phase = WorkflowPhase::Stopped;
            d.reason = "Stopped";
            d.message = "stopped on request".into();
        } else {
            d.phase = obs.phase.unwrap_or(WorkflowPhase::Running);
            d.reason = "Stopping";
            let list: Vec<String> = running.iter().map(|&i| format!("{:?}", name(i))).collect();
            d.message = format!("stopping: {} still running", list.join(", "));
        }
        return d;
    }
    d.resume = (0..n)
        .filter(|&i| job(i).is_some_and(|j| j.stopped) && !obs.templates[i].spec.stopped)
        .collect();
    if !failed.is_empty() {
        let list: Vec<String> = failed.iter().map(|&i| format!("{:?}", name(i))).collect();
        d.phase = WorkflowPhase::Failed;
        d.reason = "JobFailed";
        d.message = format!("job {} failed; no further job starts", list.join(", "));
        return d;
    }
    if all_succeeded {
        d.phase = WorkflowPhase::Succeeded;
        d.reason = "Completed";
        d.message = format!("all {n} jobs succeeded");
        return d;
    }
    d.create = (0..n)
        .filter(|&i| job(i).is_none() && unmet(i).is_empty())
        .collect();
    let exists = (0..n).filter(|&i| job(i).is_some()).count();
    if exists + d.create.len() > 0 {
        d.phase = WorkflowPhase::Running;
        d.reason = if obs.phase == Some(WorkflowPhase::Stopped) {
            "Resumed"
        } else {
            "Running"
        };
        let done = (0..n).filter(|&i| succeeded(i)).count();
        d.message = format!(
            "{done} of {n} jobs succeeded, {} running, {} starting",
            running.len(),
            d.create.len()
        );
    } else {
        d.message = "no job can start".into();
    }
    d
}

/// The status after a pass. Pure (`now` is given).
pub fn next_status(
    workflow: &Workflow,
    obs: &WorkflowObservation,
    decision: &WorkflowDecision,
    now: &Time,
) -> WorkflowStatus {
    let old = workflow.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let phase = decision.phase;
    let changed = written_phase(&old) != Some(phase);
    status.phase = Some(phase);
    status.jobs = obs
        .templates
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let job = obs.jobs.get(i).and_then(Option::as_ref);
            WorkflowJobStatus {
                name: t.name.clone(),
                phase: job.and_then(|j| j.phase),
                message: decision.job_messages.get(i).cloned().flatten(),
            }
        })
        .collect();
    if phase == WorkflowPhase::Running && status.start_time.is_none() {
        status.start_time = Some(now.clone());
    }
    match phase {
        WorkflowPhase::Succeeded | WorkflowPhase::Failed | WorkflowPhase::Stopped => {
            if changed || status.end_time.is_none() {
                status.end_time = Some(now.clone());
            }
        }
        WorkflowPhase::Pending | WorkflowPhase::Running => status.end_time = None,
    }
    let generation = workflow.metadata.generation;
    let conds = &mut status.conditions;
    let message = decision.message.as_str();
    let other = phase.as_str();
    let pairs = [
        (condition::RUNNING, WorkflowPhase::Running, "JobsRunning"),
        (
            condition::COMPLETE,
            WorkflowPhase::Succeeded,
            "AllJobsSucceeded",
        ),
        (condition::FAILED, WorkflowPhase::Failed, decision.reason),
    ];
    for (type_, when, reason) in pairs {
        if phase == when {
            set_condition(conds, type_, true, reason, message, now, generation);
        } else {
            update_condition(conds, type_, false, other, message, now, generation);
        }
    }
    status
}

/// The Job to create for template `index` of `workflow`. `Err` without name or uid.
pub fn build_job(workflow: &Workflow, index: usize) -> Result<Job, Error> {
    let template = workflow
        .spec
        .job_templates
        .get(index)
        .ok_or_else(|| Error::Invalid(format!("workflow has no job template #{index}")))?;
    let name = workflow
        .metadata
        .name
        .clone()
        .ok_or_else(|| Error::MissingName("Workflow".into()))?;
    let mut owner = workflow
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Invalid(format!("workflow {name} has no uid")))?;
    owner.block_owner_deletion = Some(true);
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(workflow_job_name(&name, &template.name)),
            labels: Some(labels::workflow_job_labels(&name)),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

/// The phase this controller last wrote: `None` for a Workflow it has not acted on yet,
/// whose status is the API server's initial `Pending` (no `jobs` list, which every write
/// of this controller sets).
pub fn written_phase(status: &WorkflowStatus) -> Option<WorkflowPhase> {
    status.phase.filter(|_| !status.jobs.is_empty())
}

/// Observation of `workflow` given the Jobs listed for it (by label): per template, the
/// Job named `<workflow>-<template>` that this Workflow controls.
pub fn observe(workflow: &Workflow, jobs: &[Job]) -> WorkflowObservation {
    let uid = workflow.metadata.uid.clone().unwrap_or_default();
    let wf = workflow.name_any();
    let by_name: HashMap<String, &Job> = jobs
        .iter()
        .filter(|j| controlled_by(&j.metadata, &uid))
        .map(|j| (j.name_any(), j))
        .collect();
    WorkflowObservation {
        phase: workflow.status.as_ref().and_then(written_phase),
        stopped: workflow.spec.stopped,
        templates: workflow.spec.job_templates.clone(),
        jobs: workflow
            .spec
            .job_templates
            .iter()
            .map(|t| {
                by_name.get(&workflow_job_name(&wf, &t.name)).map(|j| {
                    let status = j.status.clone().unwrap_or_default();
                    let why = |type_: &str| {
                        status
                            .conditions
                            .iter()
                            .find(|c| c.type_ == type_ && c.status == "True")
                            .map(|c| c.message.clone())
                    };
                    ObservedJob {
                        phase: status.phase,
                        stopped: j.spec.stopped,
                        message: why(condition::FAILED).or_else(|| why(condition::UNSCHEDULABLE)),
                    }
                })
            })
            .collect(),
    }
}

// ---------------------------------------------------------------------------------------
// Controller.

struct WorkflowState {
    ctx: Arc<Context>,
}

/// Run the Workflow controller until `shutdown` is cancelled (in-flight reconciles
/// finish). Watches Workflows and the Jobs they own.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let workflows: Api<Workflow> = Api::all(ctx.client.clone());
    let jobs: Api<Job> = Api::all(ctx.client.clone());
    let metrics = Arc::clone(&ctx.metrics);
    let controller = Controller::new(workflows, watcher::Config::default())
        .owns(jobs, watcher::Config::default());
    runner::run(
        controller,
        Arc::new(WorkflowState { ctx }),
        metrics,
        shutdown,
    )
    .await;
}

impl Reconciler for WorkflowState {
    type Object = Workflow;
    const CONTROLLER: &'static str = CONTROLLER;

    fn span(workflow: &Workflow) -> tracing::Span {
        tracing::info_span!("reconcile", controller = CONTROLLER, name = %workflow.name_any())
    }

    async fn reconcile(self: Arc<Self>, workflow: Arc<Workflow>) -> Result<Action, Error> {
        reconcile_workflow(&workflow.name_any(), &self).await
    }

    runner::policy_log!(workflow);
}

async fn reconcile_workflow(name: &str, state: &WorkflowState) -> Result<Action, Error> {
    let client = &state.ctx.client;
    let workflows: Api<Workflow> = Api::all(client.clone());
    let Some(workflow) = workflows.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    if workflow.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let recorder = &state.ctx.recorder;
    let reference = Recorder::reference(&workflow);
    let jobs_api: Api<Job> = Api::all(client.clone());
    let jobs = jobs_api
        .list(&ListParams::default().labels(&format!("{}={name}", labels::WORKFLOW)))
        .await?
        .items;
    let obs = observe(&workflow, &jobs);
    let decision = decide(&obs);

    let names: Vec<String> = obs
        .templates
        .iter()
        .map(|t| workflow_job_name(name, &t.name))
        .collect();
    for &i in &decision.stop {
        set_job_stopped(&jobs_api, &names[i], true).await?;
    }
    if !decision.stop.is_empty() {
        let list: Vec<&str> = decision.stop.iter().map(|&i| names[i].as_str()).collect();
        recorder
            .record(
                &reference,
                EventType::Normal,
                "Stopping",
                &format!("stopping jobs {}", list.join(", ")),
            )
            .await;
    }
    for &i in &decision.resume {
        set_job_stopped(&jobs_api, &names[i], false).await?;
    }
    let mut obs_after = obs.clone();
    for &i in &decision.create {
        let job = build_job(&workflow, i)?;
        match jobs_api.create(&PostParams::default(), &job).await {
            Ok(_) => {
                recorder
                    .record(
                        &reference,
                        EventType::Normal,
                        "CreatedJob",
                        &format!(
                            "created job {} for template {:?}",
                            names[i], obs.templates[i].name
                        ),
                    )
                    .await;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = jobs_api.get(&names[i]).await?;
                let uid = workflow.metadata.uid.as_deref().unwrap_or_default();
                if !controlled_by(&existing.metadata, uid) {
                    return Err(Error::Invalid(format!(
                        "job {} exists and is not controlled by this workflow",
                        names[i]
                    )));
                }
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(slot) = obs_after.jobs.get_mut(i) {
            slot.get_or_insert_with(ObservedJob::default);
        }
    }

    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let old = workflow.status.clone().unwrap_or_default();
    let status = next_status(&workflow, &obs_after, &decision, &now);
    if status != old {
        let patch = status_patch(&old, &status, workflow.metadata.resource_version.as_deref())?;
        workflows
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    if written_phase(&old) != Some(decision.phase) {
        let type_ = if decision.phase == WorkflowPhase::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        tracing::info!(
            from = written_phase(&old).map_or("", |p| p.as_str()),
            to = decision.phase.as_str(),
            reason = decision.reason,
            "workflow phase changed"
        );
        recorder
            .record(&reference, type_, decision.reason, &decision.message)
            .await;
    }
    Ok(Action::requeue(if decision.reason == "Stopping" {
        Duration::from_secs(2)
    } else {
        RESYNC
    }))
}

async fn set_job_stopped(api: &Api<Job>, name: &str, stopped: bool) -> Result<(), Error> {
    let patch = json!({"spec": {"stopped": stopped}});
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_api::types::{JobStatus, WorkflowSpec};

    fn tpl(name: &str, deps: &[&str]) -> WorkflowJobTemplate {
        WorkflowJobTemplate {
            name: name.into(),
            dependencies: deps.iter().map(|d| d.to_string()).collect(),
            spec: Default::default(),
        }
    }

    /// `train → {eval-a, eval-b} → report`, listed out of order.
    fn diamond() -> Vec<WorkflowJobTemplate> {
        vec![
            tpl("report", &["eval-a", "eval-b"]),
            tpl("eval-b", &["train"]),
            tpl("train", &[]),
            tpl("eval-a", &["train"]),
        ]
    }

    fn obs(
        templates: Vec<WorkflowJobTemplate>,
        phases: &[Option<Option<JobPhase>>],
    ) -> WorkflowObservation {
        WorkflowObservation {
            phase: None,
            stopped: false,
            jobs: phases
                .iter()
                .map(|p| {
                    p.map(|phase| ObservedJob {
                        phase,
                        ..Default::default()
                    })
                })
                .collect(),
            templates,
        }
    }

    #[test]
    fn order_ignores_listing_order() {
        let templates = diamond();
        let order = dag_order(&templates).unwrap();
        let names: Vec<&str> = order.iter().map(|&i| templates[i].name.as_str()).collect();
        assert_eq!(names, vec!["train", "eval-b", "eval-a", "report"]);
        assert_eq!(dag_order(&[]).unwrap(), Vec::<usize>::new());
    }

    #[test]
    fn cycles_and_unknown_dependencies_are_named() {
        let err = dag_order(&[
            tpl("a", &["b"]),
            tpl("b", &["c"]),
            tpl("c", &["a"]),
            tpl("d", &[]),
        ])
        .unwrap_err();
        assert_eq!(err, "dependency cycle: a → b → c → a");
        let err = dag_order(&[tpl("x", &["x"])]).unwrap_err();
        assert_eq!(err, "dependency cycle: x → x");
        // A template behind a cycle is not part of it.
        let err =
            dag_order(&[tpl("after", &["a"]), tpl("a", &["b"]), tpl("b", &["a"])]).unwrap_err();
        assert_eq!(err, "dependency cycle: a → b → a");
        let err = dag_order(&[tpl("a", &["ghost"])]).unwrap_err();
        assert_eq!(
            err,
            "job template \"a\" depends on unknown template \"ghost\""
        );
        let d = decide(&obs(vec![tpl("a", &["a"])], &[None]));
        assert_eq!(d.phase, WorkflowPhase::Failed);
        assert_eq!(d.reason, "InvalidDAG");
        assert!(d.create.is_empty());
    }

    #[test]
    fn diamond_runs_in_dependency_order() {
        use JobPhase::*;
        // report, eval-b, train, eval-a
        let d = decide(&obs(diamond(), &[None, None, None, None]));
        assert_eq!(d.create, vec![2]);
        assert_eq!(d.phase, WorkflowPhase::Running);
        assert_eq!(
            d.job_messages[0].as_deref(),
            Some("waiting for \"eval-a\", \"eval-b\"")
        );
        assert_eq!(d.job_messages[1].as_deref(), Some("waiting for \"train\""));
        assert_eq!(d.job_messages[2], None);

        let d = decide(&obs(diamond(), &[None, None, Some(Some(Running)), None]));
        assert!(d.create.is_empty());
        assert_eq!(d.phase, WorkflowPhase::Running);

        let d = decide(&obs(diamond(), &[None, None, Some(Some(Succeeded)), None]));
        assert_eq!(d.create, vec![1, 3]);

        let d = decide(&obs(
            diamond(),
            &[
                None,
                Some(Some(Succeeded)),
                Some(Some(Succeeded)),
                Some(Some(Running)),
            ],
        ));
        assert!(d.create.is_empty());
        assert_eq!(d.job_messages[0].as_deref(), Some("waiting for \"eval-a\""));

        let d = decide(&obs(
            diamond(),
            &[
                None,
                Some(Some(Succeeded)),
                Some(Some(Succeeded)),
                Some(Some(Succeeded)),
            ],
        ));
        assert_eq!(d.create, vec![0]);

        let all = [Some(Some(Succeeded)); 4];
        let d = decide(&obs(diamond(), &all));
        assert_eq!(d.phase, WorkflowPhase::Succeeded);
        assert!(d.create.is_empty());
    }

    #[test]
    fn a_failure_starts_nothing_more() {
        use JobPhase::*;
        let d = decide(&obs(
            diamond(),
            &[
                None,
                Some(Some(Failed)),
                Some(Some(Succeeded)),
                Some(Some(Running)),
            ],
        ));
        assert_eq!(d.phase, WorkflowPhase::Failed);
        assert_eq!(d.reason, "JobFailed");
        assert_eq!(d.message, "job \"eval-b\" failed; no further job starts");
        assert!(d.create.is_empty());
        assert!(d.stop.is_empty(), "running jobs are left to finish");
        // The failed Job restarted: the Workflow continues.
        let d = decide(&obs(
            diamond(),
            &[
                None,
                Some(Some(Pending)),
                Some(Some(Succeeded)),
                Some(Some(Succeeded)),
            ],
        ));
        assert_eq!(d.phase, WorkflowPhase::Running);
    }

    #[test]
    fn stop_and_resume() {
        use JobPhase::*;
        let mut o = obs(
            diamond(),
            &[
                None,
                Some(Some(Running)),
                Some(Some(Succeeded)),
                Some(Some(Pending)),
            ],
        );
        o.stopped = true;
        o.phase = Some(WorkflowPhase::Running);
        let d = decide(&o);
        assert_eq!(d.phase, WorkflowPhase::Running);
        assert_eq!(d.reason, "Stopping");
        assert_eq!(d.stop, vec![1, 3]);
        assert!(d.create.is_empty());
        assert_eq!(
            d.job_messages[0].as_deref(),
            Some("not started: the workflow is stopped")
        );

        let mut o = obs(
            diamond(),
            &[
                None,
                Some(Some(Stopped)),
                Some(Some(Succeeded)),
                Some(Some(Stopped)),
            ],
        );
        for j in o.jobs.iter_mut().flatten() {
            j.stopped = j.phase == Some(Stopped);
        }
        o.stopped = true;
        o.phase = Some(WorkflowPhase::Running);
        let d = decide(&o);
        assert_eq!(d.phase, WorkflowPhase::Stopped);
        assert!(d.stop.is_empty());

        // Resume.
        o.stopped = false;
        o.phase = Some(WorkflowPhase::Stopped);
        let d = decide(&o);
        assert_eq!(d.phase, WorkflowPhase::Running);
        assert_eq!(d.reason, "Resumed");
        assert_eq!(d.resume, vec![1, 3]);
        // A template that is itself stopped stays so.
        o.templates[1].spec.stopped = true;
        assert_eq!(decide(&o).resume, vec![3]);

        // Stop before anything started.
        let mut o = obs(diamond(), &[None, None, None, None]);
        o.stopped = true;
        let d = decide(&o);
        assert_eq!(d.phase, WorkflowPhase::Stopped);
        assert!(d.create.is_empty());
        // A Succeeded Workflow stays Succeeded.
        let mut o = obs(diamond(), &[Some(Some(Succeeded)); 4]);
        o.stopped = true;
        o.phase = Some(WorkflowPhase::Succeeded);
        assert_eq!(decide(&o).phase, WorkflowPhase::Succeeded);
    }

    fn workflow() -> Workflow {
        let mut w = Workflow::new(
            "wf",
            WorkflowSpec {
                job_templates: diamond(),
                stopped: false,
            },
        );
        w.metadata.uid = Some("wf-uid".into());
        w
    }

    #[test]
    fn built_job_and_observation() {
        let w = workflow();
        let job = build_job(&w, 2).unwrap();
        assert_eq!(job.name_any(), "wf-train");
        assert_eq!(
            job.labels().get(labels::WORKFLOW).map(String::as_str),
            Some("wf")
        );
        let owner = &job.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Workflow", "wf-uid")
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));

        let mut failed = job.clone();
        failed.status = Some(JobStatus {
            phase: Some(JobPhase::Failed),
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: condition::FAILED.into(),
                status: "True".into(),
                reason: "TaskFailed".into(),
                message: "task \"a\" failed: exit 1".into(),
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..Default::default()
        });
        let mut foreign = build_job(&w, 3).unwrap();
        foreign.metadata.owner_references.as_mut().unwrap()[0].uid = "x".into();
        let o = observe(&w, &[failed, foreign]);
        assert_eq!(o.jobs[2].as_ref().unwrap().phase, Some(JobPhase::Failed));
        assert_eq!(
            o.jobs[2].as_ref().unwrap().message.as_deref(),
            Some("task \"a\" failed: exit 1")
        );
        assert!(o.jobs[3].is_none());
    }

    #[test]
    fn status_follows_decision() {
        let mut w = workflow();
        let t =
            |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap());
        let o = obs(diamond(), &[None, None, None, None]);
        let d = decide(&o);
        let mut after = o.clone();
        after.jobs[2] = Some(ObservedJob::default());
        let s = next_status(&w, &after, &d, &t(0));
        assert_eq!(s.phase, Some(WorkflowPhase::Running));
        assert_eq!(s.start_time, Some(t(0)));
        assert_eq!(s.jobs.len(), 4);
        assert_eq!(s.jobs[0].name, "report");
        assert_eq!(
            s.jobs[0].message.as_deref(),
            Some("waiting for \"eval-a\", \"eval-b\"")
        );
        assert_eq!(s.conditions[0].type_, condition::RUNNING);
        w.status = Some(s);
        let all = obs(diamond(), &[Some(Some(JobPhase::Succeeded)); 4]);
        let d = decide(&all);
        let s = next_status(&w, &all, &d, &t(5));
        assert_eq!(s.phase, Some(WorkflowPhase::Succeeded));
        assert_eq!(s.start_time, Some(t(0)));
        assert_eq!(s.end_time, Some(t(5)));
        let complete = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::COMPLETE)
            .unwrap();
        assert_eq!(complete.status, "True");
        let running = s
            .conditions
            .iter()
            .find(|c| c.type_ == condition::RUNNING)
            .unwrap();
        assert_eq!(running.status, "False");
    }
}
