//! The direct path: agent to agent over mutual TLS, without the hub.
//!
//! An agent started with `--domain-listen ADDR` accepts TLS connections there and announces
//! `--domain-advertise HOST:PORT` in its Node's `status.network.directAddress`; the Domain
//! controller copies it into the DomainPeers as each member's `agentAddress`.
//!
//! Both ends present their agent certificate (`CN=system:rlark:agent:<cluster>`,
//! `O=rlark:agents`, issued by the installation CA at join and renewal) and verify the
//! other's chain to the installation CA bundle (`identity/ca.crt`):
//!
//! - the server requires a client certificate and takes the calling cluster from its
//!   subject, never from the request;
//! - the client checks that the server's certificate names the cluster it meant to reach
//!   (the destination member's `cluster`), not a host name: an agent address is just where
//!   that cluster's agent was announced, and only its certificate proves who answers.
//!   Agent certificates are client certificates (extended key usage `clientAuth` only), so
//!   the client verifies the server's chain for that usage too.
//!
//! After the handshake the client writes one stream header carrying the relay header
//! (`StreamRequest::Relay`, the tunnel's own framing: version, kind, length, body) and
//! reads one `StreamResponse`; after `ok`, a Tcp flow's bytes follow raw. The server hands
//! the flow to [`crate::inbound::Inbound`], which authorizes it like a relayed one.
//!
//! Revocation: both ends check the other's certificate serial against the revoked agent
//! serials the servers publish ([`crate::revocations`]) right after the handshake.
//! The listener closes a revoked client's connection without answering; the dialer drops a
//! revoked server's connection before sending anything and reports a TLS failure, so the
//! router relays that flow through the hub (which refuses a revoked agent's tunnel itself).
//! Until the set has been read once the listener does not accept and the dialer refuses.
//! Connections of a peer whose certificate is revoked while they are open are cut when the
//! new set arrives.
//!
//! Bulk transfer: both ends put [`ReadAhead`] under TLS (one `recv` per 64 KiB instead of
//! rustls' 4 KiB reads) and let rustls queue [`TLS_BUFFER_LIMIT`] of outgoing records, as
//! the tunnel does (figures: docs/benchmarks.md, `rlark bench net`).

use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use rlark_tunnel::header::{self, ReadHeaderError, Status, StreamRequest, StreamResponse};
use rlark_tunnel::relay::RelayHeader;
use rlark_tunnel::transport::{ReadAhead, TLS_BUFFER_LIMIT};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio::io::AsyncWriteExt as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::inbound::Inbound;
use crate::metrics::PathKind;
use crate::revocations::{Direction, Revocations};
use crate::router::{BoxStream, DirectDialer, DirectError};

/// Subject CN prefix of agent certificates (`system:rlark:agent:<clusterID>`).
pub const AGENT_USER_PREFIX: &str = "system:rlark:agent:";
/// Subject O of agent certificates.
pub const AGENT_GROUP: &str = "rlark:agents";
/// How long an accepted connection may take to finish TLS and send its header.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Server-name suffix of the expected cluster in the client's verifier (never sent: SNI
/// is off).
const NAME_SUFFIX: &str = ".agents.rlark.invalid";

/// Failures building the TLS configuration.
#[derive(Debug, thiserror::Error)]
pub enum DirectTlsError {
    #[error("direct path TLS: {0}")]
    Config(String),
}

fn config_err(what: &str, e: impl std::fmt::Display) -> DirectTlsError {
    DirectTlsError::Config(format!("{what}: {e}"))
}

/// The TLS configurations of both directions, from one agent's credentials.
pub struct DirectTls {
    server: tokio_rustls::TlsAcceptor,
    client: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for DirectTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectTls").finish_non_exhaustive()
    }
}

