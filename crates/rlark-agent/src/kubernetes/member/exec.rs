//! `rlark exec` of a Pod the Kubernetes runtime mirrors: the agent's local API
//! (`GET /exec/{namespace}/{pod}`, [`crate::exec`]) finds the rlark Pod's
//! [`MEMBER_POD_ANNOTATION`](super::MEMBER_POD_ANNOTATION) ([`MemberPods::resolve`]) and
//! opens the member API's `GET .../pods/{name}/exec` as a WebSocket offering the very
//! remotecommand protocol the client negotiated (`v5.channel.k8s.io` or
//! `v4.channel.k8s.io`), then relays the messages both ways unchanged: stdin, stdout,
//! stderr, resize, the v5 close of stdin, and the final status (exit code) on channel 3.
//!
//! - The container is `-c`, else the default one ([`MemberPods::container`]: the
//!   `kubectl.kubernetes.io/default-container` annotation, else the first).
//! - The member API is asked before the client's upgrade is answered, so its refusals (no
//!   such Pod, container not running, exec forbidden) come back with its status code and
//!   message.
//! - When either side closes or fails, the other is closed (at most [`CLOSE_TIMEOUT`]);
//!   the agent stopping closes both.

use futures::{SinkExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use rlark_api::agent::local::{ExecOptions, exec_upgrade, percent_encode};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_util::sync::CancellationToken;

use super::logs::MemberPods;
use crate::api_body::{ApiBody, text_response};
use crate::exec::{CLOSE_TIMEOUT, EXEC_PREFIX, ws_config};
use crate::runs::container_param;

/// The member API's exec URL of `container` of Pod `namespace/pod` with `options`.
pub fn member_exec_path(
    namespace: &str,
    pod: &str,
    container: &str,
    options: &ExecOptions,
) -> String {
    format!(
        "/api/v1/namespaces/{namespace}/pods/{pod}/exec?{}&container={}",
        options.to_query(),
        percent_encode(container)
    )
}

/// The message of a member API refusal: the `Status` message when the body is one, else
/// the body.
fn refusal_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|status| status["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string())
}

/// Answer an exec request for a mirrored Pod: `None` when the path names no Pod with the
/// member annotation (the request is then the raw or docker runtime's), else the `101`
/// (the relay runs on) or the refusal.
pub(crate) async fn handle<B>(
    pods: &MemberPods,
    shutdown: &CancellationToken,
    request: &mut http::Request<B>,
) -> Option<http::Response<ApiBody>> {
    let path = request.uri().path().to_string();
    let (namespace, pod) = path
        .strip_prefix(EXEC_PREFIX)?
        .split_once('/')
        .filter(|(ns, pod)| !pod.contains('/') && rlark_api::names::dns1123_label(ns).is_ok())
        .filter(|(_, pod)| rlark_api::names::dns1123_subdomain(pod).is_ok())?;
    if request.method() != http::Method::GET {
        return None;
    }
    let (member_ns, member_pod) = match pods.resolve(namespace, pod).await {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(e) => return Some(text_response(e.status(), e.to_string())),
    };
    let query = request.uri().query();
    let options = match ExecOptions::parse(query) {
        Ok(options) => options,
        Err(message) => return Some(text_response(http::StatusCode::BAD_REQUEST, message)),
    };
    let asked = match container_param(query) {
        Ok(asked) => asked,
        Err(message) => return Some(text_response(http::StatusCode::BAD_REQUEST, message)),
    };
    let upgrade = match exec_upgrade(request.headers()) {
        Ok(upgrade) => upgrade,
        Err(message) => return Some(text_response(http::StatusCode::BAD_REQUEST, message)),
    };
    let container = match asked {
        Some(container) => container,
        None => match pods.container(&member_ns, &member_pod).await {
            Ok(container) => container,
            Err(e) => return Some(text_response(e.status(), e.to_string())),
        },
    };
    let what = format!("member pod {member_ns}/{member_pod}");
    let member = match open(
        pods,
        &member_ns,
        &member_pod,
        &container,
        &options,
        upgrade.protocol,
    )
    .await
    {
        Ok(member) => member,
        Err((status, message)) => {
            return Some(text_response(status, format!("{what}: {message}")));
        }
    };
    tracing::info!(
        namespace,
        pod,
        member_pod = %what,
        container,
        command = ?options.command,
        tty = options.tty,
        "exec into a member pod"
    );
    let on_upgrade = hyper::upgrade::on(&mut *request);
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let client = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(ws_config()),
                )
                .await;
                relay(client, member, shutdown).await;
                tracing::info!(member_pod = %what, "exec into a member pod ended");
            }
            Err(error) => tracing::debug!(%error, member_pod = %what, "exec upgrade failed"),
        }
    });
    Some(crate::exec::switching_protocols(&upgrade))
}

