//! Issue 14, finding 3: agents and task tokens cannot exhaust the server's memory or disk
//! through Events. Oversized Events are refused (422 naming `message`, 413 naming the
//! limit), a flood gets 429 with `Retry-After` (per-identity rate limit, per-task Event
//! quota), Events expire after the Event TTL and go with the object they are about. Real
//! TLS against an in-process server.

use crate::raw_api;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use raw_api::{call, call_ok};
use rlark_server::ServerConfig;
use rlark_testkit::TestServer;
use rlark_testkit::wait::eventually;
use serde_json::{Value, json};

/// Hang guard of every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);

async fn bounded(test: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .with_context(|| format!("test did not finish within {TEST_TIMEOUT:?}"))?
}

fn base64(data: &[u8]) -> String {
    serde_json::to_value(k8s_openapi::ByteString(data.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Create Task `default/name` (admin) and a client holding its token.
async fn task_with_token(
    server: &TestServer,
    admin: &kube::Client,
    dir: &Path,
    name: &str,
) -> Result<kube::Client> {
    call_ok(
        admin,
        "POST",
        "/apis/rlinf.io/v1alpha1/namespaces/default/tasks",
        Some(&json!({
            "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
            "metadata": {"name": name},
            "spec": {"role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}},
        })),
    )
    .await?;
    let minted = call_ok(
        admin,
        "POST",
        &format!("/rlark/v1/namespaces/default/tasks/{name}/token"),
        None,
    )
    .await?;
    let token = minted["token"].as_str().context("no token")?;
    let ca = call_ok(admin, "GET", "/rlark/v1/ca", None).await?;
    let ca = ca["caBundle"].as_str().context("no caBundle")?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rlark\n  cluster:\n    server: \"{}\"\n    \
         certificate-authority-data: {}\ncontexts:\n- name: rlark\n  context:\n    cluster: rlark\n    \
         user: t\ncurrent-context: rlark\nusers:\n- name: t\n  user: {{token: \"{token}\"}}\n",
        server.url(),
        base64(ca.as_bytes()),
    );
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, yaml)?;
    // kube-rs retries a 429 after its Retry-After by default; this test wants to see it.
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// An Event about Task `default/task` with `message`, padded by an annotation of `pad` bytes.
fn event(name: &str, task: &str, message: &str, pad: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "annotations": {"pad": "p".repeat(pad)}},
        "involvedObject": {"apiVersion": "rlinf.io/v1alpha1", "kind": "Task", "name": task, "namespace": "default"},
        "reason": "Progress", "message": message, "type": "Normal",
    })
}

const EVENTS: &str = "/api/v1/namespaces/default/events";

/// Names of the Events in `default` about Task `task`.
async fn events_about(admin: &kube::Client, task: &str) -> Result<Vec<String>> {
    let list = call_ok(admin, "GET", EVENTS, None).await?;
    Ok(list["items"]
        .as_array()
        .context("no items")?
        .iter()
        .filter(|e| e["involvedObject"]["name"] == task)
        .filter_map(|e| e["metadata"]["name"].as_str().map(str::to_string))
        .collect())
}

fn database_bytes(dir: &Path) -> u64 {
    ["rlark.db", "rlark.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// The issue's flood, scaled down: a task token posting many large Events. Oversized ones
/// are refused naming the field and the limit; the first `maxEventsPerTask` are stored,
/// then the quota answers 429 (with `Retry-After`), and once the burst is spent the rate
/// limit does too; the database grows by at most the quota's worth. (The refill rate is
/// one write per 100 s, so how fast the requests go does not change the outcome.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_event_flood_is_refused_and_capped() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let mut config: ServerConfig = TestServer::config_for(dir.path());
        config.api.limits.max_events_per_task = 8;
        config.api.limits.task_write_burst = 20;
        config.api.limits.task_writes_per_second = 0.01;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let task = task_with_token(&server, &admin, dir.path(), "t1").await?;

        // Oversized: the issue's 2.9 MB Event (422 naming `message`), a message within its
        // limit in an Event over 16 KiB (413 naming the limit), and a task report over 16 KiB.
        let huge = call(
            &task,
            "POST",
            EVENTS,
            Some(&event("huge", "t1", &"m".repeat(2_900_000), 0)),
        )
        .await?;
        ensure!(
            huge.code == 422,
            "2.9 MB message: {} {}",
            huge.code,
            huge.brief()
        );
        ensure!(
            huge.json["details"]["causes"][0]["field"] == "message"
                && huge.message().contains("1024 bytes"),
            "{}",
            huge.brief()
        );
        let padded = call(
            &task,
            "POST",
            EVENTS,
            Some(&event("padded", "t1", "ok", 20_000)),
        )
        .await?;
        ensure!(
            padded.code == 413,
            "20 kB Event: {} {}",
            padded.code,
            padded.brief()
        );
        ensure!(
            padded.message().contains("16384 bytes"),
            "{}",
            padded.brief()
        );
        let reward = call(
            &task,
            "POST",
            "/rlark/v1/namespaces/default/tasks/t1/reports",
            Some(&json!({"type": "reward", "blob": "r".repeat(20_000)})),
        )
        .await?;
        ensure!(
            reward.code == 413,
            "20 kB task report: {} {}",
            reward.code,
            reward.brief()
        );
        ensure!(
            reward.message().contains("16384 bytes"),
            "{}",
            reward.brief()
        );

        // The flood: 40 Events of ~15 KiB each.
        let disk_before = database_bytes(dir.path());
        let (mut created, mut quota, mut rate) = (0, 0, 0);
        for i in 0..40 {
            let resp = call(
                &task,
                "POST",
                EVENTS,
                Some(&event(&format!("e{i}"), "t1", "step", 15_000)),
            )
            .await?;
            match resp.code {
                201 => created += 1,
                429 => {
                    ensure!(resp.json["reason"] == "TooManyRequests", "{}", resp.brief());
                    let seconds: u64 = resp
                        .retry_after()
                        .context("429 without Retry-After")?
                        .parse()?;
                    ensure!(seconds >= 1, "Retry-After {seconds}");
                    if resp.message().contains("exceeded quota") {
                        quota += 1;
                    } else if resp.message().contains("too many requests") {
                        rate += 1;
                    }
                }
                other => anyhow::bail!("flood answered {other}: {}", resp.brief()),
            }
        }
        eprintln!("flood: {created} created, {quota} over quota, {rate} rate limited");
        ensure!(created == 8, "{created} Events stored, the quota is 8");
        ensure!(quota > 0 && rate > 0, "quota {quota}, rate {rate}");
        let disk_growth = database_bytes(dir.path()).saturating_sub(disk_before);
        eprintln!("database growth during the flood: {disk_growth} bytes");
        // 8 Events of 15 KiB, plus the WAL's pages and headroom; the unbounded flood stored 40.
        ensure!(
            disk_growth < 2 * 1024 * 1024,
            "database grew {disk_growth} bytes"
        );
        ensure!(events_about(&admin, "t1").await?.len() == 8);
        server.stop().await
    })
    .await
}

