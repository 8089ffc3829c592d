//! Task controller (control-plane side): aggregates the Pods agents report for a Task's
//! replicas into the Task's `status`.
//!
//! # What it owns
//!
//! `status.phase`, `message`, `observedNodes`, `replicas`, `readyReplicas`,
//! `succeededReplicas`, `failedReplicas`, `retryCount`, `startTime`, `completionTime`,
//! `pullProgress` (while Pending: the replicas' image pulls), and in `conditions` only
//! the conditions `NotInAgentNamespace` (a Task outside every `rlark-<cluster-id>`
//! namespace, which no agent will run; with a Warning Event) and `DeviceUnhealthy` (from
//! the replicas' `status.unhealthyDevices`; the
//! others, e.g. the Node controller's `NodeLost`, are written back as they were). It writes
//! with a merge patch of only the fields that changed, preconditioned on the Task's
//! `resourceVersion` so a concurrent writer (the Node controller failing the Task) is never
//! overwritten with a stale aggregate.
//!
//! # Rules ([`aggregate`], a pure function)
//!
//! Pods belong to a Task by `spec.taskNamespace`/`spec.taskName` (or, failing that, the
//! `rlark.io/task-name` label in the Pod's namespace). A Pod owned (ownerReference) by an
//! earlier incarnation of the Task, or created before the Task (or before its
//! `rlark.io/restarted-at`), is ignored. Per replica index the newest Pod counts; older
//! Pods of the same index count as retries.
//!
//! - `Succeeded` and `Failed` are final: a finished Task is left alone, unless its
//!   `rlark.io/restarted-at` annotation is at or after its `completionTime` (a restart).
//! - `spec.stopped`: `Stopped` once no replica runs (`Running` while some still do).
//! - a replica ended by the stop (Pod `Failed` with reason `Stopped`) is not a failure;
//! - any replica `Failed` (agents report Failed only beyond the restart policy) →
//!   `Failed`, with the replica, node, exit code and the Pod's message in `message`;
//! - every desired replica `Succeeded` → `Succeeded`;
//! - any replica `Running` → `Running`;
//! - otherwise `Pending`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::agent::{REASON_STOPPED, TASK_UID_ANNOTATION};
use rlark_api::labels;
use rlark_api::types::{Pod, PodPhase, PullProgress, Task, TaskPhase, TaskSpec, TaskStatus};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Error;
use crate::events::{EventType, Recorder};
use crate::runner::{self, Reconciler};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "task";

/// Status fields this controller owns (JSON names).
const OWNED_FIELDS: &[&str] = &[
    "phase",
    "message",
    "observedNodes",
    "replicas",
    "readyReplicas",
    "succeededReplicas",
    "failedReplicas",
    "retryCount",
    "startTime",
    "completionTime",
    "pullProgress",
    "conditions",
];

struct TaskContext {
    ctx: Arc<Context>,
    pods: Store<Pod>,
    /// True once the Pod cache holds the initial list.
    pods_ready: tokio::sync::watch::Receiver<bool>,
}

/// Run the Task controller until `shutdown` is cancelled. Watches all Tasks and all Pods
/// (a Pod change reconciles its Task); in-flight reconciles finish on shutdown.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let tasks: Api<Task> = Api::all(ctx.client.clone());
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let (reader, writer) = reflector::store::<Pod>();
    // Readiness of the Pod cache as a watch channel: kube-runtime's
    // `Store::wait_until_ready` keeps only the last waiter's waker, so concurrent
    // reconciles waiting on it can hang forever.
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let pod_events = reflector::reflector(writer, watcher(pods, watcher::Config::default()))
        .default_backoff()
        .filter_map(move |event| {
            let object = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => Some(Ok(pod)),
                Ok(watcher::Event::Delete(pod)) => Some(Ok(pod)),
                Ok(watcher::Event::InitDone) => {
                    ready_tx.send_replace(true);
                    None
                }
                Ok(watcher::Event::Init) => None,
                Err(error) => Some(Err(error)),
            };
            futures::future::ready(object)
        });
    let metrics = Arc::clone(&ctx.metrics);
    let state = Arc::new(TaskContext {
        ctx,
        pods: reader,
        pods_ready: ready_rx,
    });
    let controller = Controller::new(tasks, watcher::Config::default())
        .watches_stream(pod_events, |pod: Pod| task_of_pod(&pod));
    runner::run(controller, state, metrics, shutdown).await;
}

/// The Task a Pod reports for: `spec.taskNamespace`/`spec.taskName`, else the
/// `rlark.io/task-name` label in the Pod's own namespace.
pub fn task_of_pod(pod: &Pod) -> Option<ObjectRef<Task>> {
    let pod_namespace = pod.namespace();
    let name = pod
        .spec
        .task_name
        .clone()
        .filter(|n| !n.is_empty())
        .or_else(|| pod.labels().get(labels::TASK_NAME).cloned())?;
    let namespace = pod
        .spec
        .task_namespace
        .clone()
        .filter(|n| !n.is_empty())
        .or(pod_namespace)?;
    Some(ObjectRef::new(&name).within(&namespace))
}

