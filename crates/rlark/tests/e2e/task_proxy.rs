//! The task HTTP proxy end to end: an in-process server with a real agent, raw tasks, and
//! a TensorBoard-like app run by the replica (this test binary started again, see
//! [`app_in_a_replica`]; a raw replica's ports are its node's loopback, here this
//! machine's, and the proxy reaches only those its own processes listen on) that emits
//! absolute links, redirects, cookie paths and a WebSocket. Through
//! `/rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/`:
//! - the page comes back with its links under the prefix, the redirect too, and the app saw
//!   `X-Forwarded-Prefix` but not the caller's credentials;
//! - a WebSocket echoes through the proxy;
//! - a viewer the Job grants reaches it; on a task whose Job does not grant them, 403 and
//!   an audit record;
//! - through the task proxy's own origin (`proxy_listen`) as a browser does: a one-time
//!   ticket from `POST /rlark/v1/console/proxy-tickets`, redeemed once for the proxy
//!   cookie, then the app with that cookie only (rlark's cookie kept from the app); the
//!   proxy origin serves nothing else.
//!
//! Every wait is bounded by [`DEADLINE`].

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use futures::{SinkExt as _, StreamExt as _};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use kube::api::{Api, PostParams};
use rlark_api::types::{Job, PodPhase};
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually, viewer_client};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

/// The test app: a page with absolute links, a redirect, a cookie, a WebSocket echo.
async fn app(request: http::Request<Incoming>) -> Result<http::Response<Full<Bytes>>, Infallible> {
    let seen = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let response = http::Response::builder();
    let response = match request.uri().path() {
        "/" => response
            .header("content-type", "text/html; charset=utf-8")
            .header("set-cookie", "board=1; Path=/; HttpOnly")
            .header("x-saw-prefix", seen("x-forwarded-prefix"))
            .header("x-saw-authorization", seen("authorization"))
            .header("x-saw-cookie", seen("cookie"))
            .body(Full::new(Bytes::from(
                "<html><a href=\"/data/run1\">run1</a><script src='/static/app.js'></script>\
                 <a href=\"https://example.com/\">out</a><a href=\"rel\">rel</a></html>",
            ))),
        "/data/run1" => response.body(Full::new(Bytes::from("scalars of run1"))),
        "/login" => response
            .status(302)
            .header("location", "/data/run1")
            .body(Full::new(Bytes::new())),
        "/ws" => {
            let key = seen("sec-websocket-key");
            let mut request = request;
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else { return };
                let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    tokio_tungstenite::tungstenite::protocol::Role::Server,
                    None,
                )
                .await;
                while let Some(Ok(message)) = ws.next().await {
                    if let Message::Text(text) = message {
                        let _ = ws.send(Message::text(format!("echo: {text}"))).await;
                    }
                }
            });
            response
                .status(101)
                .header("connection", "Upgrade")
                .header("upgrade", "websocket")
                .header(
                    "sec-websocket-accept",
                    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()),
                )
                .body(Full::new(Bytes::new()))
        }
        _ => response
            .status(404)
            .body(Full::new(Bytes::from("no such page"))),
    };
    Ok(response.expect("response"))
}

/// The environment variable that makes [`app_in_a_replica`] serve the app on its port.
const APP_PORT_ENV: &str = "RLARK_TEST_TASK_APP_PORT";

/// Not a test of its own: the task's app, run by a replica as this test binary started
/// again (`--exact task_proxy::app_in_a_replica`) with [`APP_PORT_ENV`] set — the proxy reaches only
/// ports the replica's own processes listen on. Returns at once without it.
#[test]
fn app_in_a_replica() {
    let Some(port) = std::env::var(APP_PORT_ENV)
        .ok()
        .and_then(|p| p.parse::<u16>().ok())
    else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the app's port");
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(app))
                    .with_upgrades()
                    .await;
            });
        }
    });
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Create Job `name` whose replica serves the test app on `port` ([`app_in_a_replica`]).
async fn create_job(
    admin: &kube::Client,
    name: &str,
    access: serde_json::Value,
    port: u16,
) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"access": access, "tasks": [{
            "name": "main", "agentType": "Raw", "role": "Actor",
            "raw": {
                "entrypoint": [me, "--exact", "task_proxy::app_in_a_replica", "--nocapture",
                               "--test-threads=1"],
                "environment": [{"name": APP_PORT_ENV, "value": port.to_string()}],
            },
        }]},
    }))?;
    Api::<Job>::all(admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    Ok(())
}

