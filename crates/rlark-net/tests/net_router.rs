//! The router on real replica network namespaces (`h16router-*`, deleted by a Drop guard):
//! a "task" in one namespace connects to the virtual IPs of two others; nftables redirects
//! each connection to the router, which reads the original destination and carries it
//! locally (a member on this agent, connected from inside its namespace) or through a
//! stand-in hub to another agent's destination side (which authorizes it and connects
//! from inside the destination's namespace); UDP and ping take the same routes through the
//! datagram planes. Only these namespaces carry traffic.
//!
//! Needs root, `/dev/net/tun` and `nft`; elsewhere the test says why and passes without
//! checking anything, except under `scripts/test.sh`/CI, where a missing tool fails it.

#[path = "../../../tests/support/missing_tool.rs"]
mod missing_tool;
#[path = "support/netns.rs"]
mod netns_support;

use netns_support::Guard;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::future::BoxFuture;
use rlark_api::types::{DomainPeer, DomainPeerSpec, DomainPodInfo};
use rlark_net::datagram::{DatagramMetrics, DatagramPlane, Limits, PlaneConfig};
use rlark_net::inbound::{DatagramPlanes, Inbound};
use rlark_net::membership::{LocalIdentity, Membership};
use rlark_net::metrics::{DomainMetrics, PathKind};
use rlark_net::netns::{DEFAULT_REDIRECT_PORT, Mode, NetnsSpec, ReplicaNetns};
use rlark_net::router::{BoxStream, HubRelay, ReplicaOpener, Router, RouterConfig};
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::{self, Status};
use rlark_tunnel::relay::RelayHeader;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_secs(10);

fn supported() -> bool {
    netns_support::supported(true)
}

/// Namespaces of this file: `h16router-<suffix>-<pid>`.
const PREFIX: &str = "h16router";

async fn replica_netns(guard: &Guard, ip: &str) -> Result<Arc<ReplicaNetns>> {
    Ok(Arc::new(
        ReplicaNetns::create(&NetnsSpec {
            name: guard.0.clone(),
            addresses: vec![format!("{ip}/16").parse()?],
            mode: Mode::Kernel,
            redirect_port: DEFAULT_REDIRECT_PORT,
            loopback_passthrough: vec![],
        })
        .await?,
    ))
}

fn member(cluster: &str, node: &str, name: &str, ip: &str) -> DomainPodInfo {
    DomainPodInfo {
        global_namespace: format!("rlark-{cluster}"),
        namespace: format!("rlark-{cluster}"),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: Some(node.into()),
        ip: ip.into(),
        cluster: cluster.into(),
        ..Default::default()
    }
}

fn domain_peer() -> DomainPeer {
    DomainPeer::new(
        "d1",
        DomainPeerSpec {
            domain: "d1".into(),
            cidr: "10.77.0.0/16".into(),
            prefix_len: 16,
            pods: vec![
                member("a", "na", "cli-0", "10.77.0.2"),
                member("a", "na", "srv-0", "10.77.0.3"),
                member("b", "nb", "far-0", "10.77.0.4"),
            ],
            pending: vec![],
        },
    )
}

/// The hub: forwards each relay stream to agent b's destination side in-process, with
/// the caller's cluster set as the hub does.
struct Hub {
    b: Inbound,
    seen: Mutex<Vec<RelayHeader>>,
}

impl HubRelay for Hub {
    fn open(
        &self,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DialError>> {
        self.seen.lock().unwrap().push(header.clone());
        let b = self.b.clone();
        Box::pin(async move {
            let (mut near, far) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                b.serve(
                    header.with_source_cluster("a"),
                    Some("a".into()),
                    Box::new(far),
                    PathKind::Relay,
                )
                .await;
            });
            let response = tokio::time::timeout(timeout, header::read_response(&mut near))
                .await
                .map_err(|_| DialError::new(Status::Timeout, "no answer"))?
                .map_err(|e| DialError::new(Status::Internal, e.to_string()))?;
            if response.status != Status::Ok {
                return Err(DialError::new(response.status, response.message));
            }
            Ok(Box::new(near) as BoxStream)
        })
    }
}