impl Reconciler for TaskContext {
    type Object = Task;
    const CONTROLLER: &'static str = CONTROLLER;
    // Someone wrote the Task meanwhile: retry soon on fresh data.
    const CONFLICT_MESSAGE: &'static str = "status write conflicted; retrying";

    fn key(task: &Task) -> String {
        object_key(task)
    }

    fn span(task: &Task) -> tracing::Span {
        tracing::info_span!(
            "reconcile",
            controller = CONTROLLER,
            namespace = task.namespace().unwrap_or_default(),
            name = %task.name_any(),
        )
    }

    async fn reconcile(self: Arc<Self>, task: Arc<Task>) -> Result<Action, Error> {
        reconcile_task(&task, &self).await
    }

    runner::policy_log!(task);
}

fn object_key(task: &Task) -> String {
    format!(
        "{}/{}",
        task.namespace().unwrap_or_default(),
        task.name_any()
    )
}

async fn reconcile_task(task: &Task, state: &TaskContext) -> Result<Action, Error> {
    if task.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = task
        .namespace()
        .ok_or_else(|| Error::Invalid(format!("task {} has no namespace", task.name_any())))?;
    let name = task
        .metadata
        .name
        .clone()
        .ok_or_else(|| Error::MissingName("Task".into()))?;
    // Aggregating from a cache that has not seen the initial list would report Pods as
    // missing; wait for it (it is fed by the same controller's watch).
    state
        .pods_ready
        .clone()
        .wait_for(|ready| *ready)
        .await
        .map_err(|_| Error::CacheUnavailable("the pod watch ended".into()))?;
    let pods: Vec<Arc<Pod>> = state
        .pods
        .state()
        .into_iter()
        .filter(|pod| {
            task_of_pod(pod)
                .is_some_and(|r| r.name == name && r.namespace.as_deref() == Some(&namespace))
        })
        .collect();
    let pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    let current = task.status.clone().unwrap_or_default();
    let desired = aggregate(
        &task.metadata,
        &task.spec,
        &current,
        &pods,
        Timestamp::now(),
    );
    let Some(patch) = status_patch(&current, &desired)? else {
        return Ok(Action::await_change());
    };
    let body = json!({
        "metadata": {"resourceVersion": task.resource_version()},
        "status": patch,
    });
    let api: Api<Task> = Api::namespaced(state.ctx.client.clone(), &namespace);
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    tracing::debug!(patch = %body["status"], "task status updated");
    if current.phase != desired.phase
        && let Some(phase) = desired.phase
    {
        record_transition(&state.ctx.recorder, task, current.phase, phase, &desired).await;
    }
    let newly_outside = |status: &TaskStatus| {
        status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_NOT_IN_AGENT_NAMESPACE)
    };
    if newly_outside(&desired) && !newly_outside(&current) {
        let message = outside_agent_namespaces(&task.metadata).unwrap_or_default();
        state
            .ctx
            .recorder
            .record(
                &Recorder::reference(task),
                EventType::Warning,
                CONDITION_NOT_IN_AGENT_NAMESPACE,
                &message,
            )
            .await;
    }
    Ok(Action::await_change())
}

async fn record_transition(
    recorder: &Recorder,
    task: &Task,
    from: Option<TaskPhase>,
    to: TaskPhase,
    status: &TaskStatus,
) {
    let message = status.message.clone().unwrap_or_default();
    let (type_, reason, message) = match to {
        // A new Task starts Pending; only a return to Pending (resume) is worth an Event.
        TaskPhase::Pending if from.is_none() => return,
        TaskPhase::Pending => (
            EventType::Normal,
            "Pending",
            "task is pending again".to_string(),
        ),
        TaskPhase::Running => (EventType::Normal, "Running", message),
        TaskPhase::Succeeded => (EventType::Normal, "Succeeded", message),
        TaskPhase::Failed => (EventType::Warning, "Failed", message),
        TaskPhase::Stopped => (EventType::Normal, "Stopped", message),
    };
    recorder
        .record(&Recorder::reference(task), type_, reason, &message)
        .await;
}

