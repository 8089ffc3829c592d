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
//! | [`menu`] | the login `menu` |

pub(crate) mod auth;
pub(crate) mod exec;
pub(crate) mod forward;
pub(crate) mod handler;
pub mod host_key;
pub(crate) mod key_routes;
pub(crate) mod keys;
pub(crate) mod menu;
pub(crate) mod session;

use std::net::SocketAddr;
use std::sync::Arc;
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
            let handler = handler::Connection::new(Arc::clone(&state), Some(peer));
            let config = Arc::clone(&config);
            tokio::spawn(async move {
                match russh::server::run_stream(config, tcp, handler).await {
                    Ok(session) => {
                        if let Err(error) = session.await {
                            tracing::debug!(%error, %peer, "ssh connection ended");
                        }
                    }
                    Err(error) => tracing::debug!(%error, %peer, "ssh handshake failed"),
                }
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