impl DirectTls {
    /// From PEM: the agent certificate, its key, the installation CA bundle.
    pub fn new(cert_pem: &str, key_pem: &str, ca_pem: &str) -> Result<Self, DirectTlsError> {
        let provider = Arc::new(rlark_pki::tls_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| config_err("CA bundle", e))?;
            roots.add(cert).map_err(|e| config_err("CA bundle", e))?;
        }
        let roots = Arc::new(roots);
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| config_err("certificate", e))?;
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| config_err("key", e))?;
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| config_err("client verifier", e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| config_err("server", e))?
            .with_client_cert_verifier(verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| config_err("server certificate", e))?;
        let mut client = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| config_err("client", e))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(
                rlark_pki::ServerVerifier::client_auth_chain(verifier, provider, check_cluster),
            ))
            .with_client_auth_cert(chain, key)
            .map_err(|e| config_err("client certificate", e))?;
        client.enable_sni = false;
        Ok(DirectTls {
            server: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
            client: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}

/// The address to announce for a direct listener on `listen`: `advertise` when given, else
/// `listen` itself when it names one IP (not `0.0.0.0` / `::`).
pub fn advertised_address(listen: SocketAddr, advertise: Option<&str>) -> Option<String> {
    match advertise {
        Some(advertise) => Some(advertise.to_string()),
        None if listen.ip().is_unspecified() => None,
        None => Some(listen.to_string()),
    }
}

/// The cluster an agent certificate (already verified to chain to the CA) names, or why
/// it names none.
pub fn cluster_of(cert_der: &[u8]) -> Result<String, String> {
    let (user, groups) = rlark_pki::identity_from_cert_der(cert_der).map_err(|e| e.to_string())?;
    let Some(cluster) = user.strip_prefix(AGENT_USER_PREFIX) else {
        return Err(format!("certificate of {user:?} is not an agent's"));
    };
    if !groups.iter().any(|g| g == AGENT_GROUP) {
        return Err(format!(
            "certificate of {user:?} is not in group {AGENT_GROUP}"
        ));
    }
    if let Some(problem) = crate::membership::cluster_id_problem(cluster) {
        return Err(format!("certificate of {user:?}: cluster ID {problem}"));
    }
    Ok(cluster.to_string())
}

/// The client's check of the server beyond its chain to the CA (verified for client-auth
/// usage, what agent certificates carry): the cluster it names is the one dialed.
fn check_cluster(
    end_entity: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
) -> Result<(), String> {
    let ServerName::DnsName(name) = server_name else {
        return Err("direct path: the expected cluster is not a name".into());
    };
    let expected = name.as_ref().strip_suffix(NAME_SUFFIX).unwrap_or_default();
    let cluster = cluster_of(end_entity.as_ref())?;
    if cluster != expected {
        return Err(format!(
            "the agent answering is of cluster {cluster}, not {expected}"
        ));
    }
    Ok(())
}

/// Both ends of the direct path, with TLS that follows certificate renewals
/// ([`DirectEndpoint::update`]) and peers checked against `revocations`. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DirectEndpoint {
    tls: Arc<RwLock<Arc<DirectTls>>>,
    revocations: Revocations,
}

/// The serial of a peer's (chain-verified) certificate, as the servers publish it.
fn serial_of(cert_der: &[u8]) -> Result<String, String> {
    rlark_pki::CertInfo::from_der(cert_der)
        .map(|info| info.serial)
        .map_err(|e| format!("peer certificate: {e}"))
}

impl DirectEndpoint {
    pub fn new(tls: DirectTls, revocations: Revocations) -> Self {
        DirectEndpoint {
            tls: Arc::new(RwLock::new(Arc::new(tls))),
            revocations,
        }
    }

    /// The revoked agent certificates this endpoint refuses.
    pub fn revocations(&self) -> Revocations {
        self.revocations.clone()
    }

    /// Use `tls` (renewed credentials) for new connections.
    pub fn update(&self, tls: DirectTls) {
        *self.tls.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(tls);
    }

