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

pub(crate) mod auth;
pub(crate) mod domain;
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
    let caps = Arc::new(Caps::default());
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
            let Some(slot) = Caps::take(&caps, peer.ip()) else {
                tracing::warn!(%peer, "SSH connection refused: too many connections");
                continue;
            };
            let authenticated = Arc::new(AtomicBool::new(false));
            let handler = handler::Connection::new(
                Arc::clone(&state),
                Some(peer),
                Arc::clone(&authenticated),
            );
            let config = Arc::clone(&config);
            tokio::spawn(async move {
                let _slot = slot;
                serve(config, tcp, handler, peer, authenticated).await;
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

/// Most SSH connections at once, and from one source address.
const MAX_CONNECTIONS: usize = 1024;
const MAX_CONNECTIONS_PER_IP: usize = 64;
/// A client must have authenticated this long after connecting, or it is disconnected.
const AUTH_DEADLINE: Duration = Duration::from_secs(30);

/// Open connections, in all and per source address.
#[derive(Default)]
struct Caps {
    per_ip: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection's place in [`Caps`], given back when dropped.
struct Slot {
    caps: Arc<Caps>,
    ip: std::net::IpAddr,
}

impl Caps {
    fn take(caps: &Arc<Caps>, ip: std::net::IpAddr) -> Option<Slot> {
        let mut per_ip = caps
            .per_ip
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = per_ip.values().sum();
        let mine = per_ip.entry(ip).or_default();
        if total >= MAX_CONNECTIONS || *mine >= MAX_CONNECTIONS_PER_IP {
            return None;
        }
        *mine += 1;
        Some(Slot {
            caps: Arc::clone(caps),
            ip,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_ip = self
            .caps
            .per_ip
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = per_ip.get_mut(&self.ip) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                per_ip.remove(&self.ip);
            }
        }
    }
}

/// Run one connection; disconnect it when it has not authenticated within
/// [`AUTH_DEADLINE`] (the version exchange included).
async fn serve(
    config: Arc<russh::server::Config>,
    tcp: tokio::net::TcpStream,
    handler: handler::Connection,
    peer: SocketAddr,
    authenticated: Arc<AtomicBool>,
) {
    let deadline = tokio::time::Instant::now() + AUTH_DEADLINE;
    let session =
        match tokio::time::timeout_at(deadline, russh::server::run_stream(config, tcp, handler))
            .await
        {
            Ok(Ok(session)) => session,
            Ok(Err(error)) => {
                tracing::debug!(%error, %peer, "ssh handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "ssh client sent no version within the deadline");
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
        tracing::info!(%peer, "ssh client did not authenticate within {AUTH_DEADLINE:?}");
        let _ = handle
            .disconnect(
                russh::Disconnect::ByApplication,
                "authentication timed out".into(),
                String::new(),
            )
            .await;
    }
    if let Err(error) = session.await {
        tracing::debug!(%error, %peer, "ssh connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_per_source_and_given_back() {
        let caps = Arc::new(Caps::default());
        let a: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let b: std::net::IpAddr = "192.0.2.2".parse().unwrap();
        let mut held: Vec<Slot> = (0..MAX_CONNECTIONS_PER_IP)
            .map(|_| Caps::take(&caps, a).expect("under the cap"))
            .collect();
        assert!(
            Caps::take(&caps, a).is_none(),
            "one more from the same source"
        );
        let other = Caps::take(&caps, b).expect("another source is not affected");
        held.pop();
        assert!(
            Caps::take(&caps, a).is_some(),
            "a closed connection frees its slot"
        );
        drop(other);
        drop(held);
        assert!(caps.per_ip.lock().unwrap().is_empty());
    }
}
