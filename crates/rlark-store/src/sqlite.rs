//! SQLite backend.
//!
//! Layout:
//! - **Memory is the read path.** Every object is loaded at open and kept in
//!   `HashMap<resource, BTreeMap<(namespace, name), _>>`; `get`, `list` and `watch` never touch
//!   SQLite, so they cost a lock and some `Arc` clones.
//! - **One writer task does every write (group commit).** Callers send a command over a bounded
//!   channel; the writer takes the first command plus everything queued behind it (up to
//!   `max_batch`), evaluates them in order against memory plus an overlay of the earlier commands
//!   of the same batch, assigns consecutive revisions, writes the successful ones in one SQLite
//!   transaction (one fsync), and only after the commit applies them to memory, appends them to
//!   the change log, publishes them to watchers and replies. Commands queue up while a commit's
//!   fsync runs, so the batch size grows with the load and throughput does not pay one fsync per
//!   write.
//! - **Each object's JSON encoding is kept beside it.** The writer encodes every written
//!   object once, outside the state lock, for the `objects` table anyway; the same text (an
//!   `Arc<str>`) is stored in memory and carried by the watch event, so
//!   [`Store::list_encoded`] and the API server's list and watch bodies copy it instead of
//!   encoding each object per request. It is replaced together with the object on every
//!   write (one `Stored` value under the write lock), so it can never be older than the object.
//!   Cost: one JSON copy per live object (roughly the object's wire size) plus one per change-log
//!   event, which counts against [`SqliteStoreConfig::log_capacity_bytes`].
//! - **Durability:** WAL journal with `synchronous=FULL`, so a committed transaction survives
//!   kill -9 and power loss; nothing is acknowledged before its commit.
//! - **Single process:** the database is opened with `locking_mode=EXCLUSIVE`, because the
//!   in-memory state is only correct if this process is the only writer. A second process
//!   opening the same file fails with [`StoreError::Database`] ("database is locked") after the
//!   busy timeout. The same holds for the `sqlite3` shell while the server runs.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::TryStreamExt;
use serde_json::{Map, Value};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous,
};
use sqlx::{Connection, Row};
use tokio::sync::{broadcast, mpsc, oneshot};
use tracing::Instrument;

use crate::{
    EncodedObject, EventType, ListOptions, ListResult, ObjectKey, Revision, Store, StoreError,
    WatchEvent, WatchStream,
};

/// Version of the on-disk schema written by this code (`meta` row `schema_version`).
const SCHEMA_VERSION: i64 = 1;

/// Upper bounds for the configured sizes (the channels allocate or panic beyond sane values).
const MAX_BATCH: usize = 1 << 16;
const MAX_WATCH_BUFFER: usize = 1 << 24;

/// Top-level fields whose changes do not bump `metadata.generation`.
const NON_SPEC_FIELDS: [&str; 4] = ["apiVersion", "kind", "metadata", "status"];

/// Settings of [`SqliteStore::open`].
#[derive(Clone, Debug)]
pub struct SqliteStoreConfig {
    /// The database file (e.g. `DATA_DIR/rlark.db`); created with its parent directory if absent.
    pub path: PathBuf,
    /// Maximum number of change-log events kept in memory for watches. When the log grows past
    /// it, the oldest events are compacted away automatically (watches from there get
    /// [`StoreError::Expired`]). Default 50 000.
    pub log_capacity: usize,
    /// Maximum memory, in bytes as estimated by [`approx_bytes`], of the objects the change log
    /// holds. The oldest events are compacted away when either this or [`Self::log_capacity`]
    /// is exceeded, so a client rewriting a large object cannot make the log hold
    /// `log_capacity` copies of it. An event larger than the whole budget is compacted at
    /// once (live watchers still receive it). Default 64 MiB.
    pub log_capacity_bytes: usize,
    /// Maximum number of write commands committed in one SQLite transaction. Default 512;
    /// clamped to 1..=65 536.
    pub max_batch: usize,
    /// Number of live events a watcher may fall behind before its stream yields
    /// [`StoreError::Expired`] and ends. Default 16 384; clamped to 1..=2^24.
    pub watch_buffer: usize,
    /// How long SQLite waits for a lock held by someone else before failing. Default 5 s.
    pub busy_timeout: Duration,
}

impl SqliteStoreConfig {
    /// Defaults for everything but the file.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            log_capacity: 50_000,
            log_capacity_bytes: 64 * 1024 * 1024,
            max_batch: 512,
            watch_buffer: 16_384,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// Counters of the write path, e.g. for metrics. Monotonic since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// SQLite transactions committed (one per batch that wrote something).
    pub commits: u64,
    /// Object writes (creates, updates, deletes) committed. `writes / commits` is the mean
    /// group-commit batch size.
    pub writes: u64,
    /// Transactions that failed (every command of the batch got [`StoreError::Database`]).
    pub failed_commits: u64,
}

/// The SQLite-backed [`Store`]. Cheap to clone: clones share one database, one writer task and
/// one in-memory state.
///
/// Dropping the last clone stops the writer once queued commands are done; [`SqliteStore::close`]
/// does it explicitly and waits for it.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

/// What the change log holds right now (see [`SqliteStore::change_log`]).
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

/// Held by store handles only. Not reachable from the writer task, so dropping the last
/// handle drops `commands`, which ends the writer.
struct Inner {
    shared: Arc<Shared>,
    commands: mpsc::Sender<Command>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    path: PathBuf,
}

/// State shared by the handles and the writer task.
struct Shared {
    state: RwLock<State>,
    /// Latest committed revision. Only stored under the `state` write lock (so a reader holding
    /// the read lock sees it consistent with `objects`), readable lock-free.
    revision: AtomicU64,
    /// Oldest revision a watch may start from. Same locking rule as `revision`. In its own `Arc`
    /// because watch streams need it and must not keep `Shared` (and thereby the event sender)
    /// alive.
    compacted: Arc<AtomicU64>,
    log_capacity: usize,
    log_capacity_bytes: usize,
    commits: AtomicU64,
    writes: AtomicU64,
    failed_commits: AtomicU64,
    /// Test hook: make commits fail (after the statements ran, before COMMIT).
    #[cfg(test)]
    fail_commits: std::sync::atomic::AtomicBool,
}

struct State {
    objects: HashMap<String, BTreeMap<(String, String), Stored>>,
    /// Recent events in revision order (revisions are dense: every write takes the next one).
    log: VecDeque<LogEntry>,
    /// Sum of the `bytes` of `log`.
    log_bytes: usize,
    /// Live fan-out. `None` once the store is closed, which ends every watch stream. Events are
    /// shared (`Arc`) so that a watcher pays a deep copy only for the events it delivers.
    events: Option<broadcast::Sender<Arc<WatchEvent>>>,
}

struct LogEntry {
    event: Arc<WatchEvent>,
    /// Estimated size, counted against `log_capacity_bytes`.
    bytes: usize,
}

#[derive(Clone)]
struct Stored {
    revision: Revision,
    object: Arc<Value>,
    /// `serde_json::to_string(&*object)`, made by the write that stored `object`.
    json: Arc<str>,
}

type Reply = oneshot::Sender<Result<Arc<Value>, StoreError>>;

enum Op {
    /// The object is already validated and carries uid, creationTimestamp and generation.
    Create(Value),
    /// The object is already validated.
    Update {
        object: Value,
        expected: Option<Revision>,
    },
    Delete {
        expected: Option<Revision>,
    },
}

struct Request {
    key: ObjectKey,
    op: Op,
    reply: Reply,
}

enum Command {
    Write(Request),
    Durability(oneshot::Sender<Result<Durability, StoreError>>),
    Shutdown(oneshot::Sender<()>),
}

