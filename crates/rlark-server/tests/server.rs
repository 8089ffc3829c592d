//! The server process end to end over real TLS on loopback: health, metrics, anonymous
//! access, HTTP/2, restart on the same data directory, graceful shutdown.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rlark_server::{RunningServer, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn config(dir: &Path) -> ServerConfig {
    let mut config = ServerConfig::new(dir);
    config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    config.shutdown_grace = Duration::from_secs(5);
    config
}

/// Who the test client claims to be.
enum ClientCert<'a> {
    None,
    /// The admin certificate the server wrote into its data directory.
    Admin,
    /// PEM cert + key from elsewhere.
    Pem(&'a str, &'a str),
}

struct Reply {
    status: u16,
    body: String,
    version: http::Version,
}

/// One GET over a fresh TLS connection that trusts only the server's CA.
async fn get(
    server: &RunningServer,
    path: &str,
    cert: ClientCert<'_>,
    http2: bool,
) -> anyhow::Result<Reply> {
    let pki = server.data_dir.join("pki");
    let ca = CertificateDer::from_pem_file(pki.join("ca.crt"))?;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let (cert_pem, key_pem) = match cert {
        ClientCert::None => (None, None),
        ClientCert::Admin => (
            Some(std::fs::read_to_string(pki.join("admin.crt"))?),
            Some(std::fs::read_to_string(pki.join("admin.key"))?),
        ),
        ClientCert::Pem(c, k) => (Some(c.to_string()), Some(k.to_string())),
    };
    let mut tls = match (cert_pem, key_pem) {
        (Some(c), Some(k)) => builder.with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(c.as_bytes())?],
            PrivateKeyDer::from_pem_slice(k.as_bytes())?,
        )?,
        _ => builder.with_no_client_auth(),
    };
    tls.alpn_protocols = if http2 {
        vec![b"h2".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    let tcp = tokio::net::TcpStream::connect(server.local_addr).await?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let io = TokioIo::new(stream);
    let request =
        http::Request::get(format!("https://localhost{path}")).body(Empty::<Bytes>::new())?;
    let response = if http2 {
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        sender.send_request(request).await?
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        sender.send_request(request).await?
    };
    let status = response.status().as_u16();
    let version = response.version();
    let body = response.into_body().collect().await?.to_bytes();
    Ok(Reply {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        version,
    })
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
}

#[tokio::test]
async fn serves_health_metrics_and_rejects_anonymous_api_calls() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    let server = rlark_server::start(config(&data_dir)).await?;
    assert_ne!(server.local_addr.port(), 0);

    // Files: private, kubeconfig points at the bound port.
    assert_eq!(mode(&data_dir), 0o700);
    assert_eq!(mode(&server.kubeconfig_path), 0o600);
    assert_eq!(mode(&data_dir.join("pki/admin.key")), 0o600);
    let kubeconfig = std::fs::read_to_string(&server.kubeconfig_path)?;
    assert!(
        kubeconfig.contains(&format!("https://127.0.0.1:{}", server.local_addr.port())),
        "{kubeconfig}"
    );

    // Admin: health and metrics.
    let reply = get(&server, "/healthz", ClientCert::Admin, false).await?;
    assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
    let reply = get(&server, "/metrics", ClientCert::Admin, false).await?;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(
        reply.body.contains("rlark_store_revision"),
        "{}",
        reply.body
    );

    // Anonymous: health yes, API and metrics no.
    for path in ["/healthz", "/livez", "/readyz"] {
        let reply = get(&server, path, ClientCert::None, false).await?;
        assert_eq!((reply.status, reply.body.as_str()), (200, "ok"), "{path}");
    }
    for path in ["/apis", "/api", "/metrics"] {
        let reply = get(&server, path, ClientCert::None, false).await?;
        assert_eq!(reply.status, 401, "{path}: {}", reply.body);
        assert!(
            reply.body.contains("Unauthorized"),
            "{path}: {}",
            reply.body
        );
    }

    // HTTP/2 through ALPN on the same listener.
    let reply = get(&server, "/healthz", ClientCert::Admin, true).await?;
    assert_eq!(reply.version, http::Version::HTTP_2);
    assert_eq!((reply.status, reply.body.as_str()), (200, "ok"));
    let reply = get(&server, "/apis", ClientCert::None, true).await?;
    assert_eq!(reply.status, 401);

    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn foreign_client_certificates_are_refused_at_the_handshake() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let server = rlark_server::start(config(dir.path())).await?;
    let other = tempfile::tempdir()?;
    let foreign = rlark_pki::Ca::load_or_create(other.path())?;
    let issued = foreign.issue_client(
        "admin",
        &["system:masters".to_string()],
        Duration::from_secs(3600),
    )?;
    let result = get(
        &server,
        "/healthz",
        ClientCert::Pem(&issued.cert_pem, &issued.key_pem),
        false,
    )
    .await;
    assert!(
        result.is_err(),
        "a certificate from another CA was accepted"
    );
    server.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn restart_keeps_ca_and_admin_cert_and_rewrites_kubeconfig() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let first = rlark_server::start(config(dir.path())).await?;
    let hash = first.ca_cert_hash.clone();
    let first_port = first.local_addr.port();
    let admin_cert = std::fs::read_to_string(dir.path().join("pki/admin.crt"))?;
    first.shutdown().await?;

    // The old port is closed.
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", first_port))
            .await
            .is_err()
    );

    let second = rlark_server::start(config(dir.path())).await?;
    assert_eq!(second.ca_cert_hash, hash);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("pki/admin.crt"))?,
        admin_cert
    );
    let kubeconfig = std::fs::read_to_string(&second.kubeconfig_path)?;
    assert!(kubeconfig.contains(&format!(":{}", second.local_addr.port())));
    let reply = get(&second, "/healthz", ClientCert::Admin, false).await?;
    assert_eq!(reply.status, 200);
    second.shutdown().await?;
    Ok(())
}

