//! [`CachedStore`]: the backend-independent store over a [`Backend`].
//!
//! - **Memory is the read path.** Every object is loaded at open into the [`Cache`]; `get`,
//!   `list` and `watch` never touch the backend, so they cost a lock and some `Arc` clones.
//! - **One writer task does every write (group commit).** Callers send a command over a bounded
//!   channel; the writer takes the first command plus everything queued behind it (up to
//!   `max_batch`), evaluates them in order ([`metadata::evaluate`]) against memory plus an
//!   overlay of the earlier commands of the same batch, assigns consecutive revisions, encodes
//!   each written object once (outside the state lock), has the backend commit the batch in one
//!   transaction, and only then applies it to memory, appends it to the change log, publishes
//!   it to watchers and replies. Commands queue up while a commit runs, so the batch size grows
//!   with the load and throughput does not pay one fsync per write.
//! - **The change log is persisted** by the backend in the same transaction as the objects,
//!   and its compaction follows the in-memory one (in the next commit, or at once for an
//!   explicit [`Store::compact`]). At open the log is rebuilt from the backend, so a watch
//!   from a recent revision resumes after a restart instead of answering `Expired`.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use crate::backend::{Backend, Change, Loaded, Remote};
use crate::backup::{Snapshot, SnapshotObject};
use crate::cache::{Cache, Encoded, Stored, encode, page_of};
use crate::changelog::{ChangeLog, ChangeLogStats};
use crate::metadata::{self, Current, Op, Outcome};
use crate::watch::{Budget, Fanout, Filter};
use crate::{
    EncodedObject, EventType, ListOptions, ListResult, ObjectKey, Revision, Store, StoreError,
    Usage, WatchEvent, WatchStream,
};

/// Default [`EngineConfig::watch_buffer_bytes`].
pub const DEFAULT_WATCH_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// Upper bounds for the configured sizes (the channels allocate or panic beyond sane values).
const MAX_BATCH: usize = 1 << 16;
const MAX_WATCH_BUFFER: usize = 1 << 24;
/// How long the writer waits for a command before it checks that the backend is reachable.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of the engine, whatever the backend.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Maximum number of change-log events kept for watches. When the log grows past it, the
    /// oldest events are compacted away automatically (watches from there get
    /// [`StoreError::Expired`]). Default 50 000.
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
    /// dropped and its stream yields [`StoreError::Expired`] and ends (the client relists).
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
    /// Transactions that failed (every command of the batch got [`StoreError::Database`]).
    pub failed_commits: u64,
    /// Time spent in the committed transactions (encoding and the backend's commit), in
    /// microseconds. `commit_micros / commits` is the mean commit latency.
    pub commit_micros: u64,
    /// Watches cut because their client fell more than [`EngineConfig::watch_buffer`]
    /// events or [`EngineConfig::watch_buffer_bytes`] bytes behind.
    pub watches_cut: u64,
}

/// The [`Store`] over backend `B`. Cheap to clone: clones share one backend, one writer task
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
struct Inner<B: Backend> {
    shared: Arc<Shared>,
    /// [`Backend::shared`].
    shared_db: bool,
    commands: mpsc::Sender<Command<B>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    info: B::Info,
}

