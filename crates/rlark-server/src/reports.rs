//! Task reports: what a running task posts back to the control plane (rewards, metrics,
//! progress), under `/rlark/v1/namespaces/{ns}/tasks/{name}/reports`.
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST .../reports` | the task's own token, the agent owning `ns`, admins | store one report |
//! | `GET .../reports[?follow=true]` | admins, viewers, the agent owning `ns`, the task | list (or follow) |
//!
//! **Storage**: one store object per report under resource [`TASK_REPORTS`] (not served by
//! the API registry), namespace = the task's, name = `<task>.<seq>` with `seq` zero-padded
//! to 16 digits (so key order is sequence order), shaped like the security records:
//! `{"metadata": {"name", "namespace"}, "spec": {"task", "taskUID", "seq", "time", "report"}}`
//! (`time` RFC 3339 with milliseconds; `report` the posted object; `taskUID` the run the
//! report was posted for; objects stored before the rename hold it as `event` and are
//! served as `report`, see [`served`]). Sequence numbers are per task and increase; two concurrent posts
//! never share one (the store's `AlreadyExists` makes the loser take the next number).
//!
//! **Body**: a JSON object of at most [`MAX_REPORT_BYTES`] with a string field `type` of
//! 1..=63 characters; anything else is a 400 naming the problem. The Task must exist (404).
//!
//! **Retention**: at most [`MAX_REPORTS_PER_TASK`] reports per task name; storing one deletes
//! the oldest beyond that. **Quotas** (issue 38; `api.limits`, checked before a report is
//! stored, 429 naming the quota): the reports of one Task at most `maxReportBytesPerTask`
//! bytes of JSON, of one namespace at most `maxReportBytesPerNamespace`, and an agent's
//! `rlark-<id>` namespace, reports included, at most `maxBytesPerAgentNamespace` for the
//! agent to post. Reports go with their Task: [`collect_deleted_task_reports`]
//! (run in the background of every server process) follows the Tasks in the store and,
//! when one is deleted, deletes the reports of that name whose `taskUID` is not the UID
//! of a Task that exists now (so a Task re-created under the same name keeps only its own
//! reports). It sweeps all reports the same way whenever it (re)starts, catching deletions
//! made while no server ran. A post racing with the deletion of its Task checks the Task
//! again after storing and removes its report when the Task is gone (404). Sequence
//! numbers only increase within one Task: a re-created Task numbers on after whatever is
//! left of the old one's reports (from 1 once they are deleted).
//!
//! **Follow**: `follow=true` answers `application/x-ndjson`: the stored reports, then new
//! ones as they are stored (a store watch from the list's revision, filtered by task),
//! until the client goes away or the server shuts down (or the watch falls too far behind:
//! the stream ends and the client follows again).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use http::{StatusCode, header};
use rlark_apiserver::audit::AuditEntry;
use rlark_apiserver::auth::{self, Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_apiserver::limits::{Limits, RateLimiter};
use rlark_store::{EventType, ListOptions, ObjectKey, Revision, Store, StoreError};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::security::Security;

/// Store resource of task reports. The name predates the rename of task "events" to
/// "reports" (the old name collided with Kubernetes Events); it is kept so that the reports
/// a server stored before the rename are still served after an upgrade.
pub(crate) const TASK_REPORTS: &str = "taskevents.rlark.io";
/// Store resource of Tasks.
const TASKS: &str = "tasks.rlinf.io";
/// Largest report body.
pub(crate) const MAX_REPORT_BYTES: usize = 16 * 1024;
/// Reports kept per task.
pub(crate) const MAX_REPORTS_PER_TASK: u64 = 1000;
/// Longest `type`.
const MAX_TYPE_CHARS: usize = 63;
/// Digits of the sequence number in the object name.
const SEQ_DIGITS: usize = 16;
/// Items per store page when listing a task's reports.
const PAGE: usize = 500;
/// Sequence hints kept in memory before the map is cleared.
const MAX_HINTS: usize = 4096;
/// `AlreadyExists` retries before relisting for the current sequence.
const RETRIES_BEFORE_RELIST: u32 = 16;
/// Attempts of one post in all.
const MAX_ATTEMPTS: u32 = 64;

/// State of the report routes.
#[derive(Clone)]
pub(crate) struct ReportsState {
    store: Arc<dyn Store>,
    security: Arc<Security>,
    shutdown: CancellationToken,
    /// The API server's per-identity write rate limits: a post takes a write from the same
    /// bucket as the poster's Kubernetes API writes.
    rate_limiter: Arc<RateLimiter>,
    /// Next sequence number per (namespace, task), as last seen by this process: a hint
    /// only (another replica of a shared store may have moved on; `AlreadyExists` corrects it).
    next_seq: Arc<Hints>,
}

impl ReportsState {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        security: Arc<Security>,
        shutdown: CancellationToken,
        rate_limiter: Arc<RateLimiter>,
    ) -> Self {
        Self {
            store,
            security,
            shutdown,
            rate_limiter,
            next_seq: Arc::default(),
        }
    }
}

/// The routes; merged into the process router.
pub(crate) fn router(state: ReportsState) -> Router {
    Router::new()
        .route(
            "/rlark/v1/namespaces/{namespace}/tasks/{name}/reports",
            get(list_reports).post(post_report),
        )
        .with_state(state)
}

/// Validate a posted body: a JSON object of at most [`MAX_REPORT_BYTES`] with a string `type`
/// of 1..=63 characters. The error names the problem.
pub(crate) fn validate_report(bytes: &[u8]) -> Result<Map<String, Value>, String> {
    if bytes.len() > MAX_REPORT_BYTES {
        return Err(format!(
            "the report is larger than {MAX_REPORT_BYTES} bytes ({} bytes)",
            bytes.len()
        ));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("the request body is empty; expected a JSON object".to_string());
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the report is not valid JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err(format!(
            "the report must be a JSON object, not {}",
            kind_of(&value)
        ));
    };
    match object.get("type") {
        None => {
            Err("the report has no \"type\" field (a string of 1 to 63 characters)".to_string())
        }
        Some(Value::String(t)) if t.is_empty() => Err("\"type\" is empty".to_string()),
        Some(Value::String(t)) if t.chars().count() > MAX_TYPE_CHARS => Err(format!(
            "\"type\" is longer than {MAX_TYPE_CHARS} characters"
        )),
        Some(Value::String(_)) => Ok(object),
        Some(other) => Err(format!("\"type\" must be a string, not {}", kind_of(other))),
    }
}

/// 413 for a task report over [`MAX_REPORT_BYTES`] (`size` when known).
fn too_large(size: Option<usize>) -> ApiError {
    let got = size.map_or_else(String::new, |size| format!(" (got {size} bytes)"));
    ApiError::new(
        413,
        "RequestEntityTooLarge",
        format!("the task report is too large: the limit is {MAX_REPORT_BYTES} bytes{got}"),
    )
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Object name of report `seq` of `task`.
fn report_name(task: &str, seq: u64) -> String {
    format!("{task}.{seq:0width$}", width = SEQ_DIGITS)
}

/// The sequence number of `name` when it names an report of `task`.
fn seq_of(task: &str, name: &str) -> Option<u64> {
    let digits = name.strip_prefix(task)?.strip_prefix('.')?;
    if digits.len() != SEQ_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn store_error(error: &StoreError) -> ApiError {
    match error {
        StoreError::Closed => ApiError::service_unavailable("the server is shutting down"),
        StoreError::Unavailable(message) => {
            ApiError::service_unavailable(format!("the store is unavailable: {message}"))
        }
        other => ApiError::internal(format!("store: {other}")),
    }
}

/// Who may do what: `None` when allowed, else the answer (401, or an audited 403).
fn denied(
    security: &Security,
    request: &Request,
    namespace: &str,
    name: &str,
    verb: &str,
) -> Option<Response> {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return Some(ApiError::unauthorized().into_response());
    };
    let allowed = match identity.role() {
        Role::Admin => true,
        Role::Viewer => verb != "create",
        Role::Agent { cluster_id } => auth::agent_namespace(&cluster_id) == namespace,
        Role::Task {
            namespace: ns,
            name: task,
        } => ns == namespace && task == name,
        _ => false,
    };
    if allowed {
        return None;
    }
    let who = if verb == "create" {
        "the task itself, the agent owning the namespace and admins"
    } else {
        "admins, viewers, the agent owning the namespace and the task itself"
    };
    let message = format!(
        "tasks/reports is forbidden: User \"{}\" cannot {verb} reports of task {namespace}/{name}: \
         only {who} may",
        identity.user
    );
    let mut entry = AuditEntry::now("denied", "denied").by(Some(&identity));
    entry.verb = verb.to_string();
    entry.resource = "tasks/reports".to_string();
    entry.namespace = namespace.to_string();
    entry.reason = message.clone();
    security.audit().record(entry);
    Some(ApiError::forbidden(message).into_response())
}

/// The stored reports of `task` in sequence order, and the store revision of the first
/// page (a watch from it misses nothing the list did not show).
async fn list_task_reports(
    store: &dyn Store,
    namespace: &str,
    task: &str,
) -> Result<(Vec<Arc<Value>>, Revision), StoreError> {
    let prefix = format!("{task}.");
    let mut options = ListOptions {
        namespace: Some(namespace.to_string()),
        start_after: Some((namespace.to_string(), prefix.clone())),
        limit: Some(PAGE),
    };
    let mut items = Vec::new();
    let mut revision = None;
    loop {
        let page = store.list(TASK_REPORTS, &options).await?;
        revision.get_or_insert(page.revision);
        let mut past_range = false;
        for item in page.items {
            let name = item
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            // Names of other tasks may sort in between ("<task>.x.<seq>"); anything past
            // "<task>.9999..." is past this task's reports.
            match name.strip_prefix(&prefix) {
                Some(rest) if rest.as_bytes().first().is_some_and(|b| *b <= b'9') => {
                    if seq_of(task, name).is_some() {
                        items.push(item);
                    }
                }
                _ => {
                    past_range = true;
                    break;
                }
            }
        }
        match page.continue_after {
            Some(last) if !past_range => options.start_after = Some((last.namespace, last.name)),
            _ => break,
        }
    }
    Ok((items, revision.unwrap_or_else(|| store.revision())))
}

fn seq_of_object(task: &str, object: &Value) -> Option<u64> {
    seq_of(task, object.pointer("/metadata/name")?.as_str()?)
}

async fn delete_quietly(store: &dyn Store, namespace: &str, name: String) {
    match store
        .delete(&ObjectKey::new(TASK_REPORTS, namespace, name.clone()), None)
        .await
    {
        Ok(_) | Err(StoreError::NotFound(_)) => {}
        Err(error) => tracing::warn!(%error, namespace, name, "pruning a task report failed"),
    }
}

/// Next sequence number per (namespace, task), and the Task UID it was learnt for.
type Hints = Mutex<HashMap<(String, String), (u64, String)>>;

/// Store `report` as the next report of `namespace/task`, keeping at most `retention`.
async fn append(
    store: &dyn Store,
    hints: &Hints,
    retention: u64,
    namespace: &str,
    task: &str,
    task_uid: &str,
    report: Map<String, Value>,
) -> Result<Arc<Value>, ApiError> {
    let hint_key = (namespace.to_string(), task.to_string());
    // A hint learnt for another Task of the same name (deleted since) is not used: its
    // reports are about to go, so the numbering is taken from what the store holds.
    let hint = hints
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&hint_key)
        .filter(|(_, uid)| uid == task_uid)
        .map(|(seq, _)| *seq);
    let mut seq = match hint {
        Some(seq) => seq,
        None => relist(store, retention, namespace, task).await?,
    };
    let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let report = Value::Object(report);
    let mut taken_in_a_row = 0;
    for _ in 0..MAX_ATTEMPTS {
        let name = report_name(task, seq);
        let object = json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "task": task,
                "taskUID": task_uid,
                "seq": seq,
                "time": time,
                "report": report,
            },
        });
        match store
            .create(&ObjectKey::new(TASK_REPORTS, namespace, name), object)
            .await
        {
            Ok(stored) => {
                {
                    let mut hints = hints.lock().unwrap_or_else(|e| e.into_inner());
                    if hints.len() >= MAX_HINTS && !hints.contains_key(&hint_key) {
                        hints.clear();
                    }
                    let next = hints
                        .entry(hint_key)
                        .or_insert_with(|| (0, task_uid.to_string()));
                    if next.1 != task_uid {
                        *next = (0, task_uid.to_string());
                    }
                    next.0 = next.0.max(seq + 1);
                }
                if seq > retention {
                    delete_quietly(store, namespace, report_name(task, seq - retention)).await;
                }
                return Ok(stored);
            }
            Err(StoreError::AlreadyExists(_)) => {
                taken_in_a_row += 1;
                seq = if taken_in_a_row >= RETRIES_BEFORE_RELIST {
                    taken_in_a_row = 0;
                    relist(store, retention, namespace, task)
                        .await?
                        .max(seq + 1)
                } else {
                    seq + 1
                };
            }
            Err(error) => return Err(store_error(&error)),
        }
    }
    Err(ApiError::new(
        409,
        "Conflict",
        format!("too many concurrent reports for task {namespace}/{task}; retry"),
    ))
}

/// The next sequence number from the stored reports; also deletes the oldest beyond the
/// retention (catching up after a restart or another replica's writes).
async fn relist(
    store: &dyn Store,
    retention: u64,
    namespace: &str,
    task: &str,
) -> Result<u64, ApiError> {
    let (items, _) = list_task_reports(store, namespace, task)
        .await
        .map_err(|e| store_error(&e))?;
    let next = items
        .last()
        .and_then(|o| seq_of_object(task, o))
        .map_or(1, |s| s + 1);
    // One more is about to be stored.
    let keep = usize::try_from(retention.saturating_sub(1)).unwrap_or(usize::MAX);
    if items.len() > keep {
        for old in &items[..items.len() - keep] {
            if let Some(seq) = seq_of_object(task, old) {
                delete_quietly(store, namespace, report_name(task, seq)).await;
            }
        }
    }
    Ok(next)
}

/// What a stored report adds to its body: its name, the Task's name and UID, the sequence
/// number and the time (an estimate: the quotas need no precision to the byte).
const REPORT_OVERHEAD: u64 = 256;

/// The byte quotas of a report of `body_bytes` about to be stored for `namespace/task` (see
/// the module docs): 429 naming the quota that is full.
async fn check_quotas(
    store: &dyn Store,
    limits: &Limits,
    identity: Option<&Identity>,
    namespace: &str,
    task: &str,
    body_bytes: usize,
) -> Result<(), ApiError> {
    let growth = body_bytes as u64 + REPORT_OVERHEAD;
    let full = |message: String| {
        tracing::warn!(namespace, task, user = identity.map_or("", |i| i.user.as_str()), %message, "task report refused");
        rlark_apiserver::limits::too_many_requests(message, QUOTA_RETRY_SECONDS)
    };
    let in_namespace = store
        .usage(namespace, Some(TASK_REPORTS))
        .await
        .map_err(|e| store_error(&e))?
        .bytes;
    let quota = limits.max_report_bytes_per_namespace;
    if in_namespace.saturating_add(growth) > quota {
        return Err(full(format!(
            "exceeded quota: the task reports of namespace {namespace} hold {in_namespace} bytes; \
             {growth} more would pass the limit (api.limits.maxReportBytesPerNamespace) of {quota} bytes"
        )));
    }
    // A Task holds at most what its namespace holds: only count when that could be over.
    let quota = limits.max_report_bytes_per_task;
    if in_namespace.saturating_add(growth) > quota {
        let (reports, _) = list_task_reports(store, namespace, task)
            .await
            .map_err(|e| store_error(&e))?;
        let held: u64 = reports
            .iter()
            .map(|r| rlark_apiserver::limits::json_len(r) as u64)
            .sum();
        if held.saturating_add(growth) > quota {
            return Err(full(format!(
                "exceeded quota: the reports of task {namespace}/{task} hold {held} bytes; \
                 {growth} more would pass the limit (api.limits.maxReportBytesPerTask) of {quota} bytes"
            )));
        }
    }
    if let Some(Role::Agent { cluster_id }) = identity.map(Identity::role)
        && auth::agent_namespace(&cluster_id) == namespace
    {
        let held = store
            .usage(namespace, None)
            .await
            .map_err(|e| store_error(&e))?
            .bytes;
        let quota = limits.max_bytes_per_agent_namespace;
        if held.saturating_add(growth) > quota {
            return Err(full(format!(
                "exceeded quota: namespace {namespace} holds {held} bytes of objects; {growth} more \
                 would pass the limit for an agent's namespace (api.limits.maxBytesPerAgentNamespace) \
                 of {quota} bytes"
            )));
        }
    }
    Ok(())
}

/// `Retry-After` of a full report quota: room comes back when Tasks (and their reports)
/// are deleted, which no client can predict.
const QUOTA_RETRY_SECONDS: u64 = 60;

async fn post_report(
    State(state): State<ReportsState>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    if let Some(e) = denied(&state.security, &request, &namespace, &name, "create") {
        return e;
    }
    let identity = request.extensions().get::<Identity>().cloned();
    if let Some(identity) = &identity
        && let Err(e) = state.rate_limiter.check(identity)
    {
        return e.into_response();
    }
    let bytes = match axum::body::to_bytes(request.into_body(), MAX_REPORT_BYTES).await {
        Ok(bytes) => bytes,
        Err(_) => return too_large(None).into_response(),
    };
    if bytes.len() > MAX_REPORT_BYTES {
        return too_large(Some(bytes.len())).into_response();
    }
    let report = match validate_report(&bytes) {
        Ok(report) => report,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let task = match state
        .store
        .get(&ObjectKey::new(TASKS, &namespace, &name))
        .await
    {
        Ok(Some(task)) => task,
        Ok(None) => {
            return ApiError::new(
                404,
                "NotFound",
                format!("tasks.rlinf.io \"{name}\" not found in {namespace}"),
            )
            .into_response();
        }
        Err(error) => return store_error(&error).into_response(),
    };
    let uid = task
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let quotas = check_quotas(
        state.store.as_ref(),
        state.rate_limiter.limits(),
        identity.as_ref(),
        &namespace,
        &name,
        bytes.len(),
    );
    if let Err(e) = quotas.await {
        return e.into_response();
    }
    let appended = append(
        state.store.as_ref(),
        &state.next_seq,
        MAX_REPORTS_PER_TASK,
        &namespace,
        &name,
        &uid,
        report,
    );
    let stored = match appended.await {
        Ok(stored) => stored,
        Err(e) => return e.into_response(),
    };
    // The Task may have been deleted (and its reports collected) between the check above
    // and the store: check again, so that no report outlives its Task.
    let current = state
        .store
        .get(&ObjectKey::new(TASKS, &namespace, &name))
        .await;
    let still_there = match &current {
        Ok(Some(task)) => task.pointer("/metadata/uid").and_then(Value::as_str) == Some(&uid),
        Ok(None) => false,
        // Unknown (a store error): keep it; a later sweep deletes it if its Task is gone.
        Err(_) => true,
    };
    if !still_there {
        if let Some(report_name) = stored.pointer("/metadata/name").and_then(Value::as_str) {
            delete_quietly(state.store.as_ref(), &namespace, report_name.to_string()).await;
        }
        return ApiError::new(
            404,
            "NotFound",
            format!(
                "tasks.rlinf.io \"{name}\" was deleted in {namespace} while the report was stored"
            ),
        )
        .into_response();
    }
    if let Some(report) = stored.pointer("/spec/report") {
        crate::reward::record(state.store.as_ref(), &namespace, &name, &uid, report).await;
    }
    (StatusCode::CREATED, axum::Json(stored.as_ref().clone())).into_response()
}

/// Pause before the collector starts again after its watch failed.
const COLLECT_RESTART_DELAY: Duration = Duration::from_secs(1);

/// Deletes the reports of deleted Tasks until `shutdown` (see the module documentation,
/// "Retention"): a sweep of every stored report, then a watch of the Tasks from the
/// revision read before the sweep, purging the reports of each deleted Task's name; a
/// failed watch (expired, store closed) starts over with a sweep. Store errors are logged
/// and retried, never fatal.
pub(crate) async fn collect_deleted_task_reports(
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
) {
    loop {
        let from = store.revision();
        if let Err(error) = sweep_orphaned_reports(store.as_ref()).await {
            tracing::warn!(%error, "sweeping the reports of deleted tasks failed");
        }
        match store.watch(TASKS, None, from).await {
            Ok(mut tasks) => loop {
                let change = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    change = tasks.next() => change,
                };
                match change {
                    Some(Ok(change)) if change.event_type == EventType::Deleted => {
                        let (namespace, name) = (&change.key.namespace, &change.key.name);
                        if let Err(error) =
                            purge_task_reports(store.as_ref(), namespace, name).await
                        {
                            tracing::warn!(%error, namespace, task = name, "deleting the reports of a deleted task failed");
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => {
                        tracing::info!(%error, "the task watch of the report collector ended; sweeping again");
                        break;
                    }
                    None => break,
                }
            },
            Err(error) => tracing::warn!(%error, "the report collector cannot watch tasks"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(COLLECT_RESTART_DELAY) => {}
        }
    }
}

/// The UID of Task `namespace/name` as stored now; `None` when there is no such Task.
async fn current_task_uid(
    store: &dyn Store,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, StoreError> {
    let task = store.get(&ObjectKey::new(TASKS, namespace, name)).await?;
    Ok(task.map(|t| {
        t.pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    }))
}

fn report_task_uid(report: &Value) -> &str {
    report
        .pointer("/spec/taskUID")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Deletes the reports of task name `name` that belong to no existing Task (all of them
/// when no Task of that name exists; those of other UIDs when one does). Returns how many.
async fn purge_task_reports(
    store: &dyn Store,
    namespace: &str,
    name: &str,
) -> Result<usize, StoreError> {
    // Listed before the Task is read: an report listed here was posted for a Task that
    // existed before the read, so a different UID (or none) now means that Task is gone.
    let (items, _) = list_task_reports(store, namespace, name).await?;
    let current = current_task_uid(store, namespace, name).await?;
    let mut deleted = 0;
    for item in items {
        if current.as_deref() == Some(report_task_uid(&item)) {
            continue;
        }
        if let Some(report_name) = item.pointer("/metadata/name").and_then(Value::as_str) {
            delete_quietly(store, namespace, report_name.to_string()).await;
            deleted += 1;
        }
    }
    if deleted > 0 {
        tracing::debug!(
            namespace,
            task = name,
            deleted,
            "deleted the reports of a deleted task"
        );
    }
    Ok(deleted)
}

/// Deletes every stored report whose Task (name and UID) does not exist. Returns how many.
async fn sweep_orphaned_reports(store: &dyn Store) -> Result<usize, StoreError> {
    let mut options = ListOptions {
        namespace: None,
        start_after: None,
        limit: Some(PAGE),
    };
    // Task UIDs read during this sweep, by (namespace, name).
    let mut tasks: HashMap<(String, String), Option<String>> = HashMap::new();
    let mut deleted = 0;
    loop {
        let page = store.list(TASK_REPORTS, &options).await?;
        let mut read_this_page = HashSet::new();
        for item in &page.items {
            let field = |pointer: &str| item.pointer(pointer).and_then(Value::as_str);
            let (Some(namespace), Some(name), Some(task)) = (
                field("/metadata/namespace"),
                field("/metadata/name"),
                field("/spec/task"),
            ) else {
                continue;
            };
            let key = (namespace.to_string(), task.to_string());
            let report_uid = report_task_uid(item);
            let cached = tasks.get(&key).cloned();
            let uid = match cached {
                Some(uid)
                    if uid.as_deref() == Some(report_uid) || read_this_page.contains(&key) =>
                {
                    uid
                }
                // Not known to match: read the Task now (after this page was listed, so a
                // mismatch means the report's Task is gone, as in purge_task_reports).
                _ => {
                    let uid = current_task_uid(store, namespace, task).await?;
                    tasks.insert(key.clone(), uid.clone());
                    read_this_page.insert(key);
                    uid
                }
            };
            if uid.as_deref() != Some(report_uid) {
                delete_quietly(store, namespace, name.to_string()).await;
                deleted += 1;
            }
        }
        match page.continue_after {
            Some(last) => options.start_after = Some((last.namespace, last.name)),
            None => break,
        }
    }
    if deleted > 0 {
        tracing::info!(deleted, "deleted the reports of tasks that no longer exist");
    }
    Ok(deleted)
}

/// A stored report as the API serves it. Reports stored before task "events" were renamed
/// to "reports" hold the posted object under `spec.event`; it is served as `spec.report`.
fn served(stored: &Value) -> Value {
    let mut object = stored.clone();
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut)
        && !spec.contains_key("report")
        && let Some(legacy) = spec.remove("event")
    {
        spec.insert("report".to_string(), legacy);
    }
    object
}

fn follow_requested(query: Option<&str>) -> Result<bool, String> {
    let mut follow = false;
    for pair in query.unwrap_or_default().split('&') {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "follow" {
            follow = match value {
                "" | "true" | "1" => true,
                "false" | "0" => false,
                other => return Err(format!("follow={other}: expected true or false")),
            };
        }
    }
    Ok(follow)
}

async fn list_reports(
    State(state): State<ReportsState>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    if let Some(e) = denied(&state.security, &request, &namespace, &name, "list") {
        return e;
    }
    let follow = match follow_requested(request.uri().query()) {
        Ok(follow) => follow,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let (items, revision) = match list_task_reports(state.store.as_ref(), &namespace, &name).await {
        Ok(listed) => listed,
        Err(error) => return store_error(&error).into_response(),
    };
    if !follow {
        let items: Vec<Value> = items.iter().map(|i| served(i)).collect();
        return axum::Json(json!({ "items": items })).into_response();
    }
    let watch = match state
        .store
        .watch(TASK_REPORTS, Some(&namespace), revision)
        .await
    {
        Ok(watch) => watch,
        Err(error) => return store_error(&error).into_response(),
    };
    // Pages after the first may already show reports the watch delivers again.
    let listed: HashSet<String> = items
        .iter()
        .filter_map(|i| i.pointer("/metadata/name")?.as_str().map(str::to_string))
        .collect();
    let task = name.clone();
    let live = watch
        .take_while(|change| {
            if let Err(error) = change {
                tracing::debug!(%error, "task report watch ended");
            }
            std::future::ready(change.is_ok())
        })
        .filter_map(move |change| {
            let keep = change.ok().filter(|e| {
                e.event_type == EventType::Added
                    && seq_of(&task, &e.key.name).is_some()
                    && !listed.contains(&e.key.name)
            });
            std::future::ready(keep.map(|e| e.object))
        });
    let lines = futures::stream::iter(items)
        .chain(live)
        .map(|object| {
            let mut line = serde_json::to_vec(&served(&object)).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(line)
        })
        .take_until(state.shutdown.clone().cancelled_owned());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_stored_before_the_rename_are_served_as_reports() {
        let legacy = json!({"metadata": {"name": "t.0000000000000001"},
            "spec": {"task": "t", "seq": 1, "event": {"type": "reward", "value": 2}}});
        let served = served(&legacy);
        assert_eq!(
            served["spec"]["report"],
            json!({"type": "reward", "value": 2})
        );
        assert!(served["spec"].get("event").is_none(), "{served}");
        // A current record is served as stored.
        let current = json!({"spec": {"task": "t", "report": {"type": "x"}, "event": 1}});
        assert_eq!(super::served(&current), current);
    }

    #[test]
    fn reports_are_validated() {
        assert!(validate_report(br#"{"type":"reward","value":1.5}"#).is_ok());
        let long = format!(r#"{{"type":"{}"}}"#, "x".repeat(63));
        assert!(validate_report(long.as_bytes()).is_ok());
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"  ", "empty"),
            (b"{", "not valid JSON"),
            (b"[1]", "not an array"),
            (b"\"x\"", "not a string"),
            (br#"{"value":1}"#, "no \"type\""),
            (br#"{"type":""}"#, "empty"),
            (br#"{"type":3}"#, "must be a string, not a number"),
        ];
        for (body, expected) in cases {
            let error = validate_report(body).unwrap_err();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
        let too_long = format!(r#"{{"type":"{}"}}"#, "x".repeat(64));
        assert!(
            validate_report(too_long.as_bytes())
                .unwrap_err()
                .contains("longer than 63")
        );
        let big = format!(r#"{{"type":"t","pad":"{}"}}"#, "x".repeat(MAX_REPORT_BYTES));
        assert!(
            validate_report(big.as_bytes())
                .unwrap_err()
                .contains("larger than")
        );
    }

    #[test]
    fn names_carry_the_sequence() {
        assert_eq!(report_name("t", 7), "t.0000000000000007");
        assert_eq!(seq_of("t", "t.0000000000000007"), Some(7));
        assert_eq!(seq_of("t", "t.x.0000000000000007"), None);
        assert_eq!(seq_of("t.x", "t.x.0000000000000007"), Some(7));
        assert_eq!(seq_of("t", "t.000000000000007"), None);
        assert_eq!(seq_of("t", "u.0000000000000007"), None);
    }

    #[test]
    fn follow_is_parsed() {
        assert!(!follow_requested(None).unwrap());
        assert!(follow_requested(Some("follow=true")).unwrap());
        assert!(follow_requested(Some("x=1&follow")).unwrap());
        assert!(!follow_requested(Some("follow=false")).unwrap());
        assert!(follow_requested(Some("follow=maybe")).is_err());
    }

    async fn test_store(dir: &std::path::Path) -> Arc<dyn Store> {
        let config = rlark_store::SqliteStoreConfig::new(dir.join("db"));
        Arc::new(rlark_store::SqliteStore::open(config).await.unwrap())
    }

    fn report(t: &str) -> Map<String, Value> {
        let mut report = Map::new();
        report.insert("type".into(), json!(t));
        report
    }

    #[tokio::test]
    async fn concurrent_posts_get_distinct_sequences() {
        let dir = tempfile::tempdir().unwrap();
        let store = test_store(dir.path()).await;
        // Two "replicas" (separate sequence hints) post at once.
        let replicas: [Arc<Hints>; 2] = [Arc::default(), Arc::default()];
        let mut posts = Vec::new();
        for i in 0..40 {
            let store = Arc::clone(&store);
            let hints = Arc::clone(&replicas[i % 2]);
            posts.push(tokio::spawn(async move {
                let appended = append(store.as_ref(), &hints, 1000, "ns", "t", "u", report("m"));
                appended.await
            }));
        }
        let mut seqs = HashSet::new();
        for post in posts {
            let stored = post.await.unwrap().unwrap();
            let seq = stored.pointer("/spec/seq").and_then(Value::as_u64).unwrap();
            assert!(seqs.insert(seq), "sequence {seq} handed out twice");
        }
        assert_eq!(seqs, (1..=40).collect());
        // Another task whose name extends this one's does not mix in.
        append(
            store.as_ref(),
            &Hints::default(),
            1000,
            "ns",
            "t.x",
            "u",
            report("m"),
        )
        .await
        .unwrap();
        let (items, _) = list_task_reports(store.as_ref(), "ns", "t").await.unwrap();
        let listed: Vec<u64> = items.iter().filter_map(|i| seq_of_object("t", i)).collect();
        assert_eq!(listed, (1..=40).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn the_oldest_reports_beyond_the_retention_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = test_store(dir.path()).await;
        let hints = Hints::default();
        for _ in 0..8 {
            append(store.as_ref(), &hints, 5, "ns", "t", "u", report("m"))
                .await
                .unwrap();
        }
        // A fresh process (no hint) relists and catches up, too.
        for _ in 0..2 {
            append(
                store.as_ref(),
                &Hints::default(),
                3,
                "ns",
                "t",
                "u",
                report("m"),
            )
            .await
            .unwrap();
        }
        let (items, _) = list_task_reports(store.as_ref(), "ns", "t").await.unwrap();
        let listed: Vec<u64> = items.iter().filter_map(|i| seq_of_object("t", i)).collect();
        assert_eq!(listed, vec![8, 9, 10]);
    }

    /// Issue 38, finding 2: "reports are capped per task, not per namespace". Reports are
    /// refused (429 naming the quota) once their Task's or their namespace's reports hold
    /// their quota of bytes, and an agent's once its namespace holds its quota.
    #[tokio::test]
    async fn report_quotas_per_task_per_namespace_and_per_agent_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let store = test_store(dir.path()).await;
        let limits = Limits {
            max_report_bytes_per_task: 100_000,
            max_report_bytes_per_namespace: 250_000,
            max_bytes_per_agent_namespace: 400_000,
            ..Limits::default()
        };
        let big = |t: &str| {
            let mut report = report(t);
            report.insert("pad".into(), json!("r".repeat(15_000)));
            report
        };
        let check = |ns: &'static str, task: &'static str, identity: Option<Identity>| {
            let store = Arc::clone(&store);
            let limits = limits.clone();
            async move {
                check_quotas(store.as_ref(), &limits, identity.as_ref(), ns, task, 15_030).await
            }
        };
        let hints = Hints::default();
        // Task t: six 15 kB reports fit in 100 kB, the seventh does not.
        for _ in 0..6 {
            check("ns", "t", None)
                .await
                .expect("within the task's quota");
            append(store.as_ref(), &hints, 1000, "ns", "t", "u", big("m"))
                .await
                .unwrap();
        }
        let error = check("ns", "t", None).await.expect_err("task quota");
        assert_eq!(error.code, 429);
        assert!(
            error.message.contains("maxReportBytesPerTask"),
            "{}",
            error.message
        );
        // Other Tasks of the namespace fill it up to its own quota.
        for task in ["u", "v", "w", "y"] {
            for _ in 0..3 {
                if check("ns", task, None).await.is_err() {
                    break;
                }
                append(store.as_ref(), &hints, 1000, "ns", task, "u", big("m"))
                    .await
                    .unwrap();
            }
        }
        let error = check("ns", "x", None).await.expect_err("namespace quota");
        assert_eq!(error.code, 429);
        assert!(
            error.message.contains("maxReportBytesPerNamespace"),
            "{}",
            error.message
        );
        // Another namespace is not affected.
        check("other", "t", None).await.expect("another namespace");
        // An agent's namespace counts every object there, not only reports.
        store
            .create(
                &ObjectKey::new("leases.coordination.k8s.io", "rlark-a", "big"),
                json!({"metadata": {"name": "big", "namespace": "rlark-a"}, "pad": "l".repeat(390_000)}),
            )
            .await
            .unwrap();
        let agent = Identity::agent("a");
        let error = check("rlark-a", "t", Some(agent))
            .await
            .expect_err("agent namespace quota");
        assert!(
            error.message.contains("maxBytesPerAgentNamespace"),
            "{}",
            error.message
        );
        // An admin posting there is held to the report quotas only.
        check("rlark-a", "t", None).await.expect("admin");
    }

    async fn put_task(store: &dyn Store, name: &str, uid: &str) {
        let task = json!({"metadata": {"name": name, "namespace": "ns", "uid": uid}});
        store
            .create(&ObjectKey::new(TASKS, "ns", name), task)
            .await
            .unwrap();
    }

    async fn seqs(store: &dyn Store, task: &str) -> Vec<u64> {
        let (items, _) = list_task_reports(store, "ns", task).await.unwrap();
        items
            .iter()
            .filter_map(|i| seq_of_object(task, i))
            .collect()
    }

    #[tokio::test]
    async fn deleting_a_task_deletes_its_reports() {
        let dir = tempfile::tempdir().unwrap();
        let store = test_store(dir.path()).await;
        put_task(store.as_ref(), "t", "u1").await;
        put_task(store.as_ref(), "t.x", "x1").await;
        let hints = Hints::default();
        for _ in 0..3 {
            append(store.as_ref(), &hints, 1000, "ns", "t", "u1", report("m"))
                .await
                .unwrap();
        }
        append(store.as_ref(), &hints, 1000, "ns", "t.x", "x1", report("m"))
            .await
            .unwrap();
        let shutdown = CancellationToken::new();
        let collector = tokio::spawn(collect_deleted_task_reports(
            Arc::clone(&store),
            shutdown.clone(),
        ));
        store
            .delete(&ObjectKey::new(TASKS, "ns", "t"), None)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !seqs(store.as_ref(), "t").await.is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the reports of the deleted task are still there"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            seqs(store.as_ref(), "t.x").await,
            [1],
            "another task's stay"
        );

        // A Task re-created under the name numbers its own reports from 1 (the hint learnt
        // for the deleted one is not used), and the collector leaves them alone.
        put_task(store.as_ref(), "t", "u2").await;
        let stored = append(store.as_ref(), &hints, 1000, "ns", "t", "u2", report("m"))
            .await
            .unwrap();
        assert_eq!(stored.pointer("/spec/seq"), Some(&json!(1)));
        store
            .delete(&ObjectKey::new(TASKS, "ns", "t.x"), None)
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !seqs(store.as_ref(), "t.x").await.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "t.x reports stay");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seqs(store.as_ref(), "t").await, [1]);
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), collector)
            .await
            .expect("the collector stops on shutdown")
            .unwrap();
    }

    #[tokio::test]
    async fn a_sweep_deletes_reports_whose_task_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = test_store(dir.path()).await;
        let hints = Hints::default();
        // "gone": no Task at all; "again": re-created (old reports of uid a1, new of a2);
        // "kept": still there.
        put_task(store.as_ref(), "again", "a2").await;
        put_task(store.as_ref(), "kept", "k1").await;
        for (task, uid, n) in [("gone", "g1", 2), ("again", "a1", 2), ("kept", "k1", 2)] {
            for _ in 0..n {
                append(store.as_ref(), &hints, 1000, "ns", task, uid, report("m"))
                    .await
                    .unwrap();
            }
        }
        append(
            store.as_ref(),
            &hints,
            1000,
            "ns",
            "again",
            "a2",
            report("m"),
        )
        .await
        .unwrap();
        assert_eq!(sweep_orphaned_reports(store.as_ref()).await.unwrap(), 4);
        assert!(seqs(store.as_ref(), "gone").await.is_empty());
        // a2's report was numbered after a1's, which were still stored then.
        assert_eq!(
            seqs(store.as_ref(), "again").await,
            [3],
            "only a2's report stays"
        );
        assert_eq!(seqs(store.as_ref(), "kept").await, [1, 2]);
        assert_eq!(sweep_orphaned_reports(store.as_ref()).await.unwrap(), 0);
    }
}
