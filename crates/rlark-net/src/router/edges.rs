//! The router's network edges as traits, each with its production implementation: the hub's
//! relay streams, a replica's sockets, the direct dialer to peer agents.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::Status;
use rlark_tunnel::relay::{Protocol, RelayHeader};
use tokio::net::TcpStream;

use super::Router;
pub use crate::pods::BoxStream;

/// Opens relay streams through the hub (implemented by the tunnel's `HubStreams`).
pub trait HubRelay: Send + Sync + 'static {
    /// Ok: the stream after the destination's `Ok` answer. Err: the answer (or the
    /// tunnel's own reason).
    fn open(
        &self,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DialError>>;
}

/// The datagram plane's opener for one replica: its Udp/Icmp flows take the router's
/// routes ([`Router::open_header`], which also refuses a source that is not the replica's).
#[derive(Clone)]
pub struct ReplicaOpener {
    router: Router,
    pod: String,
}

impl ReplicaOpener {
    pub fn new(router: Router, pod: impl Into<String>) -> Self {
        ReplicaOpener {
            router,
            pod: pod.into(),
        }
    }
}

impl crate::datagram::Opener for ReplicaOpener {
    fn open(&self, header: RelayHeader) -> BoxFuture<'_, io::Result<crate::datagram::BoxStream>> {
        Box::pin(async move {
            match self.router.open_header(&self.pod, header).await {
                Ok((_, stream)) => Ok(Box::new(stream) as crate::datagram::BoxStream),
                Err(error) => Err(io::Error::other(error.to_string())),
            }
        })
    }
}

/// Tun mode: the connections replica `pod`'s userspace TCP stack accepts go to
/// [`Router::serve_tcp`].
#[derive(Clone)]
pub struct ReplicaTcp {
    router: Router,
    pod: String,
}

impl ReplicaTcp {
    pub fn new(router: Router, pod: impl Into<String>) -> Self {
        ReplicaTcp {
            router,
            pod: pod.into(),
        }
    }
}

impl crate::stack::TcpHandler for ReplicaTcp {
    fn serve(
        &self,
        stream: BoxStream,
        source: SocketAddr,
        destination: SocketAddr,
    ) -> BoxFuture<'static, ()> {
        let (router, pod) = (self.router.clone(), self.pod.clone());
        Box::pin(async move { router.serve_tcp(&pod, stream, source, destination).await })
    }
}

/// The relay path over the agent's tunnel sessions.
impl HubRelay for rlark_tunnel::client::HubStreams {
    fn open(
        &self,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DialError>> {
        let hub = self.clone();
        Box::pin(async move {
            let stream = hub.open_relay(&header, timeout).await?;
            if header.protocol == Protocol::Tcp {
                stream.raise_window(rlark_tunnel::relay::RELAY_WINDOW);
            }
            Ok(Box::new(stream) as BoxStream)
        })
    }
}

/// Opens direct streams to peer agents (implemented by [`crate::direct::DirectEndpoint`]).
pub trait DirectDialer: Send + Sync + 'static {
    /// Connect to the agent at `address` which must prove to be of `cluster`, send
    /// `header`, read the answer.
    fn open(
        &self,
        address: String,
        cluster: String,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DirectError>>;
}

/// The original destination of a redirected connection
/// ([`crate::netns::original_destination`] in kernel mode).
pub type DestinationFn = Arc<dyn Fn(&TcpStream) -> io::Result<SocketAddr> + Send + Sync>;

/// Why a direct attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    #[error("connect to agent {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS with agent {address}: {reason}")]
    Tls { address: String, reason: String },
    #[error("agent {address} answered {status}: {message}")]
    Answer {
        address: String,
        status: Status,
        message: String,
    },
    #[error("agent {address}: no answer within {timeout:?}")]
    Timeout { address: String, timeout: Duration },
    #[error("agent {address}: {reason}")]
    Other { address: String, reason: String },
}

impl DirectError {
    /// Whether the relay should be tried: everything but a final answer (`forbidden`: the
    /// destination agent refuses this flow; `refused`: nothing listens on that port), which
    /// the relay would only repeat.
    pub fn falls_back(&self) -> bool {
        !matches!(
            self,
            DirectError::Answer {
                status: Status::Forbidden | Status::Refused,
                ..
            }
        )
    }

    /// The status label for metrics and `net check`.
    pub fn status(&self) -> Status {
        match self {
            DirectError::Connect { source, .. } => crate::inbound::connect_status(source),
            DirectError::Answer { status, .. } => *status,
            DirectError::Timeout { .. } => Status::Timeout,
            DirectError::Tls { .. } | DirectError::Other { .. } => Status::Internal,
        }
    }
}