/// State shared by the handles and the writer task.
struct Shared {
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

struct State {
    cache: Cache,
    log: ChangeLog,
    /// Live fan-out: one bounded queue per watch. Closed with the store, which ends every
    /// watch stream. Events are shared (`Arc`) so that a watcher pays a deep copy only for the
    /// events it delivers. Replaced on a reload (the old one's streams end).
    fanout: Arc<Fanout>,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

struct Request {
    key: ObjectKey,
    op: Op,
    reply: Reply<Arc<Value>>,
}

enum Command<B: Backend> {
    Write(Request),
    Compact(Revision, Reply<()>),
    /// Catch up with other writers, then reply.
    Sync(Reply<()>),
    Settings(Reply<B::Settings>),
    Shutdown(oneshot::Sender<()>),
}

impl<B: Backend> Command<B> {
    /// Answer `Closed` (the writer is stopping).
    fn refuse(self, shutdown: &mut Vec<oneshot::Sender<()>>) {
        match self {
            Command::Write(request) => {
                let _ = request.reply.send(Err(StoreError::Closed));
            }
            Command::Compact(_, reply) | Command::Sync(reply) => {
                let _ = reply.send(Err(StoreError::Closed));
            }
            Command::Settings(reply) => {
                let _ = reply.send(Err(StoreError::Closed));
            }
            Command::Shutdown(done) => shutdown.push(done),
        }
    }
}

/// Memory rebuilt from what a backend holds (at open, and when a shared database's change log
/// no longer reaches back to what this process last saw).
struct Rebuilt {
    cache: Cache,
    log: ChangeLog,
    revision: Revision,
    /// The change log's floor in memory.
    floor: Revision,
}

/// The per-watch budget of `config`.
fn watch_budget(config: &EngineConfig) -> Budget {
    Budget {
        events: config.watch_buffer.clamp(1, MAX_WATCH_BUFFER),
        bytes: config.watch_buffer_bytes.max(1),
    }
}

fn rebuild(
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

impl<B: Backend> CachedStore<B> {
    /// Load everything `backend` holds into memory, rebuild the change log and start the writer
    /// task. Must be called inside a Tokio runtime.
    pub async fn start(mut backend: B, config: EngineConfig) -> Result<Self, StoreError> {
        let info = backend.info();
        let loaded = backend.load().await?;
        let persisted_floor = loaded.compacted;
        let Rebuilt {
            cache,
            log,
            revision,
            floor,
        } = rebuild(loaded, &config, &info)?;
        let log_stats = log.stats();

        let fanout = Arc::new(Fanout::new(watch_budget(&config)));
        let object_count = cache.len();
        let shared = Arc::new(Shared {
            state: RwLock::new(State { cache, log, fanout }),
            watches_cut_before: AtomicU64::new(0),
            revision: AtomicU64::new(revision),
            compacted: Arc::new(AtomicU64::new(floor)),
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            commit_micros: AtomicU64::new(0),
            available: std::sync::atomic::AtomicBool::new(true),
        });
        let max_batch = config.max_batch.clamp(1, MAX_BATCH);
        // Room for a few batches: enough to keep the writer busy, small enough to push back on
        // callers instead of queueing without bound.
        let (commands, rx) = mpsc::channel(max_batch.saturating_mul(4));
        let span = tracing::info_span!("store_writer", backend = ?info);
        let shared_db = backend.shared();
        let writer = Writer {
            shared_db,
            remote: backend.remote_signal(),
            backend,
            shared: Arc::clone(&shared),
            max_batch,
            // What the backend holds: it is brought up to `floor` by the first commit.
            persisted_floor,
            config,
        };
        let writer = tokio::spawn(writer.run(rx).instrument(span));
        tracing::info!(
            backend = ?info,
            objects = object_count,
            revision,
            compacted = floor,
            change_log_events = log_stats.events,
            "store opened"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                shared_db,
                commands,
                writer: Mutex::new(Some(writer)),
                info,
            }),
        })
    }

    /// The backend's description (e.g. its database file).
    pub fn backend_info(&self) -> &B::Info {
        &self.inner.info
    }

