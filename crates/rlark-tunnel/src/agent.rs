//! Agent side of the tunnel: serve the streams the hub opens.
//!
//! Every incoming stream gets its own task. It reads the request header (bounded by
//! [`HEADER_TIMEOUT`]; a hub that sends nothing gets the stream reset), then:
//!
//! * **dial-tcp**: connects to `host:port` from this host within the request's timeout
//!   (capped by [`AgentConfig::max_dial_timeout`]), answers `ok` / `refused` / `unreachable` /
//!   `timeout`, and on `ok` copies bytes both ways until both directions are finished. A FIN
//!   from either side is passed on as a half-close (TCP `shutdown(Write)` / mux FIN), exactly
//!   like `tokio::io::copy_bidirectional`, so request/response protocols that signal the end
//!   of the request by half-closing work through the tunnel.
//! * **agent-api**: answers `ok` and hands the stream to [`AgentConfig::agent_api`], or
//!   `forbidden` when this agent serves no local API.
//! * **relay**: with a [`RelayHandler`] ([`AgentConfig::relay`]), the body is decoded as a
//!   [`RelayHeader`] (an invalid one is answered `bad-request` with the field that failed)
//!   and the stream is handed to the handler, which authorizes and answers itself; without
//!   one, `forbidden` ("relay is not enabled") whatever the body.
//! * a malformed header: `bad-request` with the reason.
//!
//! Error answers are followed by FIN and then the stream is dropped.

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tracing::{Instrument, field};

use crate::header::{self, ReadHeaderError, Status, StreamRequest, StreamResponse};
use crate::mux::{Incoming, MuxStream};
use crate::relay::RelayHeader;

/// How long the agent waits for a stream's request header before resetting the stream.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing an error answer (and its FIN) may take before the stream is dropped.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Copy buffer of a dial-tcp stream's target-to-hub direction. Larger than tokio's 8 KiB
/// default so a bulk transfer becomes fewer, larger mux frames (fewer WebSocket messages and
/// TLS records); small enough that thousands of idle streams cost little. The other
/// direction needs no buffer: it writes the received frames' own buffers to the socket.
const COPY_BUFFER: usize = 32 * 1024;

/// The agent's local API, reachable by the hub through `agent-api` streams (issue 6).
/// `serve` gets the stream right after the `ok` answer was written and must not block:
/// spawn a task to serve it.
pub trait AgentApi: Send + Sync + 'static {
    /// Takes over an accepted `agent-api` stream (positioned after the `ok` answer) and
    /// serves the local API on it; returns at once.
    fn serve(&self, stream: MuxStream);
}

/// The pod-network side of relay streams (issue 16): given a decoded, well-formed
/// [`RelayHeader`] and the stream positioned right after the request header, the handler
/// authorizes the flow (by the caller's cluster — `header.source_cluster` on a stream from
/// the hub — and its own membership view), writes the [`StreamResponse`] itself (`ok`, or
/// `forbidden` / `unreachable` / … with a message naming what failed, then FIN), and on
/// `ok` carries the flow. `serve` must not block: spawn a task.
pub trait RelayHandler: Send + Sync + 'static {
    /// Takes over a relay stream: authorizes `header`'s flow, answers, and on `ok` carries
    /// the flow; returns at once.
    fn serve(&self, header: RelayHeader, stream: MuxStream);
}

/// How the agent serves incoming streams.
#[derive(Clone)]
pub struct AgentConfig {
    /// Dial timeout for callers that have none of their own (10 s). Every dial-tcp header
    /// carries a timeout, so the agent itself always uses the request's (see
    /// `max_dial_timeout`); this is the value hub-side callers put in the header by default.
    pub default_dial_timeout: Duration,
    /// Upper bound on a dial's timeout, whatever the request asks for (60 s).
    pub max_dial_timeout: Duration,
    /// The local API served on `agent-api` streams; `None` answers them `forbidden`.
    pub agent_api: Option<Arc<dyn AgentApi>>,
    /// The pod-network relay served on `relay` streams; `None` answers them `forbidden`.
    pub relay: Option<Arc<dyn RelayHandler>>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            default_dial_timeout: Duration::from_secs(10),
            max_dial_timeout: Duration::from_secs(60),
            agent_api: None,
            relay: None,
        }
    }
}

