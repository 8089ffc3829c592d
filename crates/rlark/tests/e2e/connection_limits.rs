//! Lock-out without credentials (issue 14, finding 1): crowds of slowloris and
//! handshake-then-silence connections larger than the connection caps do not lock the
//! administrator or health probes out, and the slow connections are closed by the server's
//! timeouts. Small caps and short timeouts are set in the server config; every loop is
//! bounded in count and time, and nothing asserts how fast the server is.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use rlark_testkit::TestServer;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

/// Hang guard of the whole test.
const TEST_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the crowds keep attacking.
const ATTACK: Duration = Duration::from_secs(12);
/// A connection the server has not closed after this long counts as held (the failure).
const HELD: Duration = Duration::from_secs(40);
/// Deadline of each admin or probe request.
const REQUEST_DEADLINE: Duration = Duration::from_secs(20);
/// Workers of each crowd (more than a source IP's budget plus its reserve share).
const CROWD: usize = 12;

const GLOBAL_CAP: usize = 8;
const PER_IP_CAP: usize = 4;
const RESERVE: usize = 9;
const RESERVE_PER_IP: usize = 3;

const ATTACKER_SLOW: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const ATTACKER_SILENT: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

/// TLS client config trusting the server's CA, without a client certificate.
fn anonymous_tls(data_dir: &Path, alpn: &[u8]) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(data_dir.join("pki/ca.crt")).context("ca.crt")? {
        roots.add(cert.context("ca.crt")?)?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(Arc::new(config))
}

/// TCP from `source` to `addr`.
async fn connect_from(source: IpAddr, addr: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    Ok(socket.connect(addr).await?)
}

/// TLS handshake over `tcp` (bounded).
async fn handshake(
    tcp: TcpStream,
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>> {
    let name = ServerName::IpAddress(addr.ip().into());
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
    Ok(tokio::time::timeout(REQUEST_DEADLINE, connector.connect(name, tcp)).await??)
}

/// Until the server closes `stream` (EOF or error) or `limit` passes: true if it closed.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> bool {
    let mut buf = [0u8; 1024];
    let until = Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // An error response (e.g. 408) before the close is fine.
            Ok(Ok(_)) => {}
        }
    }
}

#[derive(Default)]
struct Tally {
    /// Connections that completed the TLS handshake.
    handshaken: AtomicU64,
    /// Connections closed by the server (before or after the handshake).
    closed: AtomicU64,
    /// Connections refused before the handshake completed.
    refused: AtomicU64,
    /// Connections still open after [`HELD`]: the server never closed them.
    held: AtomicU64,
}

