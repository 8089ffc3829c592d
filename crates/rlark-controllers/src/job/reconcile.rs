//! The Job controller's IO: its watches and caches (`run`), and one pass over a Job
//! (`reconcile_job`): read, decide, then place, create, update or delete its Tasks and write
//! its status.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::labels;
use rlark_api::types::{Job, JobPhase, JobTaskTemplate, Node, Task, TaskSpec};
use serde_json::json;
// Expectation and assumption TTLs follow tokio's clock, which tests may pause and advance.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::error::Error;
use crate::events::{EventType, Recorder};
use crate::runner::{self, Reconciler};
use crate::scheduler::{self, ClusterUsage, TaskUsage, Unschedulable};

use super::build::{
    build_task, controlled_by, describe_placements, desired_spec, match_tasks, ray_annotations,
    spec_fingerprint, status_patch, waiting_for_capacity,
};
use super::decide::{
    Observation, PlacementOutcome, Restart, decide, names_of, next_status, written_phase,
};
use super::expectations::{Assumed, Expectations, Ledger, UsageIndex, revision_of};
use super::{CONTROLLER, RESYNC, SHORT_REQUEUE, condition};

pub(super) struct JobState {
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
    /// The Jobs as watched (the controller's own cache).
    jobs: Store<Job>,
    /// The Tasks as watched (ready with `usage_ready`).
    tasks: Store<Task>,
    /// Per Job: this controller's writes the caches must show before a pass reads them.
    expectations: StdMutex<HashMap<String, Expectations>>,
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
    let metrics = Arc::clone(&ctx.metrics);
    let state = Arc::new(JobState {
        ctx,
        usage,
        usage_ready,
        nodes: node_cache,
        nodes_ready,
        placement: tokio::sync::Mutex::new(Ledger::default()),
        namespaces: StdMutex::default(),
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
        .watches(nodes, watcher::Config::default(), node_mapper);
    let controller = runner::run(controller, state, metrics, shutdown);
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

impl Reconciler for JobState {
    type Object = Job;
    const CONTROLLER: &'static str = CONTROLLER;
    // The Job (or a Task it was writing) deleted while the pass ran: the recheck sees the
    // deletion and stops. Not worth a warning.
    const RECHECK_VANISHED: bool = true;

    fn span(job: &Job) -> tracing::Span {
        tracing::info_span!("reconcile", controller = CONTROLLER, name = %job.name_any())
    }

    async fn reconcile(self: Arc<Self>, job: Arc<Job>) -> Result<Action, Error> {
        reconcile_job(&job.name_any(), &self).await
    }

    runner::policy_log!(job);
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
    if written_phase(&old_status) != Some(decision.phase) {
        let type_ = if decision.phase == JobPhase::Failed {
            EventType::Warning
        } else {
            EventType::Normal
        };
        tracing::info!(
            from = written_phase(&old_status).map_or("", |p| p.as_str()),
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
pub(super) async fn place_missing(
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
