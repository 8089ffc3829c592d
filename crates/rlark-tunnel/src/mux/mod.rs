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
//!
//! Files: this one holds the configuration, errors and counters; `session` (the public
//! handles), `stream` ([`MuxStream`] and window auto-tuning), `state` (what they share with
//! the driver), `driver` (the task that owns the transport).

mod driver;
mod session;
mod state;
mod stream;
#[cfg(test)]
mod tests;

pub use session::{Control, Incoming, Session};
pub use stream::MuxStream;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

/// Credit every stream starts with in each direction, before the receiver's first WINDOW.
/// Part of the protocol: a receiver must buffer at least this much per stream, so
/// `MuxConfig::window` is raised to it if configured lower.
pub const INITIAL_WINDOW: u32 = 64 * 1024;

/// Writes up to this size may be appended to a frame that is still queued.
pub(super) const COALESCE_MAX: usize = 16 * 1024;
/// Smallest buffer allocated for a new DATA frame (room for later small writes).
pub(super) const MIN_FRAME_ALLOC: usize = 4 * 1024;
/// The read side pauses while this many control frames wait for the writer (a peer that
/// floods PINGs but does not read our PONGs cannot grow our memory).
pub(super) const CONTROL_HIGH_WATER: usize = 1024;
/// Control frames sent in a row before one DATA turn is served.
pub(super) const CONTROL_BURST: usize = 16;
/// Messages handled per driver poll on each side before yielding to the runtime.
pub(super) const DRIVER_BUDGET: usize = 64;
/// How long `close()` waits for GOAWAY and the transport close before dropping it.
pub(super) const CLOSE_GRACE: Duration = Duration::from_secs(2);

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

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent-enough state (plain
    // counters and queues); keep going rather than cascading the panic.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn wake(w: Option<Waker>) {
    if let Some(w) = w {
        w.wake();
    }
}
