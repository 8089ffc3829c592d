//! [`Session::new`] (spawns the driver), [`Control`] (opens streams, pings, closes the
//! session) and [`Incoming`] (accepts the peer's streams).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::{Sink, Stream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::driver::{Driver, Phase, sweep_period};
use super::state::{End, Inner, Shared, StreamCell, StreamState};
use super::stream::MuxStream;
use super::{INITIAL_WINDOW, MuxConfig, MuxError, Role, SessionStats, lock, wake};
use crate::frame::{Frame, RstCode};

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
    pub(super) fn internal_sizes(&self) -> (usize, usize, usize, usize) {
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
