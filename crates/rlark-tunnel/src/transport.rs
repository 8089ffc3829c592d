//! Message transports for the multiplexer: one mux frame per message.
//!
//! The mux ([`crate::mux::Session`]) runs over anything that is
//! `Stream<Item = io::Result<Bytes>> + Sink<Bytes, Error = io::Error> + Send + Unpin` and
//! preserves message boundaries. Two implementations:
//!
//! * [`WsTransport`]: binary messages of a WebSocket (RFC 6455), the production transport
//!   (`wss://server/api/connect`; TLS is underneath, from tokio-rustls). The HTTP upgrade is
//!   done by tungstenite ([`connect`], [`accept_hdr`]) or by the hub's HTTP server; the
//!   frames after it are ours ([`crate::ws`]), so that a payload is read straight into the
//!   buffer that becomes the mux frame and written right after its header by one vectored
//!   write — no message copies between the mux and TLS.
//! * [`MemoryTransport`] from [`memory_pair`]: two in-memory ends for tests.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::channel::mpsc;
use futures::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Response;
use tokio_tungstenite::tungstenite::handshake::server::Callback;
use tokio_util::io::poll_read_buf;

use crate::pool;
use crate::ws::{self, FrameHeader, OpCode, Role, WsError};

/// Largest WebSocket message (and frame) we accept: one mux frame is at most
/// `MuxConfig::max_frame_payload` (256 KiB by default) plus a few bytes of frame header;
/// 1 MiB leaves room for a larger configured payload without letting a peer make us buffer
/// more than that per message. Checked on the frame header, before any payload is read.
pub const MAX_MESSAGE_SIZE: usize = 1024 * 1024;

/// Bytes read at a time while looking for a frame header. Small: what arrives behind a
/// header (the start of its payload) is copied once more out of this buffer, whereas the
/// rest of a large payload is read straight into its own buffer.
const HEADER_READ: usize = 4 * 1024;
/// Payloads up to this size are copied (masked, for a client) into one output buffer with
/// their header and their small neighbours, so that WINDOW credits, PINGs and interactive
/// DATA become one write (one TLS record). Larger ones are written from their own buffer.
const COALESCE_MAX: usize = 4 * 1024;
/// `poll_ready` writes out queued frames while this many bytes wait (the sink's bound:
/// at most this plus one message is queued).
const WRITE_HIGH_WATER: usize = 128 * 1024;
/// Smallest allocation of the coalescing buffer.
const TAIL_MIN: usize = 16 * 1024;
/// Buffers per vectored write.
const MAX_IOVECS: usize = 64;
/// Control frames and non-final fragments handled per `poll_next` before it yields, so a
/// peer streaming pings cannot keep the session's driver in one poll.
const CONTROL_BUDGET: usize = 32;

// ---------------------------------------------------------------------------------------
// In memory
// ---------------------------------------------------------------------------------------

/// One end of an in-memory, message-preserving transport (see [`memory_pair`]).
///
/// Closing the sink (`poll_close`) or dropping this end ends the peer's stream after the
/// messages already sent; sending to a peer that was dropped fails with `BrokenPipe`.
#[derive(Debug)]
pub struct MemoryTransport {
    tx: mpsc::Sender<Bytes>,
    rx: mpsc::Receiver<Bytes>,
}

/// Two connected in-memory transport ends; each direction buffers up to `capacity`
/// messages (plus one per sender, as `futures::channel::mpsc` does) before the sender waits.
pub fn memory_pair(capacity: usize) -> (MemoryTransport, MemoryTransport) {
    let (a_tx, b_rx) = mpsc::channel(capacity);
    let (b_tx, a_rx) = mpsc::channel(capacity);
    (
        MemoryTransport { tx: a_tx, rx: a_rx },
        MemoryTransport { tx: b_tx, rx: b_rx },
    )
}

fn broken_pipe(_: mpsc::SendError) -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "in-memory transport peer is gone",
    )
}

impl Stream for MemoryTransport {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.rx).poll_next(cx).map(|m| m.map(Ok))
    }
}

impl Sink<Bytes> for MemoryTransport {
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tx).poll_ready(cx).map_err(broken_pipe)
    }

    fn start_send(mut self: Pin<&mut Self>, item: Bytes) -> io::Result<()> {
        Pin::new(&mut self.tx).start_send(item).map_err(broken_pipe)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tx).poll_flush(cx).map_err(broken_pipe)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tx).poll_close(cx).map_err(broken_pipe)
    }
}

// ---------------------------------------------------------------------------------------
// WebSocket
// ---------------------------------------------------------------------------------------

