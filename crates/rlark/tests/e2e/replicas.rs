//! Three `rlark server` processes sharing one PostgreSQL database (a throwaway cluster on
//! loopback), each with its own data directory, as three replicas of one installation:
//!
//! - they share one CA, taken from the store (sealed with `--ca-secret-file`), so a client
//!   certificate issued by one is accepted by all; a replica without the secret, with a
//!   wrong one, or with another installation's CA is refused;
//! - a kube-rs watch on replica 1 sees writes made on replica 3 (latency printed, p50/p99
//!   over 1,000 writes: a figure for docs/benchmarks.md, not an assertion);
//! - revoking a user on replica 2 cuts its token off on all three;
//! - killing (-9) the replica that holds the controllers' Lease hands it to another, while a
//!   Workflow's first step runs on an agent connected to all three: the agent keeps its
//!   tunnels to the survivors and its task, and the Workflow succeeds with one Task per step;
//! - restarting PostgreSQL under writes loses no acknowledged write, and every replica
//!   recovers by itself.
//!
//! Without the PostgreSQL binaries the test skips, or fails under `CI=true`.

use crate::missing_tool;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use rlark_testkit::ServerProcess;
use rlark_testkit::postgres::PgCluster;

const WRITES: usize = 1_000;

fn leases() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
        "leases",
    )
}

fn lease(name: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"holderIdentity": "test", "leaseDurationSeconds": 15}
    }))?)
}

fn lease_api(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), "default", &leases())
}

fn spawn_replica(binary: &Path, dir: &Path, url: &str, secret: &Path) -> Result<ServerProcess> {
    ServerProcess::spawn_with_args(
        binary,
        dir,
        &[
            "--store",
            url,
            "--ca-secret-file",
            secret.to_str().context("secret path")?,
        ],
    )
}

/// A client of `replica` that authenticates with a bearer token instead of the admin
/// certificate.
async fn token_client(replica: &ServerProcess, token: &str) -> Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(replica.kubeconfig_path())?;
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

async fn status_of(client: &kube::Client, path: &str) -> Result<http::StatusCode> {
    let request = http::Request::get(path).body(kube::client::Body::empty())?;
    Ok(client.send(request).await?.status())
}

async fn post_json(
    client: &kube::Client,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body)?)?;
    Ok(client.request::<serde_json::Value>(request).await?)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Wait until `check` holds, at most `timeout`; how long it took.
