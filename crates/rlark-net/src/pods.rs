//! What the router (`net::router`) and the destination side (`net::inbound`) share: the
//! byte streams they splice, a replica's namespace as they use it ([`PodNetns`]), and the
//! replicas attached to the router ([`Pods`]).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Copy buffer per direction of a routed connection.
pub const COPY_BUFFER: usize = 64 * 1024;

/// Any byte stream (a mux stream, a TLS stream, an in-process pipe).
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// The stream as `Any`, to find out what it is (a relay's mux stream can be copied
    /// from its frames' own buffers). Call it on the boxed value (`(**boxed)`), not on the
    /// `Box`, which is a `ByteStream` too.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ByteStream for T {
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
/// A boxed [`ByteStream`].
pub type BoxStream = Box<dyn ByteStream>;

/// A replica's network namespace, as the router needs it (implemented by
/// [`crate::netns::ReplicaNetns`]).
pub trait PodNetns: Send + Sync + 'static {
    /// A listener whose socket was made inside the netns.
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListener>>;
    /// A connection whose socket was made inside the netns.
    fn connect(&self, addr: SocketAddr, timeout: Duration) -> BoxFuture<'_, io::Result<TcpStream>>;
}

/// A replica's real network namespace.
impl PodNetns for crate::netns::ReplicaNetns {
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListener>> {
        Box::pin(crate::netns::ReplicaNetns::listen(self, addr))
    }

    fn connect(&self, addr: SocketAddr, timeout: Duration) -> BoxFuture<'_, io::Result<TcpStream>> {
        Box::pin(crate::netns::ReplicaNetns::connect(self, addr, timeout))
    }
}

/// A replica attached to the router.
pub struct Attached {
    /// The replica's domain.
    pub domain: String,
    /// Its namespace.
    pub netns: Arc<dyn PodNetns>,
    /// Cancelled on detach: ends its listeners and connections.
    pub stop: CancellationToken,
}

/// The replicas attached to the router, by pod name; shared with the destination side
/// (`net::inbound`), which connects inside their netns.
#[derive(Clone, Default)]
pub struct Pods {
    inner: Arc<Mutex<HashMap<String, Attached>>>,
}

impl Pods {
    /// The map itself (the router attaches and detaches).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attached>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The netns of attached replica `pod`.
    pub fn netns(&self, pod: &str) -> Option<Arc<dyn PodNetns>> {
        let pods = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        pods.get(pod).map(|a| a.netns.clone())
    }

    /// The domain of attached replica `pod`.
    pub fn domain(&self, pod: &str) -> Option<String> {
        let pods = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        pods.get(pod).map(|a| a.domain.clone())
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::DuplexStream;

    use super::*;

    #[test]
    fn a_boxed_stream_says_what_it_is_through_the_box_only() {
        let (near, _far) = tokio::io::duplex(16);
        let mut boxed: BoxStream = Box::new(near);
        // Through the box: the concrete stream.
        assert!(
            (*boxed)
                .as_any_mut()
                .downcast_mut::<DuplexStream>()
                .is_some()
        );
        // On the Box itself (a ByteStream too): the Box, which is what callers must avoid.
        assert!(boxed.as_any_mut().downcast_mut::<DuplexStream>().is_none());
        assert!(boxed.as_any_mut().downcast_mut::<BoxStream>().is_some());
    }
}
