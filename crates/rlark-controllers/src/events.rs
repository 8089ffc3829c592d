//! Kubernetes-style Events (core `v1/Event`) for transitions and placement decisions, so
//! `rlark describe` and `kubectl describe` show why something happened.
//!
//! Repeats are aggregated as client-go's `EventRecorder` does: the same object, type,
//! reason and message recorded again within [`AGGREGATION_WINDOW`] bumps `count` and
//! `lastTimestamp` of the Event already written instead of creating a new one. The
//! bookkeeping lives in a small bounded in-memory cache shared by the clones of a
//! [`Recorder`]; after a restart (or an eviction) the next repeat simply starts a new Event.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};

/// Repeats within this window update the existing Event (client-go uses 10 minutes too).
pub const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);

/// How many distinct (object, type, reason, message) keys the cache remembers; the oldest
/// is forgotten first.
pub const CACHE_CAPACITY: usize = 4096;

/// Longest message written, in bytes: the API server refuses Events whose `message` is
/// longer than its `api.limits.maxEventMessageBytes` (default 1024, Kubernetes'
/// `NoteLengthLimit`), so longer messages are cut (at a character boundary) rather than lost.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `message` cut to at most [`MAX_MESSAGE_BYTES`] bytes, ending in `...` when cut.
fn truncate_message(message: &str) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES - 3;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// `Normal` or `Warning`, as in Kubernetes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What makes two Events "the same" for aggregation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    namespace: String,
    kind: String,
    name: String,
    uid: String,
    type_: EventType,
    reason: String,
    message: String,
}

/// The Event written for a key, and when it was last bumped.
#[derive(Clone, Debug)]
struct Seen {
    event_name: String,
    count: i32,
    last: Timestamp,
}

/// Bounded map with FIFO eviction (insertion order; a key that is bumped keeps its place,
/// which is fine for a cache of at most [`CACHE_CAPACITY`] recent keys).
#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<EventKey, Seen>,
    order: VecDeque<EventKey>,
}

/// What [`Cache::plan`] decided for one recording.
#[derive(Debug, PartialEq)]
enum Plan {
    /// Write a new Event.
    Create,
    /// Bump the named Event to `count`.
    Update { event_name: String, count: i32 },
}

impl Cache {
    /// Decide whether `key` at `now` creates a new Event or bumps a remembered one (pure;
    /// the cache is updated by [`Cache::remember`] once the write succeeded).
    fn plan(&self, key: &EventKey, now: Timestamp) -> Plan {
        match self.entries.get(key) {
            Some(seen) if within_window(seen.last, now) => Plan::Update {
                event_name: seen.event_name.clone(),
                count: seen.count.saturating_add(1),
            },
            _ => Plan::Create,
        }
    }

    fn remember(&mut self, key: EventKey, seen: Seen) {
        if self.entries.insert(key.clone(), seen).is_none() {
            self.order.push_back(key);
            while self.order.len() > CACHE_CAPACITY {
                if let Some(oldest) = self.order.pop_front() {
                    self.entries.remove(&oldest);
                }
            }
        }
    }

    fn forget(&mut self, key: &EventKey) {
        if self.entries.remove(key).is_some() {
            self.order.retain(|k| k != key);
        }
    }
}

fn within_window(last: Timestamp, now: Timestamp) -> bool {
    let age = now.duration_since(last);
    // A clock that went backwards counts as "just now".
    age.is_negative() || age.unsigned_abs() <= AGGREGATION_WINDOW
}

