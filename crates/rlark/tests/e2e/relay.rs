//! The hub's pod-network relay end to end (issue 16): real agents of three clusters keep
//! tunnel sessions to an in-process server; Domains with hand-written
//! `status.ipAllocations` (no Domain controller runs here) say who holds which address.
//! Agent A opens relay streams towards the hub; the hub authorizes them by the session's
//! certificate identity and forwards them to B's agent, whose relay handler echoes what it
//! got together with the `source_cluster` the hub stamped on the header. The forged cases
//! are refused at the hub, and every outcome shows in `/metrics`.

use crate::raw_api;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use rlark_testkit::TestServer;
use rlark_testkit::tunnel_agent::TunnelAgent;
use rlark_testkit::tunnel_agent::rlark_tunnel::agent::RelayHandler;
use rlark_testkit::tunnel_agent::rlark_tunnel::dial::DialError;
use rlark_testkit::tunnel_agent::rlark_tunnel::header::{Status, StreamResponse};
use rlark_testkit::tunnel_agent::rlark_tunnel::mux::MuxStream;
use rlark_testkit::tunnel_agent::rlark_tunnel::relay::{Protocol, RelayHeader};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Hang guard of every test.
const TEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a test waits at most for something that should happen soon.
const DEADLINE: Duration = Duration::from_secs(15);
/// Deadline of one relay open.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

async fn bounded(test: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .with_context(|| format!("test did not finish within {TEST_TIMEOUT:?}"))?
}

/// The destination side: answers `ok` and echoes `<cluster>:<source_cluster>:<bytes>`, so
/// the test sees which agent served the flow and what caller identity the hub asserted.
struct Echo {
    cluster: &'static str,
}

impl RelayHandler for Echo {
    fn serve(&self, header: RelayHeader, mut stream: MuxStream) {
        let cluster = self.cluster;
        tokio::spawn(async move {
            let ok = StreamResponse::ok().encode();
            if stream.write_all(&ok).await.is_err() {
                return;
            }
            let mut got = Vec::new();
            if stream.read_to_end(&mut got).await.is_err() {
                return;
            }
            let caller = header.source_cluster.unwrap_or_default();
            let mut answer = format!("{cluster}:{caller}:").into_bytes();
            answer.extend_from_slice(&got);
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
        });
    }
}

async fn agent(server: &TestServer, cluster: &'static str) -> Result<TunnelAgent> {
    TunnelAgent::start_with(&[server], cluster, |config| {
        config.agent.relay = Some(Arc::new(Echo { cluster }));
    })
    .await
}

/// Creates Domain `name` with `cidr` and sets its `status.ipAllocations`.
async fn domain(admin: &kube::Client, name: &str, cidr: &str, allocations: Value) -> Result<()> {
    let body = json!({
        "apiVersion": "rlinf.io/v1alpha1",
        "kind": "Domain",
        "metadata": {"name": name},
        "spec": {"cidr": cidr},
    });
    raw_api::call_ok(
        admin,
        "POST",
        "/apis/rlinf.io/v1alpha1/domains",
        Some(&body),
    )
    .await?;
    raw_api::call_ok(
        admin,
        "PATCH",
        &format!("/apis/rlinf.io/v1alpha1/domains/{name}/status"),
        Some(&json!({"status": {"ipAllocations": allocations}})),
    )
    .await?;
    Ok(())
}

fn member(ip: &str, cluster: &str, pod: &str) -> Value {
    json!({"ip": ip, "job": "j", "task": "j-t", "index": 0, "cluster": cluster,
           "pod": format!("rlark-{cluster}/{pod}")})
}

fn tcp(domain: &str, source: &str, destination: &str) -> RelayHeader {
    RelayHeader {
        domain: domain.into(),
        protocol: Protocol::Tcp,
        source: source.parse().expect("ip"),
        destination: destination.parse().expect("ip"),
        port: 8080,
        source_port: 40000,
        source_cluster: None,
    }
}

