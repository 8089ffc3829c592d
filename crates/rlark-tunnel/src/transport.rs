//! Message transports for the multiplexer: one mux frame per message.
//!
//! The mux ([`crate::mux::Session`]) runs over anything that is
//! `Stream<Item = io::Result<Bytes>> + Sink<Bytes, Error = io::Error> + Send + Unpin` and
//! preserves message boundaries. Two implementations:
//!
//! * [`WsTransport`]: binary messages of a WebSocket (`tokio_tungstenite`), the production
//!   transport (`wss://server/api/connect`; TLS is underneath, from tokio-rustls).
//! * [`MemoryTransport`] from [`memory_pair`]: two in-memory ends for tests.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::channel::mpsc;
use futures::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// Largest WebSocket message (and frame) we accept: one mux frame is at most
/// `MuxConfig::max_frame_payload` (256 KiB by default) plus a few bytes of frame header;
/// 1 MiB leaves room for a larger configured payload without letting a peer make us buffer
/// tungstenite's default of 64 MiB per message.
pub const MAX_MESSAGE_SIZE: usize = 1024 * 1024;

/// WebSocket settings for the tunnel (both the agent's client and the hub's server side).
pub fn ws_config() -> WebSocketConfig {
    // Throughput notes:
    // * write_buffer_size (128 KiB): tungstenite appends every outgoing frame to its out buffer
    //   and only writes to the socket once the buffer exceeds this size (or on flush). Small
    //   mux frames (WINDOW credits, PING, interactive DATA) are thus coalesced into one large
    //   write, i.e. few large TLS records and syscalls, while a full 256 KiB DATA frame
    //   exceeds it and is written out at once. The mux flushes after each batch, so the
    //   buffering never delays a lone small frame.
    // * max_write_buffer_size: the out buffer is bounded by write_buffer_size + one message
    //   (tokio-tungstenite's Sink refuses new items until a blocked buffer is fully flushed),
    //   plus a queued pong/close; 2 * MAX_MESSAGE_SIZE on top is a safety net that is never
    //   reached in normal operation (reaching it is an error, not backpressure).
    // * read_buffer_size (128 KiB): the chunk read from the socket per read call; large
    //   enough that a 256 KiB frame takes two reads.
    let write_buffer_size = 128 * 1024;
    WebSocketConfig::default()
        .read_buffer_size(128 * 1024)
        .write_buffer_size(write_buffer_size)
        .max_write_buffer_size(write_buffer_size + 2 * MAX_MESSAGE_SIZE)
        .max_message_size(Some(MAX_MESSAGE_SIZE))
        .max_frame_size(Some(MAX_MESSAGE_SIZE))
}

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

/// A WebSocket as a message transport: each binary message is one item.
///
/// * Incoming Ping: tungstenite queues the Pong itself and writes it out on the next read
///   attempt (or any write/flush). This stream keeps reading right after a Ping (and the
///   mux always polls its transport for input), so the Pong goes out without waiting for
///   our own outgoing traffic; if the socket is not writable, tungstenite retries the write
///   when the reader is woken again. Pong and raw frames are skipped.
/// * Text message: a protocol violation; the stream yields `InvalidData` and then ends.
/// * Close (or the connection closing): the stream ends. The close reply is flushed on a
///   best-effort basis; `poll_close` on the sink performs our side of the close handshake.
pub struct WsTransport<S> {
    ws: WebSocketStream<S>,
    ended: bool,
}

impl<S> std::fmt::Debug for WsTransport<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsTransport")
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> WsTransport<S> {
    /// Wraps an established WebSocket (after the HTTP upgrade).
    pub fn new(ws: WebSocketStream<S>) -> Self {
        WsTransport { ws, ended: false }
    }

    /// The WebSocket inside (e.g. to inspect the underlying TLS stream).
    pub fn get_ref(&self) -> &WebSocketStream<S> {
        &self.ws
    }
}