/// GET `path` as `client`: status, headers, body.
async fn get(client: &kube::Client, path: &str) -> anyhow::Result<(u16, http::HeaderMap, String)> {
    let request = http::Request::get(path).body(Vec::new())?;
    let response = client.send(request.map(kube::client::Body::from)).await;
    let response = match response {
        Ok(response) => response,
        Err(kube::Error::Api(status)) => {
            return Ok((status.code, http::HeaderMap::new(), status.message));
        }
        Err(other) => return Err(other.into()),
    };
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await?
        .to_bytes();
    Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
}

fn admin_tls(data_dir: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let pki = data_dir.join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(pki.join("ca.crt"))? {
        roots.add(cert?)?;
    }
    let certs =
        CertificateDer::pem_file_iter(pki.join("admin.crt"))?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.join("admin.key"))?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_client_auth_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_web_uis_are_proxied_under_their_prefix() -> anyhow::Result<()> {
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.proxy_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await?;
    let port = free_port()?;
    let secret_port = free_port()?;
    create_job(&h.admin, "board", json!([{"user": "vera"}]), port).await?;
    create_job(&h.admin, "secret", json!([]), secret_port).await?;
    h.wait_pod("board-main-0", PodPhase::Running).await?;
    h.wait_pod("secret-main-0", PodPhase::Running).await?;
    let prefix = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/board-main/proxy/{port}");
    eventually("the app listens in its replica", || async {
        let (status, _, _) = get(&h.admin, &format!("{prefix}/data/run1")).await?;
        Ok((status == 200).then_some(()))
    })
    .await?;

    // The page, its links under the prefix; what the app was told and not told.
    let dir = tempfile::tempdir()?;
    let vera = viewer_client(&h.server, &h.admin, dir.path()).await?;
    let (status, headers, body) = get(&vera, &format!("{prefix}/")).await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        format!(
            "<html><a href=\"{prefix}/data/run1\">run1</a><script src='{prefix}/static/app.js'></script>\
             <a href=\"https://example.com/\">out</a><a href=\"rel\">rel</a></html>"
        )
    );
    assert_eq!(headers["x-saw-prefix"], prefix.as_str());
    assert_eq!(headers["x-saw-authorization"], "-");
    assert_eq!(
        headers["set-cookie"],
        format!("board=1; Path={prefix}/; HttpOnly").as_str()
    );
    // The rewritten link works; the redirect stays under the prefix.
    let (status, _, body) = get(&vera, &format!("{prefix}/data/run1")).await?;
    assert_eq!((status, body.as_str()), (200, "scalars of run1"));
    let (status, headers, _) = get(&vera, &format!("{prefix}/login")).await?;
    assert_eq!(status, 302);
    assert_eq!(headers["location"], format!("{prefix}/data/run1").as_str());
    // The bare prefix redirects to the directory.
    let (status, headers, _) = get(&vera, &prefix).await?;
    assert_eq!(status, 301);
    assert_eq!(headers["location"], format!("{prefix}/").as_str());
    // Replica 0 by index too.
    let (status, _, body) = get(
        &vera,
        &format!(
            "/rlark/v1/namespaces/{NAMESPACE}/tasks/board-main/replicas/0/proxy/{port}/data/run1"
        ),
    )
    .await?;
    assert_eq!((status, body.as_str()), (200, "scalars of run1"));

    // A task whose Job does not grant vera: 403, audited.
    let secret = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/secret-main/proxy/{secret_port}/");
    let (status, _, message) = get(&vera, &secret).await?;
    assert_eq!(status, 403, "{message}");
    assert!(message.contains("does not grant it"), "{message}");
    let audit = std::fs::read_to_string(h.server.data_dir().join("audit.log"))?;
    assert!(
        audit.lines().any(|l| l.contains("\"action\":\"denied\"")
            && l.contains("tasks.rlinf.io/proxy")
            && l.contains("secret-main")
            && l.contains("\"user\":\"vera\"")),
        "{audit}"
    );
    // The admin reaches every task.
    eventually("the admin reaches the other task's app", || async {
        let (status, _, _) = get(&h.admin, &secret).await?;
        Ok((status == 200).then_some(()))
    })
    .await?;

    // A WebSocket through the proxy (as the admin, over TLS with its certificate).
    let addr = h.server.addr();
    let tcp = TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(admin_tls(h.server.data_dir())?)
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await?;
    let request = format!("wss://{addr}{prefix}/ws").into_client_request()?;
    let (mut ws, _) = tokio::time::timeout(DEADLINE, tokio_tungstenite::client_async(request, tls))
        .await
        .context("WebSocket handshake timed out")??;
    ws.send(Message::text("hello")).await?;
    let answer = tokio::time::timeout(DEADLINE, ws.next())
        .await
        .context("no WebSocket answer")?
        .context("the WebSocket ended")??;
    assert_eq!(answer, Message::text("echo: hello"));

    // The proxy origin, as a browser reaches it: no client certificate, a ticket, a cookie.
    let proxy = h.server.proxy_addr().context("no proxy listener")?;
    let request = http::Request::post("/rlark/v1/console/proxy-tickets")
        .header("content-type", "application/json")
        .body(
            json!({"namespace": NAMESPACE, "task": "board-main", "port": port, "path": "data/run1"})
                .to_string()
                .into_bytes(),
        )?;
    let answer = vera.request::<serde_json::Value>(request).await?;
    let url = answer["url"].as_str().context("no url")?.to_string();
    // The console is at 127.0.0.1: the proxy origin is another site.
    let login_path = url
        .strip_prefix(&format!("https://localhost:{}", proxy.port()))
        .with_context(|| format!("{url} is not on localhost:{}", proxy.port()))?
        .to_string();
    assert!(
        login_path.starts_with("/rlark/v1/proxy-login?ticket="),
        "{url}"
    );
    let browser = Browser::new(h.server.data_dir(), proxy)?;
    let (status, headers, body) = browser.get(&login_path, None).await?;
    assert_eq!(status, 303, "{body}");
    assert_eq!(headers["location"], format!("{prefix}/data/run1").as_str());
    let set = headers["set-cookie"].to_str()?;
    assert!(set.starts_with("__Host-rlark_proxy="), "{set}");
    let cookie = set.split(';').next().unwrap_or_default().to_string();
    // A ticket works once.
    let (status, _, body) = browser.get(&login_path, None).await?;
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = browser
        .get(&format!("{prefix}/data/run1"), Some(&cookie))
        .await?;
    assert_eq!((status, body.as_str()), (200, "scalars of run1"));
    let (status, headers, _) = browser
        .get(&format!("{prefix}/"), Some(&format!("{cookie}; board=1")))
        .await?;
    assert_eq!(status, 200);
    assert_eq!(
        headers["x-saw-cookie"], "board=1",
        "rlark's cookie stays with rlark"
    );
    // Without the cookie, nobody; and nothing but task apps there.
    let (status, _, _) = browser.get(&format!("{prefix}/"), None).await?;
    assert_eq!(status, 401);
    for path in ["/", "/api/v1/namespaces", "/rlark/v1/console/session"] {
        let (status, _, _) = browser.get(path, Some(&cookie)).await?;
        assert_eq!(status, 404, "{path}");
    }
    h.stop().await
}

/// An HTTPS client like a browser: the installation CA trusted, no client certificate,
/// `localhost` as the server name.
struct Browser {
    tls: tokio_rustls::TlsConnector,
    addr: std::net::SocketAddr,
}

impl Browser {
    fn new(data_dir: &Path, addr: std::net::SocketAddr) -> anyhow::Result<Self> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(data_dir.join("pki").join("ca.crt"))? {
            roots.add(cert?)?;
        }
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            addr,
        })
    }

    async fn get(
        &self,
        path: &str,
        cookie: Option<&str>,
    ) -> anyhow::Result<(u16, http::HeaderMap, String)> {
        let tcp = TcpStream::connect(self.addr).await?;
        let tls = self
            .tls
            .connect(ServerName::try_from("localhost")?, tcp)
            .await?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(conn);
        let mut request =
            http::Request::get(path).header("host", format!("localhost:{}", self.addr.port()));
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        let response = tokio::time::timeout(
            DEADLINE,
            sender.send_request(request.body(http_body_util::Empty::<Bytes>::new())?),
        )
        .await
        .context("proxy origin request timed out")??;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await?
            .to_bytes();
        Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
    }
}
