//! Tun mode's TCP termination: a userspace TCP/IP stack ([ipstack]) per replica.
//!
//! In tun mode a replica's namespace has no nft table, so the TCP it sends to any
//! non-loopback address follows the default routes into the TUN device `rlark0`, where the
//! replica's datagram plane reads it ([`super::datagram`]). The plane hands every TCP
//! packet whose source is one of the replica's own addresses to this stack through a
//! bounded queue ([`TCP_QUEUE`] packets; past it packets are dropped and counted as
//! `rlark_domain_datagrams_dropped_total{reason="tcp_queue_full"}`: TCP retransmits).
//! The stack's output goes through a second bounded queue to a writer task that writes it
//! into the TUN. Only TCP is fed to the stack: UDP and ICMP stay in the datagram plane.
//!
//! ```text
//!  replica netns        agent
//!  ┌──────────┐  TUN   ┌──────────────┐ TCP pkts ┌───────────────┐ accepted stream ┌────────┐
//!  │ connect()│──────▶ │ datagram     │─(bound)─▶│ ChannelDevice │────────────────▶│ Router │
//!  │          │◀────── │ plane reader │          │   ipstack     │  source, orig.  │ (same  │
//!  └──────────┘  TUN   └──────────────┘          └──────┬────────┘  destination    │  as    │
//!        ▲                                               │ out pkts (bound)        │ kernel │
//!        └────────────── TUN writer task ◀───────────────┘                         │ mode)  │
//!                                                                                  └────────┘
//! ```
//!
//! Each connection the stack accepts — source = the replica's ip:port, destination = the
//! original destination ip:port — goes to a [`TcpHandler`]: the router's
//! [`super::router::Router::serve_tcp`], the same routing (authorization, local / direct /
//! relay / egress, metrics) as kernel mode's REDIRECT listener.
//!
//! # ipstack's behaviour, and what is done about it
//!
//! - **Bug #89** (open upstream): `shutdown()` while written data is still un-ACKed never
//!   sends the FIN, because nothing wakes the pending shutdown when the ACK arrives.
//!   [`FinRetry`] re-polls it every [`SHUTDOWN_RETRY`], for at most [`SHUTDOWN_LIMIT`].
//! - The stack answers the SYN before the connection is accepted: a refused destination is
//!   seen by the task as a connection that opens and is then reset (kernel mode behaves the
//!   same: the REDIRECT listener accepts first).
//! - No half-close: when the task shuts down its sending side, the stack closes both
//!   directions once its own sent data is acknowledged.
//! - No retransmission timer: a lost segment is resent only when a packet of its connection
//!   arrives; [`replay::AckReplay`] feeds the replica's last ACK in again when the replica
//!   falls silent with data outstanding, and ipstack's retransmission limit is raised from
//!   3 (after which it silently dropped the segment from the stream) to [`MAX_RETRANSMITS`].
//! - Its internal queues are unbounded; what is fed to it is bounded here, and its receive
//!   window (at most 64 KiB, no window scaling) bounds each connection's unread data.
//! - An idle connection is reset after [`IDLE_TIMEOUT`] (ipstack's session timeout).
//! - Dropping a connection blocks a runtime worker briefly (`block_in_place`) until its
//!   session task ends: the agent runs on the multi-threaded runtime.
//!
//! [ipstack]: https://docs.rs/ipstack

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::future::BoxFuture;
use ipstack::{IpStack, IpStackConfig, IpStackStream, TcpConfig, TcpOptions};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, PollSender};

use super::datagram::{DatagramMetrics, DropReason, PacketIo};
use super::pods::BoxStream;
use super::tun::TUN_MTU;

pub mod replay;

use replay::AckReplay;

/// TCP packets queued from the TUN reader to the stack.
pub const TCP_QUEUE: usize = 1024;
/// Packets queued from the stack to the TUN writer.
pub const OUT_QUEUE: usize = 1024;
/// How often a pending `shutdown()` of an accepted connection is polled again (bug #89).
pub const SHUTDOWN_RETRY: Duration = Duration::from_millis(10);
/// How long [`FinRetry`] keeps polling a pending `shutdown()` before it gives up with
/// `TimedOut` (the connection is then reset when dropped).
pub const SHUTDOWN_LIMIT: Duration = Duration::from_secs(30);
/// An accepted connection with no read or write for this long is reset (ipstack's
/// session timeout; its default of 60 s would cut idle but healthy connections).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(2 * 3600);
/// The MSS the stack announces: ipstack hands at most 8 KiB of received data to the reader
/// per incoming packet, so larger segments would pile up inside it.
pub const MSS: u16 = 8192;

