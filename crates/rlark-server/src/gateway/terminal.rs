//! `GET /api/v1/rlinf.io/v1alpha1/pods/{name}/terminal` (WebSocket): the shell RLark's
//! console opens in a worker, on rlark's exec.
//!
//! **How**: the Pod is found by name (the one `pods.rlinf.io` of that name the caller can
//! list). The gateway then calls rlark's own exec route in process, as the caller —
//! `/rlark/v1/namespaces/{ns}/pods/{name}/exec?command=/bin/sh&stdin=true&tty=true`, the
//! Kubernetes remotecommand protocol (`v4.channel.k8s.io`) — so exec's authorization
//! (admins and the users the Job's `spec.access` grants), audit and agent path apply
//! unchanged. That route's upgraded connection is an in-memory pipe whose other end the
//! gateway speaks as a WebSocket client. Only when exec answered `101` does the gateway
//! accept the browser's WebSocket (exec's refusal otherwise: 403, 404, 400 for a replica
//! that is not running), and then translates, in [`from_browser`] and [`from_agent`]:
//!
//! | browser (RLark's console) | exec (`v4.channel.k8s.io`) |
//! |---|---|
//! | binary message: keystrokes | channel 0 (stdin) |
//! | text `{"type":"resize","rows","cols"}` | channel 4 `{"Width","Height"}` |
//! | text that is not JSON: keystrokes | channel 0 |
//! | text `{"type":"file-upload-*"|"file-download"}` | — (answered `{"type":"error"}`: rlark's gateway has no file transfer) |
//! | binary message: terminal output | channels 1 and 2 |
//! | close 1000 `terminal exited with code N` | channel 3 status (Success: 0; else the `ExitCode` cause) |
//!
//! A cookie-authenticated upgrade must come from this origin (`Origin` naming the `Host`):
//! a WebSocket is not covered by the same-origin policy, so another site's page could
//! otherwise open a shell with the user's cookie.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderValue, Method, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::{Role, frame::coding::CloseCode};
use tower::ServiceExt as _;

use super::Gateway;
use super::error::GatewayError;
use super::forward::Caller;
use crate::security::AuthMethod;

/// The shell RLark's console asks for.
const SHELL: &str = "/bin/sh";
/// The exec subprotocol the gateway speaks to rlark's exec route.
const EXEC_PROTOCOL: &str = "v4.channel.k8s.io";
/// Bytes buffered in the pipe between the gateway and the exec route.
const PIPE_BYTES: usize = 64 * 1024;

/// A WebSocket to rlark's exec route at `path`, as `caller`: the backend router served over
/// an in-memory HTTP/1.1 connection (with upgrades) whose every request carries the
/// caller's identity. Exec's refusal (403, 404, 400...) comes back as
/// [`GatewayError::Upstream`].
async fn exec_in_process(
    gateway: &Gateway,
    caller: &Caller,
    path: &str,
) -> Result<WebSocketStream<tokio::io::DuplexStream>, GatewayError> {
    let (client_end, server_end) = tokio::io::duplex(PIPE_BYTES);
    let router = gateway.backend.router();
    let stamp = caller.clone();
    let service =
        hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
            stamp.stamp(request.extensions_mut());
            let router = router.clone();
            async move { router.oneshot(request.map(Body::new)).await }
        });
    tokio::spawn(async move {
        let connection = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_end), service)
            .with_upgrades();
        if let Err(error) = connection.await {
            tracing::debug!(%error, "the gateway's exec connection ended");
        }
    });
    let mut request = format!("ws://rlark{path}")
        .into_client_request()
        .map_err(|e| GatewayError::Internal(format!("exec request: {e}")))?;
    request.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(EXEC_PROTOCOL),
    );
    match tokio_tungstenite::client_async(request, client_end).await {
        Ok((stream, _)) => Ok(stream),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let status = response.status();
            let body: Value = response
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice(b).ok())
                .unwrap_or(Value::Null);
            Err(GatewayError::Upstream {
                code: status,
                reason: body["reason"].as_str().unwrap_or_default().to_string(),
                message: body["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("exec answered {status}")),
            })
        }
        Err(error) => Err(GatewayError::Internal(format!("exec: {error}"))),
    }
}

/// What a browser message asks of the shell.
#[derive(Debug, PartialEq)]
pub(crate) enum FromBrowser {
    /// Keystrokes (channel 0).
    Stdin(Vec<u8>),
    /// The terminal's new size (channel 4).
    Resize { rows: u16, cols: u16 },
    /// A request the gateway does not serve; answered with this error text.
    Unsupported(String),
    /// Nothing to do (a ping, an empty message).
    Nothing,
}

