//! The SSH endpoint (`rlark server --ssh-listen ADDR`, off by default): `ssh TASK@server`
//! opens a shell or runs a command in a replica, `ssh -L` forwards into its network view,
//! `sftp` and `scp` reach its working directory, and the login `menu` lists what the user
//! may reach. See docs/ssh.md.
//!
//! | module | what |
//! |---|---|
//! | [`host_key`] | the server's Ed25519 host key in `DATA_DIR/pki` |
//! | [`keys`] | users' registered public keys, in the store |
//! | [`key_routes`] | `/rlark/v1/sshkeys`: register, list, remove |
//! | [`auth`] | login names, credentials, revocation checks, authorization |
//! | [`handler`] | one connection (russh's `Handler`) and its revocation watch |
//! | [`session`] | one session channel: shell, command, sftp, through the agent's exec |
//! | [`exec`] | the agent exec, spoken by the server |
//! | [`forward`] | `-L` forwards through the tunnel |
//! | [`domain`] | a `domain` certificate's pod-network forwards, through the hub's relay |
//! | [`menu`] | the login `menu` |
//! | [`limits`] | connections, login deadline, sessions and channels per connection and user |

pub(crate) mod auth;
pub(crate) mod domain;
pub(crate) mod exec;
pub(crate) mod forward;
pub(crate) mod handler;
pub mod host_key;
pub(crate) mod key_routes;
pub(crate) mod keys;
pub(crate) mod limits;
pub(crate) mod menu;
pub(crate) mod session;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rlark_apiserver::audit::AuditSink;
use rlark_store::Store;
use russh::keys::ssh_key::PrivateKey;
use russh::{MethodKind, MethodSet};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::security::Security;
use crate::tunnel::Hub;

/// What the SSH code shares.
pub(crate) struct SshState {
    pub store: Arc<dyn Store>,
    pub hub: Arc<Hub>,
    pub security: Arc<Security>,
    pub audit: Arc<dyn AuditSink>,
    pub keys: Arc<keys::SshKeys>,
    /// `SHA256:...` of the installation's SSH CA.
    pub ssh_ca_fingerprint: String,
    /// Cancelled when the server stops.
    pub shutdown: CancellationToken,
    /// Connection, login and channel limits.
    pub limits: limits::SshLimits,
    /// Refusals by limit.
    pub metrics: limits::SshMetrics,
    /// Open channels per user, over all connections.
    pub user_channels: Arc<limits::UserChannels>,
}

/// The running SSH endpoint.
#[derive(Debug, Clone)]
pub struct SshEndpoint {
    /// The bound address.
    pub addr: SocketAddr,
    /// `SHA256:...` of the host key.
    pub host_key_fingerprint: String,
    /// The host key as `ssh-ed25519 AAAA...` (for `known_hosts`).
    pub host_key: String,
}

/// Binding the SSH listener or loading its key failed.
#[derive(Debug, thiserror::Error)]
pub enum SshServerError {
    #[error(transparent)]
    HostKey(#[from] host_key::HostKeyError),
    #[error("bind SSH listener {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// russh's configuration: the host key, public keys (and certificates) only, keep-alives.
fn config(key: PrivateKey) -> russh::server::Config {
    russh::server::Config {
        keys: vec![key],
        methods: MethodSet::from(&[MethodKind::PublicKey][..]),
        auth_rejection_time: Duration::from_millis(300),
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        keepalive_max: 3,
        nodelay: true,
        max_auth_attempts: 6,
        ..Default::default()
    }
}

/// Bind `listen`, load or make the host key in `pki_dir`, and serve until `state.shutdown`.
pub(crate) async fn start(
    listen: SocketAddr,
    pki_dir: &std::path::Path,
    state: Arc<SshState>,
) -> Result<(SshEndpoint, tokio::task::JoinHandle<()>), SshServerError> {
    let key = host_key::load_or_create(pki_dir)?;
    let endpoint_key = host_key::public_line(&key);
    let fingerprint = host_key::fingerprint(&key);
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| SshServerError::Bind {
            addr: listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| SshServerError::Bind {
            addr: listen,
            source,
        })?;
    let config = Arc::new(config(key));
    tracing::info!(%addr, host_key = %fingerprint, "SSH listening");
    let gate = crate::limits::Gate::with_caps("ssh", state.limits.gate_caps());
    let task = tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        tracing::warn!(%error, "SSH accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = state.shutdown.cancelled() => return,
            };
            let Some(permit) = gate.admit(peer.ip()) else {
                // The gate logs (rate-limited); the client gets a line before the close
                // (RFC 4253 allows lines before the version; `ssh -v` shows it).
                state.metrics.refused("connections");
                let _ = tcp.try_write(
                    b"rlark: SSH connection limit reached (ssh.maxConnections, \
                      ssh.maxConnectionsPerIP and the reserve are full); retry later\r\n",
                );
                continue;
            };
            let authenticated = Arc::new(AtomicBool::new(false));
            let handler = handler::Connection::new(
                Arc::clone(&state),
                Some(peer),
                Arc::clone(&authenticated),
            );
            let config = Arc::clone(&config);
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let _permit = permit;
                serve(&state, config, tcp, handler, peer, authenticated).await;
            });
        }
    });
    Ok((
        SshEndpoint {
            addr,
            host_key_fingerprint: fingerprint,
            host_key: endpoint_key,
        },
        task,
    ))
}

/// Run one connection; disconnect it when it has not authenticated within the login
/// deadline (`ssh.loginDeadlineSeconds`; the version exchange included).
async fn serve(
    state: &SshState,
    config: Arc<russh::server::Config>,
    tcp: tokio::net::TcpStream,
    handler: handler::Connection,
    peer: SocketAddr,
    authenticated: Arc<AtomicBool>,
) {
    let login_deadline = state.limits.login_deadline;
    let deadline = tokio::time::Instant::now() + login_deadline;
    let session = match tokio::time::timeout_at(
        deadline,
        russh::server::run_stream(config, tcp, handler),
    )
    .await
    {
        Ok(Ok(session)) => session,
        Ok(Err(error)) => {
            tracing::debug!(%error, %peer, "ssh handshake failed");
            return;
        }
        Err(_) => {
            state.metrics.refused("login-deadline");
            tracing::info!(%peer, ?login_deadline, "ssh client sent no version within the login deadline; disconnected");
            return;
        }
    };
    let handle = session.handle();
    let mut session = std::pin::pin!(session);
    tokio::select! {
        ended = &mut session => {
            if let Err(error) = ended {
                tracing::debug!(%error, %peer, "ssh connection ended");
            }
            return;
        }
        () = tokio::time::sleep_until(deadline) => {}
    }
    if !authenticated.load(Ordering::Acquire) {
        state.metrics.refused("login-deadline");
        tracing::info!(%peer, ?login_deadline, "ssh client did not authenticate within the login deadline; disconnected");
        let _ = handle
            .disconnect(
                russh::Disconnect::ByApplication,
                format!(
                    "rlark: authentication timed out (ssh.loginDeadlineSeconds: {}s)",
                    login_deadline.as_secs()
                ),
                String::new(),
            )
            .await;
    }
    if let Err(error) = session.await {
        tracing::debug!(%error, %peer, "ssh connection ended");
    }
}
