//! One replica's worker: creates its Pod, decides from what an earlier agent left, and
//! drives the replica's state machine ([`rlark_api::agent::replica::Replica`]), executing
//! its actions through the [`Runtime`](crate::runtime::Runtime) and the Pod API.
//!
//! The worker's methods by concept: `recover` (what an earlier agent left), `drive` (running
//! the replica), `spec` (what the runtime is asked to run), `domain` (its network),
//! `devices` (what it holds) and `pod` (its Pod and status); the loop and its state here.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Patch, PatchParams, PostParams};
use rlark_api::agent::replica::{Action, Adopted as AdoptedAt, End, Event, Now, Replica, RunSpec};
use rlark_api::agent::status::{self, StatusField, StatusPatch};
use rlark_api::agent::{
    PENDING_AFTER, REASON_BACKOFF, REASON_DOMAIN_NETWORK_UNAVAILABLE, REASON_STOPPED,
    REASON_WAITING_FOR_DOMAIN_IP, RUN_KEY_ANNOTATION, replica_pod,
};
use rlark_api::types::{
    DeviceUnhealthyPolicy, DockerTaskSpec, DomainPendingPod, Pod, PodPhase, PodStatus,
    PodTensorBoard, RawTaskSpec, Task,
};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::pods::{
    Retry, delete_pod, is_status, pod_is_terminal, pod_phase, pod_progress, pod_progress_or_state,
    pod_reason,
};
use super::prune::prune_runs;
use super::recovery::{Recovered, end_recovered};
use super::tensorboard::{self, Beside, TensorBoard};
use super::{PodNetwork, ReplicaState, STATE_FILE, Shared, replica_dir, replica_env};
use crate::runtime::docker::{ContainerSet, container_name, labels as docker_labels};
use crate::runtime::sandbox::Sandbox;
use crate::runtime::{
    Adopted, ReplicaRecord, ReplicaSpec, RunningReplica, RuntimeError, exit_report, timestamp,
};

mod devices;
mod domain;
mod drive;
mod pod;
mod recover;
mod spec;

/// Where a worker stands between steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// Start the replica (its Pod exists, or is created by the first status write).
    Start,
    /// The run ended (succeeded, failed, lost): nothing runs, nothing will.
    Finished,
    /// Ended by `spec.stopped`: a resume starts it again.
    Stopped,
    /// The worker ends.
    Exit,
}

impl From<End> for Step {
    fn from(end: End) -> Self {
        match end {
            End::Finished => Step::Finished,
            End::Stopped => Step::Stopped,
            End::Exit => Step::Exit,
        }
    }
}

/// What the reconciler wants from a worker.
#[derive(Clone, Debug)]
pub(super) enum Command {
    /// Run (or keep running) this Task's replica; `resync` changes on every resync.
    Run { task: Arc<Task>, resync: u64 },
    /// A new run replaces this one: kill the process; the next worker replaces the Pod.
    Supersede,
    /// The replica is no longer wanted here: kill the process and delete the Pod.
    Remove,
    /// The agent stops: leave the process (or stop it, per `stop_tasks_on_exit`).
    Shutdown,
}

pub(super) struct Worker {
    pub(super) shared: Arc<Shared>,
    pub(super) pod: String,
    /// The Pod was listed at the last relist (or no listing succeeded): read it before
    /// acting. Otherwise it is created straight away.
    pod_may_exist: bool,
    pub(super) index: usize,
    pub(super) key: String,
    commands: watch::Receiver<Command>,
    /// The Task as last seen.
    pub(super) task: Arc<Task>,
    resync: u64,
    /// The replica's network while it is attached to its domain.
    network: Option<rlark_net::replica::Attachment>,
    /// The robots and cameras this run holds (`crate::devices::allocator`).
    devices: Vec<crate::devices::allocator::Offered>,
    /// The Pod status as this worker last wrote it (re-asserted on resync).
    pub(super) reported: PodStatus,
    /// The state file of the running process.
    state: Option<ReplicaState>,
    /// Where [`Worker::run_replica`] takes up a run an earlier agent started.
    resume: Option<Resume>,
    /// The TensorBoard beside the running replica (`tensorBoardDir`, raw tasks); boxed, as
    /// every idle worker carries the field.
    tensorboard: Option<Box<TensorBoard>>,
    /// The replica's TensorBoard ended: the next status write removes `tensorBoard`.
    clear_tensorboard: bool,
    /// A `TensorBoardNotStarted` Event was written for this replica (once is enough).
    tensorboard_warned: bool,
    /// The TensorBoard status the next status write carries (the `Running` one that
    /// follows a start), so a start costs no extra write.
    pending_tensorboard: Option<Box<PodTensorBoard>>,
}

/// A run taken over from an earlier agent.
struct Resume {
    /// Restarts so far (the Pod's `restartCount`).
    restarts: i32,
    /// The run's first start (the Pod's `startTime`).
    first_start: Timestamp,
    /// Where the run stands.
    at: AdoptedAt,
    /// Its process, when it still runs.
    running: Option<Box<dyn RunningReplica>>,
}

