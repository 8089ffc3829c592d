//! The router's decisions (table-driven), its memory of direct failures, and whole
//! connections through the accept loop with loopback stand-ins for the netns, the hub and
//! the peer agents. Real network namespaces: `tests/` of the netns module and
//! `net::tests_netns`.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::membership::LocalIdentity;
use crate::membership::tests::{me, peer, pod};
use futures::future::BoxFuture;
use rlark_tunnel::dial::DialError;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn view() -> MembershipView {
    let mut far = pod("b", "far-0", "10.88.0.4", "nb");
    far.agent_address = Some("192.0.2.2:15002".into());
    let peers = [
        peer(
            "d1",
            "10.88.0.0/16",
            vec![
                pod("a", "cli-0", "10.88.0.2", "n1"),
                pod("a", "srv-0", "10.88.0.3", "n1"),
                far,
                pod("c", "relayonly-0", "10.88.0.5", "nc"),
            ],
        ),
        peer(
            "d2",
            "10.99.0.0/16",
            vec![pod("a", "x-0", "10.99.0.2", "n1")],
        ),
    ];
    let (view, problems) = MembershipView::build(&peers, &me());
    assert!(problems.is_empty(), "{problems:?}");
    view
}

#[test]
fn route_table() {
    let view = view();
    let now = Instant::now();
    let fresh = DirectMemory::default();
    let mut failed = DirectMemory::default();
    failed.failed("192.0.2.2:15002", now);
    let direct = Route::Direct {
        address: "192.0.2.2:15002".into(),
        cluster: "b".into(),
    };
    let cases: Vec<(&str, &str, &DirectMemory, Route)> = vec![
        (
            "10.88.0.3",
            "d1",
            &fresh,
            Route::Local {
                pod: "srv-0".into(),
            },
        ),
        ("10.88.0.4", "d1", &fresh, direct.clone()),
        (
            "10.88.0.4",
            "d1",
            &failed,
            Route::Relay {
                cluster: "b".into(),
            },
        ),
        (
            "10.88.0.5",
            "d1",
            &fresh,
            Route::Relay {
                cluster: "c".into(),
            },
        ),
        ("10.88.0.77", "d1", &fresh, Route::NoMember),
        // Another domain's range is not this replica's domain: egress (the control plane
        // never lets a replica join two domains, and the other domain is not reachable).
        ("10.99.0.2", "d1", &fresh, Route::Egress),
        ("127.0.0.1", "d1", &fresh, Route::Egress),
        ("::1", "d1", &fresh, Route::Egress),
        ("1.1.1.1", "d1", &fresh, Route::Egress),
        // A domain this agent does not know (yet): nothing is a member.
        ("10.88.0.3", "unknown", &fresh, Route::Egress),
    ];
    for (to, domain, memory, expected) in cases {
        assert_eq!(
            route(&view, domain, ip(to), memory, now),
            expected,
            "{to} in {domain}"
        );
    }
    // The relay-only period ends.
    assert_eq!(
        route(
            &view,
            "d1",
            ip("10.88.0.4"),
            &failed,
            now + DIRECT_BACKOFF_INITIAL
        ),
        direct
    );
}

#[test]
fn direct_memory_backs_off_and_forgets() {
    let mut memory = DirectMemory::default();
    let t0 = Instant::now();
    let peer = "192.0.2.2:15002";
    assert!(memory.allows(peer, t0));
    assert_eq!(memory.failed(peer, t0), DIRECT_BACKOFF_INITIAL);
    assert!(!memory.allows(peer, t0 + Duration::from_secs(29)));
    // A connection that started before the failure fails too: the period stays.
    assert_eq!(
        memory.failed(peer, t0 + Duration::from_secs(1)),
        DIRECT_BACKOFF_INITIAL
    );
    assert!(memory.allows(peer, t0 + DIRECT_BACKOFF_INITIAL));
    assert!(memory.allows("other:1", t0), "per peer");
    // Failed retries double the period up to the cap.
    let mut t = t0 + DIRECT_BACKOFF_INITIAL;
    let mut periods = vec![];
    for _ in 0..6 {
        let period = memory.failed(peer, t);
        periods.push(period.as_secs());
        t += period;
    }
    assert_eq!(periods, [60, 120, 240, 300, 300, 300]);
    memory.succeeded(peer);
    assert!(memory.allows(peer, t0));
    assert_eq!(memory.failed(peer, t), DIRECT_BACKOFF_INITIAL, "reset");
}