/// The durability settings in force on the store's connection, as SQLite reports them
/// (`PRAGMA journal_mode`, `PRAGMA synchronous`). A crash test cannot see a missing fsync;
/// this can.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    /// `wal` when every commit goes through the write-ahead log.
    pub journal_mode: String,
    /// 0 OFF, 1 NORMAL, 2 FULL (fsync at every commit), 3 EXTRA.
    pub synchronous: i64,
}

/// Ask SQLite what is in force on `conn`.
async fn read_durability(conn: &mut SqliteConnection) -> Result<Durability, StoreError> {
    let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err("reading journal_mode"))?;
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .map_err(db_err("reading synchronous"))?;
    Ok(Durability {
        journal_mode: journal_mode.to_ascii_lowercase(),
        synchronous,
    })
}

/// A write accepted by evaluation, waiting for its commit.
struct Change {
    key: ObjectKey,
    event_type: EventType,
    revision: Revision,
    /// New state, or for deletions the last state with the deletion revision.
    object: Arc<Value>,
    /// `object` encoded; filled after evaluation, outside the state lock (empty until then).
    json: Arc<str>,
    /// Estimated size for the change log; filled with `json`.
    bytes: usize,
}

fn db_err(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| StoreError::Database(format!("{context}: {e}"))
}

fn to_db_int(revision: Revision) -> Result<i64, StoreError> {
    i64::try_from(revision)
        .map_err(|_| StoreError::Database(format!("revision {revision} exceeds SQLite INTEGER")))
}

fn from_db_int(value: i64, what: &str) -> Result<Revision, StoreError> {
    u64::try_from(value)
        .map_err(|_| StoreError::Database(format!("negative {what} {value} in database")))
}

