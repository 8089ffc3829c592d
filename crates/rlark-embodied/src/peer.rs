//! Who is calling, and whether they are still connected.
//!
//! Every accepted unix-socket connection is wrapped in a [`TrackedStream`]: it records the
//! peer's process ID (SO_PEERCRED, as the kernel reports it in our PID namespace) and counts
//! the open connections of each process in a [`ConnTracker`] until the connection is dropped.
//! tonic hands the [`PeerInfo`] to every request as an extension. The safety watchdog
//! (`crate::robot::watchdog`) reads both: a robot's owner is the process that started it,
//! and the owner counts as connected while it has at least one open connection.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::Connected;

/// The peer of one connection, available to handlers as a request extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// Connection number, unique within the process.
    pub connection: u64,
    /// Process ID of the peer, when the kernel reports one.
    pub pid: Option<i32>,
    /// User ID of the peer.
    pub uid: Option<u32>,
    /// Start time of the peer process when it connected (`/proc/PID/stat` field 22), to
    /// tell it from a later process given the same PID ([`crate::access`]).
    pub start_ticks: Option<u64>,
}

/// Open connections per peer process, across every socket of one server.
#[derive(Debug, Default)]
pub struct ConnTracker {
    open: Mutex<HashMap<i32, usize>>,
    next_id: AtomicU64,
}

impl ConnTracker {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// How many connections `pid` has open now.
    pub fn open_connections(&self, pid: i32) -> usize {
        self.lock().get(&pid).copied().unwrap_or(0)
    }

    /// Wrap an accepted connection: read its peer credentials and count it as open until
    /// the returned stream is dropped.
    pub fn track(self: &Arc<Self>, stream: UnixStream) -> TrackedStream {
        // A socket whose credentials cannot be read still serves; it just has no owner
        // process to follow (robots it starts get no watchdog, which is logged).
        let cred = stream.peer_cred().ok();
        let pid = cred.and_then(|c| c.pid());
        let info = PeerInfo {
            connection: self.next_id.fetch_add(1, Ordering::Relaxed) + 1,
            pid,
            uid: cred.map(|c| c.uid()),
            start_ticks: pid.and_then(start_ticks),
        };
        if let Some(pid) = info.pid {
            *self.lock().entry(pid).or_insert(0) += 1;
        }
        tracing::debug!(
            connection = info.connection,
            pid = info.pid,
            "connection opened"
        );
        TrackedStream {
            inner: stream,
            _guard: Guard {
                tracker: Arc::clone(self),
                info: info.clone(),
            },
            info,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i32, usize>> {
        // The map holds plain counters; a panic elsewhere cannot leave it inconsistent.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Decrements the peer's connection count when the connection is dropped.
#[derive(Debug)]
struct Guard {
    tracker: Arc<ConnTracker>,
    info: PeerInfo,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(pid) = self.info.pid {
            let mut open = self.tracker.lock();
            if let Some(count) = open.get_mut(&pid) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    open.remove(&pid);
                }
            }
        }
        tracing::debug!(
            connection = self.info.connection,
            pid = self.info.pid,
            "connection closed"
        );
    }
}

/// An accepted unix-socket connection, counted in its [`ConnTracker`] while it lives.
#[derive(Debug)]
pub struct TrackedStream {
    inner: UnixStream,
    info: PeerInfo,
    /// Uncounts the connection when the stream is dropped.
    _guard: Guard,
}

impl TrackedStream {
    pub fn peer(&self) -> &PeerInfo {
        &self.info
    }
}

impl Connected for TrackedStream {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for TrackedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for TrackedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

// What `/proc/PID/stat` says of a process: `rlark_process::stat`, the agent's parser too.
pub use rlark_process::{ProcStat, live_stat, start_ticks};

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_connections_per_process_until_dropped() {
        let tracker = ConnTracker::new();
        let (a, _a_peer) = UnixStream::pair().expect("pair");
        let (b, _b_peer) = UnixStream::pair().expect("pair");
        let me = i32::try_from(std::process::id()).expect("pid fits i32");
        assert_eq!(tracker.open_connections(me), 0);
        let a = tracker.track(a);
        let b = tracker.track(b);
        assert_eq!(a.peer().pid, Some(me));
        assert_ne!(a.peer().connection, b.peer().connection);
        assert_eq!(tracker.open_connections(me), 2);
        drop(a);
        assert_eq!(tracker.open_connections(me), 1);
        drop(b);
        assert_eq!(tracker.open_connections(me), 0);
    }
}
