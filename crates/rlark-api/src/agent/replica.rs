//! One run of one replica as a sans-IO state machine (docs/tasks.md, "The replica state
//! machine").
//!
//! The agent's per-replica worker owns a [`Replica`], feeds it [`Event`]s with the time
//! ([`Now`]) and executes the [`Action`]s it returns, in order: start or kill the process,
//! write the Pod status, record or delete the state file, sleep until a time. The machine
//! decides everything the restart policy, the backoff, the deadline and the grace period
//! imply; it reads no clock and does no IO, so every transition is tested here.
//!
//! One `Replica` covers one run from its first start (or its adoption after an agent
//! restart) until it ends ([`Action::Done`]): what happens before (creating the Pod) and
//! after (a stopped replica resumed starts a new `Replica`) is the worker's.
//!
//! The caller delivers [`Event::Stop`], [`Event::Supersede`], [`Event::Remove`],
//! [`Event::Shutdown`] and [`Event::DeviceUnhealthy`] only while the process runs or the replica waits to restart
//! ([`Replica::follows_task`]); while a start is in progress it holds them until
//! [`Event::Started`] or [`Event::StartFailed`] was delivered.

use std::ops::Add;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use super::status::{self, ExitCause, ExitReport, StatusPatch};
use super::{BACKOFF_INITIAL, BACKOFF_MAX, BACKOFF_RESET_AFTER, deadline_after};
use crate::types::{RestartPolicy, Task};

/// The time of an event: a reading of the caller's monotonic clock (`I`, for deadlines and
/// backoffs) and of the wall clock (for the times the Pod status reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now<I> {
    /// Monotonic time.
    pub mono: I,
    /// Wall-clock time.
    pub wall: Timestamp,
}

/// What the replica's Task says about running it. The worker passes the current one with
/// [`Replica::set_spec`] whenever the Task changes; a change applies from the next
/// (re)start on, except the grace period, which applies to the next stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// `raw.restartPolicy`.
    pub restart_policy: RestartPolicy,
    /// `raw.activeDeadlineSeconds` (counted from the run's first start, restarts included).
    pub active_deadline_seconds: Option<i64>,
    /// SIGTERM → SIGKILL wait of a stop ([`super::grace_period`]).
    pub grace: Duration,
}

impl RunSpec {
    /// What `task`'s `raw` spec says: its restart policy, deadline and grace period. A Task
    /// without one never restarts, has no deadline and gets the default grace period.
    pub fn for_task(task: &Task) -> RunSpec {
        // The `raw` or the `docker` block: both carry the same three fields.
        RunSpec {
            restart_policy: task.spec.restart_policy(),
            active_deadline_seconds: task.spec.active_deadline_seconds(),
            grace: super::grace_period(task.spec.termination_grace_period_seconds()),
        }
    }
}

/// Where a run taken over from an earlier agent stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adopted {
    /// Its process still runs (the runtime took over its supervision); it started at
    /// `started_at`.
    Running {
        /// When the process that runs now started.
        started_at: Timestamp,
    },
    /// Its process ended while no agent watched.
    Exited {
        /// How it ended.
        exit: ExitReport,
        /// When that process had started.
        started_at: Timestamp,
    },
    /// It was waiting to restart (nothing runs): start it again now.
    Restart,
}

/// What happened to the replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Start a fresh run (its Pod exists or is created by the first status write).
    Start,
    /// Take over a run an earlier agent started.
    Adopt {
        /// Where it stands.
        at: Adopted,
        /// Restarts so far (the Pod's `restartCount`; for [`Adopted::Restart`] including the
        /// one about to happen).
        restarts: i32,
        /// The run's first start (the Pod's `startTime`).
        first_start: Timestamp,
        /// The Task is stopped (`spec.stopped`): end the run as stopped instead.
        task_stopped: bool,
    },
    /// The runtime lost the run an earlier agent started (no record of its end; what is
    /// left of it was killed): `message` says what is unknown.
    Lost {
        /// Why the outcome is unknown.
        message: String,
        /// The Task is stopped (`spec.stopped`).
        task_stopped: bool,
    },
    /// The process asked for by [`Action::Spawn`] started at `at`.
    Started {
        /// When it started (wall clock).
        at: Timestamp,
    },
    /// The process asked for by [`Action::Spawn`] could not be started: `reason` is the
    /// runtime's Pod reason, `message` names the problem. Not retried.
    StartFailed {
        /// `Pod.status.reason`.
        reason: String,
        /// `Pod.status.message`.
        message: String,
    },
    /// The process ended (on its own, killed at its deadline, or by [`Action::Kill`]).
    Exited(ExitReport),
    /// The Task was stopped (`spec.stopped: true`).
    Stop,
    /// A new run of the Task replaces this one (its worker replaces the Pod).
    Supersede,
    /// The replica is no longer wanted on this node: its Pod goes too.
    Remove,
    /// The agent shuts down; with `stop_replicas` (`stop_tasks_on_exit`) the replica is
    /// stopped, otherwise left running for the next agent to adopt.
    Shutdown {
        /// Stop the replica rather than leave it running.
        stop_replicas: bool,
    },
    /// The time of the last [`Action::WakeAt`] came (the backoff elapsed, or the deadline
    /// passed while waiting to restart).
    Wake,
    /// A device the replica holds became unhealthy and the Task says
    /// `onDeviceUnhealthy: Stop` (the worker sends it only then): the process is stopped
    /// and the run ends `Failed` with reason `DeviceUnhealthy`, without a restart.
    DeviceUnhealthy {
        /// Which devices and why (`robot-arm-0: simulated arm fault: boom`).
        devices: String,
    },
}