/// How often the device asks [`AckReplay`] what to replay.
pub const REPLAY_TICK: Duration = Duration::from_millis(500);
/// Retransmissions of one segment before ipstack gives up on it (its default, 3, drops the
/// segment from the stream and leaves the connection corrupt).
pub const MAX_RETRANSMITS: usize = 12;

/// Serves the connections the stack accepts.
pub trait TcpHandler: Send + Sync + 'static {
    /// Serve one connection from `source` (the replica's ip:port) to `destination` (the
    /// address the replica connected to); the future ends when the connection is done.
    fn serve(
        &self,
        stream: BoxStream,
        source: SocketAddr,
        destination: SocketAddr,
    ) -> BoxFuture<'static, ()>;
}

/// The packet device ipstack runs on: one whole IP packet per read, from a bounded queue
/// the TUN reader fills; one whole packet per write, into a bounded queue a writer task
/// empties into the TUN.
pub struct ChannelDevice {
    incoming: mpsc::Receiver<Vec<u8>>,
    outgoing: PollSender<Vec<u8>>,
    metrics: DatagramMetrics,
    /// The retransmission nudge: sees both directions, and its due ACKs are read next.
    replay: AckReplay,
    replays: Vec<Vec<u8>>,
    tick: Pin<Box<tokio::time::Sleep>>,
}

impl ChannelDevice {
    /// A device reading `incoming` and writing to `outgoing`; packets too long for the
    /// reader's buffer are dropped and counted (`too_big`) in `metrics`.
    pub fn new(
        incoming: mpsc::Receiver<Vec<u8>>,
        outgoing: mpsc::Sender<Vec<u8>>,
        metrics: DatagramMetrics,
    ) -> Self {
        ChannelDevice {
            incoming,
            outgoing: PollSender::new(outgoing),
            metrics,
            replay: AckReplay::default(),
            replays: Vec::new(),
            tick: Box::pin(tokio::time::sleep(REPLAY_TICK)),
        }
    }
}

impl AsyncRead for ChannelDevice {
    /// The next queued packet, whole, or an ACK [`AckReplay`] says is due (checked every
    /// [`REPLAY_TICK`]). Once the queue is closed and empty this stays pending: ipstack
    /// treats a 0-byte read as a packet and would spin on it; the stack is torn down by its
    /// owner instead.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if let Some(packet) = this.replays.pop() {
                if packet.len() <= buf.remaining() {
                    buf.put_slice(&packet);
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            match this.incoming.poll_recv(cx) {
                Poll::Ready(Some(packet)) if packet.len() <= buf.remaining() => {
                    this.replay.from_replica(&packet, std::time::Instant::now());
                    buf.put_slice(&packet);
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Some(_)) => {
                    this.metrics.count_drop(DropReason::TooBig);
                    continue;
                }
                Poll::Ready(None) => return Poll::Pending,
                Poll::Pending => {}
            }
            ready!(this.tick.as_mut().poll(cx));
            this.tick
                .as_mut()
                .reset(tokio::time::Instant::now() + REPLAY_TICK);
            this.replays = this.replay.due(std::time::Instant::now());
        }
    }
}

impl AsyncWrite for ChannelDevice {
    /// Queues `buf` as one packet (ipstack writes each packet whole). Pending while the
    /// queue is full; `BrokenPipe` once the writer is gone.
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the TUN writer is gone");
        if ready!(self.outgoing.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(gone()));
        }
        self.replay.from_stack(buf);
        self.outgoing.send_item(buf.to_vec()).map_err(|_| gone())?;
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.outgoing.close();
        Poll::Ready(Ok(()))
    }
}

/// A stream whose `shutdown()` is polled again every [`SHUTDOWN_RETRY`] while it is
/// pending, for at most [`SHUTDOWN_LIMIT`] (then `TimedOut`; both set by
/// [`FinRetry::with_timing`]): the workaround for ipstack's
/// bug #89, where a shutdown that found un-ACKed data is never woken again and so never
/// sends its FIN. Reads and writes pass through.
pub struct FinRetry<S> {
    inner: S,
    every: Duration,
    limit: Duration,
    retry: Option<Pin<Box<tokio::time::Sleep>>>,
    deadline: Option<tokio::time::Instant>,
}

impl<S> FinRetry<S> {
    /// With [`SHUTDOWN_RETRY`] and [`SHUTDOWN_LIMIT`].
    pub fn new(inner: S) -> Self {
        Self::with_timing(inner, SHUTDOWN_RETRY, SHUTDOWN_LIMIT)
    }

