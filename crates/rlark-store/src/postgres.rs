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
//! - **One writer:** the engine's memory is only correct if this server is the only writer, so
//!   the backend holds a session advisory lock for as long as it runs; a second server on the
//!   same database is refused at open with a message naming the problem. Every commit also
//!   checks that the stored revision is the one this server last wrote (a conditional update in
//!   the same transaction), so a write by anyone else is detected instead of overwritten.
//!   Several replicas sharing one database (revisions from a sequence, LISTEN/NOTIFY fan-out)
//!   are not implemented.
//! - **Connection loss:** a failed commit is retried once on a new connection (taking the
//!   writer lock again); when PostgreSQL cannot be reached the batch is answered
//!   [`StoreError::Unavailable`] (HTTP 503 with `Retry-After`) and nothing of it is applied.
//!   While idle, the engine checks the connection every second, so
//!   [`CachedStore::is_available`] (the server's `/readyz`) turns false when PostgreSQL goes
//!   away and true again, without a restart, when it is back. If a COMMIT did reach the
//!   database but its reply was lost, the revision check refuses later writes with an error
//!   saying so, and a restart reloads the store.
//! - **Schema migrations** are numbered and run at open in one transaction under a
//!   transaction-level advisory lock, so servers starting together do not race.

use std::collections::HashMap;
use std::fmt;

use async_trait::async_trait;
use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{Connection, Row};

use crate::backend::{Backend, Change, Loaded, LoadedObject, LoggedChange};
use crate::engine::{CachedStore, EngineConfig};
use crate::sql::{event_type_name, from_db_int, key_of, parse_event_type, parse_object, to_db_int};
use crate::{EventType, ObjectKey, Revision, StoreError};

/// Version of the schema written by this code (`rlark_meta` row `schema_version`).
const SCHEMA_VERSION: i64 = 1;
/// Advisory lock key held while migrating ("rlark" + 1).
const MIGRATION_LOCK: i64 = 0x0072_6c61_726b_0001;
/// Advisory lock key the one writer holds for its whole session ("rlark" + 2).
const WRITER_LOCK: i64 = 0x0072_6c61_726b_0002;

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

/// The PostgreSQL [`Backend`]: one connection, owned by the engine's writer task.
pub struct PostgresBackend {
    /// `None` after a failed commit, until the next one reconnects.
    conn: Option<PgConnection>,
    connect: PgConnectOptions,
    target: PgTarget,
    /// The revision the database holds as far as this server knows (checked at every commit).
    revision: Revision,
}

impl CachedStore<PostgresBackend> {
    /// Connect, take the writer lock, migrate the schema, load every object and the persisted
    /// change log into memory and start the writer task.
    pub async fn open(config: PostgresStoreConfig) -> Result<Self, StoreError> {
        let backend = PostgresBackend::open(config.connect).await?;
        CachedStore::start(backend, config.engine).await
    }

    /// The durability settings in force on the writer's session.
    pub async fn durability(&self) -> Result<PgDurability, StoreError> {
        self.backend_settings().await
    }
}

impl PostgresBackend {
    /// Connect, take the writer lock and migrate the schema, without loading anything: for
    /// `rlark backup`, `restore` and `store migrate`, which use the backend directly (no
    /// server may run on the database meanwhile; the writer lock makes sure of it).
    pub async fn open_backend(config: &PostgresStoreConfig) -> Result<Self, StoreError> {
        Self::open(config.connect.clone()).await
    }

