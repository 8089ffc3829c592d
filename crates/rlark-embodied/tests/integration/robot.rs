//! The RobotController over real unix sockets with a tonic client: every RPC, the state
//! machine, the launch-package whitelist, errors, the ROS 1 and ROS 2 backends (fake
//! `roscore`, `roslaunch` and `ros2` scripts first on the launch PATH), and the safety
//! watchdog.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use rlark_embodied::robot::service::DETACH_METADATA;
use rlark_embodied::{EmbodiedConfig, ROS_SOCKET, ROS2_SOCKET, Running};
use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::RobotState;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use rlark_testkit::wait::{eventually_within, matching};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::Channel;

type Client = RobotControllerClient<Channel>;

/// A running embodied runtime in a temporary socket directory.
struct Harness {
    dir: TempDir,
    running: Running,
    shutdown: CancellationToken,
}

impl Harness {
    async fn start(yaml: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let config = EmbodiedConfig::from_yaml(yaml)?;
        let shutdown = CancellationToken::new();
        let running =
            rlark_embodied::serve(config, &dir.path().join("run"), shutdown.clone()).await?;
        Ok(Self {
            dir,
            running,
            shutdown,
        })
    }

    fn socket(&self, name: &str) -> PathBuf {
        self.dir.path().join("run").join(name)
    }

    async fn client(&self, socket: &str) -> Result<Client> {
        let channel = rlark_embodied::client::connect(self.socket(socket)).await?;
        Ok(RobotControllerClient::new(channel))
    }

    /// The robot's state as the controller sees it (no connection, so the watchdog's view
    /// of this process is not disturbed).
    fn state(&self, id: &str) -> pb::RobotInfo {
        self.running.robots().status(id).expect("robot exists")
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.running.wait().await?;
        Ok(())
    }
}

fn state_of(value: i32) -> RobotState {
    RobotState::try_from(value).unwrap_or(RobotState::Unspecified)
}

fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn expect_code<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, needle: &str) {
    match result {
        Ok(v) => panic!("expected {code:?} ({needle}), got {v:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "{}", status.message());
            assert!(
                status.message().contains(needle),
                "{:?} does not contain {needle:?}",
                status.message()
            );
        }
    }
}

fn start_request(robot: &str, mode: &str, config: Option<pb::ModeConfig>) -> pb::StartRobotRequest {
    pb::StartRobotRequest {
        robot_id: robot.into(),
        mode: mode.into(),
        mode_config: config,
    }
}

fn my_pid() -> i32 {
    i32::try_from(std::process::id()).expect("pid fits")
}

const SIM: &str = r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch, args: {speed: "2.0"}, argFrom: {joints: dof}}
      teleop:
        package: rlark_sim
        launchFile: arm.launch
        args: {speed: "4.0", rate: "200"}
        argFrom: {joints: dof}
robots:
  - {id: arm-0, type: sim-arm, params: {dof: 3}}
allowedLaunchPackages: [rlark_sim]
watchdog: 60s
"#;

