//! Test support: start an rlark server in-process on an ephemeral port, or run the real
//! binary as a child process.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let server = rlark_testkit::TestServer::start().await?;
//! let client = server.client().await?;
//! // ... use `client` (a kube::Client with the admin certificate) ...
//! server.stop().await?;
//! # Ok(()) }
//! ```

pub mod docker;
pub mod kubesim;
pub mod netns;
#[path = "../../../tests/support/pg_cluster.rs"]
pub mod postgres;
pub mod real_agent;
pub mod tunnel_agent;
pub mod wait;

/// The simulated agent lives in its own crate ([`rlark_sim`], also used by `rlark-bench`);
/// re-exported here so tests keep naming it through the test kit.
pub use rlark_sim::{Behaviour, HeartbeatMode, SimAgent, SimAgentBuilder, SimAgentError, SimNode};

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use rlark_server::{RunningServer, ServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tempfile::TempDir;

/// How long [`ServerProcess::spawn`] and [`ServerProcess::terminate`] wait at most.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(30);

/// Install ring as the process-wide rustls provider (kube's client needs one). Idempotent;
/// a provider installed by someone else is left in place.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err only means a provider is already installed, which is what we want.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Send logs of the code under test to the test harness's captured output, filtered by
/// `RUST_LOG` (default `warn`). Idempotent.
pub fn init_tracing() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// A kube client from a kubeconfig file (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    install_crypto_provider();
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("read kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("load kubeconfig {}", path.display()))?;
    kube::Client::try_from(config).context("build kube client")
}

enum DataDir {
    Temp(TempDir),
    Given(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Temp(t) => t.path(),
            DataDir::Given(p) => p,
        }
    }
}

/// An rlark server running in this process on `127.0.0.1:<random port>`.
pub struct TestServer {
    server: RunningServer,
    dir: DataDir,
}

impl TestServer {
    /// Start on a fresh temporary data directory (removed by [`TestServer::stop`]).
    pub async fn start() -> anyhow::Result<TestServer> {
        let dir = tempfile::Builder::new()
            .prefix("rlark-test-")
            .tempdir()
            .context("create temporary data directory")?;
        let config = Self::config_for(dir.path());
        Self::start_config(config, DataDir::Temp(dir)).await
    }

    /// Start on a fresh temporary data directory (removed by [`TestServer::stop`]) with the
    /// default test configuration changed by `configure`.
    pub async fn start_configured(
        configure: impl FnOnce(&mut ServerConfig),
    ) -> anyhow::Result<TestServer> {
        let dir = tempfile::Builder::new()
            .prefix("rlark-test-")
            .tempdir()
            .context("create temporary data directory")?;
        let mut config = Self::config_for(dir.path());
        configure(&mut config);
        Self::start_config(config, DataDir::Temp(dir)).await
    }

    /// Start on `dir` (created if missing, kept on stop): use it to restart a server on the
    /// same data.
    pub async fn start_in(dir: &Path) -> anyhow::Result<TestServer> {
        Self::start_config(Self::config_for(dir), DataDir::Given(dir.to_path_buf())).await
    }

    /// Start with a custom configuration (its `data_dir` is kept on stop).
    pub async fn start_with(config: ServerConfig) -> anyhow::Result<TestServer> {
        let dir = DataDir::Given(config.data_dir.clone());
        Self::start_config(config, dir).await
    }

    /// The default test configuration for `dir`: loopback, port 0, 2 s shutdown grace.
    pub fn config_for(dir: &Path) -> ServerConfig {
        let mut config = ServerConfig::new(dir);
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.shutdown_grace = Duration::from_secs(2);
        config
    }

    async fn start_config(config: ServerConfig, dir: DataDir) -> anyhow::Result<TestServer> {
        install_crypto_provider();
        init_tracing();
        let server = rlark_server::start(config)
            .await
            .context("start rlark server")?;
        Ok(TestServer { server, dir })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.server.local_addr
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The admin kubeconfig written by the server.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.server.kubeconfig_path
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The SSH endpoint, when the configuration set `ssh_listen`.
    pub fn ssh(&self) -> Option<&rlark_server::ssh::SshEndpoint> {
        self.server.ssh.as_ref()
    }

    /// The task proxy origin's bound address, when the configuration set `proxy_listen`.
    pub fn proxy_addr(&self) -> Option<SocketAddr> {
        self.server.proxy_addr
    }

    /// `sha256:<hex>` of the CA public key.
    pub fn ca_cert_hash(&self) -> &str {
        &self.server.ca_cert_hash
    }

    /// A kube client authenticated as the admin (`CN=admin, O=system:masters`).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(self.kubeconfig_path()).await
    }

    /// Shut down gracefully; a temporary data directory is removed.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.server
            .shutdown()
            .await
            .context("shut down rlark server")?;
        drop(self.dir);
        Ok(())
    }

    /// Shut down gracefully and start again on the same data directory (new port), with the
    /// default test configuration (what [`Self::start_configured`] changed is not kept).
    pub async fn restart(self) -> anyhow::Result<TestServer> {
        let TestServer { server, dir } = self;
        server.shutdown().await.context("shut down rlark server")?;
        let config = Self::config_for(dir.path());
        Self::start_config(config, dir).await
    }
}