/// A WebSocket (after the HTTP upgrade) as a message transport: each binary message is one
/// item.
///
/// * Reading: a frame's payload is read straight into a buffer of its own (only bytes that
///   arrived with the header are copied over from the header buffer), unmasked in place,
///   and handed out as `Bytes` without a copy. Large buffers come from a pool and return to
///   it when the message is dropped (at most twice the message's size, so a message kept
///   by a slow reader holds no one else's memory). Fragmented messages (an intermediary may
///   re-fragment) are reassembled up to [`MAX_MESSAGE_SIZE`].
/// * Writing: a message becomes its frame header and its payload buffer, written by one
///   vectored write (the server's payload is not copied). A client masks every frame with a
///   fresh random key, as RFC 6455 requires: in place when the payload's buffer is not
///   shared, else while copying it into a recycled buffer (what tungstenite always did).
///   Small messages are coalesced with their header into one buffer. Frames are written
///   once `WRITE_HIGH_WATER` (128 KiB) bytes are queued or on flush.
/// * Incoming Ping: answered with a Pong carrying its payload (only the latest one if
///   several arrive before it could be written), written from `poll_next` itself, so the
///   answer does not wait for outgoing traffic. Pong is ignored.
/// * Text message, or any violation of RFC 6455 (see [`crate::ws`]): the stream yields
///   `InvalidData` and then ends.
/// * Close: answered with a Close carrying the same code (best effort), then the stream
///   ends. The connection ending without a Close yields `UnexpectedEof`. `poll_close` on the
///   sink sends our Close (1000), flushes and shuts the connection down.
pub struct WsTransport<S> {
    io: S,
    role: Role,
    /// Header bytes (and whatever arrived behind them) not yet consumed.
    rbuf: BytesMut,
    /// The frame whose payload is being read.
    reading: Option<InFrame>,
    /// A fragmented message being reassembled.
    partial: Option<pool::Buf>,
    read_done: bool,
    /// Frames ready to be written, in order.
    out: VecDeque<Bytes>,
    /// Small frames and headers being coalesced; moved to `out` before writing.
    tail: BytesMut,
    /// Bytes in `out` and `tail`.
    queued: usize,
    /// The I/O object writes vectors efficiently; otherwise every payload is coalesced.
    vectored: bool,
    /// Payload of the latest Ping not answered yet.
    pong: Option<Bytes>,
    /// Our Close is queued or sent: no more frames after it.
    close_sent: bool,
}

struct InFrame {
    header: FrameHeader,
    /// Receives the payload at `start..`; for a continuation, the message so far is before.
    buf: pool::Buf,
    start: usize,
}

/// What one complete frame amounted to.
enum Event {
    Message(Bytes),
    /// A control frame or a non-final fragment: nothing for the user yet.
    Internal,
    /// Close received: the stream ends.
    Closed,
}

impl<S> std::fmt::Debug for WsTransport<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsTransport")
            .field("role", &self.role)
            .field("read_done", &self.read_done)
            .field("queued", &self.queued)
            .field("close_sent", &self.close_sent)
            .finish_non_exhaustive()
    }
}

