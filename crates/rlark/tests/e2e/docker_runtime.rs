//! The docker runtime against a real Docker engine: an in-process server with its
//! controllers, `rlark agent --agent-type Docker` (the built binary) on the engine of this
//! machine, and Jobs whose `docker` task runs the locally built busybox image
//! ([`rlark_testkit::docker`]):
//!
//! - the environment contract inside the container, `rlark logs`, `rlark exec` (and `-t`);
//! - a failing container fails its Task with its exit code; a missing image fails it with
//!   `ErrImageNeverPull`;
//! - a stop sends SIGTERM (trapped: the container exits with its own code) and leaves no
//!   container;
//! - `kill -9` of the agent and a restart adopt the running container (same id, no second
//!   one), a container labelled for the node but named by no state file is removed, and a
//!   deleted Task leaves no container.
//!
//! Where no engine answers the tests skip, and fail under `CI=true` (scripts/test.sh
//! starts `dockerd`). Every wait is bounded by [`DEADLINE`]; nothing asserts a duration.

use crate::missing_tool;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlark_api::types::{Job, Pod, PodPhase};
use rlark_testkit::TestServer;
use rlark_testkit::docker::{
    TEST_IMAGE, containers_with, engine_missing, ensure_test_image, remove_containers_with,
};
use rlark_testkit::real_agent::{
    DEADLINE, NAMESPACE, eventually, start_server_with_controllers, text,
};
use rlark_testkit::tunnel_agent::bootstrap_token;
use serde_json::{Value, json};

const RLARK: &str = env!("CARGO_BIN_EXE_rlark");

/// Whether the docker tests can run here (after saying why not).
fn can_run() -> anyhow::Result<bool> {
    if let Some(why) = engine_missing() {
        missing_tool::skip_or_fail(&why);
        return Ok(false);
    }
    ensure_test_image()?;
    Ok(true)
}

/// `rlark agent --agent-type Docker` as a child process; SIGKILLed if dropped.
struct DockerAgent {
    child: Option<Child>,
    log: PathBuf,
}

impl DockerAgent {
    fn spawn(
        server: &TestServer,
        dir: &Path,
        node: &str,
        join: Option<&Value>,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log = dir.with_extension("agent.log");
        let mut command = Command::new(RLARK);
        command
            .args([
                "agent",
                "--server",
                &server.url(),
                "--cluster-id",
                "a",
                "--data-dir",
            ])
            .arg(dir)
            .args(["--node-name", node, "--heartbeat-interval", "500ms"])
            .args(["--agent-type", "Docker"]);
        if let Some(token) = join {
            command
                .arg("--token")
                .arg(token["token"].as_str().context("token")?)
                .arg("--ca-hash")
                .arg(token["caHash"].as_str().context("caHash")?);
        }
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = command
            .env("RUST_LOG", "info")
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start rlark agent")?;
        Ok(DockerAgent {
            child: Some(child),
            log,
        })
    }

