//! Reverse tunnel end-to-end (DESIGN §6): real agents (joined with a bootstrap token) keep
//! tunnel sessions to in-process servers over real TLS on loopback; the hub's HTTP reverse
//! proxy (WebSocket upgrades included), HTTP CONNECT (curl, `rlark port-forward`), typed dial
//! errors, reconnects after a restart, several servers, per-stream flow control, revocation
//! and metrics.
//!
//! Every test is bounded by a hang guard; nothing asserts on wall-clock time except the
//! "refused comes back before the dial deadline" bound.

use crate::raw_api;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::{SinkExt as _, StreamExt as _};
use raw_api::Resp;
use rlark_testkit::TestServer;
use rlark_testkit::tunnel_agent::{TunnelAgent, share_pki, tokio_tungstenite};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Message;

/// Hang guard of every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a test waits at most for something that should happen soon.
const DEADLINE: Duration = Duration::from_secs(15);

/// Run `test` with the hang guard.
async fn bounded(test: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .with_context(|| format!("test did not finish within {TEST_TIMEOUT:?}"))?
}

/// `future`, or an error naming `what` after `limit`.
async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(limit, future)
        .await
        .with_context(|| format!("{what}: nothing within {limit:?}"))
}

// ---------------------------------------------------------------------------------------
// Targets behind the agent
// ---------------------------------------------------------------------------------------

/// An HTTP/1.1 server on loopback: `GET /hello` answers `hi`; every answer echoes the
/// request's `x-echo` header and its query (header `x-query`). Returns the port.
async fn http_target() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |request: hyper::Request<hyper::body::Incoming>| async move {
                        let mut response = hyper::Response::builder()
                            .header("x-query", request.uri().query().unwrap_or_default());
                        if let Some(echo) = request.headers().get("x-echo") {
                            response = response.header("x-echo", echo);
                        }
                        let (status, body) = match request.uri().path() {
                            "/hello" => (200, "hi"),
                            _ => (404, "not found"),
                        };
                        response
                            .status(status)
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Ok(port)
}

/// A TLS HTTP server on loopback answering `GET /hello` with `hi`, presenting a serving
/// certificate for 127.0.0.1 from a fresh CA that nobody trusts. Returns the port.
async fn untrusted_https_target(dir: &Path) -> Result<u16> {
    let ca = rlark_pki::Ca::load_or_create(dir).context("foreign CA")?;
    let issued = ca
        .issue_serving(&["127.0.0.1".to_string()], Duration::from_secs(3600))
        .context("serving certificate")?;
    let certs = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rlark_pki::tls_provider()))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |request: hyper::Request<hyper::body::Incoming>| async move {
                        let (status, body) = match request.uri().path() {
                            "/hello" => (200, "hi"),
                            _ => (404, "not found"),
                        };
                        hyper::Response::builder()
                            .status(status)
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    Ok(port)
}

/// A WebSocket echo server on loopback (text and binary messages). Returns the port.
async fn ws_echo_target() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    if (message.is_text() || message.is_binary()) && ws.send(message).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// A sink on loopback: per connection, reads a big-endian u64 `N`, then `N` bytes, and
/// answers with the number of bytes it read (u64). Returns the port.
async fn sink_target() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(expected) = tcp.read_u64().await else {
                    return;
                };
                let mut buffer = vec![0u8; 256 * 1024];
                let mut got = 0u64;
                while got < expected {
                    match tcp.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n as u64,
                    }
                }
                let _ = tcp.write_u64(got).await;
                let _ = tcp.flush().await;
                let _ = tcp.read(&mut buffer).await; // until the client closes
            });
        }
    });
    Ok(port)
}

/// A target that accepts connections and never reads from them. Returns the port.
async fn stalled_target() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
    Ok(port)
}

/// A loopback port that accepts no connection: a listener with backlog 0 whose accept queue
/// is full, so Linux drops further SYNs and a connect hangs. Keep the returned listener and
/// fillers alive while using the address.
async fn black_hole() -> Result<(TcpListener, Vec<TcpStream>, SocketAddr)> {
    let socket = TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(0)?;
    let addr = listener.local_addr()?;
    let mut fillers = Vec::new();
    for _ in 0..2 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
        {
            fillers.push(s);
        }
    }
    ensure!(!fillers.is_empty(), "could not fill the accept queue");
    Ok((listener, fillers, addr))
}

/// A port on loopback nothing listens on.
async fn closed_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?.port())
}

// ---------------------------------------------------------------------------------------
// HTTP through the server
// ---------------------------------------------------------------------------------------

