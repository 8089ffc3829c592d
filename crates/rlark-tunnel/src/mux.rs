//! The stream multiplexer: many independent byte streams over one message transport, with
//! per-stream credit windows so one slow reader never stalls the other streams (the standing
//! defect of konnectivity and remotedialer, whose per-connection queues are filled with
//! blocking sends from a single tunnel reader).
//!
//! [`Session::new`] spawns one driver task per session that owns the transport and never
//! waits on a stream; [`Control`] opens streams, [`Incoming`] accepts them, [`MuxStream`]
//! is one stream. Flow control (start window, auto-tuning up to `window`, see
//! `grown_window`), round-robin fairness of one DATA frame per turn, the stream lifecycle
//! and keep-alive are specified in `docs/tunnel.md` (sections Flow control, Multiplexer
//! internals, Failure handling and limits).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::{Sink, Stream};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::frame::{self, Frame, FrameType, GOAWAY_NORMAL, GOAWAY_PROTOCOL, HEADER_LEN, RstCode};
use crate::pool;

/// Credit every stream starts with in each direction, before the receiver's first WINDOW.
/// Part of the protocol: a receiver must buffer at least this much per stream, so
/// `MuxConfig::window` is raised to it if configured lower.
pub const INITIAL_WINDOW: u32 = 64 * 1024;

/// Writes up to this size may be appended to a frame that is still queued.
const COALESCE_MAX: usize = 16 * 1024;
/// Smallest buffer allocated for a new DATA frame (room for later small writes).
const MIN_FRAME_ALLOC: usize = 4 * 1024;
/// The read side pauses while this many control frames wait for the writer (a peer that
/// floods PINGs but does not read our PONGs cannot grow our memory).
const CONTROL_HIGH_WATER: usize = 1024;
/// Control frames sent in a row before one DATA turn is served.
const CONTROL_BURST: usize = 16;
/// Messages handled per driver poll on each side before yielding to the runtime.
const DRIVER_BUDGET: usize = 64;
/// How long `close()` waits for GOAWAY and the transport close before dropping it.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Which end of the tunnel this session is: decides the stream-id parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The agent: opens odd stream ids.
    Client,
    /// The hub: opens even stream ids.
    Server,
}

impl Role {
    fn first_id(self) -> u32 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    /// Parity (id % 2) of the streams the *peer* opens.
    fn peer_parity(self) -> u32 {
        match self {
            Role::Client => 0,
            Role::Server => 1,
        }
    }
}

/// Multiplexer settings.
#[derive(Clone, Debug)]
pub struct MuxConfig {
    /// Largest per-stream receive window in bytes (at least [`INITIAL_WINDOW`]): the bound
    /// of auto-tuning and of what one stream may buffer. Default 8 MiB.
    pub window: u32,
    /// Receive window every stream starts with (at least [`INITIAL_WINDOW`], at most
    /// `window`); it doubles up to `window` while the reader keeps up and half of it is
    /// consumed within two round trips (see the module docs). Default 512 KiB.
    pub start_window: u32,
    /// Largest DATA payload per frame. Default 256 KiB.
    pub max_frame_payload: usize,
    /// Concurrent streams per session, both directions together. Default 4096.
    pub max_streams: usize,
    /// Send PING after this long without receiving any frame. Default 5 s.
    pub keepalive_interval: Duration,
    /// No frame at all for this long => the session is dead. Default 15 s.
    pub keepalive_timeout: Duration,
    /// A stream with no DATA either way for this long is reset. Default 10 min.
    pub idle_stream_timeout: Option<Duration>,
}

impl Default for MuxConfig {
    fn default() -> Self {
        MuxConfig {
            window: 8 * 1024 * 1024,
            start_window: 512 * 1024,
            max_frame_payload: 256 * 1024,
            max_streams: 4096,
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(15),
            idle_stream_timeout: Some(Duration::from_secs(600)),
        }
    }
}

impl MuxConfig {
    fn normalized(mut self) -> Self {
        self.window = self.window.max(INITIAL_WINDOW);
        self.start_window = self.start_window.clamp(INITIAL_WINDOW, self.window);
        self.max_frame_payload = self.max_frame_payload.max(1);
        let min = Duration::from_millis(1);
        self.keepalive_interval = self.keepalive_interval.max(min);
        self.keepalive_timeout = self.keepalive_timeout.max(min);
        self.idle_stream_timeout = self.idle_stream_timeout.map(|d| d.max(min));
        self
    }
}

/// Multiplexer errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// The session has ended, is closing, or the peer sent GOAWAY.
    #[error("tunnel session closed")]
    Closed,
    /// `max_streams` concurrent streams are already open.
    #[error("stream limit reached ({max} concurrent streams)")]
    Limit {
        /// The configured `max_streams`.
        max: usize,
    },
    /// All 2^31 stream ids of this side were used; open a new session.
    #[error("stream ids exhausted")]
    IdsExhausted,
}

/// Session counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Streams in the session's map now (both directions, including not yet accepted).
    pub streams_open: usize,
    /// Streams ever opened or accepted.
    pub streams_total: u64,
    /// DATA payload bytes received.
    pub bytes_in: u64,
    /// DATA payload bytes sent.
    pub bytes_out: u64,
    /// Smallest PING round trip measured so far (None before the first PONG): the path
    /// delay that window auto-tuning works from.
    pub min_rtt: Option<Duration>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent-enough state (plain
    // counters and queues); keep going rather than cascading the panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn wake(w: Option<Waker>) {
    if let Some(w) = w {
        w.wake();
    }
}

// ---------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------

struct Shared {
    role: Role,
    config: MuxConfig,
    /// Unsent bytes a stream may queue (on top of credit).
    send_buffer: usize,
    inner: Mutex<Inner>,
    done: CancellationToken,
    /// Smallest round-trip time measured with PING/PONG, in nanoseconds (`u64::MAX`: none
    /// yet). Window auto-tuning compares how fast a window is consumed against it.
    min_rtt_nanos: AtomicU64,
}

impl Shared {
    fn min_rtt(&self) -> Option<Duration> {
        match self.min_rtt_nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    fn record_rtt(&self, rtt: Duration) {
        let n = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX - 1).max(1);
        self.min_rtt_nanos.fetch_min(n, Ordering::Relaxed);
    }
}

struct Inner {
    streams: HashMap<u32, Arc<StreamCell>>,
    /// Streams with output (OPEN, WINDOW, DATA, FIN), served round-robin.
    ready: VecDeque<Arc<StreamCell>>,
    control: VecDeque<Frame>,
    incoming: VecDeque<Arc<StreamCell>>,
    incoming_waker: Option<Waker>,
    driver_waker: Option<Waker>,
    /// The writer found nothing to send: producers must wake the driver.
    writer_idle: bool,
    control_alive: bool,
    incoming_alive: bool,
    /// close() was called or the session ended: no new streams, all streams dead.
    closing: bool,
    peer_goaway: bool,
    /// Next id to open; 0 once exhausted.
    next_id: u32,
    last_peer_id: u32,
    streams_total: u64,
    bytes_in: u64,
    bytes_out: u64,
}

impl Inner {
    /// Marks that output is queued; returns the driver's Waker if it must be woken.
    fn wake_writer(&mut self) -> Option<Waker> {
        if self.writer_idle {
            self.writer_idle = false;
            self.driver_waker.clone()
        } else {
            None
        }
    }

    fn push_control(&mut self, f: Frame) -> Option<Waker> {
        self.control.push_back(f);
        self.wake_writer()
    }

    /// Removes a stream from the map (and the accept queue). Caller holds the stream lock
    /// and has set `st.detached`.
    fn detach(&mut self, id: u32, st: &mut StreamState) {
        st.detached = true;
        self.streams.remove(&id);
        if st.in_incoming {
            st.in_incoming = false;
            self.incoming.retain(|c| c.id != id);
        }
        tracing::trace!(stream = id, "stream freed");
    }

    fn orphaned(&self) -> bool {
        !self.control_alive && !self.incoming_alive && self.streams.is_empty()
    }

    /// Ends the session for every stream: all are freed and woken; returns Wakers to wake
    /// after the lock is released.
    fn begin_close(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::new();
        if self.closing {
            return wakers;
        }
        self.closing = true;
        for (_, cell) in self.streams.drain() {
            let mut st = lock(&cell.st);
            let (r, w) = st.kill(End::SessionClosed);
            st.detached = true;
            st.in_incoming = false;
            wakers.extend(r);
            wakers.extend(w);
        }
        self.ready.clear();
        self.control.clear();
        self.incoming.clear();
        wakers.extend(self.incoming_waker.take());
        wakers.extend(self.driver_waker.clone());
        wakers
    }
}

struct StreamCell {
    id: u32,
    st: Mutex<StreamState>,
}

/// Why a stream ended abnormally (or the session ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    SessionClosed,
    PeerReset(RstCode),
    LocalReset(RstCode),
}

impl End {
    fn error(self) -> io::Error {
        use io::ErrorKind as K;
        let (kind, msg) = match self {
            End::SessionClosed => (K::BrokenPipe, "tunnel session closed".to_string()),
            End::PeerReset(RstCode::RefusedLimit) => (
                K::ConnectionRefused,
                "stream refused by peer (stream limit)".to_string(),
            ),
            End::PeerReset(RstCode::IdleTimeout) | End::LocalReset(RstCode::IdleTimeout) => {
                (K::TimedOut, "stream reset: idle timeout".to_string())
            }
            End::PeerReset(code) => (K::ConnectionReset, format!("stream reset by peer: {code}")),
            End::LocalReset(RstCode::Protocol) => (
                K::InvalidData,
                "stream reset: peer broke the protocol".to_string(),
            ),
            End::LocalReset(code) => (K::ConnectionAborted, format!("stream reset: {code}")),
        };
        io::Error::new(kind, msg)
    }
}