    /// Send `signal` and wait (bounded) for the exit.
    async fn end(mut self, signal: Signal) -> anyhow::Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("no agent process")?;
        kill(Pid::from_raw(i32::try_from(child.id())?), signal)?;
        let until = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= until {
                let _ = child.kill();
                bail!(
                    "the agent did not exit after {signal}; log:\n{}",
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for DockerAgent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Removes the containers of a test's node when dropped (a failed test leaves none).
struct NodeContainers(String);

impl Drop for NodeContainers {
    fn drop(&mut self) {
        remove_containers_with(&[&format!("rlark.io/node={}", self.0)]);
    }
}

async fn create_job(admin: &kube::Client, name: &str, containers: Value) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "main",
            "agentType": "Docker",
            "role": "Env",
            "docker": {"containers": containers},
        }]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

fn busybox(script: &str) -> Value {
    json!([{
        "name": "main",
        "image": TEST_IMAGE,
        "command": ["/bin/sh", "-c", script],
        "environment": [{"name": "OWN", "value": "mine"}],
    }])
}

fn phase_of(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

async fn wait_pod(
    admin: &kube::Client,
    name: &str,
    what: &str,
    pred: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    eventually(&format!("pod {name} {what}"), || async {
        Ok(pods.get_opt(name).await?.filter(|p| pred(p)))
    })
    .await
}

/// `rlark ARGS --kubeconfig K` (the flag before `--`), bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let split = args.iter().position(|a| *a == "--").unwrap_or(args.len());
    let mut command = tokio::process::Command::new(RLARK);
    command
        .args(&args[..split])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(&args[split..])
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .with_context(|| format!("rlark {args:?} timed out"))?
        .with_context(|| format!("run rlark {args:?}"))
}

fn task_containers(node: &str, task: &str) -> anyhow::Result<Vec<String>> {
    containers_with(&[
        &format!("rlark.io/node={node}"),
        &format!("rlark.io/task={task}"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_tasks_get_the_contract_logs_exec_exit_codes_and_stop_grace() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "docker-run-0";
    let _cleanup = NodeContainers(NODE.to_string());
    remove_containers_with(&[&format!("rlark.io/node={NODE}")]);
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let scratch = tempfile::tempdir()?;
    let token = bootstrap_token(&server, "a").await?;
    let agent = DockerAgent::spawn(&server, &scratch.path().join("agent"), NODE, Some(&token))?;

    // The Node says Docker: Docker tasks are placed here.
    create_job(
        &admin,
        "env",
        busybox(
            "trap 'echo got TERM; exit 7' TERM; \
             echo task=$RLARK_TASK index=$RLARK_REPLICA_INDEX node=$RLARK_NODE_NAME own=$OWN; \
             while true; do sleep 0.1; done",
        ),
    )
    .await?;
    create_job(&admin, "fail", busybox("echo failing; exit 5")).await?;
    create_job(
        &admin,
        "noimage",
        json!([{"name": "main", "image": "rlark-test/not-here:1"}]),
    )
    .await?;

    let running = |p: &Pod| phase_of(p) == Some(PodPhase::Running);
    wait_pod(&admin, "env-main-0", "Running", running).await?;
    ensure!(
        task_containers(NODE, "env-main")?.len() == 1,
        "one container runs the replica"
    );

    // rlark logs: the container's output.
    let logs = eventually("the contract in the container's log", || async {
        let out = rlark(&kubeconfig, &["logs", "task/env-main"]).await?;
        let log = text(&out.stdout);
        Ok(log.contains("task=").then_some(log))
    })
    .await?;
    assert!(
        logs.contains(&format!("task=env-main index=0 node={NODE} own=mine")),
        "{logs}"
    );

    // rlark exec: in the container, with its environment; exit codes come back.
    let out = rlark(
        &kubeconfig,
        &[
            "exec",
            "task/env-main",
            "--",
            "sh",
            "-c",
            "echo $RLARK_TASK $OWN; echo oops >&2; exit 3",
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "env-main mine\n");
    assert!(text(&out.stderr).contains("oops"), "{}", text(&out.stderr));
    // -t without a local terminal: kubectl's warning, and no terminal in the container.
    let tty_args = [
        "exec",
        "-t",
        "task/env-main",
        "--",
        "sh",
        "-c",
        "tty; echo term=$TERM",
    ];
    let out = rlark(&kubeconfig, &tty_args).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "not a tty\nterm=\n");
    assert!(
        text(&out.stderr).contains("Unable to use a TTY"),
        "{}",
        text(&out.stderr)
    );
    // -t on a terminal (util-linux `script` gives rlark a pseudo-terminal): the container
    // gets one too.
    let mut line = format!("{RLARK} --kubeconfig {}", kubeconfig.display());
    for arg in tty_args {
        line.push_str(&format!(" '{arg}'"));
    }
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("rlark exec -t under script timed out")?
    .context("run script (util-linux)")?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("/dev/pts/") && shown.contains("term=xterm"),
        "{shown:?}"
    );

    // A failing container fails its task with its exit code.
    let pod = wait_pod(&admin, "fail-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.exit_code, Some(5), "{status:?}");
    let out = rlark(&kubeconfig, &["logs", "task/fail-main"]).await?;
    assert_eq!(text(&out.stdout), "failing\n");
    eventually("the failed replica's container is removed", || async {
        Ok(task_containers(NODE, "fail-main")?.is_empty().then_some(()))
    })
    .await?;

    // A missing image: the engine's answer, no pull.
    let pod = wait_pod(&admin, "noimage-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(
        status.reason.as_deref(),
        Some("ErrImageNeverPull"),
        "{status:?}"
    );
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("rlark-test/not-here:1")),
        "{status:?}"
    );

    // Stop: SIGTERM, trapped; the container's own exit code; no container left.
    Api::<Job>::all(admin.clone())
        .patch(
            "env",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    let pod = wait_pod(&admin, "env-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some("Stopped"), "{status:?}");
    assert_eq!(status.exit_code, Some(7), "{status:?}");
    let out = rlark(&kubeconfig, &["logs", "task/env-main"]).await?;
    assert!(
        text(&out.stdout).contains("got TERM"),
        "{}",
        text(&out.stdout)
    );
    eventually("the stopped replica's container is removed", || async {
        Ok(task_containers(NODE, "env-main")?.is_empty().then_some(()))
    })
    .await?;

    let status = agent.end(Signal::SIGTERM).await?;
    ensure!(status.success(), "agent exit {status:?}");
    server.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_docker_agent_adopts_its_container_and_leaves_no_orphan() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "docker-adopt-0";
    let _cleanup = NodeContainers(NODE.to_string());
    remove_containers_with(&[&format!("rlark.io/node={NODE}")]);
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let scratch = tempfile::tempdir()?;
    let data_dir = scratch.path().join("agent");
    // A cluster of its own: it joins before it finds no engine, and a cluster that joined
    // once is not joined again by a plain token (docs/security.md, "Names and identities").
    let token = bootstrap_token(&server, "none").await?;

    // An engine that does not answer stops the agent with a message naming it.
    let mut unreachable = Command::new(RLARK);
    unreachable
        .args([
            "agent",
            "--server",
            &server.url(),
            "--cluster-id",
            "none",
            "--data-dir",
        ])
        .arg(scratch.path().join("no-engine"))
        .args(["--node-name", "docker-none-0", "--agent-type", "Docker"])
        .args(["--docker-host", "unix:///nonexistent/docker.sock"])
        .arg("--token")
        .arg(token["token"].as_str().context("token")?)
        .arg("--ca-hash")
        .arg(token["caHash"].as_str().context("caHash")?)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::task::spawn_blocking(move || unreachable.output()),
    )
    .await
    .context("the agent without an engine did not exit")???;
    ensure!(!out.status.success(), "an agent without its engine runs");
    let said = text(&out.stderr);
    assert!(
        said.contains("cannot reach the Docker engine at /nonexistent/docker.sock"),
        "{said}"
    );

    let token = bootstrap_token(&server, "a").await?;
    let first = DockerAgent::spawn(&server, &data_dir, NODE, Some(&token))?;
    create_job(
        &admin,
        "long",
        busybox("i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.1; done"),
    )
    .await?;
    let running = |p: &Pod| phase_of(p) == Some(PodPhase::Running);
    let pod = wait_pod(&admin, "long-main-0", "Running", running).await?;
    let start_time = pod.status.and_then(|s| s.start_time).context("startTime")?;
    let before = task_containers(NODE, "long-main")?;
    ensure!(before.len() == 1, "one container: {before:?}");

    let status = first.end(Signal::SIGKILL).await?;
    ensure!(status.code().is_none(), "killed by a signal: {status:?}");
    // A container labelled for this node that no replica recorded (an agent that died
    // between creating and recording it).
    let stray = Command::new("docker")
        .args(["create", "--label", "rlark.io/managed-by=rlark", "--label"])
        .arg(format!("rlark.io/node={NODE}"))
        .args([TEST_IMAGE, "/bin/true"])
        .output()?;
    ensure!(
        stray.status.success(),
        "docker create: {}",
        text(&stray.stderr)
    );
    let stray = text(&stray.stdout).trim().to_string();

    let second = DockerAgent::spawn(&server, &data_dir, NODE, None)?;
    eventually("the second agent adopts the container", || async {
        Ok(second
            .log_text()
            .contains("adopted a running replica")
            .then_some(()))
    })
    .await?;
    assert_eq!(
        task_containers(NODE, "long-main")?,
        before,
        "the same container, no second one"
    );
    eventually("the stray container is removed", || async {
        Ok(containers_with(&[&format!("rlark.io/node={NODE}")])?
            .iter()
            .all(|id| *id != stray)
            .then_some(()))
    })
    .await?;
    let pod = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .get("long-main-0")
        .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.phase, Some(PodPhase::Running), "{status:?}");
    assert_eq!(status.start_time, Some(start_time));
    assert_eq!(status.restart_count, Some(0));
    // Its output still reaches the log after the restart.
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let ticks = |out: &Output| {
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("tick ")?.parse::<u64>().ok())
            .max()
    };
    let seen = ticks(&rlark(&kubeconfig, &["logs", "task/long-main"]).await?);
    eventually("the log grows after the adoption", || async {
        let now = ticks(&rlark(&kubeconfig, &["logs", "task/long-main"]).await?);
        Ok((now > seen).then_some(()))
    })
    .await?;

    // A deleted task leaves no container.
    Api::<Job>::all(admin.clone())
        .delete("long", &DeleteParams::default())
        .await?;
    eventually("the deleted task's container is removed", || async {
        Ok(task_containers(NODE, "long-main")?.is_empty().then_some(()))
    })
    .await?;
    let status = second.end(Signal::SIGTERM).await?;
    ensure!(status.success(), "agent exit {status:?}");
    server.stop().await
}

/// A Job whose one task has the `docker` block `docker` (containers and run limits).
async fn create_docker_job(admin: &kube::Client, name: &str, docker: Value) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "main",
            "agentType": "Docker",
            "role": "Env",
            "docker": docker,
        }]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// The `docker` block's `restartPolicy`, `activeDeadlineSeconds` and