/// Events expire after the Event TTL (1 s here) while their Task still exists, which frees
/// the Task's Event quota again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_expire_after_the_ttl() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let mut config: ServerConfig = TestServer::config_for(dir.path());
        config.api.limits.event_ttl = Duration::from_secs(1);
        config.api.limits.max_events_per_task = 3;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        let task = task_with_token(&server, &admin, dir.path(), "t1").await?;
        for i in 0..3 {
            let resp = call(
                &task,
                "POST",
                EVENTS,
                Some(&event(&format!("e{i}"), "t1", "step", 0)),
            )
            .await?;
            ensure!(resp.code == 201, "{} {}", resp.code, resp.brief());
        }
        eventually("the Events expire", || async {
            Ok(events_about(&admin, "t1").await?.is_empty())
        })
        .await?;
        let again = call(
            &task,
            "POST",
            EVENTS,
            Some(&event("after", "t1", "step", 0)),
        )
        .await?;
        ensure!(
            again.code == 201,
            "quota not freed: {} {}",
            again.code,
            again.brief()
        );
        let task_object = call_ok(
            &admin,
            "GET",
            "/apis/rlinf.io/v1alpha1/namespaces/default/tasks/t1",
            None,
        )
        .await?;
        ensure!(
            task_object["metadata"]["name"] == "t1",
            "the Task is still there"
        );
        server.stop().await
    })
    .await
}

/// A Task's Events (by its token, without a uid, and by an admin, with it) are deleted when
/// the Task is, long before their TTL (the default hour); Events about another Task stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_deleted_with_their_task() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let server = TestServer::start_with(TestServer::config_for(dir.path())).await?;
        let admin = server.client().await?;
        let t1 = task_with_token(&server, &admin, dir.path(), "t1").await?;
        let t2 = task_with_token(&server, &admin, dir.path(), "t2").await?;
        call_ok(
            &t1,
            "POST",
            EVENTS,
            Some(&event("by-token", "t1", "step", 0)),
        )
        .await?;
        call_ok(&t2, "POST", EVENTS, Some(&event("other", "t2", "step", 0))).await?;
        let task = call_ok(
            &admin,
            "GET",
            "/apis/rlinf.io/v1alpha1/namespaces/default/tasks/t1",
            None,
        )
        .await?;
        let mut by_admin = event("by-admin", "t1", "placed", 0);
        by_admin["involvedObject"]["uid"] = task["metadata"]["uid"].clone();
        call_ok(&admin, "POST", EVENTS, Some(&by_admin)).await?;
        call_ok(
            &t1,
            "POST",
            "/rlark/v1/namespaces/default/tasks/t1/reports",
            Some(&json!({"type": "reward", "value": 1})),
        )
        .await?;
        ensure!(events_about(&admin, "t1").await?.len() == 2);

        call_ok(
            &admin,
            "DELETE",
            "/apis/rlinf.io/v1alpha1/namespaces/default/tasks/t1",
            None,
        )
        .await?;
        eventually("the deleted Task's Events are deleted", || async {
            Ok(events_about(&admin, "t1").await?.is_empty())
        })
        .await?;
        eventually("the deleted Task's task reports are deleted", || async {
            let listed = call(
                &admin,
                "GET",
                "/rlark/v1/namespaces/default/tasks/t1/reports",
                None,
            )
            .await?;
            Ok(listed.json["items"].as_array().is_some_and(Vec::is_empty))
        })
        .await?;
        ensure!(
            events_about(&admin, "t2").await? == ["other"],
            "an Event about another Task went too"
        );
        server.stop().await
    })
    .await
}

/// Admins (the controllers among them) are not rate limited or held to quotas, but the
/// Event size caps apply to them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_are_not_limited_but_sizes_apply() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let mut config: ServerConfig = TestServer::config_for(dir.path());
        config.api.limits.max_events_per_namespace = 3;
        config.api.limits.task_write_burst = 1;
        config.api.limits.agent_write_burst = 1;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;
        for i in 0..6 {
            call_ok(
                &admin,
                "POST",
                EVENTS,
                Some(&event(&format!("a{i}"), "x", "m", 0)),
            )
            .await?;
        }
        let long = call(
            &admin,
            "POST",
            EVENTS,
            Some(&event("long", "x", &"m".repeat(1025), 0)),
        )
        .await?;
        ensure!(long.code == 422, "{} {}", long.code, long.brief());
        server.stop().await
    })
    .await
}
