//! The simulated agent's Task side: one run per Task placed on its cluster, playing the
//! Task's [`Behaviour`] on the replica Pods it creates.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::labels;
use rlark_api::types::{AgentType, Pod, Task};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::pods::{
    RUN_KEY_ANNOTATION, pod_is_terminal, replica_pod, run_key, running_status, stopped_status,
};
use super::{Shared, lock};

/// Pause between retries of a failed API call inside a run.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Where a run of a Task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    /// Creating Pods / replicas running.
    Active,
    /// Every replica ended on its own.
    Finished,
    /// Ended (or never started) because the Task is stopped.
    Stopped,
}

/// The agent's handle on one run of one Task.
struct RunHandle {
    /// [`run_key`] of the run; empty for the clean-up after a deletion.
    key: String,
    updates: watch::Sender<Task>,
    state: Arc<Mutex<RunState>>,
    cancel: CancellationToken,
    join: JoinHandle<()>,
}

pub(super) async fn task_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    let api: Api<Task> = Api::namespaced(shared.client.clone(), &shared.namespace);
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut runs: HashMap<String, RunHandle> = HashMap::new();
    let mut listed: Option<HashSet<String>> = None;
    loop {
        let event = tokio::select! {
            _ = shutdown.cancelled() => break,
            event = stream.next() => event,
        };
        let Some(event) = event else { break };
        match event {
            Ok(watcher::Event::Apply(task)) => dispatch(&shared, &mut runs, task, &shutdown),
            Ok(watcher::Event::Delete(task)) => {
                forget(&shared, &mut runs, &task.name_any(), &shutdown);
            }
            Ok(watcher::Event::Init) => listed = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(task)) => {
                if let Some(listed) = listed.as_mut() {
                    listed.insert(task.name_any());
                }
                dispatch(&shared, &mut runs, task, &shutdown);
            }
            Ok(watcher::Event::InitDone) => {
                let listed = listed.take().unwrap_or_default();
                // Tasks deleted while the watch was down.
                let gone: Vec<String> = runs
                    .keys()
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    forget(&shared, &mut runs, &name, &shutdown);
                }
                // Pods of Tasks deleted while the agent was not running.
                let orphans = shared.clone();
                tokio::spawn(async move {
                    delete_orphan_pods(&orphans, &listed).await;
                });
            }
            Err(error) => tracing::debug!(%error, "sim agent task watch error (retrying)"),
        }
    }
    for (_, run) in runs.drain() {
        run.cancel.cancel();
        let _ = run.join.await;
    }
}

/// Route a Task (added or changed) to its run, starting a new run when needed.
fn dispatch(
    shared: &Arc<Shared>,
    runs: &mut HashMap<String, RunHandle>,
    task: Task,
    shutdown: &CancellationToken,
) {
    let name = task.name_any();
    let Some(key) = run_key(&task, &shared.cluster_id) else {
        // Not (or no longer) placed here, or being deleted: end any run and its Pods.
        if runs.get(&name).is_some_and(|r| !r.key.is_empty()) {
            forget(shared, runs, &name, shutdown);
        }
        return;
    };
    if let Some(run) = runs.get(&name)
        && run.key == key
    {
        let state = *lock(&run.state);
        let resumed = state == RunState::Stopped && !task.spec.stopped;
        if !resumed {
            run.updates.send_replace(task);
            return;
        }
    }
    // A new run: a new Task, a restart, a new placement, or a resume.
    let previous = runs.remove(&name).map(|run| {
        run.cancel.cancel();
        run.join
    });
    // Pods of an earlier run may be adopted only by the first run this agent starts for
    // the Task (the agent restarted); a resume always starts afresh.
    let may_adopt = previous.is_none();
    let (updates, receiver) = watch::channel(task.clone());
    let state = Arc::new(Mutex::new(RunState::Active));
    let cancel = shutdown.child_token();
    let join = tokio::spawn(run_task(
        shared.clone(),
        task,
        key.clone(),
        receiver,
        state.clone(),
        cancel.clone(),
        previous,
        may_adopt,
    ));
    runs.insert(
        name,
        RunHandle {
            key,
            updates,
            state,
            cancel,
            join,
        },
    );
}