/// `terminationGracePeriodSeconds` act as the `raw` block's: a container that fails once
/// under `OnFailure` is started again (a new container, the same bind mount) and succeeds
/// with one restart; a container past its deadline is stopped and fails
/// `DeadlineExceeded`; a stop with a grace period of 0 SIGKILLs a container whose TERM trap
/// would have exited 7 (137), where the default grace lets the trap finish.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_block_restart_policy_deadline_and_grace_period() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "docker-limits-0";
    let _cleanup = NodeContainers(NODE.to_string());
    remove_containers_with(&[&format!("rlark.io/node={NODE}")]);
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let scratch = tempfile::tempdir()?;
    let token = bootstrap_token(&server, "a").await?;
    let agent = DockerAgent::spawn(&server, &scratch.path().join("agent"), NODE, Some(&token))?;
    let state = scratch.path().join("state");
    std::fs::create_dir_all(&state)?;

    let main = |script: &str| {
        json!({
            "name": "main",
            "image": TEST_IMAGE,
            "command": ["/bin/sh", "-c", script],
            "volumes": [{"source": state.to_string_lossy(), "target": "/state"}],
        })
    };
    create_docker_job(
        &admin,
        "retry",
        json!({
            "restartPolicy": "OnFailure",
            "containers": [main(
                "if [ -e /state/ran ]; then echo second; exit 0; fi; \
                 touch /state/ran; echo first; exit 4"
            )],
        }),
    )
    .await?;
    create_docker_job(
        &admin,
        "late",
        json!({
            "activeDeadlineSeconds": 1,
            "containers": [main("while true; do sleep 0.1; done")],
        }),
    )
    .await?;
    let trap = "trap 'sleep 3; exit 7' TERM; echo up; while true; do sleep 0.1; done";
    create_docker_job(
        &admin,
        "nograce",
        json!({"terminationGracePeriodSeconds": 0, "containers": [main(trap)]}),
    )
    .await?;
    create_docker_job(&admin, "grace", json!({"containers": [main(trap)]})).await?;

    // OnFailure: the failed first run is restarted, the second succeeds.
    let pod = wait_pod(&admin, "retry-main-0", "Succeeded", |p| {
        phase_of(p) == Some(PodPhase::Succeeded)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.restart_count, Some(1), "{status:?}");
    assert_eq!(status.exit_code, Some(0), "{status:?}");

    // activeDeadlineSeconds: stopped and failed with the reason.
    let pod = wait_pod(&admin, "late-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(
        status.reason.as_deref(),
        Some("DeadlineExceeded"),
        "{status:?}"
    );
    eventually("the late replica's container is removed", || async {
        Ok(task_containers(NODE, "late-main")?.is_empty().then_some(()))
    })
    .await?;

    // terminationGracePeriodSeconds: 0 kills at once; the default lets the trap exit 7.
    let running = |p: &Pod| phase_of(p) == Some(PodPhase::Running);
    wait_pod(&admin, "nograce-main-0", "Running", running).await?;
    wait_pod(&admin, "grace-main-0", "Running", running).await?;
    for job in ["nograce", "grace"] {
        eventually(&format!("{job} trapped TERM"), || async {
            let out = rlark(
                server.kubeconfig_path(),
                &["logs", &format!("task/{job}-main")],
            )
            .await?;
            Ok(text(&out.stdout).contains("up").then_some(()))
        })
        .await?;
        Api::<Job>::all(admin.clone())
            .patch(
                job,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"stopped": true}})),
            )
            .await?;
    }
    for (job, code) in [("nograce", 137), ("grace", 7)] {
        let pod = wait_pod(&admin, &format!("{job}-main-0"), "Failed", |p| {
            phase_of(p) == Some(PodPhase::Failed)
        })
        .await?;
        let status = pod.status.context("status")?;
        assert_eq!(
            status.reason.as_deref(),
            Some("Stopped"),
            "{job}: {status:?}"
        );
        assert_eq!(status.exit_code, Some(code), "{job}: {status:?}");
    }

    let status = agent.end(Signal::SIGTERM).await?;
    ensure!(status.success(), "agent exit {status:?}");
    server.stop().await
}

