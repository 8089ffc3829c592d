//! PostgreSQL persistence backend (`rlark server --store postgres://...`).
//!
//! The layout of the SQLite backend's schema version 2, in tables prefixed `rlark_`:
//! `rlark_objects`, `rlark_changes` (the persisted change log) and `rlark_meta`
//! (`schema_version`, `revision`, `compacted`). A batch is one transaction.
//!
//! - **Durability:** the session runs with `synchronous_commit = on` whatever the server's
//!   default, so a commit has reached PostgreSQL's WAL on disk (and, with synchronous
//!   replication configured, the standby) before the engine acknowledges it.
//!   [`PostgresStore::durability`] reads the setting back from the live session.
//! - **Several writers (server replicas) on one database.** Every write transaction first
//!   takes one transaction-level advisory lock (the write lock), then reads the revision; if
//!   other replicas committed since this one last looked, their changes are read from the
//!   change log and applied to this replica's memory before the batch is evaluated, so every
//!   precondition (`AlreadyExists`, resourceVersion conflicts) is checked against the
//!   database's latest state. The batch is numbered from the stored revision, written, and the
//!   revision row updated in the same transaction: revisions come from that one counter, in
//!   commit order and without gaps. (A `SEQUENCE` would not do: `nextval` is not
//!   transactional, so a transaction that drew revision 5 could commit after one that drew 6,
//!   and a watcher that had caught up to 6 would never see 5.) The commit sends `NOTIFY
//!   rlark_changes` with the new revision; each replica `LISTEN`s on its own connection and
//!   catches up from the change log when notified, after its listener reconnects, and at
//!   least every second whatever happens, so a lost notification delays an event by at most
//!   that. A replica that fell behind the log's compaction floor reloads every object and
//!   ends its watches (clients relist).
//! - **Connection loss:** a batch whose transaction failed is begun again once on a new
//!   connection; when PostgreSQL cannot be reached the batch is answered
//!   [`StoreError::Unavailable`] (HTTP 503 with `Retry-After`) and nothing of it is applied.
//!   While idle, the engine catches up every second, so [`CachedStore::is_available`] (the
//!   server's `/readyz`) turns false when PostgreSQL goes away and true again, without a
//!   restart, when it is back. If a COMMIT did reach the database but its reply was lost, the
//!   next transaction's catch-up brings the batch back like another replica's write.
//! - **Compaction** of the persisted change log is a background job: every 10 s the replica
//!   that gets a transaction-level advisory lock (the compaction lock; the others skip that
//!   round) keeps the newest `log_capacity` entries and moves the stored floor up. Each
//!   replica's in-memory log is bounded on its own, as with SQLite.
//! - **Schema migrations** are numbered and run at open in one transaction under a
//!   transaction-level advisory lock, so servers starting together do not race.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener, PgPoolOptions};
use sqlx::{Connection, Row};
use tokio::sync::Notify;

use crate::backend::{Backend, Change, Loaded, LoadedObject, LoggedChange, Remote};
use crate::engine::{CachedStore, EngineConfig};
use crate::sql::{event_type_name, from_db_int, key_of, parse_event_type, parse_object, to_db_int};
use crate::{EventType, ObjectKey, Revision, StoreError};

/// Version of the schema written by this code (`rlark_meta` row `schema_version`).
const SCHEMA_VERSION: i64 = 1;
/// Advisory lock key held while migrating ("rlark" + 1).
const MIGRATION_LOCK: i64 = 0x0072_6c61_726b_0001;
/// Transaction-level advisory lock key every write transaction takes first ("rlark" + 2).
const WRITE_LOCK: i64 = 0x0072_6c61_726b_0002;
/// Transaction-level advisory lock key of the compaction job ("rlark" + 3): one replica
/// compacts at a time.
const COMPACTION_LOCK: i64 = 0x0072_6c61_726b_0003;
/// How often the compaction job looks at the log.
const COMPACTION_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
/// Opens a write transaction and takes [`WRITE_LOCK`] in one round trip (a test checks the
/// literal is that key).
const BEGIN_WRITE: &str = "BEGIN; SELECT pg_advisory_xact_lock(32207313132257282)";
/// The channel commits notify with their revision.
const CHANNEL: &str = "rlark_changes";
/// How long the listener waits before connecting again after an error.
const LISTENER_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The store over PostgreSQL: [`CachedStore`] with the [`PostgresBackend`].
pub type PostgresStore = CachedStore<PostgresBackend>;

/// Settings of [`PostgresStore::open`].
#[derive(Clone)]
pub struct PostgresStoreConfig {
    /// Where the database is, parsed from a `postgres://` URL.
    pub connect: PgConnectOptions,
    pub engine: EngineConfig,
}

impl PostgresStoreConfig {
    /// Engine defaults and the database at `url` (`postgres://user:password@host:port/db`,
    /// with the usual libpq query parameters such as `sslmode`).
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let connect = url.parse::<PgConnectOptions>().map_err(|e| {
            StoreError::Database(format!(
                "invalid PostgreSQL URL (postgres://user@host:port/db): {e}"
            ))
        })?;
        Ok(Self {
            connect,
            engine: EngineConfig::default(),
        })
    }
}

impl fmt::Debug for PostgresStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreConfig")
            .field("database", &PgTarget::of(&self.connect))
            .field("engine", &self.engine)
            .finish()
    }
}

/// Where a backend's database is (no password), for logs.
#[derive(Clone, PartialEq, Eq)]
pub struct PgTarget {
    pub user: String,
    pub host: String,
    pub port: u16,
    pub database: String,
}

impl PgTarget {
    fn of(options: &PgConnectOptions) -> Self {
        Self {
            user: options.get_username().to_owned(),
            host: options.get_host().to_owned(),
            port: options.get_port(),
            database: options.get_database().unwrap_or_default().to_owned(),
        }
    }
}

impl fmt::Debug for PgTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "postgres://{}@{}:{}/{}",
            self.user, self.host, self.port, self.database
        )
    }
}

/// The durability settings in force on the store's session, as PostgreSQL reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgDurability {
    /// `SHOW synchronous_commit`: `on` (or stronger: `remote_write`, `remote_apply`) waits for
    /// the WAL flush before a commit returns.
    pub synchronous_commit: String,
    /// `SHOW fsync`: `on` unless the server was configured to lose data on a crash.
    pub fsync: String,
}