/// A "netns" that is the test's own namespace: listeners on an ephemeral port of the
/// requested IP, connects to the same port on 127.0.0.1 whatever the address (the
/// destination's virtual IP stands for "inside its netns").
#[derive(Default)]
pub(crate) struct LoopbackNetns {
    pub(crate) listening: Mutex<Vec<SocketAddr>>,
}

impl PodNetns for LoopbackNetns {
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListener>> {
        Box::pin(async move {
            if addr.is_ipv6() {
                return Err(io::Error::other("no IPv6 here"));
            }
            let listener = TcpListener::bind((addr.ip(), 0)).await?;
            self.listening.lock().unwrap().push(listener.local_addr()?);
            Ok(listener)
        })
    }

    fn connect(&self, addr: SocketAddr, timeout: Duration) -> BoxFuture<'_, io::Result<TcpStream>> {
        Box::pin(async move {
            let target = SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port()));
            tokio::time::timeout(timeout, TcpStream::connect(target))
                .await
                .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
        })
    }
}

/// The hub: each relay stream is served by the far agent's inbound side in-process (as the
/// hub would forward it, with `source_cluster` set to the caller's cluster).
struct FakeHub {
    far: Inbound,
    caller: String,
    headers: Mutex<Vec<RelayHeader>>,
}

