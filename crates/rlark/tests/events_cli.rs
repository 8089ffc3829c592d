//! `rlark events` as a real process: an in-process server with its controllers, a real
//! agent (`rlark_agent::start`), a raw task that posts an event with the environment the
//! agent gives it, and the CLI printing it.
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
use serde_json::{Value, json};

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
async fn rlark_events_prints_what_a_task_posted() -> anyhow::Result<()> {
    let server_dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(server_dir.path());
    config.controllers.enabled = true;
    config.controllers.leader_election = false;
    let server = TestServer::start_with(config).await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let agent_dir = tempfile::tempdir()?;
    let agent = start_agent(&server, "a", agent_dir.path()).await?;

    let script = "curl -sS --fail --cacert \"$RLARK_CA_FILE\" \
        -H \"Authorization: Bearer $RLARK_TOKEN\" -H 'Content-Type: application/json' \
        -d '{\"type\":\"reward\",\"value\":1.5,\"step\":3,\"episode\":\"e1\"}' \
        \"$RLARK_EVENT_URL\"";
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "rl"},
        "spec": {"tasks": [{
            "name": "main",
            "agentType": "Raw",
            "role": "Actor",
            "raw": {"entrypoint": ["sh", "-c", script]},
        }]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    wait_succeeded(&admin, "rlark-a", "rl-main-0").await?;

    let out = rlark(&kubeconfig, &["events", "task/rl-main"]).await?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], ["TIME", "TYPE", "STEP", "VALUE", "DETAILS"]);
    assert_eq!(
        lines[1][1..],
        ["reward", "3", "1.5", r#"{"episode":"e1"}"#],
        "{stdout}"
    );

    let out = rlark(
        &kubeconfig,
        &["events", "task/rl-main", "-n", "rlark-a", "-o", "json"],
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(list["items"][0]["spec"]["event"]["value"], 1.5);

    let out = rlark(&kubeconfig, &["events", "task/nope"]).await?;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );

    tokio::time::timeout(DEADLINE, agent.stop())
        .await
        .context("agent stop timed out")??;
    server.stop().await
}
