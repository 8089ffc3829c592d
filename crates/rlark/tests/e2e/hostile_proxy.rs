//! Hostile clients of the task proxy and of `ssh -L` (issue 38, "Proxy and headers"),
//! end to end against an in-process server and a real agent:
//!
//! - a client's own `X-Forwarded-*` / `Forwarded` headers never reach the task's app; the
//!   proxy's do (the client's address, the host it asked for, `https`);
//! - every HTTPS answer of every listener — the API (a 401 included), a proxied app, the
//!   task proxy's origin — carries `X-Content-Type-Options: nosniff` and HSTS;
//! - the proxy and `ssh -L` reach the ports the task's replica listens on, and not a
//!   service of the node's loopback that is not the task's.
//!
//! Every wait is bounded by [`DEADLINE`].

use crate::missing_tool;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use kube::api::{Api, PostParams};
use rlark_api::types::{Job, PodPhase};
use rlark_testkit::real_agent::{DEADLINE, Harness, NAMESPACE, eventually, text, viewer_client};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// An HTTP app that answers every GET with the request headers it saw, one
/// `name: value` line each (names lowercase): `python3 -c HEADERS PORT`.
const HEADERS: &str = "import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ''.join(k.lower() + ': ' + v + '\\n' for k, v in self.headers.items()).encode()
        self.send_response(200)
        self.send_header('content-type', 'text/plain')
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
";

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| path.is_file())
    })
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Start Job `name` whose raw task `main` runs the [`HEADERS`] app on `port`, granted to
/// vera, and wait until the proxy reaches it.
async fn start_app(h: &Harness, name: &str, port: u16) -> anyhow::Result<String> {
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"access": [{"user": "vera"}], "tasks": [{
            "name": "main", "agentType": "Raw", "role": "Actor",
            "raw": {"entrypoint": ["python3", "-c", HEADERS, port.to_string()]},
        }]},
    }))?;
    Api::<Job>::all(h.admin.clone())
        .create(&PostParams::default(), &job)
        .await?;
    h.wait_pod(&format!("{name}-main-0"), PodPhase::Running)
        .await?;
    let prefix = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/{name}-main/proxy/{port}");
    eventually("the app answers through the proxy", || async {
        let (status, _, _) = get(&h.admin, &format!("{prefix}/"), &[]).await?;
        Ok((status == 200).then_some(()))
    })
    .await?;
    Ok(prefix)
}

/// GET `path` as `client` with `headers`: status, headers, body.
async fn get(
    client: &kube::Client,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, http::HeaderMap, String)> {
    let mut request = http::Request::get(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Vec::new())?;
    match client.send(request.map(kube::client::Body::from)).await {
        Ok(response) => {
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await?
                .to_bytes();
            Ok((status, headers, String::from_utf8_lossy(&body).into_owned()))
        }
        Err(kube::Error::Api(status)) => Ok((status.code, http::HeaderMap::new(), status.message)),
        Err(other) => Err(other.into()),
    }
}

/// `GET path` over TLS to `addr` without a client certificate (as a browser or an
/// anonymous client), asking for host `host`: the whole answer as text.
async fn anonymous_get(
    data_dir: &Path,
    addr: std::net::SocketAddr,
    host: &str,
    path: &str,
) -> anyhow::Result<String> {
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
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?;
    tls.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: {host}:{}\r\nConnection: close\r\n\r\n",
            addr.port()
        )
        .as_bytes(),
    )
    .await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(DEADLINE, tls.read_to_end(&mut answer))
        .await
        .context("no answer")?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// The security headers of an answer's head, `(nosniff, hsts)`.
fn security_headers(head: &str) -> (bool, bool) {
    let lower = head.to_ascii_lowercase();
    (
        lower.contains("\r\nx-content-type-options: nosniff\r\n"),
        lower.contains("\r\nstrict-transport-security: max-age="),
    )
}

