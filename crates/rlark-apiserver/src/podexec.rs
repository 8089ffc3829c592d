//! `GET /api/v1/namespaces/{ns}/pods/{name}/exec` of core Pods stored as objects (an extra
//! kind, [`crate::pod_sources`]): the server checks the request as kube-apiserver does
//! (options, the Pod, the container, that it runs), then upgrades to a WebSocket speaking
//! Kubernetes' remotecommand protocol (`v5.channel.k8s.io` or `v4.channel.k8s.io`) and runs
//! the process the configured [`PodExecSource`](crate::pod_sources::PodExecSource) prepares:
//!
//! - channel 0 feeds its stdin (with `stdin=true`; a v5 close of channel 0 closes it);
//! - its stdout and stderr go out on channels 1 and 2 (each only when asked for);
//! - resize messages (channel 4) are accepted and ignored: there is no terminal, and
//!   `tty=true` is refused before the upgrade (`400`);
//! - when it exits, the rest of its output, then the status on channel 3 (`Success`, or
//!   `NonZeroExitCode` with the code as the `ExitCode` cause; a signal `n` is `128+n`), then
//!   a normal close;
//! - when the client goes away or the server stops, it is killed.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use futures::{SinkExt as _, StreamExt as _};
use http::request::Parts;
use http::{HeaderValue, StatusCode};
use hyper_util::rt::TokioIo;
use rlark_api::agent::local::{
    Channel, ExecOptions, ExecOutcome, MAX_EXEC_MESSAGE, decode_frame, encode_frame, exec_upgrade,
    percent_decode,
};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use crate::Inner;
use crate::error::ApiError;
use crate::object::key;
use crate::pod_sources::{PodExecRequest, PodLogError};
use crate::podlog::names;
use crate::request::Target;

/// Largest piece of output sent in one message.
const CHUNK: usize = 32 * 1024;
/// How long output is still read once the process has exited.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The `container` parameter, percent-decoded.
fn container_param(query: Option<&str>) -> Result<Option<String>, ApiError> {
    for pair in query.unwrap_or_default().split('&') {
        if let Some(value) = pair.strip_prefix("container=") {
            return percent_decode(value)
                .map(Some)
                .map_err(|e| ApiError::bad_request(format!("container {value:?}: {e}")));
        }
    }
    Ok(None)
}

/// The container an exec runs in (the named one, or the only one) and a check that it is
/// running, worded as kube-apiserver and the kubelet word their refusals.
fn running_container(pod: &Value, pod_name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let containers = names(pod, "containers");
    let container = match asked {
        Some(name) if containers.iter().any(|c| c == name) => name.to_string(),
        Some(name) => {
            return Err(ApiError::bad_request(format!(
                "container {name} is not valid for pod {pod_name}"
            )));
        }
        None if containers.len() == 1 => containers[0].clone(),
        None if containers.is_empty() => {
            return Err(ApiError::bad_request(format!(
                "pod {pod_name} has no containers"
            )));
        }
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod_name}, choose one of: [{}]",
                containers.join(" ")
            )));
        }
    };
    let running = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|s| s.get("name").and_then(Value::as_str) == Some(container.as_str()))
        .any(|s| s.pointer("/state/running").is_some());
    if !running {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade connection: container {container:?} in pod {pod_name:?} is not \
             running"
        )));
    }
    Ok(container)
}

/// Serve one exec request for `target` (a core Pod with `Subresource::Exec`).
pub(crate) async fn serve(
    inner: &Arc<Inner>,
    target: &Target,
    parts: &Parts,
) -> Result<Response, ApiError> {
    let Some(source) = inner.options.pod_sources.exec.clone() else {
        return Err(ApiError::path_not_found(
            "the server could not find the requested resource",
        ));
    };
    if parts.method != http::Method::GET {
        return Err(ApiError::method_not_allowed(format!(
            "{} is not allowed: exec is GET with a WebSocket upgrade (SPDY is not served)",
            parts.method
        )));
    }
    let query = parts.uri.query();
    let options = ExecOptions::parse(query).map_err(ApiError::bad_request)?;
    if options.tty {
        return Err(ApiError::bad_request(
            "tty=true: exec into a stored Pod runs without a terminal",
        ));
    }
    let asked = container_param(query)?;
    let upgrade = exec_upgrade(&parts.headers).map_err(ApiError::bad_request)?;
    let rt = &target.rt;
    let namespace = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let pod = inner
        .store
        .get(&key(rt, &namespace, &name))
        .await
        .map_err(|e| ApiError::from_store(e, rt, &name))?
        .ok_or_else(|| ApiError::not_found(rt, &name))?;
    let container = running_container(&pod, &name, asked.as_deref())?;
    let request = PodExecRequest {
        namespace,
        pod: name,
        container,
        command: options.command.clone(),
    };
    let command = source.command(&request).map_err(|error| match error {
        PodLogError::BadRequest(message) => ApiError::bad_request(message),
        PodLogError::NotFound(message) => ApiError::new(404, "NotFound", message),
    })?;
    let on_upgrade = parts
        .extensions
        .get::<hyper::upgrade::OnUpgrade>()
        .cloned()
        .ok_or_else(|| ApiError::bad_request("this connection cannot be upgraded"))?;
    tracing::info!(namespace = %request.namespace, pod = %request.pod, container = %request.container, command = ?request.command, "stored pod exec");
    let shutdown = inner.shutdown.clone();
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .max_message_size(Some(MAX_EXEC_MESSAGE))
                    .max_frame_size(Some(MAX_EXEC_MESSAGE));
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                session(ws, &options, command, shutdown).await;
            }
            Err(error) => tracing::debug!(%error, "exec upgrade failed"),
        }
    });
    let accept =
        tokio_tungstenite::tungstenite::handshake::derive_accept_key(upgrade.key.as_bytes());
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONNECTION,
        HeaderValue::from_static("Upgrade"),
    );
    headers.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(upgrade.protocol),
    );
    headers.insert(
        http::header::SEC_WEBSOCKET_ACCEPT,
        HeaderValue::from_str(&accept).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    Ok(response)
}

