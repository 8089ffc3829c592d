//! A minimal HTTPS/1.1 keep-alive client for the benchmarks.
//!
//! Each [`Connection`] is one TLS connection (admin client certificate from the kubeconfig)
//! carrying requests one after another, so a worker that owns a connection measures
//! keep-alive request/response cost, not connection setup. Bodies are sent as prepared bytes
//! and responses are read as bytes: the client does as little work as possible because it
//! shares the CPU with the server it measures.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use kube::client::ConfigExt as _;
use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Path of the warm-up request of [`Reconnecting::warm`].
const WARM_PATH: &str = "/healthz";

/// Where and how to connect: address, TLS settings and `Host` header.
#[derive(Clone)]
pub struct Target {
    addr: SocketAddr,
    connector: tokio_rustls::TlsConnector,
    server_name: ServerName<'static>,
    authority: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("addr", &self.addr)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// TLS settings (CA and client certificate) from a kubeconfig; connect to `addr`.
    pub async fn from_kubeconfig(path: &Path, addr: SocketAddr) -> anyhow::Result<Self> {
        let kubeconfig = Kubeconfig::read_from(path)
            .with_context(|| format!("read kubeconfig {}", path.display()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("load kubeconfig")?;
        let tls = config
            .rustls_client_config()
            .context("TLS settings of the kubeconfig")?;
        let host = config
            .cluster_url
            .host()
            .ok_or_else(|| anyhow!("kubeconfig server URL {} has no host", config.cluster_url))?;
        // IPv6 literals come bracketed in URLs; ServerName wants them bare.
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let server_name = ServerName::try_from(bare)
            .with_context(|| format!("server name {host:?} of the kubeconfig"))?;
        let authority = config
            .cluster_url
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_else(|| addr.to_string());
        Ok(Self {
            addr,
            connector: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            server_name,
            authority,
        })
    }

    /// Open one TLS connection and complete the HTTP/1.1 handshake.
    pub async fn connect(&self) -> anyhow::Result<Connection> {
        let tcp = TcpStream::connect(self.addr)
            .await
            .with_context(|| format!("connect to {}", self.addr))?;
        tcp.set_nodelay(true).context("set TCP_NODELAY")?;
        let tls = self
            .connector
            .connect(self.server_name.clone(), tcp)
            .await
            .context("TLS handshake")?;
        let (sender, conn) = http1::handshake(TokioIo::new(tls))
            .await
            .context("HTTP/1.1 handshake")?;
        let driver = tokio::spawn(async move {
            if let Err(error) = conn.await {
                tracing::debug!(%error, "benchmark connection ended with an error");
            }
        });
        Ok(Connection {
            sender,
            driver,
            authority: self.authority.clone(),
        })
    }
}

/// One keep-alive HTTPS connection. Requests go one at a time.
#[derive(Debug)]
pub struct Connection {
    sender: http1::SendRequest<Full<Bytes>>,
    driver: JoinHandle<()>,
    authority: String,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A complete response: status, body bytes, and when the head arrived.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Bytes,
    /// When the response head (status line and headers) was received.
    pub head_at: Instant,
}

impl Connection {
    /// Whether the connection can carry another request (the server did not close it).
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Send a request and return the response head; the body is left to the caller.
    pub async fn send(
        &mut self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> anyhow::Result<Response<Incoming>> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::HOST, &self.authority)
            .header(header::ACCEPT, "application/json");
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        let request = builder
            .body(Full::new(body.unwrap_or_default()))
            .context("build request")?;
        self.sender.ready().await.context("connection not ready")?;
        self.sender
            .send_request(request)
            .await
            .context("send request")
    }

    /// Send a request and read the whole response body.
    pub async fn request(
        &mut self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> anyhow::Result<Reply> {
        let response = self.send(method, path_and_query, body).await?;
        let head_at = Instant::now();
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .context("read response body")?
            .to_bytes();
        Ok(Reply {
            status,
            body,
            head_at,
        })
    }
}

/// Fail with the status and (the start of) the body unless `reply` has status `expected`.
pub fn expect_status(reply: &Reply, expected: StatusCode) -> anyhow::Result<()> {
    if reply.status == expected {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&reply.body);
    let snippet: String = text.chars().take(300).collect();
    bail!("HTTP {} (expected {expected}): {snippet}", reply.status)
}

/// A connection that is reopened when the server closed it.
#[derive(Debug)]
pub struct Reconnecting {
    target: Target,
    conn: Option<Connection>,
    /// Connections opened so far.
    pub opened: usize,
}

impl Reconnecting {
    /// Not connected yet: the first request connects.
    pub fn new(target: Target) -> Self {
        Self {
            target,
            conn: None,
            opened: 0,
        }
    }

    /// Connect now and send one untimed `GET /healthz`, so that timed requests find a warm
    /// keep-alive connection. Returns how long that first request took: on a fresh
    /// connection it shows delays that only the first exchange after the TLS handshake pays.
    pub async fn warm(&mut self) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let reply = self.request(Method::GET, WARM_PATH, None).await?;
        expect_status(&reply, StatusCode::OK).context("warm-up GET /healthz")?;
        Ok(start.elapsed())
    }

    async fn connection(&mut self) -> anyhow::Result<&mut Connection> {
        if self.conn.as_ref().is_some_and(|c| !c.is_open()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let conn = self.target.connect().await?;
            self.opened += 1;
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| anyhow!("connection vanished"))
    }

    /// [`Connection::request`] over the current connection (reopened when needed). A failed
    /// request drops the connection, so the next one starts clean.
    pub async fn request(
        &mut self,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> anyhow::Result<Reply> {
        let conn = self.connection().await?;
        let result = conn.request(method, path_and_query, body).await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }
}
