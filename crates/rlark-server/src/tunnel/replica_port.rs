//! A connection to a port of a raw or docker replica, through its node's agent: the
//! agent's `GET /ports/{namespace}/{pod}/{port}` (`rlark_agent::ports`), which connects
//! only when every socket listening on that port of the node's loopback belongs to the
//! replica's processes — so the task proxy, `ssh -L` and port-forward reach the replica's
//! own ports and not the node's other services (the agent's, other tasks', a database).

use hyper_util::rt::TokioIo;
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::Status;

use super::{Hub, HubStream};

/// The agent route's path prefix and `Upgrade` token (`rlark_agent::ports`).
const PORTS_PREFIX: &str = "/ports/";
const PORTS_UPGRADE: &str = "rlark-port";
/// Most bytes of an agent's refusal read.
const MAX_REFUSAL: usize = 4096;

/// The agent's refusal as a dial error: 403 → `forbidden` (not the replica's port),
/// 502 → `refused`, 504 → `timeout`, 404/409 → `unreachable`, others `internal`.
fn refusal(status: http::StatusCode, message: String) -> DialError {
    let status = match status.as_u16() {
        403 => Status::Forbidden,
        502 => Status::Refused,
        504 => Status::Timeout,
        400 => Status::BadRequest,
        404 | 409 => Status::Unreachable,
        _ => Status::Internal,
    };
    DialError { status, message }
}

/// A stream to `port` of replica `namespace/pod`, through the session of `node` of
/// `cluster`.
pub(crate) async fn dial(
    hub: &Hub,
    cluster: &str,
    node: &str,
    namespace: &str,
    pod: &str,
    port: u16,
) -> Result<HubStream, DialError> {
    let stream = hub.dial_agent_api_on_node(cluster, node).await?;
    let deadline = hub.config().dial_timeout + std::time::Duration::from_secs(1);
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| DialError::new(Status::Internal, format!("agent API: {e}")))?;
        tokio::spawn(async move {
            if let Err(error) = conn.with_upgrades().await {
                tracing::debug!(%error, "agent port connection ended");
            }
        });
        let request = http::Request::get(format!("{PORTS_PREFIX}{namespace}/{pod}/{port}"))
            .header(http::header::HOST, "agent")
            .header(http::header::CONNECTION, "Upgrade")
            .header(http::header::UPGRADE, PORTS_UPGRADE)
            .body(axum::body::Body::empty())
            .map_err(|e| DialError::new(Status::Internal, e.to_string()))?;
        let mut response = sender
            .send_request(request)
            .await
            .map_err(|e| DialError::new(Status::Internal, format!("agent API: {e}")))?;
        if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body =
                axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_REFUSAL)
                    .await
                    .map(|b| String::from_utf8_lossy(&b).trim().to_string())
                    .unwrap_or_default();
            let message = if status == http::StatusCode::NOT_FOUND && body.starts_with("not found:")
            {
                format!(
                    "the agent of node {node:?} does not check replica ports (an older agent); \
                     upgrade it: {body}"
                )
            } else {
                body
            };
            return Err(refusal(status, message));
        }
        let upgraded = hyper::upgrade::on(&mut response)
            .await
            .map_err(|e| DialError::new(Status::Internal, format!("agent API upgrade: {e}")))?;
        Ok(HubStream::upgraded(TokioIo::new(upgraded)))
    };
    match tokio::time::timeout(deadline, exchange).await {
        Ok(result) => result,
        Err(_) => Err(DialError::new(
            Status::Timeout,
            format!(
                "the agent did not connect to port {port} of {namespace}/{pod} within {deadline:?}"
            ),
        )),
    }
}