/// Copy `source` to `out` as `channel` messages until end of file.
async fn pump<R: AsyncRead + Unpin>(mut source: R, channel: Channel, out: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match source.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out.send(encode_frame(channel, &buf[..n])).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Run `command` for the client on `ws` (see the module documentation).
async fn session<S>(
    mut ws: WebSocketStream<S>,
    options: &ExecOptions,
    command: std::process::Command,
    shutdown: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let piped = |on: bool| if on { Stdio::piped() } else { Stdio::null() };
    let mut command = tokio::process::Command::from(command);
    command
        .stdin(piped(options.stdin))
        .stdout(piped(options.stdout))
        .stderr(piped(options.stderr))
        .kill_on_drop(true);
    let (out, mut outgoing) = mpsc::channel::<Vec<u8>>(8);
    let gone = CancellationToken::new();
    let mut stdin = None;
    match command.spawn() {
        Err(e) => {
            let outcome = ExecOutcome::Failed {
                reason: "InternalError".into(),
                message: format!("start {:?}: {e}", options.command[0]),
            };
            let _ = out.try_send(encode_frame(Channel::Error, &outcome.to_status()));
        }
        Ok(mut child) => {
            stdin = child.stdin.take();
            let mut readers = Vec::new();
            if let Some(stdout) = child.stdout.take() {
                readers.push(tokio::spawn(pump(stdout, Channel::Stdout, out.clone())));
            }
            if let Some(stderr) = child.stderr.take() {
                readers.push(tokio::spawn(pump(stderr, Channel::Stderr, out.clone())));
            }
            let (out, gone) = (out.clone(), gone.clone());
            tokio::spawn(async move {
                let status = tokio::select! {
                    status = child.wait() => status,
                    () = gone.cancelled() => return,
                };
                let _ =
                    tokio::time::timeout(DRAIN_TIMEOUT, futures::future::join_all(readers)).await;
                let outcome = match status {
                    Ok(status) => {
                        use std::os::unix::process::ExitStatusExt as _;
                        ExecOutcome::Exited(
                            status
                                .code()
                                .or_else(|| status.signal().map(|n| 128 + n))
                                .unwrap_or(-1),
                        )
                    }
                    Err(e) => ExecOutcome::Failed {
                        reason: "InternalError".into(),
                        message: format!("wait for the process: {e}"),
                    },
                };
                let _ = out
                    .send(encode_frame(Channel::Error, &outcome.to_status()))
                    .await;
            });
        }
    }
    // Only the readers and the waiter hold senders now: `outgoing` ends after the status.
    drop(out);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            frame = outgoing.recv() => match frame {
                Some(frame) => {
                    if ws.send(Message::Binary(frame.into())).await.is_err() {
                        break;
                    }
                }
                None => {
                    let _ = tokio::time::timeout(DRAIN_TIMEOUT, ws.close(None)).await;
                    break;
                }
            },
            message = ws.next() => match message {
                Some(Ok(Message::Binary(bytes))) => match decode_frame(&bytes) {
                    Ok((Channel::Stdin, data)) => {
                        if let Some(input) = stdin.as_mut()
                            && input.write_all(data).await.is_err()
                        {
                            stdin = None;
                        }
                    }
                    Ok((Channel::Close, [0])) => stdin = None,
                    Ok(_) => {}
                    Err(error) => tracing::debug!(%error, "exec message ignored"),
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    // The waiter (and with it the child, killed on drop) goes when the client does.
    gone.cancel();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_a_running_container_of_the_spec_is_exec_d_into() {
        let pod = json!({
            "spec": {"containers": [{"name": "main"}, {"name": "side"}]},
            "status": {"containerStatuses": [
                {"name": "main", "state": {"running": {}}},
                {"name": "side", "state": {"waiting": {"reason": "ContainerCreating"}}},
            ]},
        });
        assert_eq!(running_container(&pod, "p", Some("main")).unwrap(), "main");
        let side = running_container(&pod, "p", Some("side")).unwrap_err();
        assert!(side.message.contains("not running"), "{}", side.message);
        assert_eq!(
            running_container(&pod, "p", Some("x")).unwrap_err().code,
            400
        );
        let none = running_container(&pod, "p", None).unwrap_err();
        assert!(
            none.message.contains("choose one of: [main side]"),
            "{}",
            none.message
        );
    }
}
