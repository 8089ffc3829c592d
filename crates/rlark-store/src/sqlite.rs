//! SQLite persistence backend (the default store).
//!
//! - **Tables:** `changes` (one row per write, keyed by revision, with the written JSON;
//!   deletions carry the last state) and `meta` (`schema_version`, `revision`, `compacted`:
//!   the change log's floor). The change log is the only copy of an object: rows above the
//!   floor are the log, and each live object is its key's latest row, which compaction keeps
//!   (below the floor a key has at most that one row). So a write stores its JSON once — the
//!   separate `objects` table of schema version 2 doubled every write's bytes and statements.
//!   A batch is one transaction: one multi-row `INSERT` per chunk of changes, the revision,
//!   and any compaction.
//! - **Durability:** WAL journal with `synchronous=FULL`, so a committed transaction survives
//!   kill -9 and power loss; the engine acknowledges nothing before the commit returns.
//!   [`SqliteStore::durability`] reads the settings back from the live connection.
//! - **Single process:** the database is opened with `locking_mode=EXCLUSIVE`, because the
//!   engine's in-memory state is only correct if this process is the only writer. A second
//!   process opening the same file fails with [`StoreError::Database`] ("database is locked")
//!   after the busy timeout. The same holds for the `sqlite3` shell while the server runs.
//! - **Schema migrations** are numbered and run in one transaction at open; a database from a
//!   newer build is refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteLockingMode, SqliteSynchronous,
};
use sqlx::{Connection, Row};

use crate::backend::{Backend, Change, Loaded, LoadedObject, LoggedChange};
use crate::engine::{CachedStore, EngineConfig};
use crate::sql::{
    db_err, event_type_name, from_db_int, key_of, parse_event_type, parse_object, to_db_int,
};
use crate::{EventType, ObjectKey, Revision, StoreError};

/// Version of the on-disk schema written by this code (`meta` row `schema_version`).
/// 1: `objects` and `meta`. 2: adds the persisted change log (`changes`, `meta.compacted`).
/// 3: the change log is the only copy (`objects` folded into `changes` and dropped; an index
/// on the key, and a trigger that drops a key's compacted row when a newer one is written).
const SCHEMA_VERSION: i64 = 3;

/// Rows per multi-row `INSERT`: a batch is written in chunks of the largest power of two that
/// fits, so the statement cache holds a handful of texts (one per size), not one per size.
const MAX_ROWS_PER_INSERT: usize = 64;
/// Bound parameters per row of `changes`.
const COLUMNS: usize = 6;

/// The store over SQLite: [`CachedStore`] with the [`SqliteBackend`].
pub type SqliteStore = CachedStore<SqliteBackend>;

/// Settings of [`SqliteStore::open`].
#[derive(Clone, Debug)]
pub struct SqliteStoreConfig {
    /// The database file (e.g. `DATA_DIR/rlark.db`); created with its parent directory if absent.
    pub path: PathBuf,
    /// See [`EngineConfig::log_capacity`]. Default 50 000.
    pub log_capacity: usize,
    /// See [`EngineConfig::log_capacity_bytes`]. Default 64 MiB.
    pub log_capacity_bytes: usize,
    /// See [`EngineConfig::max_batch`]. Default 512.
    pub max_batch: usize,
    /// See [`EngineConfig::watch_buffer`]. Default 16 384.
    pub watch_buffer: usize,
    /// See [`EngineConfig::watch_buffer_bytes`]. Default 8 MiB.
    pub watch_buffer_bytes: usize,
    /// How long SQLite waits for a lock held by someone else before failing. Default 5 s.
    pub busy_timeout: Duration,
    /// Test hook: make commits fail (after the statements ran, before COMMIT).
    #[cfg(test)]
    pub(crate) fail_commits: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SqliteStoreConfig {
    /// Defaults for everything but the file.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let engine = EngineConfig::default();
        Self {
            path: path.into(),
            log_capacity: engine.log_capacity,
            log_capacity_bytes: engine.log_capacity_bytes,
            max_batch: engine.max_batch,
            watch_buffer: engine.watch_buffer,
            watch_buffer_bytes: engine.watch_buffer_bytes,
            busy_timeout: Duration::from_secs(5),
            #[cfg(test)]
            fail_commits: Default::default(),
        }
    }

