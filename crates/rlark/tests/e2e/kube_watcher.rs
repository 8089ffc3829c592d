//! kube-runtime's `watcher` (what every kube-rs controller is built on) against rlark:
//! it must survive a server restart without relisting, and a compacted revision with
//! exactly one relist, then keep streaming.
//!
//! The watcher reaches the server through a small TCP proxy the test controls, so the
//! test can hold the watch connection still while the server's change log is compacted
//! past the watcher's revision, then cut it: a deterministic way to make the watcher come
//! back with an expired resourceVersion.
//!
//! The restart tests run on SQLite and on PostgreSQL (a throwaway cluster; without the
//! PostgreSQL binaries that case skips, or fails under `CI=true`,
//! `tests/support/missing_tool.rs`).

use crate::missing_tool;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use rlark_testkit::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

fn jobs() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rlinf.io", "v1alpha1", "Job"),
        "jobs",
    )
}

fn job(name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"tasks": [{"name": "actor", "role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}}]}
    }))?)
}

/// A TCP forwarder that can be paused (stops moving bytes) and severed (drops every
/// connection it carries).
struct Proxy {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    generation: std::sync::Mutex<CancellationToken>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Result<Arc<Proxy>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let (paused, _) = watch::channel(false);
        let proxy = Arc::new(Proxy {
            addr: listener.local_addr()?,
            paused,
            generation: std::sync::Mutex::new(CancellationToken::new()),
        });
        let p = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let cancel = p.generation.lock().expect("lock").clone();
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, p.paused.subscribe(), cancel.clone()));
                tokio::spawn(pump(sr, cw, p.paused.subscribe(), cancel));
            }
        });
        Ok(proxy)
    }

    fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    fn sever(&self) {
        let mut generation = self.generation.lock().expect("lock");
        generation.cancel();
        *generation = CancellationToken::new();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
    cancel: CancellationToken,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = cancel.cancelled() => return,
            n = from.read(&mut buf) => match n { Ok(0) | Err(_) => return, Ok(n) => n },
        };
        // Bytes read while paused are held (and dropped by a sever). Checking after the
        // read, not before, matters: under load this task may read bytes that were sent
        // after `pause(true)` returned, and those must not get through. A sever that comes
        // together with the unpause must win, hence `biased` and the check below.
        while *paused.borrow_and_update() {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                changed = paused.changed() => if changed.is_err() { return },
            }
        }
        if cancel.is_cancelled() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[derive(Debug)]
enum Seen {
    Init,
    InitApply(String),
    InitDone,
    Apply(String),
    Delete,
}

async fn next_apply(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    name: &str,
    inits: &mut usize,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .with_context(|| format!("watcher never delivered {name}"))?
            .context("watcher ended")?;
        match seen {
            Seen::Init => *inits += 1,
            Seen::Apply(n) | Seen::InitApply(n) if n == name => return Ok(()),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_survives_restart_and_compaction() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(dir.path());
    // A tiny change log so that a few writes compact past a stalled watcher.
    config.store_log_capacity = 5;
    let server = TestServer::start_with(config.clone()).await?;
    let addr = server.addr();
    config.listen = addr; // restart on the same port
    let admin = server.client().await?;
    let writer: Api<DynamicObject> = Api::all_with(admin, &jobs());

    let proxy = Proxy::start(addr).await?;
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig_path())?;
    let mut proxied = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    proxied.cluster_url = format!("https://{}", proxy.addr).parse()?;
    let watched: Api<DynamicObject> = Api::all_with(kube::Client::try_from(proxied)?, &jobs());

    let (tx, mut rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let watcher_task = tokio::spawn(async move {
        let mut stream = watcher::watcher(watched, watcher::Config::default()).boxed();
        loop {
            let item =
                tokio::select! { _ = stopped.cancelled() => return, item = stream.next() => item };
            let Some(item) = item else { return };
            let seen = match item {
                Ok(Event::Init) => Seen::Init,
                Ok(Event::InitApply(o)) => Seen::InitApply(o.metadata.name.unwrap_or_default()),
                Ok(Event::InitDone) => Seen::InitDone,
                Ok(Event::Apply(o)) => Seen::Apply(o.metadata.name.unwrap_or_default()),
                Ok(Event::Delete(_)) => Seen::Delete,
                Err(_) => continue, // errors are retried by the watcher itself
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });

    let mut inits = 0usize;
    writer
        .create(&PostParams::default(), &job("before-restart")?)
        .await?;
    next_apply(&mut rx, "before-restart", &mut inits).await?;
    assert_eq!(inits, 1, "one initial list");

    // 1. Restart: the watcher reconnects from its revision; no relist.
    server.stop().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = TestServer::start_with(config.clone()).await?;
    let writer: Api<DynamicObject> = Api::all_with(server.client().await?, &jobs());
    writer
        .create(&PostParams::default(), &job("after-restart")?)
        .await?;
    next_apply(&mut rx, "after-restart", &mut inits).await?;
    assert_eq!(inits, 1, "a server restart must not force a relist");

    // 2. Compaction: hold the watch still, write past the change log, cut the connection.
    proxy.pause(true);
    for i in 0..20 {
        writer
            .create(&PostParams::default(), &job(&format!("while-stalled-{i}"))?)
            .await?;
    }
    proxy.sever();
    proxy.pause(false);
    // The watcher comes back with an expired revision, gets the in-stream 410 and relists.
    next_apply(&mut rx, "while-stalled-19", &mut inits).await?;
    assert_eq!(
        inits, 2,
        "an expired revision must cause exactly one relist"
    );

    // 3. Then it streams again.
    writer
        .create(&PostParams::default(), &job("after-relist")?)
        .await?;
    next_apply(&mut rx, "after-relist", &mut inits).await?;
    assert_eq!(inits, 2, "no further relist after recovering");

    stop.cancel();
    watcher_task.await?;
    server.stop().await?;
    if inits != 2 {
        bail!("unexpected relist count {inits}");
    }
    Ok(())
}

fn leases() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
        "leases",
    )
}

fn lease(name: &str, holder: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
    }))?)
}