/// The Task is gone: end its run and delete its Pods (after the run has ended).
fn forget(
    shared: &Arc<Shared>,
    runs: &mut HashMap<String, RunHandle>,
    name: &str,
    shutdown: &CancellationToken,
) {
    let previous = runs.remove(name).map(|run| {
        run.cancel.cancel();
        run.join
    });
    let cleanup_shared = shared.clone();
    let task_name = name.to_string();
    let cancel = shutdown.child_token();
    let guard = cancel.clone();
    let join = tokio::spawn(async move {
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        tokio::select! {
            _ = guard.cancelled() => {}
            _ = delete_pods(&cleanup_shared, &task_name) => {}
        }
    });
    // A placeholder run (empty key) so a Task recreated with the same name waits for the
    // clean-up before creating its Pods.
    let (updates, _) = watch::channel(Task::new(name, placeholder_spec()));
    runs.insert(
        name.to_string(),
        RunHandle {
            key: String::new(),
            updates,
            state: Arc::new(Mutex::new(RunState::Finished)),
            cancel,
            join,
        },
    );
}

pub(super) fn placeholder_spec() -> rlark_api::types::TaskSpec {
    rlark_api::types::TaskSpec {
        agent_type: AgentType::Raw,
        role: rlark_api::types::TaskRole::Actor,
        domain: None,
        downstream_name: None,
        node_selector: BTreeMap::new(),
        node_name: None,
        placement: None,
        stopped: false,
        node_lost_policy: None,
        kubernetes: None,
        docker: None,
        raw: None,
        tensor_board_dir: None,
        prepare_script: None,
        run_script: None,
        ssh_public_key: None,
        input: None,
        env_from: None,
    }
}

