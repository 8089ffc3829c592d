//! `GET|POST /rlark/v1/namespaces/{ns}/pods/{pod}/exec?command=...&stdin=..&stdout=..&stderr=..&tty=..`:
//! a command in a running replica, through its agent — Kubernetes' remotecommand WebSocket
//! protocol (`v5.channel.k8s.io`, else `v4.channel.k8s.io`), as `kubectl exec` speaks it.
//!
//! **Who**: admins (the built-in policy's decision, [`rlark_apiserver::authz::authorize`]
//! for verb `create` on `pods/exec` in `rlinf.io`: no role but admin has it), and the users
//! and groups the replica's Job grants in `spec.access` (`crate::task_access`, the rule of
//! the SSH endpoint and the task proxy, docs/ssh.md). Anyone else's 403 reads as every other
//! denial (`pods.rlinf.io "x" is forbidden: User "vera" cannot create resource "pods/exec"
//! ...`). Denials and every exec started are written to the audit log (the command
//! included).
//!
//! **Checks, in order**: identity (401), authorization (403), query ([`ExecOptions`], 400),
//! WebSocket upgrade with an exec subprotocol (400 naming what is missing), agent namespace
//! `rlark-<clusterID>` (400), the Pod exists in the store (404), its phase is `Running`
//! (400 `pod X is not running (phase ...)`).
//!
//! **How**: the hub opens an `agent-api` stream to the agent of the Pod's cluster (the
//! session of the Pod's node preferred, [`super::Hub::dial_agent_api`]; failures are 502 as
//! for logs), sends the upgrade request on to `GET /exec/{ns}/{pod}?...` (the query
//! re-encoded canonically, the client's `Sec-WebSocket-Key` and protocols kept), and relays
//! the agent's answer: an error as a `Status` with the agent's code (400, 404, 409; others
//! 502), or its `101`, after which the bytes of both upgraded connections are copied both
//! ways until either side closes. The WebSocket is end to end between client and agent: the
//! hub never parses the frames.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_api::agent::local::{ExecOptions, exec_path, exec_upgrade};
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::Identity;
use rlark_apiserver::authz::{self, Attributes, Decision};
use rlark_apiserver::error::ApiError;
use rlark_store::{ObjectKey, Store};

use super::Hub;

/// The route, as registered.
pub(crate) const ROUTE: &str = "/rlark/v1/namespaces/{namespace}/pods/{pod}/exec";
/// Group and resource of replica Pods.
const POD_GROUP: &str = "rlinf.io";
const POD_RESOURCE: &str = "pods";
/// Store resource of replica Pods.
const PODS: &str = "pods.rlinf.io";

/// State of the exec route.
#[derive(Clone)]
pub(crate) struct ExecState {
    pub(super) hub: Arc<Hub>,
    pub(super) store: Arc<dyn Store>,
    pub(super) audit: Arc<dyn AuditSink>,
}

impl ExecState {
    pub(crate) fn new(hub: Arc<Hub>, store: Arc<dyn Store>, audit: Arc<dyn AuditSink>) -> Self {
        Self { hub, store, audit }
    }
}

/// The route; merged into the process router.
pub(crate) fn router(state: ExecState) -> Router {
    Router::new()
        .route(ROUTE, get(exec).post(exec))
        .with_state(state)
}

/// The attributes of a `create` of Pod subresource `subresource` (`exec`,
/// `portforward`), as the built-in policy sees it.
pub(super) fn attributes(namespace: &str, pod: &str, subresource: &str) -> Attributes {
    Attributes {
        verb: "create".into(),
        group: POD_GROUP.into(),
        resource: POD_RESOURCE.into(),
        subresource: Some(subresource.into()),
        namespace: Some(namespace.into()),
        name: Some(pod.into()),
    }
}

/// Replica Pod `namespace/pod` from the store, when it is `Running`: else 404 (no such
/// Pod), 500 (the store failed) or 400 naming its phase.
pub(super) async fn running_pod(
    state: &ExecState,
    namespace: &str,
    pod: &str,
) -> Result<Arc<serde_json::Value>, Box<ApiError>> {
    let object = match state.store.get(&ObjectKey::new(PODS, namespace, pod)).await {
        Ok(Some(object)) => object,
        Ok(None) => {
            return Err(Box::new(ApiError::new(
                404,
                "NotFound",
                format!("{PODS} \"{pod}\" not found"),
            )));
        }
        Err(error) => {
            return Err(Box::new(ApiError::new(
                500,
                "InternalError",
                format!("read pod {namespace}/{pod}: {error}"),
            )));
        }
    };
    let phase = object["status"]["phase"].as_str().unwrap_or("none yet");
    if phase != "Running" {
        return Err(Box::new(ApiError::bad_request(format!(
            "pod {namespace}/{pod} is not running (phase {phase})"
        ))));
    }
    Ok(object)
}

