//! Clean children (issue 38, point 5): a runtime started with SIGINT ignored and a signal
//! blocked (what a shell's `&` and a signal-handling parent leave) starts a robot's launch
//! process with default dispositions and an empty mask, so the graceful SIGINT stop works.
//! Before the fix the launch process inherited SIGINT ignored, and the stop became a
//! SIGKILL after the grace period (`killed by SIGKILL`).

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{SigSet, Signal};
use rlark_embodied::{EmbodiedConfig, ROS2_SOCKET};
use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use tokio_util::sync::CancellationToken;

const HELPER: &str = "RLARK_TEST_CLEAN_CHILDREN";

#[test]
fn a_launch_starts_with_default_signals_when_the_runtime_inherited_them_ignored() -> Result<()> {
    // `sh` ignores SIGINT and SIGQUIT, then becomes the runtime (this binary's helper).
    let output = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' INT QUIT; exec \"$0\" --exact clean_children::runtime_with_inherited_signals --ignored --nocapture --test-threads=1")
        .arg(std::env::current_exe()?)
        .env(HELPER, "1")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "helper failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let value = |key: &str| -> Result<String> {
        stdout
            .lines()
            .find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v.to_string()))
            .with_context(|| format!("no {key} in {stdout}"))
    };
    let int = 1u64 << (libc_signal(Signal::SIGINT) - 1);
    let runtime_ign: u64 = value("runtime_ign")?.parse()?;
    assert_eq!(runtime_ign & int, int, "the runtime itself ignores SIGINT");
    assert_eq!(value("launch_ign")?, "0", "{stdout}");
    assert_eq!(value("launch_blk")?, "0", "{stdout}");
    let stopped = value("stopped")?;
    assert!(
        stopped.contains("[ros2] killed by SIGINT"),
        "a graceful stop, not SIGKILL: {stopped}"
    );
    Ok(())
}

fn libc_signal(signal: Signal) -> u32 {
    u32::try_from(signal as i32).unwrap_or(0)
}

/// Run by the test above with SIGINT ignored: block SIGUSR1, serve a ROS 2 robot whose
/// `ros2` is a fake recording its PID, start it, report the launch process's signal
/// masks, stop it and report how it ended.
#[test]
#[ignore = "helper run as a child process by the clean-children test"]
fn runtime_with_inherited_signals() -> Result<()> {
    if std::env::var_os(HELPER).is_none() {
        return Ok(());
    }
    let mut blocked = SigSet::empty();
    blocked.add(Signal::SIGUSR1);
    blocked.thread_block()?;
    let (runtime_ign, _) = rlark_process::signal_masks(std::process::id())?;
    println!("runtime_ign={runtime_ign}");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bin = dir.path().join("bin");
    let log = dir.path().join("log");
    std::fs::create_dir_all(&bin)?;
    std::fs::create_dir_all(&log)?;
    let ros2 = bin.join("ros2");
    std::fs::write(
        &ros2,
        "#!/bin/sh\necho $$ > \"$FAKE_ROS_LOG/ros2.pid\"\necho up\nexec sleep 1000\n",
    )?;
    std::fs::set_permissions(&ros2, std::fs::Permissions::from_mode(0o755))?;
    let prefix = dir.path().join("install");
    let share = prefix.join("share/ur_bringup");
    std::fs::create_dir_all(share.join("launch"))?;
    std::fs::write(
        share.join("package.xml"),
        "<package><name>ur_bringup</name><version>2.0.0</version></package>",
    )?;
    std::fs::write(share.join("launch/ur.launch.py"), "")?;
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
    modes: {{run: {{package: ur_bringup, launchFile: ur.launch.py}}}}
robots:
  - {{id: ur5, type: ur, domainId: 7}}
env: {{PATH: "{path}", FAKE_ROS_LOG: "{log}"}}
ros2: {{prefixPath: ["{prefix}"]}}
allowedLaunchPackages: []
stopTimeout: 3s
watchdog: 60s
"#,
        log = log.display(),
        prefix = prefix.display(),
    );
    let shutdown = CancellationToken::new();
    let run_dir = dir.path().join("run");
    let running = rlark_embodied::serve(
        EmbodiedConfig::from_yaml(&yaml)?,
        &run_dir,
        shutdown.clone(),
    )
    .await?;
    let channel = rlark_embodied::client::connect(run_dir.join(ROS2_SOCKET)).await?;
    let mut client = RobotControllerClient::new(channel);
    client
        .start_robot(pb::StartRobotRequest {
            robot_id: "ur5".into(),
            mode: "run".into(),
            mode_config: None,
        })
        .await?;
    let pid_file: PathBuf = log.join("ros2.pid");
    let mut pid = None;
    for _ in 0..400 {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
        {
            pid = Some(p);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = pid.context("the fake ros2 never recorded its pid")?;
    // Its `exec sleep` may still be on its way: sh and sleep share the masks anyway.
    let (ign, blk) = rlark_process::signal_masks(pid)?;
    println!("launch_ign={ign}\nlaunch_blk={blk}");
    client
        .stop_robot(pb::StopRobotRequest {
            robot_id: "ur5".into(),
        })
        .await?;
    let logs = running
        .robots()
        .logs("ur5", 0)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let ended: Vec<&String> = logs.iter().filter(|l| l.contains("killed by")).collect();
    println!("stopped={ended:?}");
    shutdown.cancel();
    running.wait().await?;
    Ok(())
}