    fn engine(&self) -> EngineConfig {
        EngineConfig {
            log_capacity: self.log_capacity,
            log_capacity_bytes: self.log_capacity_bytes,
            max_batch: self.max_batch,
            watch_buffer: self.watch_buffer,
            watch_buffer_bytes: self.watch_buffer_bytes,
        }
    }
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

/// The SQLite [`Backend`]: one exclusive connection, owned by the engine's writer task.
pub struct SqliteBackend {
    conn: SqliteConnection,
    path: PathBuf,
    #[cfg(test)]
    fail_commits: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl CachedStore<SqliteBackend> {
    /// Open (or create) the database, migrate the schema, load every object and the persisted
    /// change log into memory and start the writer task. Must be called inside a Tokio runtime.
    pub async fn open(config: SqliteStoreConfig) -> Result<Self, StoreError> {
        let backend = SqliteBackend::open(&config).await?;
        CachedStore::start(backend, config.engine()).await
    }

    /// The durability settings in force on the writer's connection (read through the writer,
    /// which holds the database's exclusive lock). [`StoreError::Closed`] after
    /// [`CachedStore::close`].
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        self.backend_settings().await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.backend_info()
    }
}

/// The database holds every secret of the installation (Secrets' data, Jobs' env, token
/// records): it and its side files are 0600, whatever the umask, and an existing one of
/// this process's user that is not is made so (another user's is not ours to change).
/// SQLite gives a new WAL file the database file's mode.
fn private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
    // /proc/self belongs to the process's effective user.
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    let name = path.as_os_str().to_os_string();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut file = name.clone();
        file.push(suffix);
        match std::fs::metadata(&file) {
            Ok(meta) if meta.permissions().mode() & 0o077 != 0 && Some(meta.uid()) == me => {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

impl SqliteBackend {
    /// Open (or create) the database and migrate the schema, without loading anything: for
    /// `rlark backup`, `restore` and `store migrate`, which use the backend directly. Takes
    /// the database's exclusive lock, so it fails while a server has the file open.
    pub async fn open(config: &SqliteStoreConfig) -> Result<Self, StoreError> {
        if let Some(parent) = config.path.parent().filter(|p| !p.as_os_str().is_empty()) {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| StoreError::Database(format!("creating {}: {e}", parent.display())))?;
        }
        private_files(&config.path).map_err(|e| {
            StoreError::Database(format!("making {} private: {e}", config.path.display()))
        })?;
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
        Ok(Self {
            conn,
            path: config.path.clone(),
            #[cfg(test)]
            fail_commits: std::sync::Arc::clone(&config.fail_commits),
        })
    }

    #[cfg(test)]
    fn injected_failure(&self) -> Option<StoreError> {
        self.fail_commits
            .load(std::sync::atomic::Ordering::Relaxed)
            .then(|| StoreError::Database("injected commit failure".into()))
    }

    #[cfg(not(test))]
    fn injected_failure(&self) -> Option<StoreError> {
        None
    }
}

/// Bring the schema to [`SCHEMA_VERSION`], one numbered step at a time, in one transaction.
async fn migrate(conn: &mut SqliteConnection) -> Result<(), StoreError> {
    let mut tx = conn.begin().await.map_err(db_err("begin migration"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(db_err("creating table meta"))?;
    let found: Option<i64> =
        sqlx::query_scalar("SELECT value FROM meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(db_err("reading schema version"))?;
    let mut version = found.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Database(format!(
            "database schema version {version} is not supported (this build knows version {SCHEMA_VERSION})"
        )));
    }
    while version < SCHEMA_VERSION {
        version += 1;
        match version {
            1 => {
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
                    "INSERT INTO meta (key, value) VALUES ('revision', 0)
                     ON CONFLICT (key) DO NOTHING",
                )
                .execute(&mut *tx)
                .await
                .map_err(db_err("initializing meta"))?;
            }
            2 => {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS changes (
                        revision INTEGER PRIMARY KEY NOT NULL,
                        resource TEXT NOT NULL,
                        namespace TEXT NOT NULL,
                        name TEXT NOT NULL,
                        event_type TEXT NOT NULL,
                        value TEXT NOT NULL
                    )",
                )
                .execute(&mut *tx)
                .await
                .map_err(db_err("creating table changes"))?;
                // Nothing of the past is logged: the log starts at the present.
                sqlx::query(
                    "INSERT INTO meta (key, value)
                     SELECT 'compacted', value FROM meta WHERE key = 'revision'
                     ON CONFLICT (key) DO NOTHING",
                )
                .execute(&mut *tx)
                .await
                .map_err(db_err("initializing meta.compacted"))?;
            }
            3 => {
                for (statement, what) in [
                    (
                        "CREATE INDEX IF NOT EXISTS changes_by_key
                         ON changes (resource, namespace, name, revision)",
                        "indexing the change log by key",
                    ),
                    // A live object's row is in `changes` already when the floor is below its
                    // revision (the same write made both); otherwise it moves there now, below
                    // the floor, where only latest rows live.
                    (
                        "INSERT OR IGNORE INTO changes
                             (revision, resource, namespace, name, event_type, value)
                         SELECT revision, resource, namespace, name, 'ADDED', value FROM objects",
                        "moving objects into the change log",
                    ),
                    ("DROP TABLE objects", "dropping table objects"),
                    // Below the floor a key keeps only its latest row: a newer write of the
                    // key drops the compacted one. (Rows above the floor are the log; the
                    // compaction that moves the floor over them drops the superseded ones.)
                    (
                        "CREATE TRIGGER IF NOT EXISTS changes_supersede AFTER INSERT ON changes
                         BEGIN
                             DELETE FROM changes
                             WHERE resource = NEW.resource AND namespace = NEW.namespace
                               AND name = NEW.name AND revision < NEW.revision
                               AND revision <= (SELECT value FROM meta WHERE key = 'compacted');
                         END",
                        "creating trigger changes_supersede",
                    ),
                ] {
                    sqlx::query(statement)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err(what))?;
                }
            }
            other => unreachable!("no migration step {other}"),
        }
        sqlx::query(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(db_err("recording schema version"))?;
        tracing::info!(version, "store schema migrated");
    }
    tx.commit().await.map_err(db_err("committing migration"))
}

async fn meta_value(conn: &mut SqliteConnection, key: &str) -> Result<Revision, StoreError> {
    let value: Option<i64> = sqlx::query_scalar("SELECT value FROM meta WHERE key = ?1")
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err("reading meta"))?;
    from_db_int(value.unwrap_or(0), key)
}