impl Drop for Worker {
    /// A worker that ends any other way (its task aborted) frees its devices too.
    fn drop(&mut self) {
        self.release_devices();
    }
}

/// The current time for the state machine.
fn now() -> Now<Instant> {
    Now {
        mono: Instant::now(),
        wall: Timestamp::now(),
    }
}

impl Worker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        shared: Arc<Shared>,
        pod: String,
        pod_may_exist: bool,
        index: usize,
        key: String,
        commands: watch::Receiver<Command>,
        task: Arc<Task>,
        resync: u64,
    ) -> Self {
        Self {
            shared,
            pod,
            pod_may_exist,
            index,
            key,
            commands,
            task,
            resync,
            reported: PodStatus::default(),
            state: None,
            resume: None,
            network: None,
            devices: Vec::new(),
            tensorboard: None,
            clear_tensorboard: false,
            tensorboard_warned: false,
            pending_tensorboard: None,
        }
    }

    pub(super) async fn run(mut self, previous: Option<AbortOnDropHandle<()>>) {
        if let Some(previous) = previous {
            let _ = previous.await;
        }
        let recovered = self
            .shared
            .take_recovered(&(self.task.name_any(), self.index));
        // Each phase's future is boxed: a spawned future is as large as its largest state, so
        // without the boxes a worker idling after its replica ended (until the Task is
        // deleted) would keep the ~15 KiB of `run_replica`'s state allocated. Boxed, that
        // memory is freed when the run ends (measured with heaptrack: docs/benchmarks.md).
        let mut step = Box::pin(self.first_step(recovered)).await;
        loop {
            step = match step {
                Step::Start => {
                    let step = Box::pin(self.run_replica()).await;
                    self.stop_tensorboard();
                    Box::pin(self.leave_domain()).await;
                    if !self.left_running() {
                        Box::pin(self.stop_held_robots()).await;
                    }
                    self.release_devices();
                    step
                }
                Step::Finished | Step::Stopped => Box::pin(self.idle(step)).await,
                Step::Exit => return,
            };
        }
    }

    pub(super) fn uid(&self) -> String {
        self.task.uid().unwrap_or_default()
    }

    fn replica_dir(&self) -> PathBuf {
        replica_dir(
            &self.shared.ctx.data_dir,
            &self.shared.namespace,
            &self.task.name_any(),
            &self.uid(),
            self.index,
        )
    }

    /// `terminationGracePeriodSeconds` of the `raw` or `docker` block.
    fn grace(&self) -> Duration {
        rlark_api::agent::grace_period(self.task.spec.termination_grace_period_seconds())
    }

    /// What the state machine needs to know of the Task now.
    fn run_spec(&self) -> RunSpec {
        RunSpec::for_task(&self.task)
    }

    /// A state machine for a run of this replica.
    fn machine(&self) -> Replica<Instant> {
        Replica::new(self.shared.ctx.node_name.clone(), self.run_spec())
    }

    pub(super) fn is_ours(&self, pod: &Pod) -> bool {
        pod.annotations().get(RUN_KEY_ANNOTATION) == Some(&self.key)
    }

    /// The next command (the reconciler gone counts as a shutdown).
    async fn next_command(&mut self) -> Command {
        match self.commands.changed().await {
            Ok(()) => self.commands.borrow_and_update().clone(),
            Err(_) => Command::Shutdown,
        }
    }

    /// On a resync, write the whole status again (a lost write is repaired, a deleted
    /// Pod of a running replica created again).
    async fn maybe_resync(&mut self, resync: u64) {
        if resync == self.resync {
            return;
        }
        self.resync = resync;
        if self.reported != PodStatus::default() {
            let whole = StatusPatch {
                set: self.reported.clone(),
                clear: Vec::new(),
            };
            self.write_status(whole, true).await;
        }
    }

    /// Report the final status of a process that exited and is not restarted
    /// (`Succeeded`, or `Failed` with its exit code). Unlike [`Worker::finish`] it is not
    /// written to the state file first: the supervisor's `exit.json` already holds the
    /// exit, and an agent that dies before the Pod write finds it there and reports the same
    /// status (adoption, then the restart policy). One file rewrite (a new inode and a
    /// freed one) less per replica.
    async fn finish_exited(&mut self, status: StatusPatch) {
        if self.write_status(status, true).await {
            self.remove_state();
        }
    }

    /// Report the final status: first into the state file (so it survives an agent
    /// crash before the write), then to the Pod; then drop the state file.
    async fn finish(&mut self, status: StatusPatch) {
        let path = self.replica_dir().join(STATE_FILE);
        if let Some(state) = self.state.as_mut() {
            state.final_status = Some(status.to_json());
            if let Err(error) = state.write(&path) {
                tracing::warn!(file = %path.display(), %error, "write replica state file");
            }
        }
        if self.write_status(status, true).await {
            self.remove_state();
        }
    }

    fn save_state(&mut self, started: &dyn RunningReplica) {
        let record = started.record();
        let (containers, container_names, pgid, start_ticks) = match &record {
            ReplicaRecord::Process(p) => (Vec::new(), Vec::new(), p.pgid, p.start_ticks),
            ReplicaRecord::Container(c) => (
                c.ids.clone(),
                c.names.clone(),
                i32::try_from(c.pid).unwrap_or(0),
                c.start_ticks,
            ),
        };
        let state = ReplicaState {
            namespace: self.shared.namespace.clone(),
            task: self.task.name_any(),
            uid: self.uid(),
            index: self.index,
            run_key: self.key.clone(),
            pid: record.pid(),
            pgid,
            proc_start_ticks: start_ticks,
            containers,
            container_names,
            start_time: timestamp(started.started_at()).to_string(),
            grace_seconds: self.grace().as_secs(),
            final_status: None,
        };
        let path = self.replica_dir().join(STATE_FILE);
        if let Err(error) = state.write(&path) {
            tracing::warn!(file = %path.display(), %error, "write replica state file");
        }
        self.state = Some(state);
    }

    fn remove_state(&mut self) {
        if self.state.take().is_some() {
            super::state::remove_state_file(&self.replica_dir().join(STATE_FILE));
        }
    }
}