#[tokio::test]
async fn sim_robot_answers_every_rpc_through_its_states() -> Result<()> {
    let h = Harness::start(SIM).await?;
    let mut client = h.client(ROS_SOCKET).await?;
    // Sockets are 0660.
    let mode = std::fs::metadata(h.socket(ROS_SOCKET))?
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660);
    assert!(
        !h.socket(ROS2_SOCKET).exists(),
        "no ros2 robots, no ros2 socket"
    );

    let robots = client
        .list_robots(pb::ListRobotsRequest {})
        .await?
        .into_inner()
        .robots;
    assert_eq!(robots.len(), 1);
    assert_eq!(robots[0].robot_id, "arm-0");
    assert_eq!(state_of(robots[0].state), RobotState::Stopped);
    assert_eq!(
        (robots[0].backend.as_str(), robots[0].robot_type.as_str()),
        ("sim", "sim-arm")
    );
    assert_eq!(robots[0].params["dof"], "3");

    let modes = client
        .list_modes(pb::ListModesRequest {
            robot_id: "arm-0".into(),
        })
        .await?
        .into_inner();
    let names: Vec<&str> = modes.modes.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["idle", "teleop"]);
    assert_eq!(modes.modes[1].arg_from["joints"], "dof");

    // Start in teleop with a commanded target; joints from the robot's `dof` parameter.
    let started = client
        .start_robot(start_request(
            "arm-0",
            "teleop",
            Some(pb::ModeConfig {
                args: args(&[("target", "0.2,-0.4,0.6")]),
                ..Default::default()
            }),
        ))
        .await?
        .into_inner();
    assert_eq!(state_of(started.state), RobotState::Running);
    assert_eq!(started.owner_pid, my_pid());
    let mode = started.current_mode.context("current mode")?;
    assert_eq!(mode.name, "teleop");
    assert_eq!(
        mode.args,
        args(&[
            ("joints", "3"),
            ("rate", "200"),
            ("speed", "4.0"),
            ("target", "0.2,-0.4,0.6")
        ])
    );
    assert_eq!(
        started.sim.context("sim state")?.targets,
        vec![0.2, -0.4, 0.6]
    );

    // The arm moves to the target and stops there.
    let mut status = pb::GetRobotStatusResponse::default();
    for _ in 0..500 {
        status = client
            .get_robot_status(pb::GetRobotStatusRequest {
                robot_id: "arm-0".into(),
            })
            .await?
            .into_inner();
        if status.sim.as_ref().is_some_and(|s| !s.moving) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status.mode, "teleop");
    let sim = status.sim.context("sim")?;
    assert!(!sim.moving, "arm still moving: {sim:?}");
    assert_eq!(sim.positions, vec![0.2, -0.4, 0.6]);

    // Switch to idle: a new launch, the arm holds its position.
    let switched = client
        .switch_mode(pb::SwitchModeRequest {
            robot_id: "arm-0".into(),
            mode: "idle".into(),
            mode_config: None,
        })
        .await?
        .into_inner();
    assert_eq!(
        (state_of(switched.state), switched.mode.as_str()),
        (RobotState::Running, "idle")
    );
    assert_eq!(switched.owner_pid, my_pid(), "switching keeps the owner");
    assert_eq!(switched.sim.context("sim")?.positions, vec![0.2, -0.4, 0.6]);

    let logs = client
        .get_robot_logs(pb::GetRobotLogsRequest {
            robot_id: "arm-0".into(),
            tail: 0,
        })
        .await?
        .into_inner();
    assert_eq!(logs.robot_id, "arm-0");
    assert!(
        logs.lines
            .iter()
            .any(|l| l.starts_with("[sim-arm] target reached: [0.200, -0.400, 0.600]")),
        "{:#?}",
        logs.lines
    );
    assert!(
        logs.lines
            .iter()
            .any(|l| l == "[rlark] switch to mode idle"),
        "{:#?}",
        logs.lines
    );
    let last = client
        .get_robot_logs(pb::GetRobotLogsRequest {
            robot_id: "arm-0".into(),
            tail: 1,
        })
        .await?
        .into_inner();
    assert_eq!(last.lines.len(), 1);
    assert_eq!(last.lines.last(), logs.lines.last());

    // Packages: the built-in simulator package.
    let packages = client
        .list_packages(pb::ListPackagesRequest {})
        .await?
        .into_inner()
        .packages;
    assert_eq!(packages.len(), 1);
    assert_eq!(
        (packages[0].name.as_str(), packages[0].allowed),
        ("rlark_sim", true)
    );
    let info = client
        .get_package_info(pb::GetPackageInfoRequest {
            name: "rlark_sim".into(),
        })
        .await?
        .into_inner()
        .package
        .context("package")?;
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    let files = client
        .get_package_launch_files(pb::GetPackageLaunchFilesRequest {
            name: "rlark_sim".into(),
        })
        .await?
        .into_inner();
    assert_eq!(files.launch_files, ["arm.launch"]);
    let launch_args = client
        .get_launch_file_args(pb::GetLaunchFileArgsRequest {
            package: "rlark_sim".into(),
            launch_file: "arm.launch".into(),
        })
        .await?
        .into_inner();
    let names: Vec<&str> = launch_args.args.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["joints", "target", "speed", "rate", "fault"]);

    // Stop: STOPPED, owner cleared; stopping again is a no-op.
    let stopped = client
        .stop_robot(pb::StopRobotRequest {
            robot_id: "arm-0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(state_of(stopped.state), RobotState::Stopped);
    let again = client
        .stop_robot(pb::StopRobotRequest {
            robot_id: "arm-0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(state_of(again.state), RobotState::Stopped);
    let status = h.state("arm-0");
    assert_eq!(
        (status.owner_pid, status.mode.as_str(), status.current_mode),
        (0, "", None)
    );
    expect_code(
        client
            .switch_mode(pb::SwitchModeRequest {
                robot_id: "arm-0".into(),
                mode: "idle".into(),
                mode_config: None,
            })
            .await,
        Code::FailedPrecondition,
        "is STOPPED, not RUNNING",
    );

    // An injected fault (a custom launch of the whitelisted simulator package): RUNNING,
    // then ERROR; only a reset (or stop) gets it out.
    let faulty = client
        .start_robot(start_request(
            "arm-0",
            "",
            Some(pb::ModeConfig {
                package: "rlark_sim".into(),
                launch_file: "arm.launch".into(),
                args: args(&[("joints", "3"), ("fault", "overcurrent on joint 2")]),
                ..Default::default()
            }),
        ))
        .await?
        .into_inner();
    assert_eq!(
        faulty.current_mode.context("mode")?.name,
        "rlark_sim/arm.launch"
    );
    let failed = eventually_within(Duration::from_secs(10), "arm-0 in ERROR", || async {
        Ok(matching(h.state("arm-0"), |s| {
            state_of(s.state) == RobotState::Error
        }))
    })
    .await?;
    assert_eq!(state_of(failed.state), RobotState::Error);
    assert_eq!(
        failed.message,
        "simulated arm fault: overcurrent on joint 2"
    );
    expect_code(
        client
            .start_robot(start_request("arm-0", "idle", None))
            .await,
        Code::FailedPrecondition,
        "is ERROR, not STOPPED: reset it with ResetRobot",
    );
    let reset = client
        .reset_robot(pb::ResetRobotRequest {
            robot_id: "arm-0".into(),
        })
        .await?
        .into_inner();
    assert_eq!(state_of(reset.state), RobotState::Stopped);
    assert_eq!(
        (reset.ros_master_uri.as_str(), reset.ros_domain_id),
        ("", 0)
    );
    assert_eq!(h.state("arm-0").sim.context("sim")?.positions, vec![0.0; 3]);

    // The default mode applies when none is named.
    let restarted = client
        .start_robot(start_request("arm-0", "", None))
        .await?
        .into_inner();
    assert_eq!(restarted.current_mode.context("mode")?.name, "idle");
    h.stop().await?;
    Ok(())
}

#[tokio::test]
async fn errors_have_the_right_codes() -> Result<()> {
    let h = Harness::start(&SIM.replace("allowedLaunchPackages: [rlark_sim]", "")).await?;
    let mut client = h.client(ROS_SOCKET).await?;

    expect_code(
        client
            .start_robot(start_request("arm-9", "idle", None))
            .await,
        Code::NotFound,
        "robot \"arm-9\" not found",
    );
    expect_code(
        client
            .get_robot_status(pb::GetRobotStatusRequest {
                robot_id: "arm-9".into(),
            })
            .await,
        Code::NotFound,
        "arm-9",
    );
    expect_code(
        client
            .stop_robot(pb::StopRobotRequest {
                robot_id: "arm-9".into(),
            })
            .await,
        Code::NotFound,
        "arm-9",
    );
    expect_code(
        client
            .reset_robot(pb::ResetRobotRequest {
                robot_id: "arm-9".into(),
            })
            .await,
        Code::NotFound,
        "arm-9",
    );
    expect_code(
        client
            .list_modes(pb::ListModesRequest {
                robot_id: "arm-9".into(),
            })
            .await,
        Code::NotFound,
        "arm-9",
    );
    expect_code(
        client
            .get_robot_logs(pb::GetRobotLogsRequest {
                robot_id: "arm-9".into(),
                tail: 0,
            })
            .await,
        Code::NotFound,
        "arm-9",
    );
    expect_code(
        client
            .get_robot_status(pb::GetRobotStatusRequest {
                robot_id: String::new(),
            })
            .await,
        Code::InvalidArgument,
        "robot_id is required",
    );
    expect_code(
        client
            .start_robot(start_request("arm-0", "dance", None))
            .await,
        Code::InvalidArgument,
        "unknown mode \"dance\" for robot \"arm-0\" (modes: idle, teleop)",
    );
    expect_code(
        client
            .start_robot(start_request(
                "arm-0",
                "teleop",
                Some(pb::ModeConfig {
                    args: args(&[("target", "1,2")]),
                    ..Default::default()
                }),
            ))
            .await,
        Code::InvalidArgument,
        "argument target has 2 values but the arm has 3 joints",
    );
    expect_code(
        client
            .start_robot(start_request(
                "arm-0",
                "idle",
                Some(pb::ModeConfig {
                    package: "rlark_sim".into(),
                    launch_file: "arm.launch".into(),
                    ..Default::default()
                }),
            ))
            .await,
        Code::InvalidArgument,
        "not both",
    );
    // The whitelist is empty here: no custom launch, not even of the simulator package.
    for package in ["rlark_sim", "franka_control"] {
        expect_code(
            client
                .start_robot(start_request(
                    "arm-0",
                    "",
                    Some(pb::ModeConfig {
                        package: package.into(),
                        launch_file: "x.launch".into(),
                        ..Default::default()
                    }),
                ))
                .await,
            Code::PermissionDenied,
            &format!(
                "custom launch of package {package:?} on robot \"arm-0\" is not allowed (allowed launch packages: none)"
            ),
        );
    }
    expect_code(
        client
            .start_robot(start_request(
                "arm-0",
                "",
                Some(pb::ModeConfig {
                    package: "p".into(),
                    launch_file: "../../etc/passwd".into(),
                    ..Default::default()
                }),
            ))
            .await,
        Code::InvalidArgument,
        "must be a relative path inside the package",
    );
    assert_eq!(
        state_of(h.state("arm-0").state),
        RobotState::Stopped,
        "refused requests change nothing"
    );

    client
        .start_robot(start_request("arm-0", "idle", None))
        .await?;
    expect_code(
        client
            .start_robot(start_request("arm-0", "idle", None))
            .await,
        Code::FailedPrecondition,
        "robot \"arm-0\" is RUNNING, not STOPPED: stop it first, or switch modes with SwitchMode",
    );
    expect_code(
        client
            .get_robot_logs(pb::GetRobotLogsRequest {
                robot_id: "arm-0".into(),
                tail: -1,
            })
            .await,
        Code::InvalidArgument,
        "tail -1 must not be negative",
    );
    expect_code(
        client
            .get_package_info(pb::GetPackageInfoRequest {
                name: "franka_control".into(),
            })
            .await,
        Code::NotFound,
        "package \"franka_control\" not found",
    );
    expect_code(
        client
            .get_package_launch_files(pb::GetPackageLaunchFilesRequest { name: "a/b".into() })
            .await,
        Code::InvalidArgument,
        "not a package name",
    );
    expect_code(
        client
            .get_launch_file_args(pb::GetLaunchFileArgsRequest {
                package: "rlark_sim".into(),
                launch_file: "../x".into(),
            })
            .await,
        Code::InvalidArgument,
        "relative path",
    );
    expect_code(
        client
            .get_launch_file_args(pb::GetLaunchFileArgsRequest {
                package: "rlark_sim".into(),
                launch_file: "other.launch".into(),
            })
            .await,
        Code::NotFound,
        "has no launch file \"other.launch\"",
    );
    let packages = client
        .list_packages(pb::ListPackagesRequest {})
        .await?
        .into_inner()
        .packages;
    assert!(!packages[0].allowed, "rlark_sim is not whitelisted here");
    h.stop().await
}

// ---- ROS backends with fake tools ----

/// Fake ROS tools in `DIR/bin`; they record what they were given in `DIR/log`.
fn fake_ros(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let bin = dir.join("bin");
    let log = dir.join("log");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(&log)?;
    let scripts = [
        (
            "roscore",
            r#"#!/bin/sh
echo "$*" >> "$FAKE_ROS_LOG/roscore.args"
env | grep '^ROS_' | sort > "$FAKE_ROS_LOG/roscore.env"
echo "fake roscore on port $2"
exec python3 -c '
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
while True:
    c, _ = s.accept()
    c.close()
' "$2"
"#,
        ),
        (
            "roslaunch",
            r#"#!/bin/sh
printf '%s\n' "$@" > "$FAKE_ROS_LOG/roslaunch.args"
env | grep -E '^(ROS_|MODE_|REQUEST_|SITE_)' | sort > "$FAKE_ROS_LOG/roslaunch.env"
echo "fake roslaunch up: $*"
echo "a warning on stderr" >&2
case "$*" in
  *crash:=now*) echo "cannot reach the arm"; exit 2 ;;
  *crash:=later*) while [ ! -e "$FAKE_ROS_LOG/crash" ]; do sleep 0.05; done; echo "lost the arm"; exit 3 ;;
esac
exec sleep 1000
"#,
        ),
        (
            "ros2",
            r#"#!/bin/sh
printf '%s\n' "$@" > "$FAKE_ROS_LOG/ros2.args"
env | grep -E '^(ROS_|MODE_)' | sort > "$FAKE_ROS_LOG/ros2.env"
echo "fake ros2 up: $*"
exec sleep 1000
"#,
        ),
    ];
    for (name, text) in scripts {
        let path = bin.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok((bin, log))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A ROS 1 package `franka_control` on the package path.
fn fake_package(dir: &Path) -> Result<PathBuf> {
    let ws = dir.join("ws");
    let package = ws.join("src/franka_control");
    std::fs::create_dir_all(package.join("launch/sub"))?;
    std::fs::write(
        package.join("package.xml"),
        r#"<package format="2"><name>franka_control</name><version>0.9.1</version>
        <description>Franka arm control</description><maintainer email="a@b.c">Arm Team</maintainer></package>"#,
    )?;
    std::fs::write(
        package.join("launch/impedance.launch"),
        r#"<launch><arg name="robot_ip" doc="arm address"/><arg name="rate" default="100"/></launch>"#,
    )?;
    std::fs::write(package.join("launch/sub/gripper.launch"), "<launch/>")?;
    std::fs::write(package.join("launch/README.md"), "not a launch file")?;
    Ok(ws)
}

#[tokio::test]
async fn ros1_robot_runs_its_own_master_and_roslaunch() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (bin, log) = fake_ros(dir.path())?;
    let ws = fake_package(dir.path())?;
    let port = free_port()?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let yaml = format!(
        r#"
types:
  - type: franka
    backend: ros1
    modes:
      impedance:
        package: franka_control
        launchFile: impedance.launch
        args: {{rate: "100"}}
        env: {{MODE_FLAVOR: impedance}}
        argFrom: {{robot_ip: ip}}
      passthrough:
        package: franka_control
        launchFile: impedance.launch
        passthroughRobotArgs: true
      flaky:
        package: franka_control
        launchFile: impedance.launch
        args: {{crash: later}}
      broken:
        package: franka_control
        launchFile: impedance.launch
        args: {{crash: now}}
robots:
  - id: panda
    type: franka
    masterPort: {port}
    params: {{ip: 172.16.0.2, gripper: "true"}}
env:
  PATH: "{path}"
  FAKE_ROS_LOG: "{log}"
  SITE_NAME: lab
ros:
  packagePath: ["{ws}"]
stopTimeout: 5s
watchdog: 60s
"#,
        log = log.display(),
        ws = ws.display(),
    );
    let h = Harness::start(&yaml).await?;
    let mut client = h.client(ROS_SOCKET).await?;

    let started = client
        .start_robot(start_request(
            "panda",
            "impedance",
            Some(pb::ModeConfig {
                args: args(&[("rate", "250")]),
                env: args(&[("REQUEST_ID", "r1")]),
                ..Default::default()
            }),
        ))
        .await?
        .into_inner();
    assert_eq!(state_of(started.state), RobotState::Running);
    let uri = format!("http://127.0.0.1:{port}");
    assert_eq!(started.ros_master_uri, uri);
    assert_eq!(lines(&log.join("roscore.args")), [format!("-p {port}")]);
    assert_eq!(
        lines(&log.join("roscore.env")),
        [
            "ROS_IP=127.0.0.1".to_string(),
            format!("ROS_MASTER_URI={uri}")
        ]
    );
    // Arguments in name order: the preset's, the robot parameter by argFrom, the request's.
    assert_eq!(
        lines(&log.join("roslaunch.args")),
        [
            "franka_control",
            "impedance.launch",
            "rate:=250",
            "robot_ip:=172.16.0.2"
        ]
    );
    assert_eq!(
        lines(&log.join("roslaunch.env")),
        [
            "MODE_FLAVOR=impedance".to_string(),
            "REQUEST_ID=r1".to_string(),
            "ROS_IP=127.0.0.1".to_string(),
            format!("ROS_MASTER_URI={uri}"),
            "SITE_NAME=lab".to_string(),
        ]
    );
    // Wait (bounded) for the output to reach the log, then read it through GetRobotLogs.
    eventually_within(
        Duration::from_secs(10),
        "the roslaunch warning in the log",
        || async {
            Ok(matching(
                h.running.robots().logs("panda", 0).expect("logs"),
                |l| l.iter().any(|x| x == "[roslaunch] a warning on stderr"),
            ))
        },
    )
    .await?;
    let logs = client
        .get_robot_logs(pb::GetRobotLogsRequest {
            robot_id: "panda".into(),
            tail: 0,
        })
        .await?
        .into_inner()
        .lines;
    for expected in [
        format!("[roscore] fake roscore on port {port}"),
        "[roslaunch] fake roslaunch up: franka_control impedance.launch rate:=250 robot_ip:=172.16.0.2".to_string(),
        "[roslaunch] a warning on stderr".to_string(),
    ] {
        assert!(logs.contains(&expected), "{expected:?} not in {logs:#?}");
    }

    // Switch: a new roslaunch, the same master.
    client
        .switch_mode(pb::SwitchModeRequest {
            robot_id: "panda".into(),
            mode: "passthrough".into(),
            mode_config: None,
        })
        .await?;
    assert_eq!(
        lines(&log.join("roslaunch.args")),
        [
            "franka_control",
            "impedance.launch",
            "gripper:=true",
            "ip:=172.16.0.2"
        ]
    );
    assert_eq!(
        lines(&log.join("roscore.args")).len(),
        1,
        "the master keeps running"
    );

    // Packages from the package path.
    let packages = client
        .list_packages(pb::ListPackagesRequest {})
        .await?
        .into_inner()
        .packages;
    assert_eq!(packages.len(), 1);
    assert_eq!(
        (
            packages[0].name.as_str(),
            packages[0].version.as_str(),
            packages[0].maintainer.as_str(),
            packages[0].allowed
        ),
        ("franka_control", "0.9.1", "Arm Team <a@b.c>", false)
    );
    let files = client
        .get_package_launch_files(pb::GetPackageLaunchFilesRequest {
            name: "franka_control".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        files.launch_files,
        ["impedance.launch", "sub/gripper.launch"]
    );
    let launch_args = client
        .get_launch_file_args(pb::GetLaunchFileArgsRequest {
            package: "franka_control".into(),
            launch_file: "impedance.launch".into(),
        })
        .await?
        .into_inner()
        .args;
    assert_eq!(launch_args.len(), 2);
    assert_eq!(
        (
            launch_args[0].name.as_str(),
            launch_args[0].required,
            launch_args[0].description.as_str()
        ),
        ("robot_ip", true, "arm address")
    );
    assert_eq!(
        (
            launch_args[1].name.as_str(),
            launch_args[1].required,
            launch_args[1].default.as_str()
        ),
        ("rate", false, "100")
    );

    // A launch that dies later: ERROR with the exit status; its output is in the logs.
    client
        .switch_mode(pb::SwitchModeRequest {
            robot_id: "panda".into(),
            mode: "flaky".into(),
            mode_config: None,
        })
        .await?;
    std::fs::write(log.join("crash"), "")?;
    let failed = eventually_within(Duration::from_secs(10), "panda in ERROR", || async {
        Ok(matching(h.state("panda"), |s| {
            state_of(s.state) == RobotState::Error
        }))
    })
    .await?;
    assert_eq!(state_of(failed.state), RobotState::Error);
    assert_eq!(failed.message, "roslaunch exited with status 3");
    let logs = h.running.robots().logs("panda", 0).expect("logs");
    assert!(
        logs.contains(&"[roslaunch] lost the arm".to_string()),
        "{logs:#?}"
    );

    // Reset: a fresh master, STOPPED. A launch that fails at once: StartRobot fails.
    let reset = client
        .reset_robot(pb::ResetRobotRequest {
            robot_id: "panda".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        (state_of(reset.state), reset.ros_master_uri.as_str()),
        (RobotState::Stopped, uri.as_str())
    );
    assert_eq!(
        lines(&log.join("roscore.args")).len(),
        2,
        "reset restarts the master"
    );
    expect_code(
        client
            .start_robot(start_request("panda", "broken", None))
            .await,
        Code::Internal,
        "launch of mode broken failed: roslaunch exited with status 2 right after starting",
    );
    assert_eq!(state_of(h.state("panda").state), RobotState::Error);
    let logs = h.running.robots().logs("panda", 0).expect("logs");
    assert!(
        logs.contains(&"[roslaunch] cannot reach the arm".to_string()),
        "{logs:#?}"
    );

    // Stop takes the master down too.
    client
        .stop_robot(pb::StopRobotRequest {
            robot_id: "panda".into(),
        })
        .await?;
    assert_eq!(state_of(h.state("panda").state), RobotState::Stopped);
    let master_gone = eventually_within(
        Duration::from_secs(10),
        &format!("roscore to stop listening on {port}"),
        || async {
            Ok(matching(
                std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
                |gone| *gone,
            ))
        },
    )
    .await?;
    assert!(master_gone, "roscore still listens on {port}");
    h.stop().await
}

#[tokio::test]
async fn ros2_robot_launches_with_its_domain_on_its_own_socket() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (bin, log) = fake_ros(dir.path())?;
    let prefix = dir.path().join("install");
    let share = prefix.join("share/ur_bringup");
    std::fs::create_dir_all(share.join("launch"))?;
    std::fs::write(
        share.join("package.xml"),
        "<package><name>ur_bringup</name><version>2.0.0</version></package>",
    )?;
    std::fs::write(
        share.join("launch/ur.launch.py"),
        "DeclareLaunchArgument('ur_type', default_value='ur5e', description='model')",
    )?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let yaml = format!(
        r#"
types:
  - type: ur
    backend: ros2
    modes: {{run: {{package: ur_bringup, launchFile: ur.launch.py, env: {{MODE_X: "1"}}, passthroughRobotArgs: true}}}}
  - type: sim-arm
    backend: sim
    modes: {{idle: {{package: rlark_sim, launchFile: arm.launch}}}}
robots:
  - {{id: ur5, type: ur, domainId: 7, params: {{robot_ip: 10.0.0.5}}}}
  - {{id: arm-0, type: sim-arm}}
env: {{PATH: "{path}", FAKE_ROS_LOG: "{log}"}}
ros2: {{prefixPath: ["{prefix}"]}}
allowedLaunchPackages: ["*"]
"#,
        log = log.display(),
        prefix = prefix.display(),
    );
    let h = Harness::start(&yaml).await?;
    let mut ros2 = h.client(ROS2_SOCKET).await?;
    let mut ros1 = h.client(ROS_SOCKET).await?;

    let listed: Vec<String> = ros2
        .list_robots(pb::ListRobotsRequest {})
        .await?
        .into_inner()
        .robots
        .into_iter()
        .map(|r| r.robot_id)
        .collect();
    assert_eq!(listed, ["ur5"]);
    expect_code(
        ros1.get_robot_status(pb::GetRobotStatusRequest {
            robot_id: "ur5".into(),
        })
        .await,
        Code::NotFound,
        "robot \"ur5\" is not served on this socket: it is a ros2 robot, on ros2-ctrl.sock",
    );
    expect_code(
        ros2.get_robot_status(pb::GetRobotStatusRequest {
            robot_id: "arm-0".into(),
        })
        .await,
        Code::NotFound,
        "it is a sim robot, on ros-ctrl.sock",
    );

    let started = ros2
        .start_robot(start_request("ur5", "run", None))
        .await?
        .into_inner();
    assert_eq!(
        (
            state_of(started.state),
            started.ros_domain_id,
            started.ros_master_uri.as_str()
        ),
        (RobotState::Running, 7, "")
    );
    assert_eq!(
        lines(&log.join("ros2.args")),
        ["launch", "ur_bringup", "ur.launch.py", "robot_ip:=10.0.0.5"]
    );
    assert_eq!(
        lines(&log.join("ros2.env")),
        ["MODE_X=1", "ROS_DOMAIN_ID=7"]
    );
    // Wait (bounded) for the output to reach the log, then read it through GetRobotLogs.
    eventually_within(
        Duration::from_secs(10),
        "the ros2 output in the log",
        || async {
            Ok(matching(
                h.running.robots().logs("ur5", 0).expect("logs"),
                |l| l.iter().any(|x| x.starts_with("[ros2] fake ros2 up")),
            ))
        },
    )
    .await?;
    let logs = ros2
        .get_robot_logs(pb::GetRobotLogsRequest {
            robot_id: "ur5".into(),
            tail: 0,
        })
        .await?
        .into_inner()
        .lines;
    assert!(
        logs.contains(
            &"[ros2] fake ros2 up: launch ur_bringup ur.launch.py robot_ip:=10.0.0.5".to_string()
        ),
        "{logs:#?}"
    );

    let packages = ros2
        .list_packages(pb::ListPackagesRequest {})
        .await?
        .into_inner()
        .packages;
    assert_eq!(
        packages
            .iter()
            .map(|p| (p.name.as_str(), p.allowed))
            .collect::<Vec<_>>(),
        [("ur_bringup", true)]
    );
    let launch_args = ros2
        .get_launch_file_args(pb::GetLaunchFileArgsRequest {
            package: "ur_bringup".into(),
            launch_file: "ur.launch.py".into(),
        })
        .await?
        .into_inner()
        .args;
    assert_eq!(
        (
            launch_args[0].name.as_str(),
            launch_args[0].default.as_str()
        ),
        ("ur_type", "ur5e")
    );

    let stopped = ros2
        .stop_robot(pb::StopRobotRequest {
            robot_id: "ur5".into(),
        })
        .await?
        .into_inner();
    assert_eq!(state_of(stopped.state), RobotState::Stopped);
    let logs = h.running.robots().logs("ur5", 0).expect("logs");
    assert!(
        logs.iter().any(|l| l == "[ros2] killed by SIGINT"),
        "{logs:#?}"
    );
    h.stop().await
}

// ---- safety ----

const CHILD_SOCKET: &str = "RLARK_TEST_CHILD_SOCKET";

/// Run as a child process by `a_robot_is_stopped_when_its_owner_process_exits`: start the
/// robot through the socket in $RLARK_TEST_CHILD_SOCKET, print the owner the controller
/// recorded, and exit.
#[tokio::test]
#[ignore = "helper run as a child process by the safety test, not a test on its own"]
async fn child_process_starts_arm_0() -> Result<()> {
    let Some(socket) = std::env::var_os(CHILD_SOCKET) else {
        return Ok(());
    };
    let channel = rlark_embodied::client::connect(PathBuf::from(socket)).await?;
    let mut client = RobotControllerClient::new(channel);
    let started = client
        .start_robot(start_request("arm-0", "idle", None))
        .await?
        .into_inner();
    println!("owner_pid={}", started.owner_pid);
    Ok(())
}

#[tokio::test]
async fn a_robot_is_stopped_when_its_owner_process_exits() -> Result<()> {
    // A watchdog far longer than the test: only the process rule can stop the robot.
    let h = Harness::start(SIM).await?;
    let output = tokio::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "robot::child_process_starts_arm_0",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SOCKET, h.socket(ROS_SOCKET))
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    // The harness prints the test name on the same line, before the output.
    let owner: i32 = stdout
        .lines()
        .find_map(|l| l.split_once("owner_pid=").map(|(_, pid)| pid))
        .with_context(|| {
            format!(
                "child printed no owner: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?
        .trim()
        .parse()?;
    assert_ne!(owner, 0);
    assert_ne!(
        owner,
        my_pid(),
        "the child, not this process, owns the robot"
    );

    let status = eventually_within(
        Duration::from_secs(20),
        "arm-0 STOPPED by the watchdog",
        || async {
            Ok(matching(h.state("arm-0"), |s| {
                state_of(s.state) == RobotState::Stopped
            }))
        },
    )
    .await?;
    assert_eq!(state_of(status.state), RobotState::Stopped);
    assert_eq!(
        status.message,
        format!("safety stop: owner process {owner} exited")
    );
    let logs = h.running.robots().logs("arm-0", 0).expect("logs");
    assert!(
        logs.iter()
            .any(|l| l == &format!("[rlark] start mode idle for process {owner}")),
        "{logs:#?}"
    );
    h.stop().await
}

#[tokio::test]
async fn a_robot_is_stopped_when_its_owner_stays_disconnected_past_the_watchdog() -> Result<()> {
    let h = Harness::start(&SIM.replace("watchdog: 60s", "watchdog: 300ms")).await?;
    let mut owner_channel = h.client(ROS_SOCKET).await?;
    let other = h.client(ROS_SOCKET).await?;
    let started = owner_channel
        .start_robot(start_request("arm-0", "idle", None))
        .await?
        .into_inner();
    assert_eq!(started.owner_pid, my_pid());

    // The connection that started it closes, but the owner process keeps another one
    // open: the robot stays, well past the watchdog.
    drop(owner_channel);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(state_of(h.state("arm-0").state), RobotState::Running);

    // No connection at all: stopped once the watchdog has passed.
    drop(other);
    let status = eventually_within(
        Duration::from_secs(20),
        "arm-0 STOPPED by the watchdog",
        || async {
            Ok(matching(h.state("arm-0"), |s| {
                state_of(s.state) == RobotState::Stopped
            }))
        },
    )
    .await?;
    assert_eq!(state_of(status.state), RobotState::Stopped);
    assert_eq!(
        status.message,
        format!(
            "safety stop: owner process {} has had no connection to the controller for more than 300ms",
            my_pid()
        )
    );
    h.stop().await
}

#[tokio::test]
async fn a_detached_start_has_no_owner_and_survives_its_client() -> Result<()> {
    let h = Harness::start(&SIM.replace("watchdog: 60s", "watchdog: 100ms")).await?;
    let mut client = h.client(ROS_SOCKET).await?;
    let mut request = tonic::Request::new(start_request("arm-0", "idle", None));
    request
        .metadata_mut()
        .insert(DETACH_METADATA, "true".parse()?);
    let started = client.start_robot(request).await?.into_inner();
    assert_eq!(
        (state_of(started.state), started.owner_pid),
        (RobotState::Running, 0)
    );
    drop(client);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(state_of(h.state("arm-0").state), RobotState::Running);
    h.stop().await?;
    Ok(())
}

#[tokio::test]
async fn sockets_are_replaced_when_stale_and_refused_when_live() -> Result<()> {
    let h = Harness::start(SIM).await?;
    let run_dir = h.socket("");
    // A second runtime on the same directory: the live socket is not taken over.
    let config = EmbodiedConfig::from_yaml(SIM)?;
    let refused = rlark_embodied::serve(config.clone(), &run_dir, CancellationToken::new()).await;
    match refused {
        Err(e) => assert!(
            e.to_string()
                .contains("is in use: another server answers on it"),
            "{e}"
        ),
        Ok(_) => bail!("a second server took over a live socket"),
    }
    let socket = h.socket(ROS_SOCKET);
    h.stop().await?;
    assert!(!socket.exists(), "socket removed on shutdown");

    // A stale socket file (nobody listening) is replaced.
    let dir = tempfile::tempdir()?;
    let stale = dir.path().join(ROS_SOCKET);
    drop(std::os::unix::net::UnixListener::bind(&stale)?);
    assert!(stale.exists());
    let shutdown = CancellationToken::new();
    let running = rlark_embodied::serve(config.clone(), dir.path(), shutdown.clone()).await?;
    let mut client = RobotControllerClient::new(rlark_embodied::client::connect(&stale).await?);
    client.list_robots(pb::ListRobotsRequest {}).await?;
    shutdown.cancel();
    running.wait().await?;

    // A regular file in the way is left alone.
    std::fs::write(&stale, "data")?;
    match rlark_embodied::serve(config, dir.path(), CancellationToken::new()).await {
        Err(e) => assert!(e.to_string().contains("exists and is not a socket"), "{e}"),
        Ok(_) => bail!("replaced a regular file"),
    }
    assert_eq!(std::fs::read_to_string(&stale)?, "data");
    Ok(())
}

/// The next list of a WatchRobots stream (within 10 s).
async fn next(
    lists: &mut tonic::Streaming<pb::ListRobotsResponse>,
) -> Result<pb::ListRobotsResponse> {
    tokio::time::timeout(Duration::from_secs(10), lists.message())
        .await
        .context("a list within 10 s")?
        .context("the watch")?
        .context("the watch ended")
}

#[tokio::test]
async fn watch_robots_sends_the_list_now_and_after_each_state_change() -> Result<()> {
    let h = Harness::start(SIM).await?;
    let mut client = h.client(ROS_SOCKET).await?;
    let mut lists = client
        .watch_robots(pb::WatchRobotsRequest {})
        .await?
        .into_inner();
    let state = |list: &pb::ListRobotsResponse| state_of(list.robots[0].state);
    let now = next(&mut lists).await?;
    assert_eq!(now.robots.len(), 1);
    assert_eq!(state(&now), RobotState::Stopped);
    let mut request = tonic::Request::new(start_request("arm-0", "teleop", None));
    request
        .metadata_mut()
        .insert(DETACH_METADATA, "true".parse()?);
    client.start_robot(request).await?;
    // STARTING may be coalesced with RUNNING; RUNNING (in teleop) comes.
    loop {
        let list = next(&mut lists).await?;
        if state(&list) == RobotState::Running {
            assert_eq!(list.robots[0].mode, "teleop");
            break;
        }
        assert_eq!(state(&list), RobotState::Starting);
    }
    client
        .stop_robot(pb::StopRobotRequest {
            robot_id: "arm-0".into(),
        })
        .await?;
    loop {
        let list = next(&mut lists).await?;
        if state(&list) == RobotState::Stopped {
            break;
        }
        assert_eq!(state(&list), RobotState::Stopping);
    }
    h.stop().await?;
    Ok(())
}
