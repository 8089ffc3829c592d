//! The ROS backends. ROS 1: the robot's own `roscore -p PORT` (started on the first
//! launch or a reset, kept across mode switches, stopped with the robot), then
//! `roslaunch PACKAGE FILE NAME:=VALUE...` with `ROS_MASTER_URI` pointing at it. ROS 2:
//! `ros2 launch PACKAGE FILE NAME:=VALUE...` with the robot's `ROS_DOMAIN_ID`.
//!
//! Environment of every process, later entries winning: the controller's own, the
//! configuration's `env`, the mode's and the request's `env`, then the ROS variables the
//! controller owns (`ROS_MASTER_URI` and `ROS_IP`/`ROS_HOSTNAME`, or `ROS_DOMAIN_ID`).
//! Programs are looked up on the resulting `PATH`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::backend::{Backend, BackendEvent, EventKind, LaunchContext, LaunchError};
use super::plan::LaunchPlan;
use super::process::{LogRing, ManagedProcess, Spawn, describe_exit};

/// A launch process still running this long after it started counts as up (ROS has no
/// readiness signal for a launch; an immediate failure is reported by StartRobot itself,
/// a later one moves the robot to ERROR).
pub const LAUNCH_SETTLE: Duration = Duration::from_millis(500);
/// How often the ROS 1 master's port is probed while it starts.
const MASTER_PROBE: Duration = Duration::from_millis(100);

/// Which ROS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RosKind {
    Ros1 { host: String, port: u16 },
    Ros2 { domain_id: u32 },
}

/// `http://HOST:PORT` of a ROS 1 master.
pub fn master_uri(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("http://[{ip}]:{port}"),
        _ => format!("http://{host}:{port}"),
    }
}

/// A ROS 1 or ROS 2 robot's launches.
pub struct RosBackend {
    robot: String,
    kind: RosKind,
    base_env: BTreeMap<String, String>,
    logs: Arc<LogRing>,
    stop_timeout: Duration,
    start_timeout: Duration,
    events: mpsc::UnboundedSender<BackendEvent>,
    /// The generation of the current launch, for events of the master (which outlives
    /// launches).
    generation: Arc<AtomicU64>,
    master: Option<ManagedProcess>,
    launch: Option<ManagedProcess>,
}

/// What [`RosBackend::new`] needs besides the kind.
pub struct RosSetup {
    pub robot: String,
    pub base_env: BTreeMap<String, String>,
    pub logs: Arc<LogRing>,
    pub stop_timeout: Duration,
    pub start_timeout: Duration,
    pub events: mpsc::UnboundedSender<BackendEvent>,
}

impl RosBackend {
    pub fn new(kind: RosKind, setup: RosSetup) -> Self {
        Self {
            robot: setup.robot,
            kind,
            base_env: setup.base_env,
            logs: setup.logs,
            stop_timeout: setup.stop_timeout,
            start_timeout: setup.start_timeout,
            events: setup.events,
            generation: Arc::new(AtomicU64::new(0)),
            master: None,
            launch: None,
        }
    }

