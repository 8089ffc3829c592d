//! [`MuxStream`], one stream (`AsyncRead + AsyncBufRead + AsyncWrite`), with its credit
//! accounting and receive-window auto-tuning (`grown_window`).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::state::{End, Shared, StreamCell, StreamState};
use super::{COALESCE_MAX, MIN_FRAME_ALLOC, lock, wake};
use crate::frame::{self, Frame, FrameType, HEADER_LEN, RstCode};
use crate::pool;

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
pub(super) fn grown_window(
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
/// One multiplexed byte stream: `AsyncRead + AsyncBufRead + AsyncWrite`.
///
/// `poll_shutdown` sends FIN (half-close) once queued data is out; reads return EOF after
/// the peer's FIN; dropping a stream that is not fully closed sends RST (cancel).
/// `AsyncBufRead` hands out the received frames' own buffers (no copy; e.g.
/// `tokio::io::copy_buf` to a socket); credit goes back to the peer as the data is
/// consumed, exactly as with `poll_read`.
pub struct MuxStream {
    pub(super) cell: Arc<StreamCell>,
    pub(super) shared: Arc<Shared>,
    /// Received data taken out of the stream's queue by `poll_fill_buf`, not consumed yet.
    /// It still counts against the window: credit for it is returned on `consume`.
    pub(super) rx: Bytes,
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
pub(super) struct Flow {
    /// Bytes this side may still write.
    pub(super) credit: u64,
    /// Written but not yet handed to the transport.
    pub(super) queued: usize,
    /// Received, not yet read by the application.
    pub(super) recv_buffered: usize,
    /// Credit the peer still holds for sending to us.
    pub(super) recv_allowed: u64,
    /// The stream's current receive window.
    pub(super) recv_window: u32,
}

impl MuxStream {
    /// The stream id (odd: opened by the client/agent, even: by the server/hub).
    pub fn id(&self) -> u32 {
        self.cell.id
    }

    #[cfg(test)]
    pub(super) fn flow(&self) -> Flow {
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
