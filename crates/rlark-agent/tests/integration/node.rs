//! The real agent against an in-process server: it joins, registers its Node, renews its
//! heartbeats, keeps its tunnel, serves metrics, and reuses its identity on restart.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use rlark_agent::{AgentConfig, AgentError, JoinParams};
use rlark_api::labels;
use rlark_api::types::{AgentType, Node, NodeCategory, NodePhase};
use rlark_testkit::TestServer;
use rlark_testkit::tunnel_agent::bootstrap_token;
use rlark_testkit::wait::eventually;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(30);
const HEARTBEAT: Duration = Duration::from_millis(200);

fn agent_config(server: &TestServer, cluster: &str, dir: &Path, token: &Value) -> AgentConfig {
    let mut config = AgentConfig::new(vec![server.url()], cluster, dir);
    config.node_name = Some(format!("{cluster}-host"));
    config.node_category = NodeCategory::Edge;
    config.labels.insert("zone".into(), "lab".into());
    config.heartbeat_interval = HEARTBEAT;
    config.metrics_listen = Some("127.0.0.1:0".parse().expect("address"));
    config.join = Some(JoinParams {
        token: token["token"].as_str().unwrap_or_default().to_string(),
        ca_hash: token["caHash"].as_str().unwrap_or_default().to_string(),
    });
    config
}

async fn get_json(client: &kube::Client, path: &str) -> anyhow::Result<Value> {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())?;
    client
        .request::<Value>(request)
        .await
        .with_context(|| format!("GET {path}"))
}

/// `GET path` over plain HTTP/1.0; the whole response.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        anyhow::Ok(response)
    };
    tokio::time::timeout(WAIT, exchange)
        .await
        .with_context(|| format!("GET {path} from {addr} timed out"))?
}

