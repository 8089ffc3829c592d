use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncBufRead, AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::session::*;
use super::stream::*;
use super::*;
use crate::frame::{Frame, GOAWAY_PROTOCOL, RstCode};
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
fn pair_with(server: MuxConfig, client: MuxConfig) -> ((Control, Incoming), (Control, Incoming)) {
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
async fn expect_frame(raw: &mut MemoryTransport, mut want: impl FnMut(&Frame) -> bool) -> Frame {
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