/// The PostgreSQL [`Backend`]: one connection, owned by the engine's writer task, and (for a
/// running store) a listener task on a second one.
pub struct PostgresBackend {
    /// `None` after a failure, until the next call reconnects.
    conn: Option<PgConnection>,
    connect: PgConnectOptions,
    target: PgTarget,
    /// The latest revision this process has seen committed (its own or caught up); the
    /// listener skips notifications at or below it.
    known: Arc<AtomicU64>,
    /// A transaction begun by `begin_write` is open on `conn`.
    in_write: bool,
    listener: Option<Listener>,
}

/// The background tasks of a running store (the listener and the compaction job); stopped
/// when dropped.
struct Listener {
    signal: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
    compaction: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        self.compaction.abort();
    }
}

impl CachedStore<PostgresBackend> {
    /// Connect, take the writer lock, migrate the schema, load every object and the persisted
    /// change log into memory and start the writer task.
    pub async fn open(config: PostgresStoreConfig) -> Result<Self, StoreError> {
        let mut backend = PostgresBackend::open(config.connect).await?;
        backend.listen(config.engine.log_capacity);
        CachedStore::start(backend, config.engine).await
    }

    /// The durability settings in force on the writer's session.
    pub async fn durability(&self) -> Result<PgDurability, StoreError> {
        self.backend_settings().await
    }
}

impl PostgresBackend {
    /// Connect and migrate the schema, without loading anything or listening: for `rlark
    /// backup`, `restore` and `store migrate`, which use the backend directly (a restore
    /// refuses a database that holds anything).
    pub async fn open_backend(config: &PostgresStoreConfig) -> Result<Self, StoreError> {
        Self::open(config.connect.clone()).await
    }

    async fn open(connect: PgConnectOptions) -> Result<Self, StoreError> {
        let connect = connect
            .application_name("rlark-server")
            .options([("synchronous_commit", "on")]);
        let target = PgTarget::of(&connect);
        let mut conn = connect_to(&connect, &target).await?;
        migrate(&mut conn).await?;
        Ok(Self {
            conn: Some(conn),
            connect,
            target,
            known: Arc::new(AtomicU64::new(0)),
            in_write: false,
            listener: None,
        })
    }

    /// Start the listener task and the compaction job, which keeps the newest `keep`
    /// change-log entries (see the module documentation).
    fn listen(&mut self, keep: usize) {
        let signal = Arc::new(Notify::new());
        let task = tokio::spawn(listen(
            self.connect
                .clone()
                .application_name("rlark-server-listener"),
            Arc::clone(&self.known),
            Arc::clone(&signal),
        ));
        let compaction = tokio::spawn(compact_in_background(
            self.connect
                .clone()
                .application_name("rlark-server-compaction"),
            keep,
        ));
        self.listener = Some(Listener {
            signal,
            task,
            compaction,
        });
    }

    /// Run `step` on the connection (reconnecting first if there is none); on error the
    /// connection is dropped (rolling back whatever was open) so the next call starts clean.
    async fn on_conn<T>(
        &mut self,
        step: impl AsyncFnOnce(&mut PgConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = match self.conn().await {
            Ok(conn) => step(conn).await,
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.in_write = false;
            self.drop_conn().await;
        }
        result
    }

    async fn drop_conn(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err(e) = conn.close().await
        {
            tracing::debug!(error = %e, "closing a failed PostgreSQL connection");
        }
    }

    async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.conn.is_none() {
            let conn = connect_to(&self.connect, &self.target).await?;
            tracing::info!(database = ?self.target, "store reconnected to PostgreSQL");
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::Database("no PostgreSQL connection".into()))
    }
}

/// Name the failure; a lost or refused connection (or a server shutting down) is
/// [`StoreError::Unavailable`], anything else [`StoreError::Database`].
fn pg_err(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
    move |e| {
        let unavailable = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::BeginFailed => true,
            // Class 08: connection exception; 57P: operator intervention (shutdown,
            // terminated, cannot connect now).
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
            _ => false,
        };
        if unavailable {
            StoreError::Unavailable(format!("{context}: {e}"))
        } else {
            StoreError::Database(format!("{context}: {e}"))
        }
    }
}

async fn connect_to(
    connect: &PgConnectOptions,
    target: &PgTarget,
) -> Result<PgConnection, StoreError> {
    PgConnection::connect_with(connect)
        .await
        .map_err(pg_err("connecting to PostgreSQL"))
        .map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{target:?}: {m}")),
            StoreError::Database(m) => StoreError::Database(format!("{target:?}: {m}")),
            other => other,
        })
}

/// The listener task: `LISTEN rlark_changes` and signal the engine when another process
/// committed past `known`, and after every (re)connection, since notifications sent meanwhile
/// are lost. Runs until aborted.
async fn listen(connect: PgConnectOptions, known: Arc<AtomicU64>, signal: Arc<Notify>) {
    loop {
        // A pool of one is what `PgListener` reconnects through.
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(LISTENER_RETRY * 5)
            .connect_lazy_with(connect.clone());
        let listener = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = match listener.await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "store listener cannot connect; retrying");
                tokio::time::sleep(LISTENER_RETRY).await;
                continue;
            }
        };
        signal.notify_one();
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    let newer = notification
                        .payload()
                        .parse::<Revision>()
                        .map_or(true, |revision| revision > known.load(Ordering::Acquire));
                    if newer {
                        signal.notify_one();
                    }
                }
                // The connection was lost and made again: what was sent meanwhile is lost.
                Ok(None) => signal.notify_one(),
                Err(e) => {
                    tracing::debug!(error = %e, "store listener lost its connection; reconnecting");
                    tokio::time::sleep(LISTENER_RETRY).await;
                    break;
                }
            }
        }
    }
}