#[tokio::test]
async fn shutdown_with_an_idle_keepalive_connection_does_not_wait_for_the_grace()
-> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = config(dir.path());
    config.shutdown_grace = Duration::from_secs(20);
    let server = rlark_server::start(config).await?;

    // An HTTP/1.1 keep-alive connection that stays open after its request.
    let pki = dir.path().join("pki");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(pki.join("ca.crt"))?)?;
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(server.local_addr).await?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(ServerName::try_from("127.0.0.1")?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let conn = tokio::spawn(conn);
    let response = sender
        .send_request(http::Request::get("/healthz").body(Empty::<Bytes>::new())?)
        .await?;
    assert_eq!(response.status(), 200);
    response.into_body().collect().await?;

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), server.shutdown())
        .await
        .context("shutdown took longer than 10 s")??;
    assert!(started.elapsed() < Duration::from_secs(5));
    // The server closed the idle connection.
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await??
        .ok();
    Ok(())
}

#[tokio::test]
async fn invalid_config_is_rejected_before_binding() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = config(dir.path());
    config.tls_sans = vec!["not a name".to_string()];
    let err = rlark_server::start(config).await.expect_err("invalid SAN");
    assert!(err.to_string().contains("tlsSans[0]"), "{err}");
    // Nothing was created.
    assert!(!dir.path().join("pki").exists());
    Ok(())
}

#[tokio::test]
async fn run_stops_when_the_token_is_cancelled() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let token = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(rlark_server::run(config(dir.path()), token.clone()));
    let kubeconfig = dir.path().join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !kubeconfig.exists() {
        anyhow::ensure!(Instant::now() < deadline, "kubeconfig never written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task).await???;
    Ok(())
}

/// An installation from before the store was marked (CA plus a store with data, no marker)
/// starts, and its store is marked then.
#[tokio::test]
async fn a_store_from_before_the_marker_is_used_and_marked() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    rlark_pki::Ca::load_or_create(&dir.path().join("pki"))?;
    let db = dir.path().join("rlark.db");
    let open = || rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(&db));
    let store = open().await?;
    rlark_store::Store::create(
        &store,
        &rlark_store::ObjectKey::new("examples.test.rlark.io", "", "kept"),
        serde_json::json!({"metadata": {"name": "kept"}}),
    )
    .await?;
    store.close().await;
    drop(store);

    let server = rlark_server::start(config(dir.path())).await?;
    server.shutdown().await?;

    let store = open().await?;
    let key = rlark_store::ObjectKey::new("installations.security.rlark.io", "", "installation");
    let marker = rlark_store::Store::get(&store, &key)
        .await?
        .context("no marker")?;
    assert_eq!(marker["spec"]["how"], "upgraded", "{marker}");
    let kept = rlark_store::ObjectKey::new("examples.test.rlark.io", "", "kept");
    assert!(rlark_store::Store::get(&store, &kept).await?.is_some());
    store.close().await;
    Ok(())
}

/// A first start that fails after creating the CA (the port is taken) does not make the
/// next start look like a lost store.
#[tokio::test]
async fn a_failed_first_start_is_not_a_lost_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut busy = config(dir.path());
    busy.listen = taken.local_addr()?;
    let error = rlark_server::start(busy)
        .await
        .expect_err("the port is taken");
    assert!(error.to_string().contains("bind"), "{error}");
    assert!(dir.path().join("pki").join("ca.crt").exists());
    drop(taken);
    let server = rlark_server::start(config(dir.path())).await?;
    server.shutdown().await?;
    Ok(())
}
