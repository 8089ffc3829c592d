//! The change log: recent events in revision order, for watches that start in the past.
//!
//! Bounded by a number of events and by an estimated size in bytes; when either is exceeded
//! the oldest events are dropped and the compaction floor moves up to the newest dropped
//! revision (a watch from below the floor is `Expired`). The engine keeps it in memory and the
//! backend persists the same events, so after a restart the log is rebuilt and watches from a
//! recent revision resume.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use crate::cache::{Slot, States};
use crate::watch::Filter;
use crate::{EventType, Revision, WatchEvent};

/// What the change log holds right now (see `CachedStore::change_log`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChangeLogStats {
    /// Events in the log.
    pub events: u64,
    /// Their estimated size in bytes ([`approx_bytes`] of each event's object and key).
    pub bytes: u64,
}

/// Estimated heap size of a JSON value as this process holds it: the value nodes, string and
/// key bytes and a per-entry map overhead. Cheap (one walk, no allocation beyond the walk's
/// stack) and within a small factor of the real allocation, which is what the change-log
/// byte budget needs.
pub fn approx_bytes(value: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    // Key String, hash and index slots of the insertion-ordered map.
    const ENTRY: usize = std::mem::size_of::<String>() + 16;
    let mut total = 0usize;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        total = total.saturating_add(NODE);
        match value {
            Value::String(s) => total = total.saturating_add(s.len()),
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(map) => {
                for (key, item) in map {
                    total = total.saturating_add(ENTRY + key.len());
                    stack.push(item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    total
}

/// Estimated size of one event in the log: its object, its encoding and its key.
pub(crate) fn event_bytes(event: &WatchEvent) -> usize {
    approx_bytes(&event.object)
        + event.json.as_ref().map_or(0, |json| json.len())
        + event.key.resource.len()
        + event.key.namespace.len()
        + event.key.name.len()
        + std::mem::size_of::<WatchEvent>()
}

struct Entry {
    event: Arc<WatchEvent>,
    /// Estimated size, counted against `capacity_bytes`.
    bytes: usize,
}

pub(crate) struct ChangeLog {
    entries: VecDeque<Entry>,
    /// Sum of the entries' `bytes`.
    bytes: usize,
    capacity: usize,
    capacity_bytes: usize,
}

impl ChangeLog {
    pub(crate) fn new(capacity: usize, capacity_bytes: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            capacity,
            capacity_bytes,
        }
    }

    /// Append an event (revisions must increase).
    pub(crate) fn push(&mut self, event: Arc<WatchEvent>) {
        let bytes = event_bytes(&event);
        self.entries.push_back(Entry { event, bytes });
        self.bytes = self.bytes.saturating_add(bytes);
    }

    /// Drop the oldest events until both bounds hold; the revision of the newest dropped event
    /// (the new compaction floor), if any was dropped.
    pub(crate) fn trim(&mut self) -> Option<Revision> {
        let mut floor = None;
        while self.entries.len() > self.capacity || self.bytes > self.capacity_bytes {
            let Some(dropped) = self.entries.pop_front() else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(dropped.bytes);
            floor = Some(dropped.event.revision);
        }
        floor
    }

    /// Drop every event at or below `revision`.
    pub(crate) fn compact_to(&mut self, revision: Revision) {
        while self
            .entries
            .front()
            .is_some_and(|entry| entry.event.revision <= revision)
        {
            if let Some(dropped) = self.entries.pop_front() {
                self.bytes = self.bytes.saturating_sub(dropped.bytes);
            }
        }
    }

    /// The events `filter` selects, in revision order.
    pub(crate) fn backlog(&self, filter: &Filter) -> Vec<WatchEvent> {
        let first = self
            .entries
            .partition_point(|entry| entry.event.revision <= filter.after);
        self.entries
            .range(first..)
            .filter(|entry| filter.matches(&entry.event))
            .map(|entry| WatchEvent::clone(&entry.event))
            .collect()
    }

    /// The state at `revision` of every object of `resource` written after it, from the
    /// events the log holds (`revision` must not be below the log's floor): the object of
    /// the key's last event at or before `revision`, absent when that was a deletion or when
    /// the key's first later event is its creation. `None` when some key's state at
    /// `revision` is older than the log (its first later event modifies or deletes it and
    /// the log holds nothing of it before): that list cannot be served.
    pub(crate) fn states_at(&self, resource: &str, revision: Revision) -> Option<States> {
        let mut before: HashMap<Slot, &WatchEvent> = HashMap::new();
        let mut first_after: HashMap<Slot, EventType> = HashMap::new();
        for entry in &self.entries {
            let event = &*entry.event;
            if event.key.resource != resource {
                continue;
            }
            let slot = (event.key.namespace.clone(), event.key.name.clone());
            if event.revision <= revision {
                before.insert(slot, event);
            } else {
                first_after.entry(slot).or_insert(event.event_type);
            }
        }
        let mut states = HashMap::with_capacity(first_after.len());
        for (slot, first) in first_after {
            let state = match before.get(&slot) {
                Some(event) if event.event_type == EventType::Deleted => None,
                Some(event) => {
                    let json = match &event.json {
                        Some(json) => Arc::clone(json),
                        None => Arc::from(serde_json::to_string(&*event.object).ok()?),
                    };
                    Some((Arc::clone(&event.object), json))
                }
                None if first == EventType::Added => None,
                None => return None,
            };
            states.insert(slot, state);
        }
        Some(states)
    }

    pub(crate) fn stats(&self) -> ChangeLogStats {
        ChangeLogStats {
            events: self.entries.len() as u64,
            bytes: self.bytes as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn approx_bytes_counts_strings_and_structure() {
        let small = approx_bytes(&json!({"a": 1}));
        let big = approx_bytes(&json!({"a": "x".repeat(10_000)}));
        assert!(big >= 10_000 && big < 10_000 + 4 * small, "{small} {big}");
        let nested = approx_bytes(&json!([[[[1]]], {"k": [true, null]}]));
        assert!(nested > 6 * std::mem::size_of::<Value>(), "{nested}");
    }
}
