//! Issue 38, finding 2 ("one agent can exhaust the server's memory"), as the attacker
//! tried it: an agent identity against the real `rlark` binary running `rlark server` as a
//! child process, whose resident memory is read from `/proc/PID/status`.
//!
//! - A watch the agent never reads while it rewrites a large Task hundreds of times: the
//!   watch is cut once its unsent bytes pass the watch budget (`store.watchBufferBytes`), the
//!   cut is counted in `/metrics`, and the server's RSS stays within a stated bound during
//!   the flood and after the watch is gone.
//! - Tasks with multi-MB environment values and many large Tasks: refused before the write
//!   with 413 naming the limit and the field, then 429 naming the namespace's byte quota;
//!   RSS and the database stay bounded.
//! - Task reports from an agent over many Tasks of its namespace: capped per namespace (429
//!   naming the quota), not only per task.
//!
//! Each test starts its own server process, so nothing else moves the RSS it measures.

#[path = "support/raw_api.rs"]
mod raw_api;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use http_body_util::BodyExt as _;
use raw_api::{Resp, call, call_ok};
use rlark_agent::join::{AGENT_KUBECONFIG, JoinOptions};
use rlark_testkit::ServerProcess;
use serde_json::{Value, json};

/// Hang guard of every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
const MIB: u64 = 1024 * 1024;

async fn bounded(test: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .with_context(|| format!("test did not finish within {TEST_TIMEOUT:?}"))?
}

/// `VmRSS` of process `pid`, in bytes.
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?;
    Ok(kib * 1024)
}

/// Bytes of the server's SQLite database and WAL.
fn database_bytes(dir: &Path) -> u64 {
    ["rlark.db", "rlark.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// `rlark server` (the binary of this build) with `config` as its config file.
fn spawn_server(dir: &Path, config: &str) -> Result<ServerProcess> {
    let config_path = dir.join("server.yaml");
    std::fs::write(&config_path, config)?;
    let config_arg = config_path.to_string_lossy().into_owned();
    ServerProcess::spawn_with_args(
        Path::new(env!("CARGO_BIN_EXE_rlark")),
        &dir.join("data"),
        &["--config", &config_arg],
    )
}

/// Join agent `cluster_id` (the attacker) and return its client (namespace `rlark-ID`).
async fn join_agent(
    server: &ServerProcess,
    admin: &kube::Client,
    dir: &Path,
    cluster_id: &str,
) -> Result<kube::Client> {
    let minted = call_ok(
        admin,
        "POST",
        "/rlark/v1/tokens",
        Some(&json!({"kind": "bootstrap", "ttlSeconds": 600, "clusterID": cluster_id})),
    )
    .await?;
    let agent_dir = dir.join(format!("agent-{cluster_id}"));
    rlark_agent::join::join(&JoinOptions {
        server: format!("https://{}", server.addr()?),
        token: minted["token"].as_str().context("token")?.to_string(),
        ca_hash: minted["caHash"].as_str().context("caHash")?.to_string(),
        cluster_id: None,
        dir: agent_dir.clone(),
    })
    .await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(agent_dir.join(AGENT_KUBECONFIG))?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    // The test wants to see a 429, not kube-rs waiting it out.
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// A counter from the server's `/metrics` (0 when absent).
async fn metric(admin: &kube::Client, name: &str) -> Result<u64> {
    let resp = raw_api::send(admin, "GET", "/metrics", &[], Vec::new()).await?;
    ensure!(resp.code == 200, "/metrics: {}", resp.code);
    Ok(resp
        .text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let series_name = series.split('{').next()?;
            (series_name == name).then(|| value.trim().parse::<f64>().ok())?
        })
        .sum::<f64>() as u64)
}

/// A raw Task of the agent's namespace with `input` padded to `input_pad` bytes and one
/// environment variable `BIG` of `env_bytes` bytes.
fn task(
    namespace: &str,
    name: &str,
    generation: usize,
    input_pad: usize,
    env_bytes: usize,
) -> Value {
    let mut raw = json!({"entrypoint": ["true"]});
    if env_bytes > 0 {
        raw["environment"] = json!([{"name": "BIG", "value": "e".repeat(env_bytes)}]);
    }
    json!({
        "apiVersion": "rlinf.io/v1alpha1", "kind": "Task",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "role": "Actor", "agentType": "Raw", "raw": raw,
            "input": {"generation": generation, "pad": "p".repeat(input_pad)},
        },
    })
}