async fn delete_pods(shared: &Shared, task_name: &str) {
    let api = shared.pods_api();
    let list_params = ListParams::default().labels(&format!("{}={task_name}", labels::TASK_NAME));
    loop {
        match api.list(&list_params).await {
            Ok(list) => {
                let mut ok = true;
                for pod in list.items {
                    if let Err(error) = delete_pod(&api, &pod.name_any()).await {
                        tracing::warn!(%error, pod = %pod.name_any(), "sim agent: delete pod");
                        ok = false;
                    }
                }
                if ok {
                    return;
                }
            }
            Err(error) => tracing::warn!(%error, task = task_name, "sim agent: list pods"),
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

async fn delete_orphan_pods(shared: &Shared, tasks: &HashSet<String>) {
    let api = shared.pods_api();
    let Ok(list) = api
        .list(&ListParams::default().labels(labels::TASK_NAME))
        .await
    else {
        return;
    };
    for pod in list.items {
        let owner = pod.labels().get(labels::TASK_NAME).cloned();
        if owner.is_some_and(|t| !tasks.contains(&t)) {
            let _ = api.delete(&pod.name_any(), &DeleteParams::default()).await;
        }
    }
}

/// Retry `op` until it succeeds (a real agent keeps trying; the run's cancellation ends it).
async fn retry<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    loop {
        match op().await {
            Ok(v) => return v,
            Err(error) => {
                tracing::warn!(%error, what, "sim agent: API call failed, retrying");
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Delete a Pod; an absent one is fine.
async fn delete_pod(api: &Api<Pod>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Create a Pod; one left over under the same name (from a run that ended while this one
/// started) is deleted and the error returned, so the caller retries.
async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<Pod, kube::Error> {
    match api.create(&PostParams::default(), pod).await {
        Err(kube::Error::Api(s)) if s.code == 409 => {
            delete_pod(api, &pod.name_any()).await?;
            Err(kube::Error::Api(s))
        }
        other => other,
    }
}

/// Merge-patch a Pod's status with `{"status": status}`; an absent Pod is fine.
async fn patch_pod_status(
    api: &Api<Pod>,
    name: &str,
    status: &serde_json::Value,
) -> Result<(), kube::Error> {
    let patch = json!({ "status": status });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

/// One run of one Task, until it ends, the Task changes its mind, or the agent stops.
#[allow(clippy::too_many_arguments)]
async fn run_task(
    shared: Arc<Shared>,
    task: Task,
    key: String,
    updates: watch::Receiver<Task>,
    state: Arc<Mutex<RunState>>,
    cancel: CancellationToken,
    previous: Option<JoinHandle<()>>,
    may_adopt: bool,
) {
    if let Some(previous) = previous {
        let _ = previous.await;
    }
    let name = task.name_any();
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = run_body(&shared, task, &key, updates, &state, may_adopt) => {}
    }
    tracing::debug!(task = %name, "sim agent run ended");
}

async fn run_body(
    shared: &Shared,
    task: Task,
    key: &str,
    mut updates: watch::Receiver<Task>,
    state: &Mutex<RunState>,
    may_adopt: bool,
) {
    let name = task.name_any();
    let api = shared.pods_api();
    let list_params = ListParams::default().labels(&format!("{}={name}", labels::TASK_NAME));
    let nodes = task
        .spec
        .placement
        .as_ref()
        .map(|p| p.nodes.clone())
        .unwrap_or_default();
    let existing = retry("list pods", || api.list(&list_params)).await.items;

    if task.spec.stopped {
        stop_pods(&api, &existing).await;
        *lock(state) = RunState::Stopped;
        return;
    }

    let behaviour = shared.behaviour(&name);
    let adopt = may_adopt
        && existing.len() == nodes.len()
        && existing
            .iter()
            .all(|p| p.annotations().get(RUN_KEY_ANNOTATION).map(String::as_str) == Some(key));
    let mut pods: Vec<Pod> = if adopt {
        if existing.iter().all(pod_is_terminal) {
            *lock(state) = RunState::Finished;
            return;
        }
        existing
    } else {
        for pod in &existing {
            let pod_name = pod.name_any();
            retry("delete stale pod", || delete_pod(&api, &pod_name)).await;
        }
        shared.runs_started.fetch_add(1, Ordering::SeqCst);
        lock(&shared.run_log).push(name.clone());
        let mut created = Vec::with_capacity(nodes.len());
        for (index, node) in nodes.iter().enumerate() {
            let pod = replica_pod(&task, index, key);
            let pod = retry("create pod", || create_pod(&api, &pod)).await;
            if !shared.start_delay.is_zero() {
                let pod_name = pod.name_any();
                let pending = json!({"phase": "Pending", "node": node});
                retry("report pod pending", || {
                    patch_pod_status(&api, &pod_name, &pending)
                })
                .await;
            }
            created.push(pod);
        }
        if !shared.start_delay.is_zero() {
            tokio::time::sleep(shared.start_delay).await;
        }
        let now = Timestamp::now();
        for (pod, node) in created.iter().zip(&nodes) {
            let pod_name = pod.name_any();
            let running = running_status(node, now);
            retry("report pod running", || {
                patch_pod_status(&api, &pod_name, &running)
            })
            .await;
        }
        created
    };

    // Replicas run until the behaviour ends them or the Task is stopped.
    let ends_at = behaviour
        .runs_for()
        .map(|d| tokio::time::Instant::now() + d);
    loop {
        let timer = async {
            match ends_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = timer => {
                if let Some(status) = behaviour.final_status(Timestamp::now()) {
                    for pod in pods.iter().filter(|p| !pod_is_terminal(p)) {
                        let pod_name = pod.name_any();
                        retry("report pod finished", || {
                            patch_pod_status(&api, &pod_name, &status)
                        })
                        .await;
                    }
                }
                *lock(state) = RunState::Finished;
                return;
            }
            changed = updates.changed() => {
                if changed.is_err() {
                    // The agent dropped the run's handle: it is being replaced or stopped.
                    return;
                }
                if updates.borrow_and_update().spec.stopped {
                    pods.retain(|p| !pod_is_terminal(p));
                    stop_pods(&api, &pods).await;
                    *lock(state) = RunState::Stopped;
                    return;
                }
            }
        }
    }
}

/// End every non-terminal Pod in `pods` as stopped.
async fn stop_pods(api: &Api<Pod>, pods: &[Pod]) {
    let status = stopped_status(Timestamp::now());
    for pod in pods.iter().filter(|p| !pod_is_terminal(p)) {
        let pod_name = pod.name_any();
        retry("report pod stopped", || {
            patch_pod_status(api, &pod_name, &status)
        })
        .await;
    }
}
