//! The store the server runs on: SQLite in the data directory (the default) or PostgreSQL
//! (`--store postgres://...`). One type for the rest of the server, which needs the
//! [`Store`] interface plus closing, counters and a description for logs and errors.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use rlark_store::{
    ChangeLogStats, EncodedObject, ListOptions, ListResult, ObjectKey, PostgresStore, Revision,
    SqliteStore, Store, StoreError, StoreStats, Usage, WatchStream,
};
use serde_json::Value;

#[derive(Clone, Debug)]
pub enum ServerStore {
    Sqlite(SqliteStore),
    Postgres(PostgresStore),
}

macro_rules! each {
    ($self:ident, $store:ident => $body:expr) => {
        match $self {
            ServerStore::Sqlite($store) => $body,
            ServerStore::Postgres($store) => $body,
        }
    };
}

impl ServerStore {
    /// Where the store is: the SQLite file, or `postgres://user@host:port/db` (no password).
    pub fn location(&self) -> PathBuf {
        match self {
            ServerStore::Sqlite(store) => store.path().to_path_buf(),
            ServerStore::Postgres(store) => PathBuf::from(format!("{:?}", store.backend_info())),
        }
    }

    /// See [`rlark_store::CachedStore::close`].
    pub async fn close(&self) {
        each!(self, store => store.close().await)
    }

    /// See [`rlark_store::CachedStore::is_available`].
    pub fn is_available(&self) -> bool {
        each!(self, store => store.is_available())
    }

    pub fn stats(&self) -> StoreStats {
        each!(self, store => store.stats())
    }

    /// See [`rlark_store::CachedStore::snapshot`].
    pub fn snapshot(&self) -> rlark_store::backup::Snapshot {
        each!(self, store => store.snapshot())
    }

    pub fn change_log(&self) -> ChangeLogStats {
        each!(self, store => store.change_log())
    }
}

#[async_trait]
impl Store for ServerStore {
    async fn create(&self, key: &ObjectKey, object: Value) -> Result<Arc<Value>, StoreError> {
        each!(self, store => store.create(key, object).await)
    }

    async fn get(&self, key: &ObjectKey) -> Result<Option<Arc<Value>>, StoreError> {
        each!(self, store => store.get(key).await)
    }

    async fn update(
        &self,
        key: &ObjectKey,
        object: Value,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError> {
        each!(self, store => store.update(key, object, expected).await)
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        expected: Option<Revision>,
    ) -> Result<Arc<Value>, StoreError> {
        each!(self, store => store.delete(key, expected).await)
    }

    async fn list(&self, resource: &str, options: &ListOptions) -> Result<ListResult, StoreError> {
        each!(self, store => store.list(resource, options).await)
    }

    async fn list_encoded(
        &self,
        resource: &str,
        options: &ListOptions,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        each!(self, store => store.list_encoded(resource, options).await)
    }

    async fn list_encoded_at(
        &self,
        resource: &str,
        options: &ListOptions,
        revision: Revision,
    ) -> Result<ListResult<EncodedObject>, StoreError> {
        each!(self, store => store.list_encoded_at(resource, options, revision).await)
    }

    async fn watch(
        &self,
        resource: &str,
        namespace: Option<&str>,
        from: Revision,
    ) -> Result<WatchStream, StoreError> {
        each!(self, store => store.watch(resource, namespace, from).await)
    }

    async fn sync(&self) -> Result<(), StoreError> {
        each!(self, store => store.sync().await)
    }

    async fn usage(&self, namespace: &str, resource: Option<&str>) -> Result<Usage, StoreError> {
        each!(self, store => store.usage(namespace, resource).await)
    }

    fn revision(&self) -> Revision {
        each!(self, store => store.revision())
    }

    async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
        each!(self, store => store.compact(revision).await)
    }

    fn compacted_revision(&self) -> Revision {
        each!(self, store => store.compacted_revision())
    }
}
