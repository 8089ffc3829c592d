//! Versioned object store for rlark.
//!
//! Objects are JSON documents (Kubernetes-shaped: `apiVersion`, `kind`, `metadata`, ...)
//! addressed by [`ObjectKey`]. Every successful write takes the next value of one global,
//! monotonic revision (like etcd); that revision is written into the object's
//! `metadata.resourceVersion` as a decimal string. A change log of recent events feeds
//! watches; watching from a revision older than the log answers [`StoreError::Expired`].
//!
//! Layers, one concept per module:
//! - [`Store`] (here): the contract the API server is written against.
//! - `metadata`: the Kubernetes metadata rules (validation, uid, creationTimestamp,
//!   generation, no-op updates, preconditions, resourceVersion), pure functions.
//! - `engine` ([`CachedStore`]): the backend-independent store: group-commit writer, the
//!   in-memory object cache (`cache`), the change log (`changelog`) and the watch fan-out
//!   (`watch`).
//! - `backend` ([`Backend`]): what a persistence backend implements: load everything at start,
//!   commit a batch (objects + change log + revision) atomically and durably, compact the log.
//! - `sqlite` ([`SqliteBackend`], [`SqliteStore`]): the SQLite backend (the default).
//! - `postgres` ([`PostgresBackend`], [`PostgresStore`]): the PostgreSQL backend (one server
//!   per database).
//! - `sql`: row encoding shared by the two.
//!
//! Contract for every [`Store`] (checked by the conformance suite, `conformance`: compiled
//! into this crate's own tests, and for other crates' tests behind the cargo feature
//! `conformance`, off by default so that no product build carries it):
//! - The object must be a JSON object whose `metadata.name` equals the key's name, and whose
//!   `metadata.namespace` equals the key's namespace (absent, null or `""` for cluster-scoped
//!   keys); otherwise [`StoreError::InvalidObject`].
//! - `create` fills `metadata.uid` (random UUID v4, unless already set), `metadata.creationTimestamp`
//!   (RFC 3339, seconds precision, UTC, e.g. `2026-11-30T04:00:00Z`), `metadata.generation = 1`
//!   and `resourceVersion`. A `resourceVersion` sent by the caller is ignored.
//! - `update` keeps `uid` and `creationTimestamp` of the stored object (whatever the caller sent),
//!   sets `generation` to the stored one, plus one when something outside `metadata` and `status`
//!   (and `apiVersion`/`kind`) changed, and does not write at all (returns the stored object, same
//!   revision, no event) when the new object equals the stored one apart from `resourceVersion`.
//!   The precondition is the `expected` argument only; the body's `resourceVersion` is ignored
//!   (the API server parses it and passes it as `expected`).
//! - `delete` returns the last stored state with `resourceVersion` = the deletion's revision;
//!   the `Deleted` event carries the same object.
//! - Revisions are strictly increasing across all resources. ([`CachedStore`] hands them out
//!   densely, +1 per write; callers must not rely on that.)
//! - A write is durable before it is acknowledged. A write whose caller stopped waiting (future
//!   dropped) may still be applied.
//! - Watches: events with revision > `from`, in revision order, each exactly once: first the
//!   ones still in the change log, then live ones. `from < compacted_revision()` is
//!   [`StoreError::Expired`]; a `from` beyond the current revision is allowed. A stream that
//!   falls too far behind ([`EngineConfig::watch_buffer`] events or
//!   [`EngineConfig::watch_buffer_bytes`] bytes not taken yet) is cut: what it had queued is
//!   released at once, and it yields one `Err(Expired)` and ends (answer 410: the client relists
//!   and watches again from the list's revision). A stream also ends (`None`) when the store closes.
//! - The change log is persisted with the objects and bounded by a compaction window
//!   ([`EngineConfig::log_capacity`] events and [`EngineConfig::log_capacity_bytes`] bytes), so
//!   after a restart a watch from any revision the window still holds resumes where it
//!   stopped, with no relist. `from = 0` is not "from the beginning" once anything was
//!   compacted; the API server maps Kubernetes' `resourceVersion=0` / unset ("any"/"most
//!   recent") to a list at the current revision followed by a watch from it.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod backend;
pub mod backup;
mod cache;
mod changelog;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
mod engine;
mod error;
pub mod metadata;
#[cfg(test)]
#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;
#[cfg(test)]
#[path = "../../../tests/support/pg_cluster.rs"]
mod pg_cluster;
mod postgres;
mod sql;
mod sqlite;
mod watch;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

pub use backend::{Backend, Change, Loaded, LoadedObject, LoggedChange, Remote};
pub use changelog::{ChangeLogStats, approx_bytes};
pub use engine::{CachedStore, DEFAULT_WATCH_BUFFER_BYTES, EngineConfig, StoreStats};
pub use error::StoreError;
pub use postgres::{PgDurability, PgTarget, PostgresBackend, PostgresStore, PostgresStoreConfig};
pub use sqlite::{Durability, SqliteBackend, SqliteStore, SqliteStoreConfig};

/// A global store revision. Revision 0 means "nothing written yet".
pub type Revision = u64;

/// Address of one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Resource name qualified by group, e.g. `jobs.rlinf.io`, `namespaces` (core), `leases.coordination.k8s.io`.
    pub resource: String,
    /// Namespace, or the empty string for cluster-scoped resources.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl ObjectKey {
    pub fn new(
        resource: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            resource: resource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// Kind of change carried by a [`WatchEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change. For `Deleted` the object is the last stored state with `resourceVersion`
/// set to the revision of the deletion (as Kubernetes does).
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub event_type: EventType,
    pub key: ObjectKey,
    pub object: Arc<Value>,
    /// `serde_json::to_string(&*object)`, byte for byte, when the backend keeps encodings (the
    /// [`CachedStore`] always does; it made it for the write). Shared, not copied, by every
    /// watcher, so a reader that sends the object as JSON can copy these bytes instead of
    /// encoding the object again.
    pub json: Option<Arc<str>>,
    pub revision: Revision,
}

