//! Two in-process agents on loopback with certificates from a real installation CA:
//! a flow over the direct path, and the refusals (wrong CA, wrong cluster, a forged
//! source).

use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use rlark_tunnel::relay::Protocol;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;
use crate::membership::tests::{peer, pod};
use crate::membership::{LocalIdentity, Membership};
use crate::metrics::DomainMetrics;
use crate::revocations::Revocations;
use crate::router::{PodNetns, Router, RouterConfig};

fn ca() -> (tempfile::TempDir, rlark_pki::Ca) {
    let dir = tempfile::tempdir().unwrap();
    let ca = rlark_pki::Ca::load_or_create(dir.path()).unwrap();
    (dir, ca)
}

/// An endpoint that knows of no revocation.
fn endpoint(tls: DirectTls) -> DirectEndpoint {
    DirectEndpoint::new(tls, Revocations::known(Vec::new()))
}

fn tls_for(ca: &rlark_pki::Ca, trust: &rlark_pki::Ca, user: &str) -> DirectTls {
    let issued = ca
        .issue_client(user, &[AGENT_GROUP.to_string()], Duration::from_secs(3600))
        .unwrap();
    DirectTls::new(&issued.cert_pem, &issued.key_pem, &trust.bundle_pem()).unwrap()
}

/// A netns stand-in: the test's own namespace, connecting to 127.0.0.1 at the port asked.
struct Here;

impl PodNetns for Here {
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListener>> {
        Box::pin(async move {
            if addr.is_ipv6() {
                return Err(io::Error::other("no IPv6 here"));
            }
            TcpListener::bind((addr.ip(), 0)).await
        })
    }

    fn connect(
        &self,
        addr: SocketAddr,
        _timeout: Duration,
    ) -> BoxFuture<'_, io::Result<TcpStream>> {
        Box::pin(TcpStream::connect(SocketAddr::from((
            std::net::Ipv4Addr::LOCALHOST,
            addr.port(),
        ))))
    }
}

/// Agent of cluster "b" serving member srv-0 (10.88.0.3) on a direct listener; returns
/// its address and its metrics.
async fn agent_b(tls: DirectTls) -> (SocketAddr, DomainMetrics) {
    agent_b_checking(tls, Revocations::known(Vec::new())).await
}

/// [`agent_b`], refusing the peers `revocations` names.
async fn agent_b_checking(tls: DirectTls, revocations: Revocations) -> (SocketAddr, DomainMetrics) {
    let membership = Membership::new(LocalIdentity {
        cluster: "b".into(),
        node: "nb".into(),
    });
    membership.replace(&[peer(
        "d1",
        "10.88.0.0/16",
        vec![
            pod("a", "cli-0", "10.88.0.2", "na"),
            pod("b", "srv-0", "10.88.0.3", "nb"),
            pod("c", "evil-0", "10.88.0.9", "nc"),
        ],
    )]);
    let metrics = DomainMetrics::new();
    let router = Router::new(
        membership,
        metrics.clone(),
        None,
        None,
        RouterConfig::new(Arc::new(|_: &TcpStream| Err(io::Error::other("unused")))),
        CancellationToken::new(),
    );
    router.attach("srv-0", "d1", Arc::new(Here)).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(DirectEndpoint::new(tls, revocations).serve(
        listener,
        router.inbound(),
        CancellationToken::new(),
    ));
    (addr, metrics)
}

async fn echo_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    port
}

fn header(source: &str, port: u16) -> RelayHeader {
    RelayHeader {
        domain: "d1".into(),
        protocol: Protocol::Tcp,
        source: source.parse::<IpAddr>().unwrap(),
        destination: "10.88.0.3".parse().unwrap(),
        port,
        source_port: 40000,
        source_cluster: None,
    }
}

