//! The simulated agent's Task side: one run per Task placed on its cluster, playing the
//! Task's [`Behaviour`] on the replica Pods it creates.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::agent::replica::{Action, Adopted, End, Event, Now, Replica, RunSpec, State};
use rlark_api::agent::status::{ExitCause, ExitReport, StatusPatch};
use rlark_api::agent::{REASON_BACKOFF, RUN_KEY_ANNOTATION, replica_pod, run_key};
use rlark_api::labels;
use rlark_api::types::{AgentType, Pod, PodPhase, Task};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Behaviour, STOPPED_EXIT_CODE, Shared, lock};

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

fn placeholder_spec() -> rlark_api::types::TaskSpec {
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
        on_device_unhealthy: None,
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
    let play = Play {
        api: &api,
        behaviour: shared.behaviour(&name),
        start_delay: shared.start_delay,
    };
    let spec = RunSpec::for_task(&task);

    if task.spec.stopped {
        // Whatever still runs of the Task (this run's or an earlier one's) is stopped.
        for pod in existing.iter().filter(|p| !pod_is_terminal(p)) {
            let mut replica = SimReplica::adopting(pod, spec);
            replica.step(&play, adopt_event(pod, true)).await;
        }
        *lock(state) = RunState::Stopped;
        return;
    }

    let adopt = may_adopt
        && existing.len() == nodes.len()
        && existing
            .iter()
            .all(|p| p.annotations().get(RUN_KEY_ANNOTATION).map(String::as_str) == Some(key));
    let mut replicas: Vec<SimReplica> = if adopt {
        if existing.iter().all(pod_is_terminal) {
            *lock(state) = RunState::Finished;
            return;
        }
        let mut adopted = Vec::with_capacity(existing.len());
        for pod in &existing {
            let mut replica = SimReplica::adopting(pod, spec);
            if pod_is_terminal(pod) {
                replica.end = Some(End::Finished);
            } else {
                replica.step(&play, adopt_event(pod, false)).await;
            }
            adopted.push(replica);
        }
        adopted
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
            let mut replica = SimReplica::new(pod.name_any(), Replica::new(node.as_str(), spec));
            replica.start(&play).await;
            created.push(replica);
        }
        // Every replica's simulated process takes `start_delay` to start (the Pods were
        // reported `Pending` meanwhile).
        if !play.start_delay.is_zero() {
            tokio::time::sleep(play.start_delay).await;
        }
        for replica in &mut created {
            replica
                .step(
                    &play,
                    Event::Started {
                        at: Timestamp::now(),
                    },
                )
                .await;
        }
        created
    };

    // Replicas run until their behaviour, their deadline or a stop of the Task ends them.
    loop {
        if replicas.iter().all(|r| r.end.is_some()) {
            let stopped = replicas.iter().any(|r| r.end == Some(End::Stopped));
            *lock(state) = if stopped {
                RunState::Stopped
            } else {
                RunState::Finished
            };
            return;
        }
        let next = replicas
            .iter()
            .enumerate()
            .filter_map(|(index, r)| r.next_timer().map(|(at, timer)| (at, index, timer)))
            .min_by_key(|(at, ..)| *at);
        let sleep = async {
            match next {
                Some((at, ..)) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {
                if let Some((_, index, timer)) = next {
                    replicas[index].fire(&play, timer).await;
                }
            }
            changed = updates.changed() => {
                if changed.is_err() {
                    // The agent dropped the run's handle: it is being replaced or stopped.
                    return;
                }
                let task = updates.borrow_and_update().clone();
                let spec = RunSpec::for_task(&task);
                for replica in &mut replicas {
                    replica.machine.set_spec(spec);
                    if task.spec.stopped && replica.machine.follows_task() {
                        replica.step(&play, Event::Stop).await;
                    }
                }
            }
        }
    }
}

/// What a run's replicas play, and where their Pods are.
struct Play<'a> {
    api: &'a Api<Pod>,
    behaviour: Behaviour,
    start_delay: Duration,
}

/// How a Pod found from an earlier run is taken over: waiting to restart (its reason is
/// `BackOff`), else running since its `startTime`.
fn adopt_event(pod: &Pod, task_stopped: bool) -> Event {
    let status = pod.status.clone().unwrap_or_default();
    let first_start = status.start_time.map_or_else(Timestamp::now, |Time(at)| at);
    let restarts = status.restart_count.unwrap_or(0);
    // A replica waiting to restart is adopted with the restart about to happen counted.
    let (at, restarts) = if status.reason.as_deref() == Some(REASON_BACKOFF) {
        (Adopted::Restart, restarts.saturating_add(1))
    } else {
        let started_at = first_start;
        (Adopted::Running { started_at }, restarts)
    };
    Event::Adopt {
        at,
        restarts,
        first_start,
        task_stopped,
    }
}