/// The compaction job: every [`COMPACTION_INTERVAL`], on its own connection, the replica
/// that gets [`COMPACTION_LOCK`] (others skip the round) drops change-log entries older than
/// the newest `keep` and moves the stored floor there. It takes no write lock: writers never
/// touch those rows or the floor, and readers read the floor and the log in one snapshot.
async fn compact_in_background(connect: PgConnectOptions, keep: usize) {
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    let mut conn: Option<PgConnection> = None;
    let mut tick = tokio::time::interval(COMPACTION_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if conn.is_none() {
            match PgConnection::connect_with(&connect).await {
                Ok(new) => conn = Some(new),
                Err(e) => {
                    tracing::debug!(error = %e, "store compaction cannot connect");
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match compact_round(c, keep).await {
            Ok(Some(floor)) => tracing::debug!(floor, "store change log compacted"),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "store compaction failed");
                conn = None;
            }
        }
    }
}

/// One round of [`compact_in_background`]: the new floor, if it moved.
async fn compact_round(conn: &mut PgConnection, keep: i64) -> Result<Option<i64>, StoreError> {
    let mut tx = conn.begin().await.map_err(pg_err("begin compaction"))?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
        .bind(COMPACTION_LOCK)
        .fetch_one(&mut *tx)
        .await
        .map_err(pg_err("taking the compaction lock"))?;
    if !locked {
        return Ok(None);
    }
    let (revision, compacted) = revision_and_floor(&mut tx).await?;
    let (revision, compacted) = (to_db_int(revision)?, to_db_int(compacted)?);
    let floor = revision.saturating_sub(keep);
    if floor <= compacted {
        return Ok(None);
    }
    compact_in(&mut tx, from_db_int(floor, "floor")?).await?;
    tx.commit().await.map_err(pg_err("commit compaction"))?;
    Ok(Some(floor))
}

/// Where a shared database stands relative to `known`, read in the caller's snapshot (a
/// read-only REPEATABLE READ transaction, or a write transaction holding the write lock).
/// `None` when the change log no longer reaches back to `known` (the caller reloads).
async fn remote_since(
    conn: &mut PgConnection,
    known: Revision,
) -> Result<Option<Remote>, StoreError> {
    let (revision, compacted) = revision_and_floor(&mut *conn).await?;
    if revision == known {
        return Ok(Some(Remote::UpToDate));
    }
    // Behind the floor, or a database that went back (restored under a running server).
    if compacted > known || revision < known {
        return Ok(None);
    }
    let log = read_log(conn, known, Some(revision)).await?;
    if log.len() as u64 != revision - known {
        return Err(StoreError::Database(format!(
            "the change log between revisions {known} and {revision} has {} entries; expected {}",
            log.len(),
            revision - known
        )));
    }
    Ok(Some(Remote::Changes(log)))
}

/// Change-log entries above `after` (up to `upto`), in revision order.
async fn read_log(
    conn: &mut PgConnection,
    after: Revision,
    upto: Option<Revision>,
) -> Result<Vec<LoggedChange>, StoreError> {
    let upto = match upto {
        Some(upto) => to_db_int(upto)?,
        None => i64::MAX,
    };
    let mut rows = sqlx::query(
        "SELECT revision, resource, namespace, name, event_type, value FROM rlark_changes
         WHERE revision > $1 AND revision <= $2 ORDER BY revision",
    )
    .bind(to_db_int(after)?)
    .bind(upto)
    .fetch(&mut *conn);
    let mut log = Vec::new();
    while let Some(row) = rows
        .try_next()
        .await
        .map_err(pg_err("loading change log"))?
    {
        let change_revision: i64 = row.try_get(0).map_err(pg_err("loading change log"))?;
        let key = key_of(&row, 1).map_err(pg_err("loading change log"))?;
        let event_type: String = row.try_get(4).map_err(pg_err("loading change log"))?;
        let text: String = row.try_get(5).map_err(pg_err("loading change log"))?;
        log.push(LoggedChange {
            revision: from_db_int(change_revision, "change revision")?,
            event_type: parse_event_type(&event_type)?,
            object: parse_object(&text, &key, "change-log entry")?,
            key,
        });
    }
    Ok(log)
}

/// Everything, in one REPEATABLE READ snapshot.
async fn load_in(conn: &mut PgConnection) -> Result<Loaded, StoreError> {
    let mut tx = conn.begin().await.map_err(pg_err("begin load"))?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await
        .map_err(pg_err("begin load"))?;
    let (revision, compacted) = revision_and_floor(&mut tx).await?;
    let mut objects = Vec::new();
    {
        let mut rows =
            sqlx::query("SELECT resource, namespace, name, revision, value FROM rlark_objects")
                .fetch(&mut *tx);
        while let Some(row) = rows.try_next().await.map_err(pg_err("loading objects"))? {
            let key = key_of(&row, 0).map_err(pg_err("loading objects"))?;
            let object_revision: i64 = row.try_get(3).map_err(pg_err("loading objects"))?;
            let text: String = row.try_get(4).map_err(pg_err("loading objects"))?;
            objects.push(LoadedObject {
                revision: from_db_int(object_revision, "object revision")?,
                object: parse_object(&text, &key, "object")?,
                key,
            });
        }
    }
    let log = read_log(&mut tx, compacted, None).await?;
    tx.commit().await.map_err(pg_err("end load"))?;
    Ok(Loaded {
        objects,
        revision,
        compacted,
        log,
    })
}

/// Bring the schema to [`SCHEMA_VERSION`] in one transaction under the migration lock.
async fn migrate(conn: &mut PgConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await.map_err(pg_err("begin migration"))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(pg_err("taking the migration lock"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS rlark_meta (key TEXT PRIMARY KEY NOT NULL, value BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(pg_err("creating table rlark_meta"))?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT value FROM rlark_meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(pg_err("reading schema version"))?;
    let mut version = found.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Database(format!(
            "database schema version {version} is not supported (this build knows version {SCHEMA_VERSION})"
        )));
    }
    while version < SCHEMA_VERSION {
        version += 1;
        let statements: &[&'static str] = match version {
            1 => &[
                "CREATE TABLE rlark_objects (
                    resource TEXT NOT NULL,
                    namespace TEXT NOT NULL,
                    name TEXT NOT NULL,
                    revision BIGINT NOT NULL,
                    value TEXT NOT NULL,
                    PRIMARY KEY (resource, namespace, name)
                )",
                "CREATE TABLE rlark_changes (
                    revision BIGINT PRIMARY KEY NOT NULL,
                    resource TEXT NOT NULL,
                    namespace TEXT NOT NULL,
                    name TEXT NOT NULL,
                    event_type TEXT NOT NULL,
                    value TEXT NOT NULL
                )",
                "INSERT INTO rlark_meta (key, value) VALUES ('revision', 0), ('compacted', 0)",
            ],
            other => unreachable!("no migration step {other}"),
        };
        for statement in statements {
            sqlx::query(*statement)
                .execute(&mut *tx)
                .await
                .map_err(pg_err("migrating the schema"))?;
        }
        sqlx::query(
            "INSERT INTO rlark_meta (key, value) VALUES ('schema_version', $1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(pg_err("recording schema version"))?;
        tracing::info!(version, "store schema migrated");
    }
    tx.commit().await.map_err(pg_err("committing migration"))
}

/// The stored revision and change-log floor, in one round trip (every write transaction
/// and every catch-up reads both).
async fn revision_and_floor(conn: &mut PgConnection) -> Result<(Revision, Revision), StoreError> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT key, value FROM rlark_meta WHERE key IN ('revision', 'compacted')")
            .fetch_all(&mut *conn)
            .await
            .map_err(pg_err("reading rlark_meta"))?;
    let value = |key: &str| {
        let found = rows.iter().find(|(k, _)| k == key).map_or(0, |(_, v)| *v);
        from_db_int(found, key)
    };
    Ok((value("revision")?, value("compacted")?))
}

