//! Limits on what agents and task tokens may write, so that neither can exhaust the
//! server's memory or disk:
//!
//! - **Event size** (every caller): `message` of at most [`Limits::max_event_message_bytes`]
//!   (422, field `message`), the whole Event of at most [`Limits::max_event_bytes`] as JSON
//!   (413). Kubernetes limits an Event's note to 1 KiB (`NoteLengthLimit`).
//! - **Write rate** per identity: a token bucket per user name for agents and for task tokens
//!   (create, update, patch, delete); an empty bucket answers 429 `TooManyRequests` with
//!   `Retry-After`. Admins (the controllers among them), server replicas and viewers (who
//!   cannot write) are not limited.
//! - **Object counts** on create by an agent or a task token: Events per namespace, Events
//!   about one Task created by its token, and all objects in an agent's `rlark-<id>`
//!   namespace (each counted in the namespace written to). Over the quota is 429 with `Retry-After` as well: Events expire
//!   ([`Limits::event_ttl`]), so waiting frees room. Counting and creating are not atomic,
//!   so concurrent creates of one identity may overshoot a quota by their number (at most
//!   the write burst).
//!
//! - **Object sizes** (every caller, every kind; issue 38): the environment variables in
//!   an object's `spec` (every `env`/`environment` list, as JSON) at most
//!   [`Limits::max_env_bytes`], the `spec` at most [`Limits::max_spec_bytes`], the `status` at
//!   most [`Limits::max_status_bytes`], the whole object at most [`Limits::max_object_bytes`],
//!   all as JSON: 413 `RequestEntityTooLarge` naming the field and the limit, before anything
//!   is written. Kubernetes' own bound is etcd's 1.5 MiB per object.
//! - **Byte quotas** (issue 38): what an agent's `rlark-<id>` namespace holds, every kind and
//!   the task reports together, at most [`Limits::max_bytes_per_agent_namespace`] for the
//!   agent to create or grow an object there; the Events about a Task at most
//!   [`Limits::max_event_bytes_per_task`] for its token to create another. Over a quota is
//!   429 naming it (shrinking and deleting are always allowed). Counted from the store's
//!   per-namespace usage ([`rlark_store::Store::usage`]), so a check costs a lookup. Task
//!   reports have their own quotas (`rlark-server`'s `reports.rs`).
//!
//! Events further expire after [`Limits::event_ttl`] and go with the object they are about
//! (see `eventgc.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rlark_store::ListOptions;
use serde_json::Value;
// Token buckets refill on tokio's clock, like every other timer of the API server.
use tokio::time::Instant;