fn tasks_path(namespace: &str) -> String {
    format!("/apis/rlinf.io/v1alpha1/namespaces/{namespace}/tasks")
}

/// The flood's Task: 900 kB of `spec.input`, the largest round size under the default
/// spec limit (1 MiB), rewritten this many times (about 270 MB in all).
const WATCH_FLOOD_PAD: usize = 900 * 1000;
const WATCH_FLOOD_WRITES: usize = 300;
/// What the server's RSS may grow by (stated bound, generous margin): unbounded, the stalled
/// watch kept every rewrite alive (~2 × 270 MB: the object and its JSON); bounded, it holds
/// at most `store.watchBufferBytes` (8 MiB by default) before it is cut, the change log its
/// own byte budget, and the rest is request buffers and allocator slack.
const WATCH_FLOOD_RSS_BOUND: u64 = 192 * MIB;

/// Issue 38, finding 2: "An agent holds a watch it never reads and rewrites a 2.9 MB Task
/// 400 times: server RSS 465 → 3,006 MiB, still 1.5 GiB after the watch closes."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_watch_flood_is_cut_and_memory_stays_bounded() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let server = spawn_server(dir.path(), "store:\n  logCapacityBytes: 8388608\n")?;
        let pid = server.pid();
        let admin = server.client().await?;
        let agent = join_agent(&server, &admin, dir.path(), "a").await?;
        let namespace = "rlark-a";
        let path = tasks_path(namespace);
        let object = format!("{path}/flood");

        let resp = call(&agent, "POST", &path, Some(&task(namespace, "flood", 0, WATCH_FLOOD_PAD, 0))).await?;
        ensure!(resp.code == 201, "create the flood Task: {} {}", resp.code, resp.brief());
        // Warm up allocator, caches and controllers before the baseline.
        for generation in 1..=10 {
            let resp = call(&agent, "PUT", &object, Some(&task(namespace, "flood", generation, WATCH_FLOOD_PAD, 0))).await?;
            ensure!(resp.code == 200, "rewrite {generation}: {} {}", resp.code, resp.brief());
        }
        let baseline = rss_bytes(pid)?;

        // The watch the agent never reads (held open, body untouched).
        let request = http::Request::get(format!("{path}?watch=true&timeoutSeconds=900"))
            .body(kube::client::Body::empty())?;
        let watch = agent.send(request).await.context("open the stalled watch")?;
        ensure!(watch.status() == 200, "watch: {}", watch.status());

        let mut peak = baseline;
        for generation in 11..11 + WATCH_FLOOD_WRITES {
            let resp = call(&agent, "PUT", &object, Some(&task(namespace, "flood", generation, WATCH_FLOOD_PAD, 0))).await?;
            ensure!(resp.code == 200, "rewrite {generation}: {} {}", resp.code, resp.brief());
            if generation % 10 == 0 {
                peak = peak.max(rss_bytes(pid)?);
            }
        }
        peak = peak.max(rss_bytes(pid)?);
        let cut = metric(&admin, "rlark_store_watches_cut_total").await?;
        eprintln!(
            "{WATCH_FLOOD_WRITES} rewrites of {WATCH_FLOOD_PAD} bytes with a stalled watch: RSS {} -> peak {} MiB; watches cut: {cut}",
            baseline / MIB,
            peak / MIB
        );

        // The watch was cut: what the kernel buffered is delivered, then an ERROR (410
        // Expired, so the client relists) ends the stream — well before the watch's timeout.
        let mut body = watch.into_body();
        let mut tail = Vec::new();
        let mut received = 0usize;
        let ended = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(frame) = body.frame().await {
                let frame = frame.context("read the watch")?;
                if let Ok(data) = frame.into_data() {
                    received += data.len();
                    tail.extend_from_slice(&data);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 4096);
                    }
                }
            }
            anyhow::Ok(())
        })
        .await;
        let tail_text = String::from_utf8_lossy(&tail).into_owned();
        let Ok(read) = ended else {
            bail!(
                "the stalled watch was not cut: still open after the flood ({} MiB read so far)",
                received as u64 / MIB
            );
        };
        read?;
        let last_line = tail_text.trim_end().rsplit('\n').next().unwrap_or_default();
        let last: Value = serde_json::from_str(last_line)
            .with_context(|| format!("last watch line is not JSON: {last_line:.200}"))?;
        ensure!(
            last["type"] == "ERROR" && last["object"]["code"] == 410,
            "the watch should end with a 410 ERROR event, got {last_line:.300}"
        );
        ensure!(
            (received as u64) < (WATCH_FLOOD_WRITES * WATCH_FLOOD_PAD) as u64 / 2,
            "the stalled watch was served {received} bytes: it was not cut early"
        );
        ensure!(cut >= 1, "rlark_store_watches_cut_total is {cut}");

        // Gone with the watch: memory it held is released.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let after = rss_bytes(pid)?;
        eprintln!("RSS after the watch ended: {} MiB", after / MIB);
        ensure!(
            peak.saturating_sub(baseline) < WATCH_FLOOD_RSS_BOUND,
            "server RSS grew by {} MiB during the flood (bound {} MiB)",
            peak.saturating_sub(baseline) / MIB,
            WATCH_FLOOD_RSS_BOUND / MIB
        );
        ensure!(
            after.saturating_sub(baseline) < WATCH_FLOOD_RSS_BOUND,
            "server RSS {} MiB above the baseline after the watch ended (bound {} MiB)",
            after.saturating_sub(baseline) / MIB,
            WATCH_FLOOD_RSS_BOUND / MIB
        );
        server.terminate()?;
        Ok(())
    })
    .await
}

