//! Watch streams: the change-log backlog first, then live events from the fan-out.
//!
//! **Fan-out.** Every watch has its own queue of the live events it has not taken yet
//! (shared `Arc`s, so a queued event costs a pointer unless nobody else holds it). The
//! writer pushes each committed event into the queues of the watches that select it
//! (indexed by resource), under the lock it publishes under. A watch whose queue passes
//! [`Budget::events`] events or [`Budget::bytes`] bytes (of the events' JSON: what the watch
//! would still have to send) is *cut* at once: its queue is emptied, so a client that stopped
//! reading stops holding memory then, not when it next reads or goes away; the stream
//! yields [`StoreError::Expired`] and ends, and the client relists and watches again, as
//! with kube-apiserver's watchers that do not keep up. A single event larger than the byte
//! budget still goes to a watch whose queue is empty (it would otherwise cut every watcher
//! of that resource).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use tokio::sync::Notify;

use crate::{ObjectKey, Revision, StoreError, WatchEvent, WatchStream};

/// Which events a watch delivers.
pub(crate) struct Filter {
    pub(crate) resource: String,
    pub(crate) namespace: Option<String>,
    /// Only events with a revision strictly greater than this.
    pub(crate) after: Revision,
}

impl Filter {
    pub(crate) fn matches(&self, event: &WatchEvent) -> bool {
        event.revision > self.after && self.selects(&event.key)
    }

    fn selects(&self, key: &ObjectKey) -> bool {
        key.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == key.namespace)
    }
}

/// How much one watch may have waiting before it is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budget {
    pub(crate) events: usize,
    pub(crate) bytes: usize,
}

/// Bytes an event counts against a watch's budget: its JSON, what the watch would send
/// (the engine always publishes events with their encoding).
fn queued_bytes(event: &WatchEvent) -> usize {
    event.json.as_ref().map_or(0, |json| json.len())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a queue takes no more events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Fell behind its budget: the stream yields `Expired` and ends.
    Cut,
    /// The store closed or reloaded: the stream delivers what is queued, then ends.
    Closed,
}

#[derive(Default)]
struct Queue {
    events: VecDeque<Arc<WatchEvent>>,
    /// Sum of [`queued_bytes`] of `events`.
    bytes: usize,
    end: Option<End>,
}

/// One watch's side of the fan-out.
struct Subscriber {
    filter: Filter,
    queue: Mutex<Queue>,
    ready: Notify,
}

/// The live fan-out: the queues of the open watches by resource.
pub(crate) struct Fanout {
    subscribers: Mutex<HashMap<String, Vec<Weak<Subscriber>>>>,
    budget: Budget,
    /// No new watches (the store is closed).
    closed: std::sync::atomic::AtomicBool,
    /// Watches cut since the store opened.
    cut: AtomicU64,
}

impl Fanout {
    pub(crate) fn new(budget: Budget) -> Self {
        Self {
            subscribers: Mutex::new(HashMap::new()),
            budget: Budget {
                events: budget.events.max(1),
                bytes: budget.bytes.max(1),
            },
            closed: std::sync::atomic::AtomicBool::new(false),
            cut: AtomicU64::new(0),
        }
    }

    /// Whether [`Fanout::end_all`] closed it.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Watches cut for falling behind, since this fan-out was made.
    pub(crate) fn cut_count(&self) -> u64 {
        self.cut.load(Ordering::Relaxed)
    }

