//! `GET|POST /api/v1/namespaces/{ns}/pods/{pod}/portforward`: `kubectl port-forward` to a
//! replica, through its agent.
//!
//! **Transports** (both served; kubectl 1.30+ tries the first and falls back to the second
//! when the upgrade is refused):
//!
//! - WebSocket with subprotocol `SPDY/3.1+portforward.k8s.io`: SPDY frames inside binary
//!   messages (kubectl's `PortForwardWebsockets`, its default since 1.31);
//! - HTTP `Upgrade: SPDY/3.1` with `X-Stream-Protocol-Version: portforward.k8s.io`.
//!
//! After the upgrade both are the same [`session`]: SPDY/3.1 ([`rlark_tunnel::spdy`]),
//! one error and one data stream per forwarded connection.
//!
//! **Who**: as exec — the built-in policy's decision for verb `create` on
//! `pods/portforward` in `rlinf.io` (admins), or the replica's Job's `spec.access`; the
//! same 403 text otherwise; denials and every session are audited.
//!
//! **Checks, in order**: identity (401), authorization (403), the upgrade (400 naming what
//! is missing), agent namespace `rlark-<clusterID>` (400), the Pod exists (404) and is
//! `Running` (400), its destination ([`Destination::of`]; 400 when it has none).
//!
//! **Where a port is**: the agent dials it (a `dial-tcp` tunnel stream, as
//! `rlark port-forward` does) when kubectl opens the data stream:
//!
//! - a `Raw` or `Docker` replica without a Domain runs in its node's network (processes on
//!   the host; containers with `NetworkMode: host`): `127.0.0.1:PORT` through the session
//!   of the replica's node and no other (another node's loopback is another host), and
//!   only when the replica's own processes listen on it (the agent's `/ports` route,
//!   [`super::replica_port`]): the node's other services are not reachable;
//! - a `Kubernetes` replica is a member cluster's Pod: its IP (`status.ip`) as the agent
//!   reaches it, through any session of the cluster;
//! - a `Raw` replica in a Domain listens in its own network namespace, which the agent only
//!   enters for authorized Domain members (the pod network's inbound path); no tunnel
//!   request reaches it from the server, so the port-forward is refused with a 400 that
//!   says so (use `kubectl exec`, or a Domain member).

mod session;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::error::ApiError;
use rlark_store::ObjectKey;
use serde_json::Value;
use tokio_util::codec::{BytesCodec, FramedWrite};
use tokio_util::io::ReaderStream;

use super::Hub;
use super::exec::{ExecState, PodCaller, running_pod};
use session::{Dialer, TargetIo};

/// The WebSocket subprotocol of kubectl's tunneled SPDY.
pub(crate) const WEBSOCKET_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// The stream protocol of the SPDY upgrade.
pub(crate) const STREAM_PROTOCOL: &str = "portforward.k8s.io";
/// The `Upgrade` token of the SPDY upgrade.
const SPDY_UPGRADE: &str = "SPDY/3.1";
const X_STREAM_PROTOCOL_VERSION: &str = "x-stream-protocol-version";

const TASKS: &str = "tasks.rlinf.io";

/// The transport a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Upgrade {
    /// WebSocket; the client's `Sec-WebSocket-Key`.
    WebSocket {
        key: String,
    },
    Spdy,
}

fn has_token(headers: &HeaderMap, name: &str, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .any(|part| part.trim().eq_ignore_ascii_case(token))
        })
    })
}