struct StreamState {
    // receive side
    recv: VecDeque<Bytes>,
    recv_len: usize,
    /// Credit granted to the peer and not yet used by it.
    recv_allowed: u64,
    /// Consumed by the application since the last grant.
    consumed: usize,
    /// This stream's current receive window (auto-tuned between `start_window` and
    /// `window`).
    recv_window: u32,
    /// When the current auto-tuning epoch began: the stream's last grant. None before the
    /// first: the sender starts with its whole window, so how fast the first half of it
    /// arrives says nothing about whether the window limits the stream.
    epoch_start: Option<Instant>,
    fin_recv: bool,
    // send side
    /// Bytes this side may still queue: peer's credit minus queued and in-flight bytes.
    credit: u64,
    /// DATA frames (header included) waiting for the writer.
    sendq: VecDeque<pool::Buf>,
    queued: usize,
    open_pending: bool,
    grant_pending: u32,
    fin_queued: bool,
    fin_sent: bool,
    in_ready: bool,
    // lifecycle
    end: Option<End>,
    detached: bool,
    in_incoming: bool,
    last_activity: Instant,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

impl StreamState {
    fn new(window: u32, now: Instant) -> Self {
        StreamState {
            recv: VecDeque::new(),
            recv_len: 0,
            // Counts the extra grant (window - INITIAL_WINDOW) as given: it is queued with
            // the stream's first frames.
            recv_allowed: u64::from(window),
            consumed: 0,
            recv_window: window,
            epoch_start: None,
            fin_recv: false,
            credit: u64::from(INITIAL_WINDOW),
            sendq: VecDeque::new(),
            queued: 0,
            open_pending: false,
            grant_pending: 0,
            fin_queued: false,
            fin_sent: false,
            in_ready: false,
            end: None,
            detached: false,
            in_incoming: false,
            last_activity: now,
            read_waker: None,
            write_waker: None,
        }
    }

    fn has_output(&self) -> bool {
        self.end.is_none()
            && (self.open_pending
                || self.grant_pending > 0
                || !self.sendq.is_empty()
                || (self.fin_queued && !self.fin_sent))
    }

    /// Ends the stream: drops unsent data (and, for local resets, unread data).
    fn kill(&mut self, end: End) -> (Option<Waker>, Option<Waker>) {
        if self.end.is_none() {
            self.end = Some(end);
        }
        self.sendq.clear();
        self.queued = 0;
        self.open_pending = false;
        self.grant_pending = 0;
        if matches!(end, End::LocalReset(_)) {
            self.recv.clear();
            self.recv_len = 0;
        }
        (self.read_waker.take(), self.write_waker.take())
    }
}

// ---------------------------------------------------------------------------------------
// Session, Control, Incoming
// ---------------------------------------------------------------------------------------

/// Entry point: creates a session over a message transport.
pub struct Session;

impl Session {
    /// Starts a session over `transport` (one frame per message) and spawns its driver
    /// with `tokio::spawn` (must be called inside a Tokio runtime).
    #[allow(clippy::new_ret_no_self)] // the contract's API: the session is its two handles
    pub fn new<T>(transport: T, role: Role, config: MuxConfig) -> (Control, Incoming)
    where
        T: Stream<Item = io::Result<Bytes>>
            + Sink<Bytes, Error = io::Error>
            + Send
            + Unpin
            + 'static,
    {
        let config = config.normalized();
        let now = Instant::now();
        let shared = Arc::new(Shared {
            role,
            send_buffer: config.max_frame_payload.saturating_mul(2),
            inner: Mutex::new(Inner {
                streams: HashMap::new(),
                ready: VecDeque::new(),
                control: VecDeque::new(),
                incoming: VecDeque::new(),
                incoming_waker: None,
                driver_waker: None,
                writer_idle: false,
                control_alive: true,
                incoming_alive: true,
                closing: false,
                peer_goaway: false,
                next_id: role.first_id(),
                last_peer_id: 0,
                streams_total: 0,
                bytes_in: 0,
                bytes_out: 0,
            }),
            done: CancellationToken::new(),
            min_rtt_nanos: AtomicU64::new(u64::MAX),
            config,
        });
        let cfg = &shared.config;
        let mut driver = Driver {
            transport,
            keepalive: Box::pin(tokio::time::sleep_until(now + cfg.keepalive_interval)),
            idle_sweep: cfg
                .idle_stream_timeout
                .map(|d| Box::pin(tokio::time::sleep_until(now + sweep_period(d)))),
            last_recv: now,
            last_ping: now,
            ping_nonce: 0,
            probe: None,
            need_flush: false,
            control_streak: 0,
            phase: Phase::Running,
            shared: shared.clone(),
        };
        // The first RTT probe, for window auto-tuning (keep-alive PINGs are probes too).
        driver.ping(now);
        let span = tracing::info_span!("tunnel_session", role = ?role);
        tokio::spawn(driver.instrument(span));
        (
            Control {
                handle: Arc::new(ControlHandle {
                    shared: shared.clone(),
                }),
            },
            Incoming { shared },
        )
    }
}

/// Per-stream rate that window auto-tuning sizes for: a window never grows beyond what
/// this rate needs over the measured round trip (the bandwidth-delay product). 512 MiB/s
/// with the 8 MiB default maximum: any path up to 16 ms RTT gets the full rate, a 50 ms
/// path 160 MiB/s per stream; on loopback (RTT ~0.1-0.4 ms) the cap is under the start
/// window, so windows stay there.
const TUNED_STREAM_RATE: f64 = 512.0 * 1024.0 * 1024.0;

/// Receive-window auto-tuning, the rule of quic-go's and yamux's flow controllers: when a
/// stream's reader consumed `consumed` bytes of its `window` within `4 * consumed / window`
/// round trips (two round trips for the half window that triggers a grant), the window and
/// not the reader limits the stream, so it doubles, up to `max` — and only while it is
/// smaller than [`TUNED_STREAM_RATE`] times the RTT. Without an RTT sample the window
/// stays. A reader slower than the link never grows its window: only a fast reader on a
/// long path needs (and gets) a large one. The BDP cap matters where the consumption rule
/// alone misleads: on a short path a reader draining a burst of buffered frames looks
/// "fast" against a tiny RTT, and the larger windows that would follow only put more
/// bytes in flight (out of the CPU caches) without any gain.
fn grown_window(
    window: u32,
    max: u32,
    consumed: usize,
    elapsed: Duration,
    rtt: Option<Duration>,
) -> u32 {
    let Some(rtt) = rtt else {
        return window;
    };
    if window >= max || f64::from(window) >= TUNED_STREAM_RATE * rtt.as_secs_f64() {
        return window;
    }
    let fraction = consumed as f64 / f64::from(window);
    if elapsed.as_secs_f64() < 4.0 * fraction * rtt.as_secs_f64() {
        window.saturating_mul(2).min(max)
    } else {
        window
    }
}

fn sweep_period(idle: Duration) -> Duration {
    (idle / 4).max(Duration::from_millis(1))
}

struct ControlHandle {
    shared: Arc<Shared>,
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        let w = {
            let mut inner = lock(&self.shared.inner);
            inner.control_alive = false;
            inner.driver_waker.clone()
        };
        wake(w);
    }
}

/// Handle to a session: open streams, stats, close. Cheap to clone.
#[derive(Clone)]
pub struct Control {
    handle: Arc<ControlHandle>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("role", &self.handle.shared.role)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Control {
    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Opens a stream (OPEN is sent by the driver, ahead of the stream's data).
    /// `Err(Limit)` at `max_streams`, `Err(Closed)` after close or the peer's GOAWAY.
    pub fn open(&self) -> Result<MuxStream, MuxError> {
        let shared = self.shared();
        let now = Instant::now();
        let (cell, w) = {
            let mut inner = lock(&shared.inner);
            if inner.closing || inner.peer_goaway {
                return Err(MuxError::Closed);
            }
            let max = shared.config.max_streams;
            if inner.streams.len() >= max {
                return Err(MuxError::Limit { max });
            }
            let id = inner.next_id;
            if id == 0 {
                return Err(MuxError::IdsExhausted);
            }
            inner.next_id = id.checked_add(2).unwrap_or(0);
            let mut st = StreamState::new(shared.config.start_window, now);
            st.open_pending = true;
            st.grant_pending = shared.config.start_window - INITIAL_WINDOW;
            st.in_ready = true;
            let cell = Arc::new(StreamCell {
                id,
                st: Mutex::new(st),
            });
            inner.streams.insert(id, cell.clone());
            inner.ready.push_back(cell.clone());
            inner.streams_total += 1;
            tracing::debug!(stream = id, "stream opened");
            (cell, inner.wake_writer())
        };
        wake(w);
        Ok(MuxStream {
            cell,
            shared: shared.clone(),
            rx: Bytes::new(),
        })
    }

    /// A snapshot of the session's counters (open streams, bytes each way, smallest RTT).
    pub fn stats(&self) -> SessionStats {
        let inner = lock(&self.shared().inner);
        SessionStats {
            streams_open: inner.streams.len(),
            streams_total: inner.streams_total,
            bytes_in: inner.bytes_in,
            bytes_out: inner.bytes_out,
            min_rtt: self.shared().min_rtt(),
        }
    }

    /// Sends GOAWAY and closes the transport; all streams end at once (reads: buffered
    /// data then `ConnectionAborted`, unless the peer had finished the stream; writes:
    /// `BrokenPipe`).
    pub fn close(&self) {
        let wakers = lock(&self.shared().inner).begin_close();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Resolves when the session has ended (transport closed, keepalive timeout, close()).
    pub async fn closed(&self) {
        self.shared().done.cancelled().await
    }

    /// True once the session is closing or has ended (no new streams).
    pub fn is_closed(&self) -> bool {
        lock(&self.shared().inner).closing || self.shared().done.is_cancelled()
    }

    /// (streams map, ready queue, control queue, accept queue) sizes.
    #[cfg(test)]
    fn internal_sizes(&self) -> (usize, usize, usize, usize) {
        let inner = lock(&self.shared().inner);
        (
            inner.streams.len(),
            inner.ready.len(),
            inner.control.len(),
            inner.incoming.len(),
        )
    }
}

/// Streams opened by the peer; ends when the session ends. Dropping it refuses further
/// streams (RST) and resets those not yet accepted.
pub struct Incoming {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming").finish_non_exhaustive()
    }
}

impl Stream for Incoming {
    type Item = MuxStream;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<MuxStream>> {
        let shared = &self.shared;
        let mut inner = lock(&shared.inner);
        if let Some(cell) = inner.incoming.pop_front() {
            lock(&cell.st).in_incoming = false;
            return Poll::Ready(Some(MuxStream {
                cell,
                shared: shared.clone(),
                rx: Bytes::new(),
            }));
        }
        if inner.closing {
            return Poll::Ready(None);
        }
        if !inner
            .incoming_waker
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            inner.incoming_waker = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        let mut wakers = Vec::new();
        {
            let mut inner = lock(&self.shared.inner);
            inner.incoming_alive = false;
            for cell in std::mem::take(&mut inner.incoming) {
                let mut st = lock(&cell.st);
                st.in_incoming = false;
                if !st.detached {
                    let (r, w) = st.kill(End::LocalReset(RstCode::Cancel));
                    wakers.extend(r);
                    wakers.extend(w);
                    inner.detach(cell.id, &mut st);
                    inner.control.push_back(Frame::Rst {
                        stream: cell.id,
                        code: RstCode::Cancel,
                    });
                }
            }
            inner.writer_idle = false;
            wakers.extend(inner.driver_waker.clone());
        }
        wakers.into_iter().for_each(Waker::wake);
    }
}

// ---------------------------------------------------------------------------------------
// MuxStream
// ---------------------------------------------------------------------------------------

/// One multiplexed byte stream: `AsyncRead + AsyncBufRead + AsyncWrite`.
///
/// `poll_shutdown` sends FIN (half-close) once queued data is out; reads return EOF after
/// the peer's FIN; dropping a stream that is not fully closed sends RST (cancel).
/// `AsyncBufRead` hands out the received frames' own buffers (no copy; e.g.
/// `tokio::io::copy_buf` to a socket); credit goes back to the peer as the data is
/// consumed, exactly as with `poll_read`.
pub struct MuxStream {
    cell: Arc<StreamCell>,
    shared: Arc<Shared>,
    /// Received data taken out of the stream's queue by `poll_fill_buf`, not consumed yet.
    /// It still counts against the window: credit for it is returned on `consume`.
    rx: Bytes,
}

impl std::fmt::Debug for MuxStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxStream")
            .field("id", &self.cell.id)
            .finish()
    }
}

