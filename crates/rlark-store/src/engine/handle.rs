//! The [`CachedStore`] handle: start (load and spawn the writer), close, counters and
//! snapshot, and its [`Store`] implementation (reads from memory, writes through the writer).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use async_trait::async_trait;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::rebuild::{Rebuilt, rebuild, watch_budget};
use super::writer::{Command, Request, Writer};
use super::{CachedStore, EngineConfig, Inner, MAX_BATCH, Shared, State, StoreStats};
use crate::backend::Backend;
use crate::backup::{Snapshot, SnapshotObject};
use crate::cache::{Encoded, Stored, page_of};
use crate::changelog::ChangeLogStats;
use crate::metadata::{self, Op};
use crate::watch::{Fanout, Filter};
use crate::{
    EncodedObject, ListOptions, ListResult, ObjectKey, Revision, Store, StoreError, Usage,
    WatchStream,
};

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