/// The namespace byte quota of the large-object test (the default is 128 MiB; smaller here
/// so that the flood is short).
const NAMESPACE_QUOTA: u64 = 32 * MIB;

/// Issue 38, finding 2: "150 Tasks with a 2.9 MB env value each: +2.8 GiB memory, +401 MiB
/// disk in 51 s — the 10,000-object quota counts objects, not bytes."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_object_flood_is_refused_by_size_limits_and_byte_quota() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let server = spawn_server(
            dir.path(),
            &format!("api:\n  limits:\n    maxBytesPerAgentNamespace: {NAMESPACE_QUOTA}\n"),
        )?;
        let pid = server.pid();
        let admin = server.client().await?;
        let agent = join_agent(&server, &admin, dir.path(), "a").await?;
        let namespace = "rlark-a";
        let path = tasks_path(namespace);

        // The finding's Task: one 2.9 MB environment value. Refused before the write, 413,
        // naming the limit and the field.
        let resp = call(&agent, "POST", &path, Some(&task(namespace, "huge", 0, 0, 2_900_000))).await?;
        ensure!(
            resp.code == 413 && resp.json["reason"] == "RequestEntityTooLarge",
            "a Task with a 2.9 MB env value: {} {}",
            resp.code,
            resp.brief()
        );
        ensure!(
            resp.message().contains("spec.raw.environment") && resp.message().contains("maxEnvBytes"),
            "the 413 should name the field and the limit: {}",
            resp.message()
        );
        // The whole spec is limited too (here by a 2 MB input).
        let resp = call(&agent, "POST", &path, Some(&task(namespace, "huge", 0, 2_000_000, 0))).await?;
        ensure!(
            resp.code == 413 && resp.message().contains("maxSpecBytes"),
            "a Task with a 2 MB spec: {} {}",
            resp.code,
            resp.brief()
        );

        let baseline = rss_bytes(pid)?;
        let db_baseline = database_bytes(&dir.path().join("data"));
        // Many Tasks each within the limits (200 kB env, 250 kB input): accepted until the
        // namespace's byte quota, then 429 naming it.
        let mut created = 0usize;
        let mut refused: Option<Resp> = None;
        for i in 0..150 {
            let resp = call(&agent, "POST", &path, Some(&task(namespace, &format!("t{i}"), i, 250_000, 200_000))).await?;
            match resp.code {
                201 => created += 1,
                _ => {
                    refused = Some(resp);
                    break;
                }
            }
        }
        let Some(refused) = refused else {
            bail!("150 Tasks of 450 kB were all accepted: no byte quota");
        };
        ensure!(
            refused.code == 429 && refused.message().contains("maxBytesPerAgentNamespace"),
            "over the quota: {} {}",
            refused.code,
            refused.brief()
        );
        ensure!(
            refused.message().contains(namespace),
            "the 429 should name the namespace: {}",
            refused.message()
        );
        let stored = created as u64 * 450_000;
        ensure!(
            stored <= NAMESPACE_QUOTA + MIB,
            "{created} Tasks ({stored} bytes) stored past a {NAMESPACE_QUOTA}-byte quota"
        );
        // Updates cannot grow past the quota either: less than one more Task fits, and this
        // grows t0 by more than one (to 1.04 MB, within the spec limit).
        let resp = call(&agent, "PUT", &format!("{path}/t0"), Some(&task(namespace, "t0", 1, 840_000, 200_000))).await?;
        ensure!(
            resp.code == 429 && resp.message().contains("maxBytesPerAgentNamespace"),
            "growing a Task over the quota: {} {}",
            resp.code,
            resp.brief()
        );

        let rss = rss_bytes(pid)?;
        let db = database_bytes(&dir.path().join("data"));
        eprintln!(
            "{created} Tasks accepted before the quota; RSS {} -> {} MiB; database + WAL {} -> {} MiB",
            baseline / MIB,
            rss / MIB,
            db_baseline / MIB,
            db / MIB
        );
        // Stored: at most the quota (32 MiB of JSON). In memory each object is held as JSON
        // and as a parsed value, and again in the in-process controllers' caches (about 3×
        // the quota); the change log (64 MiB) and the shared watch lines (16 MiB) have
        // budgets of their own. Stated bound: 6× the quota + 128 MiB (measured: ~260 MiB).
        let bound = 6 * NAMESPACE_QUOTA + 128 * MIB;
        ensure!(
            rss.saturating_sub(baseline) < bound,
            "RSS grew by {} MiB for a {} MiB quota (bound {} MiB)",
            rss.saturating_sub(baseline) / MIB,
            NAMESPACE_QUOTA / MIB,
            bound / MIB
        );
        ensure!(
            db.saturating_sub(db_baseline) < 4 * NAMESPACE_QUOTA,
            "database grew by {} MiB for a {} MiB quota",
            db.saturating_sub(db_baseline) / MIB,
            NAMESPACE_QUOTA / MIB
        );
        server.terminate()?;
        Ok(())
    })
    .await
}