use crate::Inner;
use crate::auth::{Identity, Role, agent_namespace};
use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// Write and size limits of the API server ([`crate::ApiServerOptions::limits`]). Every
/// field is a setting of `rlark server` (`api.limits.*` in the config file).
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Longest core Event `message`, in bytes (default 1024, Kubernetes' `NoteLengthLimit`).
    pub max_event_message_bytes: usize,
    /// Largest core Event, in bytes of JSON as stored (default 16 KiB).
    pub max_event_bytes: usize,
    /// Events are deleted this long after their last write (default 1 h, as kube-apiserver's
    /// `--event-ttl`).
    pub event_ttl: Duration,
    /// Sustained writes per second of one agent (default 500: about 100 replica starts a
    /// second, each a Pod create and a few status writes; one agent speaks for a whole
    /// cluster, where each kubelet alone may write 50/s).
    pub agent_writes_per_second: f64,
    /// Writes one agent may make at once above the sustained rate (default 5000: a burst
    /// of 500 new replicas without waiting).
    pub agent_write_burst: u32,
    /// Sustained writes per second of one task token (default 10).
    pub task_writes_per_second: f64,
    /// Writes one task token may make at once above the sustained rate (default 100).
    pub task_write_burst: u32,
    /// Events a namespace may hold for an agent or a task token to create another (default 5000).
    pub max_events_per_namespace: usize,
    /// Events about a Task (whoever wrote them) its token may find for it to create another
    /// (default 100).
    pub max_events_per_task: usize,
    /// Objects (of every kind) an agent's `rlark-<id>` namespace may hold for the agent to
    /// create another (default 10 000).
    pub max_objects_per_agent_namespace: usize,
    /// Largest object of any kind, in bytes of JSON as stored (default 1.5 MiB, etcd's
    /// default request limit, which bounds a Kubernetes object).
    pub max_object_bytes: usize,
    /// Largest `spec` of any object, in bytes of JSON (default 1 MiB).
    pub max_spec_bytes: usize,
    /// Most bytes of environment variables in an object's `spec`: every `env` and
    /// `environment` list in it (a Task's runtimes, a Job's templates), as JSON (default
    /// 256 KiB; Linux refuses a single variable over 128 KiB at exec anyway).
    pub max_env_bytes: usize,
    /// Largest `status` of any object, in bytes of JSON (default 512 KiB).
    pub max_status_bytes: usize,
    /// Bytes of JSON an agent's `rlark-<id>` namespace may hold (every kind, task reports
    /// included) for the agent to create or grow an object there (default 128 MiB).
    pub max_bytes_per_agent_namespace: u64,
    /// Bytes of JSON of the Events about a Task (whoever wrote them) for its token to
    /// create another (default 512 KiB).
    pub max_event_bytes_per_task: u64,
    /// Bytes of JSON of one Task's stored reports for another to be posted (default 4 MiB;
    /// the 1000 reports kept per Task are far below it unless they are large).
    pub max_report_bytes_per_task: u64,
    /// Bytes of JSON of the task reports one namespace may hold for another to be posted
    /// (default 64 MiB).
    pub max_report_bytes_per_namespace: u64,
    /// Watches one agent or task token may hold open at once (default 100): with the
    /// store's per-watch budget (`store.watchBufferBytes`) this bounds what the watches of
    /// one identity that stops reading can hold.
    pub max_watches_per_identity: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_event_message_bytes: 1024,
            max_event_bytes: 16 * 1024,
            event_ttl: Duration::from_secs(3600),
            agent_writes_per_second: 500.0,
            agent_write_burst: 5000,
            task_writes_per_second: 10.0,
            task_write_burst: 100,
            max_events_per_namespace: 5000,
            max_events_per_task: 100,
            max_objects_per_agent_namespace: 10_000,
            max_object_bytes: 1536 * 1024,
            max_spec_bytes: 1024 * 1024,
            max_env_bytes: 256 * 1024,
            max_status_bytes: 512 * 1024,
            max_bytes_per_agent_namespace: 128 * 1024 * 1024,
            max_event_bytes_per_task: 512 * 1024,
            max_report_bytes_per_task: 4 * 1024 * 1024,
            max_report_bytes_per_namespace: 64 * 1024 * 1024,
            max_watches_per_identity: 100,
        }
    }
}

