//! `rlark reports` as a real process: an in-process server with its controllers, a real
//! agent (`rlark_agent::start`), a raw task that posts an report with the environment the
//! agent gives it, and the CLI printing it.
//!
//! Every wait is bounded by [`DEADLINE`].

use std::path::Path;
use std::process::Output;

use anyhow::Context as _;
use kube::api::{Api, PostParams};
use rlark_api::types::Job;
use rlark_testkit::real_agent::{
    DEADLINE, run_cli, start_agent_with, start_server_with_controllers, text, wait_succeeded,
};
use serde_json::{Value, json};

/// `rlark ARGS --kubeconfig KUBECONFIG`, bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    run_cli(env!("CARGO_BIN_EXE_rlark"), kubeconfig, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_reports_prints_what_a_task_posted() -> anyhow::Result<()> {
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let agent_dir = tempfile::tempdir()?;
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let agent = start_agent_with(&server, "a", "host-a", agent_dir.path(), supervisor).await?;

    let script = "curl -sS --fail --cacert \"$RLARK_CA_FILE\" \
        -H \"Authorization: Bearer $RLARK_TOKEN\" -H 'Content-Type: application/json' \
        -d '{\"type\":\"reward\",\"value\":1.5,\"step\":3,\"episode\":\"e1\"}' \
        \"$RLARK_REPORT_URL\"";
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

    let out = rlark(&kubeconfig, &["reports", "task/rl-main"]).await?;
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
        &["reports", "task/rl-main", "-n", "rlark-a", "-o", "json"],
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(list["items"][0]["spec"]["report"]["value"], 1.5);

    let out = rlark(&kubeconfig, &["reports", "task/nope"]).await?;
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
