//! [`CachedStore`]: the backend-independent store over a [`Backend`].
//!
//! - **Memory is the read path.** Every object is loaded at open into the [`Cache`]; `get`,
//!   `list` and `watch` never touch the backend, so they cost a lock and some `Arc` clones.
//! - **One writer task does every write (group commit).** Callers send a command over a bounded
//!   channel; the writer takes the first command plus everything queued behind it (up to
//!   `max_batch`), evaluates them in order ([`crate::metadata::evaluate`]) against memory plus an
//!   overlay of the earlier commands of the same batch, assigns consecutive revisions, encodes
//!   each written object once (outside the state lock), has the backend commit the batch in one
//!   transaction, and only then applies it to memory, appends it to the change log, publishes
//!   it to watchers and replies. Commands queue up while a commit runs, so the batch size grows
//!   with the load and throughput does not pay one fsync per write.
//! - **The change log is persisted** by the backend in the same transaction as the objects,
//!   and its compaction follows the in-memory one (in the next commit, or at once for an
//!   explicit [`crate::Store::compact`]). At open the log is rebuilt from the backend, so a watch
//!   from a recent revision resumes after a restart instead of answering `Expired`.
//!
//! Files: this one holds the configuration, the counters and the state the handles share
//! with the writer; `handle` (the [`CachedStore`] API and its [`crate::Store`]
//! implementation), `writer` (the writer task and group commit), `rebuild` (memory rebuilt
//! from the backend).

mod handle;
mod rebuild;
mod writer;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::backend::Backend;
use crate::cache::Cache;
use crate::changelog::ChangeLog;
use crate::watch::Fanout;
use writer::Command;

/// Default [`EngineConfig::watch_buffer_bytes`].
pub const DEFAULT_WATCH_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// Upper bounds for the configured sizes (the channels allocate or panic beyond sane values).
pub(super) const MAX_BATCH: usize = 1 << 16;
pub(super) const MAX_WATCH_BUFFER: usize = 1 << 24;
/// How long the writer waits for a command before it checks that the backend is reachable.
pub(super) const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of the engine, whatever the backend.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Maximum number of change-log events kept for watches. When the log grows past it, the
    /// oldest events are compacted away automatically (watches from there get
    /// [`crate::StoreError::Expired`]). Default 50 000.
    pub log_capacity: usize,
    /// Maximum memory, in bytes as estimated by [`crate::approx_bytes`], of the objects the
    /// change log holds. The oldest events are compacted away when either this or
    /// [`Self::log_capacity`] is exceeded, so a client rewriting a large object cannot make the
    /// log hold `log_capacity` copies of it. An event larger than the whole budget is compacted
    /// at once (live watchers still receive it). Default 64 MiB.
    pub log_capacity_bytes: usize,
    /// Maximum number of write commands committed in one transaction. Default 512; clamped to
    /// 1..=65 536.
    pub max_batch: usize,
    /// Number of live events a watcher may fall behind before it is cut: its queue is
    /// dropped and its stream yields [`crate::StoreError::Expired`] and ends (the client relists).
    /// Default 16 384; clamped to 1..=2^24.
    pub watch_buffer: usize,
    /// Bytes (of the events' JSON) a watcher may fall behind before it is cut, like
    /// [`Self::watch_buffer`]: a client that stops reading holds at most this much of the
    /// server's memory. One event larger than this still goes to a watcher with nothing
    /// queued. Default 8 MiB; at least 1.
    pub watch_buffer_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            log_capacity: 50_000,
            log_capacity_bytes: 64 * 1024 * 1024,
            max_batch: 512,
            watch_buffer: 16_384,
            watch_buffer_bytes: DEFAULT_WATCH_BUFFER_BYTES,
        }
    }
}

/// Counters of the write path, e.g. for metrics. Monotonic since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Transactions committed (one per batch that wrote something).
    pub commits: u64,
    /// Object writes (creates, updates, deletes) committed. `writes / commits` is the mean
    /// group-commit batch size.
    pub writes: u64,
    /// Transactions that failed (every command of the batch got [`crate::StoreError::Database`]).
    pub failed_commits: u64,
    /// Time spent in the committed transactions (encoding and the backend's commit), in
    /// microseconds. `commit_micros / commits` is the mean commit latency.
    pub commit_micros: u64,
    /// Watches cut because their client fell more than [`EngineConfig::watch_buffer`]
    /// events or [`EngineConfig::watch_buffer_bytes`] bytes behind.
    pub watches_cut: u64,
}

/// The [`crate::Store`] over backend `B`. Cheap to clone: clones share one backend, one writer task
/// and one in-memory state.
///
/// Dropping the last clone stops the writer once queued commands are done;
/// [`CachedStore::close`] does it explicitly and waits for it.
pub struct CachedStore<B: Backend> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for CachedStore<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// Held by store handles only. Not reachable from the writer task, so dropping the last
/// handle drops `commands`, which ends the writer.
pub(super) struct Inner<B: Backend> {
    shared: Arc<Shared>,
    /// [`Backend::shared`].
    shared_db: bool,
    commands: mpsc::Sender<Command<B>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    info: B::Info,
}

/// State shared by the handles and the writer task.
pub(super) struct Shared {
    state: RwLock<State>,
    /// Latest committed revision. Only stored under the `state` write lock (so a reader holding
    /// the read lock sees it consistent with the cache), readable lock-free.
    revision: AtomicU64,
    /// Oldest revision a watch may start from. Same locking rule as `revision`. In its own `Arc`
    /// because watch streams need it and must not keep `Shared` (and thereby the event sender)
    /// alive.
    compacted: Arc<AtomicU64>,
    commits: AtomicU64,
    writes: AtomicU64,
    failed_commits: AtomicU64,
    commit_micros: AtomicU64,
    /// Watches cut by fan-outs replaced since (by reloads).
    watches_cut_before: AtomicU64,
    /// False while the backend answers [`StoreError::Unavailable`] (see
    /// [`CachedStore::is_available`]).
    available: std::sync::atomic::AtomicBool,
}

pub(super) struct State {
    cache: Cache,
    log: ChangeLog,
    /// Live fan-out: one bounded queue per watch. Closed with the store, which ends every
    /// watch stream. Events are shared (`Arc`) so that a watcher pays a deep copy only for the
    /// events it delivers. Replaced on a reload (the old one's streams end).
    fanout: Arc<Fanout>,
}
impl Shared {
    // Poisoning is ignored: only the writer takes the write lock, and if it panicked it is gone
    // (writes answer `Closed`); readers may still serve what is there.
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }
}