impl Limits {
    /// Every problem with the settings as `(field, message)`, the field named as in the
    /// config file's `api.limits` section.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = |field: &'static str, value: usize| {
            if value == 0 {
                Err((field, "must be positive".to_string()))
            } else {
                Ok(())
            }
        };
        positive("maxEventMessageBytes", self.max_event_message_bytes)?;
        positive("maxEventBytes", self.max_event_bytes)?;
        positive("maxEventsPerNamespace", self.max_events_per_namespace)?;
        positive("maxEventsPerTask", self.max_events_per_task)?;
        positive(
            "maxObjectsPerAgentNamespace",
            self.max_objects_per_agent_namespace,
        )?;
        // Below a few KiB ordinary objects (a Node, a Pod) could not be written at all.
        const MIN_OBJECT: usize = 64 * 1024;
        for (field, value) in [
            ("maxObjectBytes", self.max_object_bytes),
            ("maxSpecBytes", self.max_spec_bytes),
            ("maxStatusBytes", self.max_status_bytes),
        ] {
            if value < MIN_OBJECT {
                return Err((field, format!("must be at least {MIN_OBJECT}, got {value}")));
            }
        }
        positive("maxEnvBytes", self.max_env_bytes)?;
        positive("maxWatchesPerIdentity", self.max_watches_per_identity)?;
        for (field, value) in [
            (
                "maxBytesPerAgentNamespace",
                self.max_bytes_per_agent_namespace,
            ),
            ("maxEventBytesPerTask", self.max_event_bytes_per_task),
            ("maxReportBytesPerTask", self.max_report_bytes_per_task),
            (
                "maxReportBytesPerNamespace",
                self.max_report_bytes_per_namespace,
            ),
        ] {
            if value < MIN_OBJECT as u64 {
                return Err((field, format!("must be at least {MIN_OBJECT}, got {value}")));
            }
        }
        if self.max_event_message_bytes > self.max_event_bytes {
            return Err((
                "maxEventMessageBytes",
                format!("must not exceed maxEventBytes ({})", self.max_event_bytes),
            ));
        }
        if self.event_ttl < Duration::from_secs(1) {
            return Err(("eventTTLSeconds", "must be at least 1".to_string()));
        }
        for (field, rate) in [
            ("agentWritesPerSecond", self.agent_writes_per_second),
            ("taskWritesPerSecond", self.task_writes_per_second),
        ] {
            if !rate.is_finite() || rate <= 0.0 {
                return Err((field, format!("must be a positive number, got {rate}")));
            }
        }
        positive("agentWriteBurst", self.agent_write_burst as usize)?;
        positive("taskWriteBurst", self.task_write_burst as usize)?;
        Ok(())
    }
}

/// How often Events are swept (`eventgc.rs`) for a TTL of `ttl`: a quarter of it, between 250 ms and 60 s.
pub(crate) fn event_sweep_interval(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(250), Duration::from_secs(60))
}

fn is_event(rt: &ResourceType) -> bool {
    rt.group.is_empty() && rt.plural == "events"
}

/// Bytes of `value` encoded as JSON (as the store encodes it), without encoding it.
pub fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, nor can encoding a `Value`.
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// One step of a path into an object.
#[derive(Clone, Copy)]
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn path_text(root: &str, steps: &[Step<'_>]) -> String {
    let mut text = root.to_string();
    for step in steps {
        match step {
            Step::Key(key) => {
                text.push('.');
                text.push_str(key);
            }
            Step::Index(i) => text.push_str(&format!("[{i}]")),
        }
    }
    text
}

/// The environment-variable lists in `value` (every `env` or `environment` array), each with
/// its path under `root` and its size as JSON. Paths are only spelled out for the lists found.
fn env_lists(value: &Value, root: &str, found: &mut Vec<(String, usize)>) {
    fn walk<'a>(
        value: &'a Value,
        root: &str,
        steps: &mut Vec<Step<'a>>,
        found: &mut Vec<(String, usize)>,
    ) {
        match value {
            Value::Object(map) => {
                for (key, item) in map {
                    steps.push(Step::Key(key));
                    if matches!(key.as_str(), "env" | "environment") && item.is_array() {
                        found.push((path_text(root, steps), json_len(item)));
                    } else {
                        walk(item, root, steps, found);
                    }
                    steps.pop();
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    steps.push(Step::Index(i));
                    walk(item, root, steps, found);
                    steps.pop();
                }
            }
            _ => {}
        }
    }
    walk(value, root, &mut Vec::new(), found);
}

/// 413 `RequestEntityTooLarge` about object `name` of `rt`.
fn too_large(rt: &ResourceType, name: &str, message: String) -> ApiError {
    let mut error = ApiError::new(413, "RequestEntityTooLarge", message);
    error.name = Some(name.to_string());
    error.group = (!rt.group.is_empty()).then(|| rt.group.clone());
    error.kind = Some(rt.plural.clone());
    error
}