/// Renew `name` (a Lease, as leader election and agent heartbeats do): one write each.
async fn renew(api: &Api<DynamicObject>, name: &str, times: usize) -> Result<()> {
    for i in 0..times {
        let mut current = api.get(name).await?;
        current.data["spec"]["renewTime"] =
            serde_json::json!(format!("2026-01-01T00:00:{:02}.000000Z", i % 60));
        api.replace(name, &PostParams::default(), &current).await?;
    }
    Ok(())
}

/// The watcher's revision lags the store's when other resources are written after its last
/// event (Leases renewed by leader election, agent heartbeats): a restart must still not make
/// it relist, because the change log is persisted and the watch resumes from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_after_restart_with_lease_and_heartbeat_writes_in_between() -> Result<()> {
    resume_after_restart(None).await
}

/// The same on PostgreSQL (`rlark server --store postgres://...`) against a throwaway cluster;
/// the SQLite file is never created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_resumes_after_restart_on_postgres() -> Result<()> {
    let Some(bin) = rlark_testkit::postgres::find_bin() else {
        missing_tool::skip_or_fail(
            "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
        );
        return Ok(());
    };
    let cluster = rlark_testkit::postgres::PgCluster::start(&bin);
    cluster.create_database("rlark");
    resume_after_restart(Some(cluster.url("rlark"))).await?;

    // PostgreSQL lost: /readyz turns 503 and writes are answered 503 with Retry-After;
    // PostgreSQL back: the same server recovers by itself.
    // A database of its own: the first one belongs to the installation above, and a server
    // with another data directory (another CA) refuses it (docs/security.md).
    cluster.create_database("outage");
    let dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(dir.path());
    config.store_url = Some(cluster.url("outage"));
    let server = TestServer::start_with(config).await?;
    // kube-rs retries a 503 after its Retry-After by default; this test wants to see it.
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig_path())?;
    let mut client_config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    client_config.default_retry = false;
    let admin = kube::Client::try_from(client_config)?;
    assert_eq!(probe(&admin, "/readyz").await?, http::StatusCode::OK);
    cluster.pause();
    let (status, retry_after) = post_lease(&admin, "during-outage").await?;
    assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE);
    assert!(retry_after.is_some(), "503 without Retry-After");
    assert_eq!(
        probe(&admin, "/readyz").await?,
        http::StatusCode::SERVICE_UNAVAILABLE
    );
    cluster.resume();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while probe(&admin, "/readyz").await? != http::StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "/readyz did not recover"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, _) = post_lease(&admin, "after-outage").await?;
    assert_eq!(status, http::StatusCode::CREATED);
    server.stop().await?;
    Ok(())
}