async fn get(client: &kube::Client, path: &str) -> Result<Resp> {
    raw_api::send(client, "GET", path, &[], Vec::new()).await
}

/// `GET /api/proxy/{cluster}/http/127.0.0.1:{port}/hello?x=1` must answer `hi` (with
/// `request_text`, which fails on any non-2xx).
async fn expect_hello(client: &kube::Client, cluster: &str, port: u16) -> Result<()> {
    let path = format!("/api/proxy/{cluster}/http/127.0.0.1:{port}/hello?x=1");
    let request = http::Request::get(&path)
        .body(Vec::new())
        .context("build request")?;
    let text = within(DEADLINE, &path, client.request_text(request))
        .await?
        .with_context(|| format!("GET {path}"))?;
    ensure!(text == "hi", "GET {path}: {text:?}");
    Ok(())
}

/// The clusterIDs of `GET /api/v1/tunnels`.
async fn tunnels(client: &kube::Client) -> Result<Vec<String>> {
    let resp = get(client, "/api/v1/tunnels").await?;
    ensure!(
        resp.code == 200,
        "GET /api/v1/tunnels: {} {}",
        resp.code,
        resp.text
    );
    Ok(resp.json["items"]
        .as_array()
        .with_context(|| format!("no items in {}", resp.text))?
        .iter()
        .map(|t| t["clusterID"].as_str().unwrap_or_default().to_string())
        .collect())
}

/// Poll `/api/v1/tunnels` until `done(clusterIDs)`; an error after `limit`.
async fn wait_tunnels(
    client: &kube::Client,
    limit: Duration,
    done: impl Fn(&[String]) -> bool,
) -> Result<Vec<String>> {
    let start = Instant::now();
    loop {
        let list = tunnels(client).await?;
        if done(&list) {
            return Ok(list);
        }
        if start.elapsed() > limit {
            bail!("/api/v1/tunnels still lists {list:?} after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A kube client from kubeconfig text, without kube's default retries: kube retries 503
/// and 504 answers with backoff (for seconds), and those are what some tests expect.
async fn client_from_yaml(yaml: &str) -> Result<kube::Client> {
    rlark_testkit::install_crypto_provider();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml).context("parse kubeconfig")?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .context("load kubeconfig")?;
    config.default_retry = false;
    kube::Client::try_from(config).context("build kube client")
}

/// The admin client of `server` (its kubeconfig), without retries.
async fn admin_client(server: &TestServer) -> Result<kube::Client> {
    let path = server.kubeconfig_path();
    let yaml = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    client_from_yaml(&yaml).await
}

/// A client of a new viewer (certificate signed by the server for `name`).
async fn viewer_client(
    server: &TestServer,
    admin: &kube::Client,
    name: &str,
) -> Result<kube::Client> {
    let key_and_csr = rlark_pki::generate_key_and_csr(name)?;
    let body = json!({"role": "viewer", "name": name, "csr": key_and_csr.csr_pem});
    let resp = raw_api::send(
        admin,
        "POST",
        "/rlark/v1/certificates",
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    )
    .await?;
    ensure!(
        resp.code == 200 || resp.code == 201,
        "sign viewer: {} {}",
        resp.code,
        resp.text
    );
    let yaml = rlark_pki::kubeconfig_yaml(
        &server.url(),
        resp.json["caBundle"].as_str().context("no caBundle")?,
        resp.json["certificate"]
            .as_str()
            .context("no certificate")?,
        &key_and_csr.key_pem,
        name,
    );
    client_from_yaml(&yaml).await
}

/// A client with the agent's own certificate.
async fn agent_client(server: &TestServer, agent: &TunnelAgent) -> Result<kube::Client> {
    let creds = agent.credentials();
    let yaml = rlark_pki::kubeconfig_yaml(
        &server.url(),
        &creds.ca_pem,
        &creds.cert_pem,
        &creds.key_pem,
        &creds.info.common_name,
    );
    client_from_yaml(&yaml).await
}

// ---------------------------------------------------------------------------------------
// Raw TLS and CONNECT
// ---------------------------------------------------------------------------------------

/// A TLS client config with the server's CA and the admin certificate (`DATA_DIR/pki`),
/// offering HTTP/1.1 only.
fn admin_tls(data_dir: &Path) -> Result<Arc<rustls::ClientConfig>> {
    let pki = data_dir.join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.join("ca.crt")).context("read ca.crt")? {
        roots.add(cert.context("ca.crt")?)?;
    }
    let certs = CertificateDer::pem_file_iter(pki.join("admin.crt"))
        .context("read admin.crt")?
        .collect::<Result<Vec<_>, _>>()
        .context("admin.crt")?;
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).context("read admin.key")?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// TCP + TLS to `addr` (an IP address: the serving certificate names it).
async fn tls_connect(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>> {
    let tcp = within(DEADLINE, "TCP connect", TcpStream::connect(addr)).await??;
    tcp.set_nodelay(true)?;
    let name = ServerName::IpAddress(addr.ip().into());
    let tls = within(
        DEADLINE,
        "TLS handshake",
        tokio_rustls::TlsConnector::from(Arc::clone(config)).connect(name, tcp),
    )
    .await?
    .context("TLS handshake")?;
    Ok(tls)
}

/// What a CONNECT got: the tunnelled stream, or the error status and its message.
enum Connected {
    Open(Box<TlsStream<TcpStream>>),
    Refused { code: u16, message: String },
}

impl Connected {
    fn open(self, what: &str) -> Result<TlsStream<TcpStream>> {
        match self {
            Connected::Open(stream) => Ok(*stream),
            Connected::Refused { code, message } => bail!("CONNECT {what}: {code} {message}"),
        }
    }
}

/// `CONNECT authority` over TLS to `addr` with `config`. Reads exactly the response head (and
/// on an error its body, by Content-Length), nothing of the tunnelled bytes.
async fn connect_via(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    authority: &str,
) -> Result<Connected> {
    let mut tls = tls_connect(addr, config).await?;
    let request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
    tls.write_all(request.as_bytes()).await?;
    let read_head = async {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            ensure!(head.len() < 16 * 1024, "response head over 16 KiB");
            head.push(tls.read_u8().await.context("read CONNECT response")?);
        }
        Ok(String::from_utf8_lossy(&head).into_owned())
    };
    let head = within(Duration::from_secs(30), "CONNECT response", read_head).await??;
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("malformed response {head:?}"))?;
    if code == 200 {
        return Ok(Connected::Open(Box::new(tls)));
    }
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length.min(64 * 1024)];
    within(DEADLINE, "CONNECT error body", tls.read_exact(&mut body)).await??;
    let text = String::from_utf8_lossy(&body).into_owned();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or(text);
    Ok(Connected::Refused { code, message })
}