/// How a run ended, for the worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// It ended for good (succeeded, failed, lost): nothing runs, nothing will.
    Finished,
    /// Ended by `spec.stopped`: clearing it starts a new run.
    Stopped,
    /// The worker's job is over (superseded, removed, or the agent shuts down).
    Exit,
}

/// What the worker does, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<I> {
    /// Start the process; it must be killed at `deadline` (the runtime does that and
    /// reports [`ExitCause::DeadlineExceeded`]). If starting takes longer than
    /// [`super::PENDING_AFTER`] and `pending` is set, write it meanwhile (and in any case before
    /// what is written next). Answer with [`Event::Started`] or [`Event::StartFailed`].
    Spawn {
        /// When the process must be killed.
        deadline: Option<I>,
        /// Restarts so far (for logs).
        restarts: i32,
        /// The `Pending` status of a fresh run.
        pending: Option<StatusPatch>,
    },
    /// Record the started process in the replica's state file.
    SaveState,
    /// Stop the process: SIGTERM to its group, SIGKILL after `grace`. Answer with
    /// [`Event::Exited`].
    Kill {
        /// The grace period.
        grace: Duration,
    },
    /// Leave the process running unsupervised (the next agent adopts it).
    Detach,
    /// Write the status (retried; a Pod deleted meanwhile is created again).
    WriteStatus(StatusPatch),
    /// Write a final status that the state file must keep until it is reported: into the
    /// state file first, then to the Pod; once written, delete the state file.
    Finish(StatusPatch),
    /// Write the final status of a process that exited on its own (the runtime's exit
    /// record already keeps it): to the Pod, then, once written, delete the state file.
    FinishExited(StatusPatch),
    /// Delete the replica's state file.
    DeleteState,
    /// Delete this run's Pod.
    DeletePod,
    /// Prune the Task's older run directories (the first start of a fresh run).
    PruneOldRuns,
    /// Deliver [`Event::Wake`] at this time (unless another event comes first).
    WakeAt(I),
    /// The run is over.
    Done(End),
}

/// Why the process is being killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// `spec.stopped`.
    Stop,
    /// A new run replaces this one.
    Supersede,
    /// No longer wanted here.
    Remove,
    /// The agent shuts down and stops its tasks.
    Shutdown,
    /// A device it holds became unhealthy (`onDeviceUnhealthy: Stop`).
    DeviceUnhealthy,
}

/// Where a replica stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State<I> {
    /// Created; nothing started yet.
    Idle,
    /// A start is in progress ([`Action::Spawn`]).
    Starting,
    /// The process runs; it started at `started_at`.
    Running {
        /// When the current process started.
        started_at: Timestamp,
    },
    /// The process is being killed ([`Action::Kill`]).
    Killing(KillReason),
    /// Waiting to restart at `restart_at`.
    BackingOff {
        /// When the next start is due.
        restart_at: I,
    },
    /// The run is over ([`Action::Done`]).
    Done(End),
}

/// One run of one replica (see the module documentation).
#[derive(Clone, Debug)]
pub struct Replica<I> {
    node: String,
    spec: RunSpec,
    /// `activeDeadlineSeconds` as the run began (for messages).
    deadline_seconds: Option<u64>,
    state: State<I>,
    /// A fresh run (not taken over from an earlier agent).
    fresh: bool,
    /// The `Pending` status not written yet (a fresh run's first start only).
    pending: bool,
    restarts: i32,
    first_start: Option<Timestamp>,
    deadline: Option<I>,
    backoff: Duration,
    /// The restart policy read when the current process started.
    policy: RestartPolicy,
    /// The unhealthy devices a [`KillReason::DeviceUnhealthy`] stop is for.
    unhealthy: String,
}