async fn eventually<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let started = Instant::now();
    loop {
        if check().await? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_share_one_postgres() -> Result<()> {
    let Some(bin) = rlark_testkit::postgres::find_bin() else {
        missing_tool::skip_or_fail(
            "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
        );
        return Ok(());
    };
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_rlark"));
    let cluster = PgCluster::start(&bin);
    cluster.create_database("rlark");
    let url = cluster.url("rlark");
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("ca-secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef-test-secret\n")?;

    // Sequentially, so the first one creates the CA and the others take it.
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let data = dir.path().join(format!("replica-{i}"));
        replicas.push(spawn_replica(&binary, &data, &url, &secret)?);
    }
    let ca = |i: usize| std::fs::read_to_string(replicas[i].data_dir().join("pki/ca.crt"));
    assert_eq!(ca(0)?, ca(1)?, "replica 2 took the store's CA");
    assert_eq!(ca(0)?, ca(2)?, "replica 3 took the store's CA");
    // A fourth without the secret, with a wrong one, or with another installation's CA, is
    // refused with a message naming the problem.
    let wrong = dir.path().join("wrong-secret");
    std::fs::write(&wrong, "another secret, long enough to be accepted....")?;
    let stranger = dir.path().join("stranger");
    std::fs::create_dir_all(stranger.join("pki"))?;
    rlark_pki::Ca::load_or_create(&stranger.join("pki"))?;
    for (data, secret, expected) in [
        (
            "replica-no-secret",
            None,
            "give the secret it was sealed with",
        ),
        (
            "replica-wrong-secret",
            Some(&wrong),
            "not the one it was sealed with",
        ),
        (
            "stranger",
            Some(&secret),
            "belongs to a different installation",
        ),
    ] {
        let mut command = std::process::Command::new(&binary);
        command
            .arg("server")
            .arg("--data-dir")
            .arg(dir.path().join(data))
            .args(["--listen", "127.0.0.1:0", "--store", &url]);
        if let Some(secret) = secret {
            command.arg("--ca-secret-file").arg(secret);
        }
        let output = command.output()?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{data}: must be refused");
        assert!(stderr.contains(expected), "{data}: {stderr}");
    }
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(replica.client().await?);
    }
    // Replica 1's admin certificate (issued by replica 1) works on replica 3.
    let cross = {
        let kubeconfig = kube::config::Kubeconfig::read_from(replicas[0].kubeconfig_path())?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        config.cluster_url = format!("https://{}", replicas[2].addr()?).parse()?;
        kube::Client::try_from(config)?
    };
    assert_eq!(status_of(&cross, "/readyz").await?, http::StatusCode::OK);

    // A watch on replica 1 sees writes made on replica 3.
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut stream = lease_api(&clients[0])
        .watch(&WatchParams::default().timeout(290), "0")
        .await?
        .boxed();
    let recorder = {
        let seen = Arc::clone(&seen);
        tokio::spawn(async move {
            while let Some(event) = stream.try_next().await? {
                if let WatchEvent::Added(object) = event
                    && let Some(name) = object.metadata.name
                    && name.starts_with("w-")
                {
                    seen.lock().expect("lock").insert(name, Instant::now());
                }
            }
            anyhow::Ok(())
        })
    };
    let writer = lease_api(&clients[2]);
    let mut acked = Vec::with_capacity(WRITES);
    for i in 0..WRITES {
        let name = format!("w-{i}");
        writer
            .create(&PostParams::default(), &lease(&name)?)
            .await?;
        acked.push((name, Instant::now()));
    }
    eventually("replica 1 saw every write", Duration::from_secs(30), || {
        let done = seen.lock().expect("lock").len() == WRITES;
        async move { Ok(done) }
    })
    .await?;
    recorder.abort();
    let mut latencies: Vec<Duration> = {
        let seen = seen.lock().expect("lock");
        acked
            .iter()
            .map(|(name, at)| seen[name].saturating_duration_since(*at))
            .collect()
    };
    latencies.sort();
    eprintln!(
        "cross-replica watch: {WRITES} creates on replica 3 seen by a watch on replica 1: \
         p50 {:?}, p99 {:?}, max {:?} (from the create's acknowledgement)",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );

    // Revoking a user on replica 2 cuts its token off on all three.
    let token = post_json(
        &clients[0],
        "/rlark/v1/tokens",
        serde_json::json!({"kind": "user", "user": "alice", "role": "viewer"}),
    )
    .await?;
    let token = token["token"].as_str().context("token")?.to_string();
    let mut alice = Vec::new();
    for replica in &replicas {
        let client = token_client(replica, &token).await?;
        assert_eq!(
            status_of(&client, "/api/v1/namespaces/default/pods").await?,
            http::StatusCode::OK,
            "alice before the revocation"
        );
        alice.push(client);
    }
    post_json(
        &clients[1],
        "/rlark/v1/revocations",
        serde_json::json!({"user": "alice", "reason": "test"}),
    )
    .await?;
    let revoked_at = Instant::now();
    for (i, client) in alice.iter().enumerate() {
        eventually("alice refused", Duration::from_secs(10), || async {
            Ok(status_of(client, "/api/v1/namespaces/default/pods").await?
                == http::StatusCode::UNAUTHORIZED)
        })
        .await?;
        eprintln!(
            "revocation on replica 2 in force on replica {} after {:?}",
            i + 1,
            revoked_at.elapsed()
        );
    }

    // An agent connected to all three, and a Workflow whose first step runs while the
    // controllers' replica dies.
    let agent_dir = tempfile::tempdir()?;
    let join = post_json(
        &clients[0],
        "/rlark/v1/tokens",
        serde_json::json!({"kind": "bootstrap", "ttlSeconds": 600, "clusterID": "edge"}),
    )
    .await?;
    let urls = (0..3)
        .map(|i| Ok(format!("https://{}", replicas[i].addr()?)))
        .collect::<Result<Vec<_>>>()?;
    let mut agent_config = rlark_agent::AgentConfig::new(urls, "edge", agent_dir.path());
    agent_config.node_name = Some("edge-0".into());
    agent_config.heartbeat_interval = Duration::from_millis(500);
    agent_config.stop_tasks_on_exit = true;
    agent_config.supervisor = vec![binary.clone().into(), "supervise".into()];
    agent_config.join = Some(rlark_agent::JoinParams {
        token: join["token"].as_str().context("token")?.to_string(),
        ca_hash: join["caHash"].as_str().context("caHash")?.to_string(),
    });
    let agent = tokio::time::timeout(Duration::from_secs(60), rlark_agent::start(agent_config))
        .await
        .context("agent start timed out")??;
    eventually(
        "the agent is connected to all three",
        Duration::from_secs(60),
        || {
            let connected = agent.tunnel_connected().len();
            async move { Ok(connected == 3) }
        },
    )
    .await?;
    // Not in the agent's data directory: replicas do not see it (docs/security.md).
    let shared = rlark_testkit::shared_tempdir()?;
    let marker = shared.path().join("step-one-may-finish");
    let workflow: rlark_api::types::Workflow = serde_json::from_value(serde_json::json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"name": "flight"},
        "spec": {"jobTemplates": [
            {"name": "one", "spec": {"tasks": [{"name": "main", "agentType": "Raw", "role": "Actor",
                "raw": {"entrypoint": ["sh", "-c",
                    format!("while [ ! -e {} ]; do sleep 0.1; done", marker.display())]}}]}},
            {"name": "two", "dependencies": ["one"], "spec": {"tasks": [{"name": "main",
                "agentType": "Raw", "role": "Actor", "raw": {"entrypoint": ["true"]}}]}},
        ]},
    }))?;
    let workflows: Api<rlark_api::types::Workflow> = Api::all(clients[0].clone());
    workflows.create(&PostParams::default(), &workflow).await?;
    let running = |client: kube::Client| async move {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::all(client);
        let running = pods
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .any(|pod| {
                pod.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("flight-one"))
                    && pod.status.and_then(|s| s.phase).as_deref() == Some("Running")
            });
        anyhow::Ok(running)
    };
    eventually("step one runs", Duration::from_secs(60), || {
        running(clients[0].clone())
    })
    .await?;

    // Kill -9 the replica holding the controllers' Lease: another takes it.
    let controller_lease = |client: &kube::Client| {
        let api = lease_api(client);
        async move {
            let lease = api.get("rlark-controller-manager").await?;
            Ok::<_, anyhow::Error>(
                lease.data["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        }
    };
    let holder = controller_lease(&clients[0]).await?;
    let leader = (0..3)
        .find(|&i| {
            std::fs::read_to_string(replicas[i].log_path())
                .is_ok_and(|log| log.contains("became leader") && log.contains(&holder))
        })
        .with_context(|| format!("no replica logged leadership as {holder}"))?;
    eprintln!("controllers run on replica {} ({holder})", leader + 1);
    let killed_at = Instant::now();
    replicas[leader].kill_9()?;
    let survivor = (0..3).find(|&i| i != leader).context("a survivor")?;
    let took = eventually(
        "another replica took the Lease",
        Duration::from_secs(60),
        || {
            let client = clients[survivor].clone();
            let holder = holder.clone();
            async move {
                let now = controller_lease(&client).await?;
                Ok(!now.is_empty() && now != holder)
            }
        },
    )
    .await?;
    let new_holder = controller_lease(&clients[survivor]).await?;
    assert!(
        (0..3).filter(|&i| i != leader).any(|i| {
            std::fs::read_to_string(replicas[i].log_path())
                .is_ok_and(|log| log.contains(&new_holder))
        }),
        "the new holder {new_holder} is one of the survivors"
    );
    eprintln!(
        "controllers' Lease taken over by {new_holder} {took:?} after the check began ({:?} after the kill)",
        killed_at.elapsed()
    );

    // The agent kept its tunnels to the survivors and its running task; the Workflow
    // finishes under the new controllers with one Task per step.
    assert_eq!(
        agent.tunnel_connected().len(),
        2,
        "tunnels to the two survivors"
    );
    assert!(
        running(clients[survivor].clone()).await?,
        "step one still runs"
    );
    std::fs::write(&marker, "")?;
    let workflows: Api<rlark_api::types::Workflow> = Api::all(clients[survivor].clone());
    let succeeded = eventually("the Workflow succeeds", Duration::from_secs(120), || {
        let workflows = workflows.clone();
        async move {
            let phase = workflows
                .get("flight")
                .await?
                .status
                .and_then(|s| s.phase)
                .map(|p| format!("{p:?}"));
            Ok(phase.as_deref() == Some("Succeeded"))
        }
    })
    .await;
    if let Err(error) = succeeded {
        dump_state(&clients[survivor]).await;
        eprintln!(
            "replica {} log tail:\n{}",
            survivor + 1,
            replicas[survivor].log_tail()
        );
        return Err(error);
    }
    let tasks: Api<rlark_api::types::Task> = Api::all(clients[survivor].clone());
    let mut names: Vec<String> = tasks
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|task| task.metadata.name)
        .filter(|name| name.starts_with("flight-"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["flight-one-main", "flight-two-main"],
        "one Task per step"
    );
    tokio::time::timeout(Duration::from_secs(60), agent.stop())
        .await
        .context("agent stop timed out")??;

    // PostgreSQL restarted under writes from both survivors: nothing acknowledged is lost.
    let live: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let writers: Vec<_> = live
        .iter()
        .map(|&i| {
            let api = lease_api(&clients[i]);
            tokio::spawn(async move {
                let mut acknowledged = Vec::new();
                let mut refused = 0usize;
                for n in 0..400 {
                    let name = format!("pg-{i}-{n}");
                    match api.create(&PostParams::default(), &lease(&name)?).await {
                        Ok(_) => acknowledged.push(name),
                        Err(_) => refused += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                anyhow::Ok((acknowledged, refused))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.pause();
    tokio::time::sleep(Duration::from_millis(500)).await;
    cluster.resume();
    let mut acknowledged = Vec::new();
    for writer in writers {
        let (names, refused) = writer.await??;
        eprintln!(
            "{} writes acknowledged, {refused} refused during the restart",
            names.len()
        );
        acknowledged.extend(names);
    }
    for &i in &live {
        eventually("replica ready again", Duration::from_secs(30), || {
            let client = clients[i].clone();
            async move { Ok(status_of(&client, "/readyz").await? == http::StatusCode::OK) }
        })
        .await?;
        let api = lease_api(&clients[i]);
        eventually(
            "every acknowledged write on every replica",
            Duration::from_secs(30),
            || {
                let api = api.clone();
                let acknowledged = acknowledged.clone();
                async move {
                    let names: std::collections::HashSet<String> = api
                        .list(&Default::default())
                        .await?
                        .items
                        .into_iter()
                        .filter_map(|lease| lease.metadata.name)
                        .collect();
                    Ok(acknowledged.iter().all(|name| names.contains(name)))
                }
            },
        )
        .await?;
    }
    // Writes go through after the restart.
    for &i in &live {
        lease_api(&clients[i])
            .create(&PostParams::default(), &lease(&format!("after-{i}"))?)
            .await?;
    }
    for replica in replicas {
        let _ = replica.terminate();
    }
    Ok(())
}

/// Print Workflows, Jobs, Tasks and Pods (a failed wait's context).
async fn dump_state(client: &kube::Client) {
    for (group, version, kind, plural) in [
        ("rlinf.io", "v1alpha1", "Workflow", "workflows"),
        ("rlinf.io", "v1alpha1", "Job", "jobs"),
        ("rlinf.io", "v1alpha1", "Task", "tasks"),
        ("", "v1", "Pod", "pods"),
    ] {
        let resource =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match api.list(&Default::default()).await {
            Ok(list) => {
                for item in list.items {
                    eprintln!(
                        "{kind} {}/{}: {}",
                        item.metadata.namespace.unwrap_or_default(),
                        item.metadata.name.unwrap_or_default(),
                        item.data.get("status").cloned().unwrap_or_default()
                    );
                }
            }
            Err(error) => eprintln!("list {plural}: {error}"),
        }
    }
}

/// How many agent sessions `server` holds.
async fn tunnels(server: &rlark_testkit::TestServer) -> Result<usize> {
    let client = server.client().await?;
    let request = http::Request::get("/api/v1/tunnels").body(Vec::new())?;
    let list: serde_json::Value = client.request(request).await?;
    Ok(list["items"].as_array().map_or(0, Vec::len))
}

/// `rlark port-forward` through replica A reaches an agent tunnelled only to replica B: A has
/// no session, asks its peers over mTLS with its peer certificate, and B carries the stream
/// through its own session. A non-peer (even an admin) may not open peer streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_through_a_replica_without_the_agents_tunnel() -> Result<()> {
    port_forward_through_a_peer(false).await
}

/// The same with both replicas behind one load-balanced advertise URL (the Helm chart's
/// StatefulSet): the URL they publish is the same and unresolvable here, so the stream can
/// only reach B at its own peer URL (`tunnel.peerURL`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn port_forward_through_a_peer_behind_one_balanced_url() -> Result<()> {
    port_forward_through_a_peer(true).await
}

async fn port_forward_through_a_peer(behind_balancer: bool) -> Result<()> {
    use rlark_testkit::TestServer;
    use rlark_testkit::tunnel_agent::TunnelAgent;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

    let Some(bin) = rlark_testkit::postgres::find_bin() else {
        missing_tool::skip_or_fail(
            "PostgreSQL server binaries (initdb, pg_ctl; Debian package postgresql) are not installed",
        );
        return Ok(());
    };
    let cluster = PgCluster::start(&bin);
    cluster.create_database("rlark");
    let dir = tempfile::tempdir()?;
    let secret = dir.path().join("ca-secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef-test-secret\n")?;
    let config = |name: &str| -> Result<_> {
        let mut config = TestServer::config_for(&dir.path().join(name));
        config.store_url = Some(cluster.url("rlark"));
        config.ca_secret_file = Some(secret.clone());
        if behind_balancer {
            // A port of its own known before start, for its peer URL.
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            config.listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            config.tunnel.advertise_url = Some("https://rlark-balancer.invalid:443".into());
            config.tunnel.peer_url = Some(format!("https://127.0.0.1:{port}"));
        }
        Ok(config)
    };
    let a = TestServer::start_with(config("a")?).await?;
    let b = TestServer::start_with(config("b")?).await?;
    if behind_balancer {
        // Both publish the balancer, each under a record of its own (B's reaches A through
        // the database: wait for it).
        let client = a.client().await?;
        let mut list = serde_json::Value::Null;
        for _ in 0..100 {
            list = client
                .request(http::Request::get("/rlark/v1/replicas").body(Vec::new())?)
                .await?;
            if list["items"].as_array().is_some_and(|i| i.len() >= 2) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let items = list["items"].as_array().context("items")?;
        assert_eq!(items.len(), 2, "{list}");
        assert!(
            items
                .iter()
                .all(|i| i["url"] == "https://rlark-balancer.invalid:443"),
            "{list}"
        );
        assert!(
            items
                .iter()
                .any(|i| i["peerUrl"] == format!("https://127.0.0.1:{}", b.addr().port())),
            "{list}"
        );
    }
    // Connected to B only (this test agent does not discover replicas).
    let agent = TunnelAgent::start(&[&b], "edge").await?;
    assert_eq!(tunnels(&a).await?, 0, "A holds no session of the agent");
    assert_eq!(tunnels(&b).await?, 1);

    // An echo target on the agent's host.
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let echo_port = echo.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut reader, mut writer) = socket.split();
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            });
        }
    });

    let kubeconfig = a.kubeconfig_path().to_string_lossy().into_owned();
    let mut forward = tokio::process::Command::new(env!("CARGO_BIN_EXE_rlark"))
        .args(["port-forward", "edge", &format!("0:127.0.0.1:{echo_port}")])
        .args(["--kubeconfig", &kubeconfig])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("spawn rlark port-forward")?;
    let stdout = forward.stdout.take().context("no stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let local: std::net::SocketAddr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if let Some(rest) = line.strip_prefix("Forwarding from ") {
                let addr = rest.split_whitespace().next().unwrap_or_default();
                return addr.parse().with_context(|| format!("address in {line:?}"));
            }
        }
        bail!("rlark port-forward exited without printing its address")
    })
    .await
    .context("rlark port-forward did not start")??;
    let mut socket = tokio::net::TcpStream::connect(local).await?;
    let payload = b"through replica A to the agent on replica B";
    socket.write_all(payload).await?;
    let mut back = vec![0u8; payload.len()];
    tokio::time::timeout(Duration::from_secs(30), socket.read_exact(&mut back))
        .await
        .context("echo timed out")??;
    assert_eq!(&back, payload);
    drop(socket);
    forward.kill().await?;

    // Peer streams are for replicas only.
    let admin = a.client().await?;
    let request = http::Request::post("/rlark/v1/peer/streams")
        .header("upgrade", "rlark-peer-stream/1")
        .header("connection", "Upgrade")
        .header("x-rlark-peer-cluster", "edge")
        .header("x-rlark-peer-kind", "agent-api")
        .body(kube::client::Body::empty())?;
    let response = admin.send(request).await?;
    assert_eq!(response.status(), http::StatusCode::FORBIDDEN);

    agent.stop().await;
    a.stop().await?;
    b.stop().await?;
    Ok(())
}