/// A minimal HTTP/1.1 `GET /hello` over `stream`; returns (status line, body).
async fn http_get_hello<S>(stream: &mut S) -> Result<(String, String)>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream
        .write_all(b"GET /hello HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    match within(DEADLINE, "HTTP response", stream.read_to_end(&mut response)).await? {
        Ok(_) => {}
        // A TLS peer may close without close_notify; what arrived is usable.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
        Err(e) => return Err(e).context("read HTTP response"),
    }
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("malformed response {text:?}"))?;
    Ok((
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    ))
}

fn rlark() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"));
    cmd.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    cmd.kill_on_drop(true);
    cmd
}

// ---------------------------------------------------------------------------------------
// a. HTTP reverse proxy (and i. metrics)
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn proxy_http_and_websocket_through_an_agent() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let admin = admin_client(&server).await?;
        let http_port = http_target().await?;

        // Plain HTTP: path, query and headers reach the target; its answer comes back.
        expect_hello(&admin, "edge", http_port).await?;
        let path = format!("/api/proxy/edge/http/127.0.0.1:{http_port}/hello?x=1");
        let resp = raw_api::send(&admin, "GET", &path, &[("x-echo", "ping")], Vec::new()).await?;
        assert_eq!(resp.code, 200, "{}", resp.text);
        assert_eq!(resp.text, "hi");
        assert_eq!(
            resp.headers.get("x-echo").map(|v| v.as_bytes()),
            Some(&b"ping"[..])
        );
        assert_eq!(
            resp.headers.get("x-query").map(|v| v.as_bytes()),
            Some(&b"x=1"[..])
        );
        let missing = format!("/api/proxy/edge/http/127.0.0.1:{http_port}/nothing");
        let resp = get(&admin, &missing).await?;
        assert_eq!((resp.code, resp.text.as_str()), (404, "not found"));
        // The target's root, without a trailing slash.
        let root = format!("/api/proxy/edge/http/127.0.0.1:{http_port}");
        let resp = get(&admin, &root).await?;
        assert_eq!(
            (resp.code, resp.text.as_str()),
            (404, "not found"),
            "{resp:?}"
        );

        // WebSocket through the proxy, with the admin certificate over our own TLS.
        let ws_port = ws_echo_target().await?;
        let tls = tls_connect(server.addr(), &admin_tls(server.data_dir())?).await?;
        // (A non-empty path: `.../127.0.0.1:PORT/` is a 404, see
        // `proxy_to_the_target_root_with_a_trailing_slash`.)
        let url = format!(
            "wss://{}/api/proxy/edge/http/127.0.0.1:{ws_port}/echo",
            server.addr()
        );
        let (mut ws, response) = within(
            DEADLINE,
            "WebSocket handshake",
            tokio_tungstenite::client_async(url.as_str(), tls),
        )
        .await?
        .with_context(|| format!("WebSocket handshake with {url}"))?;
        assert_eq!(response.status(), 101);
        let big = "x".repeat(300_000);
        for message in [
            Message::text("one"),
            Message::text("two"),
            Message::binary(vec![1u8, 2, 3]),
            Message::text(big.as_str()),
        ] {
            ws.send(message.clone()).await?;
            let back = within(DEADLINE, "WebSocket echo", ws.next())
                .await?
                .context("WebSocket closed")??;
            assert!(back == message, "echo differs: {} bytes", back.len());
        }
        ws.close(None).await?;

        // Only admins may proxy.
        let viewer = viewer_client(&server, &admin, "tunnel-viewer").await?;
        let resp = get(&viewer, &path).await?;
        assert_eq!(resp.code, 403, "viewer: {}", resp.text);
        let as_agent = agent_client(&server, &agent).await?;
        let resp = get(&as_agent, &path).await?;
        assert_eq!(resp.code, 403, "agent: {}", resp.text);

        // No agent of that cluster.
        let resp = get(
            &admin,
            &format!("/api/proxy/nowhere/http/127.0.0.1:{http_port}/hello"),
        )
        .await?;
        assert_eq!(resp.code, 503, "{}", resp.text);
        assert!(resp.message().contains("no-such-agent"), "{}", resp.text);

        // i. Metrics after that traffic.
        let resp = get(&admin, "/metrics").await?;
        assert_eq!(resp.code, 200, "{}", resp.text);
        let lines: Vec<&str> = resp.text.lines().collect();
        assert!(
            lines.contains(&"rlark_tunnel_sessions 1"),
            "no `rlark_tunnel_sessions 1` in:\n{}",
            resp.text
        );
        let ok_dials = lines
            .iter()
            .find_map(|l| l.strip_prefix("rlark_tunnel_dials_total{status=\"ok\"} "))
            .with_context(|| format!("no ok dials in:\n{}", resp.text))?;
        let ok_dials: f64 = ok_dials.parse()?;
        assert!(ok_dials >= 3.0, "{ok_dials} ok dials");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("rlark_tunnel_dials_total{status=\"no-such-agent\"} ")),
            "no no-such-agent dials in:\n{}",
            resp.text
        );

        agent.stop().await;
        server.stop().await
    })
    .await
}