impl SqliteStore {
    /// Open (or create) the database, migrate the schema, load every object into memory and
    /// start the writer task. Must be called inside a Tokio runtime.
    ///
    /// After open, the change log is empty: `compacted_revision() == revision()`, so watches from
    /// the current revision work and watches from older ones get [`StoreError::Expired`].
    pub async fn open(config: SqliteStoreConfig) -> Result<Self, StoreError> {
        if let Some(parent) = config.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| StoreError::Database(format!("creating {}: {e}", parent.display())))?;
        }
        let options = SqliteConnectOptions::new()
            .filename(&config.path)
            .create_if_missing(true)
            // Before journal_mode (sqlx orders the pragmas): WAL then needs no shared memory and
            // the exclusive lock is taken by the first access, i.e. during open.
            .locking_mode(SqliteLockingMode::Exclusive)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(config.busy_timeout);
        let mut conn = SqliteConnection::connect_with(&options)
            .await
            .map_err(|e| StoreError::Database(format!("opening {}: {e}", config.path.display())))?;
        migrate(&mut conn).await?;
        let (objects, revision) = load(&mut conn).await?;
        let object_count: usize = objects.values().map(BTreeMap::len).sum();

        let (events, _) = broadcast::channel(config.watch_buffer.clamp(1, MAX_WATCH_BUFFER));
        let shared = Arc::new(Shared {
            state: RwLock::new(State {
                objects,
                log: VecDeque::new(),
                log_bytes: 0,
                events: Some(events),
            }),
            revision: AtomicU64::new(revision),
            compacted: Arc::new(AtomicU64::new(revision)),
            log_capacity: config.log_capacity,
            log_capacity_bytes: config.log_capacity_bytes,
            commits: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            failed_commits: AtomicU64::new(0),
            #[cfg(test)]
            fail_commits: std::sync::atomic::AtomicBool::new(false),
        });
        let max_batch = config.max_batch.clamp(1, MAX_BATCH);
        // Room for a few batches: enough to keep the writer busy, small enough to push back on
        // callers instead of queueing without bound.
        let (commands, rx) = mpsc::channel(max_batch.saturating_mul(4));
        let span = tracing::info_span!("store_writer", path = %config.path.display());
        let writer =
            tokio::spawn(run_writer(conn, rx, Arc::clone(&shared), max_batch).instrument(span));
        tracing::info!(
            path = %config.path.display(),
            objects = object_count,
            revision,
            "store opened"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                commands,
                writer: Mutex::new(Some(writer)),
                path: config.path,
            }),
        })
    }

    /// The durability settings in force on the writer's connection (read through the writer,
    /// which holds the database's exclusive lock). [`StoreError::Closed`] after [`Self::close`].
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .commands
            .send(Command::Durability(reply))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }

    /// Stop accepting writes, finish the ones already queued, end every watch stream and close
    /// the database. Later writes and watches answer [`StoreError::Closed`]; `get` and `list`
    /// keep serving the last state. Idempotent.
    pub async fn close(&self) {
        let (done, done_rx) = oneshot::channel();
        if self
            .inner
            .commands
            .send(Command::Shutdown(done))
            .await
            .is_ok()
        {
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

    /// Write-path counters (for metrics and tests).
    pub fn stats(&self) -> StoreStats {
        let shared = &self.inner.shared;
        StoreStats {
            commits: shared.commits.load(Ordering::Relaxed),
            writes: shared.writes.load(Ordering::Relaxed),
            failed_commits: shared.failed_commits.load(Ordering::Relaxed),
        }
    }

    /// Size of the in-memory change log (for metrics and tests): bounded by
    /// [`SqliteStoreConfig::log_capacity`] events and
    /// [`SqliteStoreConfig::log_capacity_bytes`] bytes.
    pub fn change_log(&self) -> ChangeLogStats {
        let state = self.inner.shared.read();
        ChangeLogStats {
            events: state.log.len() as u64,
            bytes: state.log_bytes as u64,
        }
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    async fn submit(&self, key: &ObjectKey, op: Op) -> Result<Arc<Value>, StoreError> {
        let (reply, reply_rx) = oneshot::channel();
        let request = Request {
            key: key.clone(),
            op,
            reply,
        };
        self.inner
            .commands
            .send(Command::Write(request))
            .await
            .map_err(|_| StoreError::Closed)?;
        // A dropped reply means the writer stopped before handling the command.
        reply_rx.await.map_err(|_| StoreError::Closed)?
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
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

    #[cfg(test)]
    fn injected_failure(&self) -> Option<StoreError> {
        self.fail_commits
            .load(Ordering::Relaxed)
            .then(|| StoreError::Database("injected commit failure".into()))
    }

    #[cfg(not(test))]
    fn injected_failure(&self) -> Option<StoreError> {
        None
    }
}

impl State {
    fn lookup(&self, key: &ObjectKey) -> Option<&Stored> {
        self.objects
            .get(&key.resource)?
            .get(&(key.namespace.clone(), key.name.clone()))
    }
}

// ---------------------------------------------------------------------------------------------
// Schema and loading

async fn migrate(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await.map_err(db_err("begin migration"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(db_err("creating table meta"))?;
    let version: Option<i64> =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_err("reading schema version"))?;
    match version {
        None => {
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS objects (
                    resource TEXT NOT NULL,
                    namespace TEXT NOT NULL,
                    name TEXT NOT NULL,
                    revision INTEGER NOT NULL,
                    value TEXT NOT NULL,
                    PRIMARY KEY (resource, namespace, name)
                )",
            )
            .execute(&mut *tx)
            .await
            .map_err(db_err("creating table objects"))?;
            sqlx::query(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?1), ('revision', 0)
                 ON CONFLICT (key) DO NOTHING",
            )
            .bind(SCHEMA_VERSION)
            .execute(&mut *tx)
            .await
            .map_err(db_err("initializing meta"))?;
        }
        Some(SCHEMA_VERSION) => {}
        // Future migrations go here as `Some(n) if n < SCHEMA_VERSION`.
        Some(other) => {
            return Err(StoreError::Database(format!(
                "database schema version {other} is not supported (this build knows version {SCHEMA_VERSION})"
            )));
        }
    }
    tx.commit().await.map_err(db_err("committing migration"))
}

type ObjectMap = HashMap<String, BTreeMap<(String, String), Stored>>;

async fn load(conn: &mut SqliteConnection) -> Result<(ObjectMap, Revision), StoreError> {
    let meta_revision: Option<i64> =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_err("reading revision"))?;
    let mut revision = from_db_int(meta_revision.unwrap_or(0), "revision")?;
    let mut objects: ObjectMap = HashMap::new();
    let mut rows = sqlx::query("SELECT resource, namespace, name, revision, value FROM objects")
        .fetch(&mut *conn);
    while let Some(row) = rows.try_next().await.map_err(db_err("loading objects"))? {
        let resource: String = row.try_get(0).map_err(db_err("loading objects"))?;
        let namespace: String = row.try_get(1).map_err(db_err("loading objects"))?;
        let name: String = row.try_get(2).map_err(db_err("loading objects"))?;
        let object_revision: i64 = row.try_get(3).map_err(db_err("loading objects"))?;
        let text: String = row.try_get(4).map_err(db_err("loading objects"))?;
        let object_revision = from_db_int(object_revision, "object revision")?;
        let object: Value = serde_json::from_str(&text).map_err(|e| {
            StoreError::Database(format!("corrupt object {resource} {namespace}/{name}: {e}"))
        })?;
        if !object.is_object() {
            return Err(StoreError::Database(format!(
                "corrupt object {resource} {namespace}/{name}: not a JSON object"
            )));
        }
        // Defensive: the meta row is written in the same transaction as the objects, so this only
        // matters for a database edited by hand.
        revision = revision.max(object_revision);
        // Re-encoded rather than kept as read, so the cached text is exactly what a write makes
        // (a row edited by hand may be formatted differently).
        let json = encode(&object)?;
        objects.entry(resource).or_default().insert(
            (namespace, name),
            Stored {
                revision: object_revision,
                object: Arc::new(object),
                json,
            },
        );
    }
    Ok((objects, revision))
}

// ---------------------------------------------------------------------------------------------
// Writer

async fn run_writer(
    mut conn: SqliteConnection,
    mut rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
    max_batch: usize,
) {
    let mut commands = Vec::with_capacity(max_batch);
    let mut shutdown = Vec::new();
    loop {
        commands.clear();
        // 0 means every handle is gone and the queue is empty.
        if rx.recv_many(&mut commands, max_batch).await == 0 {
            break;
        }
        let mut requests = Vec::with_capacity(commands.len());
        for command in commands.drain(..) {
            match command {
                // Commands queued behind a shutdown are refused, like those sent after it.
                Command::Write(request) if !shutdown.is_empty() => {
                    let _ = request.reply.send(Err(StoreError::Closed));
                }
                Command::Write(request) => requests.push(request),
                Command::Durability(reply) if !shutdown.is_empty() => {
                    let _ = reply.send(Err(StoreError::Closed));
                }
                Command::Durability(reply) => {
                    let _ = reply.send(read_durability(&mut conn).await);
                }
                Command::Shutdown(done) => shutdown.push(done),
            }
        }
        if !requests.is_empty() {
            process_batch(&mut conn, &shared, requests).await;
        }
        if !shutdown.is_empty() {
            rx.close();
            while let Ok(command) = rx.try_recv() {
                match command {
                    Command::Write(request) => {
                        let _ = request.reply.send(Err(StoreError::Closed));
                    }
                    Command::Durability(reply) => {
                        let _ = reply.send(Err(StoreError::Closed));
                    }
                    Command::Shutdown(done) => shutdown.push(done),
                }
            }
            break;
        }
    }
    // Dropping the sender ends every watch stream.
    shared.write().events = None;
    if let Err(e) = conn.close().await {
        tracing::error!(error = %e, "closing database");
    }
    tracing::info!("store writer stopped");
    for done in shutdown {
        let _ = done.send(());
    }
}

/// Evaluate, commit and apply one batch; reply to every request.
async fn process_batch(conn: &mut SqliteConnection, shared: &Shared, requests: Vec<Request>) {
    let commands = requests.len();
    let mut replies = Vec::with_capacity(commands);
    // Per request: `Ok(index into changes)` or the final answer.
    let mut outcomes: Vec<Result<usize, Result<Arc<Value>, StoreError>>> =
        Vec::with_capacity(commands);
    let mut changes: Vec<Change> = Vec::new();
    {
        let state = shared.read();
        // Only this task changes `revision`, so it cannot move while we work.
        let mut next = shared.revision.load(Ordering::Acquire) + 1;
        // Effect of the earlier commands of this batch: `None` = deleted.
        let mut overlay: HashMap<ObjectKey, Option<Current>> = HashMap::new();
        for Request { key, op, reply } in requests {
            replies.push(reply);
            let current = match overlay.get(&key) {
                Some(entry) => entry.clone(),
                None => state.lookup(&key).map(|stored| Current {
                    revision: stored.revision,
                    object: Arc::clone(&stored.object),
                }),
            };
            match evaluate(&key, op, current, next) {
                Ok(Evaluated::Write(change)) => {
                    let after = match change.event_type {
                        EventType::Deleted => None,
                        EventType::Added | EventType::Modified => Some(Current {
                            revision: change.revision,
                            object: Arc::clone(&change.object),
                        }),
                    };
                    overlay.insert(key, after);
                    outcomes.push(Ok(changes.len()));
                    changes.push(change);
                    next += 1;
                }
                Ok(Evaluated::Unchanged(object)) => outcomes.push(Err(Ok(object))),
                Err(e) => outcomes.push(Err(Err(e))),
            }
        }
    }

    if !changes.is_empty() {
        let started = Instant::now();
        // Encoded once here: the text goes to the table, to memory and to the watch event.
        let result = match encode_changes(&mut changes) {
            Ok(()) => persist(conn, &changes, shared.injected_failure()).await,
            Err(e) => Err(e),
        };
        let elapsed = started.elapsed();
        if let Err(e) = result {
            shared.failed_commits.fetch_add(1, Ordering::Relaxed);
            tracing::error!(error = %e, commands, "store commit failed; batch rejected");
            // Every outcome was computed against writes that are now not happening, so none of
            // them can be trusted: the whole batch fails and memory stays as it was.
            for reply in replies {
                let _ = reply.send(Err(StoreError::Database(e.to_string())));
            }
            return;
        }
        shared.commits.fetch_add(1, Ordering::Relaxed);
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

/// Fill each change's `json` and `bytes` (outside the state lock: readers are not held up).
fn encode_changes(changes: &mut [Change]) -> Result<(), StoreError> {
    for change in changes {
        change.json = encode(&change.object)?;
        change.bytes = approx_bytes(&change.object)
            + change.json.len()
            + change.key.resource.len()
            + change.key.namespace.len()
            + change.key.name.len()
            + std::mem::size_of::<WatchEvent>();
    }
    Ok(())
}

/// The one JSON encoding of a stored object (what the table, lists and watches carry).
fn encode(object: &Value) -> Result<Arc<str>, StoreError> {
    serde_json::to_string(object)
        .map(Arc::from)
        .map_err(|e| StoreError::Database(format!("serializing object: {e}")))
}

/// Write the net effect of `changes` and the new revision in one transaction.
async fn persist(
    conn: &mut SqliteConnection,
    changes: &[Change],
    injected_failure: Option<StoreError>,
) -> Result<(), StoreError> {
    // Several changes of one key in a batch: only the last one reaches the table.
    let mut last: HashMap<&ObjectKey, &Change> = HashMap::with_capacity(changes.len());
    for change in changes {
        last.insert(&change.key, change);
    }
    let revision = changes.last().map_or(0, |c| c.revision);

    let mut tx = conn.begin().await.map_err(db_err("begin"))?;
    for change in last.into_values() {
        let key = &change.key;
        match change.event_type {
            EventType::Deleted => {
                sqlx::query(
                    "DELETE FROM objects WHERE resource = ?1 AND namespace = ?2 AND name = ?3",
                )
                .bind(key.resource.as_str())
                .bind(key.namespace.as_str())
                .bind(key.name.as_str())
                .execute(&mut *tx)
                .await
                .map_err(db_err("delete"))?;
            }
            EventType::Added | EventType::Modified => {
                sqlx::query(
                    "INSERT INTO objects (resource, namespace, name, revision, value)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (resource, namespace, name)
                     DO UPDATE SET revision = excluded.revision, value = excluded.value",
                )
                .bind(key.resource.as_str())
                .bind(key.namespace.as_str())
                .bind(key.name.as_str())
                .bind(to_db_int(change.revision)?)
                .bind(&*change.json)
                .execute(&mut *tx)
                .await
                .map_err(db_err("upsert"))?;
            }
        }
    }
    sqlx::query("UPDATE meta SET value = ?1 WHERE key = 'revision'")
        .bind(to_db_int(revision)?)
        .execute(&mut *tx)
        .await
        .map_err(db_err("updating revision"))?;
    if let Some(e) = injected_failure {
        // Dropping `tx` rolls back, exactly as after a failed statement.
        return Err(e);
    }
    tx.commit().await.map_err(db_err("commit"))
}

/// Make committed changes visible: memory, change log, watchers, revision — all under the
/// write lock, so readers and new watches see either none or all of the batch.
fn apply(shared: &Shared, changes: &[Change]) {
    let mut guard = shared.write();
    let state = &mut *guard;
    let mut compacted = shared.compacted.load(Ordering::Acquire);
    for change in changes {
        let key = &change.key;
        let slot = (key.namespace.clone(), key.name.clone());
        match change.event_type {
            EventType::Deleted => {
                if let Some(objects) = state.objects.get_mut(&key.resource) {
                    objects.remove(&slot);
                }
            }
            EventType::Added | EventType::Modified => {
                let stored = Stored {
                    revision: change.revision,
                    object: Arc::clone(&change.object),
                    json: Arc::clone(&change.json),
                };
                state
                    .objects
                    .entry(key.resource.clone())
                    .or_default()
                    .insert(slot, stored);
            }
        }
        let event = Arc::new(WatchEvent {
            event_type: change.event_type,
            key: key.clone(),
            object: Arc::clone(&change.object),
            json: Some(Arc::clone(&change.json)),
            revision: change.revision,
        });
        if let Some(events) = &state.events {
            // An error only means nobody is watching.
            let _ = events.send(Arc::clone(&event));
        }
        state.log.push_back(LogEntry {
            event,
            bytes: change.bytes,
        });
        state.log_bytes = state.log_bytes.saturating_add(change.bytes);
    }
    while state.log.len() > shared.log_capacity || state.log_bytes > shared.log_capacity_bytes {
        let Some(dropped) = state.log.pop_front() else {
            break;
        };
        state.log_bytes = state.log_bytes.saturating_sub(dropped.bytes);
        compacted = compacted.max(dropped.event.revision);
    }
    if let Some(last) = changes.last() {
        shared.revision.store(last.revision, Ordering::Release);
    }
    shared.compacted.store(compacted, Ordering::Release);
}

/// The state a command of a batch is evaluated against: memory, or an earlier command of the
/// same batch (whose encoding is not made yet, hence not a [`Stored`]).
#[derive(Clone)]
struct Current {
    revision: Revision,
    object: Arc<Value>,
}

enum Evaluated {
    Write(Change),
    /// No-op update: the stored object, unchanged.
    Unchanged(Arc<Value>),
}

/// Decide what `op` does to `current`, giving it `revision` if it writes.
fn evaluate(
    key: &ObjectKey,
    op: Op,
    current: Option<Current>,
    revision: Revision,
) -> Result<Evaluated, StoreError> {
    let check =
        |stored: Option<Current>, expected: Option<Revision>| -> Result<Current, StoreError> {
            let stored = stored.ok_or_else(|| StoreError::NotFound(key.clone()))?;
            match expected {
                Some(expected) if expected != stored.revision => Err(StoreError::Conflict {
                    key: key.clone(),
                    expected,
                    actual: stored.revision,
                }),
                _ => Ok(stored),
            }
        };
    match op {
        Op::Create(mut object) => {
            if current.is_some() {
                return Err(StoreError::AlreadyExists(key.clone()));
            }
            set_resource_version(&mut object, revision);
            Ok(Evaluated::Write(Change {
                key: key.clone(),
                event_type: EventType::Added,
                revision,
                object: Arc::new(object),
                json: Arc::from(""),
                bytes: 0,
            }))
        }
        Op::Update {
            mut object,
            expected,
        } => {
            let stored = check(current, expected)?;
            let old = &*stored.object;
            let generation = generation_of(old);
            let generation = if same_spec(old, &object) {
                generation
            } else {
                generation + 1
            };
            let old_meta = old.get("metadata").and_then(Value::as_object);
            if let Some(meta) = metadata_mut(&mut object) {
                for field in ["uid", "creationTimestamp"] {
                    match old_meta.and_then(|m| m.get(field)) {
                        Some(value) => {
                            meta.insert(field.to_owned(), value.clone());
                        }
                        None => {
                            meta.remove(field);
                        }
                    }
                }
                meta.insert("generation".to_owned(), Value::from(generation));
            }
            // Compare with the stored resourceVersion in place: equal means a no-op.
            set_resource_version(&mut object, stored.revision);
            if object == *old {
                return Ok(Evaluated::Unchanged(stored.object));
            }
            set_resource_version(&mut object, revision);
            Ok(Evaluated::Write(Change {
                key: key.clone(),
                event_type: EventType::Modified,
                revision,
                object: Arc::new(object),
                json: Arc::from(""),
                bytes: 0,
            }))
        }
        Op::Delete { expected } => {
            let stored = check(current, expected)?;
            let mut object = (*stored.object).clone();
            set_resource_version(&mut object, revision);
            Ok(Evaluated::Write(Change {
                key: key.clone(),
                event_type: EventType::Deleted,
                revision,
                object: Arc::new(object),
                json: Arc::from(""),
                bytes: 0,
            }))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Object metadata helpers

/// `metadata` of an object, created if absent; `None` only for a non-object, which never reaches
/// the writer (validated on the way in, checked at load).
fn metadata_mut(object: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = object
        .as_object_mut()?
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

fn set_resource_version(object: &mut Value, revision: Revision) {
    if let Some(meta) = metadata_mut(object) {
        meta.insert(
            "resourceVersion".to_owned(),
            Value::String(revision.to_string()),
        );
    }
}

fn generation_of(object: &Value) -> i64 {
    object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// Whether two objects agree on every top-level field outside [`NON_SPEC_FIELDS`].
fn same_spec(a: &Value, b: &Value) -> bool {
    fn spec(v: &Value) -> impl Iterator<Item = (&String, &Value)> {
        v.as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !NON_SPEC_FIELDS.contains(&k.as_str()))
    }
    spec(a).count() == spec(b).count() && spec(a).all(|(k, v)| b.get(k) == Some(v))
}

/// Check the shape of an incoming object and that it names `key`; returns its metadata.
fn validate<'a>(
    key: &ObjectKey,
    object: &'a mut Value,
) -> Result<&'a mut Map<String, Value>, StoreError> {
    let invalid = |msg: String| Err(StoreError::InvalidObject(msg));
    if key.resource.is_empty() {
        return invalid("empty resource name".into());
    }
    if key.name.is_empty() {
        return invalid("empty object name".into());
    }
    let Some(fields) = object.as_object_mut() else {
        return invalid("not a JSON object".into());
    };
    let Some(Value::Object(meta)) = fields.get_mut("metadata") else {
        return invalid("metadata must be an object".into());
    };
    match meta.get("name") {
        Some(Value::String(name)) if *name == key.name => {}
        other => {
            return invalid(format!(
                "metadata.name is {}, expected {:?}",
                show(other),
                key.name
            ));
        }
    }
    let namespace_ok = match meta.get("namespace") {
        Some(Value::String(ns)) => *ns == key.namespace,
        None | Some(Value::Null) => key.namespace.is_empty(),
        Some(_) => false,
    };
    if !namespace_ok {
        let got = show(meta.get("namespace"));
        return if key.namespace.is_empty() {
            invalid(format!(
                "metadata.namespace is {got} on a cluster-scoped object"
            ))
        } else {
            invalid(format!(
                "metadata.namespace is {got}, expected {:?}",
                key.namespace
            ))
        };
    }
    Ok(meta)
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "missing".to_owned(), Value::to_string)
}

/// Validate and fill the create-time metadata (everything but resourceVersion, which the
/// writer assigns). Done on the caller's task to keep the writer's critical path short.
fn prepare_create(key: &ObjectKey, mut object: Value) -> Result<Value, StoreError> {
    let meta = validate(key, &mut object)?;
    let has_uid = match meta.get("uid") {
        None | Some(Value::Null) => false,
        Some(Value::String(uid)) => !uid.is_empty(),
        Some(other) => {
            return Err(StoreError::InvalidObject(format!(
                "metadata.uid is {other}, expected a string"
            )));
        }
    };
    if !has_uid {
        meta.insert(
            "uid".to_owned(),
            Value::String(uuid::Uuid::new_v4().to_string()),
        );
    }
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    meta.insert("creationTimestamp".to_owned(), Value::String(now));
    meta.insert("generation".to_owned(), Value::from(1));
    meta.remove("resourceVersion");
    Ok(object)
}

impl SqliteStore {
    /// One page of `resource` as `options` ask, each item made by `item` under the read lock
    /// (so it is as of the page's revision).
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
        let empty = ListResult {
            items: Vec::new(),
            revision,
            continue_after: None,
            remaining: 0,
        };
        let Some(objects) = state.objects.get(resource) else {
            return empty;
        };
        let start = options.start_after.clone();
        let (lower, namespace) = match (&options.namespace, start) {
            (None, None) => (Bound::Unbounded, None),
            (None, Some(after)) => (Bound::Excluded(after), None),
            (Some(ns), Some(after)) if after.0 == *ns => {
                (Bound::Excluded(after), Some(ns.as_str()))
            }
            // Resuming after a later namespace: nothing of `ns` is left.
            (Some(ns), Some(after)) if after.0 > *ns => return empty,
            (Some(ns), _) => (
                Bound::Included((ns.clone(), String::new())),
                Some(ns.as_str()),
            ),
        };
        let mut matching = objects
            .range::<(String, String), _>((lower, Bound::Unbounded))
            .take_while(|((ns, _), _)| namespace.is_none_or(|want| ns == want));
        let limit = options.limit.filter(|&l| l > 0).unwrap_or(usize::MAX);
        let mut items = Vec::new();
        let mut last = None;
        for (slot, stored) in matching.by_ref().take(limit) {
            items.push(item(stored));
            last = Some(slot);
        }
        let remaining = matching.count() as u64;
        let continue_after = match last {
            Some((ns, name)) if remaining > 0 => Some(ObjectKey::new(resource, ns, name)),
            _ => None,
        };
        ListResult {
            items,
            revision,
            continue_after,
            remaining,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Store implementation

#[async_trait]
impl Store for SqliteStore {
    async fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, StoreError> {
        let object = prepare_create(key, object)?;
        self.submit(key, Op::Create(object)).await
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<Value>>, StoreError> {
        let state = self.inner.shared.read();
        Ok(state.lookup(key).map(|stored| Arc::clone(&stored.object)))
    }

    async fn update(
        &self,
        key: &ObjectKey,
        mut object: Value,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError> {
        validate(key, &mut object)?;
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
        // either in the backlog or arrives on the receiver, never both, never neither.
        let (backlog, receiver) = {
            let state = shared.read();
            let oldest = shared.compacted.load(Ordering::Acquire);
            if from < oldest {
                return Err(StoreError::Expired {
                    requested: from,
                    oldest,
                });
            }
            let receiver = state.events.as_ref().ok_or(StoreError::Closed)?.subscribe();
            let first = state
                .log
                .partition_point(|entry| entry.event.revision <= from);
            let backlog: Vec<WatchEvent> = state
                .log
                .range(first..)
                .filter(|entry| filter.matches(&entry.event))
                .map(|entry| WatchEvent::clone(&entry.event))
                .collect();
            (backlog, receiver)
        };
        let watch = Watch {
            backlog: backlog.into_iter(),
            receiver: Some(receiver),
            filter,
            last: from,
            compacted: Arc::clone(&shared.compacted),
        };
        Ok(Box::pin(futures::stream::unfold(watch, Watch::next)))
    }

    fn revision(&self) -> Revision {
        self.inner.shared.revision.load(Ordering::Acquire)
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        let shared = &self.inner.shared;
        let mut state = shared.write();
        // Compacting past the present would make the current revision unwatchable.
        let target = revision.min(shared.revision.load(Ordering::Acquire));
        if target <= shared.compacted.load(Ordering::Acquire) {
            return Ok(());
        }
        while state
            .log
            .front()
            .is_some_and(|entry| entry.event.revision <= target)
        {
            if let Some(dropped) = state.log.pop_front() {
                state.log_bytes = state.log_bytes.saturating_sub(dropped.bytes);
            }
        }
        shared.compacted.store(target, Ordering::Release);
        Ok(())
    }

    fn compacted_revision(&self) -> Revision {
        self.inner.shared.compacted.load(Ordering::Acquire)
    }
}

// ---------------------------------------------------------------------------------------------
// Watch streams

struct Filter {
    resource: String,
    namespace: Option<String>,
    /// Only events with a revision strictly greater than this.
    after: Revision,
}

impl Filter {
    fn matches(&self, event: &WatchEvent) -> bool {
        event.revision > self.after
            && event.key.resource == self.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == event.key.namespace)
    }
}

struct Watch {
    backlog: std::vec::IntoIter<WatchEvent>,
    /// `None` once the stream has ended.
    receiver: Option<broadcast::Receiver<Arc<WatchEvent>>>,
    filter: Filter,
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
            let received = self.receiver.as_mut()?.recv().await;
            match received {
                Ok(event) if self.filter.matches(&event) => {
                    self.last = event.revision;
                    let event = Arc::unwrap_or_clone(event);
                    return Some((Ok(event), self));
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // The watcher fell `watch_buffer` events behind. Rather than buffer without
                    // bound, end the stream: the client relists and watches again.
                    self.receiver = None;
                    let error = StoreError::Expired {
                        requested: self.last,
                        oldest: self.compacted.load(Ordering::Acquire),
                    };
                    return Some((Err(error), self));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use futures::StreamExt;
    use serde_json::json;
    use tempfile::TempDir;

    use super::*;
    use crate::conformance;

    /// A crash test cannot see a missing fsync: assert what SQLite has in force.
    #[tokio::test]
    async fn commits_are_fsynced_through_the_write_ahead_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(SqliteStoreConfig::new(dir.path().join("rlark.db")))
            .await
            .expect("open store");
        let durability = store.durability().await.expect("durability");
        assert_eq!(
            durability,
            Durability {
                journal_mode: "wal".into(),
                synchronous: 2, // FULL
            }
        );
        store.close().await;
        assert!(matches!(store.durability().await, Err(StoreError::Closed)));
    }

    /// A store in its own temporary directory (removed on drop).
    struct TempStore {
        store: SqliteStore,
        _dir: TempDir,
    }

    impl TempStore {
        async fn new() -> Self {
            let dir = tempfile::tempdir().expect("temp dir");
            let config = SqliteStoreConfig::new(dir.path().join("rlark.db"));
            let store = SqliteStore::open(config).await.expect("open store");
            Self { store, _dir: dir }
        }
    }

    #[async_trait]
    impl Store for TempStore {
        async fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, StoreError> {
            self.store.create(key, object).await
        }
        async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<Value>>, StoreError> {
            self.store.get(key).await
        }
        async fn update(
            &self,
            key: &ObjectKey,
            object: Value,
            expected: Option<Revision>,
        ) -> Result<Arc<Value>, StoreError> {
            self.store.update(key, object, expected).await
        }
        async fn delete(
            &self,
            key: &ObjectKey,
            expected: Option<Revision>,
        ) -> Result<Arc<Value>, StoreError> {
            self.store.delete(key, expected).await
        }
        async fn list(
            &self,
            resource: &str,
            options: &ListOptions,
        ) -> Result<ListResult, StoreError> {
            self.store.list(resource, options).await
        }
        // Forwarded explicitly: the trait's default would encode, hiding the cache from the
        // conformance suite.
        async fn list_encoded(
            &self,
            resource: &str,
            options: &ListOptions,
        ) -> Result<ListResult<EncodedObject>, StoreError> {
            self.store.list_encoded(resource, options).await
        }
        async fn watch(
            &self,
            resource: &str,
            namespace: Option<&str>,
            from: Revision,
        ) -> Result<WatchStream, StoreError> {
            self.store.watch(resource, namespace, from).await
        }
        fn revision(&self) -> Revision {
            self.store.revision()
        }
        async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
            self.store.compact(revision).await
        }
        fn compacted_revision(&self) -> Revision {
            self.store.compacted_revision()
        }
    }

    const R: &str = "widgets.test.rlark.io";

    fn key(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(R, ns, name)
    }

    fn obj(k: &ObjectKey, spec: Value) -> Value {
        json!({
            "apiVersion": "test.rlark.io/v1",
            "kind": "Widget",
            "metadata": {"name": k.name, "namespace": k.namespace},
            "spec": spec,
        })
    }

    fn rv(o: &Value) -> Revision {
        o["metadata"]["resourceVersion"]
            .as_str()
            .expect("resourceVersion")
            .parse()
            .expect("number")
    }

    async fn open(path: &Path) -> SqliteStore {
        SqliteStore::open(SqliteStoreConfig::new(path))
            .await
            .expect("open store")
    }

    async fn next(stream: &mut WatchStream) -> Option<Result<WatchEvent, StoreError>> {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch timed out")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_suite() {
        conformance::run_all(TempStore::new).await;
    }

    /// Every event carries the write's encoding (deletes too), and after a reopen the cached
    /// encodings are rebuilt from the table.
    #[tokio::test]
    async fn encodings_are_carried_by_events_and_rebuilt_on_open() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = open(&path).await;
        let (a, b) = (key("ns", "a"), key("ns", "b"));
        let mut events = store.watch(R, None, store.revision()).await.unwrap();
        store.create(&a, obj(&a, json!({"n": "é"}))).await.unwrap();
        store.create(&b, obj(&b, json!({"n": 1}))).await.unwrap();
        store
            .update(&a, obj(&a, json!({"n": 2})), None)
            .await
            .unwrap();
        store.delete(&b, None).await.unwrap();
        for _ in 0..4 {
            let event = next(&mut events).await.unwrap().unwrap();
            let json = event
                .json
                .as_deref()
                .expect("SQLite events carry the encoding");
            assert_eq!(json, serde_json::to_string(&*event.object).unwrap());
        }
        let before = store
            .list_encoded(R, &ListOptions::default())
            .await
            .unwrap();
        store.close().await;
        drop(store);
        let store = open(&path).await;
        let after = store
            .list_encoded(R, &ListOptions::default())
            .await
            .unwrap();
        assert_eq!(after.items.len(), 1);
        assert_eq!(after.items[0].json, before.items[0].json);
        assert_eq!(
            &*after.items[0].json,
            serde_json::to_string(&*after.items[0].object).unwrap()
        );
        store.close().await;
    }

    #[tokio::test]
    async fn data_survives_close_and_reopen() {
        let dir = tempfile::tempdir().expect("temp dir");
        // A missing parent directory is created.
        let path = dir.path().join("data").join("rlark.db");
        let store = open(&path).await;
        let (a, b, c) = (
            key("ns", "a"),
            key("ns", "b"),
            ObjectKey::new("gadgets", "", "c"),
        );
        store
            .create(&a, obj(&a, json!({"v": 1})))
            .await
            .expect("create a");
        store
            .create(&b, obj(&b, json!({})))
            .await
            .expect("create b");
        let c_obj = json!({"kind": "Gadget", "metadata": {"name": "c"}});
        let c_stored = store.create(&c, c_obj).await.expect("create c");
        let a_stored = store
            .update(&a, obj(&a, json!({"v": 2})), None)
            .await
            .expect("update a");
        store.delete(&b, None).await.expect("delete b");
        let revision = store.revision();
        assert_eq!(revision, 5, "five writes on a fresh store");
        store.close().await;
        assert!(matches!(
            store.create(&b, obj(&b, json!({}))).await,
            Err(StoreError::Closed)
        ));

        let store = open(&path).await;
        assert_eq!(store.revision(), revision, "revision restored");
        assert_eq!(
            store.compacted_revision(),
            revision,
            "log starts empty after restart"
        );
        assert_eq!(
            store.get(&a).await.expect("get").as_deref(),
            Some(&*a_stored)
        );
        assert_eq!(
            store.get(&c).await.expect("get").as_deref(),
            Some(&*c_stored)
        );
        assert!(
            store.get(&b).await.expect("get").is_none(),
            "deleted object came back"
        );
        let listed = store.list(R, &ListOptions::default()).await.expect("list");
        assert_eq!(listed.items.len(), 1);
        assert_eq!(listed.revision, revision);

        match store.watch(R, None, revision - 1).await {
            Err(StoreError::Expired { requested, oldest }) => {
                assert_eq!((requested, oldest), (revision - 1, revision));
            }
            other => panic!(
                "watch from before the restart should be Expired, got {:?}",
                other.map(|_| ())
            ),
        }
        let mut stream = store
            .watch(R, None, revision)
            .await
            .expect("watch from current");
        let d = key("ns", "d");
        let d_stored = store
            .create(&d, obj(&d, json!({})))
            .await
            .expect("create d");
        assert_eq!(
            rv(&d_stored),
            revision + 1,
            "revision continues where it stopped"
        );
        let event = next(&mut stream)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!(
            (event.event_type, event.revision),
            (EventType::Added, revision + 1)
        );
        // A no-op update after restart is still a no-op (stored objects compare equal).
        let same = store
            .update(&a, (*a_stored).clone(), Some(rv(&a_stored)))
            .await
            .expect("noop");
        assert_eq!(rv(&same), rv(&a_stored));
        assert_eq!(store.revision(), revision + 1);
        store.close().await;

        // The schema is versioned and the revision is persisted in `meta`.
        let mut conn = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&path))
            .await
            .expect("raw connection");
        let version: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'schema_version'")
                .fetch_one(&mut conn)
                .await
                .expect("schema_version");
        assert_eq!(version, SCHEMA_VERSION);
        let stored: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'")
            .fetch_one(&mut conn)
            .await
            .expect("revision");
        assert_eq!(stored, 6);
        // A schema from the future is refused rather than misread.
        sqlx::query("UPDATE meta SET value = 99 WHERE key = 'schema_version'")
            .execute(&mut conn)
            .await
            .expect("bump schema version");
        conn.close().await.expect("close raw connection");
        match SqliteStore::open(SqliteStoreConfig::new(&path)).await {
            Err(StoreError::Database(msg)) => assert!(msg.contains("99"), "message: {msg}"),
            other => panic!("future schema should be refused, got {other:?}"),
        }
    }

    /// What a kill -9 leaves behind: the files as they are while the store runs. Every
    /// acknowledged write must be in them.
    #[tokio::test]
    async fn acknowledged_writes_are_on_disk_before_close() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = open(&path).await;
        for i in 0..20 {
            let k = key("ns", &format!("o{i}"));
            store
                .create(&k, obj(&k, json!({"i": i})))
                .await
                .expect("create");
        }
        let a = key("ns", "o0");
        store.delete(&a, None).await.expect("delete");
        let revision = store.revision();

        let snapshot = tempfile::tempdir().expect("temp dir");
        for entry in std::fs::read_dir(dir.path()).expect("read dir") {
            let entry = entry.expect("dir entry");
            std::fs::copy(entry.path(), snapshot.path().join(entry.file_name())).expect("copy");
        }
        let copy = open(&snapshot.path().join("rlark.db")).await;
        assert_eq!(copy.revision(), revision);
        let listed = copy.list(R, &ListOptions::default()).await.expect("list");
        assert_eq!(listed.items.len(), 19);
        assert!(copy.get(&a).await.expect("get").is_none());
        copy.close().await;
        store.close().await;
    }

    #[tokio::test]
    async fn group_commit_batches_concurrent_writes() {
        let store = TempStore::new().await;
        let store = Arc::new(store.store.clone());
        let handles: Vec<_> = (0..256)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let k = key("ns", &format!("o{i}"));
                    store.create(&k, obj(&k, json!({"i": i}))).await
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("task").expect("create");
        }
        let stats = store.stats();
        eprintln!("group commit: {stats:?}");
        assert_eq!(stats.writes, 256);
        assert_eq!(stats.failed_commits, 0);
        assert!(
            stats.commits >= 1 && stats.commits < stats.writes,
            "no batching: {stats:?}"
        );
        store.close().await;
    }

    /// Commands of one batch see each other: duplicates, preconditions and delete/re-create are
    /// decided against the earlier commands, with consecutive revisions, in one transaction.
    #[tokio::test(flavor = "current_thread")]
    async fn batch_sees_earlier_commands_of_the_same_batch() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = open(&path).await;
        let a = key("ns", "a");
        let base = store.revision();
        let mut stream = store.watch(R, None, base).await.expect("watch");
        // join_all polls every call once, in order, before this task yields: on a current-thread
        // runtime all five commands are queued before the writer runs, so they form one batch.
        let results = futures::future::join_all([
            store.create(&a, obj(&a, json!({"v": 1}))),
            store.create(&a, obj(&a, json!({"v": 99}))),
            store.update(&a, obj(&a, json!({"v": 2})), Some(base + 1)),
            store.delete(&a, Some(base + 2)),
            store.create(&a, obj(&a, json!({"v": 3}))),
        ])
        .await;
        assert_eq!(
            store.stats().commits,
            1,
            "one batch, one transaction: {:?}",
            store.stats()
        );
        let revisions: Vec<_> = results
            .iter()
            .map(|r| r.as_ref().map(|o| rv(o)).map_err(|e| format!("{e:?}")))
            .collect();
        assert_eq!(revisions[0], Ok(base + 1));
        assert!(
            matches!(&results[1], Err(StoreError::AlreadyExists(_))),
            "{:?}",
            results[1]
        );
        assert_eq!(revisions[2], Ok(base + 2));
        assert_eq!(revisions[3], Ok(base + 3));
        assert_eq!(revisions[4], Ok(base + 4));
        let expected = [
            (EventType::Added, 1),
            (EventType::Modified, 2),
            (EventType::Deleted, 2),
            (EventType::Added, 3),
        ];
        for (i, (event_type, v)) in expected.into_iter().enumerate() {
            let event = next(&mut stream)
                .await
                .expect("event")
                .expect("not an error");
            assert_eq!(
                (event.event_type, event.revision),
                (event_type, base + 1 + i as u64)
            );
            assert_eq!(event.object["spec"]["v"], json!(v));
        }
        let last = store.get(&a).await.expect("get").expect("present");
        assert_eq!(
            last["metadata"]["generation"],
            json!(1),
            "re-created object"
        );
        store.close().await;

        let store = open(&path).await;
        assert_eq!(
            store.get(&a).await.expect("get").as_deref(),
            Some(&*last),
            "net effect persisted"
        );
        assert_eq!(store.revision(), base + 4);
        store.close().await;
    }

    #[tokio::test]
    async fn failed_commit_fails_the_batch_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = Arc::new(open(&path).await);
        let a = key("ns", "a");
        let a_stored = store
            .create(&a, obj(&a, json!({"v": 1})))
            .await
            .expect("create a");
        let revision = store.revision();
        let mut stream = store.watch(R, None, revision).await.expect("watch");

        store
            .inner
            .shared
            .fail_commits
            .store(true, Ordering::Relaxed);
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    let b = key("ns", "b");
                    match i {
                        0 => store.create(&b, obj(&b, json!({}))).await,
                        1 => {
                            store
                                .update(
                                    &key("ns", "a"),
                                    obj(&key("ns", "a"), json!({"v": 2})),
                                    None,
                                )
                                .await
                        }
                        // Evaluated against the create of `b` earlier in the batch (if batched).
                        _ => store.delete(&b, None).await,
                    }
                })
            })
            .collect();
        for handle in handles {
            match handle.await.expect("task") {
                Err(StoreError::Database(_)) | Err(StoreError::NotFound(_)) => {}
                other => panic!("expected Database error, got {other:?}"),
            }
        }
        assert!(store.stats().failed_commits >= 1);
        assert_eq!(
            store.revision(),
            revision,
            "failed commit advanced the revision"
        );
        assert_eq!(
            store.get(&a).await.expect("get").as_deref(),
            Some(&*a_stored)
        );
        assert!(store.get(&key("ns", "b")).await.expect("get").is_none());
        assert!(
            tokio::time::timeout(Duration::from_millis(100), stream.next())
                .await
                .is_err(),
            "event published"
        );

        store
            .inner
            .shared
            .fail_commits
            .store(false, Ordering::Relaxed);
        let b = key("ns", "b");
        let b_stored = store
            .create(&b, obj(&b, json!({})))
            .await
            .expect("create after failure");
        assert_eq!(
            rv(&b_stored),
            revision + 1,
            "revisions of the failed batch are reused"
        );
        let event = next(&mut stream)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!(event.revision, revision + 1);
        store.close().await;

        let store = open(&path).await;
        assert_eq!(
            store.get(&a).await.expect("get").as_deref(),
            Some(&*a_stored),
            "rolled back"
        );
        assert_eq!(
            store.get(&b).await.expect("get").as_deref(),
            Some(&*b_stored)
        );
        assert_eq!(store.revision(), revision + 1);
        store.close().await;
    }

    #[tokio::test]
    async fn close_ends_watches_and_refuses_writes() {
        let store = TempStore::new().await;
        let store = store.store.clone();
        let a = key("ns", "a");
        store.create(&a, obj(&a, json!({}))).await.expect("create");
        let mut stream = store.watch(R, None, 0).await.expect("watch");
        assert!(next(&mut stream).await.expect("replayed event").is_ok());
        store.close().await;
        assert!(
            next(&mut stream).await.is_none(),
            "stream must end at close"
        );
        assert!(matches!(
            store.watch(R, None, store.revision()).await,
            Err(StoreError::Closed)
        ));
        assert!(matches!(
            store.update(&a, obj(&a, json!({"v": 1})), None).await,
            Err(StoreError::Closed)
        ));
        assert!(matches!(
            store.delete(&a, None).await,
            Err(StoreError::Closed)
        ));
        // Reads keep serving the last state.
        assert!(store.get(&a).await.expect("get").is_some());
        store.close().await; // idempotent
    }

    #[tokio::test]
    async fn dropping_the_store_releases_the_database() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = open(&path).await;
        let a = key("ns", "a");
        store.create(&a, obj(&a, json!({}))).await.expect("create");
        let mut stream = store.watch(R, None, store.revision()).await.expect("watch");
        drop(store);
        // The writer stops and drops the event sender: the stream ends.
        assert!(next(&mut stream).await.is_none());
        // The busy timeout covers the writer closing the connection in the background.
        let store = open(&path).await;
        assert!(store.get(&a).await.expect("get").is_some());
        store.close().await;
    }

    #[tokio::test]
    async fn second_open_of_a_database_in_use_fails() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let store = open(&path).await;
        let mut config = SqliteStoreConfig::new(&path);
        config.busy_timeout = Duration::from_millis(100);
        match SqliteStore::open(config).await {
            Err(StoreError::Database(msg)) => eprintln!("second open: {msg}"),
            other => panic!("second open should fail, got {other:?}"),
        }
        store.close().await;
    }

    #[tokio::test]
    async fn lagging_watcher_gets_expired_and_the_stream_ends() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = SqliteStoreConfig::new(dir.path().join("rlark.db"));
        config.watch_buffer = 4;
        let store = SqliteStore::open(config).await.expect("open");
        let mut stream = store.watch(R, None, 0).await.expect("watch");
        for i in 0..20 {
            let k = key("ns", &format!("o{i}"));
            store.create(&k, obj(&k, json!({}))).await.expect("create");
        }
        match next(&mut stream).await {
            Some(Err(StoreError::Expired { requested, .. })) => assert_eq!(requested, 0),
            other => panic!("lagging watcher should get Expired, got {other:?}"),
        }
        assert!(
            next(&mut stream).await.is_none(),
            "stream must end after Expired"
        );
        store.close().await;
    }

    #[tokio::test]
    async fn change_log_is_compacted_at_capacity() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = SqliteStoreConfig::new(dir.path().join("rlark.db"));
        config.log_capacity = 10;
        let store = SqliteStore::open(config).await.expect("open");
        for i in 0..25 {
            let k = key("ns", &format!("o{i}"));
            store.create(&k, obj(&k, json!({}))).await.expect("create");
        }
        assert_eq!(store.revision(), 25);
        assert_eq!(store.compacted_revision(), 15);
        assert!(matches!(
            store.watch(R, None, 14).await,
            Err(StoreError::Expired { .. })
        ));
        let mut stream = store.watch(R, None, 15).await.expect("watch");
        for revision in 16..=25 {
            let event = next(&mut stream)
                .await
                .expect("event")
                .expect("not an error");
            assert_eq!(event.revision, revision);
        }
        store.close().await;
    }

    /// A client rewriting one large object must not make the log hold `log_capacity` copies
    /// of it: the byte budget compacts the oldest events first, and watches from before them
    /// get `Expired` as for the count bound.
    #[tokio::test]
    async fn change_log_is_bounded_by_bytes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = SqliteStoreConfig::new(dir.path().join("rlark.db"));
        config.log_capacity_bytes = 1024 * 1024;
        let store = SqliteStore::open(config).await.expect("open");
        let k = key("ns", "big");
        let large = |i: usize| obj(&k, json!({"blob": "x".repeat(200 * 1024), "i": i}));
        store.create(&k, large(0)).await.expect("create");
        for i in 1..40 {
            store.update(&k, large(i), None).await.expect("update");
        }
        let log = store.change_log();
        assert!(
            log.bytes <= 1024 * 1024,
            "the log holds {} bytes, over its 1 MiB budget",
            log.bytes
        );
        // 200 KiB per event: four fit, not forty.
        assert!((1..=5).contains(&log.events), "{log:?}");
        assert_eq!(store.revision(), 40);
        let compacted = store.compacted_revision();
        assert_eq!(compacted, 40 - log.events);
        assert!(matches!(
            store.watch(R, None, compacted - 1).await,
            Err(StoreError::Expired { .. })
        ));
        let mut stream = store.watch(R, None, compacted).await.expect("watch");
        let event = next(&mut stream)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!(event.revision, compacted + 1);
        // Small objects are still kept up to the count bound.
        store.compact(store.revision()).await.expect("compact");
        assert_eq!(store.change_log(), ChangeLogStats::default());
        for i in 0..10 {
            let k = key("ns", &format!("small{i}"));
            store.create(&k, obj(&k, json!({}))).await.expect("create");
        }
        assert_eq!(store.change_log().events, 10);
        store.close().await;
    }

    #[test]
    fn approx_bytes_counts_strings_and_structure() {
        let small = approx_bytes(&json!({"a": 1}));
        let big = approx_bytes(&json!({"a": "x".repeat(10_000)}));
        assert!(big >= 10_000 && big < 10_000 + 4 * small, "{small} {big}");
        let nested = approx_bytes(&json!([[[[1]]], {"k": [true, null]}]));
        assert!(nested > 6 * std::mem::size_of::<Value>(), "{nested}");
    }

    /// Figures for the report, not assertions: `cargo test -p rlark-store --release -- --ignored
    /// --nocapture throughput`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "timing report; run explicitly"]
    async fn throughput_report() {
        const CLIENTS: usize = 64;
        const PER_CLIENT: usize = 160;
        let store = TempStore::new().await;
        let store = Arc::new(store.store.clone());
        let filler = "x".repeat(800);
        let started = Instant::now();
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (store, filler) = (Arc::clone(&store), filler.clone());
                tokio::spawn(async move {
                    for i in 0..PER_CLIENT {
                        let k = key(&format!("ns{}", c % 8), &format!("c{c}-{i}"));
                        let mut o = obj(&k, json!({"filler": filler, "i": i}));
                        o["metadata"]["labels"] = json!({"app": "bench", "client": c.to_string()});
                        store.create(&k, o).await.expect("create");
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("task");
        }
        let elapsed = started.elapsed();
        let total = CLIENTS * PER_CLIENT;
        let stats = store.stats();
        eprintln!(
            "{total} creates by {CLIENTS} clients in {elapsed:?}: {:.0} creates/s, {} commits (mean batch {:.1})",
            total as f64 / elapsed.as_secs_f64(),
            stats.commits,
            stats.writes as f64 / stats.commits as f64
        );
        let sample = store
            .get(&key("ns0", "c0-0"))
            .await
            .expect("get")
            .expect("present");
        eprintln!(
            "object size: {} bytes",
            serde_json::to_vec(&*sample).expect("json").len()
        );

        let options = ListOptions {
            limit: Some(10_000),
            ..Default::default()
        };
        let started = Instant::now();
        let listed = store.list(R, &options).await.expect("list");
        let list_time = started.elapsed();
        let body = serde_json::to_vec(&listed.items).expect("serialize");
        eprintln!(
            "list of {} objects: {list_time:?} from memory, {:?} including JSON serialization ({} bytes)",
            listed.items.len(),
            started.elapsed(),
            body.len()
        );
        store.close().await;
    }
}
