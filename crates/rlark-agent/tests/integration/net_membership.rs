//! The pod network's control-plane IO against an in-process server: the membership view
//! follows the DomainPeers of the agent namespace (create, change, delete), and the path
//! totals are written to the DomainPeer's `status.paths`.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rlark_api::types::{DomainPeer, DomainPeerSpec, DomainPodInfo};
use rlark_net::membership::{LocalIdentity, Membership};
use rlark_net::metrics::{DomainMetrics, PathKind, write_path_status};
use rlark_testkit::TestServer;
use rlark_testkit::wait::{eventually, matching};
use tokio_util::sync::CancellationToken;

const NAMESPACE: &str = "rlark-a";

fn member(cluster: &str, name: &str, ip: &str) -> DomainPodInfo {
    DomainPodInfo {
        global_namespace: format!("rlark-{cluster}"),
        namespace: format!("rlark-{cluster}"),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: Some(format!("node-{cluster}")),
        ip: ip.into(),
        cluster: cluster.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn membership_follows_domain_peers_and_path_totals_are_written() -> anyhow::Result<()> {
    rlark_testkit::install_crypto_provider();
    let dir = tempfile::tempdir()?;
    let mut config = TestServer::config_for(dir.path());
    // No Domain controller: this test writes the DomainPeers itself.
    config.controllers.enabled = false;
    let server = TestServer::start_with(config).await?;
    let admin = server.client().await?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NAMESPACE.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    let peers: Api<DomainPeer> = Api::namespaced(admin.clone(), NAMESPACE);
    peers
        .create(
            &PostParams::default(),
            &DomainPeer::new(
                "d1",
                DomainPeerSpec {
                    domain: "d1".into(),
                    cidr: "10.88.0.0/16".into(),
                    prefix_len: 16,
                    pods: vec![member("a", "head-0", "10.88.0.2")],
                    pending: vec![],
                },
            ),
        )
        .await?;

    let membership = Membership::new(LocalIdentity {
        cluster: "a".into(),
        node: "node-a".into(),
    });
    let mut changes = membership.subscribe();
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    tokio::spawn(
        membership
            .clone()
            .run(admin.clone(), NAMESPACE.into(), shutdown.clone()),
    );
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let head = eventually("the first member is seen", || async {
        Ok(membership.view().member("d1", ip("10.88.0.2")).cloned())
    })
    .await?;
    assert!(head.local);
    assert!(changes.has_changed()?);
    changes.borrow_and_update();

    // A member joins: the view follows and subscribers are told.
    let mut worker = member("b", "worker-0", "10.88.0.3");
    worker.agent_address = Some("192.0.2.2:15002".into());
    peers
        .patch(
            "d1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"pods": [
                member("a", "head-0", "10.88.0.2"), worker
            ]}})),
        )
        .await?;
    let worker = eventually("the second member is seen", || async {
        Ok(membership.view().member("d1", ip("10.88.0.3")).cloned())
    })
    .await?;
    assert!(!worker.local);
    assert_eq!(worker.agent_address.as_deref(), Some("192.0.2.2:15002"));
    assert!(changes.has_changed()?);

    // The path totals reach status.paths.
    let metrics = DomainMetrics::new();
    let meter = metrics.opened("d1", "b", PathKind::Relay);
    meter.sent(100);
    meter.received(20);
    metrics.failed("d1", "b", PathKind::Direct, "timeout");
    tokio::spawn(write_path_status(
        metrics.clone(),
        admin.clone(),
        NAMESPACE.into(),
        shutdown.clone(),
    ));
    let paths = eventually("status.paths is written", || async {
        let peer = peers.get("d1").await?;
        Ok(matching(
            peer.status.map(|s| s.paths).unwrap_or_default(),
            |paths| paths.len() == 2,
        ))
    })
    .await?;
    let relay = paths.iter().find(|p| p.path == "relay").expect("relay");
    assert_eq!(
        (
            relay.peer.as_str(),
            relay.connections,
            relay.active,
            relay.bytes
        ),
        ("b", 1, 1, 120)
    );
    let direct = paths.iter().find(|p| p.path == "direct").expect("direct");
    assert_eq!((direct.connections, direct.failures), (0, 1));

    // The DomainPeer goes (no member left here): nothing is reachable.
    peers.delete("d1", &Default::default()).await?;
    eventually("the domain is gone from the view", || async {
        Ok(membership.view().domains().is_empty())
    })
    .await?;
    drop(meter);
    Ok(())
}