/// The Pod API of one replica's worker.
impl Worker {}

/// The runtime block of a Task that this agent can run: `raw` (processes) or `docker`
/// (containers).
#[derive(Clone, Debug)]
enum RunBody {
    Raw(RawTaskSpec),
    Docker(DockerTaskSpec),
}

impl RunBody {
    fn of(task: &Task) -> Option<RunBody> {
        match (&task.spec.raw, &task.spec.docker) {
            (Some(raw), _) => Some(RunBody::Raw(raw.clone())),
            (None, Some(docker)) => Some(RunBody::Docker(docker.clone())),
            (None, None) => None,
        }
    }
}

/// The exit of `running` (never, when nothing runs).
async fn wait_exit(running: &mut Option<Box<dyn RunningReplica>>) -> crate::runtime::ReplicaExit {
    match running {
        Some(process) => process.wait().await,
        None => std::future::pending().await,
    }
}

/// Once `pod` holds an unhealthy device (per `problems`; now, or after a change), which
/// and why ([`crate::devices::describe_unhealthy`]). Never without a receiver.
async fn device_trouble(
    problems: Option<watch::Receiver<crate::devices::Problems>>,
    pod: String,
) -> String {
    let Some(mut problems) = problems else {
        return std::future::pending().await;
    };
    loop {
        let unhealthy = problems
            .borrow_and_update()
            .get(&pod)
            .filter(|list| !list.is_empty())
            .map(|list| crate::devices::describe_unhealthy(list));
        if let Some(devices) = unhealthy {
            return devices;
        }
        if problems.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};

    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    use super::super::testing::{ctx, task};
    use super::super::{Shared, TaskTokens};
    use super::{Command, Step, Worker};
    use crate::runtime::RawRuntime;

    /// A replica's worker lives until its Task is deleted — long after a short run ended —
    /// and a spawned future is as large as its largest state. The phases are boxed so what
    /// stays allocated for an idle worker is small; unboxed, `run_replica`'s state made every
    /// finished replica cost ~15 KiB until its Job was deleted (issue 20's agent RSS figure).
    #[tokio::test]
    async fn a_worker_future_is_small_whatever_its_phases_hold() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
        let shared = Arc::new(Shared {
            client: kube::Client::try_from(config).expect("client"),
            ctx: ctx(),
            namespace: "rlark-c".into(),
            shutdown: CancellationToken::new(),
            task_tokens: TaskTokens::default(),
            recovered: Mutex::new(BTreeMap::new()),
            runtime: Arc::new(RawRuntime),
        });
        let task = Arc::new(task("uid-1", &["n1"]));
        let (_commands, receiver) = watch::channel(Command::Run {
            task: Arc::clone(&task),
            resync: 0,
        });
        let mut worker = Worker::new(
            shared,
            "j-a-0".into(),
            true,
            0,
            "key".into(),
            receiver,
            task,
            0,
        );
        // What stays allocated while the replica does not run.
        let idle = std::mem::size_of_val(&worker.idle(Step::Finished));
        assert!(
            idle <= 1024,
            "an idle worker's future is {idle} bytes; box the call that grew it"
        );
        // What stays allocated while the replica runs.
        let running = std::mem::size_of_val(&worker.run_replica());
        assert!(
            running <= 4096,
            "a running replica's future is {running} bytes; box the call that grew it"
        );
        let future = worker.run(None);
        let size = std::mem::size_of_val(&future);
        assert!(
            size <= 2048,
            "a replica worker's future is {size} bytes; box the phase that grew it"
        );
    }
}