/// The member API's exec WebSocket, or the status and message it refused with.
async fn open(
    pods: &MemberPods,
    namespace: &str,
    pod: &str,
    container: &str,
    options: &ExecOptions,
    protocol: &'static str,
) -> Result<WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>, (http::StatusCode, String)> {
    let gateway = |message: String| (http::StatusCode::BAD_GATEWAY, message);
    let key = tokio_tungstenite::tungstenite::handshake::client::generate_key();
    let request = http::Request::get(member_exec_path(namespace, pod, container, options))
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_VERSION, "13")
        .header(http::header::SEC_WEBSOCKET_KEY, &key)
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(kube::client::Body::empty())
        .map_err(|e| gateway(format!("build the exec request: {e}")))?;
    let mut response = pods
        .member()
        .send(request)
        .await
        .map_err(|e| gateway(format!("the member API did not answer the exec: {e}")))?;
    let status = response.status();
    if status != http::StatusCode::SWITCHING_PROTOCOLS {
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let code = if status.is_client_error() || status.is_server_error() {
            status
        } else {
            http::StatusCode::BAD_GATEWAY
        };
        return Err((code, refusal_message(&body)));
    }
    let expected = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let headers = response.headers();
    if headers
        .get(http::header::SEC_WEBSOCKET_ACCEPT)
        .is_none_or(|accept| accept.as_bytes() != expected.as_bytes())
    {
        return Err(gateway(
            "the member API's exec upgrade has a wrong Sec-WebSocket-Accept".into(),
        ));
    }
    if headers
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .is_none_or(|chosen| chosen.as_bytes() != protocol.as_bytes())
    {
        return Err(gateway(format!(
            "the member API does not speak {protocol} for exec"
        )));
    }
    let upgraded = hyper::upgrade::on(&mut response)
        .await
        .map_err(|e| gateway(format!("the member API's exec upgrade failed: {e}")))?;
    Ok(
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(ws_config()))
            .await,
    )
}

/// Copy messages between `client` and `member` until one side ends (see the module
/// documentation).
async fn relay<C, M>(
    mut client: WebSocketStream<C>,
    mut member: WebSocketStream<M>,
    shutdown: CancellationToken,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    M: AsyncRead + AsyncWrite + Unpin,
{
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            message = client.next() => match message {
                Some(Ok(message @ Message::Binary(_))) => {
                    if member.send(message).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
            message = member.next() => match message {
                Some(Ok(message @ Message::Binary(_))) => {
                    if client.send(message).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        let _ = futures::join!(client.close(None), member.close(None));
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_member_url_carries_the_command_and_the_container() {
        let options = ExecOptions {
            command: vec!["sh".into(), "-c".into(), "echo a b".into()],
            stdin: true,
            ..ExecOptions::default()
        };
        let path = member_exec_path("w", "job-0", "side car", &options);
        assert_eq!(
            path,
            "/api/v1/namespaces/w/pods/job-0/exec?command=sh&command=-c&command=echo%20a%20b\
             &stdin=true&stdout=true&stderr=true&tty=false&container=side%20car"
        );
        let query = path.split_once('?').unwrap().1;
        assert_eq!(ExecOptions::parse(Some(query)).unwrap(), options);
    }

    #[test]
    fn refusals_keep_the_member_message() {
        let status =
            br#"{"kind":"Status","code":400,"message":"container \"main\" is not running"}"#;
        assert_eq!(refusal_message(status), "container \"main\" is not running");
        assert_eq!(refusal_message(b"upstream down\n"), "upstream down");
    }
}