/// An object with its JSON encoding (see [`Store::list_encoded`]).
#[derive(Clone, Debug)]
pub struct EncodedObject {
    pub object: Arc<Value>,
    /// `serde_json::to_string(&*object)`, byte for byte.
    pub json: Arc<str>,
}

impl EncodedObject {
    /// Encode `object` (for backends that keep no encodings, and for tests).
    pub fn encode(object: Arc<Value>) -> Result<Self, StoreError> {
        let json = serde_json::to_string(&*object)
            .map_err(|e| StoreError::Database(format!("serializing object: {e}")))?;
        Ok(Self {
            object,
            json: Arc::from(json),
        })
    }
}

/// A page of a list, in key order (namespace, then name). Items are the objects
/// ([`Store::list`]) or the objects with their encodings ([`Store::list_encoded`]).
#[derive(Clone, Debug)]
pub struct ListResult<T = Arc<Value>> {
    pub items: Vec<T>,
    /// Store revision at which the list was read.
    pub revision: Revision,
    /// Set when `limit` cut the list and more items follow: the key of the last item returned,
    /// whose `(namespace, name)` is the `start_after` of the next page. Pages are read from the
    /// live state, each at its own revision (no snapshot across pages, unlike etcd): an object
    /// created behind the cursor during paging is missed, one created ahead of it is included.
    pub continue_after: Option<ObjectKey>,
    /// Number of items after this page (when `continue_after` is set).
    pub remaining: u64,
}

/// What a namespace holds: objects and the bytes of their JSON encodings (as stored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub objects: u64,
    pub bytes: u64,
}

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// `None` = all namespaces.
    pub namespace: Option<String>,
    /// Resume strictly after this key (namespace, name).
    pub start_after: Option<(String, String)>,
    /// Maximum number of items; `None` or 0 = no limit.
    pub limit: Option<usize>,
}

/// A stream of watch events. Ends when the store shuts down; yields `Err(Expired)` and
/// ends if the watcher fell too far behind to be served from the change log.
pub type WatchStream = futures::stream::BoxStream<'static, Result<WatchEvent, StoreError>>;

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Create; `AlreadyExists` if the key exists.
    async fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, StoreError>;

    /// Get the current object, `None` if absent.
    async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<Value>>, StoreError>;

    /// Replace. `expected` (a revision) must equal the stored `resourceVersion` when given,
    /// else `Conflict`. `NotFound` if absent.
    async fn update(
        &self,
        key: &ObjectKey,
        object: Value,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError>;

    /// Delete, returning the removed object (with the deletion revision). `expected` as for update.
    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError>;

    /// List objects of one resource.
    async fn list(&self, resource: &str, options: &ListOptions) -> Result<ListResult, StoreError>;

    /// [`Store::list`] with each object's JSON encoding, read at the same revision as the
    /// object (an encoding is never older or newer than the object it comes with). Backends
    /// that keep encodings in memory ([`CachedStore`]) hand out shared copies without encoding
    /// anything; this default encodes every item, so it is correct for any backend but saves
    /// nothing.
    async fn list_encoded(
        &self,
        resource: &str,
        options: &ListOptions,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        let listed = self.list(resource, options).await?;
        Ok(ListResult {
            items: listed
                .items
                .into_iter()
                .map(EncodedObject::encode)
                .collect::<Result<_, _>>()?,
            revision: listed.revision,
            continue_after: listed.continue_after,
            remaining: listed.remaining,
        })
    }

    /// [`Store::list_encoded`] as of an older `revision` (a consistent snapshot, like etcd's
    /// list at a revision): `Expired` when the store cannot tell the state then — below the
    /// change log's floor, or an object whose state then is older than the log. This default
    /// serves the current revision only.
    async fn list_encoded_at(
        &self,
        resource: &str,
        options: &ListOptions,
        revision: Revision,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        let listed = self.list_encoded(resource, options).await?;
        if listed.revision == revision {
            Ok(listed)
        } else {
            Err(StoreError::Expired {
                requested: revision,
                oldest: listed.revision,
            })
        }
    }

    /// Events for `resource` (optionally one namespace) with revision strictly greater than
    /// `from`. `Expired` if `from` is older than the change log still holds.
    async fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        from: Revision,
    ) -> Result<WatchStream, StoreError>;

    /// What `namespace` holds (`""` for cluster-scoped objects): of `resource`, or of
    /// every resource when `None`. From memory, kept with every write: cheap enough to ask
    /// before each write (for quotas).
    async fn usage(&self, namespace: &str, resource: Option<&str>) -> Result<Usage, StoreError>;

    /// Current (latest committed) revision.
    fn revision(&self) -> Revision;

    /// Drop change-log entries at or below `revision` (watches from below it get `Expired`).
    /// Never goes backwards; a revision above the current one is clamped to the current one.
    async fn compact(&self, revision: Revision) -> Result<(), StoreError>;

    /// Oldest revision a watch may start from (anything lower is `Expired`).
    fn compacted_revision(&self) -> Revision;

    /// Bring this process's view up to what other writers of a shared database have
    /// committed (server replicas on one PostgreSQL), before a read that must see them — a
    /// credential created a moment ago on another replica. Reads are otherwise served from
    /// memory, which follows the others within milliseconds. A no-op for stores with one
    /// writer (the default).
    async fn sync(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