impl fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentConfig")
            .field("default_dial_timeout", &self.default_dial_timeout)
            .field("max_dial_timeout", &self.max_dial_timeout)
            .field("agent_api", &self.agent_api.is_some())
            .field("relay", &self.relay.is_some())
            .finish()
    }
}

/// Serves every stream the hub opens on this session, each in its own task, until the
/// session ends ([`Incoming`] ends). Then the tasks still running are aborted: their
/// streams are dead anyway, and this closes the TCP connections they were copying.
/// (Streams already handed to [`AgentApi::serve`] are the API's own business.)
pub async fn serve(mut incoming: Incoming, config: AgentConfig) {
    let config = Arc::new(config);
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            stream = incoming.next() => match stream {
                Some(stream) => {
                    let span = tracing::info_span!(
                        "tunnel_stream",
                        stream = stream.id(),
                        kind = field::Empty,
                        target = field::Empty,
                        outcome = field::Empty,
                    );
                    tasks.spawn(handle_stream(stream, config.clone()).instrument(span));
                }
                None => break,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    if !tasks.is_empty() {
        tracing::debug!(
            streams = tasks.len(),
            "session ended: aborting stream tasks"
        );
    }
    tasks.shutdown().await;
}

/// Handles one stream; runs inside its `tunnel_stream` span.
async fn handle_stream(mut stream: MuxStream, config: Arc<AgentConfig>) {
    let span = tracing::Span::current();
    let request =
        match tokio::time::timeout(HEADER_TIMEOUT, header::read_request(&mut stream)).await {
            Err(_) => {
                span.record("outcome", "header-timeout");
                tracing::warn!(timeout = ?HEADER_TIMEOUT, "no stream header in time: stream reset");
                return; // dropping the stream resets it
            }
            Ok(Err(ReadHeaderError::Io(e))) => {
                span.record("outcome", "closed");
                tracing::debug!(error = %e, "stream ended before its header");
                return;
            }
            Ok(Err(ReadHeaderError::Header(e))) => {
                span.record("outcome", Status::BadRequest.as_str());
                tracing::warn!(error = %e, "bad stream header");
                answer_error(&mut stream, Status::BadRequest, e.to_string()).await;
                return;
            }
            Ok(Ok(request)) => request,
        };
    span.record("kind", request.kind());
    match request {
        StreamRequest::DialTcp {
            host,
            port,
            timeout,
        } => {
            span.record("target", field::display(format_args!("{host}:{port}")));
            let timeout = timeout.min(config.max_dial_timeout);
            dial_tcp(stream, &host, port, timeout).await;
        }
        StreamRequest::AgentApi => match &config.agent_api {
            Some(api) => {
                if let Err(e) = stream.write_all(&StreamResponse::ok().encode()).await {
                    span.record("outcome", "closed");
                    tracing::debug!(error = %e, "agent-api stream failed before the answer");
                    return;
                }
                span.record("outcome", Status::Ok.as_str());
                tracing::debug!("agent-api stream handed to the local API");
                api.serve(stream);
            }
            None => {
                span.record("outcome", Status::Forbidden.as_str());
                tracing::info!("agent-api stream refused: no local API");
                answer_error(
                    &mut stream,
                    Status::Forbidden,
                    "this agent serves no local API",
                )
                .await;
            }
        },
        StreamRequest::Relay(body) => {
            // Without a handler the body is not even parsed: there is nothing to serve.
            let Some(handler) = &config.relay else {
                span.record("outcome", Status::Forbidden.as_str());
                tracing::info!("relay stream refused: relay is not enabled");
                answer_error(&mut stream, Status::Forbidden, "relay is not enabled").await;
                return;
            };
            match RelayHeader::decode(&body) {
                Ok(relay) => {
                    span.record("target", field::display(&relay));
                    span.record("outcome", "handed-to-relay");
                    tracing::debug!("relay stream handed to the relay handler");
                    handler.serve(relay, stream);
                }
                Err(e) => {
                    span.record("outcome", Status::BadRequest.as_str());
                    tracing::warn!(error = %e, field = e.field(), "bad relay header");
                    answer_error(&mut stream, Status::BadRequest, e.to_string()).await;
                }
            }
        }
    }
}

/// Writes an error answer and FIN (bounded in time); the caller then drops the stream.
async fn answer_error(stream: &mut MuxStream, status: Status, message: impl Into<String>) {
    let response = StreamResponse::error(status, message).encode();
    let answer = async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(ANSWER_TIMEOUT, answer).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "could not write the answer"),
        Err(_) => tracing::debug!("answer not sent in time: stream reset"),
    }
}