/// The transport of `headers`, or the 400's message.
fn upgrade(headers: &HeaderMap) -> Result<Upgrade, String> {
    if !has_token(headers, "connection", "upgrade") {
        return Err(format!(
            "port-forward needs an upgraded connection (Connection: Upgrade) to \
             {SPDY_UPGRADE} or to a WebSocket with subprotocol {WEBSOCKET_PROTOCOL}, as \
             kubectl port-forward makes"
        ));
    }
    if has_token(headers, "upgrade", "websocket") {
        if !has_token(headers, "sec-websocket-protocol", WEBSOCKET_PROTOCOL) {
            // kubectl falls back to the SPDY upgrade on this answer.
            return Err(format!(
                "port-forward over WebSocket needs subprotocol {WEBSOCKET_PROTOCOL}"
            ));
        }
        let key = headers
            .get(header::SEC_WEBSOCKET_KEY)
            .and_then(|v| v.to_str().ok())
            .filter(|k| !k.is_empty())
            .ok_or("WebSocket upgrade without Sec-WebSocket-Key")?;
        return Ok(Upgrade::WebSocket {
            key: key.to_string(),
        });
    }
    if has_token(headers, "upgrade", SPDY_UPGRADE) {
        if !has_token(headers, X_STREAM_PROTOCOL_VERSION, STREAM_PROTOCOL) {
            return Err(format!(
                "port-forward over {SPDY_UPGRADE} needs X-Stream-Protocol-Version: \
                 {STREAM_PROTOCOL}"
            ));
        }
        return Ok(Upgrade::Spdy);
    }
    Err(format!(
        "port-forward needs Upgrade: {SPDY_UPGRADE} or Upgrade: websocket (subprotocol \
         {WEBSOCKET_PROTOCOL})"
    ))
}

/// Where a replica's ports are, as the agent dials them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Destination {
    pub(crate) host: String,
    /// Through this node's session only; `None`: any session of the cluster.
    pub(crate) node: Option<String>,
    /// `(namespace, pod)` of a replica whose ports are on its node's loopback: the agent
    /// connects only to ports the replica's own processes listen on
    /// ([`super::replica_port`]); `None`: a member Pod's IP, dialed as it is.
    pub(crate) replica: Option<(String, String)>,
}

impl Destination {
    /// A stream to `port` at this destination, through the agent of `cluster`.
    pub(crate) async fn dial(
        &self,
        hub: &Hub,
        cluster: &str,
        port: u16,
    ) -> Result<super::HubStream, rlark_tunnel::dial::DialError> {
        match (&self.node, &self.replica) {
            (Some(node), Some((namespace, pod))) => {
                super::replica_port::dial(hub, cluster, node, namespace, pod, port).await
            }
            (Some(node), None) => hub.dial_on_node(cluster, node, &self.host, port).await,
            (None, _) => hub.dial(cluster, None, &self.host, port).await,
        }
    }

    /// The destination of a stored replica Pod whose Task (if still stored) is `task`;
    /// `Err` is the 400's message.
    pub(crate) fn of(pod: &Value, task: Option<&Value>) -> Result<Destination, String> {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let agent_type = task
            .and_then(|t| t["spec"]["agentType"].as_str())
            .unwrap_or("Raw");
        let node = pod["status"]["node"].as_str().filter(|n| !n.is_empty());
        let domain = pod["spec"]["domain"].as_str().filter(|d| !d.is_empty());
        match agent_type {
            "Kubernetes" => {
                let ip = pod["status"]["ip"]
                    .as_str()
                    .filter(|ip| !ip.is_empty())
                    .ok_or_else(|| format!("pod {name} has no IP yet"))?;
                Ok(Destination {
                    host: ip.to_string(),
                    node: None,
                    replica: None,
                })
            }
            // Docker containers run with the host's network and join no Domain.
            "Raw" if domain.is_some() => Err(format!(
                "pod {name} is in Domain {:?}: its ports are in the replica's own network \
                 namespace, which the agent opens only to members of the Domain; \
                 port-forward reaches a node's loopback only (use kubectl exec, or connect \
                 from another member of the Domain)",
                domain.unwrap_or_default()
            )),
            _ => {
                let node = node.ok_or_else(|| format!("pod {name} is on no node yet"))?;
                let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
                Ok(Destination {
                    host: "127.0.0.1".into(),
                    node: Some(node.to_string()),
                    replica: Some((namespace.to_string(), name.to_string())),
                })
            }
        }
    }
}

/// Dials a replica's ports through the hub, each connection in its user's share of the
/// agent's streams.
struct HubDialer {
    hub: Arc<Hub>,
    cluster: String,
    /// Who forwards (for the per-user stream share).
    user: String,
    destination: Destination,
    /// `namespace/pod`, for messages.
    pod: String,
}