async fn probe(client: &kube::Client, path: &str) -> Result<http::StatusCode> {
    let request = http::Request::get(path).body(kube::client::Body::empty())?;
    Ok(client.send(request).await?.status())
}

/// Create a Lease with a raw request: the status and the `Retry-After` header.
async fn post_lease(
    client: &kube::Client,
    name: &str,
) -> Result<(http::StatusCode, Option<String>)> {
    let body = serde_json::to_vec(&lease(name, "probe")?)?;
    let request = http::Request::post("/apis/coordination.k8s.io/v1/namespaces/default/leases")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(body))?;
    let response = client.send(request).await?;
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Ok((response.status(), retry_after))
}

async fn resume_after_restart(store_url: Option<String>) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(dir.path());
    config.store_url = store_url.clone();
    // No periodic bookmark may move the watcher's revision up to the store's: the test wants
    // the lag that background writes cause.
    config.api.bookmark_interval = Duration::from_secs(3600);
    let server = TestServer::start_with(config.clone()).await?;
    config.listen = server.addr(); // restart on the same port
    let admin = server.client().await?;
    let writer: Api<DynamicObject> = Api::all_with(admin.clone(), &jobs());
    let lease_api: Api<DynamicObject> = Api::namespaced_with(admin, "default", &leases());
    let watched: Api<DynamicObject> = Api::all_with(server.client().await?, &jobs());

    let (tx, mut rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let watcher_task = tokio::spawn(async move {
        let mut stream = watcher::watcher(watched, watcher::Config::default()).boxed();
        loop {
            let item =
                tokio::select! { _ = stopped.cancelled() => return, item = stream.next() => item };
            let Some(item) = item else { return };
            let seen = match item {
                Ok(Event::Init) => Seen::Init,
                Ok(Event::InitApply(o)) => Seen::InitApply(o.metadata.name.unwrap_or_default()),
                Ok(Event::InitDone) => Seen::InitDone,
                Ok(Event::Apply(o)) => Seen::Apply(o.metadata.name.unwrap_or_default()),
                Ok(Event::Delete(_)) => Seen::Delete,
                Err(_) => continue, // errors are retried by the watcher itself
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });

    let mut inits = 0usize;
    let before = writer
        .create(&PostParams::default(), &job("before-restart")?)
        .await?;
    next_apply(&mut rx, "before-restart", &mut inits).await?;
    assert_eq!(inits, 1, "one initial list");
    let watcher_revision: u64 = before
        .metadata
        .resource_version
        .context("resourceVersion")?
        .parse()?;

    // Background writes to other resources: a leader-election Lease and node heartbeats.
    lease_api
        .create(
            &PostParams::default(),
            &lease("rlark-test-leader", "replica-1")?,
        )
        .await?;
    lease_api
        .create(&PostParams::default(), &lease("node-heartbeat", "agent-1")?)
        .await?;
    renew(&lease_api, "rlark-test-leader", 5).await?;
    renew(&lease_api, "node-heartbeat", 5).await?;
    let revision: u64 = lease_api
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .context("list resourceVersion")?
        .parse()?;
    assert!(
        revision >= watcher_revision + 12,
        "the store ({revision}) must be ahead of the watcher ({watcher_revision})"
    );

    server.stop().await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = TestServer::start_with(config.clone()).await?;
    let admin = server.client().await?;
    // More heartbeats right after the restart, before the watcher is back.
    let lease_api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &leases());
    renew(&lease_api, "node-heartbeat", 3).await?;
    let writer: Api<DynamicObject> = Api::all_with(admin, &jobs());
    writer
        .create(&PostParams::default(), &job("after-restart")?)
        .await?;
    next_apply(&mut rx, "after-restart", &mut inits).await?;
    assert_eq!(
        inits, 1,
        "a restart with background writes in between must not force a relist"
    );
    renew(&lease_api, "rlark-test-leader", 3).await?;
    writer
        .create(&PostParams::default(), &job("later")?)
        .await?;
    next_apply(&mut rx, "later", &mut inits).await?;
    assert_eq!(inits, 1, "still no relist");

    stop.cancel();
    watcher_task.await?;
    server.stop().await?;
    assert_eq!(
        dir.path().join(rlark_server::DATABASE_FILE).exists(),
        store_url.is_none(),
        "the SQLite file exists only when SQLite is the store"
    );
    Ok(())
}