/// Issue 38, "the task proxy forwards client-supplied `X-Forwarded-*` / `Forwarded`
/// headers ahead of its own": an app that trusts them (for its links, its logs, an
/// allow-list) was told whatever the client wanted. Now the client's are dropped and the
/// app sees the proxy's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_forwarding_headers_do_not_reach_the_app() -> anyhow::Result<()> {
    if which("python3").is_none() {
        missing_tool::skip_or_fail("python3 is not installed");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_with(supervisor).await?;
    let prefix = start_app(&h, "echo", free_port()?).await?;
    let dir = tempfile::tempdir()?;
    let vera = viewer_client(&h.server, &h.admin, dir.path()).await?;
    let (status, _, seen) = get(
        &vera,
        &format!("{prefix}/"),
        &[
            ("x-forwarded-for", "203.0.113.66"),
            ("x-forwarded-host", "evil.example"),
            ("x-forwarded-proto", "http"),
            ("x-forwarded-prefix", "/evil"),
            ("x-forwarded-user", "admin"),
            ("forwarded", "for=203.0.113.66;host=evil.example"),
        ],
    )
    .await?;
    assert_eq!(status, 200, "{seen}");
    for forged in ["203.0.113.66", "evil.example", "/evil", "x-forwarded-user"] {
        assert!(!seen.contains(forged), "the app saw {forged:?}:\n{seen}");
    }
    assert!(seen.contains("x-forwarded-for: 127.0.0.1\n"), "{seen}");
    assert!(seen.contains("x-forwarded-proto: https\n"), "{seen}");
    assert!(
        seen.contains(&format!("x-forwarded-prefix: {prefix}\n")),
        "{seen}"
    );
    assert!(
        seen.contains("forwarded: for=127.0.0.1;host=") && seen.contains(";proto=https\n"),
        "{seen}"
    );
    h.stop().await
}

/// Issue 38, "API responses lack `X-Content-Type-Options: nosniff` and HSTS": every
/// HTTPS answer of every listener has them now — an API answer, an anonymous 401, a
/// proxied app's answer, the task proxy origin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_https_answer_has_nosniff_and_hsts() -> anyhow::Result<()> {
    if which("python3").is_none() {
        missing_tool::skip_or_fail("python3 is not installed");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.proxy_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await?;
    let prefix = start_app(&h, "headers", free_port()?).await?;
    for path in ["/api/v1/namespaces", "/healthz", &format!("{prefix}/")] {
        let (status, headers, body) = get(&h.admin, path, &[]).await?;
        assert_eq!(status, 200, "{path}: {body}");
        assert_eq!(
            headers.get("x-content-type-options").map(|v| v.as_bytes()),
            Some(&b"nosniff"[..]),
            "{path}"
        );
        let hsts = headers
            .get("strict-transport-security")
            .with_context(|| format!("{path}: no HSTS"))?;
        assert!(hsts.to_str()?.starts_with("max-age="), "{path}: {hsts:?}");
    }
    let data_dir = h.server.data_dir().to_path_buf();
    let proxy = h.server.proxy_addr().context("no proxy listener")?;
    for (addr, path) in [
        (h.server.addr(), "/api/v1/namespaces"),
        (h.server.addr(), "/"),
        (proxy, "/healthz"),
        (proxy, "/no-such-page"),
    ] {
        let answer = anonymous_get(&data_dir, addr, "127.0.0.1", path).await?;
        let head = answer.split("\r\n\r\n").next().unwrap_or_default();
        assert_eq!(
            security_headers(head),
            (true, true),
            "{addr}{path} answered:\n{head}"
        );
    }
    // No HSTS for `localhost` (`rlark up`'s task proxy origin): it would hold for every
    // port of it.
    let answer = anonymous_get(&data_dir, proxy, "localhost", "/healthz").await?;
    let head = answer.split("\r\n\r\n").next().unwrap_or_default();
    assert_eq!(security_headers(head), (true, false), "{head}");
    h.stop().await
}