/// The real `rlark` binary running `rlark server` as a child process.
///
/// Synchronous, so it works from plain `#[test]`s and from async tests alike (it never
/// needs a runtime). Its stderr (the logs) goes to `DATA_DIR/server.log`. The child is
/// killed when this value is dropped.
pub struct ServerProcess {
    child: Child,
    data_dir: PathBuf,
    kubeconfig_path: PathBuf,
    log_path: PathBuf,
}

impl ServerProcess {
    /// Run `BINARY server --data-dir DATA_DIR --listen 127.0.0.1:0` and wait (at most
    /// [`PROCESS_TIMEOUT`]) until it has written a new `admin.kubeconfig` and answers
    /// `/readyz`. A stale kubeconfig is removed first, so the one waited for is this
    /// process's.
    pub fn spawn(binary: &Path, data_dir: &Path) -> anyhow::Result<ServerProcess> {
        Self::spawn_with_args(binary, data_dir, &[])
    }

    /// Like [`ServerProcess::spawn`] with extra arguments after `server`'s own.
    pub fn spawn_with_args(
        binary: &Path,
        data_dir: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<ServerProcess> {
        install_crypto_provider();
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("create {}", data_dir.display()))?;
        let kubeconfig_path = rlark_server::admin_kubeconfig_path(data_dir);
        match std::fs::remove_file(&kubeconfig_path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("remove stale kubeconfig"),
        }
        let log_path = data_dir.join("server.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("open {}", log_path.display()))?;
        let child = Command::new(binary)
            .arg("server")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", binary.display()))?;
        let mut process = ServerProcess {
            child,
            data_dir: data_dir.to_path_buf(),
            kubeconfig_path,
            log_path,
        };
        process.wait_ready()?;
        Ok(process)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        let mut last_error = String::from("kubeconfig not written yet");
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "rlark server exited early with {status}; log:\n{}",
                    self.log_tail()
                );
            }
            if self.kubeconfig_path.exists() {
                match self.probe("/readyz") {
                    Ok((200, body)) if body.trim() == "ok" => return Ok(()),
                    Ok((status, body)) => last_error = format!("/readyz: {status} {body:?}"),
                    Err(e) => last_error = format!("{e:#}"),
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "rlark server not ready after {PROCESS_TIMEOUT:?} ({last_error}); log:\n{}",
            self.log_tail()
        )
    }

    /// The server's address, from its kubeconfig.
    pub fn addr(&self) -> anyhow::Result<SocketAddr> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig_path)
            .with_context(|| format!("read {}", self.kubeconfig_path.display()))?;
        let server = kubeconfig
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .context("kubeconfig names no server")?;
        let uri: http::Uri = server.parse().context("parse server URL")?;
        let authority = uri.authority().context("server URL has no host")?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let ip: std::net::IpAddr = host.parse().context("server host is not an IP address")?;
        Ok(SocketAddr::new(ip, authority.port_u16().unwrap_or(443)))
    }

    /// An anonymous HTTPS GET (no client certificate; the server's CA is trusted) with a
    /// blocking client; returns status code and body. For health probes.
    pub fn probe(&self, path: &str) -> anyhow::Result<(u16, String)> {
        let addr = self.addr()?;
        let ca = CertificateDer::from_pem_file(self.data_dir.join("pki").join("ca.crt"))
            .context("read CA certificate")?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca)?;
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = ServerName::IpAddress(addr.ip().into());
        let conn = rustls::ClientConnection::new(Arc::new(config), name)?;
        let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        tls.flush()?;
        let mut response = Vec::new();
        match tls.read_to_end(&mut response) {
            Ok(_) => {}
            // The server may close without close_notify; what arrived is still usable.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !response.is_empty() => {}
            Err(e) => return Err(e).context("read response"),
        }
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("malformed response {head:?}"))?;
        Ok((status, body.to_string()))
    }

    /// The last 50 lines of the server log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(50)..].join("\n")
    }

    /// The admin kubeconfig written by this process.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A kube client authenticated as the admin (needs a Tokio runtime to be used).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        client_from_kubeconfig(&self.kubeconfig_path).await
    }

    /// SIGKILL the process and reap it. Idempotent.
    pub fn kill_9(&mut self) -> anyhow::Result<()> {
        if self.child.try_wait()?.is_none() {
            self.child.kill().context("kill -9 rlark server")?;
        }
        self.child.wait().context("reap rlark server")?;
        Ok(())
    }

    /// SIGTERM the process and wait (at most [`PROCESS_TIMEOUT`]) for it to exit; returns its
    /// exit status. On timeout the process is killed and an error returned.
    pub fn terminate(mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            bail!("rlark server had already exited with {status}");
        }
        let pid = self.child.id().to_string();
        // `kill` keeps this crate free of unsafe code and of a signal-handling dependency.
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .context("run kill -TERM")?;
        if !status.success() {
            bail!("kill -TERM {pid} failed: {status}");
        }
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.kill_9();
        bail!(
            "rlark server did not exit within {PROCESS_TIMEOUT:?} of SIGTERM; log:\n{}",
            self.log_tail()
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A temporary directory a test shares with its tasks' replicas: they run as users of
/// their own (docs/security.md, "Replica isolation"), so it is open to every user and
/// sticky (mode 1777), as `/tmp` is. A plain `tempfile::tempdir()` (0700) is the test's
/// alone.
pub fn shared_tempdir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))?;
    Ok(dir)
}