    fn current(&self) -> Arc<DirectTls> {
        self.tls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connect to the agent at `address`, which must be of `cluster`; send `header`; read
    /// the answer. Everything within `timeout`.
    pub async fn connect(
        &self,
        address: &str,
        cluster: &str,
        header: &RelayHeader,
        timeout: Duration,
    ) -> Result<BoxStream, DirectError> {
        let tls = self.current();
        // Not even a connection before the set is known: the router relays instead.
        if let Err(refusal) = self.revocations.ensure_known(Direction::Outbound) {
            return Err(DirectError::Other {
                address: address.to_string(),
                reason: refusal.to_string(),
            });
        }
        let attempt = async {
            let tcp = TcpStream::connect(address)
                .await
                .map_err(|source| DirectError::Connect {
                    address: address.to_string(),
                    source,
                })?;
            let _ = tcp.set_nodelay(true);
            let name = ServerName::try_from(format!("{cluster}{NAME_SUFFIX}")).map_err(|e| {
                DirectError::Other {
                    address: address.to_string(),
                    reason: format!("cluster {cluster:?} cannot be verified: {e}"),
                }
            })?;
            let mut stream = tls
                .client
                .connect(name, ReadAhead::new(tcp))
                .await
                .map_err(|e| DirectError::Tls {
                    address: address.to_string(),
                    reason: e.to_string(),
                })?;
            stream.get_mut().1.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
            let tls_error = |reason: String| DirectError::Tls {
                address: address.to_string(),
                reason,
            };
            let serial = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or_else(|| tls_error("no server certificate".into()))
                .and_then(|cert| serial_of(cert.as_ref()).map_err(tls_error))?;
            // Dropped unanswered: nothing is sent to a revoked peer.
            self.revocations
                .admit(&serial, Direction::Outbound)
                .map_err(|refusal| {
                    tls_error(format!(
                        "the agent of cluster {cluster} answered with {refusal}"
                    ))
                })?;
            let mut stream = self.revocations.track(&serial, Direction::Outbound, stream);
            let other = |reason: String| DirectError::Other {
                address: address.to_string(),
                reason,
            };
            let request = header
                .to_request()
                .map_err(|e| other(e.to_string()))?
                .encode()
                .map_err(|e| other(e.to_string()))?;
            stream
                .write_all(&request)
                .await
                .map_err(|e| DirectError::Other {
                    address: address.to_string(),
                    reason: format!("send the header: {e}"),
                })?;
            let response =
                header::read_response(&mut stream)
                    .await
                    .map_err(|e| DirectError::Other {
                        address: address.to_string(),
                        reason: format!("read the answer: {e}"),
                    })?;
            if response.status != Status::Ok {
                return Err(DirectError::Answer {
                    address: address.to_string(),
                    status: response.status,
                    message: response.message,
                });
            }
            Ok(Box::new(stream) as BoxStream)
        };
        match tokio::time::timeout(timeout, attempt).await {
            Ok(result) => result,
            Err(_) => Err(DirectError::Timeout {
                address: address.to_string(),
                timeout,
            }),
        }
    }

    /// Accept direct connections on `listener` until `shutdown`, each served by `inbound`
    /// with the cluster of its client certificate.
    /// Nothing is accepted before the revoked agent certificates are known (connections wait
    /// in the listen backlog; dialers time out and relay).
    pub async fn serve(self, listener: TcpListener, inbound: Inbound, shutdown: CancellationToken) {
        if !self.revocations.is_known() {
            tracing::info!("direct listener: waiting for the revoked agent certificates");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.revocations.wait_known() => {}
            }
        }
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "direct listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (endpoint, inbound, shutdown) = (self.clone(), inbound.clone(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = endpoint.serve_one(tcp, remote, inbound) => {}
                }
            });
        }
    }

    async fn serve_one(&self, tcp: TcpStream, remote: SocketAddr, inbound: Inbound) {
        let _ = tcp.set_nodelay(true);
        let tls = self.current();
        let setup = async {
            let mut stream = tls
                .server
                .accept(ReadAhead::new(tcp))
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            stream.get_mut().1.set_buffer_limit(Some(TLS_BUFFER_LIMIT));
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .ok_or("no client certificate")?;
            let cluster = cluster_of(cert.as_ref())?;
            let serial = serial_of(cert.as_ref())?;
            // Closed unanswered: a revoked client learns nothing here.
            self.revocations
                .admit(&serial, Direction::Inbound)
                .map_err(|refusal| format!("cluster {cluster}: {refusal}"))?;
            let mut stream = self.revocations.track(&serial, Direction::Inbound, stream);
            let request = match header::read_request(&mut stream).await {
                Ok(request) => request,
                Err(ReadHeaderError::Header(e)) => {
                    reply(&mut stream, Status::BadRequest, e.to_string()).await;
                    return Err(format!("bad header from cluster {cluster}: {e}"));
                }
                Err(ReadHeaderError::Io(e)) => return Err(format!("read the header: {e}")),
            };
            let StreamRequest::Relay(body) = request else {
                reply(
                    &mut stream,
                    Status::Forbidden,
                    "the direct path carries relay streams only".into(),
                )
                .await;
                return Err(format!("cluster {cluster} sent a non-relay header"));
            };
            let relay = match RelayHeader::decode(&body) {
                Ok(relay) => relay,
                Err(e) => {
                    reply(&mut stream, Status::BadRequest, e.to_string()).await;
                    return Err(format!("bad relay header from cluster {cluster}: {e}"));
                }
            };
            if relay.source_cluster.is_some() {
                reply(
                    &mut stream,
                    Status::BadRequest,
                    "source_cluster may not be set on the direct path (the certificate names \
                     the caller)"
                        .into(),
                )
                .await;
                return Err(format!("cluster {cluster} set source_cluster"));
            }
            Ok((stream, cluster, relay))
        };
        match tokio::time::timeout(ACCEPT_TIMEOUT, setup).await {
            Err(_) => tracing::debug!(%remote, "direct connection: no header in time"),
            Ok(Err(reason)) => tracing::info!(%remote, %reason, "direct connection refused"),
            Ok(Ok((stream, cluster, relay))) => {
                inbound
                    .serve(relay, Some(cluster), Box::new(stream), PathKind::Direct)
                    .await;
            }
        }
    }
}

/// Write an error answer and end the stream, bounded.
async fn reply<S: tokio::io::AsyncWrite + Unpin>(stream: &mut S, status: Status, message: String) {
    let write = async {
        stream
            .write_all(&StreamResponse::error(status, message).encode())
            .await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), write).await;
}

impl DirectDialer for DirectEndpoint {
    fn open(
        &self,
        address: String,
        cluster: String,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DirectError>> {
        let endpoint = self.clone();
        Box::pin(async move { endpoint.connect(&address, &cluster, &header, timeout).await })
    }
}

#[cfg(test)]
mod tests;
