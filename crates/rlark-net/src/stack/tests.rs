use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use etherparse::PacketBuilder;
use ipnet::IpNet;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::datagram::{Decision, DropReason, Limits, PlaneConfig, classify};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an IP")
}

/// A TCP SYN from `from` to `to` as the replica's kernel would write it into the TUN.
fn syn(from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let builder = match (from.ip(), to.ip()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => PacketBuilder::ipv4(a.octets(), b.octets(), 64),
        (IpAddr::V6(a), IpAddr::V6(b)) => PacketBuilder::ipv6(a.octets(), b.octets(), 64),
        _ => panic!("one family"),
    };
    let builder = builder.tcp(from.port(), to.port(), 1000, 65535).syn();
    let mut packet = Vec::with_capacity(builder.size(0));
    builder.write(&mut packet, &[]).expect("build");
    packet
}

fn plane_config() -> PlaneConfig {
    PlaneConfig {
        domain: "d".into(),
        cidrs: vec![
            "10.88.0.0/16".parse::<IpNet>().unwrap(),
            "fd00:88::/64".parse().unwrap(),
        ],
        addresses: vec![ip("10.88.0.2"), ip("fd00:88::2")],
        limits: Limits::default(),
    }
}

#[test]
fn tcp_from_the_replica_is_split_off_for_the_stack_in_and_out_of_the_domain() {
    let config = plane_config();
    for (from, to) in [
        ("10.88.0.2:40000", "10.88.0.9:80"),
        ("[fd00:88::2]:40000", "[fd00:88::9]:80"),
        // Outside the domain: the stack accepts it too, the router sends it to egress.
        ("10.88.0.2:40001", "192.0.2.7:443"),
    ] {
        let packet = syn(from.parse().unwrap(), to.parse().unwrap());
        assert_eq!(classify(&config, &packet), Decision::Tcp, "{from} -> {to}");
    }
    // Not from the replica's own address: dropped before any stack sees it.
    let spoofed = syn(
        "10.88.0.3:40000".parse().unwrap(),
        "10.88.0.9:80".parse().unwrap(),
    );
    assert_eq!(
        classify(&config, &spoofed),
        Decision::Drop(DropReason::SpoofedSource)
    );
}

#[tokio::test]
async fn the_device_reads_whole_packets_drops_oversized_ones_and_writes_one_per_write() {
    let metrics = DatagramMetrics::default();
    let (in_tx, in_rx) = mpsc::channel(4);
    let (out_tx, mut out_rx) = mpsc::channel(1);
    let mut device = ChannelDevice::new(in_rx, out_tx, metrics.clone());

    in_tx.send(vec![1; 10]).await.unwrap();
    in_tx.send(vec![2; 100]).await.unwrap();
    in_tx.send(vec![3; 20]).await.unwrap();
    let mut buf = [0u8; 50];
    let n = device.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], &[1; 10]);
    // The 100-byte packet does not fit: dropped whole, never cut; the next one is read.
    let n = device.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], &[3; 20]);
    assert_eq!(metrics.dropped_count(DropReason::TooBig), 1);

    // Closed and empty: pending, never a 0-byte read.
    drop(in_tx);
    let read = tokio::time::timeout(Duration::from_millis(50), device.read(&mut buf)).await;
    assert!(read.is_err(), "a closed device must not report a packet");

    assert_eq!(device.write(&[7; 30]).await.unwrap(), 30);
    // The queue (1) is full: the next write waits until the writer takes a packet.
    let mut second = tokio_test_write(&mut device, &[8; 5]);
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut second)
            .await
            .is_err(),
        "a write into a full queue must wait"
    );
    assert_eq!(out_rx.recv().await.unwrap(), vec![7; 30]);
    assert_eq!(second.await.unwrap(), 5);
    assert_eq!(out_rx.recv().await.unwrap(), vec![8; 5]);

    // The writer is gone: writes fail (the stack stops), they do not vanish.
    drop(out_rx);
    let error = device.write(&[9; 3]).await.expect_err("writer gone");
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
}

fn tokio_test_write<'a>(
    device: &'a mut ChannelDevice,
    bytes: &'a [u8],
) -> Pin<Box<dyn Future<Output = io::Result<usize>> + 'a>> {
    Box::pin(device.write(bytes))
}

/// A stream whose shutdown completes only after it was polled `needed` times, and which
/// never wakes the task itself: ipstack's bug #89 in miniature.
struct SleepyShutdown {
    polls: Arc<AtomicUsize>,
    needed: usize,
}