    /// A stream of `backlog`, then the live events `filter` selects. Must be called under
    /// the lock [`Fanout::publish`] is called under, the one the backlog was read under, so
    /// every event is in exactly one of them. `Closed` once the store is closed.
    pub(crate) fn subscribe(
        &self,
        backlog: Vec<WatchEvent>,
        filter: Filter,
        compacted: Arc<AtomicU64>,
    ) -> Result<WatchStream, StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        let last = filter.after;
        let resource = filter.resource.clone();
        let subscriber = Arc::new(Subscriber {
            filter,
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
        });
        {
            let mut subscribers = lock(&self.subscribers);
            let list = subscribers.entry(resource).or_default();
            // Forget watches that ended (their queues are gone already).
            if list.len().is_power_of_two() {
                list.retain(|s| s.strong_count() > 0);
            }
            list.push(Arc::downgrade(&subscriber));
        }
        let watch = Watch {
            backlog: backlog.into_iter(),
            subscriber: Some(subscriber),
            last,
            compacted,
        };
        Ok(Box::pin(futures::stream::unfold(watch, Watch::next)))
    }

    /// Queue `event` for every watch that selects it, cutting those over their budget.
    pub(crate) fn publish(&self, event: &Arc<WatchEvent>) {
        let mut subscribers = lock(&self.subscribers);
        let Some(list) = subscribers.get_mut(&event.key.resource) else {
            return;
        };
        let bytes = queued_bytes(event);
        let mut ended = false;
        for weak in list.iter() {
            let Some(subscriber) = weak.upgrade() else {
                ended = true;
                continue;
            };
            if !subscriber.filter.matches(event) {
                continue;
            }
            let mut queue = lock(&subscriber.queue);
            if queue.end.is_some() {
                continue;
            }
            queue.events.push_back(Arc::clone(event));
            queue.bytes = queue.bytes.saturating_add(bytes);
            let over_bytes = queue.bytes > self.budget.bytes && queue.events.len() > 1;
            if over_bytes || queue.events.len() > self.budget.events {
                let (events, queued) = (queue.events.len(), queue.bytes);
                // Free what it held now: it may never read again.
                *queue = Queue {
                    end: Some(End::Cut),
                    ..Queue::default()
                };
                self.cut.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    resource = %subscriber.filter.resource,
                    namespace = subscriber.filter.namespace.as_deref().unwrap_or(""),
                    events,
                    queued_bytes = queued,
                    budget_events = self.budget.events,
                    budget_bytes = self.budget.bytes,
                    "watch cut: the client is not reading its events; it must relist"
                );
            }
            drop(queue);
            subscriber.ready.notify_one();
        }
        if ended {
            list.retain(|s| s.strong_count() > 0);
        }
    }

    /// End every open watch once it has delivered what is queued (the store reloaded or
    /// closed); with `close`, refuse new watches too.
    pub(crate) fn end_all(&self, close: bool) {
        if close {
            self.closed.store(true, Ordering::Release);
        }
        let subscribers = std::mem::take(&mut *lock(&self.subscribers));
        for subscriber in subscribers.values().flatten().filter_map(Weak::upgrade) {
            let mut queue = lock(&subscriber.queue);
            if queue.end.is_none() {
                queue.end = Some(End::Closed);
            }
            drop(queue);
            subscriber.ready.notify_one();
        }
    }
}

struct Watch {
    backlog: std::vec::IntoIter<WatchEvent>,
    /// `None` once the stream has ended.
    subscriber: Option<Arc<Subscriber>>,
    /// Revision of the last event delivered (or the start revision).
    last: Revision,
    compacted: Arc<AtomicU64>,
}