/// A service of the node that is no task's: answers any request with `node secret`.
async fn node_service() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 4096];
                let _ = tcp.read(&mut buffer).await;
                let _ = tcp
                    .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 12\r\n\r\nnode secret\n")
                    .await;
                let _ = tcp.shutdown().await;
            });
        }
    });
    Ok(port)
}

/// Issue 38, "the proxy and `ssh -L` reach any service on the node's loopback, not only
/// the task's": a granted user read a node-local service (here one in the test process,
/// which is not the replica) through the task proxy and through `ssh -W`. Now both are
/// refused with a message saying the port is not the replica's, and the replica's own
/// port still works both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_and_ssh_forwards_reach_only_the_tasks_ports() -> anyhow::Result<()> {
    if which("python3").is_none() || which("ssh").is_none() {
        missing_tool::skip_or_fail("python3 or ssh is not installed");
        return Ok(());
    }
    let supervisor = vec![env!("CARGO_BIN_EXE_rlark").into(), "supervise".into()];
    let h = Harness::start_configured(supervisor, |config| {
        config.ssh_listen = Some("127.0.0.1:0".parse().expect("address"));
    })
    .await?;
    let app_port = free_port()?;
    let prefix = start_app(&h, "mine", app_port).await?;
    let secret_port = node_service().await?;
    let dir = tempfile::tempdir()?;
    let vera = viewer_client(&h.server, &h.admin, dir.path()).await?;

    // The proxy: the replica's port yes, the node's service no.
    let (status, _, _) = get(&vera, &format!("{prefix}/"), &[]).await?;
    assert_eq!(status, 200);
    let other = format!("/rlark/v1/namespaces/{NAMESPACE}/tasks/mine-main/proxy/{secret_port}/");
    let (status, _, body) = get(&vera, &other, &[]).await?;
    assert!(
        !body.contains("node secret"),
        "the proxy reached the node's service"
    );
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("not the replica's"), "{body}");
    // Not even the admin reaches it through a task's proxy.
    let (status, _, body) = get(&h.admin, &other, &[]).await?;
    assert_eq!(status, 403, "{body}");

    // ssh -W (a direct-tcpip channel, as -L opens): the same.
    let endpoint = h.server.ssh().context("ssh")?.clone();
    std::fs::write(
        dir.path().join("known_hosts"),
        format!(
            "[127.0.0.1]:{} {}\n",
            endpoint.addr.port(),
            endpoint.host_key
        ),
    )?;
    let key = dir.path().join("vera-ssh");
    let out = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "vera", "-f"])
        .arg(&key)
        .output()?;
    ensure!(out.status.success(), "ssh-keygen: {}", text(&out.stderr));
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    let request = http::Request::post("/rlark/v1/sshkeys")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(json!({"publicKey": public}).to_string().into_bytes())?;
    vera.request::<Value>(request).await?;
    let stdio_forward = |port: u16| {
        let mut command = tokio::process::Command::new("ssh");
        command
            .args([
                "-F",
                "/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "IdentitiesOnly=yes",
            ])
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=20"])
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.path().join("known_hosts").display()
            ))
            .arg("-i")
            .arg(&key)
            .args(["-p", &endpoint.addr.port().to_string()])
            .args(["-W", &format!("localhost:{port}")])
            .arg("mine-main@127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        async move {
            let mut child = command.spawn()?;
            let mut stdin = child.stdin.take().context("stdin")?;
            // The request, then the end of input (the app answers and closes).
            stdin
                .write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                .await?;
            drop(stdin);
            let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
                .await
                .context("ssh -W timed out")??;
            anyhow::Ok(out)
        }
    };
    let out = stdio_forward(app_port).await?;
    assert!(
        text(&out.stdout).contains("HTTP/1.0 200"),
        "the replica's own port through ssh -W: {}",
        text(&out.stderr)
    );
    let out = stdio_forward(secret_port).await?;
    assert!(
        !text(&out.stdout).contains("node secret"),
        "ssh -W reached the node's service"
    );
    assert!(
        text(&out.stderr).contains("not the replica's"),
        "{}",
        text(&out.stderr)
    );
    h.stop().await
}