impl Dialer for HubDialer {
    fn dial(&self, port: u16) -> BoxFuture<'static, Result<Box<dyn TargetIo>, String>> {
        let hub = Arc::clone(&self.hub);
        let cluster = self.cluster.clone();
        let destination = self.destination.clone();
        let pod = self.pod.clone();
        let user = self.user.clone();
        Box::pin(async move {
            let result = match hub.user_share(&cluster, &user) {
                Ok(share) => destination
                    .dial(&hub, &cluster, port)
                    .await
                    .map(|stream| stream.with_share(share)),
                Err(error) => Err(error),
            };
            let Destination { host, node, .. } = destination;
            // kubelet's wording, so kubectl users recognize it.
            result
                .map(|stream| Box::new(stream) as Box<dyn TargetIo>)
                .map_err(|error| {
                    let on = node.map(|n| format!(" on node {n}")).unwrap_or_default();
                    format!(
                        "error forwarding port {port} to pod {pod}: dial {host}:{port}{on} \
                         through the agent of cluster {cluster:?}: {error}"
                    )
                })
        })
    }
}

/// Where the ports of replica `namespace/pod` are: its cluster and [`Destination`]; `Err`
/// is the answer (400 for a namespace that is no agent's or a replica without a
/// destination, 404/400 from [`running_pod`]). Shared by the port-forward route and the
/// pod form of HTTP `CONNECT` ([`super::connect`]).
pub(crate) async fn locate(
    state: &ExecState,
    namespace: &str,
    pod: &str,
) -> Result<(String, Destination), Box<ApiError>> {
    let Some(cluster) = namespace
        .strip_prefix("rlark-")
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
        .map(str::to_string)
    else {
        return Err(Box::new(ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace: replicas run on the agent of \
             a cluster, so the namespace must be rlark-<clusterID>"
        ))));
    };
    let read = |key: ObjectKey| {
        let store = Arc::clone(&state.store);
        async move { store.get(&key).await }
    };
    let object = running_pod(state, namespace, pod).await?;
    // The Task says which runtime runs the replica; a Task already deleted (the replica
    // still winding down) leaves the Pod's own fields to decide.
    let task = match (
        object["spec"]["taskNamespace"].as_str(),
        object["spec"]["taskName"].as_str(),
    ) {
        (Some(task_namespace), Some(task_name)) => {
            read(ObjectKey::new(TASKS, task_namespace, task_name))
                .await
                .ok()
                .flatten()
        }
        _ => None,
    };
    let destination = Destination::of(&object, task.as_deref())
        .map_err(|message| Box::new(ApiError::bad_request(message)))?;
    Ok((cluster, destination))
}