    /// Re-poll a pending shutdown every `every`, for at most `limit`.
    pub fn with_timing(inner: S, every: Duration, limit: Duration) -> Self {
        FinRetry {
            inner,
            every,
            limit,
            retry: None,
            deadline: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FinRetry<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FinRetry<S> {
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
        let this = &mut *self;
        let limit = this.limit;
        let deadline = *this
            .deadline
            .get_or_insert_with(|| tokio::time::Instant::now() + limit);
        loop {
            if let Poll::Ready(done) = Pin::new(&mut this.inner).poll_shutdown(cx) {
                this.retry = None;
                return Poll::Ready(done);
            }
            if tokio::time::Instant::now() >= deadline {
                this.retry = None;
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the FIN was not acknowledged within {limit:?}"),
                )));
            }
            let every = this.every;
            let retry = this
                .retry
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
            ready!(retry.as_mut().poll(cx));
            // The timer fired: poll the shutdown again with a fresh timer.
            this.retry = None;
        }
    }
}

/// The ipstack configuration of a replica's stack: packets as large as the TUN's MTU, the
/// [`MSS`], [`IDLE_TIMEOUT`], [`MAX_RETRANSMITS`], and up to 64 KiB in flight each way.
pub fn stack_config() -> IpStackConfig {
    let mut tcp = TcpConfig::default();
    tcp.timeout = IDLE_TIMEOUT;
    tcp.max_unacked_bytes = u32::from(u16::MAX);
    tcp.max_retransmit_count = MAX_RETRANSMITS;
    tcp.options = Some(vec![TcpOptions::MaximumSegmentSize(MSS)]);
    let mut config = IpStackConfig::default();
    config.mtu_unchecked(TUN_MTU).with_tcp_config(tcp);
    config
}

/// One replica's TCP stack, started by [`TcpStack::start`]; it runs until its `shutdown`
/// token is cancelled (then its connections end too).
pub struct TcpStack {
    packets: mpsc::Sender<Vec<u8>>,
}

impl TcpStack {
    /// Start the stack: its output is written into `io` (the replica's TUN), its accepted
    /// connections go to `handler`. Feed it the replica's TCP packets through
    /// [`TcpStack::packets`]. Drops are counted in `metrics`.
    pub fn start(
        io: Arc<dyn PacketIo>,
        handler: Arc<dyn TcpHandler>,
        metrics: DatagramMetrics,
        shutdown: CancellationToken,
    ) -> TcpStack {
        let (packets, incoming) = mpsc::channel(TCP_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(OUT_QUEUE);
        let device = ChannelDevice::new(incoming, out_tx, metrics.clone());
        tokio::spawn(write_tun(io, out_rx, metrics, shutdown.clone()));
        tokio::spawn(accept(
            IpStack::new(stack_config(), device),
            handler,
            shutdown,
        ));
        TcpStack { packets }
    }

    /// The queue of TCP packets into the stack (bounded: [`TCP_QUEUE`]; feed it with
    /// `try_send` and count a full queue as `tcp_queue_full`).
    pub fn packets(&self) -> mpsc::Sender<Vec<u8>> {
        self.packets.clone()
    }
}

/// Writes the stack's packets into the TUN until `shutdown` or the stack is gone. A packet
/// the kernel refuses is dropped and counted (`write_failed`): TCP retransmits.
async fn write_tun(
    io: Arc<dyn PacketIo>,
    mut packets: mpsc::Receiver<Vec<u8>>,
    metrics: DatagramMetrics,
    shutdown: CancellationToken,
) {
    loop {
        let packet = tokio::select! {
            () = shutdown.cancelled() => return,
            packet = packets.recv() => match packet {
                Some(packet) => packet,
                None => return,
            },
        };
        if let Err(error) = io.send(&packet).await {
            tracing::debug!(%error, len = packet.len(), "writing a TCP packet into the TUN failed");
            metrics.count_drop(DropReason::WriteFailed);
        }
    }
}

/// Accepts the stack's connections until `shutdown`; each is served by `handler` in its own
/// task. Dropping the stack at the end stops it (and so every connection it carries).
async fn accept(mut stack: IpStack, handler: Arc<dyn TcpHandler>, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = stack.accept() => accepted,
        };
        match accepted {
            Ok(IpStackStream::Tcp(tcp)) => {
                let source = tcp.local_addr();
                let destination = tcp.peer_addr();
                let stream: BoxStream = Box::new(FinRetry::new(tcp));
                let served = handler.serve(stream, source, destination);
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = served => {}
                    }
                });
            }
            // Only TCP is fed in; anything else is not ours (and dropping it answers
            // nothing).
            Ok(other) => {
                let kind = match other {
                    IpStackStream::Udp(_) => "udp",
                    IpStackStream::UnknownTransport(_) => "other transport",
                    IpStackStream::UnknownNetwork(_) | IpStackStream::Tcp(_) => "unparsable",
                };
                tracing::debug!(kind, "non-TCP item from the stack dropped");
            }
            Err(error) => {
                tracing::warn!(%error, "the replica's TCP stack stopped");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests;