/// Connects to `host:port` within `timeout`, answers, and on success copies both ways.
async fn dial_tcp(mut stream: MuxStream, host: &str, port: u16, timeout: Duration) {
    let span = tracing::Span::current();
    // The header allows a bracketed IPv6 literal; the resolver wants it bare.
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let started = tokio::time::Instant::now();
    let connected = tokio::time::timeout(timeout, TcpStream::connect((bare, port))).await;
    let elapsed = started.elapsed();
    let mut tcp = match connected {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            let status = dial_error_status(&e);
            span.record("outcome", status.as_str());
            tracing::info!(error = %e, ?elapsed, "dial failed");
            answer_error(
                &mut stream,
                status,
                format!("connect to {host}:{port}: {e}"),
            )
            .await;
            return;
        }
        Err(_) => {
            span.record("outcome", Status::Timeout.as_str());
            tracing::info!(?timeout, "dial timed out");
            answer_error(
                &mut stream,
                Status::Timeout,
                format!("connect to {host}:{port}: no connection within {timeout:?}"),
            )
            .await;
            return;
        }
    };
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "set TCP_NODELAY");
    }
    if let Err(e) = stream.write_all(&StreamResponse::ok().encode()).await {
        span.record("outcome", "closed");
        tracing::debug!(error = %e, "stream failed before the answer");
        return;
    }
    tracing::debug!(?elapsed, peer = ?tcp.peer_addr().ok(), "dialed");
    match copy_both_ways(&mut stream, &mut tcp).await {
        Ok((to_target, from_target)) => {
            span.record("outcome", Status::Ok.as_str());
            tracing::debug!(to_target, from_target, "stream done");
        }
        Err(e) => {
            // A reset by either side (hub RST, target RST, session end) lands here.
            span.record("outcome", "reset");
            tracing::debug!(error = %e, "stream ended with an error");
        }
    }
}

async fn copy_both_ways(stream: &mut MuxStream, tcp: &mut TcpStream) -> io::Result<(u64, u64)> {
    splice(stream, tcp, COPY_BUFFER).await
}

/// Copies between a mux stream and `target` (a TCP connection, another mux stream, …)
/// until both directions are finished, passing a FIN on as a half-close either way, like
/// `tokio::io::copy_bidirectional`; returns the bytes copied (to the target, from the
/// target) or the first error. Towards the target the received frames are written from
/// their own buffers (`AsyncBufRead`), without the copy into a buffer of ours that
/// `copy_bidirectional` would make; the other direction reads into a buffer of
/// `buffer` bytes (at least 1).
pub async fn splice<T>(
    stream: &mut MuxStream,
    target: &mut T,
    buffer: usize,
) -> io::Result<(u64, u64)>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    let tcp = target;
    let mut down = Down::default();
    let mut up = Up::new(buffer.max(1));
    std::future::poll_fn(|cx| {
        let to_target = down.poll(cx, stream, tcp)?;
        let from_target = up.poll(cx, tcp, stream)?;
        match (to_target, from_target) {
            (Poll::Ready(a), Poll::Ready(b)) => Poll::Ready(Ok((a, b))),
            _ => Poll::Pending,
        }
    })
    .await
}

/// Stream to target.
#[derive(Default)]
struct Down {
    total: u64,
    eof: bool,
    done: bool,
}

