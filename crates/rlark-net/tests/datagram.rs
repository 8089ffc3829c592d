//! The datagram plane (`rlark_net::datagram`) over real replica namespaces and their
//! TUN devices: two namespaces `h16dgram-*` (deleted by a Drop guard even when an assertion
//! fails), one plane each, and an opener that connects the planes directly (what the
//! router does over a local, direct or relayed stream). A UDP echo server in B answers a
//! client in A, and `ping` from A reaches B, in IPv4 and IPv6. Only these namespaces carry
//! traffic.
//!
//! Needs root, `/dev/net/tun` and `ping` (iputils-ping); elsewhere the tests say why and
//! pass without checking anything, except under `scripts/test.sh`/CI, where a missing tool
//! fails them.

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;
#[path = "support/netns.rs"]
mod netns_support;

use netns_support::Guard;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::future::BoxFuture;
use rlark_net::datagram::{BoxStream, DatagramMetrics, DatagramPlane, Limits, Opener, PlaneConfig};
use rlark_net::netns::{DEFAULT_REDIRECT_PORT, Mode, NetnsSpec, ReplicaNetns};
use rlark_tunnel::relay::RelayHeader;

const LIMIT: Duration = Duration::from_secs(10);

fn supported() -> bool {
    if !netns_support::supported(false) {
        return false;
    }
    let ping = std::process::Command::new("ping").arg("-V").output();
    if !ping.is_ok_and(|o| o.status.success()) {
        missing_tool::skip_or_fail("ping (package iputils-ping) is not installed");
        return false;
    }
    true
}

/// Namespaces of this file: `h16dgram-<suffix>-<pid>`.
const PREFIX: &str = "h16dgram";

/// Connects to the plane holding the destination and serves the stream there with
/// `serve_inbound` (the router's job after authorizing).
#[derive(Default)]
struct DirectOpener {
    peers: Mutex<Vec<(Vec<IpAddr>, DatagramPlane)>>,
}

impl Opener for DirectOpener {
    fn open(&self, header: RelayHeader) -> BoxFuture<'_, io::Result<BoxStream>> {
        let peer = self
            .peers
            .lock()
            .unwrap()
            .iter()
            .find(|(addresses, _)| addresses.contains(&header.destination))
            .map(|(_, plane)| plane.clone());
        Box::pin(async move {
            let peer = peer.ok_or_else(|| io::Error::other("no such member"))?;
            let (near, far) = tokio::io::duplex(256 * 1024);
            tokio::spawn(async move { peer.serve_inbound(header, far).await });
            Ok(Box::new(near) as BoxStream)
        })
    }
}

struct Member {
    _guard: Guard,
    netns: ReplicaNetns,
    v4: IpAddr,
    v6: IpAddr,
}

async fn member(suffix: &str, host: u8) -> Result<Member> {
    let guard = Guard::new(PREFIX, suffix);
    let v4: IpAddr = format!("10.89.0.{host}").parse()?;
    let v6: IpAddr = format!("fd00:89::{host}").parse()?;
    let netns = ReplicaNetns::create(&NetnsSpec {
        name: guard.0.clone(),
        addresses: vec![format!("{v4}/16").parse()?, format!("{v6}/64").parse()?],
        // No nft needed: UDP and ICMP reach the TUN in both modes.
        mode: Mode::Tun,
        redirect_port: DEFAULT_REDIRECT_PORT,
        loopback_passthrough: vec![],
    })
    .await
    .context("create the member's namespace")?;
    Ok(Member {
        _guard: guard,
        netns,
        v4,
        v6,
    })
}

fn plane(m: &Member, opener: Arc<DirectOpener>, metrics: &DatagramMetrics) -> DatagramPlane {
    DatagramPlane::start(
        PlaneConfig {
            domain: "ray".into(),
            cidrs: vec![
                "10.89.0.0/16".parse().unwrap(),
                "fd00:89::/64".parse().unwrap(),
            ],
            addresses: vec![m.v4, m.v6],
            limits: Limits::default(),
        },
        m.netns.tun().clone(),
        opener,
        metrics.clone(),
    )
}

