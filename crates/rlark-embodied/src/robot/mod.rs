//! The robot controller: every configured robot, its state machine, its backend and its
//! safety watchdog.
//!
//! States (RLark's `RobotState`):
//!
//! ```text
//!            StartRobot                launch up
//!  STOPPED ─────────────► STARTING ───────────────► RUNNING ──┐ SwitchMode:
//!     ▲                      │ launch fails            │  ▲   │ STOPPING → STARTING
//!     │                      ▼                         │  └───┘ → RUNNING (or ERROR)
//!     │                    ERROR ◄─────────────────────┤ launch exits non-zero,
//!     │ StopRobot /          │                         │ master lost, sim fault
//!     │ ResetRobot           │ StopRobot / ResetRobot  │ StopRobot, safety stop,
//!     └──── STOPPING ◄───────┴─────────────────────────┘ launch exits 0
//! ```
//!
//! Operations on one robot are serialized (an operation lock held for the whole start,
//! switch, stop or reset); status reads never wait for it. Every launch gets a new
//! generation number, and what a backend reports later (a process exit, a simulated fault)
//! counts only for the launch it belongs to, so the exit of a launch being stopped on
//! purpose never turns into an error.

pub mod backend;
pub mod error;
pub mod packages;
pub mod plan;
pub mod process;
pub mod ros;
pub mod service;
pub mod sim;
pub mod sim_launch;
pub mod watchdog;

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use rlark_proto::robot::v1::{ModeConfig, ModeInfo, RobotInfo, RobotState};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use self::backend::{Backend, BackendEvent, EventKind, LaunchContext};
use self::process::LogRing;
use self::ros::{RosBackend, RosKind, RosSetup};
use self::sim::{ArmState, SimBackend};
use self::watchdog::{Owner, OwnerScope};
use crate::config::{Backend as BackendKind, EmbodiedConfig, Robot as RobotSpec};
use crate::peer::ConnTracker;

pub use self::error::RobotError;

/// Who asks for an operation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// The calling process (SO_PEERCRED), if known.
    pub pid: Option<i32>,
    /// The caller asked not to own the robot (`rlark-detach: true`): no watchdog follows it.
    pub detach: bool,
    /// The caller asked for its replica to own the robot (`rlark-owner: LABEL`): the
    /// watchdog follows the caller's session leader; `LABEL` is only shown
    /// ([`watchdog`]).
    pub owner: Option<String>,
}

/// The mutable state of a robot, read without waiting for operations.
#[derive(Clone, Debug)]
struct Status {
    state: RobotState,
    /// The current mode; `None` when STOPPED.
    mode: Option<ModeInfo>,
    /// Why the robot is in its state.
    message: String,
    owner: Option<Owner>,
}

/// Held for the whole of an operation on one robot.
struct Ops {
    backend: Box<dyn Backend>,
    /// Number of the current launch; bumped by every launch, stop and reset.
    generation: u64,
}

struct Robot {
    spec: RobotSpec,
    logs: Arc<LogRing>,
    status: Mutex<Status>,
    ops: tokio::sync::Mutex<Ops>,
    arm: Option<Arc<Mutex<ArmState>>>,
    /// The controller's state-change counter (see [`RobotController::state_changes`]).
    changes: Arc<watch::Sender<u64>>,
}

/// A robot's locked status; announces a change of `state` when released.
struct StatusGuard<'a> {
    guard: MutexGuard<'a, Status>,
    before: RobotState,
    changes: &'a watch::Sender<u64>,
}

impl Deref for StatusGuard<'_> {
    type Target = Status;
    fn deref(&self) -> &Status {
        &self.guard
    }
}

impl DerefMut for StatusGuard<'_> {
    fn deref_mut(&mut self) -> &mut Status {
        &mut self.guard
    }
}