/// Read one browser message.
pub(crate) fn from_browser(message: &Message) -> FromBrowser {
    match message {
        Message::Binary(data) if data.is_empty() => FromBrowser::Nothing,
        Message::Binary(data) => FromBrowser::Stdin(data.to_vec()),
        Message::Text(text) => {
            let text = text.as_str();
            let Ok(Value::Object(object)) = serde_json::from_str::<Value>(text) else {
                return match text.is_empty() {
                    true => FromBrowser::Nothing,
                    false => FromBrowser::Stdin(text.as_bytes().to_vec()),
                };
            };
            match object.get("type").and_then(Value::as_str) {
                Some("resize") => {
                    let dimension = |key: &str| {
                        object
                            .get(key)
                            .and_then(Value::as_u64)
                            .and_then(|v| u16::try_from(v).ok())
                    };
                    match (dimension("rows"), dimension("cols")) {
                        (Some(rows), Some(cols)) => FromBrowser::Resize { rows, cols },
                        _ => FromBrowser::Unsupported(
                            "a resize message needs whole numbers rows and cols".to_string(),
                        ),
                    }
                }
                Some(other) => FromBrowser::Unsupported(format!(
                    "{other}: rlark's gateway has no file transfer in the terminal (use `rlark \
                     exec` or `rlark ssh` and scp)"
                )),
                None => FromBrowser::Stdin(text.as_bytes().to_vec()),
            }
        }
        _ => FromBrowser::Nothing,
    }
}

/// The exec frame for a browser request (`None` for nothing to send).
pub(crate) fn to_exec(request: &FromBrowser) -> Option<Message> {
    match request {
        FromBrowser::Stdin(data) => {
            let mut frame = Vec::with_capacity(data.len() + 1);
            frame.push(0);
            frame.extend_from_slice(data);
            Some(Message::Binary(frame.into()))
        }
        FromBrowser::Resize { rows, cols } => {
            let mut frame = vec![4];
            frame.extend_from_slice(
                json!({"Width": cols, "Height": rows})
                    .to_string()
                    .as_bytes(),
            );
            Some(Message::Binary(frame.into()))
        }
        FromBrowser::Unsupported(_) | FromBrowser::Nothing => None,
    }
}

/// What an exec frame tells the browser.
#[derive(Debug, PartialEq)]
pub(crate) enum FromExec {
    /// Terminal output (channels 1 and 2).
    Output(Vec<u8>),
    /// The shell ended with this exit code (channel 3).
    Exited(i64),
    /// The shell could not run or ended without a code (channel 3); the status message.
    Failed(String),
    /// Nothing for the browser.
    Nothing,
}

