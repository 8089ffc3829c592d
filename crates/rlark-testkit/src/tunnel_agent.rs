//! A real tunnel agent for tests: joins an installation with a bootstrap token (as `rlark
//! join` does) and runs [`rlark_tunnel::client`] against one or more [`TestServer`]s.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use rlark_testkit::TestServer;
//! use rlark_testkit::tunnel_agent::TunnelAgent;
//! let server = TestServer::start().await?;
//! let agent = TunnelAgent::start(&[&server], "edge").await?;
//! // ... https://SERVER/api/proxy/edge/http/127.0.0.1:PORT/ reaches this host's PORT ...
//! agent.stop().await;
//! server.stop().await?;
//! # Ok(()) }
//! ```
//!
//! # Several servers, one CA
//!
//! An agent certificate is accepted by every server that trusts its CA. To run two servers
//! of one installation (hub replicas) in a test, give the second one a copy of the first
//! one's `pki/` directory before it starts ([`share_pki`]); it then loads that CA (and the
//! same admin certificate) instead of creating its own. Its store is new while its CA is
//! not, so it starts with `reinitialize_store` (a server refuses that otherwise):
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use rlark_testkit::TestServer;
//! use rlark_testkit::tunnel_agent::{TunnelAgent, share_pki};
//! let a = TestServer::start().await?;
//! let dir_b = tempfile::tempdir()?;
//! share_pki(a.data_dir(), dir_b.path())?;
//! let mut config_b = TestServer::config_for(dir_b.path());
//! config_b.reinitialize_store = true;
//! let b = TestServer::start_with(config_b).await?;
//! let agent = TunnelAgent::start(&[&a, &b], "edge").await?; // joins on `a`, connects to both
//! # Ok(()) }
//! ```
//!
//! Each server keeps its own database (tokens, certificate records, revocations): the agent
//! joins on the first server given, and a revocation made on one server is not seen by the
//! other.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use rlark_agent::join::{AgentCredentials, JoinOptions};
use rlark_tunnel::client::{ClientConfig, ClientHandle};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::TestServer;

/// Re-exported for tests whose crate does not depend on the tunnel crates directly.
pub use rlark_tunnel;
/// Re-exported (feature `handshake` only: `accept_async`, `client_async`, ...).
pub use tokio_tungstenite;

/// How long [`TunnelAgent::start`] waits for the agent to be connected to every server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Reconnect backoff of test agents: quick, so restarts are noticed fast.
pub const TEST_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Upper bound of the test agents' reconnect backoff.
pub const TEST_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Copy the `pki/` directory (CA, SSH CA, admin certificate) of the data directory `from`
/// into the data directory `to` (created with mode 0700 if missing), so that a server
/// started on `to` belongs to the same installation as the one on `from`. Call it before
/// the second server starts, with `ServerConfig::reinitialize_store` set: its store is new
/// while its CA is not, which a server refuses otherwise. File modes are kept (keys stay
/// 0600).
pub fn share_pki(from: &Path, to: &Path) -> anyhow::Result<()> {
    let source = from.join(rlark_server::PKI_DIR);
    let target = to.join(rlark_server::PKI_DIR);
    ensure!(
        source.is_dir(),
        "{} is not a directory: start the first server before sharing its PKI",
        source.display()
    );
    copy_dir(&source, &target)
}

fn copy_dir(source: &Path, target: &Path) -> anyhow::Result<()> {
    rlark_pki::create_private_dir(target)
        .with_context(|| format!("create {}", target.display()))?;
    for entry in std::fs::read_dir(source).with_context(|| format!("read {}", source.display()))? {
        let entry = entry.with_context(|| format!("read {}", source.display()))?;
        let kind = entry.file_type()?;
        let to = target.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &to)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &to)
                .with_context(|| format!("copy {} to {}", entry.path().display(), to.display()))?;
        }
    }
    Ok(())
}

/// Mint a bootstrap token bound to `cluster_id` on `server`, as its admin. Returns the
/// server's answer (`token`, `caHash`, `expiresAt`, ...).
pub async fn bootstrap_token(server: &TestServer, cluster_id: &str) -> anyhow::Result<Value> {
    let admin = server.client().await?;
    let body = json!({"kind": "bootstrap", "ttlSeconds": 600, "clusterID": cluster_id});
    let request = http::Request::post("/rlark/v1/tokens")
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::ACCEPT, "application/json")
        .body(body.to_string().into_bytes())
        .context("build token request")?;
    let value: Value = admin
        .request(request)
        .await
        .context("POST /rlark/v1/tokens")?;
    ensure!(value["token"].is_string(), "no token in {value}");
    Ok(value)
}

/// An agent of one cluster: its credentials (in a temporary directory) and its running
/// tunnel client. Stopped on [`TunnelAgent::stop`] or when dropped.
pub struct TunnelAgent {
    credentials: AgentCredentials,
    servers: Vec<String>,
    handle: ClientHandle,
    shutdown: CancellationToken,
    /// Cancels `shutdown` when the agent is dropped without [`TunnelAgent::stop`].
    _stop_on_drop: tokio_util::sync::DropGuard,
    /// Keeps the client's TLS config channel open.
    _tls: watch::Sender<Arc<rustls::ClientConfig>>,
    dir: TempDir,
}

impl std::fmt::Debug for TunnelAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunnelAgent")
            .field("cluster_id", &self.credentials.state.cluster_id)
            .field("servers", &self.servers)
            .field("connected", &self.handle.connected())
            .finish_non_exhaustive()
    }
}

