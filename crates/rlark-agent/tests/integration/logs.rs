//! Replica logs end to end: an in-process server with its controllers, a real agent
//! (`rlark_agent::start`: join, Node, tunnel with the local API, task reconciler), a Job whose
//! raw task prints, and `GET /rlark/v1/namespaces/{ns}/pods/{pod}/log` through the hub and
//! the agent's `agent-api` stream.
//!
//! Every wait is bounded by [`DEADLINE`].

use anyhow::{Context as _, bail, ensure};
use futures::AsyncBufReadExt as _;
use rlark_api::types::PodPhase;
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually, viewer_client};
use serde_json::Value;

const JOB: &str = "talk";
const TASK: &str = "talk-main";
const POD: &str = "talk-main-0";

/// Prints three lines, waits for `go` in its working directory (at most 60 s), sleeps 2 s,
/// prints a fourth line and exits.
const SCRIPT: &str = "echo line-1; echo line-2; echo line-3; \
                      i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
                      sleep 2; echo line-4";

fn log_path(namespace: &str, pod: &str, query: &str) -> String {
    format!("/rlark/v1/namespaces/{namespace}/pods/{pod}/log{query}")
}

fn get(path: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(http::Request::get(path).body(Vec::new())?)
}

/// `GET path` as `client`: the text, or the server's status code and message.
async fn get_text(
    client: &kube::Client,
    path: &str,
) -> anyhow::Result<Result<String, (u16, String)>> {
    match tokio::time::timeout(DEADLINE, client.request_text(get(path)?))
        .await
        .with_context(|| format!("GET {path} timed out"))?
    {
        Ok(text) => Ok(Ok(text)),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message.clone()))),
        Err(e) => Err(e).with_context(|| format!("GET {path}")),
    }
}

async fn expect_text(client: &kube::Client, path: &str) -> anyhow::Result<String> {
    match get_text(client, path).await? {
        Ok(text) => Ok(text),
        Err((code, message)) => bail!("GET {path}: {code} {message}"),
    }
}

/// Open tunnel streams on the server (`GET /api/v1/tunnels`).
async fn streams_open(admin: &kube::Client) -> anyhow::Result<u64> {
    let list: Value = admin.request(get("/api/v1/tunnels")?).await?;
    Ok(list["items"]
        .as_array()
        .context("tunnel list")?
        .iter()
        .filter_map(|t| t["streamsOpen"].as_u64())
        .sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_logs_are_read_through_the_tunnel() -> anyhow::Result<()> {
    let h = Harness::start_with(vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()]).await?;
    let admin = h.admin.clone();
    h.create_job(JOB, SCRIPT).await?;
    h.wait_pod(POD, PodPhase::Running).await?;
    let work = h.work_dir(TASK).await?;

    // While it waits: the three lines, and the last of them with tail=1.
    let full = log_path(NAMESPACE, POD, "");
    let log = eventually("three lines in the log", || async {
        let text = expect_text(&admin, &full).await?;
        Ok(text.contains("line-3").then_some(text))
    })
    .await?;
    assert_eq!(log, "line-1\nline-2\nline-3\n");
    assert_eq!(
        expect_text(&admin, &log_path(NAMESPACE, POD, "?tail=1")).await?,
        "line-3\n"
    );
    assert_eq!(
        expect_text(&admin, &log_path(NAMESPACE, POD, "?limitBytes=3")).await?,
        "lin"
    );

    // A follower that goes away: the hub closes its tunnel stream.
    {
        let request = get(&log_path(NAMESPACE, POD, "?follow=true"))?;
        let mut stream = tokio::time::timeout(DEADLINE, admin.request_stream(request))
            .await
            .context("follow request timed out")??;
        let mut line = String::new();
        tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
            .await
            .context("first line of the follow")??;
        assert_eq!(line, "line-1\n");
        assert_eq!(streams_open(&admin).await?, 1, "the follow's stream");
    }
    eventually("the abandoned follow's stream is closed", || async {
        Ok((streams_open(&admin).await? == 0).then_some(()))
    })
    .await?;

    // Follow: the lines so far, then the fourth once printed, then the end after the exit.
    let request = get(&log_path(NAMESPACE, POD, "?follow=true&tail=2"))?;
    let mut stream = tokio::time::timeout(DEADLINE, admin.request_stream(request))
        .await
        .context("follow request timed out")??;
    let mut lines = Vec::new();
    let mut line = String::new();
    while lines.len() < 2 {
        line.clear();
        let n = tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
            .await
            .context("first lines of the follow")??;
        ensure!(n > 0, "the follow ended early after {lines:?}");
        lines.push(line.clone());
    }
    assert_eq!(lines, ["line-2\n", "line-3\n"]);
    std::fs::write(work.join("go"), "")?;
    line.clear();
    tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
        .await
        .context("the fourth line")??;
    assert_eq!(line, "line-4\n");
    line.clear();
    let n = tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
        .await
        .context("the follow did not end after the exit")??;
    assert_eq!(n, 0, "nothing after the last line: {line:?}");
    h.wait_pod(POD, PodPhase::Succeeded).await?;

    // After the exit.
    assert_eq!(
        expect_text(&admin, &full).await?,
        "line-1\nline-2\nline-3\nline-4\n"
    );
    assert_eq!(
        expect_text(&admin, &log_path(NAMESPACE, POD, "?tail=1")).await?,
        "line-4\n"
    );

    // No such replica; no previous run; not an agent namespace; a cluster without agent.
    let (code, message) = get_text(&admin, &log_path(NAMESPACE, "nope-0", ""))
        .await?
        .err()
        .context("unknown pod")?;
    assert_eq!(code, 404, "{message}");
    assert!(message.contains("nope-0"), "{message}");
    let (code, message) = get_text(&admin, &log_path(NAMESPACE, POD, "?previous=true"))
        .await?
        .err()
        .context("no previous run")?;
    assert_eq!(code, 404, "{message}");
    let (code, _) = get_text(&admin, &log_path("default", POD, ""))
        .await?
        .err()
        .context("not an agent namespace")?;
    assert_eq!(code, 400);
    let (code, message) = get_text(&admin, &log_path("rlark-b", POD, ""))
        .await?
        .err()
        .context("no agent of cluster b")?;
    // 502, not 503: Kubernetes clients would retry a 503 for minutes.
    assert_eq!(code, 502, "{message}");
    assert!(message.contains("not connected"), "{message}");
    let (code, _) = get_text(&admin, &log_path(NAMESPACE, POD, "?tail=x"))
        .await?
        .err()
        .context("bad tail")?;
    assert_eq!(code, 400);

    // Who: a viewer reads; the agent's own identity does not.
    let dir = tempfile::tempdir()?;
    let viewer = viewer_client(&h.server, &admin, dir.path()).await?;
    assert_eq!(
        expect_text(&viewer, &log_path(NAMESPACE, POD, "?tail=1")).await?,
        "line-4\n"
    );
    let (code, message) = get_text(&h.agent.client(), &full)
        .await?
        .err()
        .context("the agent may not read logs")?;
    assert_eq!(code, 403, "{message}");

    h.stop().await
}