/// How a simulated process ends: on its own with `code`, or killed by SIGTERM (the
/// simulated process exits at once, with [`STOPPED_EXIT_CODE`]).
fn exit_report(code: Option<i32>, cause: ExitCause) -> ExitReport {
    let (code, description) = match code {
        Some(code) => (code, format!("exited with code {code}")),
        None => (STOPPED_EXIT_CODE, "was killed by SIGTERM".to_string()),
    };
    ExitReport {
        code: Some(code),
        description,
        cause,
        killed: false,
        finished_at: Timestamp::now(),
    }
}

/// What a replica waits for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Its simulated process ends as the behaviour says.
    Exit,
    /// Its `activeDeadlineSeconds` passed while the process runs: it is killed.
    Deadline,
    /// The state machine asked to be woken ([`Action::WakeAt`]).
    Wake,
}

/// One simulated replica: its Pod, the protocol's state machine deciding what happens to
/// it, and the times its simulated process and the machine wait for.
struct SimReplica {
    pod: String,
    machine: Replica<Instant>,
    /// When the running process ends on its own (`None`: not running, or never).
    exits_at: Option<Instant>,
    /// When the running process is killed at its deadline.
    deadline: Option<Instant>,
    /// When the machine wants [`Event::Wake`].
    wake_at: Option<Instant>,
    /// A [`Action::Spawn`] waits for its [`Event::Started`].
    starting: bool,
    /// How the run ended for this replica.
    end: Option<End>,
}

impl SimReplica {
    fn new(pod: String, machine: Replica<Instant>) -> Self {
        Self {
            pod,
            machine,
            exits_at: None,
            deadline: None,
            wake_at: None,
            starting: false,
            end: None,
        }
    }

    /// The replica of a Pod an earlier run (or an earlier agent) left.
    fn adopting(pod: &Pod, spec: RunSpec) -> Self {
        let node = pod
            .status
            .as_ref()
            .and_then(|s| s.node.clone())
            .unwrap_or_default();
        Self::new(pod.name_any(), Replica::new(node, spec))
    }

    /// The first start of a fresh run: the caller delivers [`Event::Started`] after the
    /// start delay (so that every replica of the run starts together).
    async fn start(&mut self, play: &Play<'_>) {
        self.run(play, Event::Start, false).await;
    }

    /// Deliver `event` (and what follows from it at once).
    async fn step(&mut self, play: &Play<'_>, event: Event) {
        self.run(play, event, true).await;
    }

