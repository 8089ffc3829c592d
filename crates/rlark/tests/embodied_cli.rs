//! `rlark embodied` and `rlark robot` as real processes: the runtime serves
//! `examples/embodied/sim.yaml` in a temporary socket directory, and the CLI lists, starts,
//! inspects and stops the simulated arm through the socket. Every wait is bounded.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};

const RLARK: &str = env!("CARGO_BIN_EXE_rlark");
const DEADLINE: Duration = Duration::from_secs(30);

async fn robot(socket_dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let run = tokio::process::Command::new(RLARK)
        .arg("robot")
        .arg("--socket-dir")
        .arg(socket_dir)
        .args(args)
        .stdin(Stdio::null())
        .output();
    tokio::time::timeout(DEADLINE, run)
        .await
        .with_context(|| format!("rlark robot {args:?} timed out"))?
        .context("run rlark robot")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn ok(output: Output, what: &str) -> anyhow::Result<String> {
    if !output.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            output.status,
            stdout(&output),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(stdout(&output))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_robot_drives_the_sim_arm_of_rlark_embodied() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let socket_dir = dir.path().join("run");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/embodied/sim.yaml");
    let mut server = tokio::process::Command::new(RLARK)
        .arg("embodied")
        .arg("--config")
        .arg(&config)
        .arg("--socket-dir")
        .arg(&socket_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;

    // `list` works once the socket is up.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let list = loop {
        let output = robot(&socket_dir, &["list"]).await?;
        if output.status.success() {
            break stdout(&output);
        }
        if let Some(status) = server.try_wait()? {
            bail!("rlark embodied exited: {status}");
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "rlark robot list never succeeded: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        list,
        "ID        TYPE      BACKEND   STATE     MODE      OWNER     ROS\n\
         arm-0     sim-arm   sim       STOPPED\n"
    );

    let started = ok(
        robot(&socket_dir, &["start", "arm-0", "--mode", "teleop"]).await?,
        "start",
    )?;
    assert_eq!(started, "robot/arm-0 started (RUNNING, mode teleop)\n");

    // Started from the CLI, the robot is detached: it outlives the CLI process.
    let status = ok(robot(&socket_dir, &["status", "arm-0"]).await?, "status")?;
    let lines: Vec<&str> = status.lines().collect();
    assert_eq!(lines.len(), 2, "{status}");
    assert!(
        lines[0].starts_with("ID ")
            && lines[0].contains(" JOINTS ")
            && lines[0].ends_with("MESSAGE"),
        "{status}"
    );
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        &cells[..5],
        ["arm-0", "sim-arm", "sim", "RUNNING", "teleop"],
        "{status}"
    );
    assert_eq!(
        cells[5].split(',').count(),
        6,
        "six joint positions: {status}"
    );

    let logs = ok(
        robot(&socket_dir, &["logs", "arm-0", "--tail", "50"]).await?,
        "logs",
    )?;
    assert!(
        logs.contains("[rlark] start mode teleop (no owner process)"),
        "{logs}"
    );

    let stopped = ok(robot(&socket_dir, &["stop", "arm-0"]).await?, "stop")?;
    assert_eq!(stopped, "robot/arm-0 stopped (STOPPED)\n");

    let missing = robot(&socket_dir, &["status", "arm-9"]).await?;
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("robot \"arm-9\" not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );

    // SIGTERM: the runtime stops and removes its socket.
    let pid = server.id().context("server pid")?.to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await?;
    assert!(killed.success());
    let status = tokio::time::timeout(DEADLINE, server.wait()).await??;
    assert!(status.success(), "rlark embodied exited with {status}");
    assert!(!socket_dir.join("ros-ctrl.sock").exists());
    Ok(())
}