/// Flow-control snapshot of one stream (tests).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flow {
    /// Bytes this side may still write.
    credit: u64,
    /// Written but not yet handed to the transport.
    queued: usize,
    /// Received, not yet read by the application.
    recv_buffered: usize,
    /// Credit the peer still holds for sending to us.
    recv_allowed: u64,
    /// The stream's current receive window.
    recv_window: u32,
}

impl MuxStream {
    /// The stream id (odd: opened by the client/agent, even: by the server/hub).
    pub fn id(&self) -> u32 {
        self.cell.id
    }

    #[cfg(test)]
    fn flow(&self) -> Flow {
        let st = lock(&self.cell.st);
        Flow {
            credit: st.credit,
            queued: st.queued,
            recv_buffered: st.recv_len,
            recv_allowed: st.recv_allowed,
            recv_window: st.recv_window,
        }
    }

    /// Puts the stream in the writer's ready queue (caller released the stream lock).
    fn schedule(&self) {
        let w = {
            let mut inner = lock(&self.shared.inner);
            if inner.closing {
                return;
            }
            inner.ready.push_back(self.cell.clone());
            inner.wake_writer()
        };
        wake(w);
    }

    /// Allocates DATA frames for `data` (outside any lock); large ones come from the
    /// buffer pool (see `pool`).
    fn build_frames(&self, data: &[u8]) -> Vec<pool::Buf> {
        let mfp = self.shared.config.max_frame_payload;
        data.chunks(mfp)
            .map(|chunk| {
                let cap = chunk.len().max(MIN_FRAME_ALLOC.min(mfp));
                let mut f = pool::Buf::with_capacity(HEADER_LEN + cap);
                frame::put_header(&mut *f, FrameType::Data, self.cell.id);
                f.extend_from_slice(chunk);
                f
            })
            .collect()
    }
}

impl MuxStream {
    /// Raises this stream's receive window to `window` bytes (at most `MuxConfig::window`,
    /// the per-stream bound, which stays the bound of what the stream may buffer) and grants
    /// the difference to the peer at once; a window already at least that large is left as
    /// it is. For streams known to carry bulk data over a long pipeline (the hub's relay:
    /// two tunnels and three processes between the ends), where the start window, sized for
    /// one loopback hop, would limit a single stream to window / turnaround. Auto-tuning
    /// goes on from the new window.
    pub fn raise_window(&self, window: u32) {
        let target = window.min(self.shared.config.window);
        let mut st = lock(&self.cell.st);
        if st.end.is_some() || st.fin_recv || target <= st.recv_window {
            return;
        }
        let growth = target - st.recv_window;
        st.recv_window = target;
        st.recv_allowed += u64::from(growth);
        if st.open_pending {
            // Not opened on the wire yet: the grant follows the OPEN (a WINDOW ahead of it
            // would name a stream the peer does not know).
            st.grant_pending = st.grant_pending.saturating_add(growth);
            return;
        }
        drop(st);
        let w = {
            let mut inner = lock(&self.shared.inner);
            if inner.closing {
                None
            } else {
                inner.push_control(Frame::Window {
                    stream: self.cell.id,
                    credit: growth,
                })
            }
        };
        wake(w);
    }

    /// Books `n` bytes read by the application; returns credit to the peer (WINDOW) once
    /// half the stream's window has been consumed, plus the window's growth when
    /// auto-tuning grows it. Takes the stream lock the caller holds.
    fn consumed(&self, mut st: MutexGuard<'_, StreamState>, n: usize) {
        st.consumed += n;
        if st.end.is_some() || st.fin_recv || st.consumed < st.recv_window as usize / 2 {
            return;
        }
        let now = Instant::now();
        let grown = match st.epoch_start {
            Some(start) => grown_window(
                st.recv_window,
                self.shared.config.window,
                st.consumed,
                now.saturating_duration_since(start),
                self.shared.min_rtt(),
            ),
            None => st.recv_window,
        };
        let growth = grown - st.recv_window;
        if growth > 0 {
            tracing::trace!(
                stream = self.cell.id,
                window = grown,
                "receive window grown"
            );
        }
        st.recv_window = grown;
        st.epoch_start = Some(now);
        // consumed <= recv_window (the receive buffer is bounded by it), so this fits.
        let g = std::mem::take(&mut st.consumed) as u64 + u64::from(growth);
        st.recv_allowed += g;
        drop(st);
        let w = {
            let mut inner = lock(&self.shared.inner);
            if inner.closing {
                None
            } else {
                inner.push_control(Frame::Window {
                    stream: self.cell.id,
                    credit: u32::try_from(g).unwrap_or(u32::MAX),
                })
            }
        };
        wake(w);
    }

    /// Nothing buffered: EOF after the peer's FIN, the stream's error, or Pending (waker
    /// registered).
    fn poll_empty(st: &mut StreamState, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if st.fin_recv {
            return Poll::Ready(Ok(()));
        }
        match st.end {
            // Not EOF: the peer never finished the stream, and a truncated transfer must not
            // look like a complete one to a proxy or a copy loop.
            Some(End::SessionClosed) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "tunnel session ended before the peer finished the stream",
            ))),
            Some(end) => Poll::Ready(Err(end.error())),
            None => {
                st.read_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for MuxStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if !this.rx.is_empty() {
            // Left over from poll_fill_buf.
            let k = this.rx.len().min(buf.remaining());
            buf.put_slice(&this.rx[..k]);
            this.rx.advance(k);
            this.consumed(lock(&this.cell.st), k);
            return Poll::Ready(Ok(()));
        }
        let mut st = lock(&this.cell.st);
        if st.recv_len > 0 {
            let mut n = 0;
            while buf.remaining() > 0 {
                let Some(front) = st.recv.front_mut() else {
                    break;
                };
                let k = front.len().min(buf.remaining());
                buf.put_slice(&front[..k]);
                front.advance(k);
                if front.is_empty() {
                    st.recv.pop_front();
                }
                n += k;
            }
            st.recv_len -= n;
            this.consumed(st, n);
            return Poll::Ready(Ok(()));
        }
        Self::poll_empty(&mut st, cx)
    }
}

impl AsyncBufRead for MuxStream {
    fn poll_fill_buf(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<&[u8]>> {
        let this = self.get_mut();
        if this.rx.is_empty() {
            let mut st = lock(&this.cell.st);
            match st.recv.pop_front() {
                Some(front) => {
                    st.recv_len -= front.len();
                    this.rx = front;
                }
                None => ready!(Self::poll_empty(&mut st, cx))?,
            }
        }
        Poll::Ready(Ok(&this.rx))
    }

    fn consume(self: Pin<&mut Self>, amt: usize) {
        let this = self.get_mut();
        let amt = amt.min(this.rx.len());
        if amt > 0 {
            this.rx.advance(amt);
            this.consumed(lock(&this.cell.st), amt);
        }
    }
}

impl AsyncWrite for MuxStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mfp = this.shared.config.max_frame_payload;
        let mut st = lock(&this.cell.st);
        if let Some(end) = st.end {
            return Poll::Ready(Err(end.error()));
        }
        if st.fin_queued {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "write after shutdown",
            )));
        }
        let room = this.shared.send_buffer.saturating_sub(st.queued) as u64;
        let avail = st.credit.min(room) as usize;
        if avail == 0 {
            st.write_waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let n = buf.len().min(avail);
        st.credit -= n as u64;
        st.queued += n;
        // Small write: append to the frame still waiting at the tail of the queue.
        if n <= COALESCE_MAX
            && let Some(tail) = st.sendq.back_mut()
            && tail.len() - HEADER_LEN + n <= mfp
        {
            tail.extend_from_slice(&buf[..n]);
            return Poll::Ready(Ok(n));
        }
        // Otherwise build the frames outside the lock (credit is reserved above).
        drop(st);
        let frames = this.build_frames(&buf[..n]);
        let mut st = lock(&this.cell.st);
        if st.end.is_some() {
            // Reset meanwhile: the data is dropped, the next call reports the error.
            return Poll::Ready(Ok(n));
        }
        st.sendq.extend(frames);
        let schedule = !std::mem::replace(&mut st.in_ready, true);
        drop(st);
        if schedule {
            this.schedule();
        }
        Poll::Ready(Ok(n))
    }

    /// Ready once all written data has been handed to the transport.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = lock(&self.cell.st);
        if st.sendq.is_empty() {
            return Poll::Ready(Ok(()));
        }
        st.write_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Sends FIN after the queued data; ready once FIN has been handed to the transport.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut st = lock(&self.cell.st);
        if st.fin_sent {
            return Poll::Ready(Ok(()));
        }
        if let Some(end) = st.end {
            return Poll::Ready(Err(end.error()));
        }
        st.write_waker = Some(cx.waker().clone());
        if !st.fin_queued {
            st.fin_queued = true;
            let schedule = !std::mem::replace(&mut st.in_ready, true);
            drop(st);
            if schedule {
                self.schedule();
            }
        }
        Poll::Pending
    }
}