/// `https` proxy targets: the target's certificate is verified against the web roots and
/// the installation CA (the server's own port is such a target); a certificate from an
/// unknown CA is refused with 502, and accepted only when the URL says `https+insecure`.
#[tokio::test]
async fn proxy_https_targets_verified_and_insecure() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let admin = admin_client(&server).await?;

        // The server itself, reached back through the agent: its certificate chains to
        // the installation CA and names 127.0.0.1.
        let own = format!(
            "/api/proxy/edge/https/127.0.0.1:{}/healthz",
            server.addr().port()
        );
        let resp = get(&admin, &own).await?;
        assert_eq!(resp.code, 200, "{}", resp.text);

        let foreign = tempfile::tempdir()?;
        let port = untrusted_https_target(foreign.path()).await?;
        let verified = format!("/api/proxy/edge/https/127.0.0.1:{port}/hello");
        let resp = get(&admin, &verified).await?;
        assert_eq!(resp.code, 502, "{}", resp.text);
        assert!(
            resp.message().contains("TLS handshake") && resp.message().contains("certificate"),
            "{}",
            resp.text
        );
        let insecure = format!("/api/proxy/edge/https+insecure/127.0.0.1:{port}/hello");
        let resp = get(&admin, &insecure).await?;
        assert_eq!((resp.code, resp.text.as_str()), (200, "hi"), "{resp:?}");

        // A plain-HTTP target spoken to over TLS fails the handshake, by name.
        let http_port = http_target().await?;
        let resp = get(
            &admin,
            &format!("/api/proxy/edge/https+insecure/127.0.0.1:{http_port}/hello"),
        )
        .await?;
        assert_eq!(resp.code, 502, "{}", resp.text);

        // Unknown schemes are refused before any dial.
        let resp = get(
            &admin,
            &format!("/api/proxy/edge/ftp/127.0.0.1:{port}/hello"),
        )
        .await?;
        assert_eq!(resp.code, 400, "{}", resp.text);
        assert!(resp.message().contains("ftp"), "{}", resp.text);

        agent.stop().await;
        server.stop().await
    })
    .await
}

