//! The state a session's handles, streams and driver share: the session's `Shared` part, its
//! locked `Inner` (stream table, queues) and each stream's `StreamCell` / `StreamState`.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{INITIAL_WINDOW, MuxConfig, Role, lock};
use crate::frame::{Frame, RstCode};
use crate::pool;

pub(super) struct Shared {
    pub(super) role: Role,
    pub(super) config: MuxConfig,
    /// Unsent bytes a stream may queue (on top of credit).
    pub(super) send_buffer: usize,
    pub(super) inner: Mutex<Inner>,
    pub(super) done: CancellationToken,
    /// Smallest round-trip time measured with PING/PONG, in nanoseconds (`u64::MAX`: none
    /// yet). Window auto-tuning compares how fast a window is consumed against it.
    pub(super) min_rtt_nanos: AtomicU64,
}

impl Shared {
    pub(super) fn min_rtt(&self) -> Option<Duration> {
        match self.min_rtt_nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            n => Some(Duration::from_nanos(n)),
        }
    }

    pub(super) fn record_rtt(&self, rtt: Duration) {
        let n = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX - 1).max(1);
        self.min_rtt_nanos.fetch_min(n, Ordering::Relaxed);
    }
}

pub(super) struct Inner {
    pub(super) streams: HashMap<u32, Arc<StreamCell>>,
    /// Streams with output (OPEN, WINDOW, DATA, FIN), served round-robin.
    pub(super) ready: VecDeque<Arc<StreamCell>>,
    pub(super) control: VecDeque<Frame>,
    pub(super) incoming: VecDeque<Arc<StreamCell>>,
    pub(super) incoming_waker: Option<Waker>,
    pub(super) driver_waker: Option<Waker>,
    /// The writer found nothing to send: producers must wake the driver.
    pub(super) writer_idle: bool,
    pub(super) control_alive: bool,
    pub(super) incoming_alive: bool,
    /// close() was called or the session ended: no new streams, all streams dead.
    pub(super) closing: bool,
    pub(super) peer_goaway: bool,
    /// Next id to open; 0 once exhausted.
    pub(super) next_id: u32,
    pub(super) last_peer_id: u32,
    pub(super) streams_total: u64,
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
}

impl Inner {
    /// Marks that output is queued; returns the driver's Waker if it must be woken.
    pub(super) fn wake_writer(&mut self) -> Option<Waker> {
        if self.writer_idle {
            self.writer_idle = false;
            self.driver_waker.clone()
        } else {
            None
        }
    }

    pub(super) fn push_control(&mut self, f: Frame) -> Option<Waker> {
        self.control.push_back(f);
        self.wake_writer()
    }

    /// Removes a stream from the map (and the accept queue). Caller holds the stream lock
    /// and has set `st.detached`.
    pub(super) fn detach(&mut self, id: u32, st: &mut StreamState) {
        st.detached = true;
        self.streams.remove(&id);
        if st.in_incoming {
            st.in_incoming = false;
            self.incoming.retain(|c| c.id != id);
        }
        tracing::trace!(stream = id, "stream freed");
    }

    pub(super) fn orphaned(&self) -> bool {
        !self.control_alive && !self.incoming_alive && self.streams.is_empty()
    }

    /// Ends the session for every stream: all are freed and woken; returns Wakers to wake
    /// after the lock is released.
    pub(super) fn begin_close(&mut self) -> Vec<Waker> {
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

pub(super) struct StreamCell {
    pub(super) id: u32,
    pub(super) st: Mutex<StreamState>,
}

/// Why a stream ended abnormally (or the session ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    SessionClosed,
    PeerReset(RstCode),
    LocalReset(RstCode),
}

impl End {
    pub(super) fn error(self) -> io::Error {
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

pub(super) struct StreamState {
    // receive side
    pub(super) recv: VecDeque<Bytes>,
    pub(super) recv_len: usize,
    /// Credit granted to the peer and not yet used by it.
    pub(super) recv_allowed: u64,
    /// Consumed by the application since the last grant.
    pub(super) consumed: usize,
    /// This stream's current receive window (auto-tuned between `start_window` and
    /// `window`).
    pub(super) recv_window: u32,
    /// When the current auto-tuning epoch began: the stream's last grant. None before the
    /// first: the sender starts with its whole window, so how fast the first half of it
    /// arrives says nothing about whether the window limits the stream.
    pub(super) epoch_start: Option<Instant>,
    pub(super) fin_recv: bool,
    // send side
    /// Bytes this side may still queue: peer's credit minus queued and in-flight bytes.
    pub(super) credit: u64,
    /// DATA frames (header included) waiting for the writer.
    pub(super) sendq: VecDeque<pool::Buf>,
    pub(super) queued: usize,
    pub(super) open_pending: bool,
    pub(super) grant_pending: u32,
    pub(super) fin_queued: bool,
    pub(super) fin_sent: bool,
    pub(super) in_ready: bool,
    // lifecycle
    pub(super) end: Option<End>,
    pub(super) detached: bool,
    pub(super) in_incoming: bool,
    pub(super) last_activity: Instant,
    pub(super) read_waker: Option<Waker>,
    pub(super) write_waker: Option<Waker>,
}

impl StreamState {
    pub(super) fn new(window: u32, now: Instant) -> Self {
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

    pub(super) fn has_output(&self) -> bool {
        self.end.is_none()
            && (self.open_pending
                || self.grant_pending > 0
                || !self.sendq.is_empty()
                || (self.fin_queued && !self.fin_sent))
    }

    /// Ends the stream: drops unsent data (and, for local resets, unread data).
    pub(super) fn kill(&mut self, end: End) -> (Option<Waker>, Option<Waker>) {
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