async fn meta_value(conn: &mut PgConnection, key: &str) -> Result<Revision, StoreError> {
    let value: Option<i64> = sqlx::query_scalar("SELECT value FROM rlark_meta WHERE key = $1")
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(pg_err("reading rlark_meta"))?;
    from_db_int(value.unwrap_or(0), key)
}

/// Drop change-log rows at or below `floor` and record the floor.
async fn compact_in(conn: &mut PgConnection, floor: Revision) -> Result<(), StoreError> {
    let floor = to_db_int(floor)?;
    sqlx::query("DELETE FROM rlark_changes WHERE revision <= $1")
        .bind(floor)
        .execute(&mut *conn)
        .await
        .map_err(pg_err("compacting the change log"))?;
    // Only up: another replica may have moved it further already.
    sqlx::query("UPDATE rlark_meta SET value = GREATEST(value, $1) WHERE key = 'compacted'")
        .bind(floor)
        .execute(&mut *conn)
        .await
        .map_err(pg_err("recording the change-log floor"))?;
    Ok(())
}

/// Rows of one batch as columns, bound as arrays to one statement.
#[derive(Default)]
struct Columns<'a> {
    resources: Vec<&'a str>,
    namespaces: Vec<&'a str>,
    names: Vec<&'a str>,
    revisions: Vec<i64>,
    event_types: Vec<&'a str>,
    values: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, key: &'a ObjectKey, revision: Option<i64>, value: &'a str) {
        self.resources.push(key.resource.as_str());
        self.namespaces.push(key.namespace.as_str());
        self.names.push(key.name.as_str());
        if let Some(revision) = revision {
            self.revisions.push(revision);
            self.values.push(value);
        }
    }
}

/// Write a batch into the transaction `begin_write` opened, notify the other replicas and
/// commit.
async fn commit_in(
    conn: &mut PgConnection,
    changes: &[Change],
    compact_to: Option<Revision>,
) -> Result<Revision, StoreError> {
    let Some(revision) = changes.last().map(|c| c.revision) else {
        return Err(StoreError::Database("an empty batch to commit".into()));
    };
    // Several changes of one key in a batch: only the last one reaches `rlark_objects`.
    let mut last: HashMap<&ObjectKey, &Change> = HashMap::with_capacity(changes.len());
    for change in changes {
        last.insert(&change.key, change);
    }
    // One statement per table for the whole batch (arrays unnested server-side): a
    // statement per row cost a loopback round trip each and held API creates at ~12% of
    // what pgbench inserts on the same cluster (docs/benchmarks.md).
    let mut log = Columns::default();
    for change in changes {
        log.push(&change.key, Some(to_db_int(change.revision)?), &change.json);
        log.event_types.push(event_type_name(change.event_type));
    }
    sqlx::query(
        "INSERT INTO rlark_changes (revision, resource, namespace, name, event_type, value)
         SELECT * FROM UNNEST($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[],
                              $6::text[])",
    )
    .bind(&log.revisions)
    .bind(&log.resources)
    .bind(&log.namespaces)
    .bind(&log.names)
    .bind(&log.event_types)
    .bind(&log.values)
    .execute(&mut *conn)
    .await
    .map_err(pg_err("appending to the change log"))?;
    // `last` has each key once, so no statement below touches a row twice.
    let (mut upserts, mut deletes) = (Columns::default(), Columns::default());
    for change in last.into_values() {
        match change.event_type {
            EventType::Deleted => deletes.push(&change.key, None, ""),
            EventType::Added | EventType::Modified => {
                upserts.push(&change.key, Some(to_db_int(change.revision)?), &change.json)
            }
        }
    }
    if !deletes.names.is_empty() {
        sqlx::query(
            "DELETE FROM rlark_objects o
             USING UNNEST($1::text[], $2::text[], $3::text[]) AS d(resource, namespace, name)
             WHERE o.resource = d.resource AND o.namespace = d.namespace AND o.name = d.name",
        )
        .bind(&deletes.resources)
        .bind(&deletes.namespaces)
        .bind(&deletes.names)
        .execute(&mut *conn)
        .await
        .map_err(pg_err("delete"))?;
    }
    if !upserts.names.is_empty() {
        sqlx::query(
            "INSERT INTO rlark_objects (resource, namespace, name, revision, value)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
             ON CONFLICT (resource, namespace, name)
             DO UPDATE SET revision = excluded.revision, value = excluded.value",
        )
        .bind(&upserts.resources)
        .bind(&upserts.namespaces)
        .bind(&upserts.names)
        .bind(&upserts.revisions)
        .bind(&upserts.values)
        .execute(&mut *conn)
        .await
        .map_err(pg_err("upsert"))?;
    }
    if let Some(floor) = compact_to {
        compact_in(&mut *conn, floor).await?;
    }
    // The notification is delivered at COMMIT, to every listening replica (this one too; its
    // listener skips it by `known`).
    sqlx::query(
        "UPDATE rlark_meta SET value = $1 WHERE key = 'revision'
         RETURNING pg_notify('rlark_changes', $1::text)",
    )
    .bind(to_db_int(revision)?)
    .fetch_all(&mut *conn)
    .await
    .map_err(pg_err("updating revision"))?;
    sqlx::raw_sql("COMMIT")
        .execute(&mut *conn)
        .await
        .map_err(pg_err("commit"))?;
    Ok(revision)
}