/// Opens a relay from `agent`, sends `payload`, half-closes and reads the answer.
async fn relay(agent: &TunnelAgent, header: &RelayHeader, payload: &[u8]) -> Result<Vec<u8>> {
    let mut stream = agent
        .handle()
        .hub()
        .open_relay(header, OPEN_TIMEOUT)
        .await
        .with_context(|| format!("relay {header}"))?;
    stream.write_all(payload).await?;
    stream.shutdown().await?;
    let mut back = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut back))
        .await
        .context("relay answer in time")??;
    Ok(back)
}

/// The refusal of a relay that must not be established.
async fn refused(agent: &TunnelAgent, header: &RelayHeader) -> Result<DialError> {
    match agent.handle().hub().open_relay(header, OPEN_TIMEOUT).await {
        Ok(_) => bail!("relay {header} was established; it must be refused"),
        Err(error) => Ok(error),
    }
}

/// Waits until the hub's index has caught up with the Domains: a relay that must work does.
async fn until_relayed(agent: &TunnelAgent, header: &RelayHeader) -> Result<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match relay(agent, header, b"ping").await {
            Ok(back) => return Ok(back),
            Err(error) if tokio::time::Instant::now() >= deadline => {
                return Err(error.context("the hub never forwarded the relay"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

fn metric(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_relays_members_and_refuses_forgeries() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        domain(
            &admin,
            "ray",
            "10.8.0.0/24",
            json!([
                member("10.8.0.2", "a", "j-w-0"),
                member("10.8.0.3", "b", "j-h-0"),
                member("10.8.0.4", "c", "j-c-0"),
                member("10.8.0.5", "d", "j-d-0"),
                {"ip": "10.8.0.6", "cluster": "a", "pod": "rlark-a/j-w-1",
                 "releasedAt": "2026-12-01T00:00:00Z"},
                member("fd00:8::2", "a", "v6-0"),
                member("fd00:8::3", "b", "v6-0"),
            ]),
        )
        .await?;
        domain(
            &admin,
            "other",
            "10.9.0.0/24",
            json!([
                member("10.9.0.2", "b", "o-0"),
                member("10.9.0.3", "a", "o-1")
            ]),
        )
        .await?;
        let a = agent(&server, "a").await?;
        let b = agent(&server, "b").await?;
        let c = agent(&server, "c").await?;

        // A's member reaches B's member; B's agent serves it and sees caller "a".
        let back = until_relayed(&a, &tcp("ray", "10.8.0.2", "10.8.0.3")).await?;
        assert_eq!(back, b"b:a:ping");
        // Bulk, both ways, with half-close: 1 MiB out, echoed back behind the prefix.
        let payload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        let back = relay(&a, &tcp("ray", "10.8.0.2", "10.8.0.3"), &payload).await?;
        ensure!(back.len() == payload.len() + 4, "{} bytes back", back.len());
        assert!(back[4..] == payload[..], "the payload came back intact");
        // And back from B to A; and IPv6.
        assert_eq!(
            relay(&b, &tcp("ray", "10.8.0.3", "10.8.0.2"), b"x").await?,
            b"a:b:x"
        );
        assert_eq!(
            relay(&a, &tcp("ray", "fd00:8::2", "fd00:8::3"), b"6").await?,
            b"b:a:6"
        );

        // Forged: C names A's member as its source.
        let error = refused(&c, &tcp("ray", "10.8.0.2", "10.8.0.3")).await?;
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(
            error.message.contains("source 10.8.0.2")
                && error.message.contains("cluster \"a\"")
                && error.message.contains("cluster \"c\""),
            "{error}"
        );
        // Forged: an agent asserts a source cluster itself.
        let error = refused(
            &c,
            &tcp("ray", "10.8.0.4", "10.8.0.3").with_source_cluster("a"),
        )
        .await?;
        assert_eq!(error.status, Status::BadRequest, "{error}");
        assert!(error.message.contains("source_cluster"), "{error}");
        // A released source, and one never allocated.
        let error = refused(&a, &tcp("ray", "10.8.0.6", "10.8.0.3")).await?;
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(error.message.contains("released"), "{error}");
        let error = refused(&a, &tcp("ray", "10.8.0.99", "10.8.0.3")).await?;
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(error.message.contains("not allocated"), "{error}");
        // A destination in another Domain.
        let error = refused(&a, &tcp("ray", "10.8.0.2", "10.9.0.2")).await?;
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(
            error.message.contains("not a member of domain \"ray\""),
            "{error}"
        );
        // Nobody holds the destination.
        let error = refused(&a, &tcp("ray", "10.8.0.2", "10.8.0.77")).await?;
        assert_eq!(error.status, Status::Unreachable, "{error}");
        // The destination's cluster has no agent connected.
        let error = refused(&a, &tcp("ray", "10.8.0.2", "10.8.0.5")).await?;
        assert_eq!(error.status, Status::NoSuchAgent, "{error}");
        assert!(error.message.contains("\"d\""), "{error}");

        // A release seen through the watch: the next relay from that source is refused.
        raw_api::call_ok(
            &admin,
            "PATCH",
            "/apis/rlinf.io/v1alpha1/domains/ray/status",
            Some(&json!({"status": {"ipAllocations": [
                {"ip": "10.8.0.2", "cluster": "a", "pod": "rlark-a/j-w-0",
                 "releasedAt": "2026-12-01T00:00:00Z"},
                member("10.8.0.3", "b", "j-h-0"),
            ]}})),
        )
        .await?;
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            match a
                .handle()
                .hub()
                .open_relay(&tcp("ray", "10.8.0.2", "10.8.0.3"), OPEN_TIMEOUT)
                .await
            {
                Err(error) if error.status == Status::Forbidden => break,
                _ if tokio::time::Instant::now() >= deadline => {
                    bail!("the release was not seen by the hub within {DEADLINE:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }

        // Every outcome is counted by domain.
        let metrics = raw_api::send(&admin, "GET", "/metrics", &[], Vec::new()).await?;
        let text = &metrics.text;
        let ok = metric(
            text,
            "rlark_tunnel_relay_streams_total{domain=\"ray\",outcome=\"ok\"} ",
        )
        .with_context(|| format!("no ok relays in:\n{text}"))?;
        assert!(ok >= 4.0, "{ok} ok relays");
        for outcome in ["forbidden", "bad-request", "unreachable", "no-such-agent"] {
            let line = format!(
                "rlark_tunnel_relay_streams_total{{domain=\"ray\",outcome=\"{outcome}\"}} "
            );
            assert!(metric(text, &line).is_some(), "no {outcome} in:\n{text}");
        }
        let sent = metric(
            text,
            "rlark_tunnel_relay_bytes_total{domain=\"ray\",direction=\"to_destination\"} ",
        )
        .with_context(|| format!("no relayed bytes in:\n{text}"))?;
        assert!(sent >= f64::from(1u32 << 20), "{sent} bytes relayed");
        assert_eq!(
            metric(text, "rlark_tunnel_relay_active{domain=\"ray\"} "),
            Some(0.0),
            "{text}"
        );

        c.stop().await;
        b.stop().await;
        a.stop().await;
        server.stop().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_destination_agents_refusal_and_other_requests() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        domain(
            &admin,
            "ray",
            "10.8.0.0/24",
            json!([
                member("10.8.0.2", "a", "j-w-0"),
                member("10.8.0.3", "b", "j-h-0")
            ]),
        )
        .await?;
        let a = agent(&server, "a").await?;
        // B's agent serves no relay: its own `forbidden` comes back through the hub.
        let b = TunnelAgent::start(&[&server], "b").await?;
        let header = tcp("ray", "10.8.0.2", "10.8.0.3");
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let error = loop {
            let error = refused(&a, &header).await?;
            // Until the index has the Domain, the hub itself refuses (unreachable/forbidden).
            if error.message.contains("relay is not enabled") {
                break error;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "never reached B's agent: {error}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(
            error.message.starts_with("agent of cluster \"b\": "),
            "{error}"
        );

        // Anything but a relay from an agent is refused.
        use rlark_testkit::tunnel_agent::rlark_tunnel::header::StreamRequest;
        let error = a
            .handle()
            .hub()
            .open(&StreamRequest::AgentApi, OPEN_TIMEOUT)
            .await
            .err()
            .context("an agent-api stream towards the hub must be refused")?;
        assert_eq!(error.status, Status::Forbidden, "{error}");
        assert!(error.message.contains("only relay"), "{error}");
        // A relay body that is not a relay header.
        let error = a
            .handle()
            .hub()
            .open(
                &StreamRequest::Relay(bytes::Bytes::from_static(b"\x01\x09")),
                OPEN_TIMEOUT,
            )
            .await
            .err()
            .context("a bad relay body must be refused")?;
        assert_eq!(error.status, Status::BadRequest, "{error}");
        assert!(error.message.contains("protocol"), "{error}");

        b.stop().await;
        a.stop().await;
        server.stop().await
    })
    .await
}

/// A fake agent API: `POST /v1/net/check` answers `relay` in 1234 µs for `10.8.0.3` and a
/// refusal otherwise, and records every request body it got.
struct FakeNetCheck {
    seen: Arc<std::sync::Mutex<Vec<Value>>>,
}

impl rlark_testkit::tunnel_agent::rlark_tunnel::agent::AgentApi for FakeNetCheck {
    fn serve(&self, stream: MuxStream) {
        let seen = Arc::clone(&self.seen);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                move |request: hyper::Request<hyper::body::Incoming>| {
                    let seen = Arc::clone(&seen);
                    async move {
                        use http_body_util::BodyExt as _;
                        let path = request.uri().path().to_owned();
                        let body = request
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        seen.lock().expect("lock").push(body.clone());
                        let (status, answer) = if path != "/v1/net/check" {
                            (404, json!({"message": format!("no route {path}")}))
                        } else if body["to"] == "10.8.0.3" {
                            (200, json!({"path": "relay", "setupMicros": 1234}))
                        } else {
                            (
                                502,
                                json!({"message": format!("connect to {}: connection refused", body["to"])}),
                            )
                        };
                        hyper::Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(http_body_util::Full::new(bytes::Bytes::from(
                                answer.to_string(),
                            )))
                    }
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn net_check_route_and_cli() -> Result<()> {
    bounded(async {
        let server = TestServer::start().await?;
        let admin = server.client().await?;
        for (ns, name) in [("rlark-a", "j-w"), ("rlark-b", "j-h")] {
            // The agent namespaces (a join would create its own; none joins as b here).
            let namespace =
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            let resp =
                raw_api::call(&admin, "POST", "/api/v1/namespaces", Some(&namespace)).await?;
            ensure!(
                resp.code == 201 || resp.code == 200 || resp.code == 409,
                "create namespace {ns}: {} {}",
                resp.code,
                resp.brief()
            );
            let task = json!({
                "apiVersion": "rlinf.io/v1alpha1",
                "kind": "Task",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"role": "Actor", "agentType": "Raw", "raw": {"entrypoint": ["true"]}},
            });
            raw_api::call_ok(
                &admin,
                "POST",
                &format!("/apis/rlinf.io/v1alpha1/namespaces/{ns}/tasks"),
                Some(&task),
            )
            .await?;
        }
        domain(
            &admin,
            "ray",
            "10.8.0.0/24",
            json!([
                member("10.8.0.2", "a", "j-w-0"),
                member("10.8.0.3", "b", "j-h-0")
            ]),
        )
        .await?;
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let fake = Arc::new(FakeNetCheck {
            seen: Arc::clone(&seen),
        });
        let a = TunnelAgent::start_with(&[&server], "a", |config| {
            config.agent.agent_api = Some(fake);
        })
        .await?;
        let route = "/rlark/v1/namespaces/rlark-a/tasks/j-w/netcheck";

        // By task: resolved through the Domain (once the hub's index has it).
        let body = json!({"to": {"task": "j-h", "namespace": "rlark-b"}, "port": 8080});
        let deadline = tokio::time::Instant::now() + DEADLINE;
        let answer = loop {
            let resp = raw_api::call(&admin, "POST", route, Some(&body)).await?;
            if resp.code == 200 {
                break resp.json;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "net check never succeeded: {} {}",
                resp.code,
                resp.brief()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(answer["path"], "relay", "{answer}");
        assert_eq!(answer["setupMicros"], 1234, "{answer}");
        assert_eq!(answer["to"], json!({"ip": "10.8.0.3", "port": 8080}));
        assert_eq!(
            answer["from"],
            json!({"namespace": "rlark-a", "pod": "j-w-0"})
        );
        assert_eq!(
            seen.lock().expect("lock").last().cloned(),
            Some(json!({"pod": "j-w-0", "to": "10.8.0.3", "port": 8080})),
            "what the agent was asked"
        );

        // The agent's refusal is a 502 naming why.
        let resp = raw_api::call(&admin, "POST", route, Some(&json!({"to": "10.8.0.9"}))).await?;
        assert_eq!(resp.code, 502, "{}", resp.text);
        assert!(
            resp.message().contains("connection refused"),
            "{}",
            resp.text
        );
        // Bad requests name the field; a missing replica or Task is refused before any agent.
        let resp = raw_api::call(&admin, "POST", route, Some(&json!({"to": "x"}))).await?;
        assert_eq!(resp.code, 400, "{}", resp.text);
        assert!(resp.message().contains("to \"x\""), "{}", resp.text);
        let resp = raw_api::call(
            &admin,
            "POST",
            route,
            Some(&json!({"to": "10.8.0.3", "replica": 3})),
        )
        .await?;
        assert_eq!(resp.code, 400, "{}", resp.text);
        assert!(resp.message().contains("replica 3"), "{}", resp.text);
        let resp = raw_api::call(
            &admin,
            "POST",
            "/rlark/v1/namespaces/rlark-a/tasks/nope/netcheck",
            Some(&json!({"to": "10.8.0.3"})),
        )
        .await?;
        assert_eq!(resp.code, 404, "{}", resp.text);
        let resp = raw_api::call(
            &admin,
            "POST",
            route,
            Some(&json!({"to": {"task": "j-w", "namespace": "rlark-a", "replica": 5}})),
        )
        .await?;
        assert_eq!(resp.code, 400, "{}", resp.text);
        assert!(
            resp.message().contains("holds no Domain address"),
            "{}",
            resp.text
        );

        // The CLI: path and latency on success, exit code 1 with the reason on failure.
        let kubeconfig = server.kubeconfig_path();
        let rlark = |args: &'static [&'static str]| {
            rlark_testkit::real_agent::run_cli(env!("CARGO_BIN_EXE_rlark"), kubeconfig, args)
        };
        let out = rlark(&["net", "check", "task/j-w", "task/j-h", "--port", "8080"]).await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "rlark net check failed: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            stdout.trim(),
            "rlark-a/j-w-0 -> rlark-b/j-h-0 (10.8.0.3:8080): path relay, setup 1.234 ms"
        );
        let out = rlark(&["net", "check", "j-w", "10.8.0.9", "-n", "rlark-a"]).await?;
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("connection refused") && stderr.contains("10.8.0.9"),
            "{stderr}"
        );

        a.stop().await;
        server.stop().await
    })
    .await
}