    /// The variables the controller owns.
    fn ros_env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        match &self.kind {
            RosKind::Ros1 { host, port } => {
                env.insert("ROS_MASTER_URI".into(), master_uri(host, *port));
                let var = if host.parse::<IpAddr>().is_ok() {
                    "ROS_IP"
                } else {
                    "ROS_HOSTNAME"
                };
                env.insert(var.into(), host.clone());
            }
            RosKind::Ros2 { domain_id } => {
                env.insert("ROS_DOMAIN_ID".into(), domain_id.to_string());
            }
        }
        env
    }

    fn env(&self, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut env = self.base_env.clone();
        env.extend(extra.clone());
        env.extend(self.ros_env());
        env
    }

    /// Start `roscore -p PORT` and wait until it accepts connections.
    async fn start_master(&mut self) -> Result<(), LaunchError> {
        let RosKind::Ros1 { port, .. } = self.kind else {
            return Ok(());
        };
        let probe = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
        if tokio::net::TcpStream::connect(probe).await.is_ok() {
            return Err(LaunchError::new(format!(
                "port {port} is already in use (another ROS master or program listens there); cannot start this robot's roscore"
            )));
        }
        let events = self.events.clone();
        let robot = self.robot.clone();
        let generation = self.generation.clone();
        let env = self.env(&BTreeMap::new());
        self.logs
            .push("rlark", &format!("starting ROS master: roscore -p {port}"));
        let master = ManagedProcess::spawn(
            Spawn {
                name: "roscore",
                program: "roscore",
                args: vec!["-p".into(), port.to_string()],
                env,
            },
            self.logs.clone(),
            move |status| {
                let _ = events.send(BackendEvent {
                    robot,
                    generation: generation.load(Ordering::SeqCst),
                    kind: EventKind::Failed(format!(
                        "ROS master (roscore) {}",
                        describe_exit(&status)
                    )),
                });
            },
        )
        .map_err(|e| {
            LaunchError::new(format!(
                "cannot run roscore: {e} (is ROS 1 installed and on PATH?)"
            ))
        })?;
        let deadline = tokio::time::Instant::now() + self.start_timeout;
        loop {
            if let Some(status) = master.exit_status() {
                return Err(LaunchError::new(format!(
                    "roscore {} before accepting connections on port {port}",
                    describe_exit(&status)
                )));
            }
            if tokio::net::TcpStream::connect(probe).await.is_ok() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                master.stop(self.stop_timeout).await;
                return Err(LaunchError::new(format!(
                    "roscore did not accept connections on port {port} within {:?}",
                    self.start_timeout
                )));
            }
            tokio::time::sleep(MASTER_PROBE).await;
        }
        self.logs
            .push("rlark", &format!("ROS master is up on port {port}"));
        self.master = Some(master);
        Ok(())
    }

    async fn stop_master(&mut self) {
        if let Some(master) = self.master.take() {
            master.stop(self.stop_timeout).await;
        }
    }
}

#[async_trait::async_trait]
impl Backend for RosBackend {
    async fn launch(&mut self, plan: &LaunchPlan, ctx: LaunchContext) -> Result<(), LaunchError> {
        self.stop_launch().await;
        self.generation.store(ctx.generation, Ordering::SeqCst);
        if matches!(self.kind, RosKind::Ros1 { .. })
            && self
                .master
                .as_ref()
                .is_none_or(|m| m.exit_status().is_some())
        {
            self.master = None;
            self.start_master().await?;
        }
        let (name, program, mut args) = match self.kind {
            RosKind::Ros1 { .. } => ("roslaunch", "roslaunch", Vec::new()),
            RosKind::Ros2 { .. } => ("ros2", "ros2", vec!["launch".to_string()]),
        };
        args.push(plan.mode.package.clone());
        args.push(plan.mode.launch_file.clone());
        args.extend(plan.launch_args());
        self.logs.push(
            "rlark",
            &format!(
                "launching mode {}: {program} {}",
                plan.mode.name,
                args.join(" ")
            ),
        );
        let reporter = ctx.clone();
        let launch = ManagedProcess::spawn(
            Spawn {
                name,
                program,
                args,
                env: self.env(&plan.env),
            },
            self.logs.clone(),
            move |status| {
                let text = format!("{name} {}", describe_exit(&status));
                reporter.report(if status.success() {
                    EventKind::Ended(text)
                } else {
                    EventKind::Failed(text)
                });
            },
        )
        .map_err(|e| {
            LaunchError::new(format!(
                "cannot run {program}: {e} (is ROS installed and on PATH?)"
            ))
        })?;
        if let Some(status) = launch.wait(LAUNCH_SETTLE).await {
            return Err(LaunchError::new(format!(
                "{name} {} right after starting (see GetRobotLogs)",
                describe_exit(&status)
            )));
        }
        self.launch = Some(launch);
        Ok(())
    }

    async fn stop_launch(&mut self) {
        if let Some(launch) = self.launch.take() {
            self.logs
                .push("rlark", &format!("stopping {}", launch.name()));
            launch.stop(self.stop_timeout).await;
        }
    }

    async fn shutdown(&mut self) {
        self.stop_launch().await;
        self.stop_master().await;
    }

    async fn reset(&mut self) -> Result<(), LaunchError> {
        self.shutdown().await;
        // A fresh master: the ROS graph of the failed run is gone.
        self.start_master().await
    }
}
