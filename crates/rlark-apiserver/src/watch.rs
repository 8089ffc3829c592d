//! Watches: a stream of newline-delimited JSON events
//! `{"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":...}`. Events already waiting
//! when one is sent go out in the same chunk (up to [`COALESCE_BYTES`]): in a burst of
//! writes a watcher costs one TLS record and one write per burst, not per event.
//!
//! - No `resourceVersion` (or `0`): an `ADDED` event for every current object, then live
//!   events. `resourceVersion=N`: events after `N` from the store's change log; when `N` has
//!   been compacted the stream carries one `ERROR` event with a 410 `Expired` Status and
//!   ends (an HTTP 410 would make kube-runtime retry the same revision forever).
//! - `sendInitialEvents=true`: the initial `ADDED` events end with a BOOKMARK annotated
//!   `k8s.io/initial-events-end: "true"`.
//! - Selectors apply with transitions, as in Kubernetes: an object that starts matching
//!   arrives as `ADDED`, one that stops matching as `DELETED`. The store's events carry no
//!   previous state, so the watcher remembers which objects the client holds; for events
//!   replayed from before the watch started (from `N` to the moment it started) the first
//!   event of each object cannot know that, and a non-matching modification is sent as
//!   `DELETED` to be safe (a client ignores deletes of objects it does not hold).
//! - Bookmarks (`allowWatchBookmarks=true`) every `bookmark_interval` and right before the
//!   `timeoutSeconds` close. A periodic bookmark's revision is the last event seen, or the
//!   store revision read at the previous tick if that is higher: every event up to that
//!   revision was committed a whole interval ago, and events ready on the store's stream are
//!   always handled before a tick. The closing bookmark first delivers the events already
//!   waiting, then reports the revision reached.
//! - The stream ends at the timeout, when the store closes, and when the server shuts down.
//! - Each live event is encoded once per rendering, not once per watcher: watchers share the
//!   line through [`EventEncodings`] (see `event_encodings`), and JSON lines are built from
//!   the store's encoding of the object without encoding it again.

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use futures::{FutureExt, StreamExt};
use rlark_store::{
    EventType, ListOptions, ObjectKey, Revision, StoreError, WatchEvent, WatchStream,
};
use serde_json::{Value, json};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::auth::Identity;
use crate::error::ApiError;
use crate::event_encodings::{EventEncodings, Rendering};
use crate::limits::WatchSlot;
use crate::list::{Freshness, Listed, freshness, wait_for_revision};
use crate::metrics::WatchGuard;
use crate::object::key_of;
use crate::output::{Output, event_line};
use crate::registry::ResourceType;
use crate::request::Query;
use crate::selectors::Selectors;

/// Annotation of the bookmark that ends the initial events of `sendInitialEvents=true`.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// What to watch and how to render it.
#[derive(Debug)]
pub(crate) struct WatchRequest {
    pub rt: Arc<ResourceType>,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub query: Query,
    pub output: Output,
    /// Who watches: counted against its watch limit, named when its watch is cut.
    pub identity: Option<Identity>,
}

/// Which objects the client holds, to turn store events into selector transitions.
struct Tracker {
    selectors: Selectors,
    /// Keys of matching objects the client is believed to hold (only kept with selectors).
    held: HashSet<ObjectKey>,
    /// Events up to this revision are replays whose previous state is unknown.
    replay_until: Revision,
    /// Objects seen in the replay window (their later events are certain again).
    replayed: HashSet<ObjectKey>,
}

impl Tracker {
    /// The event type to send for `event`, if any.
    fn classify(&mut self, event: &WatchEvent) -> Option<&'static str> {
        if self.selectors.is_empty() {
            return Some(match event.event_type {
                EventType::Added => "ADDED",
                EventType::Modified => "MODIFIED",
                EventType::Deleted => "DELETED",
            });
        }
        let key = &event.key;
        let matches = self.selectors.matches(&event.object);
        let uncertain = event.revision <= self.replay_until && self.replayed.insert(key.clone());
        let held = self.held.contains(key);
        match event.event_type {
            EventType::Deleted => (self.held.remove(key) || matches).then_some("DELETED"),
            EventType::Added | EventType::Modified if matches => {
                let fresh = self.held.insert(key.clone());
                Some(if fresh || event.event_type == EventType::Added {
                    "ADDED"
                } else {
                    "MODIFIED"
                })
            }
            EventType::Added => None,
            EventType::Modified => {
                self.held.remove(key);
                (held || uncertain).then_some("DELETED")
            }
        }
    }
}