#[async_trait]
impl Backend for PostgresBackend {
    type Settings = PgDurability;
    type Info = PgTarget;

    fn info(&self) -> PgTarget {
        self.target.clone()
    }

    async fn load(&mut self) -> Result<Loaded, StoreError> {
        let loaded = self.on_conn(async |conn| load_in(conn).await).await?;
        self.known.store(loaded.revision, Ordering::Release);
        Ok(loaded)
    }

    fn shared(&self) -> bool {
        true
    }

    fn remote_signal(&self) -> Option<Arc<Notify>> {
        self.listener
            .as_ref()
            .map(|listener| Arc::clone(&listener.signal))
    }

    async fn begin_write(&mut self, known: Revision) -> Result<Remote, StoreError> {
        if self.in_write {
            // A transaction the engine abandoned (it cannot happen through the engine, which
            // always ends what it begins): start clean rather than write into it.
            self.abort_write().await;
        }
        let remote = self
            .on_conn(async |conn| {
                sqlx::raw_sql(BEGIN_WRITE)
                    .execute(&mut *conn)
                    .await
                    .map_err(pg_err("taking the store's write lock"))?;
                remote_since(conn, known).await
            })
            .await?;
        self.in_write = true;
        match remote {
            Some(remote) => {
                if let Remote::Changes(changes) = &remote
                    && let Some(last) = changes.last()
                {
                    self.known.store(last.revision, Ordering::Release);
                }
                Ok(remote)
            }
            None => {
                // Reloading takes its own snapshot: release the lock first.
                self.abort_write().await;
                Ok(Remote::Reload(self.load().await?))
            }
        }
    }

    async fn abort_write(&mut self) {
        if !std::mem::take(&mut self.in_write) {
            return;
        }
        let rolled_back = match self.conn.as_mut() {
            Some(conn) => sqlx::raw_sql("ROLLBACK").execute(conn).await.is_ok(),
            None => true,
        };
        if !rolled_back {
            self.drop_conn().await;
        }
    }

    async fn commit(
        &mut self,
        changes: &[Change],
        compact_to: Option<Revision>,
    ) -> Result<(), StoreError> {
        if !self.in_write {
            return Err(StoreError::Database(
                "a PostgreSQL commit without begin_write (the write lock is not held)".into(),
            ));
        }
        let revision = self
            .on_conn(async |conn| commit_in(conn, changes, compact_to).await)
            .await?;
        self.in_write = false;
        self.known.fetch_max(revision, Ordering::AcqRel);
        Ok(())
    }

    async fn catch_up(&mut self, known: Revision) -> Result<Remote, StoreError> {
        let remote = self
            .on_conn(async |conn| {
                let mut tx = conn.begin().await.map_err(pg_err("begin catch-up"))?;
                sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .execute(&mut *tx)
                    .await
                    .map_err(pg_err("begin catch-up"))?;
                let remote = remote_since(&mut tx, known).await?;
                tx.commit().await.map_err(pg_err("end catch-up"))?;
                Ok(remote)
            })
            .await?;
        match remote {
            Some(remote) => {
                if let Remote::Changes(changes) = &remote
                    && let Some(last) = changes.last()
                {
                    self.known.fetch_max(last.revision, Ordering::AcqRel);
                }
                Ok(remote)
            }
            None => Ok(Remote::Reload(self.load().await?)),
        }
    }

    async fn check(&mut self) -> Result<(), StoreError> {
        self.on_conn(async |conn| {
            sqlx::query("SELECT 1")
                .execute(&mut *conn)
                .await
                .map_err(pg_err("checking the connection"))
                .map(|_| ())
        })
        .await
    }

    async fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        self.on_conn(async |conn| {
            let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(WRITE_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(pg_err("taking the store's write lock"))?;
            compact_in(&mut tx, revision).await?;
            tx.commit().await.map_err(pg_err("commit compaction"))
        })
        .await
    }