/// Runs `f` on a fresh thread inside the namespace at `path` (a "task" there).
fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::thread::JoinHandle<Result<T>> {
    let file = std::fs::File::open(path).expect("the namespace file");
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).context("setns")?;
        f()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_and_ping_between_two_replica_namespaces() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let metrics = DatagramMetrics::default();
    let (a, b) = (member("a", 2).await?, member("b", 9).await?);
    let (a_opener, b_opener) = (
        Arc::new(DirectOpener::default()),
        Arc::new(DirectOpener::default()),
    );
    let a_plane = plane(&a, a_opener.clone(), &metrics);
    let b_plane = plane(&b, b_opener.clone(), &metrics);
    a_opener
        .peers
        .lock()
        .unwrap()
        .push((vec![b.v4, b.v6], b_plane.clone()));
    b_opener
        .peers
        .lock()
        .unwrap()
        .push((vec![a.v4, a.v6], a_plane.clone()));

    for server_ip in [b.v4, b.v6] {
        // A UDP echo server in B (one datagram), a client in A.
        let bind = SocketAddr::new(server_ip, 7007);
        let server = in_netns(b.netns.path(), move || {
            let socket = UdpSocket::bind(bind).context("bind the echo server")?;
            socket.set_read_timeout(Some(LIMIT))?;
            let mut buf = [0u8; 1500];
            let (n, from) = socket
                .recv_from(&mut buf)
                .context("the server's datagram")?;
            socket.send_to(&buf[..n], from)?;
            Ok(from)
        });
        // Give the server a moment to bind before the client sends (UDP has no connect).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let client_from = a.v4;
        let client = in_netns(a.netns.path(), move || {
            let unspecified: SocketAddr = if bind.is_ipv6() {
                "[::]:0".parse()?
            } else {
                "0.0.0.0:0".parse()?
            };
            let socket = UdpSocket::bind(unspecified)?;
            socket.set_read_timeout(Some(LIMIT))?;
            socket.send_to(b"hello over the domain", bind)?;
            let mut buf = [0u8; 1500];
            let (n, from) = socket.recv_from(&mut buf).context("the echo")?;
            if from != bind || &buf[..n] != b"hello over the domain" {
                bail!("unexpected echo {:?} from {from}", &buf[..n]);
            }
            Ok(socket.local_addr()?.port())
        });
        let client_port = tokio::task::spawn_blocking(move || client.join().unwrap()).await??;
        let seen_from = tokio::task::spawn_blocking(move || server.join().unwrap()).await??;
        // B saw A's virtual IP and port: the source is preserved end to end.
        assert_eq!(seen_from.port(), client_port);
        if bind.is_ipv4() {
            assert_eq!(seen_from.ip(), client_from);
        } else {
            assert_eq!(seen_from.ip(), a.v6);
        }
    }

    for target in [b.v4, b.v6] {
        let name = a._guard.0.clone();
        let output = tokio::task::spawn_blocking(move || {
            std::process::Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &name,
                    "ping",
                    "-c1",
                    "-W5",
                    &target.to_string(),
                ])
                .output()
        })
        .await??;
        assert!(
            output.status.success(),
            "ping {target} from A: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    a_plane.shutdown();
    b_plane.shutdown();
    a.netns.delete().await?;
    b.netns.delete().await?;
    Ok(())
}

/// UDP to a non-domain address leaves through a socket in the agent's namespace (what makes
/// DNS work for a task in a domain). Here the agent's namespace is one more namespace of
/// the test's, with the "DNS server" on a non-loopback address of its own: the whole agent
/// side (replica namespace creation, the plane, its egress sockets) runs on a runtime whose
/// threads live in it.
#[test]
fn udp_to_a_non_domain_address_leaves_through_the_agents_namespace() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let agent = Guard::new(PREFIX, "agent");
    let ip = |args: &[&str]| -> Result<()> {
        let status = std::process::Command::new("ip").args(args).status()?;
        if !status.success() {
            bail!("ip {args:?} failed");
        }
        Ok(())
    };
    ip(&["netns", "add", &agent.0])?;
    ip(&["-n", &agent.0, "link", "set", "lo", "up"])?;
    ip(&["-n", &agent.0, "addr", "add", "10.99.0.1/32", "dev", "lo"])?;
    let agent_path = Path::new("/run/netns").join(&agent.0);
    in_netns(&agent_path, || {
        // Threads inherit the creating thread's network namespace: the runtime's workers
        // (and every socket the plane makes) are in the agent's namespace.
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
            .block_on(egress_from_a_replica())
    })
    .join()
    .expect("the agent thread")
}

async fn egress_from_a_replica() -> Result<()> {
    let server = tokio::net::UdpSocket::bind("10.99.0.1:5353").await?;
    let a = member("egress", 2).await?;
    let metrics = DatagramMetrics::default();
    let a_plane = plane(&a, Arc::new(DirectOpener::default()), &metrics);
    let client = in_netns(a.netns.path(), || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(LIMIT))?;
        socket.send_to(b"A? head-0.ray", "10.99.0.1:5353")?;
        let mut buf = [0u8; 512];
        let (n, from) = socket.recv_from(&mut buf).context("the answer")?;
        Ok((buf[..n].to_vec(), from))
    });
    let mut buf = [0u8; 512];
    let (n, from) = tokio::time::timeout(LIMIT, server.recv_from(&mut buf)).await??;
    assert_eq!(&buf[..n], b"A? head-0.ray");
    // The query comes from the agent's socket, not from the replica's virtual IP.
    assert_ne!(from.ip(), a.v4);
    server.send_to(b"10.89.0.9", from).await?;
    let (answer, answered_by) =
        tokio::task::spawn_blocking(move || client.join().unwrap()).await??;
    assert_eq!(answer, b"10.89.0.9");
    assert_eq!(answered_by, "10.99.0.1:5353".parse::<SocketAddr>()?);
    a_plane.shutdown();
    a.netns.delete().await?;
    Ok(())
}