impl Drop for MuxStream {
    fn drop(&mut self) {
        let mut wakers: [Option<Waker>; 2] = [None, None];
        {
            let mut inner = lock(&self.shared.inner);
            let mut st = lock(&self.cell.st);
            if st.detached {
                return;
            }
            // The peer knows the stream unless our OPEN never left.
            let peer_knows = !st.open_pending;
            let _ = st.kill(End::LocalReset(RstCode::Cancel));
            inner.detach(self.cell.id, &mut st);
            drop(st);
            tracing::debug!(stream = self.cell.id, "stream dropped before close: RST");
            if peer_knows {
                wakers[0] = inner.push_control(Frame::Rst {
                    stream: self.cell.id,
                    code: RstCode::Cancel,
                });
            }
            if inner.orphaned() {
                wakers[1] = inner.driver_waker.clone();
            }
        }
        wakers.into_iter().for_each(wake);
    }
}

// ---------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------

enum EndReason {
    Local,
    Orphaned,
    PeerClosed,
    Transport(io::Error),
    KeepaliveTimeout,
    Protocol(String),
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Local => f.write_str("closed locally"),
            EndReason::Orphaned => f.write_str("all handles dropped"),
            EndReason::PeerClosed => f.write_str("transport closed by peer"),
            EndReason::Transport(e) => write!(f, "transport error: {e}"),
            EndReason::KeepaliveTimeout => f.write_str("keepalive timeout"),
            EndReason::Protocol(what) => write!(f, "protocol error: {what}"),
        }
    }
}

enum Phase {
    Running,
    Closing {
        goaway: Option<u8>,
        deadline: Pin<Box<Sleep>>,
    },
    Done,
}

struct Driver<T> {
    transport: T,
    shared: Arc<Shared>,
    keepalive: Pin<Box<Sleep>>,
    idle_sweep: Option<Pin<Box<Sleep>>>,
    last_recv: Instant,
    last_ping: Instant,
    ping_nonce: u64,
    /// The newest PING not answered yet: (nonce, when queued). Its PONG is an RTT sample.
    probe: Option<(u64, Instant)>,
    need_flush: bool,
    control_streak: usize,
    phase: Phase,
}

impl<T> Future for Driver<T>
where
    T: Stream<Item = io::Result<Bytes>> + Sink<Bytes, Error = io::Error> + Unpin,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match this.phase {
                Phase::Running => match this.poll_running(cx) {
                    Ok(()) => return Poll::Pending,
                    Err(reason) => this.start_ending(reason),
                },
                Phase::Closing { .. } => return this.poll_closing(cx),
                Phase::Done => return Poll::Ready(()),
            }
        }
    }
}

impl<T> Drop for Driver<T> {
    fn drop(&mut self) {
        // Runtime shutdown or a panic: still end the session for everyone waiting on it.
        if !matches!(self.phase, Phase::Done) {
            self.finish();
        }
    }
}

impl<T> Driver<T> {
    /// Queues a PING and makes it the RTT probe: its PONG is the next round-trip sample.
    fn ping(&mut self, now: Instant) {
        self.ping_nonce = self.ping_nonce.wrapping_add(1);
        lock(&self.shared.inner).control.push_back(Frame::Ping {
            nonce: self.ping_nonce,
        });
        self.probe = Some((self.ping_nonce, now));
        self.last_ping = now;
    }

    fn finish(&mut self) {
        self.phase = Phase::Done;
        let wakers = lock(&self.shared.inner).begin_close();
        wakers.into_iter().for_each(Waker::wake);
        self.shared.done.cancel();
    }
}