    /// The durability settings in force, as the backend reports them (read through the writer,
    /// which owns the connection). [`StoreError::Closed`] after [`Self::close`].
    pub async fn backend_settings(&self) -> Result<B::Settings, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Settings(reply)).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stop accepting writes, finish the ones already queued, end every watch stream and close
    /// the backend. Later writes and watches answer [`StoreError::Closed`]; `get` and `list`
    /// keep serving the last state. Idempotent.
    pub async fn close(&self) {
        let (done, done_rx) = oneshot::channel();
        if self.send(Command::Shutdown(done)).await.is_ok() {
            // An error only means the writer is already gone.
            let _ = done_rx.await;
        }
        let handle = self
            .inner
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle
            && let Err(e) = handle.await
        {
            tracing::error!(error = %e, "store writer task failed");
        }
    }

    /// Whether the backend is reachable: false from a write or a periodic check (every second
    /// without writes) that found the database unavailable, until one succeeds again (the
    /// backend reconnects by itself). Reads keep being served from memory meanwhile; writes
    /// answer [`StoreError::Unavailable`].
    pub fn is_available(&self) -> bool {
        self.inner.shared.available.load(Ordering::Acquire)
    }

    /// Write-path counters (for metrics and tests).
    pub fn stats(&self) -> StoreStats {
        let shared = &self.inner.shared;
        StoreStats {
            commits: shared.commits.load(Ordering::Relaxed),
            writes: shared.writes.load(Ordering::Relaxed),
            failed_commits: shared.failed_commits.load(Ordering::Relaxed),
            commit_micros: shared.commit_micros.load(Ordering::Relaxed),
            watches_cut: shared.watches_cut_before.load(Ordering::Relaxed)
                + shared.read().fanout.cut_count(),
        }
    }

    /// Size of the change log (for metrics and tests): bounded by
    /// [`EngineConfig::log_capacity`] events and [`EngineConfig::log_capacity_bytes`] bytes.
    pub fn change_log(&self) -> ChangeLogStats {
        self.inner.shared.read().log.stats()
    }

    /// Every object at the current revision, from memory (one read of the cache, so one
    /// consistent revision; nothing is encoded): what `rlark backup` saves from a running
    /// server.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.inner.shared.read();
        Snapshot {
            revision: self.inner.shared.revision.load(Ordering::Acquire),
            objects: state
                .cache
                .iter()
                .map(|(resource, (namespace, name), stored)| SnapshotObject {
                    key: ObjectKey::new(resource, namespace.as_str(), name.as_str()),
                    revision: stored.revision,
                    json: Arc::clone(&stored.json),
                })
                .collect(),
        }
    }

    async fn send(&self, command: Command<B>) -> Result<(), StoreError> {
        self.inner
            .commands
            .send(command)
            .await
            .map_err(|_| StoreError::Closed)
    }

    async fn submit(&self, key: &ObjectKey, op: Op) -> Result<Arc<Value>, StoreError> {
        let (reply, reply_rx) = oneshot::channel();
        let request = Request {
            key: key.clone(),
            op,
            reply,
        };
        self.send(Command::Write(request)).await?;
        // A dropped reply means the writer stopped before handling the command.
        reply_rx.await.map_err(|_| StoreError::Closed)?
    }

    fn page<T>(
        &self,
        resource: &str,
        options: &ListOptions,
        item: impl Fn(&Stored) -> T,
    ) -> ListResult<T> {
        let shared = &self.inner.shared;
        let state = shared.read();
        // Read under the same lock as the items: the writer stores it under the write lock.
        let revision = shared.revision.load(Ordering::Acquire);
        state.cache.page(resource, options, revision, item)
    }
}

impl<B: Backend> fmt::Debug for CachedStore<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachedStore")
            .field("backend", &self.inner.info)
            .field(
                "revision",
                &self.inner.shared.revision.load(Ordering::Acquire),
            )
            .finish_non_exhaustive()
    }
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

// ---------------------------------------------------------------------------------------------
// Writer

struct Writer<B: Backend> {
    backend: B,
    shared: Arc<Shared>,
    max_batch: usize,
    /// The change-log floor the backend holds (it may lag the in-memory one by a batch).
    persisted_floor: Revision,
    config: EngineConfig,
    /// [`Backend::shared`]: other processes write the same database.
    shared_db: bool,
    /// [`Backend::remote_signal`].
    remote: Option<Arc<tokio::sync::Notify>>,
}

/// Per request of a batch: `Ok(index into the written changes)` or the final answer.
type Outcomes = Vec<Result<usize, Result<Arc<Value>, StoreError>>>;

/// How many times a batch on a shared backend is begun again after the database became
/// unavailable under it (the reconnect happens in `begin_write`).
const SHARED_ATTEMPTS: usize = 2;