impl HubRelay for FakeHub {
    fn open(
        &self,
        header: RelayHeader,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DialError>> {
        self.headers.lock().unwrap().push(header.clone());
        let far = self.far.clone();
        let caller = self.caller.clone();
        Box::pin(async move {
            let (mut near, remote) = tokio::io::duplex(COPY_BUFFER);
            let forwarded = header.with_source_cluster(caller.clone());
            tokio::spawn(async move {
                far.serve(forwarded, Some(caller), Box::new(remote), PathKind::Relay)
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

/// Peer agents that fail the way the test says.
struct FailingDirect {
    calls: AtomicUsize,
    answer: Option<Status>,
}

impl DirectDialer for FailingDirect {
    fn open(
        &self,
        address: String,
        _cluster: String,
        _header: RelayHeader,
        _timeout: Duration,
    ) -> BoxFuture<'static, Result<BoxStream, DirectError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer;
        Box::pin(async move {
            Err(match answer {
                Some(status) => DirectError::Answer {
                    address,
                    status,
                    message: "said no".into(),
                },
                None => DirectError::Connect {
                    address,
                    source: io::ErrorKind::ConnectionRefused.into(),
                },
            })
        })
    }
}

pub(crate) async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Round trip `payload` through a connection to `addr`, half-closing after the write.
async fn try_round_trip(addr: SocketAddr, payload: &[u8]) -> io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect(addr).await?;
    conn.write_all(payload).await?;
    conn.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut back))
        .await
        .expect("an answer or the end in time")?;
    Ok(back)
}

async fn round_trip(addr: SocketAddr, payload: &[u8]) -> Vec<u8> {
    try_round_trip(addr, payload).await.expect("round trip")
}

struct Setup {
    router: Router,
    metrics: DomainMetrics,
    hub: Arc<FakeHub>,
    direct: Arc<FailingDirect>,
    cli: Arc<LoopbackNetns>,
}

/// Agent "a" (node n1) with replicas cli-0 and srv-0 attached, agent "b" (in-process, its
/// inbound side behind the fake hub) with far-0 attached. The original destination of
/// every connection of cli-0 is `destination`.
async fn setup(destination: SocketAddr, direct_answer: Option<Status>) -> Setup {
    let view_peers = |_: ()| {
        let mut far = pod("b", "far-0", "10.88.0.4", "nb");
        far.agent_address = Some("192.0.2.2:15002".into());
        vec![peer(
            "d1",
            "10.88.0.0/16",
            vec![
                pod("a", "cli-0", "10.88.0.2", "n1"),
                pod("a", "srv-0", "10.88.0.3", "n1"),
                far,
            ],
        )]
    };
    // Agent b.
    let b_membership = Membership::new(LocalIdentity {
        cluster: "b".into(),
        node: "nb".into(),
    });
    b_membership.replace(&view_peers(()));
    let shutdown = CancellationToken::new();
    let b_config = RouterConfig::new(Arc::new(|_: &TcpStream| {
        Err(io::Error::other("agent b routes nothing in this test"))
    }));
    let b = Router::new(
        b_membership,
        DomainMetrics::new(),
        None,
        None,
        b_config,
        shutdown.clone(),
    );
    b.attach("far-0", "d1", Arc::new(LoopbackNetns::default()))
        .await
        .unwrap();

    // Agent a.
    let membership = Membership::new(me());
    membership.replace(&view_peers(()));
    let metrics = DomainMetrics::new();
    let hub = Arc::new(FakeHub {
        far: b.inbound(),
        caller: "a".into(),
        headers: Mutex::new(vec![]),
    });
    let direct = Arc::new(FailingDirect {
        calls: AtomicUsize::new(0),
        answer: direct_answer,
    });
    let config = RouterConfig::new(Arc::new(move |_: &TcpStream| Ok(destination)));
    let router = Router::new(
        membership,
        metrics.clone(),
        Some(hub.clone()),
        Some(direct.clone()),
        config,
        shutdown,
    );
    let cli = Arc::new(LoopbackNetns::default());
    router.attach("cli-0", "d1", cli.clone()).await.unwrap();
    router
        .attach("srv-0", "d1", Arc::new(LoopbackNetns::default()))
        .await
        .unwrap();
    // b's router goes out of scope: its inbound side (held by the hub) shares the table
    // of attached replicas, which keeps far-0.
    Setup {
        router,
        metrics,
        hub,
        direct,
        cli,
    }
}

fn listener_of(netns: &LoopbackNetns) -> SocketAddr {
    netns.listening.lock().unwrap()[0]
}

#[tokio::test]
async fn local_path_end_to_end() {
    let echo = echo_server().await;
    let s = setup(SocketAddr::new(ip("10.88.0.3"), echo.port()), None).await;
    let back = round_trip(listener_of(&s.cli), b"to srv-0").await;
    assert_eq!(back, b"to srv-0");
    let stats = s.metrics.path_stats("d1");
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(
        (stats[0].path.as_str(), stats[0].peer.as_str()),
        ("local", "a")
    );
    assert_eq!(stats[0].bytes, 16);
    assert_eq!(s.direct.calls.load(Ordering::SeqCst), 0);
    assert!(s.router.detach("srv-0"));
    assert!(!s.router.detach("srv-0"));
    // A member here that is not running: the connection is closed, nothing carried.
    let back = try_round_trip(listener_of(&s.cli), b"x").await;
    assert!(back.as_ref().map_or(true, Vec::is_empty), "{back:?}");
}

#[tokio::test]
async fn direct_failure_falls_back_to_relay_and_is_remembered() {
    let echo = echo_server().await;
    let s = setup(SocketAddr::new(ip("10.88.0.4"), echo.port()), None).await;
    let back = round_trip(listener_of(&s.cli), b"via the hub").await;
    assert_eq!(back, b"via the hub");
    assert_eq!(s.direct.calls.load(Ordering::SeqCst), 1);
    assert!(!s.router.direct_allowed("192.0.2.2:15002"));
    // The next connection does not try direct again.
    let back = round_trip(listener_of(&s.cli), b"again").await;
    assert_eq!(back, b"again");
    assert_eq!(s.direct.calls.load(Ordering::SeqCst), 1);
    let headers = s.hub.headers.lock().unwrap().clone();
    assert_eq!(headers.len(), 2);
    assert_eq!(headers[0].source, ip("10.88.0.2"));
    assert_eq!(headers[0].destination, ip("10.88.0.4"));
    assert_eq!(headers[0].port, echo.port());
    assert_eq!(headers[0].protocol, Protocol::Tcp);
    assert_eq!(
        headers[0].source_cluster, None,
        "the router never asserts a cluster"
    );
    let stats = s.metrics.path_stats("d1");
    let direct = stats.iter().find(|p| p.path == "direct").unwrap();
    let relay = stats.iter().find(|p| p.path == "relay").unwrap();
    assert_eq!((direct.peer.as_str(), direct.failures), ("b", 1));
    assert_eq!((relay.connections, relay.bytes), (2, 32));
    // net check takes the same route and says so.
    let check = s
        .router
        .check("cli-0", ip("10.88.0.4"), None)
        .await
        .unwrap();
    assert_eq!(check.path, PathKind::Relay);
    let check = s
        .router
        .check("cli-0", ip("10.88.0.4"), Some(echo.port()))
        .await
        .unwrap();
    assert_eq!(check.path, PathKind::Relay);
}

#[tokio::test]
async fn a_final_direct_answer_is_not_relayed() {
    let echo = echo_server().await;
    let s = setup(
        SocketAddr::new(ip("10.88.0.4"), echo.port()),
        Some(Status::Forbidden),
    )
    .await;
    let error = s
        .router
        .check("cli-0", ip("10.88.0.4"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            RouteError::Failed {
                path: PathKind::Direct,
                status: Status::Forbidden,
                ..
            }
        ),
        "{error}"
    );
    assert!(s.hub.headers.lock().unwrap().is_empty());
    assert!(
        s.router.direct_allowed("192.0.2.2:15002"),
        "not a path failure"
    );
    // An unavailable answer (the destination stopped there) is relayed.
    let s = setup(
        SocketAddr::new(ip("10.88.0.4"), echo.port()),
        Some(Status::Unreachable),
    )
    .await;
    let check = s
        .router
        .check("cli-0", ip("10.88.0.4"), None)
        .await
        .unwrap();
    assert_eq!(check.path, PathKind::Relay);
}

#[tokio::test]
async fn checks_and_their_errors() {
    let echo = echo_server().await;
    let s = setup(SocketAddr::new(ip("10.88.0.3"), echo.port()), None).await;
    let check = s
        .router
        .check("cli-0", ip("10.88.0.3"), None)
        .await
        .unwrap();
    assert_eq!(check.path, PathKind::Local);
    let check = s
        .router
        .check("cli-0", ip("10.88.0.3"), Some(echo.port()))
        .await
        .unwrap();
    assert_eq!(check.path, PathKind::Local);
    let err = |e: RouteError| e.to_string();
    assert_eq!(
        err(s
            .router
            .check("nope-0", ip("10.88.0.3"), None)
            .await
            .unwrap_err()),
        "pod nope-0 is not attached to the pod network on this agent"
    );
    assert_eq!(
        err(s
            .router
            .check("cli-0", ip("1.2.3.4"), None)
            .await
            .unwrap_err()),
        "1.2.3.4 is not in domain d1's range 10.88.0.0/16"
    );
    assert_eq!(
        err(s
            .router
            .check("cli-0", ip("10.88.9.9"), None)
            .await
            .unwrap_err()),
        "no member of domain d1 has the address 10.88.9.9"
    );
    // A closed port on a local member: refused, from the destination's connect.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let e = s
        .router
        .check("cli-0", ip("10.88.0.3"), Some(port))
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            RouteError::Failed {
                status: Status::Refused,
                ..
            }
        ),
        "{e}"
    );
    // Datagrams to a local member are authorized, but this agent has no datagram plane.
    let e = s
        .router
        .open_flow("cli-0", Protocol::Udp, ip("10.88.0.3"), 53, 40000)
        .await
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("udp and icmp are not enabled"),
        "{e}"
    );
    // The datagram plane's headers: the source must be the replica's own address.
    let forged = RelayHeader {
        domain: "d1".into(),
        protocol: Protocol::Udp,
        source: ip("10.88.0.3"),
        destination: ip("10.88.0.4"),
        port: 53,
        source_port: 40000,
        source_cluster: None,
    };
    let e = s
        .router
        .open_header("cli-0", forged.clone())
        .await
        .err()
        .unwrap();
    assert!(matches!(e, RouteError::Spoofed { .. }), "{e}");
    let other_domain = RelayHeader {
        domain: "d2".into(),
        source: ip("10.88.0.2"),
        ..forged.clone()
    };
    let e = s
        .router
        .open_header("cli-0", other_domain)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, RouteError::Spoofed { .. }), "{e}");
    let own = RelayHeader {
        source: ip("10.88.0.2"),
        source_cluster: Some("zzz".into()),
        ..forged
    };
    // Accepted and routed (the relay's far agent has no datagram plane either).
    let e = s.router.open_header("cli-0", own).await.err().unwrap();
    assert!(
        e.to_string().contains("udp and icmp are not enabled"),
        "{e}"
    );
    assert_eq!(s.hub.headers.lock().unwrap()[0].source_cluster, None);
}

#[tokio::test]
async fn egress_dials_from_the_agent() {
    let echo = echo_server().await;
    let s = setup(echo, None).await;
    let back = round_trip(listener_of(&s.cli), b"outside").await;
    assert_eq!(back, b"outside");
    assert!(
        s.metrics.path_stats("d1").is_empty(),
        "egress is no peer path"
    );
    assert!(s.hub.headers.lock().unwrap().is_empty());
}
