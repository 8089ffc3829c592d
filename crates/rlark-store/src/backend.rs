//! The persistence interface under [`crate::CachedStore`]: what a backend stores and loads.
//!
//! A backend knows nothing about Kubernetes metadata, watches or batching: the engine hands
//! it committed-to-be batches of [`Change`]s (already evaluated, numbered and encoded) and
//! reads everything back once at start. It must make a batch durable atomically (all or
//! nothing, on disk before `commit` returns) and persist the change log beside the objects,
//! so that after a restart watches resume from where the log still reaches.
//!
//! A **shared** backend ([`Backend::shared`]) may have other writers on the same database
//! (several server replicas). The engine then brackets every batch: [`Backend::begin_write`]
//! takes the database's write lock and reports what the others committed since this process
//! last saw it ([`Remote`]); the engine applies that to memory, evaluates the batch against it
//! and numbers it from there, and [`Backend::commit`] (or [`Backend::abort_write`]) ends the
//! transaction. Between batches it follows the others through [`Backend::remote_signal`] and
//! [`Backend::catch_up`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::{EventType, ObjectKey, Revision, StoreError};

/// One write of a batch.
pub struct Change {
    pub key: ObjectKey,
    pub event_type: EventType,
    pub revision: Revision,
    /// New state, or for deletions the last state with the deletion revision.
    pub object: Arc<Value>,
    /// `object` encoded (what the backend stores).
    pub json: Arc<str>,
}

/// One persisted change-log entry, as read back at start.
pub struct LoggedChange {
    pub key: ObjectKey,
    pub event_type: EventType,
    pub revision: Revision,
    pub object: Value,
}

/// One persisted object, as read back at start.
pub struct LoadedObject {
    pub key: ObjectKey,
    /// The revision that wrote it.
    pub revision: Revision,
    pub object: Value,
}

/// Everything a backend holds.
pub struct Loaded {
    pub objects: Vec<LoadedObject>,
    /// The latest committed revision.
    pub revision: Revision,
    /// The change log's floor: `log` holds every change above it, in revision order.
    pub compacted: Revision,
    pub log: Vec<LoggedChange>,
}

/// What other writers of a shared database committed after a given revision.
pub enum Remote {
    /// Nothing: the database's revision is the one asked about.
    UpToDate,
    /// Every change after it, in revision order, without a gap.
    Changes(Vec<LoggedChange>),
    /// The database's change log no longer reaches back that far: everything, reloaded.
    Reload(Loaded),
}

#[async_trait]
pub trait Backend: Send + Sized + 'static {
    /// What the backend reports about its durability settings (`CachedStore::backend_settings`).
    type Settings: Send + 'static;
    /// Static description (e.g. the database file), kept by the store for logs and `Debug`.
    type Info: fmt::Debug + Send + Sync + 'static;

    fn info(&self) -> Self::Info;

    /// Read everything back.
    async fn load(&mut self) -> Result<Loaded, StoreError>;

    /// Make one batch durable in one transaction (for a shared backend, the one
    /// [`Self::begin_write`] opened; a shared backend compacts its log itself and always gets
    /// `compact_to: None`): every change appended to the change log, the
    /// net effect per key applied to the objects, the revision set to the last change's; and,
    /// when `compact_to` is given, change-log entries at or below it dropped and the floor
    /// moved there. On error nothing of it may be visible.
    async fn commit(
        &mut self,
        changes: &[Change],
        compact_to: Option<Revision>,
    ) -> Result<(), StoreError>;

    /// Drop change-log entries at or below `revision` and move the floor there.
    async fn compact(&mut self, revision: Revision) -> Result<(), StoreError>;

    /// Restore: write `objects` (all `Added`, in revision order, each key once, each with the
    /// revision that wrote it, none above `revision`) into a store that holds nothing, and set
    /// the store's revision and its change log's floor to `revision` (the log starts empty).
    /// One transaction; when the store holds any object or revision, nothing is written and
    /// the error says so.
    async fn import(&mut self, objects: &[Change], revision: Revision) -> Result<(), StoreError>;

    /// Check that the database is reachable (reconnecting if need be); called by the engine
    /// when no write came for a while. [`StoreError::Unavailable`] when it is not.
    async fn check(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether other processes may write the same database (see the module documentation).
    /// Single-writer backends keep the defaults of the four methods below.
    fn shared(&self) -> bool {
        false
    }

    /// Shared backends: open a write transaction, take the database's write lock (held until
    /// [`Self::commit`] or [`Self::abort_write`]) and report what others committed after
    /// `known`. On error no transaction is left open, and none is for [`Remote::Reload`]
    /// either (the engine applies it and begins again).
    async fn begin_write(&mut self, _known: Revision) -> Result<Remote, StoreError> {
        Ok(Remote::UpToDate)
    }

    /// Shared backends: end a transaction begun by [`Self::begin_write`] without writing.
    async fn abort_write(&mut self) {}

    /// Shared backends: what others committed after `known`, read without the write lock.
    async fn catch_up(&mut self, _known: Revision) -> Result<Remote, StoreError> {
        Ok(Remote::UpToDate)
    }

    /// Shared backends: notified (coalesced) when another writer may have committed, so the
    /// engine calls [`Self::catch_up`] without waiting for its periodic check.
    fn remote_signal(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }

    /// The durability settings in force.
    async fn settings(&mut self) -> Result<Self::Settings, StoreError>;

    /// Release the database.
    async fn close(self);
}