fn invalid(e: WsError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn closed_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "websocket closed: no more messages may be sent",
    )
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsTransport<S> {
    /// Wraps a connection right after the WebSocket upgrade, nothing of it read yet.
    pub fn from_raw_socket(io: S, role: Role) -> Self {
        Self::from_partially_read(io, BytesMut::new(), role)
    }

    /// Wraps a connection whose first bytes after the upgrade (`read`) were already read.
    pub fn from_partially_read(io: S, read: BytesMut, role: Role) -> Self {
        let vectored = io.is_write_vectored();
        WsTransport {
            io,
            role,
            rbuf: read,
            reading: None,
            partial: None,
            read_done: false,
            out: VecDeque::new(),
            tail: BytesMut::new(),
            queued: 0,
            vectored,
            pong: None,
            close_sent: false,
        }
    }

    /// The connection inside (e.g. to inspect the TLS session).
    pub fn get_ref(&self) -> &S {
        &self.io
    }

    /// Queues one frame (FIN set). A client masks with a fresh random key.
    fn enqueue(&mut self, opcode: OpCode, payload: Bytes) {
        let mask = match self.role {
            // RFC 6455 5.3: a fresh, unpredictable key per frame; rand's thread RNG is a
            // CSPRNG seeded from the OS (what tungstenite uses too).
            Role::Client => Some(rand::random::<[u8; 4]>()),
            Role::Server => None,
        };
        let header = FrameHeader {
            fin: true,
            opcode,
            mask,
            len: payload.len() as u64,
        };
        let mut head = [0u8; ws::MAX_HEADER_LEN];
        let n = header.encode(&mut head);
        self.queued += n + payload.len();
        let coalesce = payload.len() <= COALESCE_MAX || !self.vectored;
        let needed = n + if coalesce { payload.len() } else { 0 };
        if self.tail.capacity() - self.tail.len() < needed {
            // Takes the old buffer back if everything split off it was written (see
            // BytesMut::reserve); otherwise a new one, never smaller than TAIL_MIN.
            self.tail.reserve(needed.max(TAIL_MIN));
        }
        self.tail.extend_from_slice(&head[..n]);
        if coalesce {
            match mask {
                Some(key) => ws::extend_masked(&mut self.tail, &payload, key),
                None => self.tail.extend_from_slice(&payload),
            }
            return;
        }
        let payload = match mask {
            None => payload,
            // A buffer of its own (a small mux frame) is masked in place; a shared one, or
            // a recycled one (Bytes::from_owner cannot be made mutable), is copied masked.
            Some(key) => match payload.try_into_mut() {
                Ok(mut owned) => {
                    ws::apply_mask(&mut owned, key);
                    owned.freeze()
                }
                Err(shared) => {
                    let mut owned = pool::Buf::with_capacity(shared.len());
                    ws::extend_masked(&mut *owned, &shared, key);
                    owned.freeze()
                }
            },
        };
        self.out.push_back(self.tail.split().freeze());
        self.out.push_back(payload);
    }

    /// Writes every queued frame (and a pending Pong) to the connection.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.close_sent
            && let Some(payload) = self.pong.take()
        {
            self.enqueue(OpCode::Pong, payload);
        }
        if !self.tail.is_empty() {
            self.out.push_back(self.tail.split().freeze());
        }
        while !self.out.is_empty() {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let mut k = 0;
            for (slot, chunk) in iov.iter_mut().zip(&self.out) {
                *slot = IoSlice::new(chunk);
                k += 1;
            }
            let mut n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, &iov[..k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.queued -= n;
            while n > 0 {
                let Some(front) = self.out.front_mut() else {
                    break;
                };
                if front.len() <= n {
                    n -= front.len();
                    self.out.pop_front();
                } else {
                    front.advance(n);
                    n = 0;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads until one frame is complete and handles it.
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Event>> {
        loop {
            let Some(frame) = self.reading.as_mut() else {
                self.start_frame(cx)?;
                if self.reading.is_none() {
                    // start_frame only returns without a frame when it needs more bytes
                    // and the connection has none yet (it registered the waker).
                    return Poll::Pending;
                }
                continue;
            };
            let end = frame.start + frame.header.len as usize;
            let missing = end - frame.buf.len();
            if missing > 0 {
                if !self.rbuf.is_empty() {
                    let take = missing.min(self.rbuf.len());
                    frame.buf.extend_from_slice(&self.rbuf[..take]);
                    self.rbuf.advance(take);
                    continue;
                }
                let mut dst = (&mut *frame.buf).limit(missing);
                let n = ready!(poll_read_buf(Pin::new(&mut self.io), cx, &mut dst))?;
                if n == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed inside a websocket frame",
                    )));
                }
                continue;
            }
            let Some(InFrame {
                header,
                mut buf,
                start,
            }) = self.reading.take()
            else {
                continue;
            };
            if let Some(key) = header.mask {
                ws::apply_mask(&mut buf[start..], key);
            }
            return Poll::Ready(self.finish_frame(cx, header, buf));
        }
    }

    /// Parses the next header, reading header bytes as needed; on success `self.reading`
    /// is set. Returns `Ok` with `reading` unset when the connection has nothing yet.
    fn start_frame(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        loop {
            let Some((header, header_len)) = FrameHeader::parse(&self.rbuf).map_err(invalid)?
            else {
                // An incomplete header is shorter than MAX_HEADER_LEN < HEADER_READ.
                let want = HEADER_READ - self.rbuf.len();
                self.rbuf.reserve(want);
                let mut dst = (&mut self.rbuf).limit(want);
                match poll_read_buf(Pin::new(&mut self.io), cx, &mut dst) {
                    Poll::Pending => return Ok(()),
                    Poll::Ready(Err(e)) => return Err(e),
                    Poll::Ready(Ok(0)) => {
                        let what = if self.rbuf.is_empty() && self.partial.is_none() {
                            "connection closed without a websocket close frame"
                        } else {
                            "connection closed inside a websocket frame"
                        };
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, what));
                    }
                    Poll::Ready(Ok(_)) => continue,
                }
            };
            header.check(self.role, MAX_MESSAGE_SIZE).map_err(invalid)?;
            let len = header.len as usize; // <= MAX_MESSAGE_SIZE
            let buf = match header.opcode {
                OpCode::Text => return Err(invalid(WsError::TextMessage)),
                OpCode::Binary if self.partial.is_some() => {
                    return Err(invalid(WsError::ExpectedContinuation(OpCode::Binary)));
                }
                OpCode::Continuation => {
                    let Some(mut message) = self.partial.take() else {
                        return Err(invalid(WsError::UnexpectedContinuation));
                    };
                    let total = message.len() + len;
                    if total > MAX_MESSAGE_SIZE {
                        return Err(invalid(WsError::TooLarge {
                            len: total as u64,
                            max: MAX_MESSAGE_SIZE,
                        }));
                    }
                    message.reserve(len);
                    message
                }
                _ => pool::Buf::with_capacity(len),
            };
            self.rbuf.advance(header_len);
            self.reading = Some(InFrame {
                header,
                start: buf.len(),
                buf,
            });
            return Ok(());
        }
    }

    /// Acts on a complete (unmasked) frame.
    fn finish_frame(
        &mut self,
        cx: &mut Context<'_>,
        header: FrameHeader,
        payload: pool::Buf,
    ) -> io::Result<Event> {
        match header.opcode {
            OpCode::Binary | OpCode::Continuation => {
                if header.fin {
                    Ok(Event::Message(payload.freeze()))
                } else {
                    self.partial = Some(payload);
                    Ok(Event::Internal)
                }
            }
            OpCode::Ping => {
                self.pong = Some(payload.freeze());
                // Pending is fine: poll_next tries again on its next call.
                if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
                    return Err(e);
                }
                Ok(Event::Internal)
            }
            OpCode::Pong => Ok(Event::Internal),
            OpCode::Close => {
                let code = ws::parse_close(&payload).map_err(invalid)?;
                if !self.close_sent {
                    self.close_sent = true;
                    let reply =
                        code.map_or_else(Bytes::new, |c| Bytes::copy_from_slice(&c.to_be_bytes()));
                    self.enqueue(OpCode::Close, reply);
                    // Best effort: the stream ends whatever happens to the reply.
                    let _ = self.poll_write_out(cx);
                    let _ = Pin::new(&mut self.io).poll_flush(cx);
                }
                Ok(Event::Closed)
            }
            // Refused in start_frame.
            OpCode::Text => Err(invalid(WsError::TextMessage)),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream for WsTransport<S> {
    type Item = io::Result<Bytes>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.read_done {
            return Poll::Ready(None);
        }
        // A Pong that could not be written when its Ping arrived goes out now, even if the
        // user has nothing to send.
        if this.pong.is_some()
            && let Poll::Ready(Err(e)) = this.poll_write_out(cx)
        {
            this.read_done = true;
            return Poll::Ready(Some(Err(e)));
        }
        for _ in 0..CONTROL_BUDGET {
            match ready!(this.poll_frame(cx)) {
                Ok(Event::Message(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(Event::Internal) => continue,
                Ok(Event::Closed) => {
                    this.read_done = true;
                    return Poll::Ready(None);
                }
                Err(e) => {
                    this.read_done = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Sink<Bytes> for WsTransport<S> {
    type Error = io::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.close_sent {
            return Poll::Ready(Err(closed_error()));
        }
        if this.queued >= WRITE_HIGH_WATER {
            ready!(this.poll_write_out(cx))?;
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: Bytes) -> io::Result<()> {
        let this = self.get_mut();
        if this.close_sent {
            return Err(closed_error());
        }
        this.enqueue(OpCode::Binary, item);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.close_sent {
            this.close_sent = true;
            this.enqueue(
                OpCode::Close,
                Bytes::copy_from_slice(&ws::CLOSE_NORMAL.to_be_bytes()),
            );
        }
        let result = match ready!(this.poll_write_out(cx)) {
            Ok(()) => match ready!(Pin::new(&mut this.io).poll_flush(cx)) {
                Ok(()) => ready!(Pin::new(&mut this.io).poll_shutdown(cx)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match result {
            // Closing a connection the peer already closed is not an error.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::NotConnected
                ) =>
            {
                Poll::Ready(Ok(()))
            }
            other => Poll::Ready(other),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Read-ahead under TLS
// ---------------------------------------------------------------------------------------

/// Size of one [`ReadAhead`] read from the connection.
pub const READ_AHEAD: usize = 64 * 1024;

/// Outgoing TLS bytes rustls may buffer per connection (its default is 64 KiB). Set on
/// the tunnel's TLS connections (`conn.set_buffer_limit(Some(TLS_BUFFER_LIMIT))`) so that
/// a 256 KiB mux frame is encrypted and handed to the socket in one system call instead of
/// four. A limit, not an allocation: memory is used only while the socket is slower than
/// the writer.
pub const TLS_BUFFER_LIMIT: usize = 512 * 1024;

/// Goes between a TCP connection and TLS (`TlsConnector::connect(name, ReadAhead::new(tcp))`)
/// so that the socket is read [`READ_AHEAD`] bytes at a time.
///
/// rustls reads its input at most 4 KiB at a time (its deframer buffer grows in 4 KiB
/// steps and shrinks back whenever it is drained), so a bulk transfer over plain
/// tokio-rustls costs one `recv` system call per 4 KiB — measured at about half of the
/// receiving side's kernel time. Here one `recv` takes up to 64 KiB and rustls's small reads
/// are served from memory. The buffer is taken from the buffer pool when a read needs it and
/// given back as soon as it is drained, so an idle connection holds none. Writes pass
/// through unchanged (vectored included).
#[derive(Debug)]
pub struct ReadAhead<S> {
    io: S,
    /// Read from the connection, not yet handed out: `buf[pos..]`.
    buf: Option<pool::Buf>,
    pos: usize,
}

impl<S> ReadAhead<S> {
    /// Wraps a connection; no buffer is taken until the first read.
    pub fn new(io: S) -> Self {
        ReadAhead {
            io,
            buf: None,
            pos: 0,
        }
    }

    /// The connection inside.
    pub fn get_ref(&self) -> &S {
        &self.io
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ReadAhead<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.buf.is_none() {
            if out.remaining() >= READ_AHEAD {
                // A large read gains nothing from our buffer.
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            let mut buf = pool::Buf::with_capacity(READ_AHEAD);
            let mut dst = (&mut *buf).limit(READ_AHEAD);
            // On Pending the buffer goes back to the pool (dropped) at once.
            if ready!(poll_read_buf(Pin::new(&mut this.io), cx, &mut dst))? == 0 {
                return Poll::Ready(Ok(())); // end of file
            }
            this.buf = Some(buf);
            this.pos = 0;
        }
        if let Some(buf) = &this.buf {
            let n = (buf.len() - this.pos).min(out.remaining());
            out.put_slice(&buf[this.pos..this.pos + n]);
            this.pos += n;
            if this.pos == buf.len() {
                this.buf = None;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ReadAhead<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

// ---------------------------------------------------------------------------------------
// Handshake
// ---------------------------------------------------------------------------------------

/// The client side of the upgrade (tungstenite writes the request and checks the 101);
/// the frames after it are [`WsTransport`]'s. Bytes the server sent right behind its
/// response are kept, not lost.
pub async fn connect<R, S>(
    request: R,
    io: S,
) -> Result<(WsTransport<S>, Response), tungstenite::Error>
where
    R: IntoClientRequest + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (ws, response) = tokio_tungstenite::client_async(request, HeadOnly::new(io)).await?;
    let (io, rest) = ws.into_inner().into_parts();
    Ok((
        WsTransport::from_partially_read(io, rest, Role::Client),
        response,
    ))
}

/// The server side of the upgrade, `callback` seeing the request (tungstenite's
/// `accept_hdr_async`); for servers that do not upgrade through their HTTP stack.
pub async fn accept_hdr<S, C>(io: S, callback: C) -> Result<WsTransport<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Callback + Unpin,
{
    let ws = tokio_tungstenite::accept_hdr_async(HeadOnly::new(io), callback).await?;
    let (io, rest) = ws.into_inner().into_parts();
    Ok(WsTransport::from_partially_read(io, rest, Role::Server))
}

/// [`accept_hdr`] accepting any request.
pub async fn accept<S>(io: S) -> Result<WsTransport<S>, tungstenite::Error>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    accept_hdr(io, tungstenite::handshake::server::NoCallback).await
}

/// Hands tungstenite's handshake the bytes of the HTTP head only (up to and including the
/// empty line that ends it) and keeps what follows for the frame reader: tungstenite would
/// otherwise buffer it inside the `WebSocketStream` we unwrap. After the head it reads as
/// end of file, so a handshake never silently consumes a frame.
struct HeadOnly<S> {
    io: S,
    buf: BytesMut,
    /// Line-end scanner: 0 inside a line, 1 after LF, 2 after LF CR.
    state: u8,
    head_done: bool,
}

impl<S> HeadOnly<S> {
    fn new(io: S) -> Self {
        HeadOnly {
            io,
            buf: BytesMut::new(),
            state: 0,
            head_done: false,
        }
    }

    fn into_parts(self) -> (S, BytesMut) {
        (self.io, self.buf)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeadOnly<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.head_done || out.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        if this.buf.is_empty() {
            this.buf.reserve(HEADER_READ);
            let mut dst = (&mut this.buf).limit(HEADER_READ);
            if ready!(poll_read_buf(Pin::new(&mut this.io), cx, &mut dst))? == 0 {
                return Poll::Ready(Ok(()));
            }
        }
        let avail = this.buf.len().min(out.remaining());
        let mut n = avail;
        for (i, &b) in this.buf[..avail].iter().enumerate() {
            this.state = match (this.state, b) {
                (1 | 2, b'\n') => {
                    this.head_done = true;
                    n = i + 1;
                    break;
                }
                (_, b'\n') => 1,
                (1, b'\r') => 2,
                _ => 0,
            };
        }
        out.put_slice(&this.buf[..n]);
        this.buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeadOnly<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mutation::{Rng, mutate};
    use futures::{SinkExt, StreamExt};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio_tungstenite::WebSocketStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::Role as TRole;

    fn assert_transport<T>()
    where
        T: Stream<Item = io::Result<Bytes>> + Sink<Bytes, Error = io::Error> + Send + Unpin,
    {
    }

    #[test]
    fn both_transports_fit_the_mux_bounds() {
        assert_transport::<MemoryTransport>();
        assert_transport::<WsTransport<DuplexStream>>();
        assert_transport::<WsTransport<tokio::net::TcpStream>>();
    }

    #[tokio::test]
    async fn memory_pair_roundtrip_and_close() {
        let (mut a, mut b) = memory_pair(4);
        a.send(Bytes::from_static(b"hello")).await.unwrap();
        a.send(Bytes::new()).await.unwrap();
        b.send(Bytes::from_static(b"world")).await.unwrap();
        assert_eq!(
            b.next().await.unwrap().unwrap(),
            Bytes::from_static(b"hello")
        );
        assert_eq!(b.next().await.unwrap().unwrap(), Bytes::new());
        assert_eq!(
            a.next().await.unwrap().unwrap(),
            Bytes::from_static(b"world")
        );
        // Closing a's sink ends b's stream after pending messages.
        a.send(Bytes::from_static(b"last")).await.unwrap();
        a.close().await.unwrap();
        assert_eq!(
            b.next().await.unwrap().unwrap(),
            Bytes::from_static(b"last")
        );
        assert!(b.next().await.is_none());
        // Dropping b ends a's stream and makes sending to b fail.
        drop(b);
        assert!(a.next().await.is_none());
        let (mut c, d) = memory_pair(1);
        drop(d);
        let err = c.send(Bytes::from_static(b"x")).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert!(c.next().await.is_none());
    }

    /// Our client and our server over an in-memory duplex pipe of 64 KiB each way (a
    /// sender of more waits for the reader).
    fn transport_pair() -> (WsTransport<DuplexStream>, WsTransport<DuplexStream>) {
        let (c, s) = tokio::io::duplex(64 * 1024);
        (
            WsTransport::from_raw_socket(c, Role::Client),
            WsTransport::from_raw_socket(s, Role::Server),
        )
    }

    /// A tungstenite peer in `peer_role` and our transport in the other role, over a pipe
    /// that holds a few messages (the tests send, then read).
    async fn tungstenite_pair(
        peer_role: TRole,
    ) -> (WebSocketStream<DuplexStream>, WsTransport<DuplexStream>) {
        let (a, b) = tokio::io::duplex(1 << 20);
        let peer = WebSocketStream::from_raw_socket(a, peer_role, None).await;
        let ours = match peer_role {
            TRole::Client => Role::Server,
            TRole::Server => Role::Client,
        };
        (peer, WsTransport::from_raw_socket(b, ours))
    }

    fn pattern(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    }

    #[tokio::test]
    async fn ws_binary_roundtrip_both_directions() {
        let (mut client, mut server) = transport_pair();
        client.send(Bytes::from_static(b"up")).await.unwrap();
        assert_eq!(
            server.next().await.unwrap().unwrap(),
            Bytes::from_static(b"up")
        );
        server.send(Bytes::from_static(b"down")).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Bytes::from_static(b"down")
        );
        // Several messages in a batch keep their boundaries, empty ones included, small
        // (coalesced) and large (vectored) mixed.
        let sizes = [0usize, 1, 125, 126, 4096, 4097, 65535, 65536, 70_000, 3];
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in sizes {
                got.push(server.next().await.unwrap().unwrap());
            }
            got
        });
        for (i, n) in sizes.iter().enumerate() {
            client.feed(pattern(*n, i as u8)).await.unwrap();
        }
        client.flush().await.unwrap();
        let got = reader.await.unwrap();
        for (i, n) in sizes.iter().enumerate() {
            assert_eq!(got[i], pattern(*n, i as u8), "message {i}");
        }
    }

    #[tokio::test]
    async fn ws_large_messages_concurrently() {
        let (client, server) = transport_pair();
        // Bigger than the duplex buffer and the write high water, both directions at once;
        // each side reads and writes concurrently (split halves, as a mux driver would).
        let sizes = [256 * 1024 + 16, MAX_MESSAGE_SIZE, 1, 300_000, 64 * 1024];
        let run = |t: WsTransport<DuplexStream>, seed: u8| async move {
            let (mut tx, mut rx) = t.split();
            let writer = tokio::spawn(async move {
                for (i, n) in sizes.iter().enumerate() {
                    tx.send(pattern(*n, seed + i as u8)).await.unwrap();
                }
                tx
            });
            let mut got = Vec::new();
            for _ in sizes {
                got.push(rx.next().await.unwrap().unwrap());
            }
            let _tx = writer.await.unwrap();
            got
        };
        let (from_server, from_client) = tokio::time::timeout(
            Duration::from_secs(30),
            futures::future::join(run(client, 0), run(server, 100)),
        )
        .await
        .expect("no deadlock");
        for (i, n) in sizes.iter().enumerate() {
            assert_eq!(from_server[i], pattern(*n, 100 + i as u8));
            assert_eq!(from_client[i], pattern(*n, i as u8));
        }
    }

    #[tokio::test]
    async fn shared_payloads_are_masked_without_changing_the_original() {
        let (c, s) = tokio::io::duplex(1 << 20);
        let mut client = WsTransport::from_raw_socket(c, Role::Client);
        let mut server = WsTransport::from_raw_socket(s, Role::Server);
        let payload = pattern(100_000, 7);
        let keep = payload.clone(); // shared: the client must copy, not mask in place
        client.send(payload).await.unwrap();
        assert_eq!(server.next().await.unwrap().unwrap(), keep);
        assert_eq!(keep, pattern(100_000, 7));
    }

    #[tokio::test]
    async fn interoperates_with_tungstenite_as_server_and_as_client() {
        // tungstenite client -> our server: masked frames accepted, our replies readable.
        let (mut peer, mut ours) = tungstenite_pair(TRole::Client).await;
        for n in [0usize, 5, 200, 70_000] {
            peer.send(Message::Binary(pattern(n, 1))).await.unwrap();
            assert_eq!(ours.next().await.unwrap().unwrap(), pattern(n, 1));
            ours.send(pattern(n, 2)).await.unwrap();
            assert_eq!(
                peer.next().await.unwrap().unwrap(),
                Message::Binary(pattern(n, 2))
            );
        }
        // Our client -> tungstenite server: tungstenite requires (and removes) our masks.
        let (mut peer, mut ours) = tungstenite_pair(TRole::Server).await;
        for n in [0usize, 5, 200, 70_000] {
            ours.send(pattern(n, 3)).await.unwrap();
            assert_eq!(
                peer.next().await.unwrap().unwrap(),
                Message::Binary(pattern(n, 3))
            );
            peer.send(Message::Binary(pattern(n, 4))).await.unwrap();
            assert_eq!(ours.next().await.unwrap().unwrap(), pattern(n, 4));
        }
    }

    #[tokio::test]
    async fn ws_oversized_message_is_refused_from_its_header() {
        // The header announces 1 MiB + 1 and no payload follows: refused at once, without
        // waiting for (or buffering) the payload.
        let (mut raw, s) = tokio::io::duplex(1024);
        let mut server = WsTransport::from_raw_socket(s, Role::Server);
        let len = (MAX_MESSAGE_SIZE + 1) as u64;
        let mut head = vec![0x82, 0xff];
        head.extend_from_slice(&len.to_be_bytes());
        head.extend_from_slice(&[1, 2, 3, 4]);
        raw.write_all(&head).await.unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), server.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("exceeds the limit"), "{err}");
        assert!(server.next().await.is_none());
    }

    /// Writes `frames` (raw bytes) to a transport in `role` and collects what it yields
    /// until the stream ends.
    async fn feed_raw(role: Role, bytes: Vec<u8>) -> (Vec<io::Result<Bytes>>, Vec<u8>) {
        let (mut raw, ours) = tokio::io::duplex(1 << 20);
        raw.write_all(&bytes).await.unwrap();
        raw.shutdown().await.unwrap();
        let mut t = WsTransport::from_raw_socket(ours, role);
        let mut got = Vec::new();
        while let Some(item) = tokio::time::timeout(Duration::from_secs(5), t.next())
            .await
            .unwrap()
        {
            got.push(item);
        }
        drop(t);
        let mut written = Vec::new();
        raw.read_to_end(&mut written).await.unwrap();
        (got, written)
    }

    /// Encodes one frame as a peer in `role` would (a client masks with `key`).
    fn raw_frame(role: Role, fin: bool, opcode: OpCode, payload: &[u8]) -> Vec<u8> {
        let mask = (role == Role::Client).then_some([0x11, 0x22, 0x33, 0x44]);
        let header = FrameHeader {
            fin,
            opcode,
            mask,
            len: payload.len() as u64,
        };
        let mut head = [0u8; ws::MAX_HEADER_LEN];
        let n = header.encode(&mut head);
        let mut v = head[..n].to_vec();
        let start = v.len();
        v.extend_from_slice(payload);
        if let Some(key) = mask {
            ws::apply_mask(&mut v[start..], key);
        }
        v
    }

    #[tokio::test]
    async fn fragmented_messages_are_reassembled_around_control_frames() {
        let c = Role::Client;
        let mut bytes = raw_frame(c, false, OpCode::Binary, b"frag");
        bytes.extend(raw_frame(c, true, OpCode::Ping, b"p1"));
        bytes.extend(raw_frame(
            c,
            false,
            OpCode::Continuation,
            &pattern(70_000, 9),
        ));
        bytes.extend(raw_frame(c, true, OpCode::Pong, b""));
        bytes.extend(raw_frame(c, true, OpCode::Continuation, b"end"));
        bytes.extend(raw_frame(c, true, OpCode::Binary, b"next"));
        bytes.extend(raw_frame(c, true, OpCode::Close, &1001u16.to_be_bytes()));
        bytes.extend(raw_frame(
            c,
            true,
            OpCode::Binary,
            b"after close: never read",
        ));
        let (got, written) = feed_raw(Role::Server, bytes).await;
        let got: Vec<Bytes> = got.into_iter().map(Result::unwrap).collect();
        let mut first = b"frag".to_vec();
        first.extend_from_slice(&pattern(70_000, 9));
        first.extend_from_slice(b"end");
        assert_eq!(got, vec![Bytes::from(first), Bytes::from_static(b"next")]);
        // The server answered the ping (unmasked pong) and echoed the close code.
        let s = Role::Server;
        let mut want = raw_frame(s, true, OpCode::Pong, b"p1");
        want.extend(raw_frame(s, true, OpCode::Close, &1001u16.to_be_bytes()));
        assert_eq!(written, want);
    }

    #[tokio::test]
    async fn protocol_violations_end_the_stream_with_invalid_data() {
        let c = Role::Client;
        let s = Role::Server;
        let cases: Vec<(Role, Vec<u8>, &str)> = vec![
            (s, raw_frame(s, true, OpCode::Binary, b"x"), "unmasked"),
            (c, raw_frame(c, true, OpCode::Binary, b"x"), "masked"),
            (
                s,
                raw_frame(c, true, OpCode::Text, b"hello"),
                "text message",
            ),
            (
                s,
                raw_frame(c, true, OpCode::Continuation, b"x"),
                "without a message",
            ),
            (
                s,
                [
                    raw_frame(c, false, OpCode::Binary, b"a"),
                    raw_frame(c, true, OpCode::Binary, b"b"),
                ]
                .concat(),
                "inside a fragmented message",
            ),
            (s, vec![0xc2, 0x80, 0, 0, 0, 0], "reserved bits"),
            (s, vec![0x83, 0x80, 0, 0, 0, 0], "unknown opcode"),
            (s, raw_frame(c, true, OpCode::Close, &[3]), "1-byte payload"),
            (
                s,
                raw_frame(c, true, OpCode::Close, &1005u16.to_be_bytes()),
                "status code 1005",
            ),
        ];
        for (role, bytes, what) in cases {
            let (got, _) = feed_raw(role, bytes).await;
            assert_eq!(got.len(), 1, "{what}: {got:?}");
            let err = got.into_iter().next().unwrap().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}");
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
        // Cut inside a frame, or a clean end without a close frame: UnexpectedEof.
        for (bytes, what) in [
            (
                raw_frame(c, true, OpCode::Binary, b"hello")[..5].to_vec(),
                "inside",
            ),
            (vec![0x82], "inside"),
            (Vec::new(), "without a websocket close frame"),
        ] {
            let (got, _) = feed_raw(s, bytes).await;
            let err = got.into_iter().next().unwrap().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{what}");
            assert!(err.to_string().contains(what), "{what}: {err}");
        }
    }

    #[tokio::test]
    async fn ws_close_ends_the_stream() {
        // The client closes: the server's stream ends; the client's stream ends once the
        // server's close reply arrives.
        let (mut client, mut server) = transport_pair();
        client.send(Bytes::from_static(b"bye")).await.unwrap();
        let server_side = tokio::spawn(async move {
            let first = server.next().await.unwrap().unwrap();
            let end = server.next().await;
            (first, end.is_none(), server)
        });
        client.close().await.unwrap();
        let (first, ended, mut server) = server_side.await.unwrap();
        assert_eq!(first, Bytes::from_static(b"bye"));
        assert!(ended);
        // After a close nothing more may be sent, either way.
        assert_eq!(
            client
                .send(Bytes::from_static(b"x"))
                .await
                .unwrap_err()
                .kind(),
            io::ErrorKind::BrokenPipe
        );
        assert_eq!(
            server
                .send(Bytes::from_static(b"x"))
                .await
                .unwrap_err()
                .kind(),
            io::ErrorKind::BrokenPipe
        );
        let end = tokio::time::timeout(Duration::from_secs(5), client.next())
            .await
            .unwrap();
        assert!(end.is_none(), "{end:?}");

        // The server closes: a tungstenite client sees the close frame.
        let (mut peer, mut ours) = tungstenite_pair(TRole::Client).await;
        ours.close().await.unwrap();
        let msg = peer.next().await.unwrap().unwrap();
        assert!(
            matches!(msg, Message::Close(Some(ref f)) if u16::from(f.code) == 1000),
            "{msg:?}"
        );

        // The connection just drops: the stream fails, it does not hang or end cleanly.
        let (client, mut server) = transport_pair();
        drop(client);
        let end = tokio::time::timeout(Duration::from_secs(5), server.next())
            .await
            .unwrap();
        assert_eq!(
            end.unwrap().unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[tokio::test]
    async fn ws_ping_is_answered_while_only_reading() {
        // Our server is only polled as a stream (as the mux does while idle); the client's
        // ping must still get its pong.
        let (mut peer, mut server) = tungstenite_pair(TRole::Client).await;
        let reader = tokio::spawn(async move { server.next().await.map(|r| r.unwrap()) });
        peer.send(Message::Ping(Bytes::from_static(b"nonce")))
            .await
            .unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(5), peer.next())
            .await
            .expect("pong in time")
            .unwrap()
            .unwrap();
        assert_eq!(pong, Message::Pong(Bytes::from_static(b"nonce")));
        // Pings are invisible to the transport's user.
        peer.send(Message::Binary(Bytes::from_static(b"data")))
            .await
            .unwrap();
        assert_eq!(reader.await.unwrap(), Some(Bytes::from_static(b"data")));
    }

    #[tokio::test]
    async fn handshake_keeps_frames_sent_right_behind_the_response() {
        // A server that answers the upgrade and sends a frame in the same write: the frame
        // must reach the client's transport (tungstenite would keep it in its own buffer).
        let (c, mut s) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move {
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut byte).await.unwrap();
                request.push(byte[0]);
            }
            let text = String::from_utf8(request).unwrap();
            let key = text
                .lines()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .or_else(|| {
                    text.lines()
                        .find_map(|l| l.strip_prefix("sec-websocket-key: "))
                })
                .unwrap()
                .trim()
                .to_owned();
            let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
            let mut reply = format!(
                "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
            )
            .into_bytes();
            reply.extend(raw_frame(Role::Server, true, OpCode::Binary, b"early"));
            s.write_all(&reply).await.unwrap();
            s
        });
        let (mut client, response) = connect("ws://localhost/api/connect", c).await.unwrap();
        assert_eq!(response.status(), 101);
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Bytes::from_static(b"early")
        );
        drop(server.await.unwrap());

        // And our own accept with our own connect, a message each way.
        let (c, s) = tokio::io::duplex(64 * 1024);
        let (client, server) = tokio::join!(connect("ws://localhost/api/connect", c), accept(s));
        let (mut client, mut server) = (client.unwrap().0, server.unwrap());
        client.send(Bytes::from_static(b"up")).await.unwrap();
        assert_eq!(
            server.next().await.unwrap().unwrap(),
            Bytes::from_static(b"up")
        );
        server.send(Bytes::from_static(b"down")).await.unwrap();
        assert_eq!(
            client.next().await.unwrap().unwrap(),
            Bytes::from_static(b"down")
        );
    }

    #[tokio::test]
    async fn read_ahead_serves_small_reads_from_one_large_read() {
        let (mut raw, inner) = tokio::io::duplex(1 << 20);
        let data = pattern(200_000, 3);
        raw.write_all(&data).await.unwrap();
        raw.shutdown().await.unwrap();
        let mut ra = ReadAhead::new(inner);
        let mut got = Vec::new();
        // 4 KiB reads as rustls does, one large read that bypasses the buffer, then the
        // rest; the bytes come out whole and in order, then end of file.
        let mut small = [0u8; 4096];
        for _ in 0..3 {
            let n = ra.read(&mut small).await.unwrap();
            assert!(n > 0);
            got.extend_from_slice(&small[..n]);
        }
        assert!(ra.buf.is_some(), "the first small read filled the buffer");
        let mut rest = Vec::new();
        ra.read_to_end(&mut rest).await.unwrap();
        got.extend_from_slice(&rest);
        assert!(got == data[..], "{} of {} bytes", got.len(), data.len());
        assert!(ra.buf.is_none(), "a drained buffer goes back to the pool");
        assert_eq!(ra.read(&mut small).await.unwrap(), 0);
        // Writes pass through.
        ra.write_all(b"back").await.unwrap();
        let mut back = [0u8; 4];
        raw.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"back");
    }

    /// Reads `input` as a peer's byte stream, in `role`, to its end: every message yielded
    /// is within the size limit and the reader never panics or loops.
    pub(crate) fn read_all(input: &[u8], role: Role) -> Vec<io::Result<Bytes>> {
        let io = tokio::io::join(input, tokio::io::sink());
        let mut t = WsTransport::from_raw_socket(io, role);
        futures::executor::block_on(async {
            let mut got = Vec::new();
            // Each item consumes at least one byte of input, or ends the stream.
            for _ in 0..=input.len() {
                match t.next().await {
                    Some(item) => got.push(item),
                    None => break,
                }
            }
            assert!(
                t.next().await.is_none(),
                "the stream ends after an error or close"
            );
            got
        })
    }

    /// Mutates valid frame sequences (bit flips, byte sets, truncation, extension, splices)
    /// and reads them in both roles: never a panic, never a message over the limit, and an
    /// unmutated sequence yields exactly its messages.
    #[test]
    fn mutated_input_never_panics() {
        let c = Role::Client;
        let s = Role::Server;
        let seeds: Vec<(Role, Vec<u8>)> = vec![
            (
                s,
                [
                    raw_frame(c, true, OpCode::Binary, b"hello"),
                    raw_frame(c, true, OpCode::Ping, b"p"),
                    raw_frame(c, true, OpCode::Binary, &pattern(300, 1)),
                ]
                .concat(),
            ),
            (
                s,
                [
                    raw_frame(c, false, OpCode::Binary, b"ab"),
                    raw_frame(c, true, OpCode::Pong, b""),
                    raw_frame(c, true, OpCode::Continuation, b"cd"),
                    raw_frame(c, true, OpCode::Close, &1000u16.to_be_bytes()),
                ]
                .concat(),
            ),
            (
                c,
                [
                    raw_frame(s, true, OpCode::Binary, &pattern(70, 2)),
                    raw_frame(s, true, OpCode::Binary, b""),
                    raw_frame(s, true, OpCode::Close, b""),
                ]
                .concat(),
            ),
        ];
        // Unmutated: exactly the messages.
        let first = read_all(&seeds[0].1, s);
        assert_eq!(first.len(), 3, "{first:?}"); // two messages, then EOF without close
        assert_eq!(first[0].as_ref().unwrap(), &Bytes::from_static(b"hello"));
        assert_eq!(read_all(&seeds[1].1, s).len(), 1);
        assert_eq!(read_all(&seeds[2].1, c).len(), 2);

        let seed_bytes: Vec<&[u8]> = seeds.iter().map(|(_, s)| s.as_slice()).collect();
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut messages = 0usize;
        for _ in 0..20_000 {
            let (role, seed) = &seeds[rng.below(seeds.len())];
            let mut input = seed.clone();
            // Header bytes are the interesting ones.
            mutate(&mut rng, &mut input, &seed_bytes, |rng, input| {
                let i = rng.below(input.len().min(16));
                input[i] = rng.next() as u8;
            });
            for m in read_all(&input, *role).into_iter().flatten() {
                assert!(m.len() <= MAX_MESSAGE_SIZE);
                messages += 1;
            }
        }
        assert!(messages > 1000, "mutations should leave valid frames too");
    }
}
