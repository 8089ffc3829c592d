//! Memory rebuilt from what a backend holds: the cache, the change log and its floor (at open,
//! and on a reload when a shared database's log no longer reaches back far enough).

use std::fmt;
use std::sync::Arc;

use super::{EngineConfig, MAX_WATCH_BUFFER};
use crate::backend::Loaded;
use crate::cache::{Cache, Stored, encode};
use crate::changelog::ChangeLog;
use crate::watch::Budget;
use crate::{EventType, Revision, StoreError, WatchEvent};

/// Memory rebuilt from what a backend holds (at open, and when a shared database's change log
/// no longer reaches back to what this process last saw).
pub(super) struct Rebuilt {
    pub(super) cache: Cache,
    pub(super) log: ChangeLog,
    pub(super) revision: Revision,
    /// The change log's floor in memory.
    pub(super) floor: Revision,
}

/// The per-watch budget of `config`.
pub(super) fn watch_budget(config: &EngineConfig) -> Budget {
    Budget {
        events: config.watch_buffer.clamp(1, MAX_WATCH_BUFFER),
        bytes: config.watch_buffer_bytes.max(1),
    }
}

pub(super) fn rebuild(
    loaded: Loaded,
    config: &EngineConfig,
    info: &dyn fmt::Debug,
) -> Result<Rebuilt, StoreError> {
    let Loaded {
        objects,
        revision: loaded_revision,
        compacted,
        log: logged,
    } = loaded;
    let mut cache = Cache::default();
    let mut revision = loaded_revision;
    for loaded in objects {
        if !loaded.object.is_object() {
            return Err(StoreError::Database(format!(
                "corrupt object {} {}/{}: not a JSON object",
                loaded.key.resource, loaded.key.namespace, loaded.key.name
            )));
        }
        // Defensive: backends write the revision in the same transaction as the objects,
        // so this only matters for a database edited by hand.
        revision = revision.max(loaded.revision);
        // Re-encoded rather than kept as read, so the cached text is exactly what a write
        // makes (a row edited by hand may be formatted differently).
        let json = encode(&loaded.object)?;
        cache.apply(
            &loaded.key,
            EventType::Added,
            Stored {
                revision: loaded.revision,
                object: Arc::new(loaded.object),
                json,
            },
        );
    }
    let mut log = ChangeLog::new(config.log_capacity, config.log_capacity_bytes);
    // The log must reach from the floor to the present without a gap; otherwise it is of
    // no use and starts empty at the present.
    let mut floor = compacted.min(revision);
    let contiguous = logged.iter().zip(floor + 1..).all(|(c, r)| c.revision == r)
        && logged.last().map_or(floor, |c| c.revision) == revision;
    if contiguous {
        for change in logged {
            let json = encode(&change.object)?;
            log.push(Arc::new(WatchEvent {
                event_type: change.event_type,
                key: change.key,
                object: Arc::new(change.object),
                json: Some(json),
                revision: change.revision,
            }));
        }
        if let Some(trimmed) = log.trim() {
            floor = floor.max(trimmed);
        }
    } else {
        tracing::warn!(
            backend = ?info,
            floor,
            revision,
            logged = logged.len(),
            "persisted change log does not reach the current revision; watches start from the present"
        );
        floor = revision;
    }
    Ok(Rebuilt {
        cache,
        log,
        revision,
        floor,
    })
}