/// The owned status fields as they should be, from the Task and its Pods at `now` (pure).
///
/// Fields this controller does not own are copied from `current`; `message` is left as it
/// is while the Task is `Pending` with nothing to report (the scheduler may have said why).
pub fn aggregate(
    meta: &ObjectMeta,
    spec: &TaskSpec,
    current: &TaskStatus,
    pods: &[&Pod],
    now: Timestamp,
) -> TaskStatus {
    let restarted_at = restarted_at(meta);
    // Times of an earlier run (before the last restart request) no longer apply.
    let this_run = |time: &Option<Time>| {
        time.clone()
            .filter(|t| restarted_at.is_none_or(|r| t.0.as_second() >= r.as_second()))
    };
    let finished_this_run = this_run(&current.completion_time);
    if matches!(
        current.phase,
        Some(TaskPhase::Succeeded | TaskPhase::Failed)
    ) && !current
        .completion_time
        .as_ref()
        .is_some_and(|c| restart_pending(c, restarted_at))
    {
        return current.clone();
    }
    let replicas = latest_per_replica(meta, pods);
    let desired = spec.replicas().max(0);
    let count = |outcome: Outcome| {
        replicas
            .iter()
            .filter(|(_, p)| outcome_of(p) == outcome)
            .count() as i32
    };
    let running = count(Outcome::Running);
    let succeeded = count(Outcome::Succeeded);
    let failed = count(Outcome::Failed);
    let pending = count(Outcome::Pending);
    let superseded = pods.len() as i32 - replicas.len() as i32;
    let considered: Vec<&Pod> = replicas.iter().map(|(_, p)| *p).collect();
    let restarts: i32 = considered
        .iter()
        .filter_map(|p| p.status.as_ref()?.restart_count)
        .sum();

    let first_failed = replicas
        .iter()
        .find(|(_, p)| outcome_of(p) == Outcome::Failed);
    let (phase, message) = if spec.stopped {
        if running > 0 {
            (
                TaskPhase::Running,
                Some(format!(
                    "stopping: {running}/{desired} replicas still running"
                )),
            )
        } else {
            (TaskPhase::Stopped, Some("stopped on request".to_string()))
        }
    } else if let Some((index, pod)) = first_failed {
        (TaskPhase::Failed, Some(failure_message(index, pod)))
    } else if desired > 0 && succeeded >= desired && running == 0 && pending == 0 {
        (
            TaskPhase::Succeeded,
            Some(format!("all {desired} replicas succeeded")),
        )
    } else if running > 0 {
        (
            TaskPhase::Running,
            Some(format!("{running}/{desired} replicas running")),
        )
    } else {
        let waiting = replicas
            .iter()
            .filter_map(|(_, p)| p.status.as_ref()?.message.clone())
            .find(|m| !m.is_empty());
        // Keep what someone else said about a pending Task (e.g. why it waits); a message
        // of an earlier phase no longer applies.
        let kept = match current.phase {
            None | Some(TaskPhase::Pending) => current.message.clone(),
            Some(_) => None,
        };
        (TaskPhase::Pending, waiting.or(kept))
    };

    let finished = matches!(
        phase,
        TaskPhase::Succeeded | TaskPhase::Failed | TaskPhase::Stopped
    );
    let started = considered
        .iter()
        .filter_map(|p| p.status.as_ref()?.start_time.as_ref().map(|t| t.0))
        .min();
    let start_time = this_run(&current.start_time).or_else(|| {
        let ran = running > 0 || succeeded > 0 || failed > 0;
        ran.then(|| Time(started.unwrap_or(now)))
    });
    let completion_time = if finished {
        finished_this_run.or_else(|| {
            let last = considered
                .iter()
                .filter_map(|p| p.status.as_ref()?.finish_time.as_ref().map(|t| t.0))
                .max();
            Some(Time(last.unwrap_or(now)))
        })
    } else {
        None
    };
    // While Pending: the image pulls its replicas report (runtimes that pull), each
    // (image, state, detail) once.
    let mut pull_progress: Vec<PullProgress> = Vec::new();
    if phase == TaskPhase::Pending {
        for pull in considered
            .iter()
            .filter_map(|p| p.status.as_ref())
            .flat_map(|s| &s.pull_progress)
        {
            if !pull_progress.contains(pull) {
                pull_progress.push(pull.clone());
            }
        }
    }
    let conditions = with_device_health(&current.conditions, &replicas, now);
    let outside = outside_agent_namespaces(meta);
    let conditions = with_namespace_check(conditions, outside.as_deref(), now);
    // Said where `get` shows it too, unless something more specific is said already.
    let message = match (&outside, phase) {
        (Some(why), TaskPhase::Pending) if message.is_none() => Some(why.clone()),
        _ => message,
    };
    let observed_nodes: BTreeSet<String> = considered
        .iter()
        .filter_map(|p| p.status.as_ref()?.node.clone())
        .filter(|n| !n.is_empty())
        .collect();

    TaskStatus {
        phase: Some(phase),
        message,
        observed_nodes: observed_nodes.into_iter().collect(),
        start_time,
        completion_time,
        retry_count: Some(restarts + superseded.max(0)),
        replicas: Some(desired),
        ready_replicas: Some(running),
        succeeded_replicas: Some(succeeded),
        failed_replicas: Some(failed),
        pull_progress,
        conditions,
        ..current.clone()
    }
}

/// Condition type: the Task is in a namespace no agent serves (not `rlark-<cluster-id>`),
/// so no replica of it will ever run.
pub const CONDITION_NOT_IN_AGENT_NAMESPACE: &str = "NotInAgentNamespace";