/// Size limits of an object about to be written (create, update, patch; every caller):
/// for core Events, 422 with a `FieldValueTooLong` cause on `message`; for every kind, 413
/// naming the field and the limit when the environment variables, the `spec`, the `status`
/// or the whole object (as JSON) are over theirs. Returns the object's size as JSON.
pub(crate) fn admit_object_size(
    limits: &Limits,
    rt: &ResourceType,
    object: &Value,
) -> Result<usize, ApiError> {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let what = format!("{} \"{name}\"", rt.plural);
    if is_event(rt)
        && let Some(message) = object.get("message").and_then(Value::as_str)
        && message.len() > limits.max_event_message_bytes
    {
        return Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueTooLong".into(),
                message: format!(
                    "Too long: may not be more than {} bytes (got {})",
                    limits.max_event_message_bytes,
                    message.len()
                ),
                field: "message".into(),
            }],
        ));
    }
    let size = json_len(object);
    // The parts are no larger than the whole: most objects need no second look.
    let parts_fit = size <= limits.max_env_bytes
        && size <= limits.max_spec_bytes
        && size <= limits.max_status_bytes;
    if !parts_fit && let Some(spec) = object.get("spec") {
        let mut lists = Vec::new();
        env_lists(spec, "spec", &mut lists);
        let total: usize = lists.iter().map(|(_, bytes)| bytes).sum();
        if total > limits.max_env_bytes
            && let Some((field, bytes)) = lists.iter().max_by_key(|(_, bytes)| *bytes)
        {
            return Err(too_large(
                rt,
                name,
                format!(
                    "{what} is too large: its environment variables take {total} bytes as JSON \
                     ({field}: {bytes}), the limit (api.limits.maxEnvBytes) is {} bytes",
                    limits.max_env_bytes
                ),
            ));
        }
        let size = json_len(spec);
        if size > limits.max_spec_bytes {
            return Err(too_large(
                rt,
                name,
                format!(
                    "{what} is too large: spec is {size} bytes as JSON, the limit \
                     (api.limits.maxSpecBytes) is {} bytes",
                    limits.max_spec_bytes
                ),
            ));
        }
    }
    if !parts_fit && let Some(status) = object.get("status") {
        let size = json_len(status);
        if size > limits.max_status_bytes {
            return Err(too_large(
                rt,
                name,
                format!(
                    "{what} is too large: status is {size} bytes as JSON, the limit \
                     (api.limits.maxStatusBytes) is {} bytes",
                    limits.max_status_bytes
                ),
            ));
        }
    }
    if is_event(rt) && size > limits.max_event_bytes {
        return Err(too_large(
            rt,
            name,
            format!(
                "{what} is too large: {size} bytes as JSON, the limit for an Event \
                 (api.limits.maxEventBytes) is {} bytes",
                limits.max_event_bytes
            ),
        ));
    }
    if size > limits.max_object_bytes {
        return Err(too_large(
            rt,
            name,
            format!(
                "{what} is too large: {size} bytes as JSON, the limit \
                 (api.limits.maxObjectBytes) is {} bytes",
                limits.max_object_bytes
            ),
        ));
    }
    Ok(size)
}

/// Whether Event `event` is about Task `task` (of its namespace).
fn about_task(event: &Value, task: &str) -> bool {
    let involved = |key: &str| {
        event
            .pointer(&format!("/involvedObject/{key}"))
            .and_then(Value::as_str)
    };
    involved("kind") == Some("Task") && involved("name") == Some(task)
}

/// 429 `TooManyRequests` with `Retry-After: seconds`.
pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u64) -> ApiError {
    let mut error = ApiError::new(429, "TooManyRequests", message);
    error.retry_after_seconds = Some(retry_after_seconds.max(1));
    error
}

/// One identity's token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// `Retry-After` of a refused watch: one is free as soon as another ends.
const WATCH_RETRY_SECONDS: u64 = 5;

/// Buckets kept before idle (full) ones are dropped.
const MAX_BUCKETS: usize = 4096;