#[async_trait]
impl Backend for SqliteBackend {
    type Settings = Durability;
    type Info = PathBuf;

    fn info(&self) -> PathBuf {
        self.path.clone()
    }

    async fn load(&mut self) -> Result<Loaded, StoreError> {
        let conn = &mut self.conn;
        let revision = meta_value(conn, "revision").await?;
        let compacted = meta_value(conn, "compacted").await?;
        // One pass in revision order: rows at or below the floor are live objects; rows above
        // it are the log, replayed over them.
        let mut objects: HashMap<ObjectKey, LoadedObject> = HashMap::new();
        let mut log = Vec::new();
        let mut rows = sqlx::query(
            "SELECT revision, resource, namespace, name, event_type, value FROM changes
             ORDER BY revision",
        )
        .fetch(&mut *conn);
        while let Some(row) = rows
            .try_next()
            .await
            .map_err(db_err("loading the change log"))?
        {
            let context = "loading the change log";
            let change_revision: i64 = row.try_get(0).map_err(db_err(context))?;
            let change_revision = from_db_int(change_revision, "change revision")?;
            let key = key_of(&row, 1).map_err(db_err(context))?;
            let event_type: String = row.try_get(4).map_err(db_err(context))?;
            let event_type = parse_event_type(&event_type)?;
            let text: String = row.try_get(5).map_err(db_err(context))?;
            let object = parse_object(&text, &key, "change-log entry")?;
            if change_revision > compacted {
                log.push(LoggedChange {
                    key: key.clone(),
                    event_type,
                    revision: change_revision,
                    object: object.clone(),
                });
            }
            if event_type == EventType::Deleted {
                objects.remove(&key);
            } else {
                objects.insert(
                    key.clone(),
                    LoadedObject {
                        key,
                        revision: change_revision,
                        object,
                    },
                );
            }
        }
        Ok(Loaded {
            objects: objects.into_values().collect(),
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
        let revision = changes.last().map_or(0, |c| c.revision);
        let injected_failure = self.injected_failure();

        let mut tx = self.conn.begin().await.map_err(db_err("begin"))?;
        insert_changes(&mut tx, changes).await?;
        sqlx::query("UPDATE meta SET value = ?1 WHERE key = 'revision'")
            .bind(to_db_int(revision)?)
            .execute(&mut *tx)
            .await
            .map_err(db_err("updating revision"))?;
        if let Some(floor) = compact_to {
            compact_in(&mut tx, floor).await?;
        }
        if let Some(e) = injected_failure {
            // Dropping `tx` rolls back, exactly as after a failed statement.
            return Err(e);
        }
        tx.commit().await.map_err(db_err("commit"))
    }

    async fn compact(&mut self, revision: Revision) -> Result<(), StoreError> {
        let mut tx = self.conn.begin().await.map_err(db_err("begin"))?;
        compact_in(&mut tx, revision).await?;
        tx.commit().await.map_err(db_err("commit compaction"))
    }

    async fn import(&mut self, objects: &[Change], revision: Revision) -> Result<(), StoreError> {
        let mut tx = self.conn.begin().await.map_err(db_err("begin"))?;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM changes")
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err("checking that the store is empty"))?;
        let current = meta_value(&mut tx, "revision").await?;
        if rows > 0 || current > 0 {
            return Err(StoreError::Database(format!(
                "{} is not empty (revision {current}, {rows} rows): a restore needs an empty store",
                self.path.display()
            )));
        }
        insert_changes(&mut tx, objects).await?;
        for key in ["revision", "compacted"] {
            sqlx::query("UPDATE meta SET value = ?1 WHERE key = ?2")
                .bind(to_db_int(revision)?)
                .bind(key)
                .execute(&mut *tx)
                .await
                .map_err(db_err("recording the restored revision"))?;
        }
        tx.commit().await.map_err(db_err("commit restore"))
    }

    async fn settings(&mut self) -> Result<Durability, StoreError> {
        let journal_mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db_err("reading journal_mode"))?;
        let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&mut self.conn)
            .await
            .map_err(db_err("reading synchronous"))?;
        Ok(Durability {
            journal_mode: journal_mode.to_ascii_lowercase(),
            synchronous,
        })
    }

    async fn close(self) {
        if let Err(e) = self.conn.close().await {
            tracing::error!(error = %e, path = %self.path.display(), "closing database");
        }
    }
}