/// Why a Task in `meta`'s namespace will never run, when that namespace is not an agent
/// namespace (`rlark-<cluster-id>`, [`rlark_api::names::agent_namespace`]).
pub fn outside_agent_namespaces(meta: &ObjectMeta) -> Option<String> {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    if namespace
        .strip_prefix("rlark-")
        .is_some_and(|c| !c.is_empty())
    {
        return None;
    }
    Some(format!(
        "namespace {namespace:?} is not an agent namespace: an agent runs the Tasks of \
         rlark-<cluster-id> only, so this one stays Pending. Create a Job instead (the \
         scheduler places its Tasks in the right agent namespace), or create the Task in \
         rlark-<cluster-id>"
    ))
}

/// `conditions` with [`CONDITION_NOT_IN_AGENT_NAMESPACE`] `True` saying `outside` while
/// the Task is outside the agent namespaces; nothing added otherwise (a Task never moves).
fn with_namespace_check(
    mut conditions: Vec<Condition>,
    outside: Option<&str>,
    now: Timestamp,
) -> Vec<Condition> {
    let Some(why) = outside else {
        return conditions;
    };
    if !conditions
        .iter()
        .any(|c| c.type_ == CONDITION_NOT_IN_AGENT_NAMESPACE)
    {
        conditions.push(Condition {
            type_: CONDITION_NOT_IN_AGENT_NAMESPACE.into(),
            status: "True".into(),
            reason: CONDITION_NOT_IN_AGENT_NAMESPACE.into(),
            message: why.to_string(),
            last_transition_time: Time(now),
            observed_generation: None,
        });
    }
    conditions
}

/// Condition type: a replica holds a robot or camera that is unhealthy now.
pub const CONDITION_DEVICE_UNHEALTHY: &str = "DeviceUnhealthy";

/// `conditions` with [`CONDITION_DEVICE_UNHEALTHY`] as the replicas' Pods say: `True`
/// naming each unhealthy device while one is, then `False` (reason `DevicesHealthy`) once
/// none is; absent while it never was. Other conditions are kept as they are.
fn with_device_health(
    conditions: &[Condition],
    replicas: &[(ReplicaKey, &Pod)],
    now: Timestamp,
) -> Vec<Condition> {
    let problems: Vec<String> = replicas
        .iter()
        .flat_map(|(index, pod)| {
            pod.status
                .iter()
                .flat_map(|s| &s.unhealthy_devices)
                .map(move |d| {
                    let why = d.message.as_deref().unwrap_or("unhealthy");
                    format!("{index}: {}: {why}", d.id)
                })
        })
        .collect();
    let mut out = conditions.to_vec();
    let existing = out
        .iter_mut()
        .find(|c| c.type_ == CONDITION_DEVICE_UNHEALTHY);
    let (status, reason, message) = if problems.is_empty() {
        (
            "False",
            "DevicesHealthy",
            "every device the replicas hold is healthy".to_string(),
        )
    } else {
        ("True", CONDITION_DEVICE_UNHEALTHY, problems.join("; "))
    };
    match existing {
        None if problems.is_empty() => {}
        None => out.push(Condition {
            type_: CONDITION_DEVICE_UNHEALTHY.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: Time(now),
            observed_generation: None,
        }),
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status.into();
            c.reason = reason.into();
            c.message = message;
        }
    }
    out
}

/// The `rlark.io/restarted-at` annotation of a Task, when it parses as RFC 3339.
fn restarted_at(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(labels::RESTARTED_AT))
        .and_then(|t| t.parse::<Timestamp>().ok())
}

/// Whether a run that completed at `completion` was asked to restart since (one-second
/// resolution: a restart in the same second as the completion counts, and the recomputed
/// status of the new run then keeps its own completion time, so this converges).
fn restart_pending(completion: &Time, restarted_at: Option<Timestamp>) -> bool {
    restarted_at.is_some_and(|r| completion.0.as_second() <= r.as_second())
}

/// What a replica's Pod says about the replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Pending,
    Running,
    Succeeded,
    /// Failed beyond its restart policy.
    Failed,
    /// Ended by `spec.stopped` (Pod `Failed` with reason [`REASON_STOPPED`]): not a
    /// failure of the Task; a resumed Task waits for its new Pods.
    Stopped,
}

fn outcome_of(pod: &Pod) -> Outcome {
    let status = pod.status.as_ref();
    match status.and_then(|s| s.phase) {
        None | Some(PodPhase::Pending) => Outcome::Pending,
        Some(PodPhase::Running) => Outcome::Running,
        Some(PodPhase::Succeeded) => Outcome::Succeeded,
        Some(PodPhase::Failed)
            if status.and_then(|s| s.reason.as_deref()) == Some(REASON_STOPPED) =>
        {
            Outcome::Stopped
        }
        Some(PodPhase::Failed) => Outcome::Failed,
    }
}