impl AsyncRead for SleepyShutdown {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SleepyShutdown {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polls = self.polls.fetch_add(1, Ordering::SeqCst) + 1;
        if polls >= self.needed {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

#[tokio::test]
async fn a_shutdown_that_is_never_woken_is_polled_again_until_done_or_the_limit() {
    let polls = Arc::new(AtomicUsize::new(0));
    let mut stream = FinRetry::with_timing(
        SleepyShutdown {
            polls: polls.clone(),
            needed: 5,
        },
        Duration::from_millis(1),
        Duration::from_secs(60),
    );
    stream.shutdown().await.expect("done after re-polling");
    assert_eq!(polls.load(Ordering::SeqCst), 5);

    // Without the wrapper the same stream would wait forever.
    let polls = Arc::new(AtomicUsize::new(0));
    let mut bare = SleepyShutdown {
        polls: polls.clone(),
        needed: 5,
    };
    let waited = tokio::time::timeout(Duration::from_millis(100), bare.shutdown()).await;
    assert!(waited.is_err(), "nothing wakes the bare shutdown");
    // Polled once, and once more only when the timeout itself fired.
    assert!(polls.load(Ordering::SeqCst) <= 2);

    // Never done: the retries are bounded.
    let mut stuck = FinRetry::with_timing(
        SleepyShutdown {
            polls: Arc::new(AtomicUsize::new(0)),
            needed: usize::MAX,
        },
        Duration::from_millis(1),
        Duration::from_millis(50),
    );
    let error = stuck.shutdown().await.expect_err("gives up");
    assert_eq!(error.kind(), io::ErrorKind::TimedOut);
}

/// The TUN in memory: what the stack writes is collected.
#[derive(Default)]
struct Written {
    packets: Mutex<VecDeque<Vec<u8>>>,
}

impl PacketIo for Written {
    fn recv<'a>(&'a self, _buf: &'a mut [u8]) -> BoxFuture<'a, io::Result<usize>> {
        Box::pin(std::future::pending())
    }
    fn send<'a>(&'a self, packet: &'a [u8]) -> BoxFuture<'a, io::Result<()>> {
        self.packets.lock().unwrap().push_back(packet.to_vec());
        Box::pin(async { Ok(()) })
    }
}

struct Accepted(mpsc::UnboundedSender<(SocketAddr, SocketAddr)>);

impl TcpHandler for Accepted {
    fn serve(
        &self,
        stream: BoxStream,
        source: SocketAddr,
        destination: SocketAddr,
    ) -> BoxFuture<'static, ()> {
        let _ = self.0.send((source, destination));
        Box::pin(async move {
            // Hold the connection until the stack stops.
            let _stream = stream;
            std::future::pending::<()>().await;
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syn_fed_to_the_stack_is_answered_and_accepted_with_both_ends() {
    for (from, to) in [
        ("10.88.0.2:40000", "10.88.0.9:8080"),
        ("[fd00:88::2]:40000", "[fd00:88::9]:8080"),
    ] {
        let (from, to): (SocketAddr, SocketAddr) = (from.parse().unwrap(), to.parse().unwrap());
        let io = Arc::new(Written::default());
        let (accepted_tx, mut accepted) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let stack = TcpStack::start(
            io.clone(),
            Arc::new(Accepted(accepted_tx)),
            DatagramMetrics::default(),
            shutdown.clone(),
        );
        stack.packets().send(syn(from, to)).await.unwrap();
        let (source, destination) = tokio::time::timeout(Duration::from_secs(10), accepted.recv())
            .await
            .expect("accepted in time")
            .expect("accepted");
        assert_eq!((source, destination), (from, to));
        // The SYN-ACK went out through the TUN: from the original destination to the
        // replica, announcing the stack's MSS.
        let reply = loop {
            if let Some(packet) = io.packets.lock().unwrap().pop_front() {
                break packet;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let sliced = etherparse::SlicedPacket::from_ip(&reply).expect("an IP packet");
        let Some(etherparse::TransportSlice::Tcp(tcp)) = sliced.transport else {
            panic!("not TCP: {reply:?}");
        };
        assert!(tcp.syn() && tcp.ack(), "a SYN-ACK");
        assert_eq!(
            (tcp.source_port(), tcp.destination_port()),
            (to.port(), from.port())
        );
        assert_eq!(tcp.acknowledgment_number(), 1001);
        assert!(
            tcp.options_iterator()
                .any(|o| o == Ok(etherparse::TcpOptionElement::MaximumSegmentSize(MSS))),
            "the MSS option"
        );
        shutdown.cancel();
    }
}