impl Down {
    fn poll<T: AsyncWrite + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        stream: &mut MuxStream,
        tcp: &mut T,
    ) -> Poll<io::Result<u64>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(self.total));
            }
            if self.eof {
                ready!(Pin::new(&mut *tcp).poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            let chunk = ready!(Pin::new(&mut *stream).poll_fill_buf(cx))?;
            if chunk.is_empty() {
                self.eof = true;
                continue;
            }
            let n = ready!(Pin::new(&mut *tcp).poll_write(cx, chunk))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            Pin::new(&mut *stream).consume(n);
            self.total += n as u64;
        }
    }
}

/// Target to stream.
struct Up {
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    total: u64,
    eof: bool,
    done: bool,
}

impl Up {
    fn new(size: usize) -> Self {
        Up {
            buf: vec![0; size].into_boxed_slice(),
            pos: 0,
            end: 0,
            total: 0,
            eof: false,
            done: false,
        }
    }

    fn poll<T: AsyncRead + Unpin>(
        &mut self,
        cx: &mut Context<'_>,
        tcp: &mut T,
        stream: &mut MuxStream,
    ) -> Poll<io::Result<u64>> {
        loop {
            if self.done {
                return Poll::Ready(Ok(self.total));
            }
            if self.pos < self.end {
                let n =
                    ready!(Pin::new(&mut *stream).poll_write(cx, &self.buf[self.pos..self.end]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pos += n;
                self.total += n as u64;
                continue;
            }
            if self.eof {
                ready!(Pin::new(&mut *stream).poll_shutdown(cx))?;
                self.done = true;
                continue;
            }
            let mut read = ReadBuf::new(&mut self.buf);
            ready!(Pin::new(&mut *tcp).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                self.eof = true;
            } else {
                self.pos = 0;
                self.end = n;
            }
        }
    }
}

/// The status for a failed `TcpStream::connect`.
fn dial_error_status(e: &io::Error) -> Status {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Status::Refused,
        io::ErrorKind::TimedOut => Status::Timeout,
        // NetworkUnreachable, HostUnreachable, DNS failures (no address, lookup failed) and
        // anything else: the target cannot be reached from here.
        _ => Status::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpSocket};

    use super::*;
    use crate::dial::{self, DialError};
    use crate::mux::{Control, MuxConfig, Role, Session};
    use crate::transport::memory_pair;

    /// A hub session (returned) and an agent session served by `serve(config)`.
    fn tunnel(config: AgentConfig) -> Control {
        let (a, b) = memory_pair(16);
        let (hub, _hub_in) = Session::new(a, Role::Server, MuxConfig::default());
        let (_agent, agent_in) = Session::new(b, Role::Client, MuxConfig::default());
        tokio::spawn(serve(agent_in, config));
        hub
    }

    fn dial_req(host: &str, port: u16, timeout: Duration) -> StreamRequest {
        StreamRequest::DialTcp {
            host: host.to_owned(),
            port,
            timeout,
        }
    }

    async fn dial(hub: &Control, request: &StreamRequest) -> Result<MuxStream, DialError> {
        dial::open(
            hub,
            request,
            dial::deadline_for(request, Duration::from_secs(5)),
        )
        .await
    }

    /// A server that reads until the client's FIN, then answers with the bytes reversed and
    /// closes: proves the half-close reached it and that its answer travels after it.
    async fn reverse_server() -> (u16, tokio::task::JoinHandle<usize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got.reverse();
            s.write_all(&got).await.unwrap();
            s.shutdown().await.unwrap();
            got.len()
        });
        (port, task)
    }

    #[tokio::test]
    async fn dial_ok_copies_both_ways_with_half_close() {
        let hub = tunnel(AgentConfig::default());
        let (port, server) = reverse_server().await;
        let mut s = dial(&hub, &dial_req("127.0.0.1", port, Duration::from_secs(5)))
            .await
            .unwrap();
        let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        s.write_all(&payload).await.unwrap();
        s.shutdown().await.unwrap(); // FIN: the server only answers after it sees EOF
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap(); // EOF: the server's FIN came back
        let mut expected = payload.clone();
        expected.reverse();
        assert_eq!(back.len(), expected.len());
        assert!(back == expected);
        assert_eq!(server.await.unwrap(), payload.len());
        // Both directions finished: the stream is gone on both sides.
        drop(s);
        tokio::time::timeout(Duration::from_secs(5), async {
            while hub.stats().streams_open != 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn dial_by_name_and_bracketed_ipv6() {
        let hub = tunnel(AgentConfig::default());
        // "localhost" goes through the resolver (/etc/hosts; it may try ::1 first).
        let (port, server) = reverse_server().await;
        let mut s = dial(&hub, &dial_req("localhost", port, Duration::from_secs(5)))
            .await
            .unwrap();
        s.write_all(b"abc").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"cba");
        server.await.unwrap();

        if let Ok(listener) = TcpListener::bind("[::1]:0").await {
            let port = listener.local_addr().unwrap().port();
            tokio::spawn(async move {
                let (mut s, _) = listener.accept().await.unwrap();
                s.write_all(b"v6").await.unwrap();
            });
            let mut s = dial(&hub, &dial_req("[::1]", port, Duration::from_secs(5)))
                .await
                .unwrap();
            let mut back = Vec::new();
            s.read_to_end(&mut back).await.unwrap();
            assert_eq!(back, b"v6");
        }
    }

    #[tokio::test]
    async fn dial_closed_port_is_refused() {
        let hub = tunnel(AgentConfig::default());
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let err = dial(&hub, &dial_req("127.0.0.1", port, Duration::from_secs(5)))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::Refused, "{err}");
        assert!(err.message.contains(&format!("127.0.0.1:{port}")), "{err}");
    }

    #[tokio::test]
    async fn dial_that_never_completes_times_out() {
        // Stays on loopback: a listener with backlog 0 whose accept queue is full. Linux then
        // drops further SYNs, so the next connect hangs until our timeout.
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..2 {
            // Up to two queued handshakes fill it; the extra attempt just times out here.
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
            {
                fillers.push(s);
            }
        }
        assert!(!fillers.is_empty());
        let hub = tunnel(AgentConfig::default());
        let timeout = Duration::from_millis(100);
        let start = std::time::Instant::now();
        let err = dial(&hub, &dial_req("127.0.0.1", addr.port(), timeout))
            .await
            .unwrap_err();
        let elapsed = start.elapsed();
        assert!(
            matches!(err.status, Status::Timeout | Status::Unreachable),
            "{err}"
        );
        assert!(elapsed < timeout + Duration::from_secs(1), "{elapsed:?}");
        assert!(elapsed >= timeout, "{elapsed:?}");
        drop(listener);
    }

    #[tokio::test]
    async fn max_dial_timeout_caps_the_request() {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        let _filler = tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr))
            .await
            .unwrap()
            .unwrap();
        let hub = tunnel(AgentConfig {
            max_dial_timeout: Duration::from_millis(100),
            ..AgentConfig::default()
        });
        let start = std::time::Instant::now();
        let err = dial(
            &hub,
            &dial_req("127.0.0.1", addr.port(), Duration::from_secs(30)),
        )
        .await
        .unwrap_err();
        assert_eq!(err.status, Status::Timeout, "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
        drop(listener);
    }

    #[tokio::test]
    async fn dial_without_route_is_unreachable() {
        // The kernel refuses a TCP connect to a multicast address (ENETUNREACH) without
        // sending anything.
        let hub = tunnel(AgentConfig::default());
        let err = dial(&hub, &dial_req("224.0.0.1", 9, Duration::from_secs(2)))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::Unreachable, "{err}");
        assert!(err.message.starts_with("connect to 224.0.0.1:9: "), "{err}");
    }

    #[test]
    fn dial_errors_map_to_statuses() {
        use io::ErrorKind as K;
        for (kind, status) in [
            (K::ConnectionRefused, Status::Refused),
            (K::TimedOut, Status::Timeout),
            (K::NetworkUnreachable, Status::Unreachable),
            (K::HostUnreachable, Status::Unreachable),
            (K::AddrNotAvailable, Status::Unreachable),
            (K::Other, Status::Unreachable),
        ] {
            assert_eq!(
                dial_error_status(&io::Error::from(kind)),
                status,
                "{kind:?}"
            );
        }
    }

    #[tokio::test]
    async fn agent_api_without_handler_is_forbidden() {
        let hub = tunnel(AgentConfig::default());
        let err = dial(&hub, &StreamRequest::AgentApi).await.unwrap_err();
        assert_eq!(
            err,
            DialError::new(Status::Forbidden, "this agent serves no local API")
        );
    }

    struct Hello(Mutex<Vec<u32>>);

    impl AgentApi for Hello {
        fn serve(&self, mut stream: MuxStream) {
            self.0.lock().unwrap().push(stream.id());
            tokio::spawn(async move {
                let _ = stream.write_all(b"hello from the agent").await;
                let _ = stream.shutdown().await;
                let _ = stream.read(&mut [0u8; 1]).await;
            });
        }
    }

    #[tokio::test]
    async fn agent_api_is_handed_to_the_handler() {
        let api = Arc::new(Hello(Mutex::new(Vec::new())));
        let hub = tunnel(AgentConfig {
            agent_api: Some(api.clone()),
            ..AgentConfig::default()
        });
        let mut s = dial(&hub, &StreamRequest::AgentApi).await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello from the agent");
        assert_eq!(*api.0.lock().unwrap(), vec![s.id()]);
    }

    #[tokio::test]
    async fn relay_is_forbidden() {
        let hub = tunnel(AgentConfig::default());
        let err = dial(&hub, &StreamRequest::Relay(Bytes::from_static(b"x")))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            DialError::new(Status::Forbidden, "relay is not enabled")
        );
    }

    /// Echoes a Tcp flow after `ok`; refuses anything else with `forbidden`, naming it.
    struct EchoRelay(Mutex<Vec<RelayHeader>>);

    impl RelayHandler for EchoRelay {
        fn serve(&self, header: RelayHeader, mut stream: MuxStream) {
            self.0.lock().unwrap().push(header.clone());
            tokio::spawn(async move {
                if header.protocol != crate::relay::Protocol::Tcp {
                    let message = format!("{} is not served here", header.protocol);
                    answer_error(&mut stream, Status::Forbidden, message).await;
                    return;
                }
                stream
                    .write_all(&StreamResponse::ok().encode())
                    .await
                    .unwrap();
                let mut got = Vec::new();
                stream.read_to_end(&mut got).await.unwrap();
                stream.write_all(&got).await.unwrap();
                stream.shutdown().await.unwrap();
            });
        }
    }

    fn relay_header(protocol: crate::relay::Protocol) -> RelayHeader {
        RelayHeader {
            domain: "ray".into(),
            protocol,
            source: "10.8.0.2".parse().unwrap(),
            destination: "10.8.0.3".parse().unwrap(),
            port: if protocol == crate::relay::Protocol::Tcp {
                80
            } else {
                0
            },
            source_port: 0,
            source_cluster: Some("a".into()),
        }
    }

    #[tokio::test]
    async fn relay_is_handed_to_the_handler() {
        use crate::relay::Protocol;
        let handler = Arc::new(EchoRelay(Mutex::new(Vec::new())));
        let hub = tunnel(AgentConfig {
            relay: Some(handler.clone()),
            ..AgentConfig::default()
        });
        let mut s = crate::relay::open(&hub, &relay_header(Protocol::Tcp), Duration::from_secs(5))
            .await
            .unwrap();
        s.write_all(b"over the relay").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"over the relay");
        // The handler's own refusal comes back as written.
        let err = crate::relay::open(&hub, &relay_header(Protocol::Probe), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            DialError::new(Status::Forbidden, "probe is not served here")
        );
        assert_eq!(
            *handler.0.lock().unwrap(),
            vec![relay_header(Protocol::Tcp), relay_header(Protocol::Probe)]
        );
    }

    #[tokio::test]
    async fn bad_relay_body_is_bad_request_naming_the_field() {
        let handler = Arc::new(EchoRelay(Mutex::new(Vec::new())));
        let hub = tunnel(AgentConfig {
            relay: Some(handler.clone()),
            ..AgentConfig::default()
        });
        let mut body = relay_header(crate::relay::Protocol::Tcp)
            .encode()
            .unwrap()
            .to_vec();
        body[11] = 0; // port 0 (bytes 11..13 of an IPv4 header)
        body[12] = 0;
        for (body, field) in [
            (Bytes::from(body), "port"),
            (Bytes::from_static(b"x"), "version"),
            (Bytes::new(), "version"),
        ] {
            let err = dial(&hub, &StreamRequest::Relay(body)).await.unwrap_err();
            assert_eq!(err.status, Status::BadRequest, "{err}");
            assert!(err.message.contains(field), "{err}");
        }
        assert!(
            handler.0.lock().unwrap().is_empty(),
            "nothing was handed on"
        );
    }

    #[tokio::test]
    async fn relay_without_handler_is_forbidden_even_when_well_formed() {
        let hub = tunnel(AgentConfig::default());
        let err = crate::relay::open(
            &hub,
            &relay_header(crate::relay::Protocol::Tcp),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err,
            DialError::new(Status::Forbidden, "relay is not enabled")
        );
    }

    #[tokio::test]
    async fn garbage_header_is_bad_request() {
        let hub = tunnel(AgentConfig::default());
        for garbage in [
            &b"\x07\x01\x00\x00"[..],
            b"\x01\x09\x00\x00",
            b"\x01\x01\xff\xff",
        ] {
            let mut s = hub.open().unwrap();
            s.write_all(garbage).await.unwrap();
            let response =
                tokio::time::timeout(Duration::from_secs(5), header::read_response(&mut s))
                    .await
                    .unwrap()
                    .unwrap();
            assert_eq!(response.status, Status::BadRequest, "{response}");
            assert!(!response.message.is_empty());
            // FIN follows the answer.
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        }
        // A well-formed prefix with an invalid body: port 0.
        let mut s = hub.open().unwrap();
        let mut raw = vec![1u8, 1, 0, 8];
        raw.extend_from_slice(&1000u32.to_be_bytes());
        raw.extend_from_slice(&0u16.to_be_bytes());
        raw.extend_from_slice(&[1, b'a']);
        s.write_all(&raw).await.unwrap();
        let response = header::read_response(&mut s).await.unwrap();
        assert_eq!(response.status, Status::BadRequest, "{response}");
    }

    #[tokio::test(start_paused = true)]
    async fn silent_stream_is_reset_after_the_header_timeout() {
        let hub = tunnel(AgentConfig::default());
        let mut s = hub.open().unwrap();
        s.write_all(&[1u8]).await.unwrap(); // a partial header, then nothing
        let start = tokio::time::Instant::now();
        let err = s.read(&mut [0u8; 8]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        let waited = start.elapsed();
        assert!(waited >= HEADER_TIMEOUT && waited < HEADER_TIMEOUT + Duration::from_secs(1));
    }

    #[tokio::test]
    async fn session_end_stops_serving() {
        let (a, b) = memory_pair(16);
        let (hub, _hub_in) = Session::new(a, Role::Server, MuxConfig::default());
        let (_agent, agent_in) = Session::new(b, Role::Client, MuxConfig::default());
        let served = tokio::spawn(serve(agent_in, AgentConfig::default()));
        // A dial whose copy is still running when the session goes away.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let _s = dial(&hub, &dial_req("127.0.0.1", port, Duration::from_secs(5)))
            .await
            .unwrap();
        let (mut target, _) = listener.accept().await.unwrap();
        hub.close();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("serve returns when the session ends")
            .unwrap();
        // The target's connection was closed by the agent.
        let n = tokio::time::timeout(Duration::from_secs(5), target.read(&mut [0u8; 8]))
            .await
            .unwrap();
        assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    }
}