fn failure_message(index: &ReplicaKey, pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let mut message = format!("{index} ({})", pod.name_any());
    if let Some(node) = status.node.filter(|n| !n.is_empty()) {
        message.push_str(&format!(" on node {node}"));
    }
    message.push_str(" failed");
    if let Some(code) = status.exit_code {
        message.push_str(&format!(": exit code {code}"));
    }
    if let Some(reason) = status.reason.filter(|r| !r.is_empty()) {
        message.push_str(&format!(": {reason}"));
    }
    if let Some(detail) = status.message.filter(|m| !m.is_empty()) {
        message.push_str(&format!(": {detail}"));
    }
    message
}

/// Which replica a Pod is: its index, or (without one) the Pod itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ReplicaKey {
    Index(i32),
    Pod(String),
}

impl std::fmt::Display for ReplicaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplicaKey::Index(i) => write!(f, "replica {i}"),
            ReplicaKey::Pod(_) => write!(f, "replica"),
        }
    }
}

/// The newest relevant Pod of each replica, ordered by replica.
fn latest_per_replica<'a>(meta: &ObjectMeta, pods: &[&'a Pod]) -> Vec<(ReplicaKey, &'a Pod)> {
    let mut latest: BTreeMap<ReplicaKey, &'a Pod> = BTreeMap::new();
    for pod in pods.iter().copied().filter(|p| pod_is_current(meta, p)) {
        let key = match pod.spec.replica_index {
            Some(i) => ReplicaKey::Index(i),
            None => ReplicaKey::Pod(pod.name_any()),
        };
        match latest.get(&key) {
            Some(existing) if newer_or_same(existing, pod) => {}
            _ => {
                latest.insert(key, pod);
            }
        }
    }
    latest.into_iter().collect()
}

/// Whether `a` is at least as new as `b` (creation time, then name for determinism).
fn newer_or_same(a: &Pod, b: &Pod) -> bool {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    (created(a), a.name_any()) >= (created(b), b.name_any())
}

/// Whether a Pod belongs to this incarnation of the Task (not to one deleted and recreated
/// under the same name, nor from before a restart).
fn pod_is_current(meta: &ObjectMeta, pod: &Pod) -> bool {
    let owner_uids: Vec<&str> = pod
        .owner_references()
        .iter()
        .filter(|o| o.kind == "Task")
        .map(|o| o.uid.as_str())
        .collect();
    if let Some(uid) = meta.uid.as_deref() {
        if !owner_uids.is_empty() && !owner_uids.contains(&uid) {
            return false;
        }
        if pod
            .annotations()
            .get(TASK_UID_ANNOTATION)
            .is_some_and(|u| !u.is_empty() && u != uid)
        {
            return false;
        }
    }
    let pod_created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let restarted = restarted_at(meta);
    let not_before = [meta.creation_timestamp.as_ref().map(|t| t.0), restarted]
        .into_iter()
        .flatten()
        .max();
    match (pod_created, not_before) {
        // Timestamps have one-second resolution: a Pod of the same second is kept.
        (Some(created), Some(floor)) => created.as_second() >= floor.as_second(),
        _ => true,
    }
}

