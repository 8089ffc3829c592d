//! Who may call a device (issue 38, "a replica holding arm-0 cannot call arm-1"; before
//! the fix any process that could open the socket drove any robot): a real embodied
//! runtime with two simulated arms and a camera, the holders file the agent would write,
//! and real processes made replicas the way rlark's supervisor makes them (`setsid()`:
//! the replica's session is the leader's PID, which a task cannot forge). Each replica
//! is this test binary run again as a child ([`replica_calls`]), which reports what each
//! call answered.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use rlark_embodied::access::{self, Holders, ProcessRef, ReplicaHolder};
use rlark_embodied::{CAMERA_SOCKET, EmbodiedConfig, ROS_SOCKET, Running};
use rlark_proto::camera::v1 as cam;
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use rlark_testkit::wait::eventually_within;
use tokio_util::sync::CancellationToken;

const TWO_ARMS: &str = r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch, argFrom: {joints: dof}}
robots:
  - {id: arm-0, type: sim-arm, params: {dof: 3}}
  - {id: arm-1, type: sim-arm, params: {dof: 3}}
cameras:
  - {id: cam-0, driver: sim, width: 64, height: 48, fps: 10, encoding: jpeg}
allowedLaunchPackages: []
watchdog: 60s
"#;

/// Environment of [`replica_calls`].
const SOCKET_DIR: &str = "RLARK_TEST_ACCESS_DIR";
const GO_FILE: &str = "RLARK_TEST_ACCESS_GO";
const LEAVE_SESSION: &str = "RLARK_TEST_ACCESS_SETSID";
const ESCAPE: &str = "RLARK_TEST_ACCESS_ESCAPE";

/// Run as a child process by the tests below: become a session leader when asked (as
/// rlark's supervisor does), wait for the go file, then call GetRobotStatus on arm-0 and
/// arm-1, ListRobots, GetCameraInfo on cam-0 and CaptureFrames on cam-0, and print
/// `RESULT name=code` lines. With `ESCAPE`, it also runs itself again as a child that
/// leaves this session (`setsid`) and prints its results with an `escaped-` prefix.
#[tokio::test]
#[ignore = "helper run as a child process by the access tests, not a test on its own"]
async fn replica_calls() -> Result<()> {
    let Some(dir) = std::env::var_os(SOCKET_DIR).map(PathBuf::from) else {
        return Ok(());
    };
    if std::env::var_os(LEAVE_SESSION).is_some() {
        nix::unistd::setsid()?;
    }
    if let Some(go) = std::env::var_os(GO_FILE) {
        let go = PathBuf::from(go);
        for _ in 0..600 {
            if go.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let channel = rlark_embodied::client::connect(dir.join(ROS_SOCKET)).await?;
    let mut robots = RobotControllerClient::new(channel);
    for arm in ["arm-0", "arm-1"] {
        let answer = robots
            .get_robot_status(pb::GetRobotStatusRequest {
                robot_id: arm.into(),
            })
            .await;
        println!("RESULT {arm}={:?}", answer.err().map(|s| s.code()));
    }
    let listed = robots.list_robots(pb::ListRobotsRequest {}).await?;
    let ids: Vec<String> = listed
        .into_inner()
        .robots
        .into_iter()
        .map(|r| r.robot_id)
        .collect();
    println!("RESULT list={}", ids.join(","));
    let channel = rlark_embodied::client::connect(dir.join(CAMERA_SOCKET)).await?;
    let mut cameras = CameraControllerClient::new(channel);
    let info = cameras
        .get_camera_info(cam::GetCameraInfoRequest {
            camera_id: "cam-0".into(),
        })
        .await;
    println!("RESULT cam-0={:?}", info.err().map(|s| s.code()));
    let frames = cameras
        .capture_frames(cam::CaptureFramesRequest {
            camera_ids: vec!["cam-0".into()],
            ..Default::default()
        })
        .await?
        .into_inner();
    let code = frames.frames.first().map_or(-1, |f| f.error_code);
    println!("RESULT frames-cam-0={code}");
    if std::env::var_os(ESCAPE).is_some() {
        let output = tokio::process::Command::new(std::env::current_exe()?)
            .args(helper_args())
            .env(SOCKET_DIR, &dir)
            .env(LEAVE_SESSION, "1")
            .env_remove(GO_FILE)
            .env_remove(ESCAPE)
            .output()
            .await?;
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            if let Some((_, result)) = line.split_once("RESULT ") {
                println!("RESULT escaped-{result}");
            }
        }
    }
    Ok(())
}

fn helper_args() -> [&'static str; 5] {
    [
        "--exact",
        "access::replica_calls",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]
}

/// A runtime serving [`TWO_ARMS`] in a directory others may enter (a replica of another
/// uid reaches its sockets, as a replica given them would).
struct Lab {
    _dir: tempfile::TempDir,
    run: PathBuf,
    running: Running,
    shutdown: CancellationToken,
}

impl Lab {
    /// With `open_sockets`, the sockets are made 0666 at once (an admin's choice); else
    /// they stay 0660 until holders are published (the runtime opens them then).
    async fn start(open_sockets: bool) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let run = dir.path().join("run");
        let shutdown = CancellationToken::new();
        let running =
            rlark_embodied::serve(EmbodiedConfig::from_yaml(TWO_ARMS)?, &run, shutdown.clone())
                .await?;
        for socket in [ROS_SOCKET, CAMERA_SOCKET].iter().filter(|_| open_sockets) {
            std::fs::set_permissions(run.join(socket), std::fs::Permissions::from_mode(0o666))?;
        }
        Ok(Self {
            _dir: dir,
            run,
            running,
            shutdown,
        })
    }

    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.running.wait().await?;
        Ok(())
    }
}