fn bookmark(rt: &ResourceType, revision: Revision, initial_events_end: bool) -> Value {
    let mut metadata = json!({"resourceVersion": revision.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({INITIAL_EVENTS_END: "true"});
    }
    json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata})
}

/// A watch stream in progress.
struct State {
    rt: Arc<ResourceType>,
    output: Output,
    user: String,
    events: WatchStream,
    pending: VecDeque<Bytes>,
    tracker: Tracker,
    /// Lines shared with the other watchers of the server.
    encodings: Arc<EventEncodings>,
    store: Arc<dyn rlark_store::Store>,
    shutdown: CancellationToken,
    deadline: Instant,
    /// Present when the client asked for bookmarks.
    ticker: Option<Interval>,
    /// Highest revision the client may resume from without missing events.
    progress: Revision,
    /// Store revision read at the previous bookmark tick.
    previous_tick_revision: Revision,
    /// Whether the next Table event still needs column definitions.
    columns: bool,
    done: bool,
    _guard: WatchGuard,
    /// Counts the watch against its identity's limit while open.
    _slot: Option<WatchSlot>,
}

enum Step {
    End,
    Timeout,
    Event(Option<Result<WatchEvent, StoreError>>),
    Tick,
}

impl State {
    /// An event of this watch only (an initial `ADDED`): rendered here, not shared.
    fn push_object(&mut self, event_type: &str, item: &Listed) {
        let line = self.output.event_line(
            &self.rt,
            event_type,
            &item.object,
            item.json.as_deref(),
            self.columns,
            Utc::now(),
        );
        self.columns = false;
        self.pending.push_back(line);
    }

    /// A live (or replayed) store event as `event_type`: the line every watcher rendering it
    /// the same way shares. `json` is the store's encoding of `object`, if `object` is it.
    fn push_event(
        &mut self,
        event_type: &'static str,
        revision: Revision,
        object: &Arc<Value>,
        json: Option<&str>,
    ) {
        let (output, rt, columns) = (self.output, &self.rt, self.columns);
        self.columns = false;
        // A Table's ages depend on the clock: lines are shared within one second, for which
        // every age is the same (timestamps have whole seconds).
        let (now, second) = match output {
            Output::Table => {
                let second = Utc::now().timestamp();
                (
                    DateTime::from_timestamp(second, 0).unwrap_or_default(),
                    second,
                )
            }
            Output::Object | Output::Metadata => (Utc::now(), 0),
        };
        let render = || output.event_line(rt, event_type, object, json, columns, now);
        // The first Table event carries column definitions: this watcher's own.
        let line = if columns && output == Output::Table {
            render()
        } else {
            let rendering = Rendering {
                output: output.code(),
                event_type,
                projected: rt.projection.is_some(),
                second,
            };
            self.encodings.line(revision, rendering, render)
        };
        self.pending.push_back(line);
    }

    fn push_bookmark(&mut self, revision: Revision, initial_events_end: bool) {
        self.pending.push_back(event_line(
            "BOOKMARK",
            &bookmark(&self.rt, revision, initial_events_end),
        ));
    }

    fn push_error(&mut self, error: &ApiError) {
        self.pending.push_back(event_line("ERROR", &error.status()));
    }