/// A [`Tally`] counter's value.
fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// One slowloris worker: TLS handshake from [`ATTACKER_SLOW`], then a request head one byte
/// every second, reconnecting whenever the server closes, until `stop`.
async fn slowloris(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    tally: Arc<Tally>,
    stop: Instant,
) {
    const HEAD: &[u8] = b"GET /api/v1/namespaces HTTP/1.1\r\nHost: rlark\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    while Instant::now() < stop {
        let Ok(tcp) = connect_from(ATTACKER_SLOW, addr).await else {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let Ok(tls) = handshake(tcp, addr, &tls).await else {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        tally.handshaken.fetch_add(1, Ordering::Relaxed);
        let (mut read, mut write) = tokio::io::split(tls);
        let trickle = async {
            for byte in HEAD.iter().cycle().take(1000) {
                if write.write_all(&[*byte]).await.is_err() || write.flush().await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            std::future::pending::<()>().await;
        };
        let closed = tokio::select! {
            closed = closed_by_server(&mut read, HELD) => closed,
            () = trickle => unreachable!("trickle never ends"),
        };
        if closed {
            tally.closed.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.held.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// One silent worker: TCP connect from [`ATTACKER_SILENT`], send nothing, wait for the
/// server to close, reconnect until `stop`.
async fn silent(addr: SocketAddr, tally: Arc<Tally>, stop: Instant) {
    while Instant::now() < stop {
        let Ok(mut tcp) = connect_from(ATTACKER_SILENT, addr).await else {
            tally.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        if closed_by_server(&mut tcp, HELD).await {
            tally.closed.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.held.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /healthz` over a fresh anonymous HTTP/1.1 connection from 127.0.0.1.
async fn probe_healthz(addr: SocketAddr, tls: &Arc<rustls::ClientConfig>) -> Result<String> {
    let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await?;
    let mut tls = handshake(tcp, addr, tls).await?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: rlark\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    tokio::time::timeout(REQUEST_DEADLINE, tls.read_to_end(&mut response))
        .await
        .context("healthz response")??;
    let text = String::from_utf8_lossy(&response).into_owned();
    ensure!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
        "healthz answered {text:?}"
    );
    Ok(text)
}

/// A metric's value from the Prometheus text of `/metrics`.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crowds_beyond_the_caps_do_not_lock_out_admin_or_health() -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, run())
        .await
        .context("test did not finish in time")?
}

async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(dir.path());
    config.tls_handshake_timeout = Duration::from_secs(2);
    let limits = &mut config.connections;
    limits.max_connections = Some(GLOBAL_CAP);
    limits.max_connections_per_ip = PER_IP_CAP;
    limits.reserved_connections = RESERVE;
    limits.reserved_connections_per_ip = RESERVE_PER_IP;
    limits.reserve_deadline = Duration::from_secs(10);
    limits.header_read_timeout = Duration::from_secs(2);
    limits.idle_timeout = Duration::from_secs(4);
    let server = TestServer::start_with(config).await?;
    let addr = server.addr();
    let h1 = anonymous_tls(dir.path(), b"http/1.1")?;
    let h2 = anonymous_tls(dir.path(), b"h2")?;

    // A watch that sees nothing for longer than the idle timeout is not cut: it gets the
    // event that comes after that quiet time.
    let watcher = server.client().await?;
    let namespaces: Api<Namespace> = Api::all(watcher);
    let version = namespaces
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .context("list resourceVersion")?;
    let mut watch = namespaces
        .watch(&WatchParams::default().timeout(120), &version)
        .await?
        .boxed();

    // The crowds.
    let stop = Instant::now() + ATTACK;
    let slow = Arc::new(Tally::default());
    let quiet = Arc::new(Tally::default());
    let mut crowd = tokio::task::JoinSet::new();
    for _ in 0..CROWD {
        crowd.spawn(slowloris(addr, Arc::clone(&h1), Arc::clone(&slow), stop));
        crowd.spawn(silent(addr, Arc::clone(&quiet), stop));
    }
    // Let the crowds fill the budget.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Meanwhile the administrator works: each round on a fresh connection (so it has to be
    // admitted while the caps are hit), plus an anonymous health probe.
    let mut rounds = 0;
    let mut max_general = 0;
    let mut max_reserve = 0;
    while Instant::now() < stop && rounds < 30 {
        rounds += 1;
        let admin = server.client().await?;
        let listed = tokio::time::timeout(
            REQUEST_DEADLINE,
            Api::<Namespace>::all(admin.clone()).list(&ListParams::default()),
        )
        .await
        .with_context(|| format!("round {rounds}: admin list timed out"))?
        .with_context(|| format!("round {rounds}: admin list failed"))?;
        ensure!(!listed.items.is_empty(), "no namespaces listed");
        let metrics = tokio::time::timeout(
            REQUEST_DEADLINE,
            admin.request_text(http::Request::get("/metrics").body(Vec::new())?),
        )
        .await
        .with_context(|| format!("round {rounds}: /metrics timed out"))??;
        max_general = max_general.max(metric(&metrics, "rlark_connections_open").unwrap_or(0));
        max_reserve =
            max_reserve.max(metric(&metrics, "rlark_connections_reserve_open").unwrap_or(0));
        drop(admin);
        probe_healthz(addr, &h1)
            .await
            .with_context(|| format!("round {rounds}: /healthz"))?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ensure!(rounds >= 3, "only {rounds} admin rounds ran");
    ensure!(
        max_general == GLOBAL_CAP as u64,
        "the crowds never filled the general budget (max {max_general} of {GLOBAL_CAP} open)"
    );
    ensure!(
        max_reserve > 0,
        "no connection was ever admitted to the reserve"
    );

    // Every crowd worker ends: its last connection is closed by the server or counted as
    // held after HELD.
    while let Some(done) = crowd.join_next().await {
        done?;
    }
    let (s, q) = (&slow, &quiet);
    println!(
        "slowloris: handshaken {} closed {} refused {} held {}; silent: closed {} held {}",
        get(&s.handshaken),
        get(&s.closed),
        get(&s.refused),
        get(&s.held),
        get(&q.closed),
        get(&q.held),
    );
    ensure!(
        get(&s.held) == 0 && get(&q.held) == 0,
        "connections held open past {HELD:?}: slowloris {}, silent {}",
        get(&s.held),
        get(&q.held)
    );
    ensure!(
        get(&s.handshaken) > 0 && get(&s.closed) == get(&s.handshaken),
        "slowloris connections not closed by the header-read timeout"
    );
    ensure!(
        get(&s.refused) > 0,
        "the per-IP cap never refused a slowloris connection"
    );

    // An HTTP/2 connection that never sends a request is closed too.
    let tcp = connect_from(IpAddr::V4(Ipv4Addr::LOCALHOST), addr).await?;
    let mut silent_h2 = handshake(tcp, addr, &h2).await?;
    ensure!(
        silent_h2.get_ref().1.alpn_protocol() == Some(b"h2"),
        "h2 not negotiated"
    );
    ensure!(
        closed_by_server(&mut silent_h2, HELD).await,
        "a silent HTTP/2 connection was held open past {HELD:?}"
    );

    // The quiet watch still works.
    let created = tokio::time::timeout(
        REQUEST_DEADLINE,
        Api::<Namespace>::all(server.client().await?).create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "after-quiet"}}))?,
        ),
    )
    .await??;
    let name = created.metadata.name.context("name")?;
    let seen = tokio::time::timeout(REQUEST_DEADLINE, async {
        while let Some(event) = watch.try_next().await? {
            if let WatchEvent::Added(ns) = event
                && ns.metadata.name.as_deref() == Some(name.as_str())
            {
                return Ok::<_, anyhow::Error>(true);
            }
        }
        Ok(false)
    })
    .await
    .context("watch: no event")??;
    ensure!(seen, "the watch ended before the namespace was created");

    server.stop().await?;
    Ok(())
}
