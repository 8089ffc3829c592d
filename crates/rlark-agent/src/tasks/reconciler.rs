//! The reconciler: the Task watch, which replicas run on this node, and one worker each.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use futures::StreamExt as _;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::labels;
use rlark_api::types::Task;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::pods::delete_pod;
use super::recovery::{Recovered, end_recovered};
use super::worker::{Command, Worker};
use super::{RESYNC_INTERVAL, ReplicaId, Shared, TaskError, pod_name, run_key};

/// A worker: dropping it (the reconciler aborted, as when the agent crashes) aborts it,
/// so nothing of a dead agent keeps acting on its replicas.
struct WorkerHandle {
    key: String,
    commands: watch::Sender<Command>,
    join: AbortOnDropHandle<()>,
}

impl WorkerHandle {
    fn update(&self, task: Arc<Task>, resync: u64) {
        self.commands.send_if_modified(|current| {
            let same = matches!(current, Command::Run { task: old, resync: r }
                if *r == resync && old.resource_version() == task.resource_version());
            if !same {
                *current = Command::Run { task, resync };
            }
            !same
        });
    }
}

/// Which replicas an event of the Task watch may have changed.
enum Scope {
    /// Nothing yet (a relist in progress).
    None,
    /// Those of one Task.
    Task(String),
    /// Any: a relist completed, or the periodic resync.
    All,
}

pub(super) struct Reconciler {
    shared: Arc<Shared>,
    /// The Tasks of the namespace, by name, as last listed and watched.
    tasks: BTreeMap<String, Arc<Task>>,
    workers: BTreeMap<ReplicaId, WorkerHandle>,
    /// Workers told to go (and ends of replicas left by an earlier agent) that may still
    /// be running; a new worker for the same replica waits for the old one.
    retired: BTreeMap<ReplicaId, AbortOnDropHandle<()>>,
    generation: u64,
    /// [`Reconciler::sweep`] ran.
    swept: bool,
    /// Names of the Pods of the namespace in the listing taken at the last (re)list of the
    /// Tasks (`None`: that listing failed). A worker whose Pod was not there creates it
    /// without reading it first.
    listed_pods: Option<HashSet<String>>,
}