/// `/api/proxy/{cluster}/http/{host}:{port}/` (the target's root, trailing slash) matches
/// neither proxy route: `{*path}` needs at least one character.
#[tokio::test]
async fn proxy_to_the_target_root_with_a_trailing_slash() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let admin = admin_client(&server).await?;
        let http_port = http_target().await?;
        let root = format!("/api/proxy/edge/http/127.0.0.1:{http_port}/");
        let resp = get(&admin, &root).await?;
        // The target answers 404 "not found" for `/`: proof that the request reached it.
        assert_eq!(
            (resp.code, resp.text.as_str()),
            (404, "not found"),
            "{resp:?}"
        );

        let ws_port = ws_echo_target().await?;
        let tls = tls_connect(server.addr(), &admin_tls(server.data_dir())?).await?;
        let url = format!(
            "wss://{}/api/proxy/edge/http/127.0.0.1:{ws_port}/",
            server.addr()
        );
        let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), tls)
            .await
            .with_context(|| format!("WebSocket handshake with {url}"))?;
        ws.send(Message::text("root")).await?;
        let back = within(DEADLINE, "WebSocket echo", ws.next())
            .await?
            .context("WebSocket closed")??;
        assert_eq!(back, Message::text("root"));

        agent.stop().await;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// b. CONNECT with curl, and rlark port-forward
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn connect_with_curl() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let http_port = http_target().await?;
        let pki = server.data_dir().join("pki");
        let path_arg = |name: &str| pki.join(name).to_string_lossy().into_owned();

        let output = within(
            Duration::from_secs(30),
            "curl",
            tokio::process::Command::new("curl")
                .args(["-sS", "--max-time", "20", "--proxytunnel", "-x"])
                .arg(server.url())
                .args(["--proxy-cacert", &path_arg("ca.crt")])
                .args(["--proxy-cert", &path_arg("admin.crt")])
                .args(["--proxy-key", &path_arg("admin.key")])
                .arg(format!("http://127.0.0.1.edge.agent:{http_port}/hello"))
                .kill_on_drop(true)
                .output(),
        )
        .await?
        .context("run curl (is it installed?)")?;
        assert!(
            output.status.success(),
            "curl: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&output.stdout), "hi");

        // rlark port-forward, as a real process.
        let (mut child, local) = start_port_forward(&server, http_port).await?;
        for _ in 0..2 {
            let mut tcp = TcpStream::connect(local).await?;
            let (status, body) = http_get_hello(&mut tcp).await?;
            assert!(status.starts_with("HTTP/1.1 200"), "{status}");
            assert_eq!(body, "hi");
        }
        child.kill().await?;

        agent.stop().await;
        server.stop().await
    })
    .await
}

/// `rlark port-forward edge 0:127.0.0.1:PORT` as a real process, and the local address it
/// printed.
async fn start_port_forward(
    server: &TestServer,
    port: u16,
) -> Result<(tokio::process::Child, SocketAddr)> {
    let kubeconfig = server.kubeconfig_path().to_string_lossy().into_owned();
    let mut child = rlark()
        .args(["port-forward", "edge", &format!("0:127.0.0.1:{port}")])
        .args(["--kubeconfig", &kubeconfig])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("spawn rlark port-forward")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let local: SocketAddr = within(DEADLINE, "Forwarding from ...", async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("Forwarding from ") {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                return addr.parse().with_context(|| format!("address in {line:?}"));
            }
        }
        bail!("rlark port-forward exited without printing its address")
    })
    .await??;
    assert!(local.ip().is_loopback(), "{local}");
    Ok((child, local))
}