/// Maps a tungstenite error to an `io::Error`, keeping I/O errors as they are.
fn ws_error(e: WsError) -> io::Error {
    match e {
        WsError::Io(e) => e,
        WsError::ConnectionClosed | WsError::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, "websocket connection closed")
        }
        WsError::Capacity(e) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("websocket message too large: {e}"),
        ),
        WsError::Protocol(e) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("websocket protocol error: {e}"),
        ),
        WsError::Utf8(e) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("websocket protocol error: invalid UTF-8: {e}"),
        ),
        other => io::Error::other(format!("websocket error: {other}")),
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream for WsTransport<S> {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        loop {
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => return Poll::Ready(Some(Ok(data))),
                // The Pong is queued by tungstenite; the next poll of `ws` (this loop)
                // writes it out before reading further.
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => continue,
                Some(Ok(Message::Text(_))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "unexpected text message on the tunnel websocket",
                    ))));
                }
                Some(Ok(Message::Close(_))) => {
                    // tungstenite queued the close reply; one more poll writes it out (and
                    // for the server role ends the connection). Whatever it returns, this
                    // stream is over.
                    self.ended = true;
                    let _ = Pin::new(&mut self.ws).poll_next(cx);
                    return Poll::Ready(None);
                }
                Some(Err(e)) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(ws_error(e))));
                }
                None => {
                    self.ended = true;
                    return Poll::Ready(None);
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Sink<Bytes> for WsTransport<S> {
    type Error = io::Error;

    fn poll_ready(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_ready(cx).map_err(ws_error)
    }

    fn start_send(mut self: Pin<&mut Self>, item: Bytes) -> io::Result<()> {
        Pin::new(&mut self.ws)
            .start_send(Message::Binary(item))
            .map_err(ws_error)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(ws_error)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            // Closing an already closed/terminated connection is not an error.
            Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(ws_error(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{SinkExt, StreamExt};
    use std::time::Duration;
    use tokio::io::DuplexStream;
    use tokio_tungstenite::tungstenite::protocol::Role;

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

    #[test]
    fn ws_config_fits_a_mux_frame() {
        let c = ws_config();
        let frame = 256 * 1024 + 16;
        assert!(c.max_message_size.is_some_and(|m| m >= frame));
        assert!(c.max_frame_size.is_some_and(|m| m >= frame));
        assert!(c.max_write_buffer_size > c.write_buffer_size + MAX_MESSAGE_SIZE);
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

    /// A client and a server WebSocket over an in-memory duplex pipe.
    async fn ws_pair() -> (WebSocketStream<DuplexStream>, WebSocketStream<DuplexStream>) {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let client = WebSocketStream::from_raw_socket(c, Role::Client, Some(ws_config())).await;
        let server = WebSocketStream::from_raw_socket(s, Role::Server, Some(ws_config())).await;
        (client, server)
    }

    async fn transport_pair() -> (WsTransport<DuplexStream>, WsTransport<DuplexStream>) {
        let (c, s) = ws_pair().await;
        (WsTransport::new(c), WsTransport::new(s))
    }

    fn pattern(len: usize, seed: u8) -> Bytes {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>()
            .into()
    }

    #[tokio::test]
    async fn ws_binary_roundtrip_both_directions() {
        let (mut client, mut server) = transport_pair().await;
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
        // Several messages in a batch keep their boundaries.
        for i in 0..10u8 {
            client
                .feed(Bytes::from(vec![i; usize::from(i)]))
                .await
                .unwrap();
        }
        client.flush().await.unwrap();
        for i in 0..10u8 {
            assert_eq!(
                server.next().await.unwrap().unwrap(),
                Bytes::from(vec![i; usize::from(i)])
            );
        }
    }

    #[tokio::test]
    async fn ws_large_messages_concurrently() {
        let (client, server) = transport_pair().await;
        // Bigger than the duplex buffer and the write buffer, both directions at once; each
        // side reads and writes concurrently (split halves, as a mux driver would).
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
    async fn ws_oversized_message_is_an_error() {
        let (c, s) = ws_pair().await;
        let mut raw_client = c;
        let mut server = WsTransport::new(s);
        let reader = tokio::spawn(async move { server.next().await });
        // tungstenite does not check outgoing sizes; the receiver must refuse.
        let _ = raw_client
            .send(Message::Binary(vec![0u8; MAX_MESSAGE_SIZE + 1].into()))
            .await;
        let got = reader.await.unwrap().unwrap();
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn ws_close_ends_the_stream() {
        // The client closes: the server's stream ends; the client's stream ends once the
        // server's close reply arrives.
        let (mut client, mut server) = transport_pair().await;
        client.send(Bytes::from_static(b"bye")).await.unwrap();
        let server_side = tokio::spawn(async move {
            let first = server.next().await.unwrap().unwrap();
            let end = server.next().await;
            (first, end.is_none())
        });
        client.close().await.unwrap();
        let (first, ended) = server_side.await.unwrap();
        assert_eq!(first, Bytes::from_static(b"bye"));
        assert!(ended);
        let end = tokio::time::timeout(Duration::from_secs(5), client.next())
            .await
            .unwrap();
        assert!(end.is_none(), "{end:?}");

        // The server closes: the client's stream ends.
        let (mut client, mut server) = transport_pair().await;
        server.close().await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(5), client.next())
            .await
            .unwrap();
        assert!(end.is_none(), "{end:?}");

        // The connection just drops: the stream ends (or errors), it does not hang.
        let (client, mut server) = transport_pair().await;
        drop(client);
        let end = tokio::time::timeout(Duration::from_secs(5), server.next())
            .await
            .unwrap();
        assert!(matches!(end, None | Some(Err(_))), "{end:?}");
    }

    #[tokio::test]
    async fn ws_text_message_is_a_protocol_error() {
        let (mut raw_client, s) = ws_pair().await;
        let mut server = WsTransport::new(s);
        raw_client.send(Message::text("hello")).await.unwrap();
        let err = server.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(server.next().await.is_none());
    }

    #[tokio::test]
    async fn ws_ping_is_answered_while_only_reading() {
        // The server side is only polled as a stream (as the mux does while idle); the
        // client's ping must still get its pong.
        let (mut raw_client, s) = ws_pair().await;
        let mut server = WsTransport::new(s);
        let reader = tokio::spawn(async move { server.next().await.map(|r| r.unwrap()) });
        raw_client
            .send(Message::Ping(Bytes::from_static(b"nonce")))
            .await
            .unwrap();
        let pong = tokio::time::timeout(Duration::from_secs(5), raw_client.next())
            .await
            .expect("pong in time")
            .unwrap()
            .unwrap();
        assert_eq!(pong, Message::Pong(Bytes::from_static(b"nonce")));
        // Pings are invisible to the transport's user.
        raw_client
            .send(Message::Binary(Bytes::from_static(b"data")))
            .await
            .unwrap();
        assert_eq!(reader.await.unwrap(), Some(Bytes::from_static(b"data")));
    }
}