/// Per-identity write rate limits (token buckets keyed by user name) for agents and task
/// tokens; see the module documentation.
#[derive(Debug)]
pub struct RateLimiter {
    limits: Limits,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Open watches per agent or task identity ([`Limits::max_watches_per_identity`]).
    watches: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open watch of an identity, counted until dropped.
#[derive(Debug)]
pub(crate) struct WatchSlot {
    watches: Arc<Mutex<HashMap<String, usize>>>,
    user: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(open) = watches.get_mut(&self.user) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                watches.remove(&self.user);
            }
        }
    }
}

impl RateLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            buckets: Mutex::new(HashMap::new()),
            watches: Arc::default(),
        }
    }

    /// Count a watch `identity` opens: `None` for identities that are not limited (admins,
    /// viewers, replicas), a slot to hold while the watch is open otherwise, or 429 when
    /// the identity holds [`Limits::max_watches_per_identity`] already.
    pub(crate) fn open_watch(&self, identity: &Identity) -> Result<Option<WatchSlot>, ApiError> {
        if !matches!(identity.role(), Role::Agent { .. } | Role::Task { .. }) {
            return Ok(None);
        }
        let limit = self.limits.max_watches_per_identity;
        let mut watches = self
            .watches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let open = watches.entry(identity.user.clone()).or_default();
        if *open >= limit {
            tracing::warn!(user = %identity.user, open = *open, limit, "watch refused: too many open watches");
            return Err(too_many_requests(
                format!(
                    "too many watches: {} holds {} open watches, the limit \
                     (api.limits.maxWatchesPerIdentity) is {limit}",
                    identity.user, *open
                ),
                WATCH_RETRY_SECONDS,
            ));
        }
        *open += 1;
        Ok(Some(WatchSlot {
            watches: Arc::clone(&self.watches),
            user: identity.user.clone(),
        }))
    }

    /// The limits this limiter was made with (the API server's).
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Take one write from `identity`'s bucket: `Ok` when there was one (or the identity is
    /// not limited), else 429 with the seconds until the next write is allowed.
    pub fn check(&self, identity: &Identity) -> Result<(), ApiError> {
        let (rate, burst) = match identity.role() {
            Role::Agent { .. } => (
                self.limits.agent_writes_per_second,
                self.limits.agent_write_burst,
            ),
            Role::Task { .. } => (
                self.limits.task_writes_per_second,
                self.limits.task_write_burst,
            ),
            _ => return Ok(()),
        };
        let burst = f64::from(burst.max(1));
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(&identity.user) {
            // Forget identities whose bucket has refilled: they lose nothing.
            buckets.retain(|_, b| {
                b.tokens + now.duration_since(b.updated).as_secs_f64() * rate < burst
            });
        }
        let bucket = buckets
            .entry(identity.user.clone())
            .or_insert_with(|| Bucket {
                tokens: burst,
                updated: now,
            });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - bucket.tokens) / rate).ceil();
        // `rate` is validated positive; a huge wait still fits in u64 after the cast.
        let seconds = if wait.is_finite() { wait as u64 } else { 1 };
        tracing::debug!(user = %identity.user, rate, burst, "write rate limit hit");
        Err(too_many_requests(
            format!(
                "too many requests: {} may write {rate} times per second (burst {burst}); retry after {seconds}s",
                identity.user
            ),
            seconds,
        ))
    }
}

impl Inner {
    /// Number of objects of `rt` in `namespace` (without copying them).
    async fn count_in(&self, rt: &ResourceType, namespace: &str) -> Result<u64, ApiError> {
        let options = ListOptions {
            namespace: Some(namespace.to_string()),
            limit: Some(1),
            ..ListOptions::default()
        };
        self.store
            .list(&rt.store_resource(), &options)
            .await
            .map(|page| page.items.len() as u64 + page.remaining)
            .map_err(|e| ApiError::from_store(e, rt, ""))
    }