impl TunnelAgent {
    /// Join as `cluster_id` (bootstrap token minted on `servers[0]` as admin), connect to
    /// every server in `servers` and wait (at most [`CONNECT_TIMEOUT`]) until connected to
    /// all of them. Backoff 100 ms .. 1 s.
    pub async fn start(servers: &[&TestServer], cluster_id: &str) -> anyhow::Result<TunnelAgent> {
        Self::start_with(servers, cluster_id, |_| {}).await
    }

    /// [`TunnelAgent::start`] with a chance to change the client configuration (mux and
    /// agent settings, backoff) before it runs.
    pub async fn start_with(
        servers: &[&TestServer],
        cluster_id: &str,
        configure: impl FnOnce(&mut ClientConfig),
    ) -> anyhow::Result<TunnelAgent> {
        crate::install_crypto_provider();
        crate::init_tracing();
        let Some(first) = servers.first() else {
            bail!("a tunnel agent needs at least one server");
        };
        let token = bootstrap_token(first, cluster_id).await?;
        let dir = tempfile::Builder::new()
            .prefix("rlark-agent-")
            .tempdir()
            .context("create agent directory")?;
        let options = JoinOptions {
            server: first.url(),
            token: token["token"].as_str().unwrap_or_default().to_string(),
            ca_hash: first.ca_cert_hash().to_string(),
            cluster_id: None,
            dir: dir.path().to_path_buf(),
        };
        let credentials = rlark_agent::join::join(&options)
            .await
            .with_context(|| format!("join as cluster {cluster_id}"))?;
        let tls_config = credentials
            .client_config()
            .context("agent TLS client config")?;
        let (tls, tls_rx) = watch::channel(tls_config);
        let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
        let mut config = ClientConfig::new(urls.clone(), tls_rx);
        config.backoff_min = TEST_BACKOFF_MIN;
        config.backoff_max = TEST_BACKOFF_MAX;
        configure(&mut config);
        let shutdown = CancellationToken::new();
        let handle = rlark_tunnel::client::spawn(config, shutdown.clone());
        let agent = TunnelAgent {
            credentials,
            servers: urls,
            handle,
            _stop_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            _tls: tls,
            dir,
        };
        agent.wait_connected(servers.len(), CONNECT_TIMEOUT).await?;
        for server in servers {
            agent.wait_listed(server, CONNECT_TIMEOUT).await?;
        }
        Ok(agent)
    }

    /// Wait until `server` lists a session of this agent in `GET /api/v1/tunnels` (as its
    /// admin); an error after `timeout`. The agent counts itself connected as soon as the
    /// WebSocket upgrade is answered, and the hub registers the session just after that:
    /// wait for this before dialing through a fresh connection.
    pub async fn wait_listed(&self, server: &TestServer, timeout: Duration) -> anyhow::Result<()> {
        let admin = server.client().await?;
        let cluster_id = self.cluster_id();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let request = http::Request::get("/api/v1/tunnels")
                .header(http::header::ACCEPT, "application/json")
                .body(Vec::new())
                .context("build request")?;
            let list: Value = admin
                .request(request)
                .await
                .context("GET /api/v1/tunnels")?;
            let listed = list["items"]
                .as_array()
                .is_some_and(|items| items.iter().any(|t| t["clusterID"] == cluster_id));
            if listed {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "{} does not list the tunnel of {cluster_id} after {timeout:?}: {list}",
                    server.url()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until connected to at least `n` servers; an error after `timeout`.
    pub async fn wait_connected(&self, n: usize, timeout: Duration) -> anyhow::Result<()> {
        match tokio::time::timeout(timeout, self.handle.wait_connected(n)).await {
            Ok(true) => Ok(()),
            Ok(false) => bail!("tunnel client of {self:?} stopped"),
            Err(_) => bail!(
                "{self:?} not connected to {n} server(s) within {timeout:?} (RUST_LOG=info \
                 shows the connection attempts)"
            ),
        }
    }

    /// Wait until connected to none of the servers; an error after `timeout`.
    pub async fn wait_disconnected(&self, timeout: Duration) -> anyhow::Result<()> {
        let mut rx = self.handle.watch();
        match tokio::time::timeout(timeout, rx.wait_for(Vec::is_empty)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Ok(()), // the client stopped: connected to nothing
            Err(_) => bail!("{self:?} still connected after {timeout:?}"),
        }
    }

    /// The servers connected right now (URLs as given, in order).
    pub fn connected(&self) -> Vec<String> {
        self.handle.connected()
    }

    /// The server URLs the agent connects to.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> &str {
        &self.credentials.state.cluster_id
    }

    /// The credentials written by the join.
    pub fn credentials(&self) -> &AgentCredentials {
        &self.credentials
    }

    /// The agent directory (`agent.pem`, `ca.crt`, `agent.json`, `agent.kubeconfig`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The running client.
    pub fn handle(&self) -> &ClientHandle {
        &self.handle
    }

    /// Close every session and wait (at most 10 s) until the client has stopped.
    pub async fn stop(self) {
        let TunnelAgent {
            handle,
            shutdown,
            dir,
            ..
        } = self;
        shutdown.cancel();
        if tokio::time::timeout(Duration::from_secs(10), handle.join())
            .await
            .is_err()
        {
            tracing::warn!("tunnel agent did not stop within 10 s");
        }
        drop(dir);
    }
}