/// Issue 38, finding 2: "reports are capped per task, not per namespace": an agent posting
/// the largest reports to every Task of its namespace is refused once the namespace holds
/// `maxReportBytesPerNamespace`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_flood_is_capped_per_namespace() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let quota = 2 * MIB;
        let server = spawn_server(
            dir.path(),
            &format!("api:\n  limits:\n    maxReportBytesPerNamespace: {quota}\n"),
        )?;
        let admin = server.client().await?;
        let agent = join_agent(&server, &admin, dir.path(), "a").await?;
        let namespace = "rlark-a";
        let path = tasks_path(namespace);
        for i in 0..4 {
            let resp = call(
                &agent,
                "POST",
                &path,
                Some(&task(namespace, &format!("r{i}"), i, 0, 0)),
            )
            .await?;
            ensure!(
                resp.code == 201,
                "create Task r{i}: {} {}",
                resp.code,
                resp.brief()
            );
        }
        // 15 kB reports round-robin over the Tasks: each Task stays far below its own cap
        // (1000 reports); the namespace must not.
        let report = json!({"type": "reward", "pad": "r".repeat(15_000)});
        let mut posted = 0u64;
        let mut refused = None;
        for i in 0..400 {
            let url = format!("/rlark/v1/namespaces/{namespace}/tasks/r{}/reports", i % 4);
            let resp = call(&agent, "POST", &url, Some(&report)).await?;
            if (200..300).contains(&resp.code) {
                posted += 1;
            } else {
                refused = Some(resp);
                break;
            }
        }
        let Some(refused) = refused else {
            bail!(
                "400 reports of 15 kB ({} MiB) were all accepted in one namespace",
                400 * 15_000 / MIB
            );
        };
        ensure!(
            refused.code == 429 && refused.message().contains("maxReportBytesPerNamespace"),
            "over the namespace's report quota: {} {}",
            refused.code,
            refused.brief()
        );
        ensure!(
            posted * 15_000 <= quota + 64 * 1024,
            "{posted} reports stored past a {quota}-byte quota"
        );
        server.terminate()?;
        Ok(())
    })
    .await
}
