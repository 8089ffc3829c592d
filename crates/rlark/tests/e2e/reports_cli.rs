//! `rlark reports` as a real process: an in-process server with its controllers, a real
//! agent (`rlark_agent::start`), raw tasks that post rewards with the environment the agent
//! gives them, and the CLI printing them: per task, per job, two runs compared, and the
//! reward summary in `get -o wide` and `describe`.
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

    // Job `rl` posts one reward with details, then two more; `rl2` posts three others.
    let post = |body: &str| {
        format!(
            "curl -sS --fail --cacert \"$RLARK_CA_FILE\" \
             -H \"Authorization: Bearer $RLARK_TOKEN\" -H 'Content-Type: application/json' \
             -d '{body}' \"$RLARK_REPORT_URL\""
        )
    };
    let rl = [
        post(r#"{"type":"reward","value":1.5,"step":3,"episode":"e1"}"#),
        post(r#"{"type":"reward","value":2.5,"step":4}"#),
        post(r#"{"type":"reward","value":0.30000000000000004,"step":5}"#),
    ]
    .join(" && ");
    let rl2 = [
        post(r#"{"type":"reward","value":1,"step":3}"#),
        post(r#"{"type":"reward","value":2,"step":4}"#),
        post(r#"{"type":"reward","value":6,"step":6}"#),
    ]
    .join(" && ");
    for (name, script) in [("rl", rl), ("rl2", rl2)] {
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "rlinf.io/v1alpha1",
            "kind": "Job",
            "metadata": {"name": name},
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
    }
    wait_succeeded(&admin, "rlark-a", "rl-main-0").await?;
    wait_succeeded(&admin, "rlark-a", "rl2-main-0").await?;

    let out = rlark(&kubeconfig, &["reports", "task/rl-main"]).await?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let lines: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(lines[0], ["TIME", "TYPE", "STEP", "VALUE", "DETAILS"]);
    assert_eq!(
        lines[1][1..],
        ["reward", "3", "1.5", r#"{"episode":"e1"}"#],
        "{stdout}"
    );
    assert_eq!(lines[3][1..], ["reward", "5", "0.3"], "{stdout}");

    // The Task's summary: the REWARD column of -o wide (last/mean) and describe's line.
    let out = rlark(&kubeconfig, &["get", "tasks", "-A", "-o", "wide"]).await?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let header: Vec<&str> = stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let reward_column = header
        .iter()
        .position(|h| *h == "REWARD")
        .with_context(|| format!("no REWARD column: {stdout}"))?;
    let cell = |name: &str| -> Option<String> {
        stdout
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cells| cells.get(1) == Some(&name))
            .and_then(|cells| cells.get(reward_column).map(|c| c.to_string()))
    };
    assert_eq!(cell("rl-main").as_deref(), Some("0.3/1.433"), "{stdout}");
    assert_eq!(cell("rl2-main").as_deref(), Some("6/3"), "{stdout}");
    let out = rlark(&kubeconfig, &["get", "tasks", "-A"]).await?;
    assert!(
        !text(&out.stdout).contains("REWARD"),
        "only -o wide shows it"
    );
    let out = rlark(&kubeconfig, &["describe", "task", "rl-main"]).await?;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Reward:        last 0.3 · mean 1.43333 · max 2.5 over 3 reports (step 5)"),
        "{stdout}"
    );
    // The Job's, from its task's (the Job controller copies it when the Task changes).
    let mut job_line = String::new();
    for _ in 0..100 {
        let out = rlark(&kubeconfig, &["get", "jobs", "-o", "wide"]).await?;
        job_line = text(&out.stdout)
            .lines()
            .find(|l| l.starts_with("rl2 "))
            .unwrap_or_default()
            .to_string();
        if job_line.contains("6/3") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(job_line.contains("6/3"), "{job_line}");
    let out = rlark(&kubeconfig, &["describe", "job", "rl2"]).await?;
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("Reward:        last 6 · mean 3 · max 6 over 3 reports (step 6)\n  main:"),
        "{stdout}"
    );

    // A Job's reports: every task's, with a TASK column.
    let out = rlark(&kubeconfig, &["reports", "job/rl2"]).await?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["TIME", "TASK", "TYPE", "STEP", "VALUE", "DETAILS"],
        "{stdout}"
    );
    assert_eq!(rows.len(), 4, "{stdout}");
    assert_eq!(rows[3][1..], ["rl2-main", "reward", "6", "6"], "{stdout}");

    // Two runs side by side.
    let out = rlark(&kubeconfig, &["reports", "--compare", "job/rl", "job/rl2"]).await?;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0], ["STEP", "job/rl", "job/rl2"], "{stdout}");
    assert_eq!(rows[1], ["3", "1.5", "1"], "{stdout}");
    assert_eq!(rows[3], ["5", "0.3", "-"], "{stdout}");
    assert_eq!(rows[4], ["6", "-", "6"], "{stdout}");
    assert!(
        rows.contains(&vec!["job/rl2", "6", "3", "6", "3"]),
        "{stdout}"
    );
    for (args, expected) in [
        (
            vec!["reports", "--compare", "job/rl"],
            "--compare needs two or more runs",
        ),
        (vec!["reports", "job/rl", "job/rl2"], "add --compare"),
        (vec!["reports", "job/nope"], "job \"nope\" not found"),
        (vec!["reports", "pod/x"], "use task/NAME or job/NAME"),
    ] {
        let out = rlark(&kubeconfig, &args).await?;
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains(expected),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }

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