/// A one-line "HTTP" server on `ip:8080` inside `netns`: answers `<name> got <request>`.
async fn serve_in(netns: &ReplicaNetns, ip: &str, name: &'static str) -> Result<()> {
    let listener: TcpListener = netns.listen(SocketAddr::new(ip.parse()?, 8080)).await?;
    tokio::spawn(async move {
        while let Ok((mut conn, peer)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let _ = conn.read_to_end(&mut request).await;
                let answer = format!(
                    "{name} got {} from {}",
                    String::from_utf8_lossy(&request),
                    peer.ip()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(())
}

/// What a task in `netns` gets back for `request` sent to `to:8080`.
async fn ask(netns: &ReplicaNetns, to: &str, request: &str) -> Result<String> {
    let mut conn = netns
        .connect(SocketAddr::new(to.parse()?, 8080), LIMIT)
        .await?;
    conn.write_all(request.as_bytes()).await?;
    conn.shutdown().await?;
    let mut answer = Vec::new();
    tokio::time::timeout(LIMIT, conn.read_to_end(&mut answer)).await??;
    Ok(String::from_utf8(answer)?)
}

#[tokio::test]
async fn local_and_relayed_connections_between_namespaces() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let (g_cli, g_srv, g_far) = (
        Guard::new(PREFIX, "cli"),
        Guard::new(PREFIX, "srv"),
        Guard::new(PREFIX, "far"),
    );
    let cli = replica_netns(&g_cli, "10.77.0.2").await?;
    let srv = replica_netns(&g_srv, "10.77.0.3").await?;
    let far = replica_netns(&g_far, "10.77.0.4").await?;
    serve_in(&srv, "10.77.0.3", "srv-0").await?;
    serve_in(&far, "10.77.0.4", "far-0").await?;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let destination = || RouterConfig::new(Arc::new(rlark_net::netns::original_destination));

    // Agent b runs far-0.
    let b_membership = Membership::new(LocalIdentity {
        cluster: "b".into(),
        node: "nb".into(),
    });
    b_membership.replace(&[domain_peer()]);
    let b = Router::new(
        b_membership,
        DomainMetrics::new(),
        None,
        None,
        destination(),
        shutdown.clone(),
    );
    b.attach("far-0", "d1", far.clone()).await?;

    // Agent a runs cli-0 and srv-0.
    let membership = Membership::new(LocalIdentity {
        cluster: "a".into(),
        node: "na".into(),
    });
    membership.replace(&[domain_peer()]);
    let metrics = DomainMetrics::new();
    let hub = Arc::new(Hub {
        b: b.inbound(),
        seen: Mutex::new(vec![]),
    });
    let a = Router::new(
        membership,
        metrics.clone(),
        Some(hub.clone()),
        None,
        destination(),
        shutdown.clone(),
    );
    a.attach("cli-0", "d1", cli.clone()).await?;
    a.attach("srv-0", "d1", srv.clone()).await?;

    // Local: the server sees the connection coming from its own netns (the router
    // connected from inside it).
    assert_eq!(
        ask(&cli, "10.77.0.3", "GET /local").await?,
        "srv-0 got GET /local from 10.77.0.3"
    );
    // Relayed to agent b.
    assert_eq!(
        ask(&cli, "10.77.0.4", "GET /far").await?,
        "far-0 got GET /far from 10.77.0.4"
    );
    let seen = hub.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        (seen[0].source, seen[0].destination, seen[0].port),
        (ip("10.77.0.2"), ip("10.77.0.4"), 8080)
    );
    assert_ne!(seen[0].source_port, 0, "the task's own port");

    // An address of the domain that no member holds: closed, nothing carried.
    let nobody = ask(&cli, "10.77.0.99", "GET /").await;
    assert!(nobody.as_deref().map_or(true, str::is_empty), "{nobody:?}");

    // net check along the same routes.
    let check = a.check("cli-0", ip("10.77.0.4"), Some(8080)).await?;
    assert_eq!(check.path, PathKind::Relay);
    let check = a.check("cli-0", ip("10.77.0.3"), None).await?;
    assert_eq!(check.path, PathKind::Local);

    let stats = metrics.path_stats("d1");
    let path = |p: &str| stats.iter().find(|s| s.path == p).cloned();
    let local = path("local").expect("local stats");
    assert_eq!((local.peer.as_str(), local.connections), ("a", 1));
    assert!(local.bytes > 0);
    let relay = path("relay").expect("relay stats");
    assert_eq!((relay.peer.as_str(), relay.connections), ("b", 1));

    // Detached replicas are neither routed nor served.
    assert!(a.detach("cli-0") && a.detach("srv-0") && b.detach("far-0"));
    drop((a, b));
    for netns in [cli, srv, far] {
        if let Ok(netns) = Arc::try_unwrap(netns) {
            netns.delete().await?;
        }
    }
    Ok(())
}

/// Runs `f` on a fresh thread inside the namespace at `path` (a "task" there).
fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::thread::JoinHandle<Result<T>> {
    let file = std::fs::File::open(path).expect("the namespace file");
    std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)?;
        f()
    })
}

