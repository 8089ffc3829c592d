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
//! Events further expire after [`Limits::event_ttl`] and go with the object they are about
//! (see `eventgc.rs`).

use std::collections::HashMap;
use std::sync::Mutex;
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

/// Size limits of a core Event about to be written (create, update, patch; every caller):
/// 422 with a `FieldValueTooLong` cause on `message`, 413 for the whole object.
pub(crate) fn admit_event_size(
    limits: &Limits,
    rt: &ResourceType,
    object: &Value,
) -> Result<(), ApiError> {
    if !is_event(rt) {
        return Ok(());
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(message) = object.get("message").and_then(Value::as_str)
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
    let size = serde_json::to_vec(object).map_or(usize::MAX, |bytes| bytes.len());
    if size > limits.max_event_bytes {
        let mut error = ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "events \"{name}\" is too large: {size} bytes as JSON, the limit for an Event is {} bytes",
                limits.max_event_bytes
            ),
        );
        error.name = Some(name.to_string());
        error.kind = Some("events".into());
        return Err(error);
    }
    Ok(())
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

/// Buckets kept before idle (full) ones are dropped.
const MAX_BUCKETS: usize = 4096;

/// Per-identity write rate limits (token buckets keyed by user name) for agents and task
/// tokens; see the module documentation.
#[derive(Debug)]
pub struct RateLimiter {
    limits: Limits,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            buckets: Mutex::new(HashMap::new()),
        }
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
            let involved = |o: &Value, key: &str| {
                o.pointer(&format!("/involvedObject/{key}"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            };
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
            let mine = all
                .items
                .iter()
                .filter(|o| {
                    involved(o, "kind").as_deref() == Some("Task")
                        && involved(o, "name").as_deref() == Some(task.as_str())
                })
                .count();
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
        assert!(admit_event_size(&limits, &events, &ok).is_ok());
        let long = json!({"metadata": {"name": "e"}, "message": "x".repeat(11)});
        let error = admit_event_size(&limits, &events, &long).expect_err("message too long");
        assert_eq!((error.code, error.reason), (422, "Invalid"));
        assert_eq!(error.causes[0].field, "message");
        assert!(error.message.contains("10 bytes"), "{}", error.message);
        let big = json!({"metadata": {"name": "e"}, "reason": "y".repeat(300)});
        let error = admit_event_size(&limits, &events, &big).expect_err("object too large");
        assert_eq!((error.code, error.reason), (413, "RequestEntityTooLarge"));
        assert!(error.message.contains("200 bytes"), "{}", error.message);
        // Other kinds are not this check's business.
        assert!(admit_event_size(&limits, &ResourceType::lease(), &big).is_ok());
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