impl Drop for StatusGuard<'_> {
    fn drop(&mut self) {
        if self.guard.state != self.before {
            // Never blocks: watch receivers only see the counter move.
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl Robot {
    fn status(&self) -> StatusGuard<'_> {
        // Status fields are replaced whole; a panic cannot leave them half-written.
        let guard = self.status.lock().unwrap_or_else(PoisonError::into_inner);
        StatusGuard {
            before: guard.state,
            guard,
            changes: &self.changes,
        }
    }

    fn set(&self, state: RobotState, message: impl Into<String>) {
        let mut status = self.status();
        status.state = state;
        status.message = message.into();
    }

    fn note(&self, text: &str) {
        self.logs.push("rlark", text);
    }
}

/// Every robot of a configuration. Create it with [`RobotController::new`].
pub struct RobotController {
    config: Arc<EmbodiedConfig>,
    robots: Vec<Robot>,
    index: BTreeMap<String, usize>,
    tracker: Arc<ConnTracker>,
    events: mpsc::UnboundedSender<BackendEvent>,
    /// Ends the background tasks (event handler, watchdog).
    background: CancellationToken,
    /// Counts state changes of any robot (see [`RobotController::state_changes`]).
    changes: Arc<watch::Sender<u64>>,
}

/// The upper-case name of a state, as RLark's clients print it.
pub fn state_name(state: RobotState) -> &'static str {
    match state {
        RobotState::Unspecified => "UNSPECIFIED",
        RobotState::Starting => "STARTING",
        RobotState::Running => "RUNNING",
        RobotState::Stopping => "STOPPING",
        RobotState::Stopped => "STOPPED",
        RobotState::Error => "ERROR",
    }
}

impl RobotController {
    /// Set up every robot (all STOPPED; nothing is launched) and start the background
    /// tasks: the backend event handler and the safety watchdog. `tracker` counts the
    /// connections of the servers in front of this controller. Call
    /// [`RobotController::shutdown`] to stop every robot and the tasks.
    pub fn new(config: Arc<EmbodiedConfig>, tracker: Arc<ConnTracker>) -> Arc<Self> {
        let (events, event_rx) = mpsc::unbounded_channel();
        let changes = Arc::new(watch::Sender::new(0));
        let mut robots = Vec::new();
        let mut index = BTreeMap::new();
        for spec in &config.robots {
            let logs = LogRing::new(config.log_lines);
            let (backend, arm): (Box<dyn Backend>, _) = match spec.backend {
                BackendKind::Sim => {
                    let sim = SimBackend::new(logs.clone());
                    let arm = sim.arm();
                    (Box::new(sim), Some(arm))
                }
                BackendKind::Ros1 | BackendKind::Ros2 => {
                    let kind = if spec.backend == BackendKind::Ros1 {
                        RosKind::Ros1 {
                            host: config.ros.master_host.clone(),
                            // Validation assigns a port to every ros1 robot.
                            port: spec
                                .master_port
                                .unwrap_or(crate::config::DEFAULT_FIRST_MASTER_PORT),
                        }
                    } else {
                        RosKind::Ros2 {
                            // Validation assigns a domain to every ros2 robot.
                            domain_id: spec.domain_id.unwrap_or(0),
                        }
                    };
                    let setup = RosSetup {
                        robot: spec.id.clone(),
                        base_env: config.env.clone(),
                        logs: logs.clone(),
                        stop_timeout: config.stop_timeout,
                        start_timeout: config.start_timeout,
                        events: events.clone(),
                    };
                    (Box::new(RosBackend::new(kind, setup)), None)
                }
            };
            index.insert(spec.id.clone(), robots.len());
            robots.push(Robot {
                spec: spec.clone(),
                logs,
                status: Mutex::new(Status {
                    state: RobotState::Stopped,
                    mode: None,
                    message: String::new(),
                    owner: None,
                }),
                ops: tokio::sync::Mutex::new(Ops {
                    backend,
                    generation: 0,
                }),
                arm,
                changes: changes.clone(),
            });
        }
        let controller = Arc::new(Self {
            config,
            robots,
            index,
            tracker,
            events,
            background: CancellationToken::new(),
            changes,
        });
        controller.spawn_event_handler(event_rx);
        watchdog::spawn(&controller);
        controller
    }

    /// The configuration the controller runs.
    pub fn config(&self) -> &EmbodiedConfig {
        &self.config
    }

    /// A receiver marked changed whenever the state of any robot changes (every
    /// transition, e.g. RUNNING → ERROR); read the states with [`Self::status`]. Consumers
    /// that look later see only the latest state (e.g. the device plugin's health).
    pub fn state_changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    pub(crate) fn tracker(&self) -> &ConnTracker {
        &self.tracker
    }

    pub(crate) fn background(&self) -> &CancellationToken {
        &self.background
    }