impl Watch {
    async fn next(mut self) -> Option<(Result<WatchEvent, StoreError>, Self)> {
        if let Some(event) = self.backlog.next() {
            self.last = event.revision;
            return Some((Ok(event), self));
        }
        loop {
            let subscriber = self.subscriber.as_ref()?;
            let step = {
                let mut queue = lock(&subscriber.queue);
                match queue.events.pop_front() {
                    Some(event) => {
                        queue.bytes = queue.bytes.saturating_sub(queued_bytes(&event));
                        Some(Ok(event))
                    }
                    None => queue.end.map(Err),
                }
            };
            match step {
                Some(Ok(event)) => {
                    self.last = event.revision;
                    return Some((Ok(Arc::unwrap_or_clone(event)), self));
                }
                Some(Err(End::Cut)) => {
                    // Rather than buffer without bound, end the stream: the client relists
                    // and watches again.
                    self.subscriber = None;
                    let error = StoreError::Expired {
                        requested: self.last,
                        oldest: self.compacted.load(Ordering::Acquire),
                    };
                    return Some((Err(error), self));
                }
                Some(Err(End::Closed)) => return None,
                // `notify_one` keeps a permit when nobody waits, so an event queued between
                // the check above and this wait is not missed.
                None => subscriber.ready.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventType;
    use futures::FutureExt as _;
    use futures::StreamExt as _;
    use serde_json::json;

    fn event(name: &str, revision: Revision, pad: usize) -> Arc<WatchEvent> {
        let object = json!({"metadata": {"name": name}, "pad": "x".repeat(pad)});
        Arc::new(WatchEvent {
            event_type: EventType::Modified,
            key: ObjectKey::new("things", "ns", name),
            json: Some(Arc::from(object.to_string())),
            object: Arc::new(object),
            revision,
        })
    }

    fn filter(resource: &str) -> Filter {
        Filter {
            resource: resource.into(),
            namespace: None,
            after: 0,
        }
    }

    fn fanout(events: usize, bytes: usize) -> Fanout {
        Fanout::new(Budget { events, bytes })
    }

    #[tokio::test]
    async fn a_watch_gets_its_events_in_order() {
        let fanout = fanout(100, 1 << 20);
        let mut stream = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        let mut other = fanout
            .subscribe(Vec::new(), filter("others"), Arc::default())
            .unwrap();
        for revision in 1..=3 {
            fanout.publish(&event("a", revision, 10));
        }
        for revision in 1..=3 {
            let got = stream.next().await.unwrap().unwrap();
            assert_eq!(got.revision, revision);
        }
        assert!(stream.next().now_or_never().is_none(), "nothing more yet");
        assert!(
            other.next().now_or_never().is_none(),
            "other resources see nothing"
        );
        assert_eq!(fanout.cut_count(), 0);
    }

    /// Issue 38, finding 2: a watcher that does not read is cut once its unsent bytes pass
    /// the budget, and what it held is released at once, before it reads again.
    #[tokio::test]
    async fn a_watch_over_its_byte_budget_is_cut_and_releases_its_events() {
        let fanout = fanout(1000, 10_000);
        let mut stalled = fanout
            .subscribe(Vec::new(), filter("things"), Arc::new(AtomicU64::new(7)))
            .unwrap();
        let mut reader = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        let first = event("a", 1, 4000);
        fanout.publish(&first);
        assert!(reader.next().await.unwrap().is_ok());
        for revision in 2..=3 {
            fanout.publish(&event("a", revision, 4000));
            assert!(reader.next().await.unwrap().is_ok());
        }
        // 3 × ~4 kB queued for the stalled watch: over 10 kB, cut; its queue is gone, so
        // nothing but this test holds the first event.
        assert_eq!(fanout.cut_count(), 1);
        assert_eq!(Arc::strong_count(&first), 1);
        match stalled.next().await {
            Some(Err(StoreError::Expired { requested, oldest })) => {
                assert_eq!((requested, oldest), (0, 7));
            }
            other => panic!("expected Expired, got {other:?}"),
        }
        assert!(
            stalled.next().await.is_none(),
            "the stream ends after Expired"
        );
        // The reader goes on.
        fanout.publish(&event("a", 4, 10));
        assert_eq!(reader.next().await.unwrap().unwrap().revision, 4);
    }

    #[tokio::test]
    async fn one_event_larger_than_the_budget_still_reaches_an_idle_watch() {
        let fanout = fanout(1000, 100);
        let mut stream = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        fanout.publish(&event("big", 1, 1000));
        assert_eq!(stream.next().await.unwrap().unwrap().revision, 1);
        assert_eq!(fanout.cut_count(), 0);
    }

    #[tokio::test]
    async fn a_watch_over_its_event_count_is_cut() {
        let fanout = fanout(2, 1 << 20);
        let mut stream = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        for revision in 1..=3 {
            fanout.publish(&event("a", revision, 1));
        }
        assert!(matches!(
            stream.next().await,
            Some(Err(StoreError::Expired { .. }))
        ));
        assert_eq!(fanout.cut_count(), 1);
    }

    #[tokio::test]
    async fn ending_delivers_what_is_queued_and_closing_refuses_new_watches() {
        let fanout = fanout(100, 1 << 20);
        let mut stream = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        fanout.publish(&event("a", 1, 1));
        fanout.end_all(false);
        assert_eq!(stream.next().await.unwrap().unwrap().revision, 1);
        assert!(stream.next().await.is_none());
        let mut again = fanout
            .subscribe(Vec::new(), filter("things"), Arc::default())
            .unwrap();
        fanout.end_all(true);
        assert!(again.next().await.is_none());
        assert!(matches!(
            fanout.subscribe(Vec::new(), filter("things"), Arc::default()),
            Err(StoreError::Closed)
        ));
    }

    #[tokio::test]
    async fn dropped_watches_are_forgotten() {
        let fanout = fanout(100, 1 << 20);
        for _ in 0..10 {
            drop(fanout.subscribe(Vec::new(), filter("things"), Arc::default()));
        }
        fanout.publish(&event("a", 1, 1));
        assert!(lock(&fanout.subscribers)["things"].is_empty());
    }
}