impl<B: Backend> Writer<B> {
    async fn run(mut self, mut rx: mpsc::Receiver<Command<B>>) {
        let mut commands = Vec::with_capacity(self.max_batch);
        let mut shutdown = Vec::new();
        // A private one for single-writer backends: never notified.
        let remote = self.remote.clone().unwrap_or_default();
        loop {
            commands.clear();
            // All three are cancel safe: `recv_many` loses no command, a `Notify` permit stays
            // stored until taken.
            tokio::select! {
                received = rx.recv_many(&mut commands, self.max_batch) => {
                    // Every handle is gone and the queue is empty.
                    if received == 0 {
                        break;
                    }
                }
                () = remote.notified() => {
                    self.catch_up().await;
                    continue;
                }
                () = tokio::time::sleep(HEALTH_CHECK_INTERVAL) => {
                    if self.shared_db {
                        // Also covers a notification that was lost (listener reconnecting).
                        self.catch_up().await;
                    } else {
                        let checked = self.backend.check().await;
                        self.note(&checked);
                    }
                    continue;
                }
            }
            let mut requests = Vec::with_capacity(commands.len());
            for command in commands.drain(..) {
                match command {
                    // Commands queued behind a shutdown are refused, like those sent after it.
                    command if !shutdown.is_empty() => command.refuse(&mut shutdown),
                    Command::Write(request) => requests.push(request),
                    Command::Compact(revision, reply) => {
                        // Writes queued before the compaction are committed first.
                        self.commit_batch(std::mem::take(&mut requests)).await;
                        let _ = reply.send(self.compact(revision).await);
                    }
                    Command::Settings(reply) => {
                        let _ = reply.send(self.backend.settings().await);
                    }
                    Command::Sync(reply) => {
                        // Writes queued before it are committed first (they catch up too).
                        self.commit_batch(std::mem::take(&mut requests)).await;
                        self.catch_up().await;
                        let _ = reply.send(Ok(()));
                    }
                    Command::Shutdown(done) => shutdown.push(done),
                }
            }
            self.commit_batch(requests).await;
            if !shutdown.is_empty() {
                rx.close();
                while let Ok(command) = rx.try_recv() {
                    command.refuse(&mut shutdown);
                }
                break;
            }
        }
        // Ends every watch stream and refuses new ones.
        self.shared.write().fanout.end_all(true);
        self.backend.close().await;
        tracing::info!("store writer stopped");
        for done in shutdown {
            let _ = done.send(());
        }
    }

    /// Track availability from the outcome of a backend call.
    fn note<T>(&self, outcome: &Result<T, StoreError>) {
        let available = !matches!(outcome, Err(StoreError::Unavailable(_)));
        let was = self.shared.available.swap(available, Ordering::AcqRel);
        match (was, available) {
            (true, false) => tracing::warn!(
                error = %outcome.as_ref().err().map(ToString::to_string).unwrap_or_default(),
                "store backend unavailable; writes are refused until it is back"
            ),
            (false, true) => tracing::info!("store backend available again"),
            _ => {}
        }
    }