/// A started [`replica_calls`] child.
struct Replica {
    child: tokio::process::Child,
    go: PathBuf,
}

impl Replica {
    /// Start one: as `uid` when given; a session leader when `leader`; waiting for its go
    /// file (in `scratch`, named `name`) when `wait`.
    fn start(
        lab: &Lab,
        scratch: &Path,
        name: &str,
        uid: Option<u32>,
        leader: bool,
        escape: bool,
    ) -> Result<Self> {
        let go = scratch.join(format!("{name}.go"));
        let mut command = tokio::process::Command::new(std::env::current_exe()?);
        command
            .args(helper_args())
            .env(SOCKET_DIR, &lab.run)
            .env(GO_FILE, &go)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if leader {
            command.env(LEAVE_SESSION, "1");
        }
        if escape {
            command.env(ESCAPE, "1");
        }
        if let Some(uid) = uid {
            command.uid(uid).gid(uid);
        }
        Ok(Self {
            child: command.spawn()?,
            go,
        })
    }

    fn pid(&self) -> Result<i32> {
        Ok(i32::try_from(self.child.id().context("running")?)?)
    }

    /// Its session root once it leads its own session.
    async fn root(&self) -> Result<ProcessRef> {
        let pid = self.pid()?;
        eventually_within(
            Duration::from_secs(20),
            "the replica leads its session",
            || async move {
                Ok(access::live_stat(pid)
                    .filter(|s| s.session == pid)
                    .map(|s| ProcessRef {
                        pid,
                        start_ticks: s.start_ticks,
                    }))
            },
        )
        .await
    }

    /// Let it call, and collect `name=code` results.
    async fn results(self) -> Result<std::collections::BTreeMap<String, String>> {
        std::fs::write(&self.go, "")?;
        let output = tokio::time::timeout(Duration::from_secs(60), self.child.wait_with_output())
            .await
            .context("the replica's calls timed out")??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "replica failed: {stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(stdout
            .lines()
            .filter_map(|l| l.split_once("RESULT "))
            .filter_map(|(_, r)| r.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }
}

const DENIED: &str = "Some(PermissionDenied)";
const ALLOWED: &str = "None";
/// `CaptureFrames`' per-camera error code for PermissionDenied.
const FRAME_DENIED: &str = "7";

fn holder(name: &str, root: ProcessRef, devices: &[&str]) -> ReplicaHolder {
    ReplicaHolder {
        name: name.into(),
        roots: vec![root],
        devices: devices.iter().map(|d| (*d).to_string()).collect(),
        ..ReplicaHolder::default()
    }
}

/// Issue 38: a replica holding arm-0 cannot call arm-1 — neither as root (raw replicas
/// today) nor as its own uid, nor after leaving its session; a process of another uid
/// outside every replica is refused; root outside the replicas (the agent, an admin) may
/// call everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_calls_only_the_devices_it_holds() -> Result<()> {
    let lab = Lab::start(false).await?;
    let scratch = tempfile::tempdir()?;
    // a: root, holds arm-0 and the camera; its child leaves the session. b: uid 65534
    // (as replicas with their own user will run), holds arm-1.
    let a = Replica::start(&lab, scratch.path(), "a", None, true, true)?;
    let b = Replica::start(&lab, scratch.path(), "b", Some(65534), true, false)?;
    let outsider = Replica::start(&lab, scratch.path(), "outsider", Some(65534), false, false)?;
    let holders = Holders {
        replicas: vec![
            holder("lab/a-0", a.root().await?, &["robot-arm-0", "camera-cam-0"]),
            holder("lab/b-0", b.root().await?, &["robot-arm-1"]),
        ],
    };
    access::publish(&lab.run, &holders)?;
    // The runtime notices the file by itself and opens its sockets to every user (b and
    // the outsider run as uid 65534).
    let socket = lab.run.join(ROS_SOCKET);
    eventually_within(Duration::from_secs(20), "the sockets opened", || {
        let socket = socket.clone();
        async move {
            let mode = std::fs::metadata(&socket)?.permissions().mode() & 0o777;
            Ok((mode == 0o666).then_some(()))
        }
    })
    .await?;
    let outsider = outsider.results().await?;
    let b = b.results().await?;
    let a = a.results().await?;
    assert_eq!(a["arm-0"], ALLOWED, "{a:?}");
    assert_eq!(a["arm-1"], DENIED, "a holds arm-0 only: {a:?}");
    assert_eq!(a["list"], "arm-0", "{a:?}");
    assert_eq!(a["cam-0"], ALLOWED, "{a:?}");
    // Not open yet (FailedPrecondition), but not refused.
    assert_ne!(a["frames-cam-0"], FRAME_DENIED, "{a:?}");
    assert_eq!(
        a["escaped-arm-0"], ALLOWED,
        "setsid does not leave the replica: {a:?}"
    );
    assert_eq!(a["escaped-arm-1"], DENIED, "{a:?}");

