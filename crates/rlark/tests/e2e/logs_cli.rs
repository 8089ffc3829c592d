//! `rlark logs` as a real process: an in-process server with its controllers, two real agents
//! (clusters `a` and `b`, `rlark_agent::start`), a Job with one task on each, and the CLI
//! reading their logs through the server and the agents' tunnels.
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
use serde_json::json;
use tempfile::TempDir;

/// `rlark ARGS --kubeconfig KUBECONFIG`, bounded by [`DEADLINE`].
async fn rlark(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
    run_cli(env!("CARGO_BIN_EXE_rlark"), kubeconfig, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlark_logs_reads_pods_tasks_and_jobs() -> anyhow::Result<()> {
    let (server, _server_dir) = start_server_with_controllers().await?;
    let admin = server.client().await?;
    let kubeconfig = server.kubeconfig_path().to_path_buf();
    let (dir_a, dir_b): (TempDir, TempDir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let supervisor = || vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let agent_a = start_agent_with(&server, "a", "host-a", dir_a.path(), supervisor()).await?;
    let agent_b = start_agent_with(&server, "b", "host-b", dir_b.path(), supervisor()).await?;

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
