//! Durability: a write acknowledged to a client survives `kill -9` of the server.
//!
//! Writers create objects concurrently through the real binary over HTTPS; the server is
//! killed with SIGKILL while they are still writing; it is restarted on the same data dir
//! and every acknowledged object must be there, with the revision continuing upward.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use rlark_testkit::ServerProcess;

fn domains_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rlinf.io", "v1alpha1", "Domain"),
        "domains",
    )
}

async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

fn domain(name: &str, i: usize) -> Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Domain",
        "metadata": {"name": name},
        "spec": {"cidr": format!("10.{}.{}.0/24", (i / 256) % 256, i % 256)}
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let data_dir = tempfile::tempdir()?;
    let binary = Path::new(env!("CARGO_BIN_EXE_rlark"));
    let mut server = ServerProcess::spawn(binary, data_dir.path())?;
    let client = client_for(server.kubeconfig_path()).await?;
    let api: Api<DynamicObject> = Api::all_with(client, &domains_resource());

    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..8 {
        let api = api.clone();
        let acknowledged = acknowledged.clone();
        writers.push(tokio::spawn(async move {
            // Bounded: at most 2,000 writes per writer; the kill ends it much sooner.
            for i in 0..2000 {
                let name = format!("d-{w}-{i}");
                let Ok(object) = domain(&name, w * 2000 + i) else {
                    return;
                };
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => acknowledged.lock().expect("lock").push(name),
                    Err(_) => return, // the server is gone
                }
            }
        }));
    }
    // Let the writers get going, then kill mid-stream.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while acknowledged.lock().expect("lock").len() < 300 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "writers made no progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill_9()?;
    for writer in writers {
        writer.await?;
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(acknowledged.len() >= 300);

    let server = ServerProcess::spawn(binary, data_dir.path())?;
    let client = client_for(server.kubeconfig_path()).await?;
    let api: Api<DynamicObject> = Api::all_with(client, &domains_resource());
    let listed = api
        .list(&ListParams::default())
        .await
        .context("list after restart")?;
    let present: std::collections::HashSet<String> = listed
        .items
        .iter()
        .filter_map(|d| d.metadata.name.clone())
        .collect();
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !present.contains(*n))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost after kill -9, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );

    // Revisions keep increasing after the restart.
    let before: u64 = listed
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()?;
    let created = api
        .create(&PostParams::default(), &domain("after-restart", 60_000)?)
        .await?;
    let after: u64 = created
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("0")
        .parse()?;
    assert!(
        after > before,
        "revision went backwards: {after} <= {before}"
    );
    server.terminate()?;
    Ok(())
}
