//! `rlark logs` as a real process: an in-process server with its controllers, two real agents
//! (clusters `a` and `b`, `rlark_agent::start`), a Job with one task on each, and the CLI
//! reading their logs through the server and the agents' tunnels.
//!
//! Every wait is bounded by [`DEADLINE`].

use std::future::Future;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::api::{Api, PostParams};
use rlark_agent::{AgentConfig, JoinParams, RunningAgent};
use rlark_api::types::{Job, Pod, PodPhase};
use rlark_testkit::TestServer;
use rlark_testkit::tunnel_agent::bootstrap_token;
use serde_json::json;
use tempfile::TempDir;

/// Upper bound of every wait.
const DEADLINE: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// Poll `check` until it returns `Ok(Some(value))`, at most [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut last = String::new();
    loop {
        match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {DEADLINE:?} waiting for {what}; last error: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Start the agent of `cluster` (node `host-<cluster>`) in `dir`, joined with a fresh token.
async fn start_agent(
    server: &TestServer,
    cluster: &str,
    dir: &Path,
) -> anyhow::Result<RunningAgent> {
    let token = bootstrap_token(server, cluster).await?;
    let mut config = AgentConfig::new(vec![server.url()], cluster, dir);
    config.node_name = Some(format!("host-{cluster}"));
    config.heartbeat_interval = Duration::from_millis(500);
    config.stop_tasks_on_exit = true;
    config.join = Some(JoinParams {
        token: token["token"].as_str().unwrap_or_default().to_string(),
        ca_hash: token["caHash"].as_str().unwrap_or_default().to_string(),
    });
    let agent = tokio::time::timeout(DEADLINE, rlark_agent::start(config))
        .await
        .context("agent start timed out")??;
    eventually("the agent's tunnel is up", || async {
        Ok((!agent.tunnel_connected().is_empty()).then_some(()))
    })
    .await?;
    Ok(agent)
}

/// `rlark ARGS --kubeconfig KUBECONFIG`, bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .kill_on_drop(true);
    tokio::time::timeout(DEADLINE, command.output())
        .await
        .with_context(|| format!("rlark {args:?} timed out"))?
        .with_context(|| format!("run rlark {args:?}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn wait_succeeded(admin: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), namespace);
    eventually(&format!("pod {namespace}/{name} Succeeded"), || async {
        Ok(pods
            .get_opt(name)
            .await?
            .filter(|p| p.status.as_ref().and_then(|s| s.phase) == Some(PodPhase::Succeeded))
            .map(|_| ()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_logs_reads_pods_tasks_and_jobs() -> anyhow::Result<()> {
    let server_dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(server_dir.path());
    config.controllers.enabled = true;
    config.controllers.leader_election = false;
    let server = TestServer::start_with(config).await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let (dir_a, dir_b): (TempDir, TempDir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let agent_a = start_agent(&server, "a", dir_a.path()).await?;
    let agent_b = start_agent(&server, "b", dir_b.path()).await?;

    // One task per cluster.
    let task = |name: &str, cluster: &str, script: &str| {
        json!({
            "name": name,
            "agentType": "Raw",
            "role": "Actor",
            "nodeSelector": {"rlark.io/cluster-id": cluster},
            "raw": {"entrypoint": ["sh", "-c", script]},
        })
    };
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "duo"},
        "spec": {"tasks": [
            task("left", "a", "echo left-1; echo left-2; printf left-3"),
            task("right", "b", "echo right-1"),
        ]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    wait_succeeded(&admin, "rlark-a", "duo-left-0").await?;
    wait_succeeded(&admin, "rlark-b", "duo-right-0").await?;

    // One pod: its output as is (the last line without its newline, too).
    let out = rlark(&kubeconfig, &["logs", "task/duo-left"]).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "left-1\nleft-2\nleft-3");
    let out = rlark(&kubeconfig, &["logs", "duo-left-0", "--tail", "2"]).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "left-2\nleft-3");
    let out = rlark(
        &kubeconfig,
        &["logs", "-f", "pod/duo-right-0", "-n", "rlark-b"],
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "right-1\n",
        "-f ends once the replica has exited"
    );

    // The Job: every pod, each line prefixed with its pod.
    let out = rlark(&kubeconfig, &["logs", "job/duo"]).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "[duo-left-0] left-1\n[duo-left-0] left-2\n[duo-left-0] left-3\n[duo-right-0] right-1\n"
    );

    // Unknown names: a clear error, exit code 1.
    let out = rlark(&kubeconfig, &["logs", "task/nope"]).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("task \"nope\" not found"),
        "{}",
        text(&out.stderr)
    );

    // The agent of b goes away: its pod gets an error line, the others still print.
    tokio::time::timeout(DEADLINE, agent_b.stop())
        .await
        .context("agent b stop timed out")??;
    let out = rlark(&kubeconfig, &["logs", "-f", "job/duo"]).await?;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "[duo-left-0] left-1\n[duo-left-0] left-2\n[duo-left-0] left-3\n"
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("pod rlark-b/duo-right-0: ")
            && stderr.contains("the agent of cluster \"b\" is not connected"),
        "{stderr}"
    );

    tokio::time::timeout(DEADLINE, agent_a.stop())
        .await
        .context("agent a stop timed out")??;
    server.stop().await
}