impl<I> Replica<I>
where
    I: Copy + Ord + Add<Duration, Output = I>,
{
    /// A replica of a run on `node`, as `spec` says, before its first event.
    pub fn new(node: impl Into<String>, spec: RunSpec) -> Self {
        Self {
            node: node.into(),
            spec,
            deadline_seconds: spec
                .active_deadline_seconds
                .and_then(|s| u64::try_from(s).ok()),
            state: State::Idle,
            fresh: true,
            pending: true,
            restarts: 0,
            first_start: None,
            deadline: None,
            backoff: BACKOFF_INITIAL,
            policy: spec.restart_policy,
            unhealthy: String::new(),
        }
    }

    /// Where it stands.
    pub fn state(&self) -> State<I> {
        self.state
    }

    /// Restarts so far (`restartCount`).
    pub fn restarts(&self) -> i32 {
        self.restarts
    }

    /// When the run's process must be killed (`activeDeadlineSeconds`), once known.
    pub fn deadline(&self) -> Option<I> {
        self.deadline
    }

    /// The grace period of a stop now.
    pub fn grace(&self) -> Duration {
        self.spec.grace
    }

    /// Whether the worker delivers changes of the Task now ([`Event::Stop`],
    /// [`Event::Supersede`], [`Event::Remove`], [`Event::Shutdown`]) and of its devices
    /// ([`Event::DeviceUnhealthy`]): while the process runs and while the replica waits to
    /// restart.
    pub fn follows_task(&self) -> bool {
        matches!(self.state, State::Running { .. } | State::BackingOff { .. })
    }

    /// The Task changed: use `spec` from now on.
    pub fn set_spec(&mut self, spec: RunSpec) {
        self.spec = spec;
    }

    /// Feed `event`, which happened at `now`; returns what to do, in order. An event that
    /// means nothing where the replica stands gives no action.
    pub fn step(&mut self, event: Event, now: Now<I>) -> Vec<Action<I>> {
        match (self.state, event) {
            (State::Idle, Event::Start) => self.spawn(now),
            (
                State::Idle,
                Event::Adopt {
                    at,
                    restarts,
                    first_start,
                    task_stopped,
                },
            ) => self.adopt(at, restarts, first_start, task_stopped, now),
            (
                State::Idle,
                Event::Lost {
                    message,
                    task_stopped,
                },
            ) => {
                let end = if task_stopped {
                    End::Stopped
                } else {
                    End::Finished
                };
                self.end(
                    vec![Action::Finish(status::agent_lost(message, now.wall))],
                    end,
                )
            }
            (State::Starting, Event::Started { at }) => {
                let start_time = *self.first_start.get_or_insert(at);
                let mut actions = vec![
                    Action::SaveState,
                    Action::WriteStatus(status::running(&self.node, start_time, self.restarts)),
                ];
                if self.fresh && self.restarts == 0 {
                    actions.push(Action::PruneOldRuns);
                }
                self.state = State::Running { started_at: at };
                actions
            }
            (State::Starting, Event::StartFailed { reason, message }) => self.end(
                vec![Action::WriteStatus(status::start_failed(
                    &reason,
                    message,
                    self.restarts,
                    now.wall,
                ))],
                End::Finished,
            ),
            (State::Running { started_at }, Event::Exited(exit)) => {
                self.exited(exit, started_at, now)
            }
            (State::Running { .. }, Event::Stop) => self.kill(KillReason::Stop),
            (State::Running { .. }, Event::Supersede) => self.kill(KillReason::Supersede),
            (State::Running { .. }, Event::Remove) => self.kill(KillReason::Remove),
            (State::Running { .. }, Event::DeviceUnhealthy { devices }) => {
                self.unhealthy = devices;
                self.kill(KillReason::DeviceUnhealthy)
            }
            (State::Running { .. }, Event::Shutdown { stop_replicas }) => {
                if stop_replicas {
                    self.kill(KillReason::Shutdown)
                } else {
                    self.end(vec![Action::Detach], End::Exit)
                }
            }
            (State::Killing(reason), Event::Exited(exit)) => match reason {
                KillReason::Stop => {
                    let patch =
                        status::stopped(Some(&exit), self.spec.grace, self.restarts, now.wall);
                    self.end(vec![Action::Finish(patch)], End::Stopped)
                }
                KillReason::Supersede => self.end(vec![Action::DeleteState], End::Exit),
                KillReason::Remove => {
                    self.end(vec![Action::DeleteState, Action::DeletePod], End::Exit)
                }
                KillReason::Shutdown => self.end(
                    vec![Action::Finish(status::agent_shutdown(
                        Some(&exit),
                        now.wall,
                    ))],
                    End::Exit,
                ),
                KillReason::DeviceUnhealthy => {
                    let patch = status::device_unhealthy(
                        &self.unhealthy,
                        Some(&exit),
                        self.spec.grace,
                        self.restarts,
                        now.wall,
                    );
                    self.end(vec![Action::Finish(patch)], End::Finished)
                }
            },
            (State::BackingOff { restart_at }, Event::Wake) => {
                if self.deadline.is_some_and(|deadline| deadline <= now.mono) {
                    let patch = status::deadline_exceeded(
                        self.deadline_seconds,
                        None,
                        self.spec.grace,
                        self.restarts,
                        now.wall,
                    );
                    self.end(vec![Action::Finish(patch)], End::Finished)
                } else if restart_at <= now.mono {
                    self.restarts += 1;
                    self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                    self.spawn(now)
                } else {
                    vec![Action::WakeAt(self.wake_time(restart_at))]
                }
            }
            (State::BackingOff { .. }, Event::Stop) => {
                let patch = status::stopped(None, self.spec.grace, self.restarts, now.wall);
                self.end(vec![Action::Finish(patch)], End::Stopped)
            }
            (State::BackingOff { .. }, Event::DeviceUnhealthy { devices }) => {
                let patch = status::device_unhealthy(
                    &devices,
                    None,
                    self.spec.grace,
                    self.restarts,
                    now.wall,
                );
                self.end(vec![Action::Finish(patch)], End::Finished)
            }
            (State::BackingOff { .. }, Event::Supersede) => self.end(Vec::new(), End::Exit),
            (State::BackingOff { .. }, Event::Remove) => {
                self.end(vec![Action::DeletePod], End::Exit)
            }
            (State::BackingOff { .. }, Event::Shutdown { stop_replicas }) => {
                let actions = if stop_replicas {
                    vec![Action::Finish(status::agent_shutdown(None, now.wall))]
                } else {
                    Vec::new()
                };
                self.end(actions, End::Exit)
            }
            _ => Vec::new(),
        }
    }

    /// A (re)start begins: the restart policy of this process is the one now, and the
    /// deadline, if none is known yet, counts from now.
    fn begin(&mut self, now: Now<I>) {
        self.policy = self.spec.restart_policy;
        if self.deadline.is_none() {
            self.deadline =
                deadline_after(self.spec.active_deadline_seconds, now.mono, Duration::ZERO);
        }
    }

    fn spawn(&mut self, now: Now<I>) -> Vec<Action<I>> {
        self.begin(now);
        let pending = std::mem::take(&mut self.pending).then(|| status::pending(&self.node));
        self.state = State::Starting;
        vec![Action::Spawn {
            deadline: self.deadline,
            restarts: self.restarts,
            pending,
        }]
    }

    fn adopt(
        &mut self,
        at: Adopted,
        restarts: i32,
        first_start: Timestamp,
        task_stopped: bool,
        now: Now<I>,
    ) -> Vec<Action<I>> {
        self.fresh = false;
        self.pending = false;
        self.restarts = restarts;
        self.first_start = Some(first_start);
        let elapsed = now
            .wall
            .duration_since(first_start)
            .try_into()
            .unwrap_or(Duration::ZERO);
        self.deadline = deadline_after(self.spec.active_deadline_seconds, now.mono, elapsed);
        if task_stopped {
            return match at {
                Adopted::Running { started_at } => {
                    self.state = State::Running { started_at };
                    self.kill(KillReason::Stop)
                }
                Adopted::Exited { exit, .. } => self.end(
                    vec![Action::Finish(status::exited(&exit, restarts))],
                    End::Stopped,
                ),
                Adopted::Restart => {
                    let patch = status::stopped(None, self.spec.grace, restarts, now.wall);
                    self.end(vec![Action::Finish(patch)], End::Stopped)
                }
            };
        }
        match at {
            Adopted::Running { started_at } => {
                self.begin(now);
                self.state = State::Running { started_at };
                vec![Action::WriteStatus(status::running(
                    &self.node,
                    first_start,
                    restarts,
                ))]
            }
            Adopted::Exited { exit, started_at } => {
                self.begin(now);
                self.exited(exit, started_at, now)
            }
            Adopted::Restart => self.spawn(now),
        }
    }

    /// The process that started at `started_at` ended on its own (or at its deadline).
    fn exited(&mut self, exit: ExitReport, started_at: Timestamp, now: Now<I>) -> Vec<Action<I>> {
        if exit.cause == ExitCause::DeadlineExceeded {
            let patch = status::deadline_exceeded(
                self.deadline_seconds,
                Some(&exit),
                self.spec.grace,
                self.restarts,
                now.wall,
            );
            return self.end(vec![Action::Finish(patch)], End::Finished);
        }
        let restart = match self.policy {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => !exit.success(),
            RestartPolicy::Always => true,
        };
        if !restart {
            return self.end(
                vec![Action::FinishExited(status::exited(&exit, self.restarts))],
                End::Finished,
            );
        }
        let ran_for: Duration = exit
            .finished_at
            .duration_since(started_at)
            .try_into()
            .unwrap_or(Duration::ZERO);
        if ran_for >= BACKOFF_RESET_AFTER {
            self.backoff = BACKOFF_INITIAL;
        }
        let restart_at = now.mono + self.backoff;
        self.state = State::BackingOff { restart_at };
        vec![
            Action::WriteStatus(status::backoff(&exit, self.backoff, self.restarts)),
            // After the BackOff write: an agent that stops in between finds the exit again
            // (state file) or the BackOff reason, and restarts either way.
            Action::DeleteState,
            Action::WakeAt(self.wake_time(restart_at)),
        ]
    }

    fn kill(&mut self, reason: KillReason) -> Vec<Action<I>> {
        self.state = State::Killing(reason);
        vec![Action::Kill {
            grace: self.spec.grace,
        }]
    }

    fn end(&mut self, mut actions: Vec<Action<I>>, end: End) -> Vec<Action<I>> {
        self.state = State::Done(end);
        actions.push(Action::Done(end));
        actions
    }

    /// The next wake-up while waiting to restart at `restart_at`: then, or at the deadline
    /// when that comes first.
    fn wake_time(&self, restart_at: I) -> I {
        self.deadline.map_or(restart_at, |d| d.min(restart_at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::status::{
        agent_lost, agent_shutdown, backoff, deadline_exceeded, device_unhealthy, exited, pending,
        running, start_failed, stopped,
    };

    const NODE: &str = "n1";
    const GRACE: Duration = Duration::from_secs(5);

    /// Monotonic time is seconds since the test's epoch; the wall clock reads the same
    /// seconds since the Unix epoch.
    fn at(secs: u64) -> Now<Duration> {
        Now {
            mono: Duration::from_secs(secs),
            wall: wall(secs),
        }
    }

    fn wall(secs: u64) -> Timestamp {
        Timestamp::from_second(i64::try_from(secs).expect("secs")).expect("timestamp")
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn run_spec_comes_from_the_raw_or_docker_block() {
        let task = |block: serde_json::Value| -> Task {
            let mut spec = serde_json::json!({"agentType": "Docker", "role": "Env"});
            for (k, v) in block.as_object().expect("object") {
                spec[k] = v.clone();
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "t"}, "spec": spec,
            }))
            .expect("task")
        };
        let limits = serde_json::json!({"restartPolicy": "OnFailure",
            "activeDeadlineSeconds": 60, "terminationGracePeriodSeconds": 2});
        let mut docker = limits.clone();
        docker["containers"] = serde_json::json!([{"name": "c", "image": "i"}]);
        let mut raw = limits;
        raw["entrypoint"] = serde_json::json!(["x"]);
        let expected = RunSpec {
            restart_policy: RestartPolicy::OnFailure,
            active_deadline_seconds: Some(60),
            grace: Duration::from_secs(2),
        };
        assert_eq!(
            RunSpec::for_task(&task(serde_json::json!({"docker": docker}))),
            expected
        );
        assert_eq!(
            RunSpec::for_task(&task(serde_json::json!({"raw": raw}))),
            expected
        );
        // Unset: the raw block's defaults (Never, no deadline, 30 s).
        let plain = task(serde_json::json!({"docker": {"containers": []}}));
        assert_eq!(
            RunSpec::for_task(&plain),
            RunSpec {
                restart_policy: RestartPolicy::Never,
                active_deadline_seconds: None,
                grace: super::super::grace_period(None),
            }
        );
    }

    fn spec(policy: RestartPolicy, deadline: Option<i64>) -> RunSpec {
        RunSpec {
            restart_policy: policy,
            active_deadline_seconds: deadline,
            grace: GRACE,
        }
    }

    fn exit_at(code: i32, finished: u64) -> ExitReport {
        ExitReport {
            code: Some(code),
            description: format!("exited with code {code}"),
            cause: ExitCause::Exited,
            killed: false,
            finished_at: wall(finished),
        }
    }

    fn killed_at(cause: ExitCause, finished: u64) -> ExitReport {
        ExitReport {
            code: Some(143),
            description: "was killed by SIGTERM".into(),
            cause,
            killed: false,
            finished_at: wall(finished),
        }
    }

    /// Events to reach a state: (event, time in seconds).
    type Script = Vec<(Event, u64)>;

    fn started(t: u64) -> (Event, u64) {
        (Event::Started { at: wall(t) }, t)
    }

    /// Running since 10 (fresh run, started at 10).
    fn running_since_10() -> Script {
        vec![(Event::Start, 10), started(10)]
    }

    /// Exited with 1 at 20 (ran 10 s), waiting to restart at 21.
    fn backing_off() -> Script {
        let mut script = running_since_10();
        script.push((Event::Exited(exit_at(1, 20)), 20));
        script
    }

    fn adopt(at: Adopted, task_stopped: bool) -> Event {
        Event::Adopt {
            at,
            restarts: 3,
            first_start: wall(100),
            task_stopped,
        }
    }

    struct Row {
        name: &'static str,
        spec: RunSpec,
        before: Script,
        event: Event,
        at: u64,
        expect: Vec<Action<Duration>>,
        state: State<Duration>,
    }

    fn rows() -> Vec<Row> {
        use Action::*;
        let never = spec(RestartPolicy::Never, None);
        let on_failure = spec(RestartPolicy::OnFailure, None);
        let always = spec(RestartPolicy::Always, None);
        let with_deadline = spec(RestartPolicy::OnFailure, Some(60));
        let running_10 = State::Running {
            started_at: wall(10),
        };
        let backing_off_until_21 = State::BackingOff {
            restart_at: secs(21),
        };
        vec![
            // --- a fresh run starts
            Row {
                name: "a fresh run spawns with its Pending status and deadline",
                spec: with_deadline,
                before: vec![],
                event: Event::Start,
                at: 10,
                expect: vec![Spawn {
                    deadline: Some(secs(70)),
                    restarts: 0,
                    pending: Some(pending(NODE)),
                }],
                state: State::Starting,
            },
            Row {
                name: "started: state file, Running, old runs pruned",
                spec: never,
                before: vec![(Event::Start, 10)],
                event: Event::Started { at: wall(10) },
                at: 10,
                expect: vec![
                    SaveState,
                    WriteStatus(running(NODE, wall(10), 0)),
                    PruneOldRuns,
                ],
                state: running_10,
            },
            Row {
                name: "a start that fails is final, not retried",
                spec: always,
                before: vec![(Event::Start, 10)],
                event: Event::StartFailed {
                    reason: "StartError".into(),
                    message: "no such program".into(),
                },
                at: 11,
                expect: vec![
                    WriteStatus(start_failed(
                        "StartError",
                        "no such program".into(),
                        0,
                        wall(11),
                    )),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            // --- the process exits
            Row {
                name: "Never: an exit 0 is final",
                spec: never,
                before: running_since_10(),
                event: Event::Exited(exit_at(0, 20)),
                at: 20,
                expect: vec![
                    FinishExited(exited(&exit_at(0, 20), 0)),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "Never: a failure is final",
                spec: never,
                before: running_since_10(),
                event: Event::Exited(exit_at(3, 20)),
                at: 20,
                expect: vec![
                    FinishExited(exited(&exit_at(3, 20), 0)),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "OnFailure: an exit 0 is final",
                spec: on_failure,
                before: running_since_10(),
                event: Event::Exited(exit_at(0, 20)),
                at: 20,
                expect: vec![
                    FinishExited(exited(&exit_at(0, 20), 0)),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "OnFailure: a failure waits 1 s to restart, Pod still Running",
                spec: on_failure,
                before: running_since_10(),
                event: Event::Exited(exit_at(1, 20)),
                at: 20,
                expect: vec![
                    WriteStatus(backoff(&exit_at(1, 20), secs(1), 0)),
                    DeleteState,
                    WakeAt(secs(21)),
                ],
                state: backing_off_until_21,
            },
            Row {
                name: "Always: an exit 0 restarts too",
                spec: always,
                before: running_since_10(),
                event: Event::Exited(exit_at(0, 20)),
                at: 20,
                expect: vec![
                    WriteStatus(backoff(&exit_at(0, 20), secs(1), 0)),
                    DeleteState,
                    WakeAt(secs(21)),
                ],
                state: backing_off_until_21,
            },
            Row {
                name: "killed at its deadline: final whatever the policy",
                spec: spec(RestartPolicy::Always, Some(60)),
                before: running_since_10(),
                event: Event::Exited(killed_at(ExitCause::DeadlineExceeded, 70)),
                at: 70,
                expect: vec![
                    Finish(deadline_exceeded(
                        Some(60),
                        Some(&killed_at(ExitCause::DeadlineExceeded, 70)),
                        GRACE,
                        0,
                        wall(70),
                    )),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "the wake-up of a backoff comes at the deadline when that is first",
                spec: spec(RestartPolicy::OnFailure, Some(10)),
                before: running_since_10(),
                event: Event::Exited(exit_at(1, 20)),
                at: 19,
                expect: vec![
                    WriteStatus(backoff(&exit_at(1, 20), secs(1), 0)),
                    DeleteState,
                    WakeAt(secs(20)),
                ],
                state: State::BackingOff {
                    restart_at: secs(20),
                },
            },
            // --- the Task changes while the process runs
            Row {
                name: "running, stopped: kill with the grace period",
                spec: never,
                before: running_since_10(),
                event: Event::Stop,
                at: 30,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::Stop),
            },
            Row {
                name: "killed for a stop: Stopped with the exit",
                spec: never,
                before: [running_since_10(), vec![(Event::Stop, 30)]].concat(),
                event: Event::Exited(killed_at(ExitCause::Terminated, 31)),
                at: 31,
                expect: vec![
                    Finish(stopped(
                        Some(&killed_at(ExitCause::Terminated, 31)),
                        GRACE,
                        0,
                        wall(31),
                    )),
                    Done(End::Stopped),
                ],
                state: State::Done(End::Stopped),
            },
            Row {
                name: "running, a held device unhealthy (Stop policy): kill",
                spec: always,
                before: running_since_10(),
                event: Event::DeviceUnhealthy {
                    devices: "robot-arm-0: fault".into(),
                },
                at: 30,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::DeviceUnhealthy),
            },
            Row {
                name: "killed for an unhealthy device: Failed DeviceUnhealthy, no restart even with Always",
                spec: always,
                before: [
                    running_since_10(),
                    vec![(
                        Event::DeviceUnhealthy {
                            devices: "robot-arm-0: fault".into(),
                        },
                        30,
                    )],
                ]
                .concat(),
                event: Event::Exited(killed_at(ExitCause::Terminated, 31)),
                at: 31,
                expect: vec![
                    Finish(device_unhealthy(
                        "robot-arm-0: fault",
                        Some(&killed_at(ExitCause::Terminated, 31)),
                        GRACE,
                        0,
                        wall(31),
                    )),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "running, superseded: kill",
                spec: never,
                before: running_since_10(),
                event: Event::Supersede,
                at: 30,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::Supersede),
            },
            Row {
                name: "killed for a new run: state file gone, the new run's worker takes the Pod",
                spec: never,
                before: [running_since_10(), vec![(Event::Supersede, 30)]].concat(),
                event: Event::Exited(killed_at(ExitCause::Terminated, 31)),
                at: 31,
                expect: vec![DeleteState, Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            Row {
                name: "running, removed: kill",
                spec: never,
                before: running_since_10(),
                event: Event::Remove,
                at: 30,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::Remove),
            },
            Row {
                name: "killed for a removal: state file and Pod gone",
                spec: never,
                before: [running_since_10(), vec![(Event::Remove, 30)]].concat(),
                event: Event::Exited(killed_at(ExitCause::Terminated, 31)),
                at: 31,
                expect: vec![DeleteState, DeletePod, Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            Row {
                name: "running, the agent stops its tasks on exit: kill",
                spec: never,
                before: running_since_10(),
                event: Event::Shutdown {
                    stop_replicas: true,
                },
                at: 30,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::Shutdown),
            },
            Row {
                name: "killed at agent shutdown: AgentShutdown",
                spec: never,
                before: [
                    running_since_10(),
                    vec![(
                        Event::Shutdown {
                            stop_replicas: true,
                        },
                        30,
                    )],
                ]
                .concat(),
                event: Event::Exited(killed_at(ExitCause::Terminated, 31)),
                at: 31,
                expect: vec![
                    Finish(agent_shutdown(
                        Some(&killed_at(ExitCause::Terminated, 31)),
                        wall(31),
                    )),
                    Done(End::Exit),
                ],
                state: State::Done(End::Exit),
            },
            Row {
                name: "running, the agent shuts down: the process is left running",
                spec: never,
                before: running_since_10(),
                event: Event::Shutdown {
                    stop_replicas: false,
                },
                at: 30,
                expect: vec![Detach, Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            // --- waiting to restart
            Row {
                name: "backing off, woken early: sleep again",
                spec: on_failure,
                before: backing_off(),
                event: Event::Wake,
                at: 20,
                expect: vec![WakeAt(secs(21))],
                state: backing_off_until_21,
            },
            Row {
                name: "backing off, the backoff elapsed: restart (counted), no Pending",
                spec: on_failure,
                before: backing_off(),
                event: Event::Wake,
                at: 21,
                expect: vec![Spawn {
                    deadline: None,
                    restarts: 1,
                    pending: None,
                }],
                state: State::Starting,
            },
            Row {
                name: "restarted: Running keeps the run's first start, no pruning",
                spec: on_failure,
                before: [backing_off(), vec![(Event::Wake, 21)]].concat(),
                event: Event::Started { at: wall(21) },
                at: 21,
                expect: vec![SaveState, WriteStatus(running(NODE, wall(10), 1))],
                state: State::Running {
                    started_at: wall(21),
                },
            },
            Row {
                name: "backing off, the deadline passed: DeadlineExceeded without an exit",
                spec: spec(RestartPolicy::OnFailure, Some(10)),
                before: backing_off(),
                event: Event::Wake,
                at: 20,
                expect: vec![
                    Finish(deadline_exceeded(Some(10), None, GRACE, 0, wall(20))),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "backing off, stopped: Stopped without an exit",
                spec: on_failure,
                before: backing_off(),
                event: Event::Stop,
                at: 20,
                expect: vec![
                    Finish(stopped(None, GRACE, 0, wall(20))),
                    Done(End::Stopped),
                ],
                state: State::Done(End::Stopped),
            },
            Row {
                name: "backing off, a held device unhealthy: Failed DeviceUnhealthy without an exit",
                spec: on_failure,
                before: backing_off(),
                event: Event::DeviceUnhealthy {
                    devices: "camera-cam-0: gone".into(),
                },
                at: 20,
                expect: vec![
                    Finish(device_unhealthy(
                        "camera-cam-0: gone",
                        None,
                        GRACE,
                        0,
                        wall(20),
                    )),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "backing off, superseded: nothing to kill",
                spec: on_failure,
                before: backing_off(),
                event: Event::Supersede,
                at: 20,
                expect: vec![Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            Row {
                name: "backing off, removed: the Pod goes",
                spec: on_failure,
                before: backing_off(),
                event: Event::Remove,
                at: 20,
                expect: vec![DeletePod, Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            Row {
                name: "backing off, the agent stops its tasks on exit: AgentShutdown",
                spec: on_failure,
                before: backing_off(),
                event: Event::Shutdown {
                    stop_replicas: true,
                },
                at: 20,
                expect: vec![Finish(agent_shutdown(None, wall(20))), Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            Row {
                name: "backing off, the agent shuts down: nothing runs, nothing to do",
                spec: on_failure,
                before: backing_off(),
                event: Event::Shutdown {
                    stop_replicas: false,
                },
                at: 20,
                expect: vec![Done(End::Exit)],
                state: State::Done(End::Exit),
            },
            // --- after an agent restart
            Row {
                name: "adopted running: Running with the run's start and restarts",
                spec: never,
                before: vec![],
                event: adopt(
                    Adopted::Running {
                        started_at: wall(150),
                    },
                    false,
                ),
                at: 200,
                expect: vec![WriteStatus(running(NODE, wall(100), 3))],
                state: State::Running {
                    started_at: wall(150),
                },
            },
            Row {
                name: "adopted, exited meanwhile: the restart policy applies to that exit",
                spec: on_failure,
                before: vec![],
                event: adopt(
                    Adopted::Exited {
                        exit: exit_at(2, 190),
                        started_at: wall(150),
                    },
                    false,
                ),
                at: 200,
                expect: vec![
                    WriteStatus(backoff(&exit_at(2, 190), secs(1), 3)),
                    DeleteState,
                    WakeAt(secs(201)),
                ],
                state: State::BackingOff {
                    restart_at: secs(201),
                },
            },
            Row {
                name: "adopted, exited meanwhile, beyond the policy: final",
                spec: never,
                before: vec![],
                event: adopt(
                    Adopted::Exited {
                        exit: exit_at(0, 190),
                        started_at: wall(150),
                    },
                    false,
                ),
                at: 200,
                expect: vec![
                    FinishExited(exited(&exit_at(0, 190), 3)),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "adopted while waiting to restart: start now, no Pending",
                spec: on_failure,
                before: vec![],
                event: adopt(Adopted::Restart, false),
                at: 200,
                expect: vec![Spawn {
                    deadline: None,
                    restarts: 3,
                    pending: None,
                }],
                state: State::Starting,
            },
            Row {
                name: "adopted with a deadline: counted from the run's first start",
                spec: spec(RestartPolicy::OnFailure, Some(150)),
                before: vec![],
                event: adopt(Adopted::Restart, false),
                at: 200,
                expect: vec![Spawn {
                    deadline: Some(secs(250)),
                    restarts: 3,
                    pending: None,
                }],
                state: State::Starting,
            },
            Row {
                name: "adopted running, the Task is stopped: kill",
                spec: never,
                before: vec![],
                event: adopt(
                    Adopted::Running {
                        started_at: wall(150),
                    },
                    true,
                ),
                at: 200,
                expect: vec![Kill { grace: GRACE }],
                state: State::Killing(KillReason::Stop),
            },
            Row {
                name: "adopted exited, the Task is stopped: the real exit, as stopped",
                spec: always,
                before: vec![],
                event: adopt(
                    Adopted::Exited {
                        exit: exit_at(1, 190),
                        started_at: wall(150),
                    },
                    true,
                ),
                at: 200,
                expect: vec![Finish(exited(&exit_at(1, 190), 3)), Done(End::Stopped)],
                state: State::Done(End::Stopped),
            },
            Row {
                name: "adopted waiting to restart, the Task is stopped: Stopped",
                spec: always,
                before: vec![],
                event: adopt(Adopted::Restart, true),
                at: 200,
                expect: vec![
                    Finish(stopped(None, GRACE, 3, wall(200))),
                    Done(End::Stopped),
                ],
                state: State::Done(End::Stopped),
            },
            Row {
                name: "lost: AgentLost",
                spec: always,
                before: vec![],
                event: Event::Lost {
                    message: "gone".into(),
                    task_stopped: false,
                },
                at: 200,
                expect: vec![
                    Finish(agent_lost("gone".into(), wall(200))),
                    Done(End::Finished),
                ],
                state: State::Done(End::Finished),
            },
            Row {
                name: "lost, the Task is stopped: AgentLost, and a resume starts it again",
                spec: always,
                before: vec![],
                event: Event::Lost {
                    message: "gone".into(),
                    task_stopped: true,
                },
                at: 200,
                expect: vec![
                    Finish(agent_lost("gone".into(), wall(200))),
                    Done(End::Stopped),
                ],
                state: State::Done(End::Stopped),
            },
            // --- events that mean nothing where the replica stands
            Row {
                name: "idle: an exit is ignored",
                spec: never,
                before: vec![],
                event: Event::Exited(exit_at(0, 1)),
                at: 1,
                expect: vec![],
                state: State::Idle,
            },
            Row {
                name: "starting: a stop waits for the start (the worker holds it)",
                spec: never,
                before: vec![(Event::Start, 10)],
                event: Event::Stop,
                at: 10,
                expect: vec![],
                state: State::Starting,
            },
            Row {
                name: "running: a wake-up is ignored",
                spec: never,
                before: running_since_10(),
                event: Event::Wake,
                at: 30,
                expect: vec![],
                state: running_10,
            },
            Row {
                name: "killing: a second stop is ignored",
                spec: never,
                before: [running_since_10(), vec![(Event::Stop, 30)]].concat(),
                event: Event::Remove,
                at: 30,
                expect: vec![],
                state: State::Killing(KillReason::Stop),
            },
            Row {
                name: "done: nothing happens any more",
                spec: never,
                before: [
                    running_since_10(),
                    vec![(Event::Exited(exit_at(0, 20)), 20)],
                ]
                .concat(),
                event: Event::Start,
                at: 30,
                expect: vec![],
                state: State::Done(End::Finished),
            },
        ]
    }

    fn run(spec: RunSpec, script: &Script) -> Replica<Duration> {
        let mut replica = Replica::new(NODE, spec);
        for (event, t) in script {
            replica.step(event.clone(), at(*t));
        }
        replica
    }

    #[test]
    fn every_transition_does_what_the_table_says() {
        for row in rows() {
            let mut replica = run(row.spec, &row.before);
            let actions = replica.step(row.event, at(row.at));
            assert_eq!(actions, row.expect, "{}", row.name);
            assert_eq!(replica.state(), row.state, "{}", row.name);
        }
    }

    /// Crash-loop the replica: `runs` processes that each run `ran_for` seconds and exit
    /// 1; returns the backoffs it waited.
    fn crash_loop(replica: &mut Replica<Duration>, runs: usize, ran_for: u64) -> Vec<u64> {
        let mut t = 0;
        let mut waits = Vec::new();
        replica.step(Event::Start, at(t));
        for _ in 0..runs {
            replica.step(Event::Started { at: wall(t) }, at(t));
            t += ran_for;
            let actions = replica.step(Event::Exited(exit_at(1, t)), at(t));
            let Some(Action::WakeAt(wake)) = actions.last() else {
                panic!("no wake-up in {actions:?}");
            };
            let wait = wake.as_secs() - t;
            waits.push(wait);
            t += wait;
            let actions = replica.step(Event::Wake, at(t));
            assert!(matches!(actions[..], [Action::Spawn { .. }]), "{actions:?}");
        }
        waits
    }

    #[test]
    fn the_backoff_doubles_up_to_five_minutes() {
        let mut replica = Replica::new(NODE, spec(RestartPolicy::Always, None));
        let waits = crash_loop(&mut replica, 12, 1);
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(replica.restarts(), 12);
    }

    #[test]
    fn the_backoff_starts_over_after_ten_minutes_of_running() {
        let mut replica = Replica::new(NODE, spec(RestartPolicy::Always, None));
        crash_loop(&mut replica, 4, 1);
        let waits = crash_loop(&mut replica, 2, 599);
        assert_eq!(waits, [16, 32], "599 s is not long enough");
        let waits = crash_loop(&mut replica, 2, 600);
        assert_eq!(waits, [1, 1], "after 600 s running it starts over");
    }

    #[test]
    fn the_deadline_counts_from_the_first_start_across_restarts() {
        let mut replica = Replica::new(NODE, spec(RestartPolicy::Always, Some(30)));
        let actions = replica.step(Event::Start, at(100));
        assert!(matches!(
            actions[..],
            [Action::Spawn {
                deadline: Some(d),
                ..
            }] if d == secs(130)
        ));
        replica.step(Event::Started { at: wall(101) }, at(101));
        replica.step(Event::Exited(exit_at(1, 110)), at(110));
        let actions = replica.step(Event::Wake, at(111));
        assert!(
            matches!(actions[..], [Action::Spawn { deadline: Some(d), .. }] if d == secs(130)),
            "{actions:?}"
        );
    }

    #[test]
    fn task_changes_apply_from_the_next_start_and_the_next_stop() {
        let mut replica = Replica::new(NODE, spec(RestartPolicy::Never, None));
        replica.step(Event::Start, at(0));
        replica.step(Event::Started { at: wall(0) }, at(0));
        // Changed while the process runs: its exit still follows the policy it started with.
        replica.set_spec(RunSpec {
            restart_policy: RestartPolicy::Always,
            active_deadline_seconds: Some(5),
            grace: secs(9),
        });
        let actions = replica.step(Event::Exited(exit_at(1, 3)), at(3));
        assert!(
            matches!(
                actions[..],
                [Action::FinishExited(_), Action::Done(End::Finished)]
            ),
            "{actions:?}"
        );

        let mut replica = Replica::new(NODE, spec(RestartPolicy::Always, None));
        replica.step(Event::Start, at(0));
        replica.step(Event::Started { at: wall(0) }, at(0));
        replica.step(Event::Exited(exit_at(1, 3)), at(3));
        replica.set_spec(RunSpec {
            restart_policy: RestartPolicy::Never,
            active_deadline_seconds: Some(5),
            grace: secs(9),
        });
        // The next start reads the new deadline (none was known) and policy.
        let actions = replica.step(Event::Wake, at(4));
        assert!(
            matches!(actions[..], [Action::Spawn { deadline: Some(d), .. }] if d == secs(9)),
            "{actions:?}"
        );
        replica.step(Event::Started { at: wall(4) }, at(4));
        assert_eq!(
            replica.step(Event::Stop, at(5)),
            [Action::Kill { grace: secs(9) }]
        );
    }
}