    assert_eq!(b["arm-1"], ALLOWED, "{b:?}");
    assert_eq!(b["arm-0"], DENIED, "{b:?}");
    assert_eq!(b["list"], "arm-1", "{b:?}");
    assert_eq!(b["cam-0"], DENIED, "{b:?}");
    assert_eq!(b["frames-cam-0"], FRAME_DENIED, "{b:?}");

    for device in ["arm-0", "arm-1", "cam-0"] {
        assert_eq!(outsider[device], DENIED, "{device}: {outsider:?}");
    }
    assert_eq!(outsider["list"], "", "{outsider:?}");

    // This process: root, in no replica.
    let channel = rlark_embodied::client::connect(lab.run.join(ROS_SOCKET)).await?;
    let mut client = RobotControllerClient::new(channel);
    let status = client
        .get_robot_status(pb::GetRobotStatusRequest {
            robot_id: "arm-1".into(),
        })
        .await?;
    assert_eq!(status.into_inner().robot_id, "arm-1");
    let listed = client.list_robots(pb::ListRobotsRequest {}).await?;
    assert_eq!(listed.into_inner().robots.len(), 2, "root sees every robot");
    lab.stop().await
}

/// Until an agent publishes holders, the runtime is open (a standalone runtime, the
/// device plugin's); a refusal names the device and its holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_is_open_until_holders_are_published_and_refusals_name_the_holder() -> Result<()>
{
    let lab = Lab::start(true).await?;
    let scratch = tempfile::tempdir()?;
    let before = Replica::start(&lab, scratch.path(), "before", Some(65534), false, false)?;
    let before = before.results().await?;
    assert_eq!(before["arm-0"], ALLOWED, "{before:?}");
    assert_eq!(before["list"], "arm-0,arm-1", "{before:?}");

    access::publish(
        &lab.run,
        &Holders {
            replicas: vec![holder(
                "lab/a-0",
                ProcessRef {
                    pid: 1,
                    start_ticks: 1,
                },
                &["robot-arm-0"],
            )],
        },
    )?;
    // A process of uid 65534 outside every replica: refused now.
    let out = tokio::process::Command::new(std::env::current_exe()?)
        .args(helper_args())
        .env(SOCKET_DIR, &lab.run)
        .uid(65534)
        .gid(65534)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("RESULT arm-0={DENIED}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("RESULT list=\n") || stdout.contains("RESULT list=\r\n"),
        "{stdout}"
    );
    // The message, as a root process in a replica that holds nothing (this process, its
    // session made a replica) reads it.
    let holders = Holders {
        replicas: vec![
            holder(
                "lab/a-0",
                ProcessRef {
                    pid: 1,
                    start_ticks: 1,
                },
                &["robot-arm-0"],
            ),
            holder("lab/me", my_session()?, &[]),
        ],
    };
    access::publish(&lab.run, &holders)?;
    let channel = rlark_embodied::client::connect(lab.run.join(ROS_SOCKET)).await?;
    let mut client = RobotControllerClient::new(channel);
    let denied = client
        .start_robot(pb::StartRobotRequest {
            robot_id: "arm-0".into(),
            mode: String::new(),
            mode_config: None,
        })
        .await
        .expect_err("this process's session is a replica holding nothing");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    assert!(
        denied
            .message()
            .contains("robot-arm-0 is held by replica lab/a-0")
            && denied.message().contains("of replica lab/me"),
        "{}",
        denied.message()
    );
    assert_eq!(
        lab.running
            .robots()
            .status("arm-0")
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .state,
        pb::RobotState::Stopped as i32,
        "not started"
    );
    lab.stop().await
}

/// This process's session leader; this process itself where the leader is not in this
/// PID namespace (a CI runner's session: the kernel reports session 0) — either way a
/// replica rooted there has this process in it.
fn my_session() -> Result<ProcessRef> {
    let me = i32::try_from(std::process::id())?;
    let session = access::live_stat(me).context("my stat")?.session;
    if session > 0
        && let Some(start_ticks) = access::start_ticks(session)
    {
        return Ok(ProcessRef {
            pid: session,
            start_ticks,
        });
    }
    Ok(ProcessRef {
        pid: me,
        start_ticks: access::start_ticks(me).context("this process's start time")?,
    })
}
