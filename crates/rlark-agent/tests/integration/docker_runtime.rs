//! [`DockerRuntime`] against a real Docker engine, without a server: sidecars stop with the
//! main container, a stop that needs SIGKILL says so, a deadline kills, an exited container
//! is adopted as an exit, and nothing is left behind. Skips without an engine (fails under
//! `CI=true`); every wait is bounded.

use crate::missing_tool;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use rlark_agent::runtime::docker::{
    ContainerSet, DockerClient, DockerRuntime, container_name, labels,
};
use rlark_agent::runtime::{
    Adopted, ExitCause, ExitStatus, RecordedReplica, ReplicaSpec, Runtime as _,
};
use rlark_api::types::DockerContainerSpec;
use rlark_testkit::docker::{
    TEST_IMAGE, containers_with, engine_missing, ensure_test_image, remove_containers_with,
};

/// Longest wait for anything here.
const WAIT: Duration = Duration::from_secs(60);

fn can_run() -> anyhow::Result<bool> {
    if let Some(why) = engine_missing() {
        missing_tool::skip_or_fail(&why);
        return Ok(false);
    }
    ensure_test_image()?;
    Ok(true)
}

/// Removes the node's containers when dropped.
struct Cleanup(&'static str);

impl Drop for Cleanup {
    fn drop(&mut self) {
        remove_containers_with(&[&format!("rlark.io/node={}", self.0)]);
    }
}

fn container(name: &str, script: &str) -> DockerContainerSpec {
    DockerContainerSpec {
        name: name.to_string(),
        image: TEST_IMAGE.to_string(),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..DockerContainerSpec::default()
    }
}

fn spec(
    node: &str,
    task: &str,
    dir: &std::path::Path,
    containers: Vec<DockerContainerSpec>,
) -> ReplicaSpec {
    let mut spec = ReplicaSpec::new(Vec::new(), dir);
    spec.env = vec![("RLARK_TASK".to_string(), task.to_string())];
    spec.containers = Some(ContainerSet {
        names: containers
            .iter()
            .map(|c| container_name("rlark-t", task, "uid-1", 0, &c.name))
            .collect(),
        containers,
        labels: labels(node, "rlark-t", task, "uid-1", 0, "key"),
        read_only_files: Vec::new(),
        read_write_dirs: Vec::new(),
    });
    spec
}

fn runtime(node: &str) -> anyhow::Result<DockerRuntime> {
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    Ok(DockerRuntime::new(DockerClient::new(&host)?, node))
}

#[tokio::test]
async fn sidecars_stop_with_the_main_container_and_nothing_is_left() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "rt-sidecar";
    let _cleanup = Cleanup(NODE);
    let dir = tempfile::tempdir()?;
    let runtime = runtime(NODE)?;
    let spec = spec(
        NODE,
        "duo",
        dir.path(),
        vec![
            container("main", "echo main $RLARK_TASK; sleep 1; exit 4"),
            container(
                "side",
                "trap 'echo side got TERM; exit 0' TERM; echo side up; while true; do sleep 0.1; done",
            ),
        ],
    );
    let mut replica = runtime.start(spec.clone()).await?;
    ensure!(
        containers_with(&[&format!("rlark.io/node={NODE}")])?.len() == 2,
        "two containers run"
    );
    let exit = tokio::time::timeout(WAIT, replica.wait())
        .await
        .context("exit")?;
    assert_eq!(exit.status, ExitStatus::Code(4));
    assert_eq!(exit.cause, ExitCause::Exited);
    assert!(!exit.killed);
    let main_log = std::fs::read_to_string(dir.path().join("logs/current.log"))?;
    assert_eq!(main_log, "main duo\n");
    let side_log = std::fs::read_to_string(dir.path().join("logs/side.log"))?;
    assert!(
        side_log.contains("side up") && side_log.contains("side got TERM"),
        "{side_log}"
    );
    assert!(containers_with(&[&format!("rlark.io/node={NODE}")])?.is_empty());
    assert!(dir.path().join("exit.json").is_file());

    // Started again in the same replica directory (a restart, a resume): each log marks
    // where the new start begins, as a process replica's does.
    let mut again = runtime.start(spec).await?;
    let exit = tokio::time::timeout(WAIT, again.wait())
        .await
        .context("second exit")?;
    assert_eq!(exit.status, ExitStatus::Code(4));
    let main_log = std::fs::read_to_string(dir.path().join("logs/current.log"))?;
    let lines: Vec<&str> = main_log.lines().collect();
    assert_eq!(lines.len(), 3, "{main_log}");
    assert_eq!((lines[0], lines[2]), ("main duo", "main duo"), "{main_log}");
    assert!(
        lines[1].starts_with("--- rlark: the replica started again at "),
        "{main_log}"
    );
    let side_log = std::fs::read_to_string(dir.path().join("logs/side.log"))?;
    assert_eq!(
        side_log
            .matches("--- rlark: the replica started again at ")
            .count(),
        1,
        "{side_log}"
    );
    assert!(containers_with(&[&format!("rlark.io/node={NODE}")])?.is_empty());
    Ok(())
}