const T: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_flow_over_mutual_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (addr, metrics) = agent_b(tls_for(&ca, &ca, "system:rlark:agent:b")).await;
    let a = endpoint(tls_for(&ca, &ca, "system:rlark:agent:a"));
    let port = echo_port().await;
    let mut stream = a
        .connect(&addr.to_string(), "b", &header("10.88.0.2", port), T)
        .await
        .unwrap();
    stream.write_all(b"direct hello").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(T, stream.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, b"direct hello");

    // The certificate says "a": a source of cluster c is refused, whatever the header says.
    let refused = a
        .connect(&addr.to_string(), "b", &header("10.88.0.9", port), T)
        .await
        .err()
        .unwrap();
    match &refused {
        DirectError::Answer {
            status: Status::Forbidden,
            message,
            ..
        } => assert_eq!(
            message,
            "source 10.88.0.9 is rlark-c/evil-0 of cluster c, not of the calling cluster a"
        ),
        other => panic!("{other}"),
    }
    assert!(!refused.falls_back());
    // Asserting a source cluster on the direct path is a bad request.
    let mut forged = header("10.88.0.2", port);
    forged.source_cluster = Some("b".into());
    let e = a
        .connect(&addr.to_string(), "b", &forged, T)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            e,
            DirectError::Answer {
                status: Status::BadRequest,
                ..
            }
        ),
        "{e}"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &{
        let mut r = prometheus_client::registry::Registry::with_prefix("rlark");
        metrics.register(&mut r);
        r
    })
    .unwrap();
    assert!(
        text.contains(
            r#"rlark_domain_refused_total{domain="d1",reason="source-cluster-mismatch"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn the_wrong_ca_or_cluster_is_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (_dir2, other_ca) = ca_pair();
    let (addr, _) = agent_b(tls_for(&ca, &ca, "system:rlark:agent:b")).await;
    let port = echo_port().await;
    let h = header("10.88.0.2", port);

    // The client meant cluster c: b's certificate does not prove that.
    let a = endpoint(tls_for(&ca, &ca, "system:rlark:agent:a"));
    let e = a
        .connect(&addr.to_string(), "c", &h, T)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, DirectError::Tls { reason, .. } if reason.contains("of cluster b, not c")),
        "{e}"
    );
    assert!(e.falls_back());

    // A client certificate of another CA: the server refuses the handshake.
    let stranger = endpoint(tls_for(&other_ca, &ca, "system:rlark:agent:a"));
    let e = stranger
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(e, DirectError::Tls { .. } | DirectError::Other { .. }),
        "{e}"
    );

    // A client that trusts another CA does not accept b.
    let wary = endpoint(tls_for(&ca, &other_ca, "system:rlark:agent:a"));
    let e = wary
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, DirectError::Tls { .. }), "{e}");

    // A certificate of the right CA that is not an agent's.
    let admin = endpoint(tls_for(&ca, &ca, "admin"));
    let e = admin
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(
        !matches!(
            e,
            DirectError::Answer {
                status: Status::Ok,
                ..
            }
        ),
        "{e}"
    );

    // Nothing listening.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = closed.local_addr().unwrap();
    drop(closed);
    let e = a
        .connect(&gone.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(matches!(e, DirectError::Connect { .. }), "{e}");
    assert!(e.falls_back());
}

fn ca_pair() -> (tempfile::TempDir, rlark_pki::Ca) {
    ca()
}

#[test]
fn cluster_of_agent_certificates() {
    let (_dir, ca) = ca();
    let der = |user: &str, groups: &[&str]| {
        let issued = ca
            .issue_client(
                user,
                &groups.iter().map(|g| g.to_string()).collect::<Vec<_>>(),
                Duration::from_secs(60),
            )
            .unwrap();
        CertificateDer::from_pem_slice(issued.cert_pem.as_bytes())
            .unwrap()
            .to_vec()
    };
    assert_eq!(
        cluster_of(&der("system:rlark:agent:gpu-1", &[AGENT_GROUP])),
        Ok("gpu-1".into())
    );
    assert!(
        cluster_of(&der("system:rlark:agent:gpu-1", &["rlark:viewers"]))
            .unwrap_err()
            .contains("not in group rlark:agents")
    );
    assert!(
        cluster_of(&der("admin", &[AGENT_GROUP]))
            .unwrap_err()
            .contains("is not an agent's")
    );
    assert!(
        cluster_of(&der("system:rlark:agent:Bad_ID", &[AGENT_GROUP]))
            .unwrap_err()
            .contains("cluster ID")
    );
}

#[test]
fn the_advertised_address() {
    use crate::direct::advertised_address;
    let listen = |s: &str| s.parse::<SocketAddr>().unwrap();
    assert_eq!(
        advertised_address(listen("0.0.0.0:15002"), Some("agent-b.example:15002")),
        Some("agent-b.example:15002".into())
    );
    assert_eq!(advertised_address(listen("0.0.0.0:15002"), None), None);
    assert_eq!(advertised_address(listen("[::]:15002"), None), None);
    assert_eq!(
        advertised_address(listen("192.0.2.7:15002"), None),
        Some("192.0.2.7:15002".into())
    );
}

/// Agent a's router with the real direct path: cli-0 here, srv-0 at agent b's `address`.
async fn router_a(tls: DirectTls, address: &str) -> Router {
    let membership = Membership::new(LocalIdentity {
        cluster: "a".into(),
        node: "na".into(),
    });
    let mut srv = pod("b", "srv-0", "10.88.0.3", "nb");
    srv.agent_address = Some(address.into());
    membership.replace(&[peer(
        "d1",
        "10.88.0.0/16",
        vec![pod("a", "cli-0", "10.88.0.2", "na"), srv],
    )]);
    let router = Router::new(
        membership,
        DomainMetrics::new(),
        None,
        Some(Arc::new(endpoint(tls))),
        RouterConfig::new(Arc::new(|_: &TcpStream| Err(io::Error::other("unused")))),
        CancellationToken::new(),
    );
    router.attach("cli-0", "d1", Arc::new(Here)).await.unwrap();
    router
}