/// Append `changes` to table `changes`: one multi-row `INSERT` per chunk, each chunk the
/// largest power of two that fits (few distinct statement texts to cache).
async fn insert_changes(conn: &mut SqliteConnection, changes: &[Change]) -> Result<(), StoreError> {
    let mut rest = changes;
    while !rest.is_empty() {
        let rows = MAX_ROWS_PER_INSERT.min(1 << rest.len().ilog2());
        let (chunk, tail) = rest.split_at(rows);
        rest = tail;
        let mut query = sqlx::query(insert_statement(rows));
        for change in chunk {
            let key = &change.key;
            query = query
                .bind(to_db_int(change.revision)?)
                .bind(key.resource.as_str())
                .bind(key.namespace.as_str())
                .bind(key.name.as_str())
                .bind(event_type_name(change.event_type))
                .bind(&*change.json);
        }
        query
            .execute(&mut *conn)
            .await
            .map_err(db_err("appending to the change log"))?;
    }
    Ok(())
}

/// The multi-row `INSERT` of `rows` changes (texts built once per size and kept).
fn insert_statement(rows: usize) -> &'static str {
    static STATEMENTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let statements = STATEMENTS.get_or_init(|| {
        (0..=MAX_ROWS_PER_INSERT.ilog2())
            .map(|power| {
                let rows = 1usize << power;
                let mut text = String::from(
                    "INSERT INTO changes (revision, resource, namespace, name, event_type, value) VALUES ",
                );
                for row in 0..rows {
                    if row > 0 {
                        text.push_str(", ");
                    }
                    let first = row * COLUMNS + 1;
                    let params: Vec<String> =
                        (first..first + COLUMNS).map(|n| format!("?{n}")).collect();
                    text.push('(');
                    text.push_str(&params.join(", "));
                    text.push(')');
                }
                text
            })
            .collect()
    });
    debug_assert!(rows.is_power_of_two() && rows <= MAX_ROWS_PER_INSERT);
    &statements[rows.ilog2() as usize]
}

