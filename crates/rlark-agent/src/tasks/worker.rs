//! One replica's worker: creates its Pod, decides from what an earlier agent left, and
//! drives the replica's state machine ([`rlark_api::agent::replica::Replica`]), executing
//! its actions through the [`Runtime`](crate::runtime::Runtime) and the Pod API.

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

    /// Decide from what an earlier agent left (`recovered`) and the existing Pod (an
    /// earlier agent's, an earlier run's, or none).
    async fn first_step(&mut self, recovered: Vec<Recovered>) -> Step {
        tracing::debug!(pod = %self.pod, recovered = recovered.len(), "replica worker started");
        // Replicas of other runs end first: this run may use the same directory.
        let mut mine = None;
        for r in recovered {
            if mine.is_none() && r.state.run_key == self.key && r.state.uid == self.uid() {
                mine = Some(r);
            } else {
                end_recovered(&self.shared, r, false).await;
            }
        }
        if mine.is_none() && !self.pod_may_exist && !self.task.spec.stopped {
            // A replica of a Task that appeared since the last listing: its Pod is new.
            self.prefetch_task_token();
            match self.create_new_pod().await {
                Some(true) => {
                    self.reported = PodStatus::default();
                    return Step::Start;
                }
                // There after all (another run's, or created since the listing): read it.
                Some(false) => {}
                None => return Step::Exit,
            }
        }
        let Some(existing) = self.get_pod().await else {
            return Step::Exit;
        };
        let existing = existing.filter(|pod| {
            // A Pod under deletion is as good as gone.
            pod.metadata.deletion_timestamp.is_none()
        });
        let ours = existing.as_ref().filter(|pod| self.is_ours(pod));
        if let Some(pod) = ours {
            self.reported = pod.status.clone().unwrap_or_default();
        }
        if let Some(r) = mine {
            return self.adopt(r, ours.cloned()).await;
        }
        if self.task.spec.stopped {
            if let Some(pod) = ours
                && !pod_is_terminal(pod)
            {
                self.write_status(status::stopped_before_start(Timestamp::now()), false)
                    .await;
            }
            return Step::Stopped;
        }
        match (ours, &existing) {
            (Some(pod), _) => match pod_phase(pod) {
                Some(PodPhase::Succeeded) => Step::Finished,
                Some(PodPhase::Failed) if pod_reason(pod) == Some(REASON_STOPPED) => {
                    // Stopped, and the Task is not stopped any more: a resume.
                    self.fresh_pod(existing.as_ref()).await
                }
                Some(PodPhase::Failed) => Step::Finished,
                Some(PodPhase::Running) if pod_reason(pod) == Some(REASON_BACKOFF) => {
                    // An earlier agent stopped while the replica waited to restart
                    // (nothing runs then): restart it now.
                    let (restarts, first_start) = pod_progress(pod, None);
                    tracing::info!(pod = %self.pod, restarts, "restarting a replica an earlier agent left waiting to restart");
                    self.resume = Some(Resume {
                        restarts: restarts.saturating_add(1),
                        first_start,
                        at: AdoptedAt::Restart,
                        running: None,
                    });
                    Step::Start
                }
                Some(PodPhase::Running) => {
                    let status = status::agent_lost(
                        "the agent has no record of this replica's process (it was reported \
                         Running before the agent restarted); the outcome of the run is unknown"
                            .to_string(),
                        Timestamp::now(),
                    );
                    self.write_status(status, false).await;
                    Step::Finished
                }
                // Created but never started: start it.
                Some(PodPhase::Pending) | None => Step::Start,
            },
            (None, _) => self.fresh_pod(existing.as_ref()).await,
        }
    }

    /// Take over this run's replica `r`, left by an earlier agent: adopt its running
    /// process, or go on from its recorded exit, or report it lost.
    async fn adopt(&mut self, r: Recovered, pod: Option<Pod>) -> Step {
        let (restarts, first_start) = pod_progress_or_state(pod.as_ref(), &r.state);
        let mut spec = ReplicaSpec::new(Vec::new(), self.replica_dir());
        spec.deadline = self.deadline_from(first_start);
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        self.state = Some(r.state.clone());
        let task_stopped = self.task.spec.stopped;
        let (at, running) = match self.shared.runtime.adopt(&spec, &r.recorded()).await {
            Adopted::Running(running) => {
                tracing::info!(pod = %self.pod, pid = running.record().pid(), "adopted a running replica");
                let started_at = timestamp(running.started_at());
                (AdoptedAt::Running { started_at }, Some(running))
            }
            Adopted::Exited(exit) => {
                tracing::info!(pod = %self.pod, status = %exit.status, "a replica ended while no agent ran");
                let started_at = r
                    .state
                    .start_time
                    .parse::<Timestamp>()
                    .unwrap_or_else(|_| timestamp(exit.finished_at));
                let exit = exit_report(&exit);
                (AdoptedAt::Exited { exit, started_at }, None)
            }
            Adopted::Lost(message) => {
                let event = Event::Lost {
                    message,
                    task_stopped,
                };
                return self.drive(self.machine(), event, None, None).await;
            }
        };
        if task_stopped {
            if running.is_some() {
                tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
            }
            let event = Event::Adopt {
                at,
                restarts,
                first_start,
                task_stopped,
            };
            return self.drive(self.machine(), event, running, None).await;
        }
        self.resume = Some(Resume {
            restarts,
            first_start,
            at,
            running,
        });
        Step::Start
    }

    /// `activeDeadlineSeconds` after `first_start`, as an instant (now when it passed).
    fn deadline_from(&self, first_start: Timestamp) -> Option<Instant> {
        let elapsed = SystemTime::now()
            .duration_since(SystemTime::from(first_start))
            .unwrap_or_default();
        // `raw` or `docker` block: both carry `activeDeadlineSeconds`.
        rlark_api::agent::deadline_after(
            self.task.spec.active_deadline_seconds(),
            Instant::now(),
            elapsed,
        )
    }

    /// Replace `existing` (if any) by a new Pod for this run.
    async fn fresh_pod(&mut self, existing: Option<&Pod>) -> Step {
        self.reported = PodStatus::default();
        self.prefetch_task_token();
        if let Some(pod) = existing
            && !self.delete_pod(pod).await
        {
            return Step::Exit;
        }
        if self.create_pod().await {
            Step::Start
        } else {
            Step::Exit
        }
    }

    /// A replica of a new run starts next: mint the run's task token (one API round trip)
    /// while its Pod is created, rather than after. `start` finds it in the cache, or
    /// waits for this very mint.
    fn prefetch_task_token(&self) {
        if RunBody::of(&self.task).is_some() {
            let shared = Arc::clone(&self.shared);
            let task = Arc::clone(&self.task);
            tokio::spawn(async move {
                shared
                    .task_tokens
                    .env(
                        &shared.client,
                        &shared.ctx.server_url,
                        &shared.ctx.ca_file,
                        &task,
                    )
                    .await;
            });
        }
    }

    /// Nothing runs: follow the Task until a resume, a removal or the end. Its rare calls
    /// are boxed: this future waits, allocated, for as long as the Task exists.
    async fn idle(&mut self, step: Step) -> Step {
        loop {
            match self.next_command().await {
                Command::Run { task, resync } => {
                    self.task = task;
                    if step == Step::Stopped && !self.task.spec.stopped {
                        let existing = match Box::pin(self.get_pod()).await {
                            Some(pod) => pod.filter(|p| self.is_ours(p)),
                            None => return Step::Exit,
                        };
                        return Box::pin(self.fresh_pod(existing.as_ref())).await;
                    }
                    // A final status was written successfully (or is kept in the state
                    // file): nothing to re-assert for a replica that does not run.
                    self.resync = resync;
                }
                Command::Supersede | Command::Shutdown => return Step::Exit,
                Command::Remove => {
                    Box::pin(self.delete_own_pod()).await;
                    return Step::Exit;
                }
            }
        }
    }

    /// Run the replica, with restarts, until it ends for good or the worker is told
    /// otherwise. Takes up [`Worker::resume`] when set.
    async fn run_replica(&mut self) -> Step {
        let resume = self.resume.take();
        let body = match RunBody::of(&self.task) {
            Some(RunBody::Docker(_)) if self.shared.ctx.docker.is_none() => None,
            body => body,
        };
        let Some(body) = body else {
            let status = status::unsupported_agent_type(
                self.task.spec.agent_type.as_str(),
                Timestamp::now(),
            );
            Box::pin(self.write_status(status, true)).await;
            return Step::Finished;
        };
        if let RunBody::Docker(_) = body
            && let Some(domain) = self.task.spec.domain.as_deref().filter(|d| !d.is_empty())
        {
            // Planned: containers joining the pod network (docs/tasks.md, "Docker runtime").
            let message = format!(
                "task is in domain {domain}, but the Docker runtime does not join Domains yet"
            );
            let patch = status::start_failed(
                REASON_DOMAIN_NETWORK_UNAVAILABLE,
                message,
                0,
                Timestamp::now(),
            );
            Box::pin(self.write_status(patch, true)).await;
            return Step::Finished;
        }
        if let Err(step) = Box::pin(self.take_devices(&body)).await {
            return step;
        }
        if let Some(domain) = self.task.spec.domain.clone().filter(|d| !d.is_empty())
            && let Err(step) = Box::pin(self.join_domain(&domain)).await
        {
            return step;
        }
        let machine = self.machine();
        match resume {
            None => self.drive(machine, Event::Start, None, Some(body)).await,
            Some(resume) => {
                if let Some(running) = &resume.running {
                    self.publish_replica(Some(running.roots()));
                    Box::pin(self.start_tensorboard(true)).await;
                }
                let event = Event::Adopt {
                    at: resume.at,
                    restarts: resume.restarts,
                    first_start: resume.first_start,
                    task_stopped: false,
                };
                self.drive(machine, event, resume.running, Some(body)).await
            }
        }
    }

    /// Feed `first` to `machine`, then every event that follows (the process's exit, the
    /// Task's changes, wake-ups), executing the machine's actions, until the run is over.
    /// `running` is the process of an adopted run; `body` the Task's runtime block as the
    /// run began (what a start uses when the Task has none any more).
    async fn drive(
        &mut self,
        mut machine: Replica<Instant>,
        first: Event,
        mut running: Option<Box<dyn RunningReplica>>,
        body: Option<RunBody>,
    ) -> Step {
        let mut actions: VecDeque<Action<Instant>> = machine.step(first, now()).into();
        let mut wake_at: Option<Instant> = None;
        loop {
            while let Some(action) = actions.pop_front() {
                let event = match action {
                    Action::Spawn {
                        deadline,
                        restarts,
                        pending,
                    } => {
                        self.publish_replica(None);
                        let spawned = match RunBody::of(&self.task).or_else(|| body.clone()) {
                            Some(body) => {
                                Box::pin(self.start(&body, deadline, restarts, pending)).await
                            }
                            None => Err(RuntimeError::Internal(
                                "the task has no raw or docker spec to start".to_string(),
                            )),
                        };
                        let roots = spawned.as_ref().map(|s| s.roots()).unwrap_or_default();
                        self.publish_replica(Some(roots));
                        match spawned {
                            Ok(started) => {
                                let at = timestamp(started.started_at());
                                running = Some(started);
                                // Reported by the Running write that follows.
                                Box::pin(self.start_tensorboard(false)).await;
                                Some(Event::Started { at })
                            }
                            Err(error) => {
                                tracing::warn!(pod = %self.pod, %error, "replica did not start");
                                Some(Event::StartFailed {
                                    reason: error.reason().to_string(),
                                    message: error.to_string(),
                                })
                            }
                        }
                    }
                    Action::SaveState => {
                        if let Some(started) = running.as_deref() {
                            self.save_state(started);
                        }
                        None
                    }
                    Action::Kill { grace } => match running.take() {
                        Some(mut process) => {
                            let exit = Box::pin(process.terminate(grace)).await;
                            self.stop_tensorboard();
                            Some(Event::Exited(exit_report(&exit)))
                        }
                        None => None,
                    },
                    Action::Detach => {
                        // The next agent starts a TensorBoard for the replica it adopts.
                        self.stop_tensorboard();
                        if let Some(process) = running.take() {
                            // Keep running; the state file tells the next agent about it.
                            tracing::info!(pod = %self.pod, pid = process.record().pid(), "leaving replica running");
                            process.detach();
                        }
                        None
                    }
                    Action::WriteStatus(patch) => {
                        Box::pin(self.write_status(patch, true)).await;
                        None
                    }
                    Action::Finish(patch) => {
                        Box::pin(self.finish(patch)).await;
                        None
                    }
                    Action::FinishExited(patch) => {
                        Box::pin(self.finish_exited(patch)).await;
                        None
                    }
                    Action::DeleteState => {
                        self.remove_state();
                        None
                    }
                    Action::DeletePod => {
                        Box::pin(self.delete_own_pod()).await;
                        None
                    }
                    Action::PruneOldRuns => {
                        Box::pin(self.prune_old_runs()).await;
                        None
                    }
                    Action::WakeAt(at) => {
                        wake_at = Some(at);
                        None
                    }
                    Action::Done(end) => return end.into(),
                };
                if let Some(event) = event {
                    // The machine answers the event before the actions still queued.
                    let mut next: VecDeque<_> = machine.step(event, now()).into();
                    next.extend(actions);
                    actions = next;
                }
            }
            let event = self
                .next_event(&mut machine, &mut running, &mut wake_at)
                .await;
            if let Some(event) = event {
                actions = machine.step(event, now()).into();
            }
        }
    }

    /// Wait for what happens next to a run the machine waits on: its process's exit, a
    /// wake-up, or a change of the Task (`None`: nothing for the machine).
    async fn next_event(
        &mut self,
        machine: &mut Replica<Instant>,
        running: &mut Option<Box<dyn RunningReplica>>,
        wake_at: &mut Option<Instant>,
    ) -> Option<Event> {
        let devices = self.device_watch();
        let pod = self.pod.clone();
        let command = tokio::select! {
            exit = wait_exit(running) => {
                *running = None;
                self.stop_tensorboard();
                return Some(Event::Exited(exit_report(&exit)));
            }
            devices = device_trouble(devices, pod) => {
                tracing::warn!(pod = %self.pod, %devices, "a device the replica holds is unhealthy; stopping it (onDeviceUnhealthy: Stop)");
                return Some(Event::DeviceUnhealthy { devices });
            }
            () = sleep_until_opt(*wake_at) => {
                *wake_at = None;
                return Some(Event::Wake);
            }
            command = self.next_command() => command,
        };
        match command {
            Command::Run { task, resync } => {
                self.task = task;
                if RunBody::of(&self.task).is_some() {
                    machine.set_spec(self.run_spec());
                }
                if self.task.spec.stopped {
                    if running.is_some() {
                        tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
                    }
                    return Some(Event::Stop);
                }
                Box::pin(self.maybe_resync(resync)).await;
                None
            }
            Command::Supersede => Some(Event::Supersede),
            Command::Remove => Some(Event::Remove),
            Command::Shutdown => Some(Event::Shutdown {
                stop_replicas: self.shared.ctx.stop_tasks_on_exit,
            }),
        }
    }

    /// Start the replica's process through the runtime; `pending` (the Pending status of a
    /// fresh run) is written, concurrently, when starting takes longer than
    /// [`PENDING_AFTER`], and always before whatever is reported next.
    async fn start(
        &mut self,
        body: &RunBody,
        deadline: Option<Instant>,
        restarts: i32,
        pending: Option<StatusPatch>,
    ) -> Result<Box<dyn RunningReplica>, RuntimeError> {
        let mut spec = match body {
            RunBody::Raw(raw) => self.replica_spec(raw, deadline)?,
            RunBody::Docker(docker) => self.container_spec(docker, deadline),
        };
        let shared = Arc::clone(&self.shared);
        let task = Arc::clone(&self.task);
        let pod = self.pod.clone();
        let starting = async move {
            let reports = shared.task_tokens.env(
                &shared.client,
                &shared.ctx.server_url,
                &shared.ctx.ca_file,
                &task,
            );
            spec.env.extend(reports.await);
            tracing::debug!(%pod, "task token ready; starting the process");
            shared.runtime.start(spec).await
        };
        let spawned = match pending {
            Some(pending) => {
                tokio::pin!(starting);
                tokio::select! {
                    spawned = &mut starting => spawned,
                    () = tokio::time::sleep(PENDING_AFTER) => {
                        let (_, spawned) =
                            tokio::join!(self.write_status(pending, true), starting);
                        spawned
                    }
                }
            }
            None => starting.await,
        };
        if let Ok(started) = &spawned {
            tracing::info!(pod = %self.pod, pid = started.record().pid(), restarts, "replica started");
        }
        spawned
    }

    /// Start TensorBoard beside the replica that just started (or was adopted running) when
    /// its Task is a raw one with `tensorBoardDir`, and report it in the Pod's
    /// `status.tensorBoard`: its port, or why it does not run ([`tensorboard`]) — written
    /// now with `write_now`, else with the next status write.
    async fn start_tensorboard(&mut self, write_now: bool) {
        if self.task.spec.raw.is_none() && self.task.spec.docker.is_none() {
            return;
        }
        let Some(dir) = self
            .task
            .spec
            .tensor_board_dir
            .as_deref()
            .filter(|d| !d.is_empty())
        else {
            return;
        };
        if let Some(mut previous) = self.tensorboard.take() {
            previous.stop();
        }
        let replica_dir = self.replica_dir();
        let mut work_dir = replica_dir.join("work");
        // A raw replica's directory and environment; a Docker replica's logs are read on
        // the node through the main container's bind mount (host network: the proxy reaches
        // the node's loopback either way), by the agent's `tensorboard`.
        let plan = match (&self.task.spec.raw, &self.task.spec.docker) {
            (Some(raw), _) => {
                if let Some(working_dir) = &raw.working_dir {
                    work_dir = work_dir.join(working_dir);
                }
                let env = replica_env(&self.task, self.index, &self.shared.ctx);
                Ok((dir.to_string(), env))
            }
            (None, Some(docker)) => match docker.containers.first() {
                Some(main) => tensorboard::docker_log_dir(main, dir)
                    .inspect(|_| work_dir.clone_from(&replica_dir))
                    .map(|host| (host.display().to_string(), Vec::new())),
                None => Err("the Task has no container".to_string()),
            },
            (None, None) => return,
        };
        let status = match (
            self.task.spec.domain.as_deref().filter(|d| !d.is_empty()),
            plan,
        ) {
            (Some(domain), _) => tensorboard::not_started(format!(
                "the replica is in Domain {domain}: its ports are in its own network \
                 namespace, which the task proxy does not reach"
            )),
            (None, Err(why)) => tensorboard::not_started(why),
            (None, Ok((log_dir, env))) => {
                let (running, status) = tensorboard::start(&Beside {
                    tensor_board_dir: &log_dir,
                    work_dir: &work_dir,
                    replica_dir: &replica_dir,
                    env: &env,
                });
                self.tensorboard = running.map(Box::new);
                status
            }
        };
        if let Some(message) = &status.message {
            tracing::warn!(pod = %self.pod, %message, "no TensorBoard beside the replica");
            if !std::mem::replace(&mut self.tensorboard_warned, true) {
                crate::task_events::warn_task(
                    &self.shared.client,
                    &self.task,
                    tensorboard::REASON_NOT_STARTED,
                    format!("replica {}: {message}", self.index),
                )
                .await;
            }
        }
        self.clear_tensorboard = false;
        self.pending_tensorboard = Some(Box::new(status));
        if write_now {
            self.write_status(StatusPatch::default(), true).await;
        }
    }

    /// Kill the replica's TensorBoard, if any; the next status write removes
    /// `status.tensorBoard`.
    fn stop_tensorboard(&mut self) {
        if let Some(mut running) = self.tensorboard.take() {
            running.stop();
        }
        self.pending_tensorboard = None;
        // Gone from what a resync re-asserts, too.
        if self.reported.tensor_board.take().is_some() {
            self.clear_tensorboard = true;
        }
    }

    /// Apply the retention rule to this Task's older runs ([`prune_runs`]).
    async fn prune_old_runs(&self) {
        let task_dir = self
            .shared
            .ctx
            .data_dir
            .join(&self.shared.namespace)
            .join(self.task.name_any());
        let current = self.uid();
        let removed = tokio::task::spawn_blocking(move || prune_runs(&task_dir, &current))
            .await
            .unwrap_or_default();
        for dir in removed {
            tracing::info!(dir = %dir.display(), "removed the directory of an old run");
        }
    }

    /// Give the replica its place in `domain` before it starts: wait for its address
    /// (reporting the Pod `Pending` with reason `NoDomainIP` while the Domain's pool is
    /// full), then attach it ([`rlark_net::replica::DomainNet::attach`]). Err: the step to
    /// take instead of starting (a command came, or the network cannot be had).
    async fn join_domain(&mut self, domain: &str) -> Result<(), Step> {
        let net = match &self.shared.ctx.network {
            PodNetwork::Ready(net) => net.clone(),
            PodNetwork::Unavailable(why) => {
                let message = format!(
                    "task is in domain {domain}, but this agent runs no pod network: {why}"
                );
                let patch = status::start_failed(
                    REASON_DOMAIN_NETWORK_UNAVAILABLE,
                    message,
                    0,
                    Timestamp::now(),
                );
                self.write_status(patch, true).await;
                return Err(Step::Finished);
            }
        };
        let pod = self.pod.clone();
        let (tx, mut pending) = watch::channel::<Option<Option<DomainPendingPod>>>(None);
        let wait = net.wait_addresses(domain, &pod, move |p| {
            let _ = tx.send(Some(p.cloned()));
        });
        tokio::pin!(wait);
        enum Waited {
            Addresses(Vec<ipnet::IpNet>),
            Pending(Option<DomainPendingPod>),
            Command(Command),
        }
        let addresses = loop {
            let waited = tokio::select! {
                addresses = &mut wait => Waited::Addresses(addresses),
                Ok(()) = pending.changed() => Waited::Pending(pending.borrow_and_update().clone().flatten()),
                command = self.next_command() => Waited::Command(command),
            };
            match waited {
                Waited::Addresses(addresses) => break addresses,
                Waited::Pending(entry) => {
                    let (reason, message) = match entry {
                        Some(entry) => (entry.reason, entry.message),
                        None => (
                            REASON_WAITING_FOR_DOMAIN_IP.to_string(),
                            format!("waiting for an address in domain {domain}"),
                        ),
                    };
                    let patch = status::waiting(&self.shared.ctx.node_name, &reason, message);
                    self.write_status(patch, true).await;
                }
                Waited::Command(Command::Run { task, .. }) => {
                    self.task = task;
                    if self.task.spec.stopped {
                        self.write_status(status::stopped_before_start(Timestamp::now()), false)
                            .await;
                        return Err(Step::Stopped);
                    }
                }
                Waited::Command(Command::Remove) => {
                    self.delete_own_pod().await;
                    return Err(Step::Exit);
                }
                Waited::Command(Command::Supersede | Command::Shutdown) => return Err(Step::Exit),
            }
        };
        let namespace = self.task.namespace().unwrap_or_default();
        match net.attach(&namespace, &pod, domain, addresses).await {
            Ok(attachment) => {
                let ip = attachment.addresses.first().map(ToString::to_string);
                self.network = Some(attachment);
                let patch = StatusPatch {
                    set: PodStatus {
                        ip,
                        ..PodStatus::default()
                    },
                    clear: Vec::new(),
                };
                self.write_status(patch, true).await;
                Ok(())
            }
            Err(error) => {
                tracing::warn!(pod = %self.pod, %error, "replica could not join its domain");
                let patch =
                    status::start_failed(error.reason(), error.to_string(), 0, Timestamp::now());
                self.write_status(patch, true).await;
                Err(Step::Finished)
            }
        }
    }

    /// Takes the robots and cameras the Task requests for this run (none requested: no
    /// change), records them in the Pod's status, and gives the process their environment
    /// ([`Self::replica_spec`]). An adopted run prefers what its Pod recorded. Devices that
    /// cannot be had fail the run with `DevicesUnavailable`, as a kubelet fails a pod its
    /// device plugins cannot serve.
    async fn take_devices(&mut self, body: &RunBody) -> Result<(), Step> {
        use crate::devices::allocator::{self, REASON_DEVICES_UNAVAILABLE};
        // Per replica: the raw block's requests, or the sum over a docker task's containers
        // (as placement counts them).
        let lists: Vec<&rlark_api::types::ResourceList> = match body {
            RunBody::Raw(raw) => raw.resources.iter().map(|r| &r.requests).collect(),
            RunBody::Docker(docker) => docker
                .containers
                .iter()
                .filter_map(|c| c.resources.as_ref())
                .map(|r| &r.requests)
                .collect(),
        };
        let wanted = allocator::device_requests_of(&lists).and_then(|wants| {
            if wants.is_empty() {
                return Ok(Vec::new());
            }
            let Some(access) = &self.shared.ctx.devices else {
                return Err(
                    "this agent has no embodied runtime (rlark agent --embodied-socket-dir)"
                        .to_string(),
                );
            };
            let prefer = self.reported.devices.clone();
            access.allocate(&self.pod, &wants, &prefer)
        });
        match wanted {
            Ok(devices) if devices.is_empty() => Ok(()),
            Ok(devices) => {
                let ids: Vec<String> = devices.iter().map(|o| o.device.id.clone()).collect();
                tracing::info!(pod = %self.pod, devices = ?ids, "devices given to the replica");
                self.devices = devices;
                let patch = StatusPatch {
                    set: PodStatus {
                        devices: ids,
                        ..PodStatus::default()
                    },
                    clear: Vec::new(),
                };
                self.write_status(patch, true).await;
                Ok(())
            }
            Err(message) => {
                tracing::warn!(pod = %self.pod, %message, "the replica's devices cannot be given");
                let patch =
                    status::start_failed(REASON_DEVICES_UNAVAILABLE, message, 0, Timestamp::now());
                self.write_status(patch, true).await;
                Err(Step::Finished)
            }
        }
    }

    /// The replica stays running after this worker (the agent exits and leaves its tasks
    /// for the next agent to adopt).
    fn left_running(&self) -> bool {
        self.shared.shutdown.is_cancelled() && !self.shared.ctx.stop_tasks_on_exit
    }

    /// `<namespace>/<pod>`: how the replica is named to the embodied runtime
    /// (`RLINF_EMBODIED_OWNER`, robots' stop messages).
    fn owner_label(&self) -> String {
        format!("{}/{}", self.shared.namespace, self.pod)
    }

    /// The backstop of the runtime's safety watchdog: the run is over, so every robot it
    /// held that still runs for an owner is stopped (a detached one is left alone), even if
    /// some process outside the replica started it
    /// ([`crate::devices::stop_held_robots`]).
    async fn stop_held_robots(&self) {
        if self.devices.is_empty() {
            return;
        }
        if let Some(access) = &self.shared.ctx.devices {
            crate::devices::stop_held_robots(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            )
            .await;
        }
    }

    /// What the replica's devices say now, when its Task wants it stopped on an unhealthy
    /// device (`onDeviceUnhealthy: Stop`) and it holds some: a receiver of the holders'
    /// problems. `None`: nothing to follow.
    fn device_watch(&self) -> Option<watch::Receiver<crate::devices::Problems>> {
        if self.devices.is_empty()
            || self.task.spec.on_device_unhealthy != Some(DeviceUnhealthyPolicy::Stop)
        {
            return None;
        }
        self.shared.ctx.devices.as_ref().map(|a| a.problems())
    }

    /// Frees this run's devices for other replicas, and tells the embodied runtime the
    /// replica is gone (not when it is left running for the next agent: it keeps its
    /// devices meanwhile).
    fn release_devices(&mut self) {
        let Some(access) = &self.shared.ctx.devices else {
            return;
        };
        let leaving = !self.left_running();
        if !self.devices.is_empty() {
            access.release(&self.pod, leaving);
        }
        self.devices.clear();
        if leaving {
            access.replica_ended(&self.pod);
        }
    }

    /// Tells the embodied runtime (when the agent has one) that this replica is starting
    /// (`roots` `None`) or runs with `roots`.
    fn publish_replica(&self, roots: Option<Vec<rlark_embodied::access::ProcessRef>>) {
        if let Some(access) = &self.shared.ctx.devices {
            let name = self.owner_label();
            match roots {
                None => access.replica_starting(&self.pod, &name),
                Some(roots) => {
                    access.replica_running(&self.pod, &name, roots, self.own_user());
                }
            }
        }
    }

    /// The user only this replica runs as: an isolated raw replica's from the agent's pool
    /// (its claim, `uid` in the replica's directory, is root's). Empty otherwise (a
    /// `runAsUser` others may share, root, a container).
    fn own_user(&self) -> Vec<u32> {
        let pooled = self.shared.ctx.isolation.is_some()
            && self
                .task
                .spec
                .raw
                .as_ref()
                .is_some_and(|raw| raw.run_as_user.is_none());
        if !pooled {
            return Vec::new();
        }
        std::fs::read_to_string(self.replica_dir().join(crate::runtime::uids::UID_FILE))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .into_iter()
            .collect()
    }

    /// The run is over for this worker: give the replica's network back (deleted, unless
    /// the agent exits and leaves the replica running for the next agent).
    async fn leave_domain(&mut self) {
        if self.network.take().is_none() {
            return;
        }
        let PodNetwork::Ready(net) = &self.shared.ctx.network else {
            return;
        };
        if self.shared.shutdown.is_cancelled() && !self.shared.ctx.stop_tasks_on_exit {
            net.leave(&self.pod);
        } else {
            net.release(&self.pod).await;
        }
    }

    fn replica_spec(
        &self,
        raw: &RawTaskSpec,
        deadline: Option<Instant>,
    ) -> Result<ReplicaSpec, RuntimeError> {
        let mut spec = ReplicaSpec::new(raw.entrypoint.clone(), self.replica_dir());
        spec.env = replica_env(&self.task, self.index, &self.shared.ctx);
        spec.working_dir = raw.working_dir.as_ref().map(PathBuf::from);
        spec.artifact = raw.artifact.clone();
        spec.artifact_sha256 = raw.artifact_sha256.clone();
        spec.artifact_cache = self
            .shared
            .ctx
            .data_dir
            .parent()
            .map(|d| d.join("artifacts"));
        spec.deadline = deadline;
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        if let Some(access) = &self.shared.ctx.devices {
            spec.env.extend(crate::devices::allocator::replica_env(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            ));
        }
        if let Some(attachment) = &self.network {
            if let Some(ip) = attachment.addresses.first() {
                spec.env.push(("RLARK_POD_IP".to_string(), ip.to_string()));
            }
            spec.network = Some(attachment.network.clone());
        }
        spec.sandbox = self.sandbox(raw)?;
        if spec.sandbox.is_some() {
            // The agent's own HOME (root's) is not the replica user's: its work directory
            // is, unless the Task says otherwise.
            let home = spec.default_work_dir().display().to_string();
            let user = super::isolation::REPLICA_USER.to_string();
            for (name, value) in [("HOME", home), ("USER", user.clone()), ("LOGNAME", user)] {
                if !spec.env.iter().any(|(k, _)| k == name) {
                    spec.env.push((name.to_string(), value));
                }
            }
        }
        Ok(spec)
    }

    /// The isolation of this replica under the agent's policy ([`super::isolation`]).
    fn sandbox(&self, raw: &RawTaskSpec) -> Result<Option<Sandbox>, RuntimeError> {
        let Some(isolation) = &self.shared.ctx.isolation else {
            return Ok(None);
        };
        let sockets = match &self.shared.ctx.devices {
            Some(access) => {
                let mut names: Vec<&str> = self.devices.iter().map(|d| d.socket).collect();
                names.sort_unstable();
                names.dedup();
                names
                    .into_iter()
                    .map(|name| access.socket_dir.join(name))
                    .collect()
            }
            None => Vec::new(),
        };
        let replica_dir = self.replica_dir();
        let job = crate::kubernetes::env::task_job(&self.task);
        let request = super::isolation::Request {
            namespace: &self.shared.namespace,
            pod: &self.pod,
            job: &job,
            raw,
            replica_dir: &replica_dir,
            ca_file: &self.shared.ctx.ca_file,
            sockets,
        };
        match isolation.decide(&request) {
            Ok(super::isolation::Decision::Isolated(sandbox)) => Ok(Some(sandbox)),
            Ok(super::isolation::Decision::Root) => {
                tracing::info!(pod = %self.pod, %job, "replica runs as root: its Job is allowed to");
                Ok(None)
            }
            Err(message) => Err(RuntimeError::Isolation(message)),
        }
    }

    /// The spec of a replica of a `docker` task: its containers, the environment contract,
    /// the identity labels.
    fn container_spec(&self, docker: &DockerTaskSpec, deadline: Option<Instant>) -> ReplicaSpec {
        let mut spec = ReplicaSpec::new(Vec::new(), self.replica_dir());
        spec.env = replica_env(&self.task, self.index, &self.shared.ctx);
        spec.deadline = deadline;
        spec.grace = self.grace();
        let task = self.task.name_any();
        let uid = self.uid();
        let namespace = &self.shared.namespace;
        spec.containers = Some(ContainerSet {
            containers: docker.containers.clone(),
            labels: docker_labels(
                &self.shared.ctx.node_name,
                namespace,
                &task,
                &uid,
                self.index,
                &self.key,
            ),
            names: docker
                .containers
                .iter()
                .map(|c| container_name(namespace, &task, &uid, self.index, &c.name))
                .collect(),
            read_only_files: vec![self.shared.ctx.ca_file.clone()],
            read_write_dirs: Vec::new(),
        });
        // Devices: the same environment as a raw replica's, and the runtime's socket
        // directory at the same path inside (so the socket paths in it are valid).
        if let Some(access) = &self.shared.ctx.devices
            && !self.devices.is_empty()
        {
            spec.env.extend(crate::devices::allocator::replica_env(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            ));
            if let Some(set) = spec.containers.as_mut() {
                set.read_write_dirs.push(access.socket_dir.clone());
            }
        }
        spec
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
impl Worker {
    /// The Pod, if any; `None` when the agent shut down before it could be read.
    pub(super) async fn get_pod(&self) -> Option<Option<Pod>> {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match api.get_opt(&self.pod).await {
                Ok(pod) => {
                    tracing::debug!(pod = %self.pod, exists = pod.is_some(), "pod read");
                    return Some(pod);
                }
                Err(error) => {
                    if !retry.again(&self.shared, "read pod", &error).await {
                        return None;
                    }
                }
            }
        }
    }

    /// The Pod object of this replica for this run (no status).
    fn new_pod(&self) -> Pod {
        let mut pod = replica_pod(&self.task, self.index, &self.key);
        // The Task was read from this namespace.
        pod.metadata.namespace = Some(self.shared.namespace.clone());
        pod.spec.task_namespace = Some(self.shared.namespace.clone());
        pod.spec.pod_namespace = Some(self.shared.namespace.clone());
        pod
    }

    /// Create this run's Pod, expecting none: `Some(true)` when created, `Some(false)` when
    /// a Pod of that name exists, `None` when the agent shut down first (other errors are
    /// retried).
    pub(super) async fn create_new_pod(&self) -> Option<bool> {
        self.try_create_pod(false).await
    }

    /// Create this run's Pod; one of another run in the way is deleted first. Returns
    /// false only when the agent shut down first.
    pub(super) async fn create_pod(&self) -> bool {
        self.try_create_pod(true).await == Some(true)
    }

    /// Create this run's Pod, retrying errors: `Some(true)` once it exists and is this
    /// run's, `None` when the agent shut down first. A Pod already there (409): with
    /// `replace`, adopted when it is ours, else deleted and the create retried; without,
    /// `Some(false)` at once.
    async fn try_create_pod(&self, replace: bool) -> Option<bool> {
        let api = self.shared.pods();
        let pod = self.new_pod();
        let mut retry = Retry::new();
        loop {
            let error = match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, "pod created");
                    return Some(true);
                }
                Err(error) if is_status(&error, 409) && !replace => return Some(false),
                Err(error) if is_status(&error, 409) => match api.get_opt(&self.pod).await {
                    Ok(Some(existing)) if self.is_ours(&existing) => return Some(true),
                    Ok(Some(existing)) => match delete_pod(&api, &existing).await {
                        Ok(()) => error,
                        Err(e) => e,
                    },
                    Ok(None) => error,
                    Err(e) => e,
                },
                Err(error) => error,
            };
            if !retry.again(&self.shared, "create pod", &error).await {
                return None;
            }
        }
    }

    /// Delete `pod`; false only when the agent shut down first.
    pub(super) async fn delete_pod(&self, pod: &Pod) -> bool {
        let api = self.shared.pods();
        let mut retry = Retry::new();
        loop {
            match delete_pod(&api, pod).await {
                Ok(()) => return true,
                Err(error) => {
                    if !retry.again(&self.shared, "delete pod", &error).await {
                        return false;
                    }
                }
            }
        }
    }

    /// Delete this run's Pod (not one another run or node put under the same name).
    pub(super) async fn delete_own_pod(&self) {
        if let Some(Some(pod)) = self.get_pod().await
            && self.is_ours(&pod)
        {
            self.delete_pod(&pod).await;
        }
    }

    /// Merge-patch the Pod's status with `patch` (retried). With `recreate`, a Pod that
    /// disappeared is created again with everything reported so far. Returns whether the
    /// write happened.
    pub(super) async fn write_status(&mut self, mut patch: StatusPatch, recreate: bool) -> bool {
        if let Some(board) = self.pending_tensorboard.take() {
            patch.set.tensor_board = Some(*board);
            self.clear_tensorboard = false;
        }
        if std::mem::take(&mut self.clear_tensorboard) && patch.set.tensor_board.is_none() {
            patch.clear.push(StatusField::TensorBoard);
        }
        patch.apply(&mut self.reported);
        let api = self.shared.pods();
        let params = PatchParams::default();
        let body = json!({ "status": patch.to_json() });
        let mut retry = Retry::new();
        loop {
            let error = match api
                .patch_status(&self.pod, &params, &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    tracing::debug!(pod = %self.pod, phase = ?patch.phase(), "pod status written");
                    return true;
                }
                Err(error) if is_status(&error, 404) && !recreate => return false,
                Err(error) if is_status(&error, 404) => {
                    if !self.create_pod().await {
                        return false;
                    }
                    let full = json!({ "status": self.reported });
                    match api
                        .patch_status(&self.pod, &params, &Patch::Merge(&full))
                        .await
                    {
                        Ok(_) => return true,
                        Err(error) => error,
                    }
                }
                Err(error) => error,
            };
            if !retry.again(&self.shared, "write pod status", &error).await {
                return false;
            }
        }
    }
}

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
