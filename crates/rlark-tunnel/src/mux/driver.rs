//! The driver task of a session: owns the transport, reads frames into the streams, writes
//! control frames and one DATA frame per stream turn, keep-alive and idle-stream sweeps, and
//! the end of the session.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::{Sink, Stream};
use tokio::time::{Instant, Sleep};

use super::state::{End, Shared, StreamCell, StreamState};
use super::{
    CLOSE_GRACE, CONTROL_BURST, CONTROL_HIGH_WATER, DRIVER_BUDGET, INITIAL_WINDOW, lock, wake,
};
use crate::frame::{Frame, GOAWAY_NORMAL, GOAWAY_PROTOCOL, HEADER_LEN, RstCode};

pub(super) fn sweep_period(idle: Duration) -> Duration {
    (idle / 4).max(Duration::from_millis(1))
}
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

pub(super) enum Phase {
    Running,
    Closing {
        goaway: Option<u8>,
        deadline: Pin<Box<Sleep>>,
    },
    Done,
}

pub(super) struct Driver<T> {
    pub(super) transport: T,
    pub(super) shared: Arc<Shared>,
    pub(super) keepalive: Pin<Box<Sleep>>,
    pub(super) idle_sweep: Option<Pin<Box<Sleep>>>,
    pub(super) last_recv: Instant,
    pub(super) last_ping: Instant,
    pub(super) ping_nonce: u64,
    /// The newest PING not answered yet: (nonce, when queued). Its PONG is an RTT sample.
    pub(super) probe: Option<(u64, Instant)>,
    pub(super) need_flush: bool,
    pub(super) control_streak: usize,
    pub(super) phase: Phase,
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
    pub(super) fn ping(&mut self, now: Instant) {
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