#[tokio::test]
async fn the_router_takes_the_direct_path_and_remembers_its_failure() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (addr, _) = agent_b(tls_for(&ca, &ca, "system:rlark:agent:b")).await;
    let port = echo_port().await;
    let a = router_a(tls_for(&ca, &ca, "system:rlark:agent:a"), &addr.to_string()).await;
    let ip: IpAddr = "10.88.0.3".parse().unwrap();
    let check = a.check("cli-0", ip, Some(port)).await.unwrap();
    assert_eq!(check.path, PathKind::Direct);
    let check = a.check("cli-0", ip, None).await.unwrap();
    assert_eq!(check.path, PathKind::Direct);
    assert!(a.direct_allowed(&addr.to_string()));

    // b's agent gone: the direct attempt fails, the relay is tried (none here), and b is
    // relay-only for a while.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    let a = router_a(tls_for(&ca, &ca, "system:rlark:agent:a"), &gone).await;
    let e = a.check("cli-0", ip, None).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("relay through the hub is not available"),
        "{e}"
    );
    assert!(!a.direct_allowed(&gone));
}

/// An agent's TLS for the direct path and the serial of its certificate.
fn agent_tls(ca: &rlark_pki::Ca, cluster: &str) -> (DirectTls, String) {
    let issued = ca
        .issue_client(
            &format!("{AGENT_USER_PREFIX}{cluster}"),
            &[AGENT_GROUP.to_string()],
            Duration::from_secs(3600),
        )
        .unwrap();
    let serial = rlark_pki::CertInfo::from_pem(&issued.cert_pem)
        .unwrap()
        .serial;
    let tls = DirectTls::new(&issued.cert_pem, &issued.key_pem, &ca.bundle_pem()).unwrap();
    (tls, serial)
}

/// The text exposition of `revocations`' metrics, under the agent's prefix.
fn revocation_metrics(revocations: &Revocations) -> String {
    let mut registry = prometheus_client::registry::Registry::with_prefix("rlark_agent");
    revocations.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

#[tokio::test]
async fn a_revoked_client_is_refused_unanswered() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (a_tls, a_serial) = agent_tls(&ca, "a");
    let b_revocations = Revocations::known([a_serial.clone()]);
    let (addr, _) = agent_b_checking(agent_tls(&ca, "b").0, b_revocations.clone()).await;
    let port = echo_port().await;
    let h = header("10.88.0.2", port);

    let revoked = endpoint(a_tls);
    let e = revoked
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    // No answer at all: the TLS session ends before the header is answered.
    assert!(
        matches!(e, DirectError::Tls { .. } | DirectError::Other { .. }),
        "{e}"
    );
    assert!(e.falls_back());
    assert!(
        revocation_metrics(&b_revocations).contains(
            r#"rlark_agent_domain_direct_refused_total{direction="inbound",reason="revoked"} 1"#
        ),
        "{}",
        revocation_metrics(&b_revocations)
    );

    // The refusal is of that certificate: cluster a's next one is served.
    let renewed = endpoint(agent_tls(&ca, "a").0);
    let mut stream = renewed
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .unwrap();
    stream.write_all(b"renewed").await.unwrap();
    stream.shutdown().await.unwrap();
    let mut back = Vec::new();
    tokio::time::timeout(T, stream.read_to_end(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, b"renewed");
}

#[tokio::test]
async fn a_revoked_server_is_refused_and_the_flow_relayed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (b_tls, b_serial) = agent_tls(&ca, "b");
    let (addr, _) = agent_b(b_tls).await;
    let port = echo_port().await;
    let h = header("10.88.0.2", port);

    let a_revocations = Revocations::known([b_serial.clone()]);
    let a = DirectEndpoint::new(agent_tls(&ca, "a").0, a_revocations.clone());
    let e = a
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, DirectError::Tls { reason, .. }
            if reason.contains(&format!("certificate {b_serial} is revoked"))),
        "{e}"
    );
    assert!(e.falls_back());
    assert!(
        revocation_metrics(&a_revocations).contains(
            r#"rlark_agent_domain_direct_refused_total{direction="outbound",reason="revoked"} 1"#
        ),
        "{}",
        revocation_metrics(&a_revocations)
    );

    // Before the set is known the dialer does not even connect.
    let unknown = Revocations::unknown();
    let a = DirectEndpoint::new(agent_tls(&ca, "a").0, unknown.clone());
    let e = a
        .connect(&addr.to_string(), "b", &h, T)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, DirectError::Other { reason, .. } if reason.contains("not known yet")),
        "{e}"
    );
    assert!(e.falls_back());
    // The router then relays (no hub here, so the relay's absence is what it reports).
    let mut srv = pod("b", "srv-0", "10.88.0.3", "nb");
    srv.agent_address = Some(addr.to_string());
    let membership = Membership::new(LocalIdentity {
        cluster: "a".into(),
        node: "na".into(),
    });
    membership.replace(&[peer(
        "d1",
        "10.88.0.0/16",
        vec![pod("a", "cli-0", "10.88.0.2", "na"), srv],
    )]);
    let router = Router::new(
        membership,
        DomainMetrics::new(),
        None,
        Some(Arc::new(DirectEndpoint::new(
            agent_tls(&ca, "a").0,
            Revocations::known([b_serial]),
        ))),
        RouterConfig::new(Arc::new(|_: &TcpStream| Err(io::Error::other("unused")))),
        CancellationToken::new(),
    );
    router.attach("cli-0", "d1", Arc::new(Here)).await.unwrap();
    let e = router
        .check("cli-0", "10.88.0.3".parse().unwrap(), None)
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("relay through the hub is not available"),
        "{e}"
    );
}