    /// Handle one item of the store's stream; `false` when it ended the watch.
    fn on_event(&mut self, item: Result<WatchEvent, StoreError>) -> bool {
        match item {
            Ok(mut event) => {
                self.progress = self.progress.max(event.revision);
                if self.rt.projection.is_some() {
                    // The stored encoding is not what this kind shows.
                    event.object = self.rt.present(event.object);
                    event.json = None;
                }
                if let Some(event_type) = self.tracker.classify(&event) {
                    self.push_event(
                        event_type,
                        event.revision,
                        &event.object,
                        event.json.as_deref(),
                    );
                }
                true
            }
            Err(error) => {
                if let StoreError::Expired { requested, .. } = &error {
                    // Live events only end this way when the store cut the watch: its client
                    // fell `store.watchBufferBytes` behind.
                    tracing::warn!(
                        user = %self.user,
                        resource = %self.rt.qualified_name(),
                        revision = requested,
                        "watch cut for falling behind; the client must relist"
                    );
                }
                self.push_error(&ApiError::from_store(error, &self.rt, ""));
                self.done = true;
                false
            }
        }
    }

    /// Handle the store events that are ready without waiting, until [`COALESCE_BYTES`]
    /// are pending.
    fn drain_ready(&mut self) {
        let mut queued: usize = self.pending.iter().map(Bytes::len).sum();
        while !self.done && queued < COALESCE_BYTES {
            match self.events.next().now_or_never() {
                Some(Some(item)) => {
                    let before = self.pending.len();
                    self.on_event(item);
                    if self.pending.len() > before {
                        queued += self.pending.back().map_or(0, Bytes::len);
                    }
                }
                Some(None) => self.done = true,
                None => break,
            }
        }
    }

    /// The pending lines as one chunk (at least one line, at most about [`COALESCE_BYTES`]).
    fn take_chunk(&mut self) -> Option<Bytes> {
        let first = self.pending.pop_front()?;
        if self.pending.is_empty() {
            return Some(first);
        }
        let mut chunk = BytesMut::from(first);
        while chunk.len() < COALESCE_BYTES
            && let Some(line) = self.pending.pop_front()
        {
            chunk.extend_from_slice(&line);
        }
        Some(chunk.freeze())
    }

    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if let Some(chunk) = self.take_chunk() {
                return Some((Ok(chunk), self));
            }
            if self.done {
                return None;
            }
            let step = {
                let State {
                    shutdown,
                    deadline,
                    events,
                    ticker,
                    ..
                } = &mut self;
                let tick = async move {
                    match ticker {
                        Some(ticker) => {
                            ticker.tick().await;
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    // Order matters: shutdown and timeout win over a busy stream, and
                    // ready events are drained before a bookmark is cut.
                    biased;
                    () = shutdown.cancelled() => Step::End,
                    () = tokio::time::sleep_until(*deadline) => Step::Timeout,
                    event = events.next() => Step::Event(event),
                    () = tick => Step::Tick,
                }
            };
            match step {
                Step::End => self.done = true,
                Step::Timeout => {
                    // Deliver what happened before the deadline but was not read yet (a slow
                    // client), so the closing bookmark is only as recent as what was sent.
                    while let Some(Some(item)) = self.events.next().now_or_never() {
                        if !self.on_event(item) {
                            break;
                        }
                    }
                    if self.ticker.is_some() && !self.done {
                        self.push_bookmark(self.progress, false);
                    }
                    self.done = true;
                }
                Step::Event(None) => self.done = true,
                Step::Event(Some(item)) => {
                    if self.on_event(item) {
                        self.drain_ready();
                    }
                }
                Step::Tick => {
                    self.progress = self.progress.max(self.previous_tick_revision);
                    self.previous_tick_revision = self.store.revision();
                    self.push_bookmark(self.progress, false);
                }
            }
        }
    }
}

/// Bytes of waiting events sent as one chunk, at most (one event may exceed it).
const COALESCE_BYTES: usize = 256 * 1024;

fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl Inner {
    /// Start a watch. Errors before the first event (bad options, a revision the store
    /// cannot reach) are ordinary HTTP errors; later ones are `ERROR` events.
    pub(crate) async fn watch(
        self: &Arc<Self>,
        request: WatchRequest,
    ) -> Result<Response, ApiError> {
        let WatchRequest {
            rt,
            namespace,
            selectors,
            query,
            output,
            identity,
        } = request;
        let slot = match &identity {
            Some(identity) => self.rate_limiter.open_watch(identity)?,
            None => None,
        };
        let user = identity.map(|identity| identity.user).unwrap_or_default();
        let freshness = freshness(&query)?;
        let initial = match query.send_initial_events {
            Some(send) => send,
            None => matches!(freshness, Freshness::MostRecent | Freshness::Any),
        };
        let resource = rt.store_resource();
        let list_options = ListOptions {
            namespace: namespace.clone(),
            ..ListOptions::default()
        };
        let list = |what: &'static str| {
            let store = Arc::clone(&self.store);
            let resource = resource.clone();
            let list_options = list_options.clone();
            let rt = Arc::clone(&rt);
            async move {
                let listed = store
                    .list_encoded(&resource, &list_options)
                    .await
                    .map_err(|e| {
                        tracing::debug!(error = %e, what, "watch list failed");
                        ApiError::from_store(e, &rt, "")
                    })?;
                let items: Vec<Listed> = listed
                    .items
                    .into_iter()
                    .map(|stored| Listed::presented(&rt, stored))
                    .collect();
                Ok((items, listed.revision))
            }
        };

        let mut tracker = Tracker {
            selectors: selectors.clone(),
            held: HashSet::new(),
            replay_until: 0,
            replayed: HashSet::new(),
        };
        let mut initial_objects = Vec::new();
        let from = if initial {
            if let Freshness::NotOlderThan(rv) = freshness {
                wait_for_revision(self.store.as_ref(), rv).await?;
            }
            let (items, revision) = list("initial events").await?;
            for item in items.into_iter().filter(|i| selectors.matches(&i.object)) {
                if !selectors.is_empty() {
                    tracker.held.insert(key_of(&rt, &item.object));
                }
                initial_objects.push(item);
            }
            revision
        } else {
            let from = match freshness {
                Freshness::NotOlderThan(rv) | Freshness::Exact(rv) => rv,
                Freshness::MostRecent | Freshness::Any => self.store.revision(),
            };
            if !selectors.is_empty() {
                // Who matches now; see the module docs for the replay window before it.
                let (items, revision) = list("selector seed").await?;
                tracker.replay_until = revision;
                tracker.held = items
                    .iter()
                    .filter(|i| selectors.matches(&i.object))
                    .map(|i| key_of(&rt, &i.object))
                    .collect();
            }
            from
        };

        let guard = self.metrics.watch_opened();
        let events = match self
            .store
            .watch(&resource, namespace.as_deref(), from)
            .await
        {
            Ok(events) => events,
            Err(error @ StoreError::Expired { .. }) => {
                let line = event_line("ERROR", &ApiError::from_store(error, &rt, "").status());
                return Ok(stream_response(Body::from(line)));
            }
            Err(error) => return Err(ApiError::from_store(error, &rt, "")),
        };

        let timeout = watch_timeout(query.timeout_seconds, self.options.default_watch_timeout);
        let ticker = query.allow_watch_bookmarks.then(|| {
            let period = self.options.bookmark_interval.min(MAX_WATCH_TIMEOUT);
            let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            ticker
        });
        let mut state = State {
            rt: Arc::clone(&rt),
            output,
            user,
            events,
            pending: VecDeque::new(),
            tracker,
            encodings: Arc::clone(&self.event_encodings),
            store: Arc::clone(&self.store),
            shutdown: self.shutdown.clone(),
            deadline: Instant::now() + timeout,
            ticker,
            progress: from,
            previous_tick_revision: from,
            columns: true,
            done: false,
            _guard: guard,
            _slot: slot,
        };
        for item in &initial_objects {
            state.push_object("ADDED", item);
        }
        if query.send_initial_events == Some(true) {
            state.push_bookmark(from, true);
        }
        let stream = futures::stream::unfold(state, State::next);
        Ok(stream_response(Body::from_stream(stream)))
    }
}

