//! Crash safety with real processes: `rlark agent` (the built binary) runs three replicas
//! under its supervisor processes (`rlark-supervise`, built beside it), gets `kill -9`, two replicas end while no agent
//! runs, and a new `rlark agent` on the same data directory adopts the running one (same
//! process, Pod `Running` with its start time, its log growing, a later stop reported
//! `Stopped`) and reports the others with their real exit codes. No Pod stays `Running`.
//!
//! Every wait is bounded by [`DEADLINE`]; no test asserts how long anything took.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rlark_api::types::{Job, Pod, PodPhase, Task};
use rlark_testkit::TestServer;
use rlark_testkit::real_agent::{DEADLINE, NAMESPACE, eventually, start_server_with_controllers};
use rlark_testkit::tunnel_agent::bootstrap_token;
use serde_json::{Value, json};

/// `rlark agent` as a child process; SIGKILLed if dropped.
struct AgentProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl AgentProcess {
    fn spawn(
        server: &TestServer,
        dir: &Path,
        join: Option<&Value>,
        stop_tasks: bool,
    ) -> anyhow::Result<Self> {
        let log = dir.with_extension(format!("agent-{}.log", std::process::id()));
        let mut command = Command::new(env!("CARGO_BIN_EXE_rlark"));
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
            .args(["--node-name", "host-0", "--heartbeat-interval", "500ms"]);
        if let Some(token) = join {
            command
                .arg("--token")
                .arg(token["token"].as_str().context("token")?)
                .arg("--ca-hash")
                .arg(token["caHash"].as_str().context("caHash")?);
        }
        if stop_tasks {
            command.arg("--stop-tasks-on-exit");
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
        Ok(AgentProcess {
            child: Some(child),
            log,
        })
    }

    fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .unwrap_or(0)
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

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn sh(script: &str) -> Value {
    json!(["sh", "-c", script])
}

fn phase_of(pod: &Pod) -> Option<PodPhase> {
    pod.status.as_ref().and_then(|s| s.phase)
}

async fn create_job(admin: &kube::Client, name: &str, raw: Value) -> anyhow::Result<()> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{"name": "main", "agentType": "Raw", "role": "Actor", "raw": raw}]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
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

/// `DATA_DIR/tasks/<ns>/<task>/<uid>/0`.
async fn replica_dir(admin: &kube::Client, data_dir: &Path, task: &str) -> anyhow::Result<PathBuf> {
    let task = Api::<Task>::namespaced(admin.clone(), NAMESPACE)
        .get(task)
        .await?;
    Ok(rlark_agent::tasks::replica_dir(
        &data_dir.join("tasks"),
        NAMESPACE,
        &task.name_any(),
        &task.uid().unwrap_or_default(),
        0,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_adopts_running_replicas_and_reports_finished_ones() -> anyhow::Result<()> {
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let scratch = rlark_testkit::shared_tempdir()?;
    let data_dir = scratch.path().join("agent");
    let gate = scratch.path().join("gate");
    let pidfile = scratch.path().join("long.pid");

    let token = bootstrap_token(&server, "a").await?;
    let first = AgentProcess::spawn(&server, &data_dir, Some(&token), false)?;
    create_job(
        &admin,
        "long",
        json!({
            "entrypoint": sh("echo $$ > \"$PIDFILE\"; i=0; while true; do echo tick $i; \
                              i=$((i+1)); sleep 0.1; done"),
            "environment": [{"name": "PIDFILE", "value": pidfile.display().to_string()}],
            "terminationGracePeriodSeconds": 5,
        }),
    )
    .await?;
    for (name, code) in [("zero", 0), ("three", 3)] {
        create_job(
            &admin,
            name,
            json!({
                "entrypoint": sh(&format!(
                    "while [ ! -e \"$GATE\" ]; do sleep 0.05; done; exit {code}"
                )),
                "environment": [{"name": "GATE", "value": gate.display().to_string()}],
            }),
        )
        .await?;
    }
    let running = |p: &Pod| phase_of(p) == Some(PodPhase::Running);
    let long = wait_pod(&admin, "long-main-0", "Running", running).await?;
    let start_time = long
        .status
        .and_then(|s| s.start_time)
        .context("startTime")?;
    for name in ["zero-main-0", "three-main-0"] {
        wait_pod(&admin, name, "Running", running).await?;
    }
    let long_pid: i32 = eventually("long's pid", || async {
        Ok(std::fs::read_to_string(&pidfile)
            .ok()
            .filter(|t| t.ends_with('\n'))
            .and_then(|t| t.trim().parse().ok()))
    })
    .await?;
    let long_dir = replica_dir(&admin, &data_dir, "long-main").await?;
    let long_pid_json: Value = serde_json::from_slice(&std::fs::read(long_dir.join("pid.json"))?)?;
    ensure!(long_pid_json["pid"] == json!(long_pid), "{long_pid_json}");
    let agent_pid = first.pid();
    ensure!(
        long_pid_json["supervisorPid"] != json!(agent_pid),
        "the replica runs under a supervisor, not the agent"
    );

    // kill -9: nothing of the agent's shutdown path runs.
    let status = first.end(Signal::SIGKILL).await?;
    ensure!(status.code().is_none(), "killed by a signal: {status:?}");
    ensure!(
        kill(Pid::from_raw(long_pid), None).is_ok(),
        "the replica outlives its agent"
    );
    std::fs::write(&gate, "")?;
    for task in ["zero-main", "three-main"] {
        let exit_file = replica_dir(&admin, &data_dir, task)
            .await?
            .join("exit.json");
        eventually(&format!("{task} recorded its exit"), || async {
            Ok(exit_file.exists().then_some(()))
        })
        .await?;
    }
    let log_file = long_dir.join("logs/current.log");
    let log_before = std::fs::metadata(&log_file)?.len();

    let second = AgentProcess::spawn(&server, &data_dir, None, true)?;
    let pod = wait_pod(&admin, "zero-main-0", "Succeeded", |p| {
        phase_of(p) == Some(PodPhase::Succeeded)
    })
    .await?;
    assert_eq!(pod.status.as_ref().and_then(|s| s.exit_code), Some(0));
    let pod = wait_pod(&admin, "three-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.exit_code, Some(3), "{status:?}");
    assert_eq!(status.reason.as_deref(), Some("Error"));

    eventually("long's log grows after the restart", || async {
        Ok((std::fs::metadata(&log_file)?.len() > log_before + 20).then_some(()))
    })
    .await?;
    let long = Api::<Pod>::namespaced(admin.clone(), NAMESPACE)
        .get("long-main-0")
        .await?;
    let status = long.status.context("status")?;
    assert_eq!(status.phase, Some(PodPhase::Running), "{status:?}");
    assert_eq!(status.start_time, Some(start_time));
    assert_eq!(status.restart_count, Some(0));
    assert!(
        kill(Pid::from_raw(long_pid), None).is_ok(),
        "the same process runs"
    );
    assert_eq!(
        std::fs::read_to_string(&pidfile)?.trim(),
        long_pid.to_string(),
        "started once"
    );

    // The adopted replica stops through its supervisor.
    Api::<Job>::all(admin.clone())
        .patch(
            "long",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"stopped": true}})),
        )
        .await?;
    let pod = wait_pod(&admin, "long-main-0", "Failed", |p| {
        phase_of(p) == Some(PodPhase::Failed)
    })
    .await?;
    let status = pod.status.context("status")?;
    assert_eq!(status.reason.as_deref(), Some("Stopped"), "{status:?}");
    assert_eq!(status.exit_code, Some(143), "{status:?}");
    eventually("long's process gone", || async {
        Ok(kill(Pid::from_raw(long_pid), None).is_err().then_some(()))
    })
    .await?;

    let log = second.log_text();
    assert!(log.contains("adopted a running replica"), "{log}");
    let status = second.end(Signal::SIGTERM).await?;
    assert!(status.success(), "{status:?}\n{log}");
    server.stop().await
}