#[tokio::test]
async fn the_listener_accepts_only_once_revocations_are_known() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let b_revocations = Revocations::unknown();
    let (addr, _) = agent_b_checking(agent_tls(&ca, "b").0, b_revocations.clone()).await;
    let port = echo_port().await;
    let a = endpoint(agent_tls(&ca, "a").0);
    let e = a
        .connect(
            &addr.to_string(),
            "b",
            &header("10.88.0.2", port),
            Duration::from_millis(500),
        )
        .await
        .err()
        .unwrap();
    assert!(matches!(e, DirectError::Timeout { .. }), "{e}");
    b_revocations.replace(Vec::new());
    a.connect(&addr.to_string(), "b", &header("10.88.0.2", port), T)
        .await
        .unwrap();
}

/// Write `probe` and read until the end: what came back, or the error that ended it.
async fn echo_after(stream: &mut BoxStream, probe: &[u8]) -> Result<Vec<u8>, io::Error> {
    stream.write_all(probe).await?;
    let mut back = Vec::new();
    tokio::time::timeout(T, stream.read_to_end(&mut back))
        .await
        .map_err(|_| io::Error::other("no end within the hang guard"))??;
    Ok(back)
}

#[tokio::test]
async fn live_connections_are_cut_when_the_peer_is_revoked() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (_dir, ca) = ca();
    let (a_tls, a_serial) = agent_tls(&ca, "a");
    let (b_tls, b_serial) = agent_tls(&ca, "b");
    let b_revocations = Revocations::known(Vec::new());
    let (addr, _) = agent_b_checking(b_tls, b_revocations.clone()).await;
    let port = echo_port().await;
    let a_revocations = Revocations::known(Vec::new());
    let a = DirectEndpoint::new(a_tls, a_revocations.clone());
    let (address, h) = (addr.to_string(), header("10.88.0.2", port));
    let open = || a.connect(&address, "b", &h, T);

    // b learns that a's certificate is revoked: b cuts a's open connection; what a sends
    // after that is not echoed.
    let mut first = open().await.unwrap();
    let mut hello = [0u8; 5];
    first.write_all(b"hello").await.unwrap();
    first.read_exact(&mut hello).await.unwrap();
    b_revocations.replace([a_serial.clone()]);
    match echo_after(&mut first, b"after").await {
        Ok(back) => assert!(back.is_empty(), "echoed after the cut: {back:?}"),
        Err(e) => assert_ne!(e.to_string(), "no end within the hang guard"),
    }
    assert!(
        revocation_metrics(&b_revocations).contains(
            r#"rlark_agent_domain_direct_refused_total{direction="inbound",reason="revoked-while-open"} 1"#
        ),
        "{}",
        revocation_metrics(&b_revocations)
    );

    // a learns that b's certificate is revoked: a cuts its own end.
    b_revocations.replace(Vec::new());
    let mut second = open().await.unwrap();
    second.write_all(b"hello").await.unwrap();
    second.read_exact(&mut hello).await.unwrap();
    a_revocations.replace([b_serial]);
    let e = echo_after(&mut second, b"after").await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted, "{e}");
    assert!(
        revocation_metrics(&a_revocations).contains(
            r#"rlark_agent_domain_direct_refused_total{direction="outbound",reason="revoked-while-open"} 1"#
        ),
        "{}",
        revocation_metrics(&a_revocations)
    );
}
