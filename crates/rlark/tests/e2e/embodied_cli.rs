//! `rlark embodied` and `rlark robot` as real processes: the runtime serves
//! `examples/embodied/sim.yaml` in a temporary socket directory, and the CLI lists, starts,
//! inspects and stops the simulated arm through the socket. Every wait is bounded.

use crate::embodied_common;
use anyhow::Context as _;
use embodied_common::{DEADLINE, Embodied, ok};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_robot_drives_the_sim_arm_of_rlark_embodied() -> anyhow::Result<()> {
    let mut server = Embodied::start()?;
    // `list` works once the socket is up.
    let list = server.first_list("robot").await?;
    assert_eq!(
        list,
        "ID        TYPE      BACKEND   STATE     MODE      OWNER     ROS\n\
         arm-0     sim-arm   sim       STOPPED\n"
    );

    let started = ok(
        server
            .cli("robot", &["start", "arm-0", "--mode", "teleop"])
            .await?,
        "start",
    )?;
    assert_eq!(started, "robot/arm-0 started (RUNNING, mode teleop)\n");

    // Started from the CLI, the robot is detached: it outlives the CLI process.
    let status = ok(server.cli("robot", &["status", "arm-0"]).await?, "status")?;
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
        server
            .cli("robot", &["logs", "arm-0", "--tail", "50"])
            .await?,
        "logs",
    )?;
    assert!(
        logs.contains("[rlark] start mode teleop (no owner process)"),
        "{logs}"
    );

    let stopped = ok(server.cli("robot", &["stop", "arm-0"]).await?, "stop")?;
    assert_eq!(stopped, "robot/arm-0 stopped (STOPPED)\n");

    let missing = server.cli("robot", &["status", "arm-9"]).await?;
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("robot \"arm-9\" not found"),
        "{}",
        String::from_utf8_lossy(&missing.stderr)
    );

    // SIGTERM: the runtime stops and removes its socket.
    let pid = server.process.id().context("server pid")?.to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await?;
    assert!(killed.success());
    let status = tokio::time::timeout(DEADLINE, server.process.wait()).await??;
    assert!(status.success(), "rlark embodied exited with {status}");
    assert!(!server.socket_dir.join("ros-ctrl.sock").exists());
    Ok(())
}