/// A sidecar's output and a command in it: `rlark logs -c NAME` reads the sidecar's log,
/// no `-c` (or the main container's name) the main one's; `rlark exec -c NAME` runs in the
/// sidecar; a name the replica does not have is an error listing the names it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sidecar_logs_and_exec_by_container_name() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    const NODE: &str = "docker-sidecar-0";
    let _cleanup = NodeContainers(NODE.to_string());
    remove_containers_with(&[&format!("rlark.io/node={NODE}")]);
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let scratch = tempfile::tempdir()?;
    let token = bootstrap_token(&server, "a").await?;
    let agent = DockerAgent::spawn(&server, &scratch.path().join("agent"), NODE, Some(&token))?;
    let container = |name: &str, script: &str| {
        json!({
            "name": name,
            "image": TEST_IMAGE,
            "command": ["/bin/sh", "-c", script],
            "environment": [{"name": "WHO", "value": name}],
        })
    };
    create_docker_job(
        &admin,
        "pair",
        json!({"containers": [
            container("main", "echo main says hi; while true; do sleep 0.1; done"),
            container("board", "echo board says hi; while true; do sleep 0.1; done"),
        ]}),
    )
    .await?;
    let running = |p: &Pod| phase_of(p) == Some(PodPhase::Running);
    wait_pod(&admin, "pair-main-0", "Running", running).await?;

    for (args, expected) in [
        (vec!["logs", "pod/pair-main-0"], "main says hi\n"),
        (
            vec!["logs", "pod/pair-main-0", "-c", "main"],
            "main says hi\n",
        ),
        (
            vec!["logs", "pod/pair-main-0", "-c", "board"],
            "board says hi\n",
        ),
    ] {
        let shown = eventually(&format!("rlark {args:?}"), || async {
            let out = rlark(&kubeconfig, &args).await?;
            let log = text(&out.stdout);
            Ok((!log.is_empty()).then_some(log))
        })
        .await?;
        assert_eq!(shown, expected, "{args:?}");
    }
    let out = rlark(&kubeconfig, &["logs", "pod/pair-main-0", "-c", "db"]).await?;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr)
            .contains("container \"db\" is not in this replica: its containers are main, board"),
        "{}",
        text(&out.stderr)
    );

    let out = rlark(
        &kubeconfig,
        &[
            "exec",
            "task/pair-main",
            "-c",
            "board",
            "--",
            "sh",
            "-c",
            "echo $WHO",
        ],
    )
    .await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "board\n");
    let out = rlark(
        &kubeconfig,
        &["exec", "task/pair-main", "--", "sh", "-c", "echo $WHO"],
    )
    .await?;
    assert_eq!(text(&out.stdout), "main\n", "{}", text(&out.stderr));
    let out = rlark(
        &kubeconfig,
        &["exec", "task/pair-main", "-c", "db", "--", "true"],
    )
    .await?;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("its containers are main, board"),
        "{}",
        text(&out.stderr)
    );

    let status = agent.end(Signal::SIGTERM).await?;
    ensure!(status.success(), "agent exit {status:?}");
    server.stop().await
}