/// The merge patch (of `status`) turning `current` into `desired` on the owned fields, or
/// `None` when nothing changed. Cleared fields are `null`.
pub fn status_patch(current: &TaskStatus, desired: &TaskStatus) -> Result<Option<Value>, Error> {
    let to_map = |status: &TaskStatus| -> Result<Map<String, Value>, Error> {
        match serde_json::to_value(status) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Ok(Map::new()),
            Err(source) => Err(Error::Decode {
                what: "task status".into(),
                source,
            }),
        }
    };
    let (current, desired) = (to_map(current)?, to_map(desired)?);
    let mut patch = Map::new();
    for field in OWNED_FIELDS {
        let before = current.get(*field).unwrap_or(&Value::Null);
        let after = desired.get(*field).unwrap_or(&Value::Null);
        if before != after {
            patch.insert((*field).to_string(), after.clone());
        }
    }
    Ok((!patch.is_empty()).then_some(Value::Object(patch)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use rlark_api::types::{PodSpec, PodStatus};

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn task_meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("job-a".into()),
            namespace: Some("rlark-c1".into()),
            uid: Some("task-uid".into()),
            creation_timestamp: Some(Time(ts(0))),
            ..Default::default()
        }
    }

    fn spec(replicas: i32) -> TaskSpec {
        serde_json::from_value(json!({
            "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": ["x"], "replicas": replicas}
        }))
        .unwrap()
    }

    fn pod(name: &str, index: i32, phase: PodPhase) -> Pod {
        let mut pod = Pod::new(
            name,
            PodSpec {
                task_namespace: Some("rlark-c1".into()),
                task_name: Some("job-a".into()),
                replica_index: Some(index),
                ..Default::default()
            },
        );
        pod.metadata.namespace = Some("rlark-c1".into());
        pod.metadata.creation_timestamp = Some(Time(ts(1)));
        pod.status = Some(PodStatus {
            phase: Some(phase),
            node: Some(format!("node-{index}")),
            start_time: Some(Time(ts(5))),
            restart_count: Some(1),
            ..Default::default()
        });
        pod
    }

    fn run(spec: &TaskSpec, current: &TaskStatus, pods: &[Pod]) -> TaskStatus {
        let refs: Vec<&Pod> = pods.iter().collect();
        aggregate(&task_meta(), spec, current, &refs, ts(100))
    }

    #[test]
    fn no_pods_is_pending() {
        let status = run(&spec(2), &TaskStatus::default(), &[]);
        assert_eq!(status.phase, Some(TaskPhase::Pending));
        assert_eq!(status.replicas, Some(2));
        assert_eq!(status.ready_replicas, Some(0));
        assert_eq!(status.start_time, None);
        assert_eq!(status.retry_count, Some(0));
    }

    #[test]
    fn a_task_outside_the_agent_namespaces_says_it_will_never_run() {
        let mut meta = task_meta();
        meta.namespace = Some("default".into());
        let status = aggregate(&meta, &spec(1), &TaskStatus::default(), &[], ts(100));
        assert_eq!(status.phase, Some(TaskPhase::Pending));
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_NOT_IN_AGENT_NAMESPACE)
            .expect("the condition");
        assert_eq!(condition.status, "True");
        assert!(
            condition
                .message
                .contains("\"default\" is not an agent namespace")
                && condition.message.contains("rlark-<cluster-id>")
                && condition.message.contains("Create a Job instead"),
            "{}",
            condition.message
        );
        assert_eq!(status.message.as_deref(), Some(condition.message.as_str()));
        // Again: the condition is kept as it was (same transition time), not added twice.
        let again = aggregate(&meta, &spec(1), &status, &[], ts(200));
        assert_eq!(again.conditions, status.conditions);
        assert_eq!(status_patch(&status, &again).expect("patch"), None);
        // In an agent namespace: nothing of it.
        let inside = run(&spec(1), &TaskStatus::default(), &[]);
        assert!(inside.conditions.is_empty(), "{:?}", inside.conditions);
        assert_eq!(inside.message, None);
        let mut bare = task_meta();
        bare.namespace = Some("rlark-".into());
        assert!(outside_agent_namespaces(&bare).is_some());
    }

    #[test]
    fn a_pending_task_lists_its_replicas_pulls_once_each() {
        let pulling = |image: &str, status: &str| PullProgress {
            image: image.into(),
            status: status.into(),
            ..Default::default()
        };
        let mut pods = [
            pod("p0", 0, PodPhase::Pending),
            pod("p1", 1, PodPhase::Pending),
        ];
        for p in &mut pods {
            let status = p.status.as_mut().expect("status");
            status.pull_progress = vec![pulling("big:1", "Pulling"), pulling("side:1", "Done")];
        }
        let status = run(&spec(2), &TaskStatus::default(), &pods);
        assert_eq!(status.phase, Some(TaskPhase::Pending));
        assert_eq!(
            status.pull_progress,
            [pulling("big:1", "Pulling"), pulling("side:1", "Done")]
        );
        let patch = status_patch(&TaskStatus::default(), &status)
            .expect("patch")
            .expect("a change");
        assert_eq!(patch["pullProgress"][0]["image"], "big:1");

        pods[0].status.as_mut().expect("status").phase = Some(PodPhase::Running);
        let running = run(&spec(2), &status, &pods);
        assert_eq!(running.phase, Some(TaskPhase::Running));
        assert!(running.pull_progress.is_empty(), "only while Pending");
        let patch = status_patch(&status, &running)
            .expect("patch")
            .expect("a change");
        assert_eq!(patch["pullProgress"], Value::Null, "cleared: {patch}");
    }

    #[test]
    fn an_unhealthy_device_conditions_the_task_until_it_recovers() {
        let mut pods = [pod("p0", 0, PodPhase::Running)];
        pods[0].status.as_mut().expect("status").unhealthy_devices =
            vec![rlark_api::types::NodeDevice {
                id: "robot-arm-0".into(),
                resource: "rlinf.io/robot-sim-arm".into(),
                health: "Unhealthy".into(),
                message: Some("robot arm-0 is in ERROR: launch exited".into()),
            }];
        let status = run(&spec(1), &TaskStatus::default(), &pods);
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str()),
            ("DeviceUnhealthy", "True")
        );
        assert_eq!(
            c.message,
            "replica 0: robot-arm-0: robot arm-0 is in ERROR: launch exited"
        );
        assert_eq!(status.phase, Some(TaskPhase::Running), "kept running");

        pods[0]
            .status
            .as_mut()
            .expect("status")
            .unhealthy_devices
            .clear();
        let healed = run(&spec(1), &status, &pods);
        assert_eq!(healed.conditions.len(), 1);
        assert_eq!(healed.conditions[0].status, "False");
        assert_eq!(healed.conditions[0].reason, "DevicesHealthy");
        let patch = status_patch(&status, &healed)
            .expect("patch")
            .expect("a change");
        assert_eq!(patch["conditions"][0]["status"], "False");
        assert!(
            run(&spec(1), &TaskStatus::default(), &pods)
                .conditions
                .is_empty(),
            "no condition while no device ever failed"
        );
    }

    #[test]
    fn running_counts_and_nodes() {
        let pods = [
            pod("p0", 0, PodPhase::Running),
            pod("p1", 1, PodPhase::Pending),
        ];
        let status = run(&spec(2), &TaskStatus::default(), &pods);
        assert_eq!(status.phase, Some(TaskPhase::Running));
        assert_eq!(status.ready_replicas, Some(1));
        assert_eq!(status.observed_nodes, ["node-0", "node-1"]);
        assert_eq!(status.start_time, Some(Time(ts(5))));
        assert_eq!(status.retry_count, Some(2));
        assert_eq!(status.message.as_deref(), Some("1/2 replicas running"));
        assert_eq!(status.completion_time, None);
    }

    #[test]
    fn every_replica_succeeded_is_succeeded() {
        let mut pods = [
            pod("p0", 0, PodPhase::Succeeded),
            pod("p1", 1, PodPhase::Succeeded),
        ];
        pods[1].status.as_mut().unwrap().finish_time = Some(Time(ts(50)));
        let status = run(&spec(2), &TaskStatus::default(), &pods);
        assert_eq!(status.phase, Some(TaskPhase::Succeeded));
        assert_eq!(status.succeeded_replicas, Some(2));
        assert_eq!(status.completion_time, Some(Time(ts(50))));
        // One of two succeeded, the other still running: Running.
        let pods = [
            pod("p0", 0, PodPhase::Succeeded),
            pod("p1", 1, PodPhase::Running),
        ];
        assert_eq!(
            run(&spec(2), &TaskStatus::default(), &pods).phase,
            Some(TaskPhase::Running)
        );
    }

    #[test]
    fn any_failure_fails_with_its_message() {
        let mut pods = [
            pod("p0", 0, PodPhase::Running),
            pod("p1", 1, PodPhase::Failed),
        ];
        let st = pods[1].status.as_mut().unwrap();
        st.exit_code = Some(3);
        st.message = Some("out of memory".into());
        let status = run(&spec(2), &TaskStatus::default(), &pods);
        assert_eq!(status.phase, Some(TaskPhase::Failed));
        assert_eq!(
            status.message.as_deref(),
            Some("replica 1 (p1) on node node-1 failed: exit code 3: out of memory")
        );
        assert_eq!(status.failed_replicas, Some(1));
        assert_eq!(status.completion_time, Some(Time(ts(100))));
    }

    #[test]
    fn finished_tasks_are_left_alone_and_conditions_kept() {
        let current = TaskStatus {
            phase: Some(TaskPhase::Failed),
            message: Some("node lost".into()),
            ..Default::default()
        };
        let pods = [pod("p0", 0, PodPhase::Running)];
        assert_eq!(run(&spec(1), &current, &pods), current);
        assert_eq!(status_patch(&current, &current).unwrap(), None);
    }

    #[test]
    fn stopped_waits_for_running_replicas() {
        let mut s = spec(1);
        s.stopped = true;
        let status = run(
            &s,
            &TaskStatus::default(),
            &[pod("p0", 0, PodPhase::Running)],
        );
        assert_eq!(status.phase, Some(TaskPhase::Running));
        let status = run(
            &s,
            &TaskStatus::default(),
            &[pod("p0", 0, PodPhase::Failed)],
        );
        assert_eq!(status.phase, Some(TaskPhase::Stopped));
        assert!(status.completion_time.is_some());
        // Resumed: Pending again, completion time cleared.
        let resumed = run(&spec(1), &status, &[]);
        assert_eq!(resumed.phase, Some(TaskPhase::Pending));
        assert_eq!(resumed.completion_time, None);
        let patch = status_patch(&status, &resumed).unwrap().unwrap();
        assert_eq!(patch["completionTime"], Value::Null);
        assert_eq!(patch["phase"], "Pending");
    }

    #[test]
    fn newest_pod_per_replica_counts_and_stale_pods_are_ignored() {
        let mut old = pod("p0-old", 0, PodPhase::Failed);
        old.metadata.creation_timestamp = Some(Time(ts(1)));
        let mut new = pod("p0-new", 0, PodPhase::Running);
        new.metadata.creation_timestamp = Some(Time(ts(2)));
        let status = run(&spec(1), &TaskStatus::default(), &[old, new.clone()]);
        assert_eq!(status.phase, Some(TaskPhase::Running));
        // restartCount 1 of the newest pod + one superseded pod.
        assert_eq!(status.retry_count, Some(2));

        // Owned by another incarnation of the task.
        let mut foreign = pod("p0-foreign", 0, PodPhase::Failed);
        foreign.metadata.creation_timestamp = Some(Time(ts(3)));
        foreign.metadata.owner_references = Some(vec![OwnerReference {
            kind: "Task".into(),
            name: "job-a".into(),
            uid: "old-uid".into(),
            api_version: "rlinf.io/v1alpha1".into(),
            ..Default::default()
        }]);
        // Created before the task.
        let mut before = pod("p0-before", 0, PodPhase::Failed);
        before.metadata.creation_timestamp = Some(Time(ts(-10)));
        let status = run(&spec(1), &TaskStatus::default(), &[new, foreign, before]);
        assert_eq!(status.phase, Some(TaskPhase::Running));
    }

    #[test]
    fn replicas_ended_by_the_stop_do_not_fail_a_resumed_task() {
        let mut stopped_pod = pod("p0", 0, PodPhase::Failed);
        let st = stopped_pod.status.as_mut().unwrap();
        st.reason = Some(REASON_STOPPED.into());
        st.exit_code = Some(143);
        let current = TaskStatus {
            phase: Some(TaskPhase::Stopped),
            ..Default::default()
        };
        // Resumed, the agent has not replaced the stopped Pod yet: Pending, not Failed.
        let status = run(&spec(1), &current, &[stopped_pod]);
        assert_eq!(status.phase, Some(TaskPhase::Pending));
        assert_eq!(status.failed_replicas, Some(0));
    }

    #[test]
    fn a_restart_request_reopens_a_finished_task() {
        let finished = TaskStatus {
            phase: Some(TaskPhase::Failed),
            message: Some("replica 0 failed".into()),
            start_time: Some(Time(ts(5))),
            completion_time: Some(Time(ts(50))),
            ..Default::default()
        };
        let mut meta = task_meta();
        // Restart requested before the completion: still final.
        meta.annotations = Some(
            [(
                labels::RESTARTED_AT.to_string(),
                "2027-01-15T08:00:40Z".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            Timestamp::from_second(1_800_000_040).unwrap().to_string(),
            "2027-01-15T08:00:40Z"
        );
        let old = pod("p0", 0, PodPhase::Failed);
        let status = aggregate(&meta, &spec(1), &finished, &[&old], ts(100));
        assert_eq!(status, finished);
        // Restart requested after it: the old Pod is ignored, times of the old run cleared.
        meta.annotations = Some(
            [(
                labels::RESTARTED_AT.to_string(),
                "2027-01-15T08:01:30Z".to_string(),
            )]
            .into(),
        );
        let status = aggregate(&meta, &spec(1), &finished, &[&old], ts(100));
        assert_eq!(status.phase, Some(TaskPhase::Pending));
        assert_eq!(status.start_time, None);
        assert_eq!(status.completion_time, None);
        assert_eq!(status.message, None);
        // The new run's Pod counts.
        let mut new = pod("p0", 0, PodPhase::Running);
        new.metadata.creation_timestamp = Some(Time(ts(95)));
        new.status.as_mut().unwrap().start_time = Some(Time(ts(96)));
        let status = aggregate(&meta, &spec(1), &finished, &[&new], ts(100));
        assert_eq!(status.phase, Some(TaskPhase::Running));
        assert_eq!(status.start_time, Some(Time(ts(96))));
    }

    #[test]
    fn patch_only_has_changed_owned_fields() {
        let current = TaskStatus {
            phase: Some(TaskPhase::Pending),
            replicas: Some(1),
            ready_replicas: Some(0),
            succeeded_replicas: Some(0),
            failed_replicas: Some(0),
            retry_count: Some(0),
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: "NodeLost".into(),
                status: "True".into(),
                reason: "NodeLost".into(),
                message: String::new(),
                last_transition_time: Time(ts(0)),
                observed_generation: None,
            }],
            ..Default::default()
        };
        let desired = run(&spec(1), &current, &[]);
        assert_eq!(status_patch(&current, &desired).unwrap(), None);
        let desired = run(&spec(1), &current, &[pod("p0", 0, PodPhase::Running)]);
        let patch = status_patch(&current, &desired).unwrap().unwrap();
        assert_eq!(patch["phase"], "Running");
        assert!(patch.get("conditions").is_none());
        assert!(patch.get("replicas").is_none());
    }

    #[test]
    fn pods_map_to_their_task() {
        let p = pod("p0", 0, PodPhase::Running);
        let r = task_of_pod(&p).unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref()),
            ("job-a", Some("rlark-c1"))
        );
        let mut p = Pod::new("x", PodSpec::default());
        p.metadata.namespace = Some("rlark-c2".into());
        assert!(task_of_pod(&p).is_none());
        p.metadata.labels = Some([(labels::TASK_NAME.to_string(), "t".to_string())].into());
        let r = task_of_pod(&p).unwrap();
        assert_eq!(
            (r.name.as_str(), r.namespace.as_deref()),
            ("t", Some("rlark-c2"))
        );
    }
}