    /// Byte quotas for a write by `caller` that makes an object of `rt` in `namespace`
    /// `new_bytes` long as JSON where it was `old` (`None` for a create): an agent's
    /// namespace ([`Limits::max_bytes_per_agent_namespace`]) and, for a task token's Event
    /// about its Task, that Task's Events ([`Limits::max_event_bytes_per_task`]). 429 naming
    /// the quota; a write that does not grow anything passes.
    pub(crate) async fn check_byte_quotas(
        &self,
        caller: Option<&Identity>,
        rt: &ResourceType,
        namespace: &str,
        new_bytes: usize,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let Some(identity) = caller else {
            return Ok(());
        };
        if !rt.namespaced || !matches!(identity.role(), Role::Agent { .. } | Role::Task { .. }) {
            return Ok(());
        }
        // Measured only for the identities with quotas: one more walk of the object.
        let old_bytes = old.map_or(0, json_len);
        if new_bytes <= old_bytes {
            return Ok(());
        }
        let limits = &self.options.limits;
        let retry = event_sweep_interval(limits.event_ttl).as_secs();
        let growth = (new_bytes - old_bytes) as u64;
        match identity.role() {
            Role::Agent { cluster_id } if agent_namespace(&cluster_id) == namespace => {
                let held = self
                    .store
                    .usage(namespace, None)
                    .await
                    .map_err(|e| ApiError::from_store(e, rt, ""))?
                    .bytes;
                let quota = limits.max_bytes_per_agent_namespace;
                if held.saturating_add(growth) > quota {
                    tracing::warn!(user = %identity.user, %namespace, held, growth, quota, "agent namespace byte quota reached: write refused");
                    return Err(too_many_requests(
                        format!(
                            "exceeded quota: namespace {namespace} holds {held} bytes of objects; \
                             {growth} more would pass the limit for an agent's namespace \
                             (api.limits.maxBytesPerAgentNamespace) of {quota} bytes"
                        ),
                        retry,
                    ));
                }
            }
            Role::Task { name: task, .. } if is_event(rt) => {
                let all = self
                    .store
                    .list_encoded(
                        &rt.store_resource(),
                        &ListOptions {
                            namespace: Some(namespace.to_string()),
                            ..ListOptions::default()
                        },
                    )
                    .await
                    .map_err(|e| ApiError::from_store(e, rt, ""))?;
                let held: u64 = all
                    .items
                    .iter()
                    .filter(|e| about_task(&e.object, &task))
                    .map(|e| e.json.len() as u64)
                    .sum();
                let quota = limits.max_event_bytes_per_task;
                if held.saturating_add(growth) > quota {
                    return Err(too_many_requests(
                        format!(
                            "exceeded quota: the Events about task {namespace}/{task} hold {held} \
                             bytes; {growth} more would pass the limit \
                             (api.limits.maxEventBytesPerTask) of {quota} bytes"
                        ),
                        retry,
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Object-count quotas for a create by an agent or a task token (see the module
    /// documentation); 429 with `Retry-After` when one is full.
    pub(crate) async fn check_quotas(
        &self,
        identity: &Identity,
        rt: &ResourceType,
        namespace: &str,
    ) -> Result<(), ApiError> {
        let limits = &self.options.limits;
        let role = identity.role();
        if !matches!(role, Role::Agent { .. } | Role::Task { .. }) || !rt.namespaced {
            return Ok(());
        }
        let retry = event_sweep_interval(limits.event_ttl).as_secs();
        if let Role::Agent { cluster_id } = &role
            && agent_namespace(cluster_id) == namespace
        {
            let mut total = 0u64;
            for rt in self.registry.stored().filter(|rt| rt.namespaced) {
                total += self.count_in(rt, namespace).await?;
            }
            if total >= limits.max_objects_per_agent_namespace as u64 {
                return Err(too_many_requests(
                    format!(
                        "exceeded quota: namespace {namespace} holds {total} objects, the limit for an agent's namespace is {}",
                        limits.max_objects_per_agent_namespace
                    ),
                    retry,
                ));
            }
        }
        if !is_event(rt) {
            return Ok(());
        }
        let events = self.count_in(rt, namespace).await?;
        if events >= limits.max_events_per_namespace as u64 {
            return Err(too_many_requests(
                format!(
                    "exceeded quota: namespace {namespace} holds {events} events, the limit is {}",
                    limits.max_events_per_namespace
                ),
                retry,
            ));
        }
        if let Role::Task { name: task, .. } = &role {
            let all = self
                .store
                .list(
                    &rt.store_resource(),
                    &ListOptions {
                        namespace: Some(namespace.to_string()),
                        ..ListOptions::default()
                    },
                )
                .await
                .map_err(|e| ApiError::from_store(e, rt, ""))?;
            let mine = all.items.iter().filter(|o| about_task(o, task)).count();
            if mine >= limits.max_events_per_task {
                return Err(too_many_requests(
                    format!(
                        "exceeded quota: task {namespace}/{task} has {mine} events, the limit is {}",
                        limits.max_events_per_task
                    ),
                    retry,
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn event_sweep_interval_follows_the_ttl_within_bounds() {
        assert_eq!(
            event_sweep_interval(Duration::from_secs(3600)),
            Duration::from_secs(60)
        );
        assert_eq!(
            event_sweep_interval(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            event_sweep_interval(Duration::from_millis(100)),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn event_sizes_are_limited_with_the_field_and_limit_named() {
        let limits = Limits {
            max_event_message_bytes: 10,
            max_event_bytes: 200,
            ..Limits::default()
        };
        let events = ResourceType::event();
        let ok = json!({"metadata": {"name": "e"}, "message": "short"});
        assert!(admit_object_size(&limits, &events, &ok).is_ok());
        let long = json!({"metadata": {"name": "e"}, "message": "x".repeat(11)});
        let error = admit_object_size(&limits, &events, &long).expect_err("message too long");
        assert_eq!((error.code, error.reason), (422, "Invalid"));
        assert_eq!(error.causes[0].field, "message");
        assert!(error.message.contains("10 bytes"), "{}", error.message);
        let big = json!({"metadata": {"name": "e"}, "reason": "y".repeat(300)});
        let error = admit_object_size(&limits, &events, &big).expect_err("object too large");
        assert_eq!((error.code, error.reason), (413, "RequestEntityTooLarge"));
        assert!(error.message.contains("200 bytes"), "{}", error.message);
        // Other kinds are not this check's business.
        assert!(admit_object_size(&limits, &ResourceType::lease(), &big).is_ok());
    }

    /// Issue 38, finding 2: "150 Tasks with a 2.9 MB env value each": the environment, the
    /// spec, the status and the whole object are limited per kind, with the field and the
    /// limit named.
    #[test]
    fn object_sizes_are_limited_with_the_field_and_limit_named() {
        let limits = Limits::default();
        let tasks = ResourceType::lease();
        let task = |env: usize, input: usize| {
            json!({"metadata": {"name": "t"}, "spec": {
                "raw": {"entrypoint": ["true"], "environment": [{"name": "BIG", "value": "e".repeat(env)}]},
                "docker": {"containers": [{"name": "c", "environment": [{"name": "X", "value": "x".repeat(env / 2)}]}]},
                "input": "i".repeat(input),
            }})
        };
        let size = admit_object_size(&limits, &tasks, &task(1000, 1000)).expect("small");
        assert_eq!(size, json_len(&task(1000, 1000)));
        assert_eq!(size, serde_json::to_vec(&task(1000, 1000)).unwrap().len());
        // 2.9 MB of environment: the largest list is named, and the limit.
        let error = admit_object_size(&limits, &tasks, &task(2_900_000, 0)).expect_err("env");
        assert_eq!((error.code, error.reason), (413, "RequestEntityTooLarge"));
        assert!(
            error.message.contains("spec.raw.environment"),
            "{}",
            error.message
        );
        assert!(error.message.contains("maxEnvBytes"), "{}", error.message);
        assert!(error.message.contains("262144 bytes"), "{}", error.message);
        // Two lists under the limit each, over it together.
        let error = admit_object_size(&limits, &tasks, &task(180_000, 0)).expect_err("env total");
        assert!(error.message.contains("maxEnvBytes"), "{}", error.message);
        let docker_path = "spec.docker.containers[0].environment";
        let mut lists = Vec::new();
        env_lists(&task(10, 0)["spec"], "spec", &mut lists);
        assert!(
            lists.iter().any(|(path, _)| path == docker_path),
            "{lists:?}"
        );
        // The whole spec.
        let error = admit_object_size(&limits, &tasks, &task(10, 1_100_000)).expect_err("spec");
        assert!(error.message.contains("maxSpecBytes"), "{}", error.message);
        // Status.
        let status = json!({"metadata": {"name": "n"}, "status": {"pad": "s".repeat(600_000)}});
        let error = admit_object_size(&limits, &tasks, &status).expect_err("status");
        assert!(
            error.message.contains("maxStatusBytes"),
            "{}",
            error.message
        );
        // The whole object (annotations are neither spec nor status).
        let annotated =
            json!({"metadata": {"name": "n", "annotations": {"a": "a".repeat(1_600_000)}}});
        let error = admit_object_size(&limits, &tasks, &annotated).expect_err("object");
        assert!(
            error.message.contains("maxObjectBytes"),
            "{}",
            error.message
        );
    }

    #[test]
    fn buckets_limit_agents_and_tasks_but_not_admins() {
        let limiter = RateLimiter::new(Limits {
            agent_writes_per_second: 0.001,
            agent_write_burst: 3,
            task_writes_per_second: 0.001,
            task_write_burst: 1,
            ..Limits::default()
        });
        let agent = Identity::agent("a");
        for _ in 0..3 {
            limiter.check(&agent).expect("within the burst");
        }
        let error = limiter.check(&agent).expect_err("burst used up");
        assert_eq!((error.code, error.reason), (429, "TooManyRequests"));
        assert!(error.retry_after_seconds.is_some_and(|s| s >= 1));
        // Buckets are per identity.
        limiter.check(&Identity::agent("b")).expect("other agent");
        let task = Identity::task("ns", "t");
        limiter.check(&task).expect("first");
        assert_eq!(limiter.check(&task).map_err(|e| e.code), Err(429));
        let admin = Identity {
            user: "admin".into(),
            groups: vec![crate::auth::ADMIN_GROUP.into()],
        };
        for _ in 0..100 {
            limiter.check(&admin).expect("admins are not limited");
        }
    }

    #[test]
    fn settings_are_checked_by_name() {
        assert_eq!(Limits::default().check(), Ok(()));
        let bad = |limits: Limits| limits.check().expect_err("invalid").0;
        assert_eq!(
            bad(Limits {
                max_event_bytes: 0,
                ..Limits::default()
            }),
            "maxEventBytes"
        );
        assert_eq!(
            bad(Limits {
                agent_writes_per_second: f64::NAN,
                ..Limits::default()
            }),
            "agentWritesPerSecond"
        );
        assert_eq!(
            bad(Limits {
                event_ttl: Duration::ZERO,
                ..Limits::default()
            }),
            "eventTTLSeconds"
        );
        assert_eq!(
            bad(Limits {
                max_event_message_bytes: 20_000,
                ..Limits::default()
            }),
            "maxEventMessageBytes"
        );
    }

    #[test]
    fn too_many_requests_carries_retry_after() {
        let error = too_many_requests("slow down", 0);
        assert_eq!(error.retry_after_seconds, Some(1));
        assert_eq!(error.status()["reason"], "TooManyRequests");
        assert_eq!(error.status()["details"]["retryAfterSeconds"], 1);
    }
}