/// The authorized caller of a Pod subresource (exec, port-forward), and its audit trail.
pub(super) struct PodCaller {
    pub(super) identity: Identity,
    attrs: Attributes,
    audit: Arc<dyn AuditSink>,
    namespace: String,
    pod: String,
    subresource: &'static str,
}

impl PodCaller {
    /// The caller of `request` for `subresource` of Pod `namespace/pod`: 401 without an
    /// identity, 403 (audited as `denied`) when neither the policy (admins) nor the replica's
    /// Job (`spec.access`, [`crate::task_access`]) allows it.
    pub(super) async fn authorize(
        state: &ExecState,
        identity: Option<Identity>,
        namespace: &str,
        pod: &str,
        subresource: &'static str,
    ) -> Result<Self, Box<ApiError>> {
        let Some(identity) = identity else {
            return Err(Box::new(ApiError::unauthorized()));
        };
        let caller = PodCaller {
            identity,
            attrs: attributes(namespace, pod, subresource),
            audit: Arc::clone(&state.audit),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            subresource,
        };
        if let Decision::Deny(reason) = authz::authorize(&caller.identity, &caller.attrs) {
            if granted_by_job(state, &caller.identity, namespace, pod).await {
                return Ok(caller);
            }
            caller.audit("denied", reason.clone());
            return Err(Box::new(ApiError::forbidden_resource(
                POD_GROUP,
                POD_RESOURCE,
                Some(pod),
                &reason,
            )));
        }
        Ok(caller)
    }

    /// Audit `action` (`denied`, or what was done: `exec`, `portforward`) with `reason`.
    pub(super) fn audit(&self, action: &str, reason: String) {
        let decision = if action == "denied" {
            "denied"
        } else {
            "allowed"
        };
        self.audit.record(AuditEntry {
            verb: self.attrs.verb.clone(),
            resource: format!("{PODS}/{}", self.subresource),
            namespace: self.namespace.clone(),
            name: self.pod.clone(),
            reason,
            ..AuditEntry::now(action, decision).by(Some(&self.identity))
        });
    }
}

/// The caller's identity, when authenticated.
pub(super) fn identity_of(request: &Request) -> Option<Identity> {
    request.extensions().get::<Identity>().cloned()
}

/// Whether the Job of replica `namespace/pod` grants `identity` (`spec.access`).
async fn granted_by_job(
    state: &ExecState,
    identity: &Identity,
    namespace: &str,
    pod: &str,
) -> bool {
    crate::task_access::pod_granted(&*state.store, identity, namespace, pod).await
}