/// `rlark port-forward` keeps a server connection with its handshakes done for the next
/// local connection. A server that closed that spare (here after 1 s without a request)
/// must not fail the client: the forward notices before forwarding a byte and dials anew.
#[tokio::test]
async fn port_forward_survives_a_spare_connection_the_server_closed() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let mut config = TestServer::config_for(dir.path());
        config.connections.header_read_timeout = Duration::from_secs(1);
        config.connections.idle_timeout = Duration::from_secs(1);
        let server = TestServer::start_with(config).await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let http_port = http_target().await?;
        let (mut child, local) = start_port_forward(&server, http_port).await?;
        for round in 0..3 {
            // Long enough for the server to close the spare opened after the last use
            // (its header-read and idle timeouts are 1 s), shorter than the forward's own
            // spare lifetime (10 s), so the spare it holds is a closed one.
            tokio::time::sleep(Duration::from_millis(2500)).await;
            let mut tcp = TcpStream::connect(local).await?;
            let (status, body) = http_get_hello(&mut tcp)
                .await
                .with_context(|| format!("round {round}"))?;
            assert!(
                status.starts_with("HTTP/1.1 200"),
                "round {round}: {status}"
            );
            assert_eq!(body, "hi");
        }
        child.kill().await?;
        agent.stop().await;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// c. Typed dial errors
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn dial_errors_are_typed() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let mut config = TestServer::config_for(dir.path());
        config.tunnel.dial_timeout = Duration::from_secs(1);
        let dial_timeout = config.tunnel.dial_timeout;
        let server = TestServer::start_with(config).await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let tls = admin_tls(server.data_dir())?;

        // Refused: the agent's answer arrives well before the dial deadline.
        let port = closed_port().await?;
        let started = Instant::now();
        let authority = format!("127.0.0.1.edge.agent:{port}");
        let refused = connect_via(server.addr(), &tls, &authority);
        let Connected::Refused { code, message } = refused.await? else {
            bail!("CONNECT to a closed port succeeded");
        };
        let elapsed = started.elapsed();
        assert_eq!(code, 502, "{message}");
        assert!(message.contains("refused"), "{message}");
        assert!(
            elapsed < dial_timeout,
            "refused after {elapsed:?}, dial timeout {dial_timeout:?}"
        );

        // Timeout: a black hole on loopback.
        let (_listener, _fillers, hole) = black_hole().await?;
        let authority = format!("127.0.0.1.edge.agent:{}", hole.port());
        let Connected::Refused { code, message } =
            connect_via(server.addr(), &tls, &authority).await?
        else {
            bail!("CONNECT to a black hole succeeded");
        };
        assert_eq!(code, 504, "{message}");
        assert!(message.contains("timeout"), "{message}");

        // No agent of that cluster.
        let Connected::Refused { code, message } =
            connect_via(server.addr(), &tls, "127.0.0.1.nowhere.agent:80").await?
        else {
            bail!("CONNECT through a cluster without agent succeeded");
        };
        assert_eq!(code, 503, "{message}");
        assert!(message.contains("no-such-agent"), "{message}");

        // The tunnel still works after all that.
        let http_port = http_target().await?;
        let mut stream = connect_via(
            server.addr(),
            &tls,
            &format!("127.0.0.1.edge.agent:{http_port}"),
        )
        .await?
        .open("hello")?;
        let (status, body) = http_get_hello(&mut stream).await?;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert_eq!(body, "hi");

        agent.stop().await;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// d. Reconnect after a server restart
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn agent_reconnects_after_server_restart() -> Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let server = TestServer::start_in(dir.path()).await?;
        let addr = server.addr();
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let http_port = http_target().await?;
        expect_hello(&admin_client(&server).await?, "edge", http_port).await?;

        server.stop().await?;
        agent.wait_disconnected(DEADLINE).await?;
        let mut config = TestServer::config_for(dir.path());
        config.listen = addr;
        let server = TestServer::start_with(config).await?;
        assert_eq!(server.addr(), addr);
        agent.wait_connected(1, Duration::from_secs(30)).await?;
        agent.wait_listed(&server, DEADLINE).await?;
        let admin = admin_client(&server).await?;
        expect_hello(&admin, "edge", http_port).await?;

        let kubeconfig = server.kubeconfig_path().to_string_lossy().into_owned();
        let output = within(
            DEADLINE,
            "rlark get tunnels",
            rlark()
                .args(["get", "tunnels", "--kubeconfig", &kubeconfig])
                .output(),
        )
        .await??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "rlark get tunnels: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let mut rows = stdout.lines();
        let header = rows.next().unwrap_or_default();
        assert!(header.starts_with("AGENT"), "{stdout}");
        let edge: Vec<&str> = rows.filter(|row| row.starts_with("edge ")).collect();
        assert_eq!(edge.len(), 1, "{stdout}");
        // The last column is the session's measured PING round trip.
        assert_eq!(header.split_whitespace().last(), Some("RTT"), "{stdout}");
        let rtt = edge[0].split_whitespace().last().unwrap_or_default();
        assert!(
            rtt.strip_suffix("ms")
                .and_then(|v| v.parse::<f64>().ok())
                .is_some(),
            "{stdout}"
        );

        agent.stop().await;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// e. One agent, two servers
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn agent_with_two_servers_is_reachable_through_either() -> Result<()> {
    bounded(async {
        let a = TestServer::start().await?;
        let dir_b = tempfile::tempdir()?;
        share_pki(a.data_dir(), dir_b.path())?;
        // B has A's CA but a store of its own: a new replica, started on purpose on an
        // empty store.
        let mut config_b = TestServer::config_for(dir_b.path());
        config_b.reinitialize_store = true;
        let b = TestServer::start_with(config_b).await?;
        assert_eq!(a.ca_cert_hash(), b.ca_cert_hash(), "B has A's CA");
        let agent = TunnelAgent::start(&[&a, &b], "edge").await?;
        assert_eq!(agent.connected(), vec![a.url(), b.url()]);
        let http_port = http_target().await?;
        let admin_a = admin_client(&a).await?;
        let admin_b = admin_client(&b).await?;

        expect_hello(&admin_a, "edge", http_port).await?;
        expect_hello(&admin_b, "edge", http_port).await?;
        assert_eq!(tunnels(&admin_a).await?, vec!["edge".to_string()]);
        assert_eq!(tunnels(&admin_b).await?, vec!["edge".to_string()]);

        let b_url = b.url();
        a.stop().await?;
        within(DEADLINE, "agent sees A go", async {
            let mut watch = agent.handle().watch();
            watch
                .wait_for(|connected| *connected == [b_url.clone()])
                .await
                .map(|_| ())
        })
        .await??;
        expect_hello(&admin_b, "edge", http_port).await?;
        assert_eq!(tunnels(&admin_b).await?, vec!["edge".to_string()]);

        agent.stop().await;
        b.stop().await
    })
    .await
}

