//! Task reports end to end: an in-process server with its controllers, a real agent
//! (`rlark_agent::start`), raw tasks that post reports with the environment the agent gives
//! them (`RLARK_REPORT_URL`, `RLARK_TOKEN`, `RLARK_CA_FILE`), and
//! `GET/POST /rlark/v1/namespaces/{ns}/tasks/{name}/reports`.
//!
//! Every wait is bounded by [`DEADLINE`].

use anyhow::{Context as _, bail, ensure};
use futures::AsyncBufReadExt as _;
use kube::ResourceExt as _;
use kube::api::Api;
use rlark_api::types::{PodPhase, Task};
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, viewer_client};
use serde_json::{Value, json};

/// Posts one reward report with the task's own token.
const POST_REWARD: &str = "curl -sS --fail --cacert \"$RLARK_CA_FILE\" \
    -H \"Authorization: Bearer $RLARK_TOKEN\" -H 'Content-Type: application/json' \
    -d '{\"type\":\"reward\",\"value\":1.5,\"step\":3}' \"$RLARK_REPORT_URL\"";

/// Posts to the reports of task `reward-main` with its own token; writes the HTTP code to
/// `code` in its working directory.
const POST_TO_ANOTHER: &str = "url=$(echo \"$RLARK_REPORT_URL\" | sed 's#/tasks/spy-main/#/tasks/reward-main/#'); \
    curl -sS -o /dev/null -w '%{http_code}' --cacert \"$RLARK_CA_FILE\" \
    -H \"Authorization: Bearer $RLARK_TOKEN\" -H 'Content-Type: application/json' \
    -d '{\"type\":\"reward\",\"value\":99}' \"$url\" > code";

fn reports_path(task: &str, query: &str) -> String {
    format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/{task}/reports{query}")
}

/// `method path` with `body` as `client`: the JSON answer, or the status code and message.
async fn call(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Vec<u8>,
) -> anyhow::Result<Result<Value, (u16, String)>> {
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)?;
    match tokio::time::timeout(DEADLINE, client.request::<Value>(request))
        .await
        .with_context(|| format!("{path} timed out"))?
    {
        Ok(value) => Ok(Ok(value)),
        Err(kube::Error::Api(status)) => Ok(Err((status.code, status.message.clone()))),
        Err(e) => Err(e).with_context(|| path.to_string()),
    }
}

async fn list(client: &kube::Client, task: &str) -> anyhow::Result<Vec<Value>> {
    match call(
        client,
        http::Method::GET,
        &reports_path(task, ""),
        Vec::new(),
    )
    .await?
    {
        Ok(list) => Ok(list["items"].as_array().context("items")?.clone()),
        Err((code, message)) => bail!("list reports: {code} {message}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_post_reports_with_their_own_token() -> anyhow::Result<()> {
    let h = Harness::start_with(vec![env!("CARGO_BIN_EXE_rlark-agent-supervise").into()]).await?;
    let admin = h.admin.clone();

    // A task posts a reward with the environment the agent gave it.
    h.create_job("reward", POST_REWARD).await?;
    h.wait_pod("reward-main-0", PodPhase::Succeeded).await?;
    let task = Api::<Task>::namespaced(admin.clone(), NAMESPACE)
        .get("reward-main")
        .await?;
    let items = list(&admin, "reward-main").await?;
    ensure!(items.len() == 1, "one report: {items:?}");
    let spec = &items[0]["spec"];
    assert_eq!(spec["task"], "reward-main");
    assert_eq!(spec["taskUID"], json!(task.uid()));
    assert_eq!(spec["seq"], 1);
    assert_eq!(spec["report"]["type"], "reward");
    assert_eq!(spec["report"]["value"], 1.5);
    assert_eq!(spec["report"]["step"], 3);
    assert!(
        spec["time"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z') && t.contains('.'))
    );

    // Another task may not post to it with its own token.
    h.create_job("spy", POST_TO_ANOTHER).await?;
    h.wait_pod("spy-main-0", PodPhase::Succeeded).await?;
    let code = std::fs::read_to_string(h.work_dir("spy-main").await?.join("code"))?;
    assert_eq!(code.trim(), "403");
    assert_eq!(list(&admin, "reward-main").await?.len(), 1);

    // A viewer can list, not post.
    let viewer_dir = tempfile::tempdir()?;
    let viewer = viewer_client(&h.server, &admin, viewer_dir.path()).await?;
    assert_eq!(list(&viewer, "reward-main").await?.len(), 1);
    let post = call(
        &viewer,
        http::Method::POST,
        &reports_path("reward-main", ""),
        br#"{"type":"x"}"#.to_vec(),
    )
    .await?;
    let (code, message) = post.err().context("a viewer's post was accepted")?;
    assert_eq!(code, 403);
    assert!(message.contains("vera"), "{message}");

    // Bad bodies.
    let big = format!(r#"{{"type":"t","pad":"{}"}}"#, "x".repeat(20 * 1024));
    let reward_path = reports_path("reward-main", "");
    for (body, expected, expected_code) in [
        (br#"{"value":1}"#.to_vec(), "type", 400),
        (b"[1,2]".to_vec(), "JSON object", 400),
        // Over the size limit: 413, as every oversized write (docs/security.md, "Limits").
        (big.into_bytes(), "too large: the limit is 16384 bytes", 413),
    ] {
        let answer = call(&admin, http::Method::POST, &reward_path, body);
        let (code, message) = answer.await?.err().context("a bad body was accepted")?;
        assert_eq!(code, expected_code, "{message}");
        assert!(message.contains(expected), "{message} lacks {expected}");
    }
    // A Task that does not exist.
    let nope_path = reports_path("nope", "");
    let answer = call(
        &admin,
        http::Method::POST,
        &nope_path,
        br#"{"type":"x"}"#.to_vec(),
    );
    assert_eq!(answer.await?.err().map(|e| e.0), Some(404));

    // Follow: the stored report, then one posted meanwhile.
    let request =
        http::Request::get(reports_path("reward-main", "?follow=true")).body(Vec::new())?;
    let mut stream = tokio::time::timeout(DEADLINE, admin.request_stream(request))
        .await
        .context("follow request timed out")??;
    let mut line = String::new();
    tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
        .await
        .context("first followed report")??;
    let first: Value = serde_json::from_str(&line)?;
    assert_eq!(first["spec"]["seq"], 1);
    let posted = call(
        &admin,
        http::Method::POST,
        &reports_path("reward-main", ""),
        br#"{"type":"metric","value":2}"#.to_vec(),
    )
    .await?
    .map_err(|(code, message)| anyhow::anyhow!("{code} {message}"))?;
    assert_eq!(posted["spec"]["seq"], 2);
    line.clear();
    tokio::time::timeout(DEADLINE, stream.read_line(&mut line))
        .await
        .context("second followed report")??;
    let second: Value = serde_json::from_str(&line)?;
    assert_eq!(second["spec"]["report"]["type"], "metric");
    drop(stream);

    h.stop().await
}