#[tokio::test]
async fn stops_kill_after_the_grace_period_and_deadlines_end_runs() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "rt-stop";
    let _cleanup = Cleanup(NODE);
    let runtime = runtime(NODE)?;
    // SIGTERM ignored: SIGKILL after the grace period.
    let dir = tempfile::tempdir()?;
    let stubborn = spec(
        NODE,
        "stubborn",
        dir.path(),
        vec![container(
            "main",
            "trap '' TERM; while true; do sleep 0.1; done",
        )],
    );
    let mut replica = runtime.start(stubborn).await?;
    let exit = tokio::time::timeout(WAIT, replica.terminate(Duration::from_millis(500)))
        .await
        .context("terminate")?;
    assert_eq!(exit.cause, ExitCause::Terminated);
    assert!(exit.killed, "{exit:?}");
    assert_eq!(exit.status.code(), Some(137));

    // A deadline: SIGTERM (trapped: the container's main process is its pid 1, which has
    // no default action for SIGTERM), then the exit as the container made it.
    let dir = tempfile::tempdir()?;
    let mut late = spec(
        NODE,
        "late",
        dir.path(),
        vec![container(
            "main",
            "trap 'exit 3' TERM; while true; do sleep 0.1; done",
        )],
    );
    late.deadline = Some(tokio::time::Instant::now() + Duration::from_millis(300));
    late.grace = Duration::from_secs(5);
    let mut replica = runtime.start(late).await?;
    let exit = tokio::time::timeout(WAIT, replica.wait())
        .await
        .context("deadline")?;
    assert_eq!(exit.cause, ExitCause::DeadlineExceeded);
    assert_eq!(exit.status, ExitStatus::Code(3), "{exit:?}");
    assert!(!exit.killed, "{exit:?}");
    assert!(containers_with(&[&format!("rlark.io/node={NODE}")])?.is_empty());

    // A missing image: nothing created, a clear reason.
    let dir = tempfile::tempdir()?;
    let mut missing = container("main", "true");
    missing.image = "rlark-test/absent:0".into();
    let error = match runtime
        .start(spec(NODE, "absent", dir.path(), vec![missing]))
        .await
    {
        Ok(_) => anyhow::bail!("a missing image started"),
        Err(error) => error,
    };
    assert_eq!(error.reason(), "ErrImageNeverPull");
    assert!(error.to_string().contains("rlark-test/absent:0"), "{error}");
    Ok(())
}

#[tokio::test]
async fn detached_replicas_are_adopted_running_or_exited() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "rt-adopt";
    let _cleanup = Cleanup(NODE);
    let runtime = runtime(NODE)?;
    let dir = tempfile::tempdir()?;
    let spec = spec(
        NODE,
        "gate",
        dir.path(),
        vec![container(
            "main",
            "echo before; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo after; exit 9",
        )],
    );
    let replica = runtime.start(spec.clone()).await?;
    let record = replica.record();
    let id = match &record {
        rlark_agent::runtime::ReplicaRecord::Container(c) => c.ids[0].clone(),
        other => anyhow::bail!("not a container record: {other:?}"),
    };
    replica.detach();
    let recorded = RecordedReplica {
        record,
        grace: Duration::from_secs(5),
    };
    // Running: supervised again, the same container.
    let Adopted::Running(again) = runtime.adopt(&spec, &recorded).await else {
        anyhow::bail!("not adopted running");
    };
    again.detach();
    // It ends while nobody watches: the next adoption reports the exit.
    let out = std::process::Command::new("docker")
        .args(["exec", &id, "/bin/sh", "-c", "echo > /tmp/go"])
        .output()?;
    ensure!(
        out.status.success(),
        "docker exec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let inspect = DockerClient::new("unix:///var/run/docker.sock")?
            .inspect(&id)
            .await?;
        if inspect.is_some_and(|c| !c.state.running) {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < until,
            "the container did not end"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Adopted::Exited(exit) = runtime.adopt(&spec, &recorded).await else {
        anyhow::bail!("not adopted as an exit");
    };
    assert_eq!(exit.status, ExitStatus::Code(9));
    let log = std::fs::read_to_string(dir.path().join("logs/current.log"))?;
    assert_eq!(log, "before\nafter\n", "no line lost or repeated");
    assert!(containers_with(&[&format!("rlark.io/node={NODE}")])?.is_empty());
    // Gone, with its exit recorded: still that exit.
    let Adopted::Exited(exit) = runtime.adopt(&spec, &recorded).await else {
        anyhow::bail!("not the recorded exit");
    };
    assert_eq!(exit.status, ExitStatus::Code(9));
    Ok(())
}