/// An agent configured with one server finds the other replica in the hub's list
/// (`GET /rlark/v1/replicas`: B's own registration plus its configured peer A) and keeps a
/// session to it too, so A reaches the agent with no load balancer and no agent change.
#[tokio::test]
async fn an_agent_discovers_the_other_replica_from_the_hub() -> Result<()> {
    bounded(async {
        let a = TestServer::start().await?;
        let dir_b = tempfile::tempdir()?;
        share_pki(a.data_dir(), dir_b.path())?;
        let mut config_b = TestServer::config_for(dir_b.path());
        config_b.reinitialize_store = true;
        config_b.tunnel.peers = vec![a.url()];
        let b = TestServer::start_with(config_b).await?;
        let admin_a = admin_client(&a).await?;
        let admin_b = admin_client(&b).await?;

        let resp = get(&admin_b, "/rlark/v1/replicas").await?;
        assert_eq!(resp.code, 200, "{}", resp.text);
        let list: Value = serde_json::from_str(&resp.text)?;
        let listed: Vec<(&str, &str)> = list["items"]
            .as_array()
            .context("items")?
            .iter()
            .map(|i| {
                (
                    i["url"].as_str().unwrap_or_default(),
                    i["source"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        let (a_url, b_url) = (a.url(), b.url());
        assert_eq!(
            listed,
            vec![
                (b_url.as_str(), "registered"),
                (a_url.as_str(), "configured")
            ],
            "{}",
            resp.text
        );

        let agent_dir = tempfile::tempdir()?;
        let agent =
            rlark_testkit::real_agent::start_agent(&b, "edge", "edge-node", agent_dir.path())
                .await?;
        within(
            DEADLINE,
            "the agent connects to the discovered replica",
            async {
                let mut watch = agent.tunnel_watch();
                watch
                    .wait_for(|connected| connected.len() == 2)
                    .await
                    .map(|_| ())
            },
        )
        .await??;
        assert_eq!(agent.tunnel_connected(), vec![b_url.clone(), a_url.clone()]);
        let http_port = http_target().await?;
        expect_hello(&admin_a, "edge", http_port).await?;
        expect_hello(&admin_b, "edge", http_port).await?;

        agent.stop().await?;
        a.stop().await?;
        b.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// f. Head-of-line: a stalled stream does not stall another
// ---------------------------------------------------------------------------------------

const MIB: usize = 1024 * 1024;
/// Bytes pushed at most into the stalled stream, and transferred on the other one.
const TRANSFER: usize = 64 * MIB;

/// Send `TRANSFER` bytes (after their count) to the sink and wait for its count; returns
/// the time taken.
async fn transfer_to_sink(stream: &mut TlsStream<TcpStream>) -> Result<Duration> {
    let chunk = vec![0x5au8; MIB];
    let started = Instant::now();
    stream.write_u64(TRANSFER as u64).await?;
    for _ in 0..TRANSFER / MIB {
        stream.write_all(&chunk).await?;
    }
    stream.flush().await?;
    let acknowledged = stream.read_u64().await.context("read the sink's count")?;
    let elapsed = started.elapsed();
    ensure!(
        acknowledged == TRANSFER as u64,
        "the sink got {acknowledged} of {TRANSFER} bytes"
    );
    Ok(elapsed)
}

fn mib_per_s(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / MIB as f64 / elapsed.as_secs_f64()
}

#[tokio::test]
async fn slow_stream_does_not_stall_another() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let tls = admin_tls(server.data_dir())?;
        let sink = sink_target().await?;
        let stalled = stalled_target().await?;
        let to = |port: u16| format!("127.0.0.1.edge.agent:{port}");

        // Stream 2's throughput alone.
        let mut alone = connect_via(server.addr(), &tls, &to(sink))
            .await?
            .open("sink")?;
        let alone_time = within(
            Duration::from_secs(60),
            "transfer alone",
            transfer_to_sink(&mut alone),
        )
        .await??;
        drop(alone);

        // Stream 1: the target never reads; push until writes block.
        let mut slow = connect_via(server.addr(), &tls, &to(stalled))
            .await?
            .open("stalled")?;
        let chunk = vec![0xa5u8; 256 * 1024];
        let mut pushed = 0usize;
        let mut stalled_at = None;
        while pushed < TRANSFER {
            match tokio::time::timeout(Duration::from_secs(1), slow.write_all(&chunk)).await {
                Ok(result) => {
                    result.context("write into the stalled stream")?;
                    pushed += chunk.len();
                }
                Err(_) => {
                    stalled_at = Some(pushed);
                    break;
                }
            }
        }
        let stalled_at = stalled_at.with_context(|| {
            format!("{pushed} bytes went into a stream whose target never reads: no flow control?")
        })?;

        // Stream 2 while stream 1 is stalled: must complete.
        let mut fast = connect_via(server.addr(), &tls, &to(sink))
            .await?
            .open("sink")?;
        let with_stall_time = within(
            Duration::from_secs(60),
            "transfer beside a stalled stream (head-of-line blocking?)",
            transfer_to_sink(&mut fast),
        )
        .await??;
        // Stream 1 is still stalled (nothing was read from it).
        let still_blocked =
            tokio::time::timeout(Duration::from_millis(300), slow.write_all(&chunk))
                .await
                .is_err();

        let alone_rate = mib_per_s(TRANSFER, alone_time);
        let with_stall_rate = mib_per_s(TRANSFER, with_stall_time);
        eprintln!(
            "stream 1 (target never reads): {:.1} MiB accepted before writes blocked; still \
             blocked afterwards: {still_blocked}",
            stalled_at as f64 / MIB as f64
        );
        eprintln!(
            "stream 2 (sink): {} MiB alone in {alone_time:?} ({alone_rate:.1} MiB/s), beside the \
             stalled stream in {with_stall_time:?} ({with_stall_rate:.1} MiB/s); ratio \
             stalled/alone = {:.2}",
            TRANSFER / MIB,
            with_stall_rate / alone_rate
        );
        drop(slow);
        drop(fast);

        agent.stop().await;
        server.stop().await
    })
    .await
}

// ---------------------------------------------------------------------------------------
// h. Revocation closes the tunnel
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn revoked_agent_tunnel_is_closed() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let agent = TunnelAgent::start(&[&server], "edge").await?;
        let admin = admin_client(&server).await?;
        let http_port = http_target().await?;
        expect_hello(&admin, "edge", http_port).await?;
        assert_eq!(tunnels(&admin).await?, vec!["edge".to_string()]);

        let resp = raw_api::send(
            &admin,
            "POST",
            "/rlark/v1/revocations",
            &[("content-type", "application/json")],
            json!({"clusterID": "edge"}).to_string().into_bytes(),
        )
        .await?;
        assert!(
            (200..300).contains(&resp.code),
            "revoke: {} {}",
            resp.code,
            resp.text
        );

        wait_tunnels(&admin, Duration::from_secs(5), |list| list.is_empty()).await?;
        let path = format!("/api/proxy/edge/http/127.0.0.1:{http_port}/hello");
        let resp = get(&admin, &path).await?;
        assert_eq!(resp.code, 503, "{}", resp.text);
        assert!(resp.message().contains("no-such-agent"), "{}", resp.text);

        // The agent keeps trying (backoff at most 1 s) and is refused every time.
        agent.wait_disconnected(DEADLINE).await?;
        let watching = Instant::now();
        while watching.elapsed() < Duration::from_secs(3) {
            assert!(agent.connected().is_empty(), "a revoked agent reconnected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(tunnels(&admin).await?.is_empty());
        assert_eq!(get(&admin, &path).await?.code, 503);

        agent.stop().await;
        server.stop().await
    })
    .await
}