impl Reconciler {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            tasks: BTreeMap::new(),
            workers: BTreeMap::new(),
            retired: BTreeMap::new(),
            generation: 0,
            swept: false,
            listed_pods: None,
        }
    }

    pub(super) async fn watch(&mut self) -> Result<(), TaskError> {
        let api: Api<Task> = Api::namespaced(self.shared.client.clone(), &self.shared.namespace);
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut listing: Option<BTreeMap<String, Arc<Task>>> = None;
        let mut synced = false;
        let mut resync =
            tokio::time::interval_at(Instant::now() + RESYNC_INTERVAL, RESYNC_INTERVAL);
        let shutdown = self.shared.shutdown.clone();
        loop {
            // What the event changed: one Task's replicas, or possibly all of them. A watch
            // event reconciles only its Task, so a burst of N Task events costs O(N), not
            // O(N x Tasks) (issue 20: the whole map was walked for every event).
            let scope = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = resync.tick() => {
                    self.generation += 1;
                    Scope::All
                }
                event = stream.next() => match event {
                    None => return Err(TaskError::WatchEnded),
                    Some(Ok(watcher::Event::Apply(task))) => {
                        let name = task.name_any();
                        self.tasks.insert(name.clone(), Arc::new(task));
                        Scope::Task(name)
                    }
                    Some(Ok(watcher::Event::Delete(task))) => {
                        let name = task.name_any();
                        self.tasks.remove(&name);
                        Scope::Task(name)
                    }
                    Some(Ok(watcher::Event::Init)) => {
                        listing = Some(BTreeMap::new());
                        Scope::None
                    }
                    Some(Ok(watcher::Event::InitApply(task))) => {
                        if let Some(listing) = listing.as_mut() {
                            listing.insert(task.name_any(), Arc::new(task));
                        }
                        Scope::None
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(listing) = listing.take() {
                            self.tasks = listing;
                        }
                        synced = true;
                        self.delete_orphan_pods().await;
                        Scope::All
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "task watch failed (retrying)");
                        continue;
                    }
                },
            };
            if synced {
                match scope {
                    Scope::All => self.reconcile(),
                    Scope::Task(name) => self.reconcile_task(&name),
                    Scope::None => {}
                }
                if !self.swept {
                    self.sweep();
                    self.swept = true;
                }
            }
            self.retired.retain(|_, join| !join.is_finished());
        }
    }

    /// The replicas of Task `name` (`task`) that should run here, into `desired`:
    /// id → (run key, Task).
    fn desired_of(
        &self,
        name: &str,
        task: &Arc<Task>,
        desired: &mut BTreeMap<ReplicaId, (String, Arc<Task>)>,
    ) {
        let ctx = &self.shared.ctx;
        let nodes = task
            .spec
            .placement
            .as_ref()
            .map(|p| p.nodes.as_slice())
            .unwrap_or_default();
        // Most Tasks have no replica here: the run key is made only for those that do.
        if !nodes.contains(&ctx.node_name) {
            return;
        }
        let Some(key) = run_key(task, &ctx.cluster_id) else {
            return;
        };
        let replicas = usize::try_from(task.spec.replicas().max(0)).unwrap_or(0);
        for (index, node) in nodes.iter().enumerate().take(replicas) {
            if *node == ctx.node_name {
                desired.insert((name.to_string(), index), (key.clone(), task.clone()));
            }
        }
    }

    /// One pass over every Task: start, update, replace and retire workers so they match.
    fn reconcile(&mut self) {
        let mut desired = BTreeMap::new();
        for (name, task) in &self.tasks {
            self.desired_of(name, task, &mut desired);
        }
        let unwanted: Vec<ReplicaId> = self
            .workers
            .keys()
            .filter(|id| !desired.contains_key(*id))
            .cloned()
            .collect();
        self.apply(unwanted, desired);
    }

    /// [`Reconciler::reconcile`] for the replicas of one Task (`name`, present or gone).
    fn reconcile_task(&mut self, name: &str) {
        let mut desired = BTreeMap::new();
        if let Some(task) = self.tasks.get(name) {
            self.desired_of(name, task, &mut desired);
        }
        let first: ReplicaId = (name.to_string(), 0);
        let unwanted: Vec<ReplicaId> = self
            .workers
            .range(first..)
            .map(|(id, _)| id)
            .take_while(|(task, _)| task == name)
            .filter(|id| !desired.contains_key(*id))
            .cloned()
            .collect();
        self.apply(unwanted, desired);
    }

    /// Retire the workers of `unwanted`; start, update or replace those of `desired`.
    fn apply(
        &mut self,
        unwanted: Vec<ReplicaId>,
        desired: BTreeMap<ReplicaId, (String, Arc<Task>)>,
    ) {
        for id in unwanted {
            if let Some(worker) = self.workers.remove(&id) {
                worker.commands.send_replace(Command::Remove);
                self.retired.insert(id, worker.join);
            }
        }
        for (id, (key, task)) in desired {
            if let Some(worker) = self.workers.get(&id)
                && worker.key == key
            {
                worker.update(task, self.generation);
                continue;
            }
            let previous = match self.workers.remove(&id) {
                Some(old) => {
                    old.commands.send_replace(Command::Supersede);
                    Some(old.join)
                }
                None => self.retired.remove(&id),
            };
            let (commands, receiver) = watch::channel(Command::Run {
                task: task.clone(),
                resync: self.generation,
            });
            let pod = pod_name(&id.0, id.1);
            let pod_may_exist = self
                .listed_pods
                .as_ref()
                .is_none_or(|listed| listed.contains(&pod));
            let worker = Worker::new(
                self.shared.clone(),
                pod,
                pod_may_exist,
                id.1,
                key.clone(),
                receiver,
                task,
                self.generation,
            );
            let join = AbortOnDropHandle::new(tokio::spawn(worker.run(previous)));
            self.workers.insert(
                id,
                WorkerHandle {
                    key,
                    commands,
                    join,
                },
            );
        }
    }

    /// End the replicas left by an earlier agent that no worker took over after the first
    /// full listing (see [`end_recovered`]); a later worker of the same replica waits for
    /// that end.
    fn sweep(&mut self) {
        let left: Vec<(ReplicaId, Vec<Recovered>)> = {
            let mut recovered = self
                .shared
                .recovered
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let ids: Vec<ReplicaId> = recovered
                .keys()
                .filter(|id| !self.workers.contains_key(*id))
                .cloned()
                .collect();
            ids.into_iter()
                .filter_map(|id| recovered.remove(&id).map(|r| (id, r)))
                .collect()
        };
        for (id, replicas) in left {
            let shared = self.shared.clone();
            let previous = self.retired.remove(&id);
            let join = tokio::spawn(async move {
                if let Some(previous) = previous {
                    let _ = previous.await;
                }
                for r in replicas {
                    end_recovered(&shared, r, true).await;
                }
            });
            self.retired.insert(id, AbortOnDropHandle::new(join));
        }
    }

    /// Delete the Pods on this node whose Task no longer exists (deleted while the agent
    /// was away or the watch was down). One attempt; the next relist tries again.
    /// Also records the listed names ([`Reconciler::listed_pods`]).
    async fn delete_orphan_pods(&mut self) {
        let api = self.shared.pods();
        let pods = match api
            .list(&ListParams::default().labels(labels::TASK_NAME))
            .await
        {
            Ok(list) => list.items,
            Err(error) => {
                tracing::warn!(%error, "list pods to clean up");
                self.listed_pods = None;
                return;
            }
        };
        self.listed_pods = Some(pods.iter().map(kube::ResourceExt::name_any).collect());
        for pod in pods {
            let task = pod
                .labels()
                .get(labels::TASK_NAME)
                .cloned()
                .unwrap_or_default();
            let on_this_node = pod.status.as_ref().and_then(|s| s.node.as_deref())
                == Some(self.shared.ctx.node_name.as_str());
            let ours_running = self.workers.keys().any(|(t, _)| *t == task);
            if on_this_node && !ours_running && !self.tasks.contains_key(&task) {
                tracing::info!(pod = %pod.name_any(), task = %task, "deleting the pod of a deleted task");
                if let Err(error) = delete_pod(&api, &pod).await {
                    tracing::warn!(%error, pod = %pod.name_any(), "delete orphan pod");
                }
            }
        }
    }

    /// Tell every worker the agent stops and wait for all of them.
    pub(super) async fn stop_workers(&mut self) {
        let mut joins: Vec<AbortOnDropHandle<()>> = Vec::new();
        for (_, worker) in std::mem::take(&mut self.workers) {
            worker.commands.send_replace(Command::Shutdown);
            joins.push(worker.join);
        }
        joins.extend(std::mem::take(&mut self.retired).into_values());
        for join in joins {
            if let Err(error) = join.await {
                tracing::warn!(%error, "replica worker failed");
            }
        }
    }
}