fn quantity_positive(list: &rlark_api::types::ResourceList, name: &str) -> bool {
    list.get(name)
        .and_then(|q| rlark_api::quantity::parse_quantity(&q.0).ok())
        .and_then(|v| v.value())
        .is_some_and(|v| v > 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_reports_its_node_heartbeats_and_keeps_its_tunnel() -> anyhow::Result<()> {
    let server = TestServer::start().await?;
    let admin = server.client().await?;
    let cluster = "edge1";
    let namespace = "rlark-edge1";
    let token = bootstrap_token(&server, cluster).await?;
    let dir = tempfile::tempdir()?;
    let config = agent_config(&server, cluster, dir.path(), &token);
    let agent = tokio::time::timeout(WAIT, rlark_agent::start(config.clone()))
        .await
        .context("agent start timed out")??;
    assert_eq!(agent.cluster_id(), cluster);
    let node_name = agent.node_name().to_string();
    assert_eq!(node_name, "edge1-host");

    // The Node: labels, agent type, Online, resources, facts.
    let nodes: Api<Node> = Api::namespaced(admin.clone(), namespace);
    let node = eventually("the node is registered Online", || async {
        let node = nodes.get_opt(&node_name).await?;
        Ok(node.filter(|n| n.status.as_ref().and_then(|s| s.phase) == Some(NodePhase::Online)))
    })
    .await?;
    let node_labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(node_labels[labels::CLUSTER_ID], cluster);
    assert_eq!(node_labels["kubernetes.io/hostname"], node_name);
    assert_eq!(node_labels[labels::NODE_CATEGORY], "edge");
    assert_eq!(node_labels[labels::AGENT_TYPE], "Raw");
    assert_eq!(node_labels["zone"], "lab");
    assert_eq!(node.spec.agent_type, AgentType::Raw);
    let status = node.status.clone().context("node status")?;
    for name in ["cpu", "memory", "ephemeral-storage"] {
        assert!(
            quantity_positive(&status.capacity, name),
            "capacity {name}: {:?}",
            status.capacity
        );
        assert!(
            quantity_positive(&status.allocatable, name),
            "allocatable {name}: {:?}",
            status.allocatable
        );
    }
    assert_eq!(status.reason.as_deref(), Some("AgentReady"));
    let info = status.node_info.clone().context("nodeInfo")?;
    assert!(
        info.kernel_version.is_some() && info.agent_version.is_some(),
        "{info:?}"
    );
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.type_ == "Hostname" && a.address == node_name),
        "{:?}",
        status.addresses
    );
    assert_eq!(agent.node().capacity, status.capacity);

    // The heartbeat: the Lease's renewTime advances, and so does status.heartbeatTime.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    let lease_name = format!("node-{node_name}");
    let renew_time = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.renew_time.clone());
    let first = eventually("the heartbeat lease exists", || async {
        Ok(leases
            .get_opt(&lease_name)
            .await?
            .and_then(|l| renew_time(&l)))
    })
    .await?;
    let lease = leases.get(&lease_name).await?;
    let spec = lease.spec.clone().context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(node_name.as_str()));
    assert!(
        spec.lease_duration_seconds.is_some_and(|s| s >= 40),
        "{spec:?}"
    );
    eventually("the lease is renewed", || async {
        let lease = leases.get(&lease_name).await?;
        Ok(renew_time(&lease).filter(|t| t.0 > first.0))
    })
    .await?;
    let first_beat = status.heartbeat_time.clone().context("heartbeatTime")?;
    eventually("status.heartbeatTime advances", || async {
        let node = nodes.get(&node_name).await?;
        Ok(node
            .status
            .and_then(|s| s.heartbeat_time)
            .filter(|t| t.0 > first_beat.0))
    })
    .await?;

    // The tunnel, listed by the hub with the node name.
    eventually("the hub lists the tunnel of the node", || async {
        let list = get_json(&admin, "/api/v1/tunnels").await?;
        let listed = list["items"].as_array().is_some_and(|items| {
            items
                .iter()
                .any(|t| t["clusterID"] == cluster && t["node"] == node_name.as_str())
        });
        Ok(listed.then_some(()))
    })
    .await?;
    assert_eq!(agent.tunnel_connected(), [server.url()]);

    // Metrics.
    let metrics_addr = agent.metrics_addr().context("metrics address")?;
    let metrics = eventually("metrics count heartbeats", || async {
        let text = http_get(metrics_addr, "/metrics").await?;
        Ok(
            (text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"))
                .then_some(text)
                .filter(|t| {
                    t.contains("rlark_agent_tunnel_connected 1")
                        && !t.contains("rlark_agent_heartbeats_total 0\n")
                }),
        )
    })
    .await?;
    assert!(
        metrics.contains("rlark_agent_heartbeat_failures_total"),
        "{metrics}"
    );

    // Restart on the same data directory: same identity, no second join (the token was
    // single-use anyway), same Node object.
    let uid = node.metadata.uid.clone();
    tokio::time::timeout(WAIT, agent.stop())
        .await
        .context("agent stop timed out")??;
    let agent = tokio::time::timeout(WAIT, rlark_agent::start(config.clone()))
        .await
        .context("agent restart timed out")??;
    let certificates = get_json(&admin, "/rlark/v1/certificates").await?;
    let agent_certs: Vec<&Value> = certificates["items"]
        .as_array()
        .context("certificate list")?
        .iter()
        .filter(|c| c["role"] == "agent")
        .collect();
    ensure!(
        agent_certs.len() == 1,
        "one agent certificate expected: {certificates}"
    );
    assert_eq!(agent_certs[0]["user"], "system:rlark:agent:edge1");
    let node = nodes.get(&node_name).await?;
    assert_eq!(
        node.metadata.uid, uid,
        "the Node was updated, not recreated"
    );
    eventually("the restarted agent's tunnel is up", || async {
        Ok((!agent.tunnel_connected().is_empty()).then_some(()))
    })
    .await?;
    tokio::time::timeout(WAIT, agent.stop())
        .await
        .context("agent stop timed out")??;

    // The server moves (restarted on another port): the agent follows its configuration,
    // API client and renewals included.
    let server = server.restart().await?;
    let admin = server.client().await?;
    let mut config = config.clone();
    config.servers = vec![server.url()];
    let agent = tokio::time::timeout(WAIT, rlark_agent::start(config.clone()))
        .await
        .context("agent start after the server moved timed out")??;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
    let before = leases
        .get(&lease_name)
        .await?
        .spec
        .and_then(|s| s.renew_time)
        .context("renewTime")?;
    eventually("the lease is renewed through the new address", || async {
        let lease = leases.get(&lease_name).await?;
        Ok(renew_time(&lease).filter(|t| t.0 > before.0))
    })
    .await?;
    let state: Value = serde_json::from_str(&std::fs::read_to_string(
        dir.path().join("identity/agent.json"),
    )?)?;
    assert_eq!(state["server"], server.url().as_str());
    tokio::time::timeout(WAIT, agent.stop())
        .await
        .context("agent stop timed out")??;

    // The credentials are the cluster's: another cluster ID on the same directory is refused.
    let mut other = config.clone();
    other.cluster_id = "edge2".into();
    let err = rlark_agent::start(other)
        .await
        .expect_err("credentials of another cluster");
    assert!(matches!(err, AgentError::ClusterMismatch { .. }), "{err}");

    server.stop().await?;
    Ok(())
}

#[tokio::test]
async fn a_bad_config_is_refused_before_any_network_use() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("agent");
    let mut config = AgentConfig::new(vec!["http://x".into()], "Bad_ID", &data);
    config.join = Some(JoinParams {
        token: "abcdef.0123456789abcdef".into(),
        ca_hash: format!("sha256:{}", "0".repeat(64)),
    });
    let shutdown = tokio_util::sync::CancellationToken::new();
    let err = tokio::time::timeout(WAIT, rlark_agent::run(config, shutdown))
        .await
        .context("refusal timed out")?
        .expect_err("refused");
    let AgentError::Config(config_err) = &err else {
        bail!("not a configuration error: {err}");
    };
    assert_eq!(config_err.fields(), ["server URL", "cluster ID"]);
    let text = err.to_string();
    assert!(text.contains("invalid server URL \"http://x\""), "{text}");
    assert!(text.contains("invalid cluster ID \"Bad_ID\""), "{text}");
    assert!(!data.exists(), "nothing written before validation");
    Ok(())
}
