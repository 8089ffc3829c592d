//! Watch event lines shared by every watcher that sends the same bytes.
//!
//! A write is delivered to every watcher of its resource. Without sharing, each watcher
//! encodes the event itself: with W watchers an event costs W encodings. Here the encoded
//! line (`{"type":...,"object":...}\n`) is made once per event and *rendering* — output
//! format (JSON, `Table`, `PartialObjectMetadata`), event type as this watcher sends it, and
//! the kind it is shown as (a projection shows the same stored event differently) — and
//! every other watcher that needs the same rendering gets the same [`Bytes`] (a reference
//! count, no copy). JSON lines of stored objects are not even encoded once: they are built
//! from the encoding the store made for the write ([`rlark_store::WatchEvent::json`]).
//!
//! Watchers receive an event at about the same time (they all read it from the store's
//! fan-out right after the write), so the lines are kept in a small cache keyed by the
//! event's revision (unique per event) and the rendering, bounded by bytes
//! ([`DEFAULT_BUDGET_BYTES`]) and evicted oldest-first. A watcher that comes to an event
//! after its line was evicted (one far behind, or replaying the change log) renders it again:
//! slower, never wrong. Concurrent watchers needing a line that is not there yet wait for the
//! one rendering it instead of rendering it too.
//!
//! Not shared: the first Table event of each watch (it carries the column definitions),
//! initial `ADDED` events from the watch's list, bookmarks and errors — each belongs to one
//! watcher.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use rlark_store::Revision;

/// Default bound of the bytes of lines kept ([`EventEncodings::new`]).
pub(crate) const DEFAULT_BUDGET_BYTES: usize = 16 * 1024 * 1024;

/// What a line depends on besides the event: see the module docs. Two watchers with equal
/// keys send equal bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Rendering {
    /// `crate::output::Output` as a small number (the cache does not interpret it).
    pub output: u8,
    /// The event type sent (`ADDED`, `MODIFIED`, `DELETED`), which selector transitions
    /// can change per watcher.
    pub event_type: &'static str,
    /// Whether the kind is a projection of the stored kind (the only way two kinds show
    /// the same stored event).
    pub projected: bool,
    /// For renderings that depend on the clock (a Table's ages): the second they were
    /// computed for; 0 otherwise. Lines of different seconds are different lines.
    pub second: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    revision: Revision,
    rendering: Rendering,
}

/// The shared lines (see the module docs). One per API server.
pub(crate) struct EventEncodings {
    entries: Mutex<Entries>,
    budget_bytes: usize,
    /// Lines rendered (misses): the encodings watchers did.
    renders: Counter,
    /// Lines served from the cache (hits): the encodings saved.
    shared: Counter,
}

#[derive(Default)]
struct Entries {
    /// Rendered or being rendered.
    slots: HashMap<Key, Arc<OnceLock<Bytes>>>,
    /// Rendered lines, oldest first, with their size.
    order: VecDeque<(Key, usize)>,
    bytes: usize,
}

impl EventEncodings {
    /// A cache keeping at most about `budget_bytes` of lines (always the newest one).
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            entries: Mutex::new(Entries::default()),
            budget_bytes,
            renders: Counter::default(),
            shared: Counter::default(),
        }
    }

    /// Register `rlark_apiserver_watch_event_encodings_total` (lines rendered) and
    /// `rlark_apiserver_watch_event_encodings_shared_total` (lines reused) into `registry`:
    /// their ratio says how many watchers one encoding served.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "rlark_apiserver_watch_event_encodings",
            "Watch event lines encoded (once per event and rendering, not per watcher)",
            self.renders.clone(),
        );
        registry.register(
            "rlark_apiserver_watch_event_encodings_shared",
            "Watch event lines sent from another watcher's encoding",
            self.shared.clone(),
        );
    }

    /// The line of the event at `revision` as `rendering`: shared if some watcher rendered it
    /// already, else rendered by `render` (once, however many watchers ask at the same time).
    /// `render` must be a function of the event and `rendering` only.
    pub(crate) fn line(
        &self,
        revision: Revision,
        rendering: Rendering,
        render: impl FnOnce() -> Bytes,
    ) -> Bytes {
        let key = Key {
            revision,
            rendering,
        };
        let slot = Arc::clone(self.lock().slots.entry(key).or_default());
        if let Some(line) = slot.get() {
            self.shared.inc();
            return line.clone();
        }
        let mut rendered = false;
        let line = slot
            .get_or_init(|| {
                rendered = true;
                render()
            })
            .clone();
        if rendered {
            self.renders.inc();
            self.account(key, line.len());
        } else {
            self.shared.inc();
        }
        line
    }

    /// Lines rendered so far (each a miss: the number of encodings watchers did).
    #[cfg(test)]
    pub(crate) fn renders(&self) -> u64 {
        self.renders.get()
    }

    /// Count a new line and evict the oldest ones beyond the budget.
    fn account(&self, key: Key, len: usize) {
        let mut entries = self.lock();
        entries.order.push_back((key, len));
        entries.bytes += len;
        while entries.bytes > self.budget_bytes && entries.order.len() > 1 {
            let Some((old, len)) = entries.order.pop_front() else {
                break;
            };
            entries.bytes -= len;
            entries.slots.remove(&old);
        }
    }

    // A panic while the lock is held leaves the maps consistent (every update is a single
    // insert or remove), so a poisoned lock is used as is.
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for EventEncodings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let entries = self.lock();
        f.debug_struct("EventEncodings")
            .field("lines", &entries.order.len())
            .field("bytes", &entries.bytes)
            .field("budget_bytes", &self.budget_bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendering(event_type: &'static str) -> Rendering {
        Rendering {
            output: 0,
            event_type,
            projected: false,
            second: 0,
        }
    }

    #[test]
    fn one_rendering_per_event_and_rendering() {
        let cache = EventEncodings::new(1024);
        let mut calls = 0;
        for _ in 0..10 {
            let line = cache.line(5, rendering("ADDED"), || {
                calls += 1;
                Bytes::from_static(b"five\n")
            });
            assert_eq!(line, "five\n");
        }
        assert_eq!((calls, cache.renders()), (1, 1));
        // Another event type, another revision: other lines.
        cache.line(5, rendering("DELETED"), || Bytes::from_static(b"x\n"));
        cache.line(6, rendering("ADDED"), || Bytes::from_static(b"y\n"));
        assert_eq!(cache.renders(), 3);
    }

    #[test]
    fn the_budget_evicts_the_oldest_lines() {
        let cache = EventEncodings::new(10);
        for revision in 1..=5 {
            cache.line(revision, rendering("ADDED"), || Bytes::from(vec![b'x'; 4]));
        }
        // 10 bytes hold two 4-byte lines: revisions 4 and 5.
        let renders = cache.renders();
        cache.line(5, rendering("ADDED"), || unreachable!("5 is kept"));
        cache.line(4, rendering("ADDED"), || unreachable!("4 is kept"));
        let again = cache.line(1, rendering("ADDED"), || Bytes::from_static(b"again"));
        assert_eq!(again, "again");
        assert_eq!(cache.renders(), renders + 1);
        let entries = cache.lock();
        assert!(entries.bytes <= 10, "{}", entries.bytes);
        assert_eq!(entries.slots.len(), entries.order.len());
    }

    #[test]
    fn a_line_larger_than_the_budget_is_still_served() {
        let cache = EventEncodings::new(2);
        let line = cache.line(1, rendering("ADDED"), || Bytes::from_static(b"larger"));
        assert_eq!(line, "larger");
    }
}