/// Longest a watch stays open (one day), whatever `timeoutSeconds` asks: any `u64` is a
/// valid query, and the deadline is a clock reading. A client that wants more re-watches,
/// as it does after kube-apiserver's own timeouts.
pub const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How long a watch runs: `timeoutSeconds` when positive, else the server's default, both
/// cut to [`MAX_WATCH_TIMEOUT`].
fn watch_timeout(timeout_seconds: Option<u64>, default: Duration) -> Duration {
    match timeout_seconds {
        Some(seconds) if seconds > 0 => Duration::from_secs(seconds),
        _ => default,
    }
    .min(MAX_WATCH_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: EventType, name: &str, phase: &str, revision: Revision) -> WatchEvent {
        WatchEvent {
            event_type,
            key: ObjectKey::new("namespaces", "", name),
            object: Arc::new(json!({"metadata": {"name": name}, "status": {"phase": phase}})),
            json: None,
            revision,
        }
    }

    fn tracker(replay_until: Revision, held: &[&str]) -> Tracker {
        let rt = ResourceType::namespace();
        Tracker {
            selectors: Selectors::parse(None, Some("status.phase=Active"), &rt).unwrap(),
            held: held
                .iter()
                .map(|n| ObjectKey::new("namespaces", "", *n))
                .collect(),
            replay_until,
            replayed: HashSet::new(),
        }
    }

    #[test]
    fn watch_timeouts_are_cut_to_the_maximum() {
        let default = Duration::from_secs(1800);
        assert_eq!(watch_timeout(None, default), default);
        assert_eq!(watch_timeout(Some(0), default), default);
        assert_eq!(watch_timeout(Some(5), default), Duration::from_secs(5));
        for huge in [i64::MAX as u64, u64::MAX, MAX_WATCH_TIMEOUT.as_secs() + 1] {
            assert_eq!(watch_timeout(Some(huge), default), MAX_WATCH_TIMEOUT);
        }
        assert_eq!(watch_timeout(None, Duration::MAX), MAX_WATCH_TIMEOUT);
    }

    #[test]
    fn selector_transitions() {
        let mut t = tracker(0, &[]);
        assert_eq!(
            t.classify(&event(EventType::Added, "a", "Pending", 1)),
            None
        );
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Active", 2)),
            Some("ADDED")
        );
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Active", 3)),
            Some("MODIFIED")
        );
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Terminating", 4)),
            Some("DELETED")
        );
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Pending", 5)),
            None
        );
        assert_eq!(
            t.classify(&event(EventType::Deleted, "a", "Pending", 6)),
            None
        );
        assert_eq!(
            t.classify(&event(EventType::Added, "b", "Active", 7)),
            Some("ADDED")
        );
        assert_eq!(
            t.classify(&event(EventType::Deleted, "b", "Active", 8)),
            Some("DELETED")
        );
    }

    #[test]
    fn replayed_events_err_on_the_side_of_deleting() {
        // Watching from 10 with the store at 20: "a" matched at 10 (client holds it) but not
        // at 20, so the seed does not know it.
        let mut t = tracker(20, &[]);
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Pending", 12)),
            Some("DELETED")
        );
        // Its next replayed event is certain again.
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "Pending", 13)),
            None
        );
        // After the window, unknown non-matching objects are not the client's.
        assert_eq!(
            t.classify(&event(EventType::Modified, "c", "Pending", 21)),
            None
        );
    }

    #[test]
    fn without_selectors_events_pass_through() {
        let mut t = Tracker {
            selectors: Selectors::default(),
            held: HashSet::new(),
            replay_until: 0,
            replayed: HashSet::new(),
        };
        assert_eq!(
            t.classify(&event(EventType::Added, "a", "x", 1)),
            Some("ADDED")
        );
        assert_eq!(
            t.classify(&event(EventType::Modified, "a", "x", 2)),
            Some("MODIFIED")
        );
        assert_eq!(
            t.classify(&event(EventType::Deleted, "a", "x", 3)),
            Some("DELETED")
        );
    }

    #[test]
    fn bookmarks() {
        let rt = ResourceType::lease();
        assert_eq!(
            bookmark(&rt, 5, false),
            json!({"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", "metadata": {"resourceVersion": "5"}})
        );
        assert_eq!(
            bookmark(&rt, 5, true)["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
    }
}