/// Read one exec frame.
pub(crate) fn from_agent(message: &Message) -> FromExec {
    let Message::Binary(data) = message else {
        return FromExec::Nothing;
    };
    let Some((channel, payload)) = data.split_first() else {
        return FromExec::Nothing;
    };
    match channel {
        1 | 2 if !payload.is_empty() => FromExec::Output(payload.to_vec()),
        3 => {
            let status: Value = serde_json::from_slice(payload).unwrap_or(Value::Null);
            if status["status"] == "Success" {
                return FromExec::Exited(0);
            }
            let code = status["details"]["causes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["reason"] == "ExitCode")
                .and_then(|c| c["message"].as_str())
                .and_then(|m| m.trim().parse().ok());
            match code {
                Some(code) => FromExec::Exited(code),
                None => FromExec::Failed(
                    status["message"]
                        .as_str()
                        .unwrap_or("the shell ended without an exit code")
                        .to_string(),
                ),
            }
        }
        _ => FromExec::Nothing,
    }
}

/// The route.
pub(crate) async fn terminal(
    State(gateway): State<Gateway>,
    Path(name): Path<String>,
    mut request: Request,
) -> Response {
    match open(&gateway, &name, &mut request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn open(
    gateway: &Gateway,
    name: &str,
    request: &mut Request,
) -> Result<Response, GatewayError> {
    let caller = Caller::of(request.extensions())?;
    let key = browser_key(request.headers())?;
    if matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Session { .. })
    ) && !same_origin(request.headers())
    {
        return Err(GatewayError::Forbidden(
            "a terminal opened with a session cookie must come from this origin (its Origin \
             header must name this host)"
                .to_string(),
        ));
    }
    super::resources::check_name("pod", name)?;
    let namespace = pod_namespace(gateway, &caller, name).await?;

    // rlark's exec, in process: its router served over an in-memory connection whose
    // requests carry the caller's identity, and a WebSocket client on the other end.
    let path = format!(
        "/rlark/v1/namespaces/{namespace}/pods/{name}/exec?command={}&stdin=true&stdout=true&stderr=true&tty=true",
        rlark_api::agent::local::percent_encode(SHELL)
    );
    let exec_ws = exec_in_process(gateway, &caller, &path).await?;

    let browser_upgrade = hyper::upgrade::on(&mut *request);
    let user = caller.identity.user.clone();
    let pod = format!("{namespace}/{name}");
    tokio::spawn(async move {
        match browser_upgrade.await {
            Ok(upgraded) => {
                let browser =
                    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None)
                        .await;
                relay(browser, exec_ws).await;
                tracing::debug!(%user, %pod, "gateway terminal ended");
            }
            Err(error) => tracing::debug!(%error, "the browser's terminal upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    let accept = HeaderValue::from_str(&derive_accept_key(key.as_bytes()))
        .map_err(|e| GatewayError::Internal(format!("accept key: {e}")))?;
    headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    Ok(response)
}

/// The browser's `Sec-WebSocket-Key`, after checking that it asks for a WebSocket.
fn browser_key(headers: &http::HeaderMap) -> Result<String, GatewayError> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let version = headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    match headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
    {
        Some(key) if upgrade && version => Ok(key.to_string()),
        _ => Err(GatewayError::BadRequest(
            "the terminal is a WebSocket: connect with Upgrade: websocket, \
             Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key"
                .to_string(),
        )),
    }
}

/// Whether the `Origin` header names the `Host` the request came to.
fn same_origin(headers: &http::HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .and_then(|o| o.split_once("://").map(|(_, rest)| rest));
    matches!((host, origin), (Some(host), Some(origin)) if host.eq_ignore_ascii_case(origin))
}

/// The namespace of the one Pod named `name` the caller can list.
async fn pod_namespace(
    gateway: &Gateway,
    caller: &Caller,
    name: &str,
) -> Result<String, GatewayError> {
    let list = gateway
        .backend
        .json(
            caller,
            Method::GET,
            &format!("/apis/rlinf.io/v1alpha1/pods?fieldSelector=metadata.name%3D{name}"),
            None,
            Body::empty(),
        )
        .await?;
    let namespaces: Vec<String> = list.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["namespace"].as_str().map(str::to_string))
        .collect();
    match namespaces.as_slice() {
        [] => Err(GatewayError::NotFound(format!("pod {name} not found"))),
        [one] => Ok(one.clone()),
        several => Err(GatewayError::BadRequest(format!(
            "pod name {name} is in several namespaces ({}); use rlark exec -n",
            several.join(", ")
        ))),
    }
}

/// Translate between the browser and exec until either side ends.
async fn relay<B, E>(browser: WebSocketStream<B>, exec: WebSocketStream<E>)
where
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    E: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut to_browser, mut from_browser_stream) = browser.split();
    let (mut exec_sink, mut from_exec_stream) = exec.split();
    loop {
        tokio::select! {
            message = from_browser_stream.next() => {
                let Some(Ok(message)) = message else {
                    let _ = exec_sink.close().await;
                    return;
                };
                if matches!(message, Message::Close(_)) {
                    let _ = exec_sink.close().await;
                    return;
                }
                let request = from_browser(&message);
                if let FromBrowser::Unsupported(text) = &request {
                    let error = json!({"type": "error", "message": text}).to_string();
                    if to_browser.send(Message::Text(error.into())).await.is_err() {
                        return;
                    }
                }
                if let Some(frame) = to_exec(&request)
                    && exec_sink.send(frame).await.is_err()
                {
                    let _ = to_browser.close().await;
                    return;
                }
            }
            message = from_exec_stream.next() => {
                let Some(Ok(message)) = message else {
                    let _ = to_browser
                        .send(close(CloseCode::Away, "the shell's connection ended"))
                        .await;
                    return;
                };
                match from_agent(&message) {
                    FromExec::Output(data) => {
                        if to_browser.send(Message::Binary(data.into())).await.is_err() {
                            let _ = exec_sink.close().await;
                            return;
                        }
                    }
                    FromExec::Exited(code) => {
                        let reason = format!("terminal exited with code {code}");
                        let _ = to_browser.send(close(CloseCode::Normal, &reason)).await;
                        let _ = exec_sink.close().await;
                        return;
                    }
                    FromExec::Failed(text) => {
                        let error = json!({"type": "error", "message": text}).to_string();
                        let _ = to_browser.send(Message::Text(error.into())).await;
                        let _ = to_browser.send(close(CloseCode::Error, "the shell failed")).await;
                        let _ = exec_sink.close().await;
                        return;
                    }
                    FromExec::Nothing => {
                        if matches!(message, Message::Close(_)) {
                            let _ = to_browser
                                .send(close(CloseCode::Normal, "the shell's connection closed"))
                                .await;
                            return;
                        }
                    }
                }
            }
        }
    }
}