/// `tensorBoardDir` on a Docker task: the agent runs the node's `tensorboard` on the host
/// directory that the main container's bind mount puts at that path (host network: the
/// proxy reaches it on the node's loopback), and the Pod reports its port; TensorBoard's
/// data API through the task proxy names the host directory. A directory under no
/// host-path volume runs the task anyway and says why no TensorBoard runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_tasks_get_a_tensorboard_on_their_volume() -> anyhow::Result<()> {
    if !can_run()? {
        return Ok(());
    }
    let installed = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("tensorboard").is_file())
    });
    if !installed {
        missing_tool::skip_or_fail("tensorboard is not installed (pip install tensorboard)");
        return Ok(());
    }
    const NODE: &str = "docker-board-0";
    let _cleanup = NodeContainers(NODE.to_string());
    remove_containers_with(&[&format!("rlark.io/node={NODE}")]);
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let scratch = tempfile::tempdir()?;
    let runs = scratch.path().join("runs");
    std::fs::create_dir_all(runs.join("ppo"))?;
    let token = bootstrap_token(&server, "a").await?;
    let agent = DockerAgent::spawn(&server, &scratch.path().join("agent"), NODE, Some(&token))?;
    let job = |name: &str, dir: &str| -> anyhow::Result<Job> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": {"tasks": [{
                "name": "main",
                "agentType": "Docker",
                "role": "Actor",
                "tensorBoardDir": dir,
                "docker": {"containers": [{
                    "name": "trainer",
                    "image": TEST_IMAGE,
                    "command": ["/bin/sh", "-c", "while true; do sleep 0.1; done"],
                    "volumes": [{"source": runs.display().to_string(), "target": "/logs"}],
                }]},
            }]},
        }))?)
    };
    let jobs = Api::<Job>::all(admin.clone());
    jobs.create(&PostParams::default(), &job("board", "/logs/ppo")?)
        .await?;
    jobs.create(&PostParams::default(), &job("blind", "/tmp/runs")?)
        .await?;
    let reported = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.tensor_board.as_ref())
            .is_some()
    };
    let pod = wait_pod(&admin, "board-main-0", "with its TensorBoard", reported).await?;
    let board = pod
        .status
        .and_then(|s| s.tensor_board)
        .context("tensorBoard")?;
    let port = board.port.with_context(|| format!("no port: {board:?}"))?;
    let host_dir = runs.join("ppo").display().to_string();
    assert_eq!(board.log_dir.as_deref(), Some(host_dir.as_str()));
    let path =
        format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/board-main/proxy/{port}/data/environment");
    let environment = eventually("TensorBoard's data API through the task proxy", || async {
        let request = http::Request::get(path.as_str()).body(Vec::new())?;
        // A 502 while TensorBoard starts listening: ask again.
        Ok(admin.request_text(request).await.ok())
    })
    .await?;
    let environment: Value = serde_json::from_str(&environment)?;
    assert_eq!(environment["data_location"], host_dir.as_str());

    let pod = wait_pod(&admin, "blind-main-0", "with why no TensorBoard", reported).await?;
    assert_eq!(phase_of(&pod), Some(PodPhase::Running));
    let message = pod
        .status
        .and_then(|s| s.tensor_board)
        .and_then(|b| b.message)
        .unwrap_or_default();
    assert!(
        message.contains("not under a host-path volume of container \"trainer\""),
        "{message}"
    );

    let status = agent.end(Signal::SIGTERM).await?;
    ensure!(status.success(), "agent exit {status:?}");
    server.stop().await
}
