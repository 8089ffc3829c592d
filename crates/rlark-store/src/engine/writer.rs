//! The writer task: the commands the handles send it, group commit of a batch (evaluate,
//! encode, have the backend commit, apply to memory and publish), compaction, and catching up
//! with other writers of a shared database.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::rebuild::{Rebuilt, rebuild, watch_budget};
use super::{EngineConfig, HEALTH_CHECK_INTERVAL, Shared};
use crate::backend::{Backend, Change, Remote};
use crate::cache::{Stored, encode};
use crate::metadata::{self, Current, Op, Outcome};
use crate::watch::Fanout;
use crate::{EventType, ObjectKey, Revision, StoreError, WatchEvent};

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

pub(super) struct Request {
    pub(super) key: ObjectKey,
    pub(super) op: Op,
    pub(super) reply: Reply<Arc<Value>>,
}

pub(super) enum Command<B: Backend> {
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
pub(super) struct Writer<B: Backend> {
    pub(super) backend: B,
    pub(super) shared: Arc<Shared>,
    pub(super) max_batch: usize,
    /// The change-log floor the backend holds (it may lag the in-memory one by a batch).
    pub(super) persisted_floor: Revision,
    pub(super) config: EngineConfig,
    /// [`Backend::shared`]: other processes write the same database.
    pub(super) shared_db: bool,
    /// [`Backend::remote_signal`].
    pub(super) remote: Option<Arc<tokio::sync::Notify>>,
}

/// Per request of a batch: `Ok(index into the written changes)` or the final answer.
type Outcomes = Vec<Result<usize, Result<Arc<Value>, StoreError>>>;

/// How many times a batch on a shared backend is begun again after the database became
/// unavailable under it (the reconnect happens in `begin_write`).
const SHARED_ATTEMPTS: usize = 2;

impl<B: Backend> Writer<B> {
    pub(super) async fn run(mut self, mut rx: mpsc::Receiver<Command<B>>) {
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
pub(super) fn apply(shared: &Shared, changes: &[Change]) {
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