impl<T> Driver<T>
where
    T: Stream<Item = io::Result<Bytes>> + Sink<Bytes, Error = io::Error> + Unpin,
{
    fn start_ending(&mut self, reason: EndReason) {
        let goaway = match &reason {
            EndReason::Local | EndReason::Orphaned => Some(GOAWAY_NORMAL),
            EndReason::Protocol(_) => Some(GOAWAY_PROTOCOL),
            _ => None,
        };
        match &reason {
            EndReason::Local | EndReason::Orphaned | EndReason::PeerClosed => {
                tracing::debug!(reason = %reason, "tunnel session ending")
            }
            _ => tracing::warn!(reason = %reason, "tunnel session ending"),
        }
        let wakers = lock(&self.shared.inner).begin_close();
        wakers.into_iter().for_each(Waker::wake);
        match goaway {
            Some(code) => {
                self.phase = Phase::Closing {
                    goaway: Some(code),
                    deadline: Box::pin(tokio::time::sleep(CLOSE_GRACE)),
                }
            }
            None => self.finish(),
        }
    }

    fn poll_closing(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Phase::Closing { goaway, deadline } = &mut self.phase else {
            return Poll::Ready(());
        };
        if deadline.as_mut().poll(cx).is_ready() {
            self.finish();
            return Poll::Ready(());
        }
        let transport = Pin::new(&mut self.transport);
        if let Some(code) = *goaway {
            match transport.poll_ready(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) => {
                    *goaway = None;
                    let msg = Frame::GoAway { code }.encode();
                    if Pin::new(&mut self.transport).start_send(msg).is_err() {
                        self.finish();
                        return Poll::Ready(());
                    }
                }
                Poll::Ready(Err(_)) => {
                    self.finish();
                    return Poll::Ready(());
                }
            }
        }
        match Pin::new(&mut self.transport).poll_close(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(_) => {
                self.finish();
                Poll::Ready(())
            }
        }
    }

    fn poll_running(&mut self, cx: &mut Context<'_>) -> Result<(), EndReason> {
        let now = Instant::now();
        {
            let mut inner = lock(&self.shared.inner);
            if inner.closing {
                return Err(EndReason::Local);
            }
            if inner.orphaned() {
                return Err(EndReason::Orphaned);
            }
            if !inner
                .driver_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                inner.driver_waker = Some(cx.waker().clone());
            }
        }
        let reader_paused = self.poll_reader(cx, now)?;
        self.poll_timers(cx)?;
        let writer_blocked = self.poll_writer(cx, now)?;
        if (reader_paused && !writer_blocked) || lock(&self.shared.inner).orphaned() {
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// Reads and handles frames. Returns true if paused because of control backpressure.
    fn poll_reader(&mut self, cx: &mut Context<'_>, now: Instant) -> Result<bool, EndReason> {
        for _ in 0..DRIVER_BUDGET {
            if lock(&self.shared.inner).control.len() >= CONTROL_HIGH_WATER {
                return Ok(true);
            }
            match Pin::new(&mut self.transport).poll_next(cx) {
                Poll::Pending => return Ok(false),
                Poll::Ready(None) => return Err(EndReason::PeerClosed),
                Poll::Ready(Some(Err(e))) => return Err(EndReason::Transport(e)),
                Poll::Ready(Some(Ok(msg))) => {
                    self.last_recv = now;
                    let frame = Frame::decode_bytes(msg)
                        .map_err(|e| EndReason::Protocol(format!("bad frame: {e}")))?;
                    self.on_frame(frame, now)?;
                }
            }
        }
        cx.waker().wake_by_ref();
        Ok(false)
    }

    fn on_frame(&mut self, frame: Frame, now: Instant) -> Result<(), EndReason> {
        let shared = &*self.shared;
        let mut wakers: [Option<Waker>; 2] = [None, None];
        {
            let mut inner = lock(&shared.inner);
            match frame {
                Frame::Data { stream, payload } => {
                    let len = payload.len();
                    inner.bytes_in += len as u64;
                    let Some(cell) = inner.streams.get(&stream).cloned() else {
                        return Ok(()); // stream already gone: drop the data
                    };
                    let mut st = lock(&cell.st);
                    let violation = if st.fin_recv {
                        Some("DATA after FIN")
                    } else if len as u64 > st.recv_allowed {
                        Some("DATA beyond the granted credit")
                    } else {
                        None
                    };
                    if let Some(what) = violation {
                        tracing::warn!(stream, len, "{what}: RST protocol");
                        wakers = st.kill(End::LocalReset(RstCode::Protocol)).into();
                        inner.detach(stream, &mut st);
                        inner.control.push_back(Frame::Rst {
                            stream,
                            code: RstCode::Protocol,
                        });
                    } else {
                        st.recv_allowed -= len as u64;
                        st.recv_len += len;
                        st.recv.push_back(payload);
                        st.last_activity = now;
                        wakers[0] = st.read_waker.take();
                    }
                }
                Frame::Window { stream, credit } => {
                    if let Some(cell) = inner.streams.get(&stream) {
                        let mut st = lock(&cell.st);
                        st.credit = st.credit.saturating_add(u64::from(credit));
                        wakers[0] = st.write_waker.take();
                    }
                }
                Frame::Open { stream } => {
                    if stream % 2 != shared.role.peer_parity() || stream <= inner.last_peer_id {
                        return Err(EndReason::Protocol(format!(
                            "OPEN with invalid stream id {stream}"
                        )));
                    }
                    inner.last_peer_id = stream;
                    if !inner.incoming_alive {
                        inner.control.push_back(Frame::Rst {
                            stream,
                            code: RstCode::Cancel,
                        });
                    } else if inner.streams.len() >= shared.config.max_streams {
                        tracing::debug!(stream, "incoming stream over the limit: refused");
                        inner.control.push_back(Frame::Rst {
                            stream,
                            code: RstCode::RefusedLimit,
                        });
                    } else {
                        let mut st = StreamState::new(shared.config.start_window, now);
                        st.in_incoming = true;
                        let cell = Arc::new(StreamCell {
                            id: stream,
                            st: Mutex::new(st),
                        });
                        let extra = shared.config.start_window - INITIAL_WINDOW;
                        if extra > 0 {
                            inner.control.push_back(Frame::Window {
                                stream,
                                credit: extra,
                            });
                        }
                        inner.streams.insert(stream, cell.clone());
                        inner.incoming.push_back(cell);
                        inner.streams_total += 1;
                        tracing::debug!(stream, "stream accepted");
                        wakers[0] = inner.incoming_waker.take();
                    }
                }
                Frame::Fin { stream } => {
                    if let Some(cell) = inner.streams.get(&stream).cloned() {
                        let mut st = lock(&cell.st);
                        st.fin_recv = true;
                        wakers[0] = st.read_waker.take();
                        if st.fin_sent {
                            inner.detach(stream, &mut st);
                        }
                    }
                }
                Frame::Rst { stream, code } => {
                    if let Some(cell) = inner.streams.get(&stream).cloned() {
                        let mut st = lock(&cell.st);
                        tracing::debug!(stream, code = %code, "stream reset by peer");
                        wakers = st.kill(End::PeerReset(code)).into();
                        inner.detach(stream, &mut st);
                    }
                }
                Frame::Ping { nonce } => inner.control.push_back(Frame::Pong { nonce }),
                Frame::Pong { nonce } => {
                    if let Some((probe, sent)) = self.probe
                        && probe == nonce
                    {
                        // Not `now` (taken before this poll's writes): the PING may have
                        // left after it.
                        shared.record_rtt(Instant::now().saturating_duration_since(sent));
                        self.probe = None;
                    }
                }
                Frame::GoAway { code } => {
                    tracing::debug!(code, "peer sent GOAWAY");
                    inner.peer_goaway = true;
                }
            }
        }
        wakers.into_iter().for_each(wake);
        Ok(())
    }

    fn poll_timers(&mut self, cx: &mut Context<'_>) -> Result<(), EndReason> {
        // An owned handle, so `self.ping` can borrow `self` mutably below.
        let shared = self.shared.clone();
        let cfg = &shared.config;
        while self.keepalive.as_mut().poll(cx).is_ready() {
            // A fired timer means its deadline has passed; `now` must not be earlier, or
            // the re-armed timer could fire again without progress.
            let now = Instant::now().max(self.keepalive.deadline());
            if now.saturating_duration_since(self.last_recv) >= cfg.keepalive_timeout {
                return Err(EndReason::KeepaliveTimeout);
            }
            let quiet_since = self.last_recv.max(self.last_ping);
            if now >= quiet_since + cfg.keepalive_interval {
                self.ping(now);
            }
            let next = (self.last_recv.max(self.last_ping) + cfg.keepalive_interval)
                .min(self.last_recv + cfg.keepalive_timeout);
            self.keepalive.as_mut().reset(next);
        }
        if let (Some(sweep), Some(idle)) = (self.idle_sweep.as_mut(), cfg.idle_stream_timeout) {
            while sweep.as_mut().poll(cx).is_ready() {
                let now = Instant::now().max(sweep.deadline());
                let mut wakers = Vec::new();
                {
                    let mut inner = lock(&self.shared.inner);
                    let cells: Vec<Arc<StreamCell>> = inner.streams.values().cloned().collect();
                    for cell in cells {
                        let mut st = lock(&cell.st);
                        if now.saturating_duration_since(st.last_activity) >= idle {
                            tracing::debug!(stream = cell.id, "stream idle: RST");
                            let (r, w) = st.kill(End::LocalReset(RstCode::IdleTimeout));
                            wakers.extend(r);
                            wakers.extend(w);
                            inner.detach(cell.id, &mut st);
                            inner.control.push_back(Frame::Rst {
                                stream: cell.id,
                                code: RstCode::IdleTimeout,
                            });
                        }
                    }
                }
                wakers.into_iter().for_each(Waker::wake);
                sweep.as_mut().reset(now + sweep_period(idle));
            }
        }
        Ok(())
    }

    /// Next frame to send: control first (up to CONTROL_BURST in a row), then one frame of
    /// the stream at the head of the ready queue (round-robin).
    fn next_frame(&mut self, now: Instant) -> Option<(Bytes, Option<Waker>)> {
        let mut inner = lock(&self.shared.inner);
        let serve_control = !inner.control.is_empty()
            && (self.control_streak < CONTROL_BURST || inner.ready.is_empty());
        if serve_control && let Some(f) = inner.control.pop_front() {
            self.control_streak += 1;
            return Some((f.encode(), None));
        }
        self.control_streak = 0;
        while let Some(cell) = inner.ready.pop_front() {
            let id = cell.id;
            let mut st = lock(&cell.st);
            let mut waker = None;
            let msg = if st.end.is_some() {
                None
            } else if st.open_pending {
                st.open_pending = false;
                Some(Frame::Open { stream: id }.encode())
            } else if st.grant_pending > 0 {
                let credit = std::mem::take(&mut st.grant_pending);
                Some(Frame::Window { stream: id, credit }.encode())
            } else if let Some(f) = st.sendq.pop_front() {
                let payload = f.len() - HEADER_LEN;
                st.queued -= payload;
                st.last_activity = now;
                inner.bytes_out += payload as u64;
                waker = st.write_waker.take();
                Some(f.freeze())
            } else if st.fin_queued && !st.fin_sent {
                st.fin_sent = true;
                waker = st.write_waker.take();
                if st.fin_recv {
                    inner.detach(id, &mut st);
                }
                Some(Frame::Fin { stream: id }.encode())
            } else {
                None
            };
            let Some(msg) = msg else {
                st.in_ready = false;
                continue;
            };
            if st.has_output() {
                drop(st);
                inner.ready.push_back(cell);
            } else {
                st.in_ready = false;
            }
            return Some((msg, waker));
        }
        // Nothing to send: producers must wake us.
        if let Some(f) = inner.control.pop_front() {
            self.control_streak += 1;
            return Some((f.encode(), None));
        }
        inner.writer_idle = true;
        None
    }

    /// Writes frames. Returns true if the transport is applying backpressure.
    fn poll_writer(&mut self, cx: &mut Context<'_>, now: Instant) -> Result<bool, EndReason> {
        for _ in 0..DRIVER_BUDGET {
            match Pin::new(&mut self.transport).poll_ready(cx) {
                Poll::Pending => return Ok(true),
                Poll::Ready(Err(e)) => return Err(EndReason::Transport(e)),
                Poll::Ready(Ok(())) => {}
            }
            let Some((msg, waker)) = self.next_frame(now) else {
                if self.need_flush {
                    match Pin::new(&mut self.transport).poll_flush(cx) {
                        Poll::Pending => return Ok(true),
                        Poll::Ready(Err(e)) => return Err(EndReason::Transport(e)),
                        Poll::Ready(Ok(())) => self.need_flush = false,
                    }
                }
                return Ok(false);
            };
            wake(waker);
            Pin::new(&mut self.transport)
                .start_send(msg)
                .map_err(EndReason::Transport)?;
            self.need_flush = true;
        }
        cx.waker().wake_by_ref();
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::transport::{MemoryTransport, memory_pair};

    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;

    fn cfg() -> MuxConfig {
        MuxConfig {
            window: 256 * KIB as u32,
            max_frame_payload: 16 * KIB,
            idle_stream_timeout: None,
            ..MuxConfig::default()
        }
    }

    /// (server/hub end, client/agent end)
    fn pair_with(
        server: MuxConfig,
        client: MuxConfig,
    ) -> ((Control, Incoming), (Control, Incoming)) {
        let (a, b) = memory_pair(64);
        (
            Session::new(a, Role::Server, server),
            Session::new(b, Role::Client, client),
        )
    }

    fn pair() -> ((Control, Incoming), (Control, Incoming)) {
        pair_with(cfg(), cfg())
    }

    /// Writes at least `total` bytes of `byte` to `s` in `chunk`-sized writes, then shuts
    /// it down; the task returns the stream (kept open for reading).
    fn spawn_writer(
        mut s: MuxStream,
        total: usize,
        chunk: usize,
        byte: u8,
    ) -> tokio::task::JoinHandle<MuxStream> {
        tokio::spawn(async move {
            let buf = vec![byte; chunk];
            let mut sent = 0;
            while sent < total {
                s.write_all(&buf).await.unwrap();
                sent += buf.len();
            }
            s.shutdown().await.unwrap();
            s
        })
    }

    fn data(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
        })
    }

    /// Echoes until EOF, then half-closes.
    async fn echo(mut s: MuxStream) {
        let mut buf = vec![0u8; 64 * KIB];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await.unwrap();
        }
        s.shutdown().await.unwrap();
    }

    fn serve_echo(mut incoming: Incoming) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(s) = incoming.next().await {
                tokio::spawn(echo(s));
            }
        })
    }

    /// Sends `payload`, half-closes, reads everything back concurrently.
    async fn round_trip(s: MuxStream, payload: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = tokio::io::split(s);
        let writer = async move {
            w.write_all(&payload).await.unwrap();
            w.shutdown().await.unwrap();
            w
        };
        let reader = async move {
            let mut back = Vec::new();
            r.read_to_end(&mut back).await.unwrap();
            (r, back)
        };
        let (_w, (_r, back)) = tokio::join!(writer, reader);
        back
    }

    async fn eventually(what: &str, cond: impl FnMut() -> bool) {
        let held = crate::test_wait::eventually(Duration::from_secs(10), cond).await;
        assert!(held, "timed out waiting for: {what}");
    }

    fn assert_empty(c: &Control) -> bool {
        c.stats().streams_open == 0 && c.internal_sizes() == (0, 0, 0, 0)
    }

    #[tokio::test]
    async fn open_accept_echo_both_directions() {
        let ((hub, hub_in), (agent, agent_in)) = pair();
        let _e1 = serve_echo(agent_in);
        let _e2 = serve_echo(hub_in);

        let s = hub.open().unwrap();
        assert_eq!(s.id() % 2, 0, "hub opens even ids");
        let msg = data(1, 300 * KIB);
        assert_eq!(round_trip(s, msg.clone()).await, msg);

        let s = agent.open().unwrap();
        assert_eq!(s.id() % 2, 1, "agent opens odd ids");
        let msg = data(2, 1000);
        assert_eq!(round_trip(s, msg.clone()).await, msg);

        eventually("streams freed", || {
            assert_empty(&hub) && assert_empty(&agent)
        })
        .await;
        let st = hub.stats();
        assert_eq!(st.streams_total, 2);
        assert_eq!(st.bytes_out, (300 * KIB + 1000) as u64);
        assert_eq!(st.bytes_in, st.bytes_out);
        assert_eq!(agent.stats().bytes_in, st.bytes_out);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_concurrent_streams_checksummed() {
        let ((hub, hub_in), (agent, agent_in)) = pair();
        let _e1 = serve_echo(agent_in);
        let _e2 = serve_echo(hub_in);
        let mut tasks = Vec::new();
        for i in 0..80u64 {
            let control = if i.is_multiple_of(2) {
                hub.clone()
            } else {
                agent.clone()
            };
            tasks.push(tokio::spawn(async move {
                let len = (i as usize * 37 * KIB) % (1536 * KIB) + (i as usize);
                let msg = data(i, len);
                let s = control.open().unwrap();
                let back = round_trip(s, msg.clone()).await;
                assert_eq!(back.len(), msg.len(), "stream {i}");
                assert_eq!(fnv(&back), fnv(&msg), "stream {i}");
                len as u64
            }));
        }
        let mut total = 0;
        for t in tasks {
            total += t.await.unwrap();
        }
        eventually("streams freed", || {
            assert_empty(&hub) && assert_empty(&agent)
        })
        .await;
        let (h, a) = (hub.stats(), agent.stats());
        assert_eq!(h.streams_total, 80);
        assert_eq!(h.bytes_out + a.bytes_out, 2 * total);
        assert_eq!(h.bytes_in, a.bytes_out);
    }

    #[tokio::test]
    async fn half_close_both_ways() {
        let ((hub, _hub_in), (agent, mut agent_in)) = pair();

        // The opener closes its side first.
        let mut a = hub.open().unwrap();
        a.write_all(b"request").await.unwrap();
        a.shutdown().await.unwrap();
        let err = a.write_all(b"more").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        let mut b = agent_in.next().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        // Reading again after EOF stays at EOF.
        assert_eq!(b.read(&mut [0u8; 8]).await.unwrap(), 0);
        // The other direction is still open.
        b.write_all(b"response").await.unwrap();
        assert_eq!(hub.stats().streams_open, 1);
        b.shutdown().await.unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"response");
        // FIN both ways: freed while the handles still exist; dropping them sends nothing.
        eventually("freed", || assert_empty(&hub) && assert_empty(&agent)).await;
        drop((a, b));

        // The acceptor closes its side first.
        let mut a = hub.open().unwrap();
        a.write_all(b"x").await.unwrap();
        let mut b = agent_in.next().await.unwrap();
        let mut one = [0u8; 1];
        b.read_exact(&mut one).await.unwrap();
        b.write_all(b"bye").await.unwrap();
        b.shutdown().await.unwrap();
        let mut got = Vec::new();
        a.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"bye");
        a.write_all(b"still writing").await.unwrap();
        a.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"still writing");
        eventually("freed", || assert_empty(&hub) && assert_empty(&agent)).await;
        drop((a, b));
        assert!(assert_empty(&hub) && assert_empty(&agent));
    }

    #[tokio::test]
    async fn dropping_a_stream_resets_the_peer() {
        let ((hub, _hub_in), (agent, mut agent_in)) = pair();
        let mut a = hub.open().unwrap();
        a.write_all(b"hello").await.unwrap();
        let mut b = agent_in.next().await.unwrap();
        let mut buf = [0u8; 5];
        b.read_exact(&mut buf).await.unwrap();
        drop(a);
        let err = b.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let err = b.write_all(b"x").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        eventually("freed", || assert_empty(&hub) && assert_empty(&agent)).await;
    }

    /// The point of the whole design: stream A's reader stops; A's writer stops exactly at
    /// the window; stream B still moves many windows' worth of data.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn head_of_line_isolation() {
        let window = 256 * KIB;
        let ((hub, _hub_in), (agent, mut agent_in)) = pair();

        let a = hub.open().unwrap();
        let a_id = a.id();
        let written = Arc::new(AtomicU64::new(0));
        let w = written.clone();
        // A's writer: writes forever, counting accepted bytes.
        let a_writer = tokio::spawn(async move {
            let mut a = a;
            let chunk = vec![0xaa; 10_000];
            loop {
                let n = a.write(&chunk).await.unwrap();
                w.fetch_add(n as u64, Ordering::SeqCst);
            }
        });
        let a_peer = agent_in.next().await.unwrap();
        assert_eq!(a_peer.id(), a_id);
        // A's reader never reads. Wait until A's sender has everything in flight.
        eventually("A blocked at the window", || {
            a_peer.flow().recv_buffered == window
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            written.load(Ordering::SeqCst),
            window as u64,
            "A accepted exactly one window"
        );
        let pf = a_peer.flow();
        assert_eq!(pf.recv_buffered, window);
        assert_eq!(pf.recv_allowed, 0, "A's peer holds no credit");
        assert!(!a_writer.is_finished(), "A's writer is blocked");

        // B moves 16 MiB (64 windows) through the same session while A is stuck.
        let total = 16 * MIB;
        let b = hub.open().unwrap();
        let b_send = tokio::spawn(async move {
            let mut b = b;
            let msg = data(7, total);
            b.write_all(&msg).await.unwrap();
            b.shutdown().await.unwrap();
            (b, fnv(&msg))
        });
        let mut b_peer = agent_in.next().await.unwrap();
        let mut got = Vec::with_capacity(total);
        b_peer.read_to_end(&mut got).await.unwrap();
        let (_b, sum) = b_send.await.unwrap();
        assert_eq!(got.len(), total);
        assert_eq!(fnv(&got), sum);

        // A did not move while B ran.
        assert_eq!(written.load(Ordering::SeqCst), window as u64);
        assert_eq!(a_peer.flow().recv_buffered, window);
        assert!(!a_writer.is_finished());

        // Now A's reader reads; A's writer resumes.
        let mut a_peer = a_peer;
        let mut sink = vec![0u8; 64 * KIB];
        let mut read = 0;
        while read < 4 * window {
            read += a_peer.read(&mut sink).await.unwrap();
        }
        assert!(written.load(Ordering::SeqCst) > window as u64);
        a_writer.abort();
        let _ = agent;
    }

    /// A writer that never stops, counting the bytes its stream accepted.
    fn spawn_endless_writer(s: MuxStream) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
        let written = Arc::new(AtomicU64::new(0));
        let w = written.clone();
        let task = tokio::spawn(async move {
            let mut s = s;
            let chunk = vec![0x5a; 10_000];
            loop {
                let Ok(n) = s.write(&chunk).await else { return };
                w.fetch_add(n as u64, Ordering::SeqCst);
            }
        });
        (written, task)
    }

    /// `raise_window` (the relay's bulk streams) moves the bound of what a stream buffers
    /// for a reader that does not read: the sender gets exactly the raised window ahead,
    /// never more, and never past `MuxConfig::window` — also when the stream is raised by
    /// the side that opened it, before its OPEN went out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_raised_window_is_the_new_bound_and_never_exceeds_the_maximum() {
        let config = MuxConfig {
            window: MIB as u32,
            start_window: 128 * KIB as u32,
            ..cfg()
        };
        let ((hub, mut hub_in), (agent, mut agent_in)) = pair_with(config.clone(), config);
        // Raised by the receiver of a stream the peer opened: 512 KiB, then (asking for
        // 4 MiB) the 1 MiB maximum.
        for (raise, bound) in [(512 * KIB, 512 * KIB), (4 * MIB, MIB)] {
            let (written, writer) = spawn_endless_writer(hub.open().unwrap());
            let peer = agent_in.next().await.unwrap();
            eventually("the start window buffered", || {
                peer.flow().recv_buffered == 128 * KIB
            })
            .await;
            peer.raise_window(raise as u32);
            eventually("the raised window buffered", || {
                peer.flow().recv_buffered == bound
            })
            .await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(written.load(Ordering::SeqCst), bound as u64);
            let f = peer.flow();
            assert_eq!((f.recv_window, f.recv_allowed), (bound as u32, 0));
            writer.abort();
        }
        // Raised by the side that opened it, right away (OPEN still queued): the grant
        // follows the OPEN, and the peer's writer stops at the raised window.
        let mine = agent.open().unwrap();
        mine.raise_window(256 * KIB as u32);
        let (written, writer) = spawn_endless_writer(hub_in.next().await.unwrap());
        eventually("the raised window buffered", || {
            mine.flow().recv_buffered == 256 * KIB
        })
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(written.load(Ordering::SeqCst), 256 * KIB as u64);
        writer.abort();
        // Lowering is not a thing: a smaller value leaves the window as it is.
        mine.raise_window(64 * KIB as u32);
        assert_eq!(mine.flow().recv_window, 256 * KIB as u32);
    }

    /// One busy stream does not starve another: a small request/response on C completes
    /// while B is still in the middle of a large transfer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn busy_stream_does_not_starve_others() {
        let big = MuxConfig {
            window: 8 * MIB as u32,
            max_frame_payload: 64 * KIB,
            idle_stream_timeout: None,
            ..MuxConfig::default()
        };
        let ((hub, _hub_in), (_agent, mut agent_in)) = pair_with(big.clone(), big);
        let total = 256 * MIB;
        let b = hub.open().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let _b_writer = spawn_writer(b, total, 256 * KIB, 1);
        let mut b_peer = agent_in.next().await.unwrap();
        let r = received.clone();
        let b_reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 256 * KIB];
            loop {
                let n = b_peer.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                r.fetch_add(n as u64, Ordering::SeqCst);
            }
        });
        eventually("B running", || {
            received.load(Ordering::SeqCst) > 4 * MIB as u64
        })
        .await;
        let c = hub.open().unwrap();
        let c_peer = agent_in.next().await.unwrap();
        tokio::spawn(echo(c_peer));
        let back = round_trip(c, b"ping".to_vec()).await;
        assert_eq!(back, b"ping");
        let at_c_done = received.load(Ordering::SeqCst);
        assert!(
            at_c_done < total as u64,
            "C completed only after B finished ({at_c_done} of {total})"
        );
        b_reader.await.unwrap();
    }

    /// Reads raw frames until one matches.
    async fn expect_frame(
        raw: &mut MemoryTransport,
        mut want: impl FnMut(&Frame) -> bool,
    ) -> Frame {
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(5), raw.next())
                .await
                .expect("frame in time")
                .expect("transport open")
                .unwrap();
            let f = Frame::decode(&msg).unwrap();
            if want(&f) {
                return f;
            }
        }
    }

    #[tokio::test]
    async fn credit_violation_is_reset() {
        let window = 128 * KIB;
        let (a, mut raw) = memory_pair(64);
        let config = MuxConfig {
            window: window as u32,
            ..cfg()
        };
        let (hub, mut hub_in) = Session::new(a, Role::Server, config);
        raw.send(Frame::Open { stream: 1 }.encode()).await.unwrap();
        // The receiver grants the part of its window above INITIAL_WINDOW right away.
        let f = expect_frame(&mut raw, |f| matches!(f, Frame::Window { .. })).await;
        assert_eq!(
            f,
            Frame::Window {
                stream: 1,
                credit: (window - INITIAL_WINDOW as usize) as u32
            }
        );
        // Exactly the window is fine...
        for _ in 0..window / (16 * KIB) {
            let payload = Bytes::from(vec![3u8; 16 * KIB]);
            raw.send(Frame::Data { stream: 1, payload }.encode())
                .await
                .unwrap();
        }
        let mut s = hub_in.next().await.unwrap();
        eventually("window buffered", || s.flow().recv_buffered == window).await;
        assert_eq!(s.flow().recv_allowed, 0);
        // ...one byte more is a protocol error on this stream only.
        raw.send(
            Frame::Data {
                stream: 1,
                payload: Bytes::from_static(b"!"),
            }
            .encode(),
        )
        .await
        .unwrap();
        let f = expect_frame(&mut raw, |f| matches!(f, Frame::Rst { .. })).await;
        assert_eq!(
            f,
            Frame::Rst {
                stream: 1,
                code: RstCode::Protocol
            }
        );
        let err = s.read(&mut [0u8; 16]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert_eq!(hub.stats().streams_open, 0);
        // The session itself is fine: another stream works.
        raw.send(Frame::Open { stream: 3 }.encode()).await.unwrap();
        raw.send(
            Frame::Data {
                stream: 3,
                payload: Bytes::from_static(b"ok"),
            }
            .encode(),
        )
        .await
        .unwrap();
        let mut s3 = hub_in.next().await.unwrap();
        let mut buf = [0u8; 2];
        s3.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ok");
        assert!(!hub.is_closed());
    }

    #[tokio::test]
    async fn bad_frames_end_the_session_with_goaway() {
        let (a, mut raw) = memory_pair(64);
        let (hub, _hub_in) = Session::new(a, Role::Server, cfg());
        // An even id is the hub's own parity: invalid from the agent.
        raw.send(Frame::Open { stream: 2 }.encode()).await.unwrap();
        let f = expect_frame(&mut raw, |f| matches!(f, Frame::GoAway { .. })).await;
        assert_eq!(
            f,
            Frame::GoAway {
                code: GOAWAY_PROTOCOL
            }
        );
        hub.closed().await;
        assert!(hub.is_closed());

        let (a, mut raw) = memory_pair(64);
        let (hub, _hub_in) = Session::new(a, Role::Server, cfg());
        raw.send(Bytes::from_static(&[9, 0, 0, 0, 0]))
            .await
            .unwrap();
        expect_frame(&mut raw, |f| matches!(f, Frame::GoAway { .. })).await;
        hub.closed().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn ten_thousand_open_and_drop_leak_nothing() {
        let ((hub, hub_in), (agent, mut agent_in)) = pair();
        drop(hub_in);
        // The agent accepts and drops (some after reading, some at once).
        let acceptor = tokio::spawn(async move {
            let mut n = 0u32;
            while let Some(mut s) = agent_in.next().await {
                n += 1;
                if n.is_multiple_of(3) {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4];
                        let _ = s.read(&mut buf).await;
                    });
                }
            }
            n
        });
        for i in 0..10_000u32 {
            let mut s = hub.open().unwrap();
            // The peer may already have reset the stream: errors are expected here.
            match i % 4 {
                0 => {}
                1 => {
                    let _ = s.write_all(b"data").await;
                }
                2 => {
                    let _ = s.write_all(&[7u8; 20_000]).await;
                    let _ = s.shutdown().await;
                }
                _ => {
                    let _ = s.shutdown().await;
                }
            }
            drop(s);
            if i.is_multiple_of(500) {
                tokio::task::yield_now().await;
            }
        }
        eventually("hub and agent empty", || {
            assert_empty(&hub) && assert_empty(&agent)
        })
        .await;
        assert_eq!(hub.stats().streams_total, 10_000);
        hub.close();
        hub.closed().await;
        let accepted = acceptor.await.unwrap();
        assert!(accepted > 0);
        assert!(assert_empty(&agent));
    }

    #[tokio::test]
    async fn max_streams_both_directions() {
        let hub_cfg = MuxConfig {
            max_streams: 2,
            ..cfg()
        };
        let ((hub, mut hub_in), (agent, mut agent_in)) = pair_with(hub_cfg, cfg());
        let s1 = hub.open().unwrap();
        let _s2 = hub.open().unwrap();
        assert_eq!(hub.open().unwrap_err(), MuxError::Limit { max: 2 });
        let _p1 = agent_in.next().await.unwrap();
        let _p2 = agent_in.next().await.unwrap();

        // The agent may open (its own limit is higher), but the hub is full: refused.
        let mut refused = agent.open().unwrap();
        let err = refused.read(&mut [0u8; 4]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        drop(refused);

        // Free one slot on the hub; the next stream is accepted.
        drop(s1);
        eventually("slot freed", || hub.stats().streams_open == 1).await;
        let mut ok = agent.open().unwrap();
        ok.write_all(b"hi").await.unwrap();
        let mut accepted = hub_in.next().await.unwrap();
        let mut buf = [0u8; 2];
        accepted.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        assert_eq!(hub.open().unwrap_err(), MuxError::Limit { max: 2 });
    }

    #[tokio::test(start_paused = true)]
    async fn idle_streams_are_reset() {
        let config = MuxConfig {
            idle_stream_timeout: Some(Duration::from_secs(60)),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(15),
            ..cfg()
        };
        let ((hub, _hub_in), (agent, mut agent_in)) = pair_with(config.clone(), config);
        let mut a = hub.open().unwrap();
        a.write_all(b"1").await.unwrap();
        let mut b = agent_in.next().await.unwrap();
        let mut one = [0u8; 1];
        b.read_exact(&mut one).await.unwrap();
        // Traffic every 40 s keeps it alive well past the timeout.
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_secs(40)).await;
            b.write_all(b"2").await.unwrap();
            a.read_exact(&mut one).await.unwrap();
        }
        assert_eq!(hub.stats().streams_open, 1);
        // Silence: reset within timeout + one sweep period.
        let start = Instant::now();
        let err = a.read(&mut one).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(60) && waited <= Duration::from_secs(76),
            "{waited:?}"
        );
        let err = b.read(&mut one).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(hub.stats().streams_open, 0);
        assert_eq!(agent.stats().streams_open, 0);
        // The session is still alive (keepalive answered all along).
        assert!(!hub.is_closed() && !agent.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_keeps_a_quiet_session_alive() {
        let ((hub, _h), (agent, _a)) = pair();
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(!hub.is_closed() && !agent.is_closed());
    }

    /// A transport that accepts every message and never delivers one.
    struct Swallow {
        sent: Arc<Mutex<Vec<Bytes>>>,
    }

    impl Stream for Swallow {
        type Item = io::Result<Bytes>;
        fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Pending
        }
    }

    impl Sink<Bytes> for Swallow {
        type Error = io::Error;
        fn poll_ready(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn start_send(self: Pin<&mut Self>, item: Bytes) -> io::Result<()> {
            lock(&self.sent).push(item);
            Ok(())
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn keepalive_timeout_ends_a_dead_session() {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let config = MuxConfig {
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(15),
            ..cfg()
        };
        let (control, mut incoming) =
            Session::new(Swallow { sent: sent.clone() }, Role::Client, config);
        let mut s = control.open().unwrap();
        let start = Instant::now();
        control.closed().await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(15) && waited < Duration::from_secs(16),
            "{waited:?}"
        );
        let frames: Vec<Frame> = lock(&sent)
            .iter()
            .map(|m| Frame::decode(m).unwrap())
            .collect();
        let pings = frames
            .iter()
            .filter(|f| matches!(f, Frame::Ping { .. }))
            .count();
        assert_eq!(
            pings, 3,
            "PING at start (RTT probe), at 5 s and at 10 s of silence: {frames:?}"
        );
        assert!(control.is_closed());
        assert_eq!(control.open().unwrap_err(), MuxError::Closed);
        assert!(incoming.next().await.is_none());
        assert_eq!(
            s.read(&mut [0u8; 1]).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            s.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        assert_eq!(control.stats().streams_open, 0);
    }

    #[tokio::test]
    async fn close_ends_every_stream_and_both_sessions() {
        let ((hub, mut hub_in), (agent, mut agent_in)) = pair();
        let mut h1 = hub.open().unwrap();
        h1.write_all(b"abc").await.unwrap();
        let mut a1 = agent_in.next().await.unwrap();
        let mut a2 = agent.open().unwrap();
        a2.write_all(b"def").await.unwrap();
        let mut h2 = hub_in.next().await.unwrap();
        let mut buf = [0u8; 3];
        h2.read_exact(&mut buf).await.unwrap();
        // A writer blocked on credit must be released by close too.
        let mut h3 = hub.open().unwrap();
        let blocked = tokio::spawn(async move {
            let big = vec![0u8; 4 * MIB];
            h3.write_all(&big).await
        });
        let _a3 = agent_in.next().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;

        hub.close();
        assert!(hub.is_closed());
        assert_eq!(hub.open().unwrap_err(), MuxError::Closed);
        tokio::time::timeout(Duration::from_secs(5), async {
            hub.closed().await;
            agent.closed().await;
        })
        .await
        .expect("both sessions end");
        let err = blocked.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        // Hub side: reads fail (the stream was never finished), writes BrokenPipe.
        assert_eq!(
            h1.read(&mut buf).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        assert_eq!(
            h1.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        assert_eq!(
            h2.read(&mut buf).await.unwrap_err().kind(),
            io::ErrorKind::ConnectionAborted
        );
        // Agent side: data that arrived is still readable, then the abort.
        let mut got = Vec::new();
        let err = a1.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(got, b"abc");
        assert_eq!(
            a2.write(b"x").await.unwrap_err().kind(),
            io::ErrorKind::BrokenPipe
        );
        assert!(hub_in.next().await.is_none());
        assert!(agent_in.next().await.is_none());
        assert!(assert_empty(&hub) && assert_empty(&agent));
    }

    #[tokio::test]
    async fn session_ends_when_all_handles_are_dropped() {
        let (a, b) = memory_pair(8);
        let (hub, hub_in) = Session::new(a, Role::Server, cfg());
        let (agent, _agent_in) = Session::new(b, Role::Client, cfg());
        let s = hub.open().unwrap();
        drop(hub_in);
        let hub2 = hub.clone();
        drop(hub);
        // A stream still uses the session: it stays up.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!hub2.is_closed());
        drop(hub2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!agent.is_closed());
        drop(s);
        tokio::time::timeout(Duration::from_secs(5), agent.closed())
            .await
            .expect("peer sees the orphaned session end");
    }

    #[tokio::test]
    async fn buffered_reads_return_credit_like_plain_reads() {
        // Four windows through a stream read only with poll_fill_buf/consume: the sender is
        // released by the credit consume returns; the data is whole; a partial consume
        // followed by a plain read continues where it stopped.
        let ((hub, _hub_in), (_agent, mut agent_in)) = pair();
        let window = cfg().window as usize;
        let msg = data(5, 4 * window + 123);
        let mut s = hub.open().unwrap();
        let sent = msg.clone();
        let writer = tokio::spawn(async move {
            s.write_all(&sent).await.unwrap();
            s.shutdown().await.unwrap();
            s
        });
        let mut p = agent_in.next().await.unwrap();
        let mut got = Vec::new();
        let mut chunks = 0;
        loop {
            let chunk = tokio::io::AsyncBufReadExt::fill_buf(&mut p).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            chunks += 1;
            // Every other chunk: consume part of it, then read the rest with read().
            let n = if chunks % 2 == 0 {
                chunk.len() / 2
            } else {
                chunk.len()
            };
            got.extend_from_slice(&chunk[..n]);
            Pin::new(&mut p).consume(n);
            if chunks % 2 == 0 {
                let mut rest = vec![0u8; 1 << 20];
                let k = p.read(&mut rest).await.unwrap();
                got.extend_from_slice(&rest[..k]);
            }
            assert!(p.flow().recv_buffered <= window);
        }
        assert!(got == msg, "data intact");
        assert!(chunks > 4, "{chunks} chunks");
        let _s = tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .expect("the writer got its credit back")
            .unwrap();
    }

    #[tokio::test]
    async fn windows_may_differ_between_the_ends() {
        let small = MuxConfig {
            window: INITIAL_WINDOW,
            ..cfg()
        };
        let large = MuxConfig {
            window: 4 * MIB as u32,
            ..cfg()
        };
        let ((hub, hub_in), (agent, agent_in)) = pair_with(large, small);
        let _e1 = serve_echo(agent_in);
        let _e2 = serve_echo(hub_in);
        let msg = data(9, 3 * MIB);
        assert_eq!(round_trip(hub.open().unwrap(), msg.clone()).await, msg);
        assert_eq!(round_trip(agent.open().unwrap(), msg.clone()).await, msg);
    }

    #[test]
    fn default_config() {
        let c = MuxConfig::default();
        assert_eq!(c.window, 8 * 1024 * 1024);
        assert_eq!(c.start_window, 512 * 1024);
        assert_eq!(c.max_frame_payload, 256 * 1024);
        assert_eq!(c.max_streams, 4096);
        assert_eq!(c.keepalive_interval, Duration::from_secs(5));
        assert_eq!(c.keepalive_timeout, Duration::from_secs(15));
        assert_eq!(c.idle_stream_timeout, Some(Duration::from_secs(600)));
        assert_eq!(
            MuxConfig { window: 1, ..c }.normalized().window,
            INITIAL_WINDOW
        );
        // The start window lies between INITIAL_WINDOW and the window.
        let n = MuxConfig {
            window: 128 * KIB as u32,
            ..c.clone()
        }
        .normalized();
        assert_eq!(n.start_window, 128 * KIB as u32);
        let n = MuxConfig {
            start_window: 1,
            ..c
        }
        .normalized();
        assert_eq!(n.start_window, INITIAL_WINDOW);
    }

    #[test]
    fn window_grows_only_when_consumed_within_two_round_trips() {
        let ms = Duration::from_millis;
        let (w, max) = (512 * KIB as u32, 8 * MIB as u32);
        let half = w as usize / 2;
        // No RTT sample yet: no growth.
        assert_eq!(grown_window(w, max, half, ms(1), None), w);
        // Half the window in less than two round trips: the window limits, double it.
        assert_eq!(grown_window(w, max, half, ms(99), Some(ms(50))), 2 * w);
        // ... but never beyond the maximum.
        assert_eq!(
            grown_window(max / 2 + 1, max, half, ms(1), Some(ms(50))),
            max
        );
        assert_eq!(grown_window(max, max, half, ms(1), Some(ms(50))), max);
        // Two round trips or more: the reader (or the sender) limits, keep it.
        assert_eq!(grown_window(w, max, half, ms(100), Some(ms(50))), w);
        assert_eq!(grown_window(w, max, half, ms(5), Some(ms(1))), w);
        // A whole window consumed counts double: four round trips.
        assert_eq!(grown_window(w, max, 2 * half, ms(150), Some(ms(50))), 2 * w);
        // A short path: however fast the reader, the window already covers 512 MiB/s.
        let us = Duration::from_micros;
        assert_eq!(grown_window(w, max, half, us(10), Some(us(200))), w);
        assert_eq!(grown_window(w, max, half, us(10), Some(us(1500))), 2 * w);
        // ... and grows only up to that rate's bandwidth-delay product.
        assert_eq!(
            grown_window(MIB as u32, max, MIB / 2, us(10), Some(ms(2))),
            2 * MIB as u32
        );
        assert_eq!(
            grown_window(2 * MIB as u32, max, MIB, us(10), Some(ms(2))),
            2 * MIB as u32
        );
    }

    /// A memory transport pair whose messages arrive `delay` after they were sent, each way
    /// (a long path; use with a paused clock).
    fn delayed_pair(delay: Duration) -> (MemoryTransport, MemoryTransport) {
        let (a, a_far) = memory_pair(1024);
        let (b_far, b) = memory_pair(1024);
        let (a_out, a_in) = a_far.split::<Bytes>();
        let (b_out, b_in) = b_far.split::<Bytes>();
        tokio::spawn(relay_halves(a_in, b_out, delay));
        tokio::spawn(relay_halves(b_in, a_out, delay));
        (a, b)
    }

    /// Forwards every message `delay` after it arrived (order kept).
    async fn relay_halves(
        mut rx: futures::stream::SplitStream<MemoryTransport>,
        mut tx: futures::stream::SplitSink<MemoryTransport, Bytes>,
        delay: Duration,
    ) {
        let (q_tx, mut q_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(m)) = rx.next().await {
                if q_tx.send((Instant::now() + delay, m)).is_err() {
                    break;
                }
            }
        });
        while let Some((at, m)) = q_rx.recv().await {
            tokio::time::sleep_until(at).await;
            if tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = tx.close().await;
    }

    /// Sends `total` bytes hub -> agent on a new stream over a 50 ms round trip, the agent
    /// reading with `read_pause` between 64 KiB reads; returns the receiving stream's final
    /// window and the RTT both ends measured.
    async fn transfer_over_long_path(
        total: usize,
        read_pause: Duration,
    ) -> (u32, Option<Duration>, Option<Duration>) {
        let config = MuxConfig {
            window: 8 * MIB as u32,
            start_window: 256 * KIB as u32,
            max_frame_payload: 64 * KIB,
            idle_stream_timeout: None,
            ..MuxConfig::default()
        };
        let (a, b) = delayed_pair(Duration::from_millis(25));
        let (hub, _hub_in) = Session::new(a, Role::Server, config.clone());
        let (agent, mut agent_in) = Session::new(b, Role::Client, config);
        let s = hub.open().unwrap();
        let writer = spawn_writer(s, total, 64 * KIB, 7);
        let mut r = agent_in.next().await.unwrap();
        let mut buf = vec![0u8; 64 * KIB];
        let mut got = 0;
        loop {
            let n = r.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got += n;
            if !read_pause.is_zero() {
                tokio::time::sleep(read_pause).await;
            }
        }
        assert_eq!(got, total);
        let _s = writer.await.unwrap();
        let window = r.flow().recv_window;
        (window, hub.stats().min_rtt, agent.stats().min_rtt)
    }

    #[tokio::test(start_paused = true)]
    async fn windows_grow_to_the_maximum_on_a_long_path_with_a_fast_reader() {
        let (window, hub_rtt, agent_rtt) = transfer_over_long_path(64 * MIB, Duration::ZERO).await;
        // Both ends measured the path's 50 ms round trip with their first PING.
        assert_eq!(hub_rtt, Some(Duration::from_millis(50)));
        assert_eq!(agent_rtt, Some(Duration::from_millis(50)));
        // 256 KiB per 50 ms would be ~5 MiB/s; the window doubled up to the maximum.
        assert_eq!(window, 8 * MIB as u32);
    }

    #[tokio::test(start_paused = true)]
    async fn windows_stay_small_when_the_reader_is_the_bottleneck() {
        // 64 KiB per 100 ms = 0.64 MiB/s: half the 256 KiB start window takes 200 ms to
        // read, more than two round trips (100 ms), so the window never limits.
        let (window, _, _) = transfer_over_long_path(2 * MIB, Duration::from_millis(100)).await;
        assert_eq!(window, 256 * KIB as u32);
    }

    /// Throughput of the mux alone (memory transport). `cargo test --release -p rlark-tunnel
    /// --lib mux::tests::throughput -- --ignored --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore]
    async fn throughput() {
        for (streams, write_size) in [(1, 8 * KIB), (1, 256 * KIB), (4, 64 * KIB)] {
            let ((hub, _hi), (_agent, mut agent_in)) =
                pair_with(MuxConfig::default(), MuxConfig::default());
            let per_stream = 1024 * MIB / streams;
            let start = std::time::Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..streams {
                let writer = spawn_writer(hub.open().unwrap(), per_stream, write_size, 5);
                tasks.push(tokio::spawn(async move {
                    writer.await.unwrap();
                }));
                let mut p = agent_in.next().await.unwrap();
                tasks.push(tokio::spawn(async move {
                    let mut buf = vec![0u8; 256 * KIB];
                    let mut got = 0;
                    loop {
                        let n = p.read(&mut buf).await.unwrap();
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                    assert_eq!(got, per_stream);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let secs = start.elapsed().as_secs_f64();
            println!(
                "{streams} stream(s), {} KiB writes: {:.0} MiB/s",
                write_size / KIB,
                1024.0 / secs
            );
        }
    }
}