pub(super) async fn exec(
    State(state): State<ExecState>,
    Path((namespace, pod)): Path<(String, String)>,
    mut request: Request,
) -> Response {
    let caller =
        match PodCaller::authorize(&state, identity_of(&request), &namespace, &pod, "exec").await {
            Ok(caller) => caller,
            Err(error) => return (*error).into_response(),
        };
    let options = match ExecOptions::parse(request.uri().query()) {
        Ok(options) => options,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let container = match super::logs::container_param(request.uri().query()) {
        Ok(container) => container,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    if let Err(message) = exec_upgrade(request.headers()) {
        return ApiError::bad_request(format!("{ROUTE_NAME}: {message}")).into_response();
    }
    let Some(cluster) = namespace
        .strip_prefix("rlark-")
        .filter(|c| crate::security::validate_cluster_id(c).is_ok())
        .map(str::to_string)
    else {
        return ApiError::bad_request(format!(
            "namespace {namespace:?} is not an agent namespace: replicas run on the agent of \
             a cluster, so the namespace must be rlark-<clusterID>"
        ))
        .into_response();
    };
    let object = match running_pod(&state, &namespace, &pod).await {
        Ok(object) => object,
        Err(error) => return (*error).into_response(),
    };
    let node = object["status"]["node"].as_str().map(str::to_string);

    // Each exec holds one of its user's share of the agent's streams.
    let share = match state.hub.user_share(&cluster, &caller.identity.user) {
        Ok(share) => share,
        Err(error) => {
            return ApiError::new(429, "TooManyRequests", error.message).into_response();
        }
    };
    let stream = match state.hub.dial_agent_api(&cluster, node.as_deref()).await {
        Ok(stream) => stream.with_share(share),
        Err(error) => return super::logs::tunnel_error(&cluster, &error),
    };
    let bad_gateway = |error: String| {
        ApiError::new(
            502,
            "BadGateway",
            format!(
                "exec in pod {namespace}/{pod} through the agent of cluster {cluster:?}: {error}"
            ),
        )
        .into_response()
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(error) => return bad_gateway(error.to_string()),
    };
    // Ends with the upgraded connection (or at once when there is no upgrade).
    tokio::spawn(async move {
        if let Err(error) = conn.with_upgrades().await {
            tracing::debug!(%error, "agent exec connection ended");
        }
    });
    let uri = format!(
        "{}?{}",
        exec_path(&namespace, &pod),
        super::logs::with_container(options.to_query(), container.as_deref())
    );
    let mut out = http::Request::get(&uri)
        .header(header::HOST, "agent")
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket");
    for name in [
        header::SEC_WEBSOCKET_VERSION,
        header::SEC_WEBSOCKET_KEY,
        header::SEC_WEBSOCKET_PROTOCOL,
    ] {
        for value in request.headers().get_all(&name) {
            out = out.header(&name, value);
        }
    }
    let out = match out.body(Body::empty()) {
        Ok(out) => out,
        Err(error) => return ApiError::bad_request(error.to_string()).into_response(),
    };
    let client_upgrade = hyper::upgrade::on(&mut request);
    // A terminal opened with a console session closes at its logout.
    let session_end = request
        .extensions()
        .get::<crate::console::sessions::SessionEnd>()
        .cloned();
    let deadline = state.hub.config().dial_timeout;
    let mut response = match tokio::time::timeout(deadline, sender.send_request(out)).await {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => return bad_gateway(error.to_string()),
        Err(_) => {
            return bad_gateway(format!("the agent did not answer within {deadline:?}"));
        }
    };
    let status = response.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return super::agent_refusal::refusal(response, &cluster, deadline).await;
    }
    caller.audit(
        "exec",
        format!(
            "command {:?} (tty={}, stdin={})",
            options.command, options.tty, options.stdin
        ),
    );
    tracing::info!(
        user = %caller.identity.user,
        namespace = %namespace,
        pod = %pod,
        command = ?options.command,
        "exec"
    );
    let agent_upgrade = hyper::upgrade::on(&mut response);
    tokio::spawn(async move {
        match tokio::try_join!(client_upgrade, agent_upgrade) {
            Ok((client, agent)) => {
                let mut client = TokioIo::new(client);
                let mut agent = TokioIo::new(agent);
                tokio::select! {
                    copied = tokio::io::copy_bidirectional(&mut client, &mut agent) => {
                        if let Err(error) = copied {
                            tracing::debug!(%error, "exec connection ended");
                        }
                    }
                    () = crate::console::sessions::ended_or_never(session_end) => {
                        tracing::info!("exec connection closed: its console session ended");
                    }
                }
            }
            Err(error) => tracing::debug!(%error, "exec upgrade failed"),
        }
    });
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Body::empty())
}

/// How error messages name the route.
const ROUTE_NAME: &str = "/rlark/v1/namespaces/{ns}/pods/{pod}/exec";

#[cfg(test)]
mod tests {
    use super::*;
    use rlark_apiserver::auth::{ADMIN_GROUP, VIEWER_GROUP};

    #[test]
    fn only_admins_may_exec() {
        let attrs = attributes("rlark-a", "t-0", "exec");
        let who = |user: &str, group: &str| Identity {
            user: user.into(),
            groups: vec![group.into()],
        };
        assert!(authz::authorize(&who("root", ADMIN_GROUP), &attrs).is_allowed());
        for identity in [
            who("vera", VIEWER_GROUP),
            who("system:rlark:agent:a", "rlark:agents"),
            who("system:rlark:task:rlark-a:t", "rlark:tasks"),
            who("bob", "developers"),
        ] {
            let decision = authz::authorize(&identity, &attrs);
            let Decision::Deny(reason) = decision else {
                panic!("{} may exec", identity.user)
            };
            assert!(
                reason.contains("cannot create resource \"pods/exec\""),
                "{reason}"
            );
        }
    }
}