/// Writes Events on behalf of one controller component. Cheap to clone; clones share the
/// aggregation cache.
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    component: String,
    cache: Arc<Mutex<Cache>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("component", &self.component)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder writing as `component` (`source.component` and `reportingComponent`).
    pub fn new(client: kube::Client, component: impl Into<String>) -> Self {
        Self {
            client,
            component: component.into(),
            cache: Arc::default(),
        }
    }

    /// A reference to `object` suitable for [`Recorder::record`].
    pub fn reference<K>(object: &K) -> ObjectReference
    where
        K: Resource<DynamicType = ()>,
    {
        object.object_ref(&())
    }

    /// Record one Event about `regarding`. Events of cluster-scoped objects go to the
    /// `default` namespace, as in Kubernetes. A repeat of the same object, type, reason and
    /// message within [`AGGREGATION_WINDOW`] increments `count` and moves `lastTimestamp`
    /// of the existing Event instead.
    ///
    /// Never fails the caller: an Event is best-effort diagnostics, so a failure is logged
    /// and dropped.
    pub async fn record(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let namespace = regarding
            .namespace
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let key = EventKey {
            namespace: namespace.clone(),
            kind: regarding.kind.clone().unwrap_or_default(),
            name: regarding.name.clone().unwrap_or_default(),
            uid: regarding.uid.clone().unwrap_or_default(),
            type_,
            reason: reason.to_string(),
            message: truncate_message(message),
        };
        let now = Timestamp::now();
        let plan = self.lock().plan(&key, now);
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        if let Plan::Update { event_name, count } = plan {
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(now)});
            match api
                .patch(&event_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.lock().remember(
                        key,
                        Seen {
                            event_name,
                            count,
                            last: now,
                        },
                    );
                    return;
                }
                Err(error) => {
                    // Deleted meanwhile (or unreachable): start a fresh Event.
                    tracing::debug!(%error, event = %event_name, "bumping event failed; creating a new one");
                    self.lock().forget(&key);
                }
            }
        }
        let event = self.new_event(regarding, &key, now);
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => {
                if let Some(event_name) = created.metadata.name {
                    self.lock().remember(
                        key,
                        Seen {
                            event_name,
                            count: 1,
                            last: now,
                        },
                    );
                }
            }
            Err(error) => {
                tracing::warn!(%error, object = %key.name, reason, "recording event failed");
            }
        }
    }

    fn new_event(&self, regarding: &ObjectReference, key: &EventKey, now: Timestamp) -> Event {
        Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", key.name)),
                namespace: Some(key.namespace.clone()),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(key.reason.clone()),
            message: Some(key.message.clone()),
            type_: Some(key.type_.as_str().to_string()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: None,
            }),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.component.clone()),
            ..Default::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        // The cache holds no invariant a panicking holder could break half-way (each
        // method leaves it consistent), so a poisoned lock is still usable.
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Name of an object for messages.
pub fn display_name<K: ResourceExt>(object: &K) -> String {
    match object.namespace() {
        Some(ns) => format!("{ns}/{}", object.name_any()),
        None => object.name_any(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(reason: &str) -> EventKey {
        EventKey {
            namespace: "ns".into(),
            kind: "Task".into(),
            name: "t".into(),
            uid: "u".into(),
            type_: EventType::Normal,
            reason: reason.into(),
            message: "m".into(),
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn long_messages_are_cut_to_the_api_limit() {
        assert_eq!(truncate_message("short"), "short");
        let cut = truncate_message(&"é".repeat(MAX_MESSAGE_BYTES));
        assert!(
            cut.len() <= MAX_MESSAGE_BYTES && cut.ends_with("..."),
            "{}",
            cut.len()
        );
        assert_eq!(
            truncate_message(&"x".repeat(MAX_MESSAGE_BYTES)).len(),
            MAX_MESSAGE_BYTES
        );
    }

    #[test]
    fn repeats_within_the_window_bump_the_existing_event() {
        let mut cache = Cache::default();
        assert_eq!(cache.plan(&key("A"), at(0)), Plan::Create);
        cache.remember(
            key("A"),
            Seen {
                event_name: "t.x".into(),
                count: 1,
                last: at(0),
            },
        );
        assert_eq!(
            cache.plan(&key("A"), at(599)),
            Plan::Update {
                event_name: "t.x".into(),
                count: 2
            }
        );
        assert_eq!(cache.plan(&key("B"), at(1)), Plan::Create);
        assert_eq!(cache.plan(&key("A"), at(601)), Plan::Create);
        // A clock step backwards still aggregates.
        assert!(matches!(cache.plan(&key("A"), at(-5)), Plan::Update { .. }));
        cache.forget(&key("A"));
        assert_eq!(cache.plan(&key("A"), at(1)), Plan::Create);
        assert!(cache.order.is_empty());
    }

    #[test]
    fn cache_is_bounded() {
        let mut cache = Cache::default();
        for i in 0..CACHE_CAPACITY + 10 {
            cache.remember(
                key(&format!("R{i}")),
                Seen {
                    event_name: format!("e{i}"),
                    count: 1,
                    last: at(0),
                },
            );
        }
        assert_eq!(cache.entries.len(), CACHE_CAPACITY);
        assert_eq!(cache.order.len(), CACHE_CAPACITY);
        assert_eq!(cache.plan(&key("R0"), at(1)), Plan::Create);
        assert!(matches!(
            cache.plan(&key(&format!("R{}", CACHE_CAPACITY + 9)), at(1)),
            Plan::Update { .. }
        ));
    }
}
