//! Issue 14, finding 3: an agent rewriting one large object many times cannot grow the
//! server's memory without bound. The probe updated a 2.9 MB Event 400 times (+1,085 MiB);
//! Events are now capped (16 KiB), so the flood here uses the largest object an agent may
//! still write, a Lease with 256 KiB of annotations (Kubernetes' annotation limit), 400
//! times: the store's change log stays within its byte budget, and so does the process's
//! resident memory. Alone in its test binary, so that nothing else moves the RSS.

#[path = "support/raw_api.rs"]
mod raw_api;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use rlark_agent::join::{AGENT_KUBECONFIG, JoinOptions};
use rlark_testkit::{TestServer, client_from_kubeconfig};
use serde_json::{Value, json};

const TEST_TIMEOUT: Duration = Duration::from_secs(300);
/// The store's change-log byte budget in this test.
const LOG_BUDGET: usize = 4 * 1024 * 1024;
const UPDATES: usize = 400;
/// Annotation bytes per write: just under Kubernetes' 256 KiB total.
const PAD: usize = 250 * 1024;

/// `method path` with a JSON `body`: the status and at most 400 characters of the answer
/// (enough for a Status, not a whole echoed object).
async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: &Value,
) -> Result<(u16, String)> {
    let resp = raw_api::call(client, method, path, Some(body)).await?;
    Ok((resp.code, resp.brief()))
}

async fn get_text(client: &kube::Client, path: &str) -> Result<String> {
    let resp = raw_api::send(client, "GET", path, &[], Vec::new()).await?;
    ensure!((200..300).contains(&resp.code), "GET {path}: {}", resp.code);
    Ok(resp.text)
}

/// `VmRSS` of this process (the server runs in it), in bytes.
fn rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
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

/// A gauge from the server's `/metrics`.
async fn metric(admin: &kube::Client, name: &str) -> Result<u64> {
    let text = get_text(admin, "/metrics").await?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .with_context(|| format!("no {name} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_rewriting_a_large_object_leaves_memory_and_disk_bounded() -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let dir = tempfile::tempdir()?;
        let mut config = TestServer::config_for(dir.path());
        config.store_log_capacity_bytes = LOG_BUDGET;
        let server = TestServer::start_with(config).await?;
        let admin = server.client().await?;

        // Agent `a` joins; it may write Leases and Events in rlark-a.
        let minted = send(
            &admin,
            "POST",
            "/rlark/v1/tokens",
            &json!({"kind": "bootstrap", "ttlSeconds": 600, "clusterID": "a"}),
        )
        .await?;
        ensure!(minted.0 == 201 || minted.0 == 200, "token: {minted:?}");
        let minted: Value = serde_json::from_str(&minted.1)?;
        let agent_dir = dir.path().join("agent-a");
        rlark_agent::join::join(&JoinOptions {
            server: server.url(),
            token: minted["token"].as_str().context("token")?.to_string(),
            ca_hash: minted["caHash"].as_str().context("caHash")?.to_string(),
            cluster_id: None,
            dir: agent_dir.clone(),
        })
        .await?;
        let agent = client_from_kubeconfig(&agent_dir.join(AGENT_KUBECONFIG)).await?;

        // The Event: 2.9 MB is refused now.
        let events = "/api/v1/namespaces/rlark-a/events";
        let event = |message: String| {
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "big"},
                   "involvedObject": {"kind": "Pod", "name": "p", "namespace": "rlark-a"},
                   "reason": "Flood", "message": message, "type": "Normal"})
        };
        let (code, text) = send(&agent, "POST", events, &event("m".repeat(2_900_000))).await?;
        ensure!(code == 422 && text.contains("message"), "2.9 MB Event: {code} {text}");

        let lease_path = "/apis/coordination.k8s.io/v1/namespaces/rlark-a/leases";
        let lease = |i: usize| {
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                   "metadata": {"name": "flood", "annotations": {"pad": format!("{i}{}", "x".repeat(PAD))}},
                   "spec": {"holderIdentity": "a"}})
        };
        let (code, text) = send(&agent, "POST", lease_path, &lease(0)).await?;
        ensure!(code == 201, "create lease: {code} {text}");
        // Warm up allocator and caches with a few writes before the baseline.
        for i in 1..=10 {
            let (code, text) = send(&agent, "PUT", &format!("{lease_path}/flood"), &lease(i)).await?;
            ensure!(code == 200, "update: {code} {text}");
        }
        let rss_before = rss_bytes()?;
        let disk = |dir: &std::path::Path| -> u64 {
            ["rlark.db", "rlark.db-wal"]
                .iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|m| m.len())
                .sum()
        };
        for i in 11..11 + UPDATES {
            let (code, text) = send(&agent, "PUT", &format!("{lease_path}/flood"), &lease(i)).await?;
            ensure!(code == 200, "update {i}: {code} {text}");
        }
        let rss_after = rss_bytes()?;
        let log_bytes = metric(&admin, "rlark_store_change_log_bytes").await?;
        let log_events = metric(&admin, "rlark_store_change_log_events").await?;
        let disk_after = disk(dir.path());
        let growth = rss_after.saturating_sub(rss_before);
        let written = (UPDATES * PAD) as u64;
        eprintln!(
            "{UPDATES} writes of {PAD} bytes ({} MiB in all): change log {log_events} events, {log_bytes} bytes \
             (budget {LOG_BUDGET}); RSS {} -> {} MiB (+{} MiB); database + WAL {} MiB",
            written >> 20,
            rss_before >> 20,
            rss_after >> 20,
            growth >> 20,
            disk_after >> 20,
        );
        ensure!(
            log_bytes <= LOG_BUDGET as u64,
            "the change log holds {log_bytes} bytes, over its {LOG_BUDGET} budget"
        );
        // Unbounded, the log kept every write (> 100 MiB); bounded, it keeps 4 MiB. The rest
        // of the margin is allocator slack and request buffers.
        ensure!(
            growth < written / 2,
            "RSS grew by {} MiB while {} MiB were written",
            growth >> 20,
            written >> 20
        );
        // The database keeps the current Lease; the WAL is checkpointed (every ~4 MB).
        ensure!(disk_after < 32 * 1024 * 1024, "database + WAL hold {disk_after} bytes");
        server.stop().await
    })
    .await
    .context("test hang guard")?
}