    fn spawn_event_handler(self: &Arc<Self>, mut rx: mpsc::UnboundedReceiver<BackendEvent>) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let stop = self.background.clone();
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => break,
                    event = rx.recv() => match event {
                        Some(event) => event,
                        None => break,
                    },
                };
                let Some(controller) = weak.upgrade() else {
                    break;
                };
                controller.handle_event(event).await;
            }
        });
    }

    /// Something happened to a launch on its own: a clean end stops the robot, a failure
    /// stops the launch and puts the robot in ERROR. Events of an earlier launch, or
    /// arriving when the robot is not STARTING or RUNNING, change nothing.
    async fn handle_event(&self, event: BackendEvent) {
        let Some(robot) = self.index.get(&event.robot).map(|&i| &self.robots[i]) else {
            return;
        };
        let mut ops = robot.ops.lock().await;
        let state = robot.status().state;
        if event.generation != ops.generation
            || !matches!(state, RobotState::Running | RobotState::Starting)
        {
            tracing::debug!(robot = %event.robot, ?event.kind, "stale launch event ignored");
            return;
        }
        match event.kind {
            EventKind::Ended(text) => {
                tracing::info!(robot = %event.robot, %text, "launch ended; robot stopped");
                robot.set(RobotState::Stopping, text.clone());
                ops.generation += 1;
                ops.backend.shutdown().await;
                robot.note(&format!("launch ended ({text}); robot STOPPED"));
                let mut status = robot.status();
                status.state = RobotState::Stopped;
                status.mode = None;
                status.owner = None;
                status.message = text;
            }
            EventKind::Failed(text) => {
                tracing::warn!(robot = %event.robot, %text, "launch failed; robot in ERROR");
                ops.generation += 1;
                ops.backend.stop_launch().await;
                robot.note(&format!(
                    "{text}; robot in ERROR (ResetRobot or StopRobot to recover)"
                ));
                robot.set(RobotState::Error, text);
            }
        }
    }

    fn robot(&self, id: &str) -> Result<&Robot, RobotError> {
        self.index
            .get(id)
            .map(|&i| &self.robots[i])
            .ok_or_else(|| RobotError::NotFound(format!("robot {id:?} not found")))
    }

    /// The backend of a robot, if the robot exists.
    pub fn backend_of(&self, id: &str) -> Option<BackendKind> {
        self.robot(id).ok().map(|r| r.spec.backend)
    }

    /// IDs of every robot, in configuration order.
    pub fn robot_ids(&self) -> Vec<String> {
        self.robots.iter().map(|r| r.spec.id.clone()).collect()
    }

    /// What GetRobotStatus reports.
    pub fn status(&self, id: &str) -> Result<RobotInfo, RobotError> {
        Ok(self.info(self.robot(id)?))
    }

    fn info(&self, robot: &Robot) -> RobotInfo {
        let status = robot.status().clone();
        let spec = &robot.spec;
        RobotInfo {
            robot_id: spec.id.clone(),
            mode: status
                .mode
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            state: status.state as i32,
            current_mode: status.mode,
            ros_master_uri: match spec.master_port {
                Some(port) if spec.backend == BackendKind::Ros1 => {
                    ros::master_uri(&self.config.ros.master_host, port)
                }
                _ => String::new(),
            },
            params: spec.params.clone(),
            ros_domain_id: spec
                .domain_id
                .filter(|_| spec.backend == BackendKind::Ros2)
                .and_then(|d| i32::try_from(d).ok())
                .unwrap_or(0),
            message: status.message,
            backend: spec.backend.as_str().to_string(),
            robot_type: spec.robot_type.clone(),
            owner_pid: status.owner.map(|o| o.pid).unwrap_or(0),
            sim: robot.arm.as_ref().map(|arm| {
                arm.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .to_proto()
            }),
        }
    }

    /// The preset modes of a robot's type.
    pub fn modes(&self, id: &str) -> Result<Vec<ModeInfo>, RobotError> {
        let robot = self.robot(id)?;
        let Some(robot_type) = self.config.types.get(&robot.spec.robot_type) else {
            return Ok(Vec::new());
        };
        Ok(robot_type
            .modes
            .iter()
            .map(|(name, mode)| ModeInfo {
                name: name.clone(),
                package: mode.package.clone(),
                launch_file: mode.launch_file.clone(),
                args: mode.args.clone(),
                env: mode.env.clone(),
                arg_from: mode.arg_from.clone(),
                passthrough_robot_args: mode.passthrough_robot_args,
            })
            .collect())
    }

    /// The last `tail` log lines of a robot (all kept lines for 0).
    pub fn logs(&self, id: &str, tail: usize) -> Result<Vec<String>, RobotError> {
        Ok(self.robot(id)?.logs.tail(tail))
    }

    /// StartRobot: launch `mode` (or the custom launch of `request`) on a STOPPED robot
    /// and return once it runs. Unless `caller.detach`, the calling process becomes the
    /// robot's owner, followed by the safety watchdog.
    pub async fn start(
        &self,
        id: &str,
        mode: &str,
        request: Option<&ModeConfig>,
        caller: &Caller,
    ) -> Result<RobotInfo, RobotError> {
        let robot = self.robot(id)?;
        let plan = plan::resolve(&self.config, &robot.spec, mode, request)?;
        let mut ops = robot.ops.lock().await;
        let state = robot.status().state;
        if state != RobotState::Stopped {
            let hint = match state {
                RobotState::Running => "stop it first, or switch modes with SwitchMode",
                RobotState::Error => "reset it with ResetRobot (or stop it) first",
                _ => "wait for the current operation to finish",
            };
            return Err(RobotError::FailedPrecondition(format!(
                "robot {id:?} is {}, not STOPPED: {hint}",
                state_name(state)
            )));
        }
        let owner = watchdog::claim(id, caller);
        {
            let mut status = robot.status();
            status.state = RobotState::Starting;
            status.mode = Some(plan.mode.clone());
            status.message = format!("starting mode {}", plan.mode.name);
            status.owner = owner.clone();
        }
        robot.note(&match &owner {
            Some(
                owner @ Owner {
                    scope: OwnerScope::Replica { caller, .. },
                    ..
                },
            ) => format!(
                "start mode {} for {}, called by process {caller}",
                plan.mode.name,
                owner.describe()
            ),
            Some(owner) => format!("start mode {} for {}", plan.mode.name, owner.describe()),
            None => format!("start mode {} (no owner process)", plan.mode.name),
        });
        tracing::info!(robot = id, mode = %plan.mode.name, owner = owner.as_ref().map(|o| o.pid), owner_scope = ?owner.as_ref().map(|o| &o.scope), "starting robot");
        self.launch(robot, &mut ops, &plan).await?;
        Ok(self.info(robot))
    }

    /// Launch `plan` on a robot whose status says STARTING; RUNNING or ERROR after.
    async fn launch(
        &self,
        robot: &Robot,
        ops: &mut Ops,
        plan: &plan::LaunchPlan,
    ) -> Result<(), RobotError> {
        ops.generation += 1;
        let ctx = LaunchContext {
            robot: robot.spec.id.clone(),
            generation: ops.generation,
            events: self.events.clone(),
        };
        match ops.backend.launch(plan, ctx).await {
            Ok(()) => {
                robot.set(RobotState::Running, "");
                robot.note(&format!("RUNNING in mode {}", plan.mode.name));
                Ok(())
            }
            Err(e) => {
                // Whatever did start (a ROS master) stays until StopRobot or ResetRobot.
                ops.backend.stop_launch().await;
                robot.set(RobotState::Error, e.to_string());
                robot.note(&format!(
                    "launch of mode {} failed: {e}; robot in ERROR",
                    plan.mode.name
                ));
                tracing::warn!(robot = %robot.spec.id, mode = %plan.mode.name, error = %e, "launch failed");
                Err(RobotError::LaunchFailed(format!(
                    "robot {:?}: launch of mode {} failed: {e}",
                    robot.spec.id, plan.mode.name
                )))
            }
        }
    }

    /// SwitchMode: stop the current launch of a RUNNING robot and launch another mode.
    /// The owner stays.
    pub async fn switch(
        &self,
        id: &str,
        mode: &str,
        request: Option<&ModeConfig>,
    ) -> Result<RobotInfo, RobotError> {
        let robot = self.robot(id)?;
        let plan = plan::resolve(&self.config, &robot.spec, mode, request)?;
        let mut ops = robot.ops.lock().await;
        let state = robot.status().state;
        if state != RobotState::Running {
            return Err(RobotError::FailedPrecondition(format!(
                "robot {id:?} is {}, not RUNNING: start it with StartRobot",
                state_name(state)
            )));
        }
        robot.set(
            RobotState::Stopping,
            format!("switching to mode {}", plan.mode.name),
        );
        robot.note(&format!("switch to mode {}", plan.mode.name));
        ops.generation += 1;
        ops.backend.stop_launch().await;
        {
            let mut status = robot.status();
            status.state = RobotState::Starting;
            status.mode = Some(plan.mode.clone());
        }
        self.launch(robot, &mut ops, &plan).await?;
        Ok(self.info(robot))
    }

    /// StopRobot: stop everything the robot runs; STOPPED after (a no-op when it is).
    pub async fn stop(&self, id: &str, reason: &str) -> Result<RobotInfo, RobotError> {
        let robot = self.robot(id)?;
        let mut ops = robot.ops.lock().await;
        self.stop_locked(robot, &mut ops, reason).await;
        Ok(self.info(robot))
    }

    async fn stop_locked(&self, robot: &Robot, ops: &mut Ops, reason: &str) {
        if robot.status().state == RobotState::Stopped {
            return;
        }
        robot.set(RobotState::Stopping, reason);
        robot.note(&format!("stopping: {reason}"));
        ops.generation += 1;
        ops.backend.shutdown().await;
        {
            let mut status = robot.status();
            status.state = RobotState::Stopped;
            status.mode = None;
            status.owner = None;
            status.message = reason.to_string();
        }
        robot.note("STOPPED");
        tracing::info!(robot = %robot.spec.id, reason, "robot stopped");
    }

    /// The watchdog's stop: only if `pid` still owns the robot (it may have been stopped
    /// and started by someone else meanwhile).
    pub(crate) async fn safety_stop(&self, id: &str, pid: i32, reason: &str) {
        let Ok(robot) = self.robot(id) else {
            return;
        };
        let mut ops = robot.ops.lock().await;
        if robot.status().owner.as_ref().map(|o| o.pid) != Some(pid) {
            return;
        }
        tracing::warn!(robot = id, pid, reason, "safety stop");
        self.stop_locked(robot, &mut ops, reason).await;
    }

    /// ResetRobot: stop everything, clear an error, come back STOPPED with a fresh ROS
    /// master (ROS 1) or zeroed joints (sim).
    pub async fn reset(&self, id: &str) -> Result<RobotInfo, RobotError> {
        let robot = self.robot(id)?;
        let mut ops = robot.ops.lock().await;
        robot.set(RobotState::Stopping, "resetting");
        robot.note("reset");
        ops.generation += 1;
        let result = ops.backend.reset().await;
        let mut status = robot.status();
        status.mode = None;
        status.owner = None;
        match result {
            Ok(()) => {
                status.state = RobotState::Stopped;
                status.message = "reset".into();
                drop(status);
                robot.note("reset done; robot STOPPED");
                Ok(self.info(robot))
            }
            Err(e) => {
                status.state = RobotState::Error;
                status.message = e.to_string();
                drop(status);
                robot.note(&format!("reset failed: {e}; robot in ERROR"));
                Err(RobotError::LaunchFailed(format!(
                    "robot {id:?}: reset failed: {e}"
                )))
            }
        }
    }

    /// Stop every robot (concurrently) and the background tasks.
    pub async fn shutdown(&self) {
        self.background.cancel();
        let stops = self.robots.iter().map(|robot| async move {
            let mut ops = robot.ops.lock().await;
            self.stop_locked(robot, &mut ops, "controller shutting down")
                .await;
        });
        futures::future::join_all(stops).await;
    }

    /// Robots whose owner the watchdog follows: (id, owner).
    pub(crate) fn owned(&self) -> Vec<(String, Owner)> {
        self.robots
            .iter()
            .filter_map(|r| r.status().owner.clone().map(|o| (r.spec.id.clone(), o)))
            .collect()
    }

    /// Update the owner record of a robot in place (the watchdog's bookkeeping).
    pub(crate) fn update_owner(&self, id: &str, pid: i32, update: impl FnOnce(&mut Owner)) {
        if let Ok(robot) = self.robot(id) {
            let mut status = robot.status();
            if let Some(owner) = status.owner.as_mut().filter(|o| o.pid == pid) {
                update(owner);
            }
        }
    }
}