    async fn open(connect: PgConnectOptions) -> Result<Self, StoreError> {
        let connect = connect
            .application_name("rlark-server")
            .options([("synchronous_commit", "on")]);
        let target = PgTarget::of(&connect);
        let mut conn = connect_writer(&connect, &target).await?;
        migrate(&mut conn).await?;
        Ok(Self {
            conn: Some(conn),
            connect,
            target,
            revision: 0,
        })
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
            let conn = connect_writer(&self.connect, &self.target).await?;
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

/// Connect and take the writer lock (refused while another server holds it).
async fn connect_writer(
    connect: &PgConnectOptions,
    target: &PgTarget,
) -> Result<PgConnection, StoreError> {
    let mut conn = PgConnection::connect_with(connect)
        .await
        .map_err(pg_err("connecting to PostgreSQL"))
        .map_err(|e| match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(format!("{target:?}: {m}")),
            StoreError::Database(m) => StoreError::Database(format!("{target:?}: {m}")),
            other => other,
        })?;
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(WRITER_LOCK)
        .fetch_one(&mut conn)
        .await
        .map_err(pg_err("taking the writer lock"))?;
    if !locked {
        return Err(StoreError::Database(format!(
            "database {target:?} is in use by another rlark server (it holds the store's \
             writer lock); one server per database is supported"
        )));
    }
    Ok(conn)
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
    sqlx::query("UPDATE rlark_meta SET value = $1 WHERE key = 'compacted'")
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

async fn commit_in(
    conn: &mut PgConnection,
    changes: &[Change],
    compact_to: Option<Revision>,
    previous: Revision,
) -> Result<(), StoreError> {
    // Several changes of one key in a batch: only the last one reaches `rlark_objects`.
    let mut last: HashMap<&ObjectKey, &Change> = HashMap::with_capacity(changes.len());
    for change in changes {
        last.insert(&change.key, change);
    }
    let revision = changes.last().map_or(previous, |c| c.revision);
    let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
    let claimed =
        sqlx::query("UPDATE rlark_meta SET value = $1 WHERE key = 'revision' AND value = $2")
            .bind(to_db_int(revision)?)
            .bind(to_db_int(previous)?)
            .execute(&mut *tx)
            .await
            .map_err(pg_err("updating revision"))?;
    if claimed.rows_affected() != 1 {
        return Err(StoreError::Database(format!(
            "the database's revision is no longer {previous}, the last one this server wrote: \
             it was written by someone else, or an earlier commit whose reply was lost did \
             complete; restart the server to reload the store"
        )));
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
    .execute(&mut *tx)
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
        .execute(&mut *tx)
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
        .execute(&mut *tx)
        .await
        .map_err(pg_err("upsert"))?;
    }
    if let Some(floor) = compact_to {
        compact_in(&mut tx, floor).await?;
    }
    tx.commit().await.map_err(pg_err("commit"))
}

#[async_trait]
impl Backend for PostgresBackend {
    type Settings = PgDurability;
    type Info = PgTarget;

    fn info(&self) -> PgTarget {
        self.target.clone()
    }

    async fn load(&mut self) -> Result<Loaded, StoreError> {
        let conn = self.conn().await?;
        // One snapshot for the three reads.
        let mut tx = conn.begin().await.map_err(pg_err("begin load"))?;
        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(pg_err("begin load"))?;
        let revision = meta_value(&mut tx, "revision").await?;
        let compacted = meta_value(&mut tx, "compacted").await?;
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
        let mut log = Vec::new();
        {
            let mut rows = sqlx::query(
                "SELECT revision, resource, namespace, name, event_type, value FROM rlark_changes
                 WHERE revision > $1 ORDER BY revision",
            )
            .bind(to_db_int(compacted)?)
            .fetch(&mut *tx);
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
        }
        tx.commit().await.map_err(pg_err("end load"))?;
        // The engine starts from the highest revision it sees; the check at commit compares
        // with what the meta row holds.
        self.revision = revision;
        Ok(Loaded {
            objects,
            revision,
            compacted,
            log,
        })
    }

    async fn commit(
        &mut self,
        changes: &[Change],
        compact_to: Option<Revision>,
    ) -> Result<(), StoreError> {
        let previous = self.revision;
        let first = match self.conn().await {
            Ok(conn) => commit_in(conn, changes, compact_to, previous).await,
            Err(e) => Err(e),
        };
        let result = match first {
            Ok(()) => Ok(()),
            Err(e) => {
                // The connection may be broken: start again on a fresh one, once. Safe even if
                // the first COMMIT did land (its reply lost): `commit_in` checks the stored
                // revision, so the batch is then refused rather than applied twice.
                self.drop_conn().await;
                tracing::warn!(error = %e, "store commit failed; retrying once on a new connection");
                match self.conn().await {
                    Ok(conn) => commit_in(conn, changes, compact_to, previous).await,
                    Err(reconnect) => Err(reconnect),
                }
            }
        };
        match &result {
            Ok(()) => self.revision = changes.last().map_or(previous, |c| c.revision),
            Err(_) => self.drop_conn().await,
        }
        result
    }

    async fn check(&mut self) -> Result<(), StoreError> {
        if let Some(conn) = self.conn.as_mut()
            && let Err(e) = sqlx::query("SELECT 1").execute(&mut *conn).await
        {
            tracing::debug!(error = %e, "PostgreSQL health check failed");
            self.drop_conn().await;
        }
        self.conn().await.map(|_| ())
    }

    async fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
        compact_in(&mut tx, revision).await?;
        tx.commit().await.map_err(pg_err("commit compaction"))
    }

    async fn import(&mut self, objects: &[Change], revision: Revision) -> Result<(), StoreError> {
        let target = format!("{:?}", self.target);
        let conn = self.conn().await?;
        let mut tx = conn.begin().await.map_err(pg_err("begin"))?;
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
        self.revision = revision;
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

    async fn close(self) {
        if let Some(conn) = self.conn
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

    /// Data and the change log survive a restart (watches resume from before it); a second
    /// server on the same database is refused; after the connection is cut from outside the
    /// next write reconnects by itself.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restart_single_writer_and_reconnect() {
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

        match PostgresStore::open(config.clone()).await {
            Err(StoreError::Database(msg)) => {
                assert!(msg.contains("another rlark server"), "{msg}")
            }
            other => panic!("a second server must be refused, got {other:?}"),
        }
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