/// A replica's datagram plane whose flows take `router`'s routes.
fn plane(router: &Router, pod: &str, netns: &ReplicaNetns, ip: &str) -> DatagramPlane {
    DatagramPlane::start(
        PlaneConfig {
            domain: "d1".into(),
            cidrs: vec!["10.77.0.0/16".parse().unwrap()],
            addresses: vec![ip.parse().unwrap()],
            limits: Limits::default(),
        },
        netns.tun().clone(),
        Arc::new(ReplicaOpener::new(router.clone(), pod)),
        DatagramMetrics::default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_and_ping_relayed_between_agents() -> Result<()> {
    if !supported() {
        return Ok(());
    }
    let (g_cli, g_far) = (Guard::new(PREFIX, "ucli"), Guard::new(PREFIX, "ufar"));
    let cli = replica_netns(&g_cli, "10.77.0.2").await?;
    let far = replica_netns(&g_far, "10.77.0.4").await?;
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let config = || RouterConfig::new(Arc::new(rlark_net::netns::original_destination));
    let router_of = |cluster: &str, node: &str, hub: Option<Arc<dyn HubRelay>>| {
        let membership = Membership::new(LocalIdentity {
            cluster: cluster.into(),
            node: node.into(),
        });
        membership.replace(&[domain_peer()]);
        Router::new(
            membership,
            DomainMetrics::new(),
            hub,
            None,
            config(),
            shutdown.clone(),
        )
    };
    let b = router_of("b", "nb", None);
    b.attach("far-0", "d1", far.clone()).await?;
    let hub = Arc::new(Hub {
        b: b.inbound(),
        seen: Mutex::new(vec![]),
    });
    let a = router_of("a", "na", Some(hub.clone()));
    a.attach("cli-0", "d1", cli.clone()).await?;
    let (a_planes, b_planes) = (DatagramPlanes::default(), DatagramPlanes::default());
    a_planes.insert("cli-0", plane(&a, "cli-0", &cli, "10.77.0.2"));
    b_planes.insert("far-0", plane(&b, "far-0", &far, "10.77.0.4"));
    a.inbound().set_datagrams(Arc::new(a_planes));
    b.inbound().set_datagrams(Arc::new(b_planes));

    // A UDP echo server in far-0 (one datagram), a client in cli-0.
    let bind: SocketAddr = "10.77.0.4:7007".parse()?;
    let server = in_netns(far.path(), move || {
        let socket = std::net::UdpSocket::bind(bind)?;
        socket.set_read_timeout(Some(LIMIT))?;
        let mut buf = [0u8; 1500];
        let (n, from) = socket.recv_from(&mut buf)?;
        socket.send_to(&buf[..n], from)?;
        Ok(from)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = in_netns(cli.path(), move || {
        let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(LIMIT))?;
        socket.send_to(b"udp via the hub", bind)?;
        let mut buf = [0u8; 1500];
        let (n, from) = socket.recv_from(&mut buf)?;
        anyhow::ensure!(
            from == bind && &buf[..n] == b"udp via the hub",
            "unexpected echo {:?} from {from}",
            &buf[..n]
        );
        Ok(socket.local_addr()?.port())
    });
    let port = tokio::task::spawn_blocking(move || client.join().unwrap()).await??;
    let seen = tokio::task::spawn_blocking(move || server.join().unwrap()).await??;
    assert_eq!(seen, SocketAddr::new("10.77.0.2".parse()?, port));
    let udp = hub.seen.lock().unwrap()[0].clone();
    assert_eq!(
        (udp.protocol, udp.source_port, udp.port),
        (rlark_tunnel::relay::Protocol::Udp, port, 7007)
    );

    // ping: the echo request crosses the relay, far-0's kernel answers.
    let name = g_cli.0.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("ip")
            .args(["netns", "exec", &name, "ping", "-c1", "-W5", "10.77.0.4"])
            .output()
    })
    .await??;
    assert!(
        output.status.success(),
        "ping: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(a.detach("cli-0") && b.detach("far-0"));
    Ok(())
}