    async fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        let shared = &self.shared;
        // Compacting past the present would make the current revision unwatchable.
        let target = revision.min(shared.revision.load(Ordering::Acquire));
        if target <= shared.compacted.load(Ordering::Acquire) {
            return Ok(());
        }
        self.backend.compact(target).await?;
        self.persisted_floor = target;
        let mut state = shared.write();
        state.log.compact_to(target);
        shared.compacted.store(target, Ordering::Release);
        Ok(())
    }

    /// Shared backends: follow what other writers committed.
    async fn catch_up(&mut self) {
        let known = self.shared.revision.load(Ordering::Acquire);
        let remote = self.backend.catch_up(known).await;
        self.note(&remote);
        match remote {
            Ok(remote) => {
                if let Err(e) = self.apply_remote(remote) {
                    tracing::error!(error = %e, "store catch-up failed");
                }
            }
            Err(e) => tracing::debug!(error = %e, "store catch-up failed"),
        }
    }

    /// Make what other writers committed visible here, as if this process had written it:
    /// memory, change log, watchers. A reload (the database's log no longer reaches back to
    /// this process's revision) replaces memory and ends every watch stream, whose clients
    /// then relist.
    fn apply_remote(&mut self, remote: Remote) -> Result<(), StoreError> {
        match remote {
            Remote::UpToDate => Ok(()),
            Remote::Changes(logged) => {
                let mut changes = Vec::with_capacity(logged.len());
                for change in logged {
                    let object = Arc::new(change.object);
                    changes.push(Change {
                        json: encode(&object)?,
                        key: change.key,
                        event_type: change.event_type,
                        revision: change.revision,
                        object,
                    });
                }
                tracing::debug!(
                    changes = changes.len(),
                    revision = changes.last().map_or(0, |c| c.revision),
                    "store caught up with other writers"
                );
                apply(&self.shared, &changes);
                Ok(())
            }
            Remote::Reload(loaded) => {
                let persisted_floor = loaded.compacted;
                let info = self.backend.info();
                let Rebuilt {
                    cache,
                    log,
                    revision,
                    floor,
                } = rebuild(loaded, &self.config, &info)?;
                tracing::warn!(
                    revision,
                    "store fell behind the database's change log; reloaded, watches restart"
                );
                let shared = &self.shared;
                let mut state = shared.write();
                state.cache = cache;
                state.log = log;
                // The old fan-out's streams end; new watches subscribe to the new one (unless
                // the store is closing).
                if !state.fanout.is_closed() {
                    state.fanout.end_all(false);
                    shared
                        .watches_cut_before
                        .fetch_add(state.fanout.cut_count(), Ordering::Relaxed);
                    state.fanout = Arc::new(Fanout::new(watch_budget(&self.config)));
                }
                shared.revision.store(revision, Ordering::Release);
                shared.compacted.store(floor, Ordering::Release);
                self.persisted_floor = persisted_floor;
                Ok(())
            }
        }
    }

    /// Evaluate `requests` in order against memory plus the effect of the earlier ones, numbering
    /// the writes from the revision after the current one; encode the writes.
    fn evaluate<'r>(
        &self,
        requests: impl Iterator<Item = (&'r ObjectKey, Op)>,
    ) -> Result<(Outcomes, Vec<Change>), StoreError> {
        let shared = &self.shared;
        let mut outcomes: Outcomes = Vec::new();
        // Evaluated writes, encoded after the lock is released.
        let mut written: Vec<(ObjectKey, EventType, Revision, Arc<Value>)> = Vec::new();
        {
            let state = shared.read();
            // Only this task changes `revision`, so it cannot move while we work.
            let mut next = shared.revision.load(Ordering::Acquire) + 1;
            // Effect of the earlier commands of this batch: `None` = deleted.
            let mut overlay: HashMap<&ObjectKey, Option<Current>> = HashMap::new();
            for (key, op) in requests {
                let current = match overlay.get(key) {
                    Some(entry) => entry.clone(),
                    None => state.cache.lookup(key).map(|stored| Current {
                        revision: stored.revision,
                        object: Arc::clone(&stored.object),
                    }),
                };
                match metadata::evaluate(key, op, current, next) {
                    Ok(Outcome::Write { event_type, object }) => {
                        let object = Arc::new(object);
                        let after = (event_type != EventType::Deleted).then(|| Current {
                            revision: next,
                            object: Arc::clone(&object),
                        });
                        overlay.insert(key, after);
                        outcomes.push(Ok(written.len()));
                        written.push((key.clone(), event_type, next, object));
                        next += 1;
                    }
                    Ok(Outcome::Unchanged(object)) => outcomes.push(Err(Ok(object))),
                    Err(e) => outcomes.push(Err(Err(e))),
                }
            }
        }
        // Encoded once here: the text goes to the backend, to memory and to the watch event.
        let mut changes = Vec::with_capacity(written.len());
        for (key, event_type, revision, object) in written {
            changes.push(Change {
                json: encode(&object)?,
                key,
                event_type,
                revision,
                object,
            });
        }
        Ok((outcomes, changes))
    }

    /// Evaluate, commit and apply one batch; reply to every request.
    async fn commit_batch(&mut self, requests: Vec<Request>) {
        if requests.is_empty() {
            return;
        }
        let commands = requests.len();
        let mut keys = Vec::with_capacity(commands);
        let mut ops = Vec::with_capacity(commands);
        let mut replies = Vec::with_capacity(commands);
        for Request { key, op, reply } in requests {
            keys.push(key);
            ops.push(op);
            replies.push(reply);
        }
        let started = Instant::now();
        let result = if self.shared_db {
            self.commit_shared(&keys, &ops).await
        } else {
            match self.evaluate(keys.iter().zip(ops)) {
                Ok((outcomes, changes)) => self
                    .commit_changes(&changes)
                    .await
                    .map(|()| (outcomes, changes)),
                Err(e) => Err(e),
            }
        };
        let (outcomes, changes) = match result {
            Ok(done) => done,
            Err(e) => {
                self.shared.failed_commits.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, commands, "store commit failed; batch rejected");
                // Every outcome was computed against writes that are now not happening, so none
                // of them can be trusted: the whole batch fails and memory stays as it was.
                let unavailable = matches!(e, StoreError::Unavailable(_));
                let message = match e {
                    StoreError::Unavailable(message) => message,
                    other => other.to_string(),
                };
                for reply in replies {
                    let error = if unavailable {
                        StoreError::Unavailable(message.clone())
                    } else {
                        StoreError::Database(message.clone())
                    };
                    let _ = reply.send(Err(error));
                }
                return;
            }
        };
        if !changes.is_empty() {
            let elapsed = started.elapsed();
            let shared = &self.shared;
            shared.commits.fetch_add(1, Ordering::Relaxed);
            shared.commit_micros.fetch_add(
                u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            shared
                .writes
                .fetch_add(changes.len() as u64, Ordering::Relaxed);
            tracing::debug!(
                commands,
                writes = changes.len(),
                revision = changes.last().map_or(0, |c| c.revision),
                commit_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                "group commit"
            );
            apply(shared, &changes);
        }
        for (reply, outcome) in replies.into_iter().zip(outcomes) {
            let answer = match outcome {
                Ok(index) => Ok(Arc::clone(&changes[index].object)),
                Err(answer) => answer,
            };
            // The caller may have given up waiting; the write stands anyway.
            let _ = reply.send(answer);
        }
    }

    /// Have the backend commit evaluated changes (nothing to do for none), carrying the
    /// change log's compaction along.
    async fn commit_changes(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        // A shared database's log is compacted by the backend's own background job (other
        // replicas may still need what this one's memory no longer holds).
        let floor = self.shared.compacted.load(Ordering::Acquire);
        let compact_to = (!self.shared_db && floor > self.persisted_floor).then_some(floor);
        let result = self.backend.commit(changes, compact_to).await;
        self.note(&result);
        if result.is_ok()
            && let Some(floor) = compact_to
        {
            self.persisted_floor = floor;
        }
        result
    }

    /// A batch on a shared backend: under the database's write lock, catch up with the other
    /// writers, evaluate against the result, commit. Begun again (once) when the database
    /// became unavailable under it: if that commit did land with its reply lost, the catch-up
    /// brings it back as a change from outside, and the batch is evaluated against it (a
    /// create then answers `AlreadyExists`, as after any ambiguous commit).
    async fn commit_shared(
        &mut self,
        keys: &[ObjectKey],
        ops: &[Op],
    ) -> Result<(Outcomes, Vec<Change>), StoreError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let known = self.shared.revision.load(Ordering::Acquire);
            let remote = self.backend.begin_write(known).await;
            self.note(&remote);
            let result = match remote {
                // The backend released the lock to reload; apply it and begin again.
                Ok(reload @ Remote::Reload(_)) => {
                    attempt -= 1;
                    self.apply_remote(reload)?;
                    continue;
                }
                Ok(remote) => self.commit_begun(remote, keys, ops).await,
                Err(e) => Err(e),
            };
            match result {
                Err(StoreError::Unavailable(message)) if attempt < SHARED_ATTEMPTS => {
                    tracing::warn!(error = %message, "store commit failed; beginning it again");
                }
                other => return other,
            }
        }
    }

    async fn commit_begun(
        &mut self,
        remote: Remote,
        keys: &[ObjectKey],
        ops: &[Op],
    ) -> Result<(Outcomes, Vec<Change>), StoreError> {
        // Cloned: a batch begun again is evaluated again.
        let evaluated = self
            .apply_remote(remote)
            .and_then(|()| self.evaluate(keys.iter().zip(ops.iter().cloned())));
        let (outcomes, changes) = match evaluated {
            Ok(evaluated) => evaluated,
            Err(e) => {
                self.backend.abort_write().await;
                return Err(e);
            }
        };
        if changes.is_empty() {
            self.backend.abort_write().await;
            return Ok((outcomes, changes));
        }
        self.commit_changes(&changes).await?;
        Ok((outcomes, changes))
    }
}