/// Move the change log's floor up to `floor`: of the rows between the old floor and it, drop
/// deletions and every row a later row of its key supersedes (a live object's latest row
/// stays: it is the object), and record the floor.
async fn compact_in(conn: &mut SqliteConnection, floor: Revision) -> Result<(), StoreError> {
    let floor = to_db_int(floor)?;
    sqlx::query(
        "DELETE FROM changes
         WHERE revision > (SELECT value FROM meta WHERE key = 'compacted') AND revision <= ?1
           AND (event_type = 'DELETED' OR EXISTS (
                SELECT 1 FROM changes AS later
                WHERE later.resource = changes.resource AND later.namespace = changes.namespace
                  AND later.name = changes.name AND later.revision > changes.revision))",
    )
    .bind(floor)
    .execute(&mut *conn)
    .await
    .map_err(db_err("compacting the change log"))?;
    sqlx::query("UPDATE meta SET value = ?1 WHERE key = 'compacted'")
        .bind(floor)
        .execute(&mut *conn)
        .await
        .map_err(db_err("recording the change-log floor"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Instant;

    use futures::StreamExt;
    use serde_json::{Value, json};
    use tempfile::TempDir;

    use super::*;
    use crate::conformance;

    /// Issue 38 (key files private): the store holds Secrets and Jobs' env; it used to be
    /// created 0644. A new one is 0600, and an existing open one is made 0600.
    #[tokio::test]
    async fn the_database_file_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = TempDir::new().expect("dir");
        let mode =
            |path: &Path| std::fs::metadata(path).expect("meta").permissions().mode() & 0o777;
        let fresh = dir.path().join("fresh.db");
        drop(open(&fresh).await);
        assert_eq!(mode(&fresh), 0o600);
        let old = dir.path().join("old.db");
        std::fs::write(&old, b"").expect("write");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        drop(open(&old).await);
        assert_eq!(mode(&old), 0o600);
    }
    use crate::{
        ChangeLogStats, EncodedObject, ListOptions, ListResult, Store, WatchEvent, WatchStream,
    };

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
        async fn list_encoded_at(
            &self,
            resource: &str,
            options: &ListOptions,
            revision: Revision,
        ) -> Result<ListResult<EncodedObject>, StoreError> {
            self.store
                .list_encoded_at(resource, options, revision)
                .await
        }
        async fn watch(
            &self,
            resource: &str,
            namespace: Option<&str>,
            from: Revision,
        ) -> Result<WatchStream, StoreError> {
            self.store.watch(resource, namespace, from).await
        }
        async fn usage(
            &self,
            namespace: &str,
            resource: Option<&str>,
        ) -> Result<crate::Usage, StoreError> {
            self.store.usage(namespace, resource).await
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

    /// A plain connection to the database file (created if missing), beside the store: to
    /// write an older schema or read the tables as they are.
    async fn raw_connection(path: &Path) -> SqliteConnection {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true);
        SqliteConnection::connect_with(&options)
            .await
            .expect("raw connection")
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
            0,
            "the persisted change log reaches back to the first write"
        );
        assert_eq!(store.change_log().events, revision);
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

        // A watch from before the restart resumes from the persisted log: the update of `a`
        // (revision 4) and the deletion of `b` (revision 5), with their encodings.
        let mut resumed = store
            .watch(R, None, revision - 2)
            .await
            .expect("watch from before the restart");
        let event = next(&mut resumed)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!((event.event_type, event.revision), (EventType::Modified, 4));
        assert_eq!(event.object, a_stored);
        let event = next(&mut resumed)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!((event.event_type, event.revision), (EventType::Deleted, 5));
        assert_eq!(event.object["metadata"]["resourceVersion"], json!("5"));
        assert_eq!(
            event.json.as_deref(),
            Some(
                serde_json::to_string(&*event.object)
                    .expect("json")
                    .as_str()
            )
        );
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
        let mut conn = raw_connection(&path).await;
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
        let config = SqliteStoreConfig::new(&path);
        let fail_commits = Arc::clone(&config.fail_commits);
        let store = Arc::new(SqliteStore::open(config).await.expect("open store"));
        let a = key("ns", "a");
        let a_stored = store
            .create(&a, obj(&a, json!({"v": 1})))
            .await
            .expect("create a");
        let revision = store.revision();
        let mut stream = store.watch(R, None, revision).await.expect("watch");

        fail_commits.store(true, Ordering::Relaxed);
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

        fail_commits.store(false, Ordering::Relaxed);
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

    /// The change log is persisted with its compaction: after a restart it holds what it held
    /// before (bounded by the same window), watches resume from there, an explicit compaction
    /// is not undone by a restart, and the table does not grow past the window.
    #[tokio::test]
    async fn change_log_and_its_compaction_survive_restarts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let config = || {
            let mut config = SqliteStoreConfig::new(&path);
            config.log_capacity = 10;
            config
        };
        let store = SqliteStore::open(config()).await.expect("open");
        for i in 0..25 {
            let k = key("ns", &format!("o{i}"));
            store.create(&k, obj(&k, json!({}))).await.expect("create");
        }
        assert_eq!(store.compacted_revision(), 15);
        store.close().await;

        let store = SqliteStore::open(config()).await.expect("reopen");
        assert_eq!((store.revision(), store.compacted_revision()), (25, 15));
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
            assert_eq!(
                (event.event_type, event.revision),
                (EventType::Added, revision)
            );
        }
        store.compact(20).await.expect("compact");
        store.close().await;

        let store = SqliteStore::open(config()).await.expect("reopen");
        assert_eq!((store.revision(), store.compacted_revision()), (25, 20));
        for i in 0..30 {
            let k = key("ns", &format!("p{i}"));
            store.create(&k, obj(&k, json!({}))).await.expect("create");
        }
        // Rewrites and deletions of keys whose rows are already below the floor, and enough of
        // them to move the floor over their own earlier rows.
        let (p0, o1, p1) = (key("ns", "p0"), key("ns", "o1"), key("ns", "p1"));
        for round in 0..20 {
            let current = store.get(&p0).await.expect("get").expect("present");
            let mut next = (*current).clone();
            next["spec"] = json!({"round": round});
            store.update(&p0, next, None).await.expect("update");
        }
        store.delete(&o1, None).await.expect("delete o1");
        store.delete(&p1, None).await.expect("delete p1");
        let in_memory = store.compacted_revision();
        store.close().await;
        let mut conn = raw_connection(&path).await;
        // The table's floor follows the in-memory one a commit late.
        let floor: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'compacted'")
            .fetch_one(&mut conn)
            .await
            .expect("floor");
        assert!((in_memory - 1..=in_memory).contains(&u64::try_from(floor).expect("floor")));
        let logged: i64 = sqlx::query_scalar("SELECT count(*) FROM changes WHERE revision > ?1")
            .bind(floor)
            .fetch_one(&mut conn)
            .await
            .expect("count");
        assert!((10..=11).contains(&logged), "{logged} rows above the floor");
        // Below the floor only objects remain: one row per live key, none for a deleted key.
        let below: Vec<(String, i64)> = sqlx::query_as(
            "SELECT name, count(*) FROM changes WHERE revision <= ?1 GROUP BY resource, namespace, name",
        )
        .bind(floor)
        .fetch_all(&mut conn)
        .await
        .expect("rows below the floor");
        assert!(below.iter().all(|(_, rows)| *rows == 1), "{below:?}");
        let names: Vec<&str> = below.iter().map(|(name, _)| name.as_str()).collect();
        assert!(
            !names.contains(&"o1") && !names.contains(&"p1"),
            "{names:?}"
        );
        // p0's latest row is in the log above the floor; its older rows are gone.
        assert!(!names.contains(&"p0"), "{names:?}");
        assert_eq!(below.len(), 55 - 2 - 1);
        conn.close().await.expect("close raw connection");

        // What was written is what is read back.
        let store = SqliteStore::open(config()).await.expect("reopen");
        let p0 = store.get(&p0).await.expect("get").expect("p0 present");
        assert_eq!(p0["spec"], json!({"round": 19}));
        assert!(store.get(&o1).await.expect("get").is_none());
        assert!(store.get(&p1).await.expect("get").is_none());
        let listed = store.list(R, &ListOptions::default()).await.expect("list");
        assert_eq!(listed.items.len(), 53);
        store.close().await;
    }

    /// A backup of a store restores into an empty one with the same objects and revisions;
    /// a store that holds anything is refused, with nothing written. `Snapshot::of_backend`
    /// (the offline backup) reads the same snapshot as the running store's.
    #[tokio::test]
    async fn a_backup_restores_into_an_empty_store() {
        use crate::backup::{self, Snapshot, testing};
        let dir = tempfile::tempdir().expect("temp dir");
        let source = open(&dir.path().join("source.db")).await;
        testing::write_history(&source).await;
        let snapshot = source.snapshot();
        assert_eq!((snapshot.revision, snapshot.objects.len()), (6, 3));
        source.close().await;
        let mut offline =
            SqliteBackend::open(&SqliteStoreConfig::new(dir.path().join("source.db")))
                .await
                .expect("open the source backend");
        testing::assert_same(
            &Snapshot::of_backend(&mut offline).await.expect("load"),
            &snapshot,
        );
        let error = backup::import(&mut offline, &snapshot)
            .await
            .expect_err("a store with data")
            .to_string();
        assert!(error.contains("is not empty (revision 6"), "{error}");
        offline.close().await;

        let target = dir.path().join("target.db");
        let mut backend = SqliteBackend::open(&SqliteStoreConfig::new(&target))
            .await
            .expect("open the target backend");
        backup::import(&mut backend, &testing::through_a_file(&snapshot))
            .await
            .expect("import");
        backend.close().await;
        let restored = open(&target).await;
        testing::check_restored(&snapshot, &restored).await;
        restored.close().await;
    }

    /// A database written by schema version 2 (objects beside the change log) is migrated to
    /// the change log as the only copy: objects below the floor move into it, objects whose
    /// latest write is logged keep that row, the log still resumes watches, and the objects
    /// table is gone.
    #[tokio::test]
    async fn schema_version_2_is_migrated() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let mut conn = raw_connection(&path).await;
        for statement in [
            "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)",
            "CREATE TABLE objects (resource TEXT NOT NULL, namespace TEXT NOT NULL, \
             name TEXT NOT NULL, revision INTEGER NOT NULL, value TEXT NOT NULL, \
             PRIMARY KEY (resource, namespace, name))",
            "CREATE TABLE changes (revision INTEGER PRIMARY KEY NOT NULL, resource TEXT NOT NULL, \
             namespace TEXT NOT NULL, name TEXT NOT NULL, event_type TEXT NOT NULL, \
             value TEXT NOT NULL)",
            "INSERT INTO meta (key, value) VALUES ('schema_version', 2), ('revision', 9), \
             ('compacted', 5)",
        ] {
            sqlx::query(statement)
                .execute(&mut conn)
                .await
                .expect("v2 schema");
        }
        let stored = |name: &str, revision: u64, v: u64| {
            let k = key("ns", name);
            let mut o = obj(&k, json!({ "v": v }));
            o["metadata"]["resourceVersion"] = json!(revision.to_string());
            (k, o)
        };
        // `a` was last written below the floor (revision 3); `b` was created at 6 and updated
        // at 8 (both logged); `c` was created at 7 and deleted at 9 (logged, no object).
        let (a, a_obj) = stored("a", 3, 1);
        let (b, b6) = stored("b", 6, 1);
        let (_, b8) = stored("b", 8, 2);
        let (c, c7) = stored("c", 7, 1);
        for (revision, name, value) in [(3, "a", &a_obj), (8, "b", &b8)] {
            sqlx::query("INSERT INTO objects VALUES (?1, 'ns', ?2, ?3, ?4)")
                .bind(R)
                .bind(name)
                .bind(revision)
                .bind(value.to_string())
                .execute(&mut conn)
                .await
                .expect("v2 object");
        }
        for (revision, name, event_type, value) in [
            (6, "b", "ADDED", &b6),
            (7, "c", "ADDED", &c7),
            (8, "b", "MODIFIED", &b8),
            (9, "c", "DELETED", &c7),
        ] {
            sqlx::query("INSERT INTO changes VALUES (?1, ?2, 'ns', ?3, ?4, ?5)")
                .bind(revision)
                .bind(R)
                .bind(name)
                .bind(event_type)
                .bind(value.to_string())
                .execute(&mut conn)
                .await
                .expect("v2 change");
        }
        conn.close().await.expect("close raw connection");

        let store = open(&path).await;
        assert_eq!((store.revision(), store.compacted_revision()), (9, 5));
        assert_eq!(store.get(&a).await.expect("get").as_deref(), Some(&a_obj));
        assert_eq!(store.get(&b).await.expect("get").as_deref(), Some(&b8));
        assert!(store.get(&c).await.expect("get").is_none());
        let mut stream = store.watch(R, None, 5).await.expect("watch from the floor");
        let mut seen = Vec::new();
        for _ in 0..4 {
            let event = next(&mut stream).await.expect("event").expect("ok");
            seen.push((event.revision, event.event_type, event.key.name.clone()));
        }
        assert_eq!(
            seen,
            [
                (6, EventType::Added, "b".to_string()),
                (7, EventType::Added, "c".to_string()),
                (8, EventType::Modified, "b".to_string()),
                (9, EventType::Deleted, "c".to_string()),
            ]
        );
        store.close().await;

        let mut conn = raw_connection(&path).await;
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                .fetch_all(&mut conn)
                .await
                .expect("tables");
        assert_eq!(tables, ["changes", "meta"]);
        let rows: Vec<i64> = sqlx::query_scalar("SELECT revision FROM changes ORDER BY revision")
            .fetch_all(&mut conn)
            .await
            .expect("rows");
        assert_eq!(rows, [3, 6, 7, 8, 9]);
        conn.close().await.expect("close raw connection");
    }

    /// A database written by schema version 1 (no persisted change log) is migrated at open:
    /// its objects and revision are kept and the log starts at the present.
    #[tokio::test]
    async fn schema_version_1_is_migrated() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rlark.db");
        let mut conn = raw_connection(&path).await;
        for statement in [
            "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL)",
            "CREATE TABLE objects (resource TEXT NOT NULL, namespace TEXT NOT NULL, \
             name TEXT NOT NULL, revision INTEGER NOT NULL, value TEXT NOT NULL, \
             PRIMARY KEY (resource, namespace, name))",
            "INSERT INTO meta (key, value) VALUES ('schema_version', 1), ('revision', 7)",
        ] {
            sqlx::query(statement)
                .execute(&mut conn)
                .await
                .expect("v1 schema");
        }
        let a = key("ns", "a");
        let mut stored = obj(&a, json!({"v": 1}));
        stored["metadata"]["resourceVersion"] = json!("7");
        sqlx::query("INSERT INTO objects VALUES (?1, 'ns', 'a', 7, ?2)")
            .bind(R)
            .bind(stored.to_string())
            .execute(&mut conn)
            .await
            .expect("v1 object");
        conn.close().await.expect("close raw connection");

        let store = open(&path).await;
        assert_eq!((store.revision(), store.compacted_revision()), (7, 7));
        assert_eq!(store.get(&a).await.expect("get").as_deref(), Some(&stored));
        assert!(matches!(
            store.watch(R, None, 6).await,
            Err(StoreError::Expired { .. })
        ));
        let mut stream = store.watch(R, None, 7).await.expect("watch");
        store
            .update(&a, obj(&a, json!({"v": 2})), Some(7))
            .await
            .expect("update");
        let event = next(&mut stream)
            .await
            .expect("event")
            .expect("not an error");
        assert_eq!(event.revision, 8);
        store.close().await;
        let store = open(&path).await;
        assert_eq!((store.revision(), store.compacted_revision()), (8, 7));
        store.close().await;
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