    /// What the replica waits for next, and when.
    fn next_timer(&self) -> Option<(Instant, Timer)> {
        if self.end.is_some() {
            return None;
        }
        [
            self.exits_at.map(|at| (at, Timer::Exit)),
            self.deadline.map(|at| (at, Timer::Deadline)),
            self.wake_at.map(|at| (at, Timer::Wake)),
        ]
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at)
    }

    /// `timer` came.
    async fn fire(&mut self, play: &Play<'_>, timer: Timer) {
        let event = match timer {
            Timer::Exit => match play.behaviour.exit_code() {
                Some(code) => Event::Exited(exit_report(Some(code), ExitCause::Exited)),
                None => return,
            },
            Timer::Deadline => Event::Exited(exit_report(None, ExitCause::DeadlineExceeded)),
            Timer::Wake => {
                self.wake_at = None;
                Event::Wake
            }
        };
        self.step(play, event).await;
    }

    /// Feed `event` to the machine and carry out its actions; events that follow at once
    /// (a killed process exits on SIGTERM; with `start_at_once`, a spawned one starts) are
    /// fed in turn.
    async fn run(&mut self, play: &Play<'_>, event: Event, start_at_once: bool) {
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            let now = Now {
                mono: Instant::now(),
                wall: Timestamp::now(),
            };
            if matches!(event, Event::Exited(_)) {
                self.exits_at = None;
                self.deadline = None;
            }
            if matches!(event, Event::Started { .. }) {
                self.starting = false;
            }
            let was_running = matches!(self.machine.state(), State::Running { .. });
            for action in self.machine.step(event, now) {
                match action {
                    Action::Spawn {
                        deadline, pending, ..
                    } => {
                        self.deadline = deadline;
                        self.starting = true;
                        if let Some(pending) = pending.filter(|_| !play.start_delay.is_zero()) {
                            self.write(play, "report pod pending", &pending).await;
                        }
                        if start_at_once {
                            events.push_back(Event::Started {
                                at: Timestamp::now(),
                            });
                        }
                    }
                    Action::Kill { .. } => {
                        events.push_back(Event::Exited(exit_report(None, ExitCause::Terminated)));
                    }
                    Action::WriteStatus(patch) => {
                        self.write(play, "report pod status", &patch).await;
                    }
                    Action::Finish(patch) | Action::FinishExited(patch) => {
                        self.write(play, "report pod finished", &patch).await;
                    }
                    Action::DeletePod => {
                        let pod = self.pod.clone();
                        retry("delete pod", || delete_pod(play.api, &pod)).await;
                    }
                    Action::WakeAt(at) => self.wake_at = Some(at),
                    Action::Done(end) => {
                        self.end = Some(end);
                        self.exits_at = None;
                        self.deadline = None;
                        self.wake_at = None;
                    }
                    // The simulated agent keeps no state file and no run directory: the
                    // Pod's run-key annotation is what a restarted one adopts by.
                    Action::SaveState
                    | Action::DeleteState
                    | Action::PruneOldRuns
                    | Action::Detach => {}
                }
            }
            let running = matches!(self.machine.state(), State::Running { .. });
            if running && !was_running {
                // The simulated process runs from now until the behaviour ends it.
                self.exits_at = play.behaviour.runs_for().map(|d| now.mono + d);
            }
        }
    }

    /// Merge-patch the Pod's status with `patch`, until it is written.
    async fn write(&self, play: &Play<'_>, what: &str, patch: &StatusPatch) {
        let status = patch.to_json();
        retry(what, || patch_pod_status(play.api, &self.pod, &status)).await;
    }
}

fn pod_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase),
        Some(PodPhase::Succeeded | PodPhase::Failed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_api::agent::grace_period;
    use rlark_api::agent::status;
    use rlark_api::agent::{REASON_COMPLETED, REASON_ERROR, REASON_STOPPED};
    use rlark_api::types::RawTaskSpec;
    use rlark_api::types::RestartPolicy;

    #[test]
    fn simulated_exits_end_replicas_as_the_protocol_says() {
        let ok = status::exited(&exit_report(Some(0), ExitCause::Exited), 0).set;
        assert_eq!(ok.phase, Some(PodPhase::Succeeded));
        assert_eq!(ok.exit_code, Some(0));
        assert_eq!(ok.reason.as_deref(), Some(REASON_COMPLETED));
        assert_eq!(ok.message.as_deref(), Some("process exited with code 0"));
        let failed = status::exited(&exit_report(Some(7), ExitCause::Exited), 0).set;
        assert_eq!(failed.phase, Some(PodPhase::Failed));
        assert_eq!(failed.exit_code, Some(7));
        assert_eq!(failed.reason.as_deref(), Some(REASON_ERROR));
        assert!(failed.message.is_some_and(|m| m.contains('7')));
        let killed = exit_report(None, ExitCause::Terminated);
        let stopped = status::stopped(Some(&killed), grace_period(None), 0, killed.finished_at);
        assert_eq!(stopped.set.phase, Some(PodPhase::Failed));
        assert_eq!(stopped.set.reason.as_deref(), Some(REASON_STOPPED));
        assert_eq!(stopped.set.exit_code, Some(STOPPED_EXIT_CODE));
    }

    #[test]
    fn run_specs_follow_the_raw_spec() {
        let mut task = Task::new("j-a", placeholder_spec());
        assert_eq!(
            RunSpec::for_task(&task),
            RunSpec {
                restart_policy: RestartPolicy::Never,
                active_deadline_seconds: None,
                grace: grace_period(None),
            }
        );
        let raw: RawTaskSpec = serde_json::from_value(json!({
            "entrypoint": ["true"],
            "replicas": 1,
            "restartPolicy": "OnFailure",
            "activeDeadlineSeconds": 60,
            "terminationGracePeriodSeconds": 5,
        }))
        .expect("raw spec");
        task.spec.raw = Some(raw);
        assert_eq!(
            RunSpec::for_task(&task),
            RunSpec {
                restart_policy: RestartPolicy::OnFailure,
                active_deadline_seconds: Some(60),
                grace: Duration::from_secs(5),
            }
        );
    }
}