/// Make committed changes visible: memory, change log, watchers, revision — all under the
/// write lock, so readers and new watches see either none or all of the batch.
fn apply(shared: &Shared, changes: &[Change]) {
    let mut guard = shared.write();
    let state = &mut *guard;
    for change in changes {
        state.cache.apply(
            &change.key,
            change.event_type,
            Stored {
                revision: change.revision,
                object: Arc::clone(&change.object),
                json: Arc::clone(&change.json),
            },
        );
        let event = Arc::new(WatchEvent {
            event_type: change.event_type,
            key: change.key.clone(),
            object: Arc::clone(&change.object),
            json: Some(Arc::clone(&change.json)),
            revision: change.revision,
        });
        state.fanout.publish(&event);
        state.log.push(event);
    }
    if let Some(floor) = state.log.trim() {
        shared.compacted.fetch_max(floor, Ordering::AcqRel);
    }
    if let Some(last) = changes.last() {
        shared.revision.store(last.revision, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------------
// Store implementation

#[async_trait]
impl<B: Backend> Store for CachedStore<B> {
    async fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, StoreError> {
        let object = metadata::prepare_create(key, object)?;
        self.submit(key, Op::Create(object)).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<Value>>, StoreError> {
        let state = self.inner.shared.read();
        Ok(state
            .cache
            .lookup(key)
            .map(|stored| Arc::clone(&stored.object)))
    }

    async fn update(
        &self,
        key: &ObjectKey,
        mut object: Value,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError> {
        metadata::validate(key, &mut object)?;
        self.submit(key, Op::Update { object, expected }).await
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError> {
        self.submit(key, Op::Delete { expected }).await
    }

    async fn list(&self, resource: &str, options: &ListOptions) -> Result<ListResult, StoreError> {
        Ok(self.page(resource, options, |stored| Arc::clone(&stored.object)))
    }

    async fn list_encoded(
        &self,
        resource: &str,
        options: &ListOptions,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        Ok(self.page(resource, options, |stored| EncodedObject {
            object: Arc::clone(&stored.object),
            json: Arc::clone(&stored.json),
        }))
    }

    async fn list_encoded_at(
        &self,
        resource: &str,
        options: &ListOptions,
        revision: Revision,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        let shared = &self.inner.shared;
        let state = shared.read();
        // Read under the lock the writer stores them under: consistent with the log.
        let current = shared.revision.load(Ordering::Acquire);
        let oldest = shared.compacted.load(Ordering::Acquire);
        let encoded = |(object, json): &Encoded| EncodedObject {
            object: Arc::clone(object),
            json: Arc::clone(json),
        };
        if revision == current {
            return Ok(state.cache.page(resource, options, current, |stored| {
                encoded(&(Arc::clone(&stored.object), Arc::clone(&stored.json)))
            }));
        }
        let expired = StoreError::Expired {
            requested: revision,
            oldest,
        };
        if revision < oldest || revision > current {
            return Err(expired);
        }
        let Some(changed) = state.log.states_at(resource, revision) else {
            return Err(expired);
        };
        let view = state.cache.view_with(resource, changed);
        Ok(page_of(&view, resource, options, revision, encoded))
    }

    async fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        from: Revision,
    ) -> Result<WatchStream, StoreError> {
        let shared = &self.inner.shared;
        let filter = Filter {
            resource: resource.to_owned(),
            namespace: namespace.map(str::to_owned),
            after: from,
        };
        // Backlog and subscription under the lock the writer publishes under: every event is
        // either in the backlog or arrives through the fan-out, never both, never neither.
        let state = shared.read();
        let oldest = shared.compacted.load(Ordering::Acquire);
        if from < oldest {
            return Err(StoreError::Expired {
                requested: from,
                oldest,
            });
        }
        let backlog = state.log.backlog(&filter);
        state
            .fanout
            .subscribe(backlog, filter, Arc::clone(&shared.compacted))
    }

    async fn usage(&self, namespace: &str, resource: Option<&str>) -> Result<Usage, StoreError> {
        Ok(self.inner.shared.read().cache.usage(namespace, resource))
    }

    fn revision(&self) -> Revision {
        self.inner.shared.revision.load(Ordering::Acquire)
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Compact(revision, reply)).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    fn compacted_revision(&self) -> Revision {
        self.inner.shared.compacted.load(Ordering::Acquire)
    }

    async fn sync(&self) -> Result<(), StoreError> {
        if !self.inner.shared_db {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        self.send(Command::Sync(reply)).await?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}