/// The route's handler.
pub(super) async fn portforward(
    State(state): State<ExecState>,
    Path((namespace, pod)): Path<(String, String)>,
    mut request: Request,
) -> Response {
    let caller = match PodCaller::authorize(
        &state,
        super::exec::identity_of(&request),
        &namespace,
        &pod,
        "portforward",
    )
    .await
    {
        Ok(caller) => caller,
        Err(error) => return (*error).into_response(),
    };
    let transport = match upgrade(request.headers()) {
        Ok(transport) => transport,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let (cluster, destination) = match locate(&state, &namespace, &pod).await {
        Ok(found) => found,
        Err(error) => return (*error).into_response(),
    };
    caller.audit(
        "portforward",
        format!(
            "to {}{}",
            destination.host,
            destination
                .node
                .as_deref()
                .map(|n| format!(" on node {n}"))
                .unwrap_or_default()
        ),
    );
    let kind = match &transport {
        Upgrade::WebSocket { .. } => "websocket",
        Upgrade::Spdy => "spdy",
    };
    tracing::info!(
        user = %caller.identity.user,
        namespace = %namespace,
        pod = %pod,
        host = %destination.host,
        node = ?destination.node,
        transport = kind,
        "port-forward"
    );
    let label = format!("{namespace}/{pod}");
    let dialer: Arc<dyn Dialer> = Arc::new(HubDialer {
        hub: Arc::clone(&state.hub),
        cluster,
        user: caller.identity.user.clone(),
        destination,
        pod: label.clone(),
    });
    let on_upgrade = hyper::upgrade::on(&mut request);
    let websocket = matches!(transport, Upgrade::WebSocket { .. });
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => TokioIo::new(upgraded),
            Err(error) => {
                tracing::debug!(%error, pod = %label, "port-forward upgrade failed");
                return;
            }
        };
        if websocket {
            let transport = rlark_tunnel::transport::WsTransport::from_raw_socket(
                upgraded,
                rlark_tunnel::ws::Role::Server,
            );
            let (output, input) = transport.split();
            session::serve(input, output, dialer, label).await;
        } else {
            let (read, write) = tokio::io::split(upgraded);
            session::serve(
                ReaderStream::new(read),
                FramedWrite::new(write, BytesCodec::new()),
                dialer,
                label,
            )
            .await;
        }
    });
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade");
    let response = match transport {
        Upgrade::WebSocket { key } => response
            .header(header::UPGRADE, "websocket")
            .header(
                header::SEC_WEBSOCKET_ACCEPT,
                tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes()),
            )
            .header(header::SEC_WEBSOCKET_PROTOCOL, WEBSOCKET_PROTOCOL),
        Upgrade::Spdy => response
            .header(header::UPGRADE, SPDY_UPGRADE)
            .header(X_STREAM_PROTOCOL_VERSION, STREAM_PROTOCOL),
    };
    response.body(Body::empty()).unwrap_or_else(|error| {
        ApiError::new(500, "InternalError", error.to_string()).into_response()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_apiserver::auth::{ADMIN_GROUP, Identity, VIEWER_GROUP};
    use rlark_apiserver::authz::{self, Decision};
    use serde_json::json;

    #[test]
    fn only_admins_may_port_forward() {
        let attrs = super::super::exec::attributes("rlark-a", "t-0", "portforward");
        let who = |user: &str, group: &str| Identity {
            user: user.into(),
            groups: vec![group.into()],
        };
        assert!(authz::authorize(&who("root", ADMIN_GROUP), &attrs).is_allowed());
        for identity in [
            who("vera", VIEWER_GROUP),
            who("system:rlark:agent:a", "rlark:agents"),
            who("bob", "developers"),
        ] {
            let Decision::Deny(reason) = authz::authorize(&identity, &attrs) else {
                panic!("{} may port-forward", identity.user)
            };
            assert!(
                reason.contains("cannot create resource \"pods/portforward\""),
                "{reason}"
            );
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn kubectl_upgrades_are_recognized() {
        // What kubectl 1.32 sends first, and its fallback.
        assert_eq!(
            upgrade(&headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io"),
            ])),
            Ok(Upgrade::WebSocket {
                key: "dGhlIHNhbXBsZSBub25jZQ==".into()
            })
        );
        assert_eq!(
            upgrade(&headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "SPDY/3.1"),
                ("x-stream-protocol-version", "portforward.k8s.io"),
            ])),
            Ok(Upgrade::Spdy)
        );
        for bad in [
            headers(&[]),
            headers(&[("connection", "Upgrade"), ("upgrade", "h2c")]),
            headers(&[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-key", "k"),
                ("sec-websocket-protocol", "v5.channel.k8s.io"),
            ]),
            headers(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]),
        ] {
            assert!(upgrade(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn destinations_follow_the_runtime() {
        let pod = |spec: Value, status: Value| json!({"metadata": {"name": "t-0", "namespace": "rlark-a"}, "spec": spec, "status": status});
        let task = |agent_type: &str| json!({"spec": {"agentType": agent_type}});
        let raw = pod(json!({}), json!({"node": "n1"}));
        let loopback = Destination {
            host: "127.0.0.1".into(),
            node: Some("n1".into()),
            replica: Some(("rlark-a".into(), "t-0".into())),
        };
        assert_eq!(
            Destination::of(&raw, Some(&task("Raw"))),
            Ok(loopback.clone())
        );
        assert_eq!(Destination::of(&raw, None), Ok(loopback.clone()));
        assert_eq!(Destination::of(&raw, Some(&task("Docker"))), Ok(loopback));
        let in_domain = pod(
            json!({"domain": "d"}),
            json!({"node": "n1", "ip": "10.88.0.2"}),
        );
        assert!(
            Destination::of(&in_domain, Some(&task("Raw")))
                .is_err_and(|e| e.contains("Domain \"d\""))
        );
        let member = pod(json!({}), json!({"node": "k8s-node", "ip": "10.1.0.7"}));
        assert_eq!(
            Destination::of(&member, Some(&task("Kubernetes"))),
            Ok(Destination {
                host: "10.1.0.7".into(),
                node: None,
                replica: None,
            })
        );
        assert!(Destination::of(&pod(json!({}), json!({})), Some(&task("Kubernetes"))).is_err());
        assert!(Destination::of(&pod(json!({}), json!({})), Some(&task("Raw"))).is_err());
    }
}