fn close(code: CloseCode, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.to_string().into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn browser_messages_become_exec_frames() {
        let keys = from_browser(&Message::Binary(b"ls\r".to_vec().into()));
        assert_eq!(keys, FromBrowser::Stdin(b"ls\r".to_vec()));
        assert_eq!(
            to_exec(&keys),
            Some(Message::Binary(b"\0ls\r".to_vec().into()))
        );
        let resize = from_browser(&Message::Text(
            r#"{"type":"resize","rows":30,"cols":100}"#.into(),
        ));
        assert_eq!(
            resize,
            FromBrowser::Resize {
                rows: 30,
                cols: 100
            }
        );
        let Some(Message::Binary(frame)) = to_exec(&resize) else {
            panic!("a resize frame");
        };
        assert_eq!(frame[0], 4);
        let size: Value = serde_json::from_slice(&frame[1..]).expect("json");
        assert_eq!(size, json!({"Width": 100, "Height": 30}));
        assert_eq!(
            from_browser(&Message::Text("echo hi\r".into())),
            FromBrowser::Stdin(b"echo hi\r".to_vec())
        );
        let upload = from_browser(&Message::Text(
            r#"{"type":"file-upload-start","name":"a"}"#.into(),
        ));
        assert!(
            matches!(&upload, FromBrowser::Unsupported(t) if t.contains("no file transfer")),
            "{upload:?}"
        );
        assert_eq!(to_exec(&upload), None);
        let bad = from_browser(&Message::Text(
            r#"{"type":"resize","rows":-1,"cols":2}"#.into(),
        ));
        assert!(matches!(bad, FromBrowser::Unsupported(_)));
        assert_eq!(
            from_browser(&Message::Binary(Vec::new().into())),
            FromBrowser::Nothing
        );
    }

    #[test]
    fn exec_frames_become_output_and_an_exit() {
        assert_eq!(
            from_agent(&Message::Binary(b"\x01hello".to_vec().into())),
            FromExec::Output(b"hello".to_vec())
        );
        assert_eq!(
            from_agent(&Message::Binary(b"\x02oops".to_vec().into())),
            FromExec::Output(b"oops".to_vec())
        );
        let mut success = vec![3];
        success.extend_from_slice(br#"{"metadata":{},"status":"Success"}"#);
        assert_eq!(
            from_agent(&Message::Binary(success.into())),
            FromExec::Exited(0)
        );
        let mut failure = vec![3];
        failure.extend_from_slice(
            br#"{"status":"Failure","reason":"NonZeroExitCode","message":"command terminated with non-zero exit code","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}"#,
        );
        assert_eq!(
            from_agent(&Message::Binary(failure.into())),
            FromExec::Exited(7)
        );
        let mut broken = vec![3];
        broken.extend_from_slice(br#"{"status":"Failure","message":"no such file: /bin/sh"}"#);
        assert_eq!(
            from_agent(&Message::Binary(broken.into())),
            FromExec::Failed("no such file: /bin/sh".to_string())
        );
        assert_eq!(from_agent(&Message::Text("x".into())), FromExec::Nothing);
        assert_eq!(
            from_agent(&Message::Binary(Vec::new().into())),
            FromExec::Nothing
        );
    }

    #[test]
    fn a_cookie_terminal_must_name_this_host_as_its_origin() {
        let headers = |origin: Option<&str>| {
            let mut h = http::HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8443"));
            if let Some(o) = origin {
                h.insert(header::ORIGIN, HeaderValue::from_str(o).expect("origin"));
            }
            h
        };
        assert!(same_origin(&headers(Some("https://127.0.0.1:8443"))));
        assert!(!same_origin(&headers(Some("https://evil.example"))));
        assert!(!same_origin(&headers(None)));
        let mut h = headers(None);
        assert!(browser_key(&h).is_err());
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        h.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        assert_eq!(browser_key(&h).expect("key"), "dGhlIHNhbXBsZSBub25jZQ==");
    }
}