    async fn import(&mut self, objects: &[Change], revision: Revision) -> Result<(), StoreError> {
        let target = format!("{:?}", self.target);
        let conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(WRITE_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(pg_err("taking the store's write lock"))?;
        let rows: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM rlark_objects) + (SELECT count(*) FROM rlark_changes)",
        )
        .fetch_one(&mut *tx)
        .await
        .map_err(pg_err("checking that the store is empty"))?;
        let current = meta_value(&mut tx, "revision").await?;
        if rows > 0 || current > 0 {
            return Err(StoreError::Database(format!(
                "{target} is not empty (revision {current}, {rows} rows): a restore needs an empty store"
            )));
        }
        let mut columns = Columns::default();
        for object in objects {
            columns.push(&object.key, Some(to_db_int(object.revision)?), &object.json);
        }
        sqlx::query(
            "INSERT INTO rlark_objects (resource, namespace, name, revision, value)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])",
        )
        .bind(&columns.resources)
        .bind(&columns.namespaces)
        .bind(&columns.names)
        .bind(&columns.revisions)
        .bind(&columns.values)
        .execute(&mut *tx)
        .await
        .map_err(pg_err("restoring objects"))?;
        sqlx::query("UPDATE rlark_meta SET value = $1 WHERE key IN ('revision', 'compacted')")
            .bind(to_db_int(revision)?)
            .execute(&mut *tx)
            .await
            .map_err(pg_err("recording the restored revision"))?;
        tx.commit().await.map_err(pg_err("commit restore"))?;
        self.known.store(revision, Ordering::Release);
        Ok(())
    }

    async fn settings(&mut self) -> Result<PgDurability, StoreError> {
        let conn = self.conn().await?;
        let synchronous_commit: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut *conn)
            .await
            .map_err(pg_err("reading synchronous_commit"))?;
        let fsync: String = sqlx::query_scalar("SHOW fsync")
            .fetch_one(&mut *conn)
            .await
            .map_err(pg_err("reading fsync"))?;
        Ok(PgDurability {
            synchronous_commit,
            fsync,
        })
    }

    async fn close(mut self) {
        self.abort_write().await;
        drop(self.listener.take());
        if let Some(conn) = self.conn.take()
            && let Err(e) = conn.close().await
        {
            tracing::error!(error = %e, database = ?self.target, "closing PostgreSQL connection");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::StreamExt;
    use serde_json::{Value, json};

    use super::*;
    use crate::missing_tool;
    use crate::pg_cluster::{PgCluster, find_bin};
    use crate::{ListOptions, Store, conformance};

    /// A cluster, or `None` after reporting the skip (a failure under CI=true).
    fn cluster() -> Option<Arc<PgCluster>> {
        match find_bin() {
            Some(bin) => Some(Arc::new(PgCluster::start(&bin))),
            None => {
                missing_tool::skip_or_fail(
                    "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
                );
                None
            }
        }
    }

    /// A fresh, empty database on `cluster`.
    async fn database(cluster: &PgCluster) -> PostgresStoreConfig {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!("rlark_test_{}", NEXT.fetch_add(1, Ordering::Relaxed));
        cluster.create_database(&name);
        PostgresStoreConfig::from_url(&cluster.url(&name)).expect("url")
    }

    const R: &str = "widgets.test.rlark.io";

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new(R, "ns", name)
    }

    fn obj(name: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "test.rlark.io/v1",
            "kind": "Widget",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
        })
    }

    async fn next(stream: &mut crate::WatchStream) -> crate::WatchEvent {
        tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("watch timed out")
            .expect("stream ended")
            .expect("not an error")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_suite_on_postgres() {
        let Some(cluster) = cluster() else { return };
        conformance::run_all(|| {
            let cluster = Arc::clone(&cluster);
            async move {
                PostgresStore::open(database(&cluster).await)
                    .await
                    .expect("open store")
            }
        })
        .await;
    }

    /// A backup restores into an empty PostgreSQL database, and `store migrate`'s path
    /// (load one backend, import into another) carries a store from PostgreSQL to SQLite and
    /// back with its revisions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_restores_and_migrates_between_backends() {
        use crate::backup::{self, Snapshot, testing};
        use crate::{SqliteBackend, SqliteStore, SqliteStoreConfig};
        let Some(cluster) = cluster() else { return };
        let source_config = database(&cluster).await;
        let source = PostgresStore::open(source_config.clone())
            .await
            .expect("open");
        testing::write_history(&source).await;
        let snapshot = source.snapshot();
        source.close().await;

        let mut offline = PostgresBackend::open_backend(&source_config)
            .await
            .expect("open the source backend");
        let loaded = Snapshot::of_backend(&mut offline).await.expect("load");
        testing::assert_same(&loaded, &snapshot);
        let error = backup::import(&mut offline, &snapshot)
            .await
            .expect_err("a store with data")
            .to_string();
        assert!(error.contains("is not empty (revision 6"), "{error}");
        offline.close().await;

        // PostgreSQL -> PostgreSQL, through the file format.
        let target_config = database(&cluster).await;
        let mut target = PostgresBackend::open_backend(&target_config)
            .await
            .expect("open the target backend");
        backup::import(&mut target, &testing::through_a_file(&snapshot))
            .await
            .expect("import");
        target.close().await;
        let restored = PostgresStore::open(target_config).await.expect("reopen");
        testing::check_restored(&snapshot, &restored).await;
        restored.close().await;

        // PostgreSQL -> SQLite -> PostgreSQL.
        let dir = tempfile::tempdir().expect("temp dir");
        let sqlite = SqliteStoreConfig::new(dir.path().join("rlark.db"));
        let mut to_sqlite = SqliteBackend::open(&sqlite).await.expect("sqlite");
        backup::import(&mut to_sqlite, &loaded)
            .await
            .expect("to sqlite");
        let from_sqlite = Snapshot::of_backend(&mut to_sqlite)
            .await
            .expect("load sqlite");
        to_sqlite.close().await;
        let back_config = database(&cluster).await;
        let mut back = PostgresBackend::open_backend(&back_config)
            .await
            .expect("back");
        backup::import(&mut back, &from_sqlite)
            .await
            .expect("back to postgres");
        back.close().await;
        let back = PostgresStore::open(back_config).await.expect("reopen");
        testing::check_restored(&snapshot, &back).await;
        back.close().await;
        let sqlite = SqliteStore::open(sqlite).await.expect("sqlite store");
        testing::check_restored(&snapshot, &sqlite).await;
        sqlite.close().await;
    }

    /// A crash test cannot see a missing WAL flush: assert what PostgreSQL has in force on the
    /// store's own session.
    #[tokio::test]
    async fn commits_wait_for_the_wal_flush() {
        let Some(cluster) = cluster() else { return };
        let store = PostgresStore::open(database(&cluster).await)
            .await
            .expect("open");
        let durability = store.durability().await.expect("durability");
        assert_eq!(
            durability,
            PgDurability {
                synchronous_commit: "on".into(),
                fsync: "on".into(),
            }
        );
        store.close().await;
    }

    /// Data and the change log survive a restart (watches resume from before it); after the
    /// connection is cut from outside the next write reconnects by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restart_and_reconnect() {
        let Some(cluster) = cluster() else { return };
        let config = database(&cluster).await;
        let store = PostgresStore::open(config.clone()).await.expect("open");
        let a = store
            .create(&key("a"), obj("a", json!({"v": 1})))
            .await
            .expect("create a");
        store
            .update(&key("a"), obj("a", json!({"v": 2})), None)
            .await
            .expect("update a");
        store.delete(&key("a"), None).await.expect("delete a");
        store
            .create(&key("b"), obj("b", json!({})))
            .await
            .expect("create b");
        assert_eq!(store.revision(), 4);

        store.close().await;

        let store = PostgresStore::open(config.clone()).await.expect("reopen");
        assert_eq!((store.revision(), store.compacted_revision()), (4, 0));
        let listed = store.list(R, &ListOptions::default()).await.expect("list");
        assert_eq!(listed.items.len(), 1);
        let mut stream = store.watch(R, None, 1).await.expect("watch from before");
        let event = next(&mut stream).await;
        assert_eq!((event.event_type, event.revision), (EventType::Modified, 2));
        assert_eq!(event.object["metadata"]["uid"], a["metadata"]["uid"]);
        assert_eq!(next(&mut stream).await.event_type, EventType::Deleted);
        assert_eq!(next(&mut stream).await.event_type, EventType::Added);

        // Cut the writer's connection from outside.
        let mut admin = PgConnection::connect(&cluster.url("postgres"))
            .await
            .expect("admin connection");
        let database = config.connect.get_database().expect("database").to_owned();
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND application_name = 'rlark-server'",
        )
        .bind(&database)
        .fetch_all(&mut admin)
        .await
        .expect("terminate");
        assert_eq!(killed, vec![true]);
        // The next write reconnects by itself.
        store
            .create(&key("c"), obj("c", json!({})))
            .await
            .expect("create after the connection was cut");
        assert_eq!(store.revision(), 5);
        assert_eq!(next(&mut stream).await.revision, 5);
        store.close().await;

        let store = PostgresStore::open(config).await.expect("reopen");
        assert_eq!(store.revision(), 5);
        assert!(store.get(&key("c")).await.expect("get").is_some());
        store.close().await;
        admin.close().await.expect("close");
    }

    /// The literal in [`BEGIN_WRITE`] is [`WRITE_LOCK`].
    #[test]
    fn begin_write_takes_the_write_lock() {
        assert!(BEGIN_WRITE.ends_with(&format!("pg_advisory_xact_lock({WRITE_LOCK})")));
    }

    /// The value of `spec.n` in a widget.
    fn n_of(object: &Value) -> u64 {
        object["spec"]["n"].as_u64().expect("spec.n")
    }

    /// Two stores on one database, as two server replicas: each sees the other's writes
    /// (through LISTEN/NOTIFY) in its memory and its watches, revisions are one sequence
    /// without gaps or duplicates, preconditions are checked against the other's writes (a
    /// create of a name the other created is refused; a compare-and-swap counter incremented
    /// from both loses no increment).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replicas_share_one_database() {
        const PER_TASK: u64 = 25;
        const TASKS: u64 = 3;
        let Some(cluster) = cluster() else { return };
        let config = database(&cluster).await;
        let one = PostgresStore::open(config.clone()).await.expect("open one");
        let two = PostgresStore::open(config.clone()).await.expect("open two");
        let mut watch_two = two.watch(R, None, 0).await.expect("watch on two");

        // A write on one reaches two's watch and memory.
        let created = one
            .create(&key("counter"), obj("counter", json!({"n": 0})))
            .await
            .expect("create on one");
        let event = next(&mut watch_two).await;
        assert_eq!((event.event_type, event.revision), (EventType::Added, 1));
        assert_eq!(event.object["metadata"]["uid"], created["metadata"]["uid"]);
        assert!(two.get(&key("counter")).await.expect("get").is_some());
        match two
            .create(&key("counter"), obj("counter", json!({"n": 9})))
            .await
        {
            Err(StoreError::AlreadyExists(_)) => {}
            other => panic!("a name the other replica created must be taken, got {other:?}"),
        }

        // `sync` makes a write of the other replica visible at once, notification or not.
        one.create(&key("synced"), obj("synced", json!({})))
            .await
            .expect("create on one");
        two.sync().await.expect("sync");
        assert!(two.get(&key("synced")).await.expect("get").is_some());
        one.delete(&key("synced"), None).await.expect("delete");
        assert_eq!(next(&mut watch_two).await.event_type, EventType::Added);
        assert_eq!(next(&mut watch_two).await.event_type, EventType::Deleted);

        // Both increment one counter with compare-and-swap, concurrently.
        let mut tasks = Vec::new();
        for store in [&one, &two] {
            for _ in 0..TASKS {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    let mut conflicts = 0u32;
                    for _ in 0..PER_TASK {
                        loop {
                            let current = store
                                .get(&key("counter"))
                                .await
                                .expect("get")
                                .expect("counter");
                            let revision = current["metadata"]["resourceVersion"]
                                .as_str()
                                .and_then(|v| v.parse().ok())
                                .expect("resourceVersion");
                            let mut next = (*current).clone();
                            next["spec"]["n"] = json!(n_of(&current) + 1);
                            match store.update(&key("counter"), next, Some(revision)).await {
                                Ok(_) => break,
                                Err(StoreError::Conflict { .. }) => conflicts += 1,
                                Err(e) => panic!("update: {e}"),
                            }
                            assert!(conflicts < 10_000, "no progress");
                        }
                    }
                    conflicts
                }));
            }
        }
        let mut conflicts = 0;
        for task in tasks {
            conflicts += task.await.expect("task");
        }
        let total = 2 * TASKS * PER_TASK;
        eprintln!("{total} increments from two replicas, {conflicts} conflicts retried");
        let last = 3 + total;
        // Two's watch saw every revision once, in order.
        let mut seen = Vec::new();
        while seen.len() < total as usize {
            let event = next(&mut watch_two).await;
            assert_eq!(event.event_type, EventType::Modified);
            seen.push((event.revision, n_of(&event.object)));
        }
        let expected: Vec<(u64, u64)> = (4..=last).map(|r| (r, r - 3)).collect();
        assert_eq!(seen, expected, "every increment, once, in revision order");
        for store in [&one, &two] {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while store.revision() < last {
                assert!(tokio::time::Instant::now() < deadline, "replica behind");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let counter = store
                .get(&key("counter"))
                .await
                .expect("get")
                .expect("counter");
            assert_eq!(n_of(&counter), total);
        }
        one.close().await;
        two.close().await;

        // A third opening loads the same state and log.
        let three = PostgresStore::open(config).await.expect("open three");
        assert_eq!(three.revision(), last);
        let mut from_start = three.watch(R, None, 0).await.expect("watch");
        assert_eq!(next(&mut from_start).await.event_type, EventType::Added);
        three.close().await;
    }

    /// The backend's catch-up: nothing when up to date, the missing changes when behind, the
    /// whole store when the change log was compacted past the revision asked about.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn catch_up_reads_changes_or_reloads() {
        let Some(cluster) = cluster() else { return };
        let config = database(&cluster).await;
        let store = PostgresStore::open(config.clone()).await.expect("open");
        for name in ["a", "b", "c"] {
            store
                .create(&key(name), obj(name, json!({})))
                .await
                .expect("create");
        }
        let mut backend = PostgresBackend::open_backend(&config)
            .await
            .expect("backend");
        assert!(matches!(
            backend.catch_up(3).await.expect("catch up"),
            Remote::UpToDate
        ));
        match backend.catch_up(1).await.expect("catch up") {
            Remote::Changes(changes) => assert_eq!(
                changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
                [2, 3]
            ),
            _ => panic!("two changes expected"),
        }
        store.compact(2).await.expect("compact");
        match backend.catch_up(1).await.expect("catch up") {
            Remote::Reload(loaded) => {
                assert_eq!((loaded.revision, loaded.compacted), (3, 2));
                assert_eq!(loaded.objects.len(), 3);
                assert_eq!(loaded.log.len(), 1);
            }
            _ => panic!("a reload expected below the floor"),
        }
        // Under the write lock too; the lock is released for the reload.
        assert!(matches!(
            backend.begin_write(1).await.expect("begin"),
            Remote::Reload(_)
        ));
        assert!(!backend.in_write);
        assert!(matches!(
            backend.begin_write(3).await.expect("begin"),
            Remote::UpToDate
        ));
        backend.abort_write().await;
        backend.close().await;
        store.close().await;
    }

    /// The compaction job's round: keeps the newest entries, moves the floor, does nothing
    /// when the floor is already there or when another replica holds the compaction lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn background_compaction_keeps_the_newest_entries() {
        let Some(cluster) = cluster() else { return };
        let config = database(&cluster).await;
        let store = PostgresStore::open(config.clone()).await.expect("open");
        for name in ["a", "b", "c", "d", "e"] {
            store
                .create(&key(name), obj(name, json!({})))
                .await
                .expect("create");
        }
        let mut conn = PgConnection::connect_with(&config.connect)
            .await
            .expect("connect");
        let mut other = PgConnection::connect_with(&config.connect)
            .await
            .expect("connect");
        let mut held = other.begin().await.expect("begin");
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(COMPACTION_LOCK)
            .execute(&mut *held)
            .await
            .expect("lock");
        assert_eq!(compact_round(&mut conn, 2).await.expect("round"), None);
        held.rollback().await.expect("release");
        assert_eq!(compact_round(&mut conn, 2).await.expect("round"), Some(3));
        assert_eq!(compact_round(&mut conn, 2).await.expect("round"), None);
        let left: Vec<i64> = sqlx::query_scalar("SELECT revision FROM rlark_changes ORDER BY 1")
            .fetch_all(&mut conn)
            .await
            .expect("rows");
        assert_eq!(left, [4, 5]);
        store.close().await;
        // A replica opening now starts its log at the floor.
        let reopened = PostgresStore::open(config).await.expect("reopen");
        assert_eq!((reopened.revision(), reopened.compacted_revision()), (5, 3));
        reopened.close().await;
    }

    /// PostgreSQL down: writes answer `Unavailable` (nothing applied), the store reports itself
    /// unavailable within the health-check interval; PostgreSQL back: available again and
    /// writes succeed, without reopening the store; every acknowledged write is there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn outage_is_unavailable_then_recovers_without_restart() {
        let Some(cluster) = cluster() else { return };
        let store = PostgresStore::open(database(&cluster).await)
            .await
            .expect("open");
        store
            .create(&key("before"), obj("before", json!({})))
            .await
            .expect("create before the outage");
        assert!(store.is_available());

        cluster.pause();
        match store.create(&key("during"), obj("during", json!({}))).await {
            Err(StoreError::Unavailable(message)) => eprintln!("during the outage: {message}"),
            other => panic!("a write during the outage must be Unavailable, got {other:?}"),
        }
        assert!(!store.is_available());
        assert!(store.get(&key("during")).await.expect("get").is_none());
        assert_eq!(store.revision(), 1);
        // Reads are still served from memory.
        assert!(store.get(&key("before")).await.expect("get").is_some());

        cluster.resume();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !store.is_available() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the store did not notice PostgreSQL is back"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        store
            .create(&key("after"), obj("after", json!({})))
            .await
            .expect("create after the outage");
        assert_eq!(store.revision(), 2);
        store.close().await;
    }

    /// Figures for the report, not assertions (the same load as the SQLite backend's
    /// `throughput_report`): `cargo test -p rlark-store --release -- --ignored --nocapture
    /// postgres_throughput`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "timing report; run explicitly"]
    async fn postgres_throughput_report() {
        const CLIENTS: usize = 64;
        const PER_CLIENT: usize = 160;
        let Some(cluster) = cluster() else { return };
        let store = Arc::new(
            PostgresStore::open(database(&cluster).await)
                .await
                .expect("open"),
        );
        let filler = "x".repeat(800);
        let started = std::time::Instant::now();
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let (store, filler) = (Arc::clone(&store), filler.clone());
                tokio::spawn(async move {
                    for i in 0..PER_CLIENT {
                        let k = ObjectKey::new(R, format!("ns{}", c % 8), format!("c{c}-{i}"));
                        let mut o = json!({
                            "apiVersion": "test.rlark.io/v1",
                            "kind": "Widget",
                            "metadata": {"name": k.name, "namespace": k.namespace},
                            "spec": {"filler": filler, "i": i},
                        });
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
            "PostgreSQL: {total} creates by {CLIENTS} clients in {elapsed:?}: {:.0} creates/s, {} commits (mean batch {:.1})",
            total as f64 / elapsed.as_secs_f64(),
            stats.commits,
            stats.writes as f64 / stats.commits as f64
        );
        store.close().await;
    }
}
