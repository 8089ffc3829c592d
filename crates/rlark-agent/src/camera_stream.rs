//! `GET /v1/cameras/{id}/stream?fps=N` on the agent's local API: the live view of a camera
//! of the host's embodied runtime (`--embodied-socket-dir`), as MJPEG
//! (`multipart/x-mixed-replace`, one JPEG per part), which a browser shows in an `<img>`.
//!
//! The frames come from the runtime's `WatchFrames` (JPEG, encoded by the runtime at most
//! once per frame whoever asks); at most `fps` frames a second are sent (default
//! [`DEFAULT_FPS`], 1..=[`MAX_FPS`]), later ones dropped, so a slow viewer never queues.
//! The stream ends when the camera's stream ends (closed), the client leaves or the agent
//! stops. The camera must be open (`rlark camera open ID`): viewing does not change a
//! device's state.
//!
//! Beside the stream, for the console's Devices page: `GET /v1/cameras` lists the cameras
//! (`{"items": [{"id", "name", "type", "state", "width", "height", "fps"}]}`, `state`
//! `OPEN`, `CLOSED` or `ERROR`), and `POST /v1/cameras/{id}/open` (the camera's configured
//! size, rate and encoding) and `.../close` open and close one, answering it as listed.
//! `GET /v1/cameras?watch=1` sends that list as one JSON line (`application/x-ndjson`) at
//! once and again whenever a camera opens, closes, fails or recovers (the runtime's
//! `WatchCameras`), until the client goes; a line `{"error": "..."}` ends it when the
//! runtime ends its watch.
//!
//! Errors are plain text: `404` no embodied runtime on this agent, no camera socket or no
//! such camera; `409` the camera is not open; `400` a bad id or `fps`; `405` another
//! method; `502` the runtime failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Bytes, Frame};
use rlark_proto::camera::v1::camera_controller_client::CameraControllerClient;
use rlark_proto::camera::v1::{
    CameraDescriptor, CameraState, CloseCameraRequest, ListCamerasRequest, OpenCameraRequest,
    WatchCamerasRequest, WatchFramesRequest,
};
use rlark_proto::sockets::CAMERA_SOCKET;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api_body::{ApiBody, text_response};

/// Prefix of the route.
pub const CAMERA_PREFIX: &str = "/v1/cameras/";
/// Frames a second when the request does not say.
pub const DEFAULT_FPS: u32 = 5;
/// Most frames a second a viewer may ask for.
pub const MAX_FPS: u32 = 30;
/// The multipart boundary.
pub const BOUNDARY: &str = boundary!();

/// The boundary as a literal, for [`BOUNDARY`] and the constant content type.
macro_rules! boundary {
    () => {
        "rlarkframe"
    };
}
use boundary;

/// The stream's content type, naming [`BOUNDARY`].
const MJPEG_CONTENT_TYPE: &str = concat!("multipart/x-mixed-replace; boundary=", boundary!());
/// How long connecting to the runtime and starting the watch may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `(camera id, fps)` of a request for `path` with `query`, or why it is refused.
pub fn parse_request(path: &str, query: Option<&str>) -> Result<(String, u32), (u16, String)> {
    let rest = path.strip_prefix(CAMERA_PREFIX).unwrap_or_default();
    let Some(id) = rest.strip_suffix("/stream") else {
        return Err((
            404,
            format!("not found: {path}; use GET {CAMERA_PREFIX}{{id}}/stream"),
        ));
    };
    if !valid_id(id) {
        return Err((
            400,
            format!("invalid camera id {id:?}: 1 to 63 letters, digits, '-', '_' or '.'"),
        ));
    }
    let mut fps = DEFAULT_FPS;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "fps" => {
                fps = value
                    .parse::<u32>()
                    .ok()
                    .filter(|f| (1..=MAX_FPS).contains(f))
                    .ok_or_else(|| {
                        (
                            400,
                            format!("fps={value}: expected a whole number from 1 to {MAX_FPS}"),
                        )
                    })?;
            }
            other => return Err((400, format!("unknown parameter {other:?}; expected fps"))),
        }
    }
    Ok((id.to_string(), fps))
}

/// One part of the multipart stream: headers and the JPEG.
pub fn part(jpeg: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(jpeg.len() + 96);
    out.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\n\r\n",
            jpeg.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(jpeg);
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// The list route.
pub const CAMERAS_PATH: &str = "/v1/cameras";

/// Whether `path` is one of the camera routes.
pub fn is_camera_path(path: &str) -> bool {
    path == CAMERAS_PATH || path.starts_with(CAMERA_PREFIX)
}

/// `open` or `close` with the camera id of `path` (`/v1/cameras/{id}/open`), if it is one.
pub fn control_request(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(CAMERA_PREFIX)?;
    let (id, action) = rest.split_once('/')?;
    matches!(action, "open" | "close").then_some((id, action))
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn camera_json(camera: &CameraDescriptor) -> serde_json::Value {
    let state = CameraState::try_from(camera.state)
        .unwrap_or(CameraState::Unspecified)
        .as_str_name()
        .trim_start_matches("CAMERA_STATE_")
        .to_string();
    serde_json::json!({
        "id": camera.camera_id,
        "name": camera.name,
        "type": camera.camera_type,
        "state": state,
        "width": camera.width,
        "height": camera.height,
        "fps": camera.fps,
    })
}

fn json_response(value: &serde_json::Value) -> http::Response<ApiBody> {
    let body = http_body_util::Full::new(Bytes::from(value.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = http::Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn rpc_status(status: &tonic::Status) -> http::StatusCode {
    match status.code() {
        tonic::Code::NotFound => http::StatusCode::NOT_FOUND,
        tonic::Code::FailedPrecondition => http::StatusCode::CONFLICT,
        tonic::Code::InvalidArgument => http::StatusCode::BAD_REQUEST,
        _ => http::StatusCode::BAD_GATEWAY,
    }
}

/// `GET /v1/cameras`, `POST /v1/cameras/{id}/{open,close}` on the runtime at `socket`.
async fn control(
    socket: &Path,
    action: Option<(&str, &str)>,
) -> Result<serde_json::Value, (http::StatusCode, String)> {
    let channel = rlark_proto::client::connect(socket)
        .await
        .map_err(|e| (http::StatusCode::BAD_GATEWAY, e.to_string()))?;
    let mut client = CameraControllerClient::new(channel);
    if let Some((id, action)) = action {
        let done = if action == "open" {
            client
                .open_camera(OpenCameraRequest {
                    camera_id: id.to_string(),
                    ..OpenCameraRequest::default()
                })
                .await
                .map(|_| ())
        } else {
            client
                .close_camera(CloseCameraRequest {
                    camera_id: id.to_string(),
                })
                .await
                .map(|_| ())
        };
        done.map_err(|s| {
            (
                rpc_status(&s),
                format!("{action} camera {id}: {}", s.message()),
            )
        })?;
        tracing::info!(camera = %id, action, "camera action from the control plane");
    }
    let cameras = client
        .list_cameras(ListCamerasRequest::default())
        .await
        .map_err(|s| (rpc_status(&s), format!("ListCameras: {}", s.message())))?
        .into_inner()
        .cameras;
    Ok(match action {
        None => serde_json::json!({"items": cameras.iter().map(camera_json).collect::<Vec<_>>()}),
        Some((id, _)) => cameras
            .iter()
            .find(|c| c.camera_id == id)
            .map(camera_json)
            .ok_or_else(|| (http::StatusCode::NOT_FOUND, format!("no camera {id:?}")))?,
    })
}

/// Serve one request (see the module documentation).
pub(crate) async fn handle(
    socket_dir: Option<&PathBuf>,
    shutdown: &CancellationToken,
    method: &http::Method,
    path: &str,
    query: Option<&str>,
) -> http::Response<ApiBody> {
    let action = control_request(path);
    if path == CAMERAS_PATH || action.is_some() {
        let wanted = if action.is_some() {
            http::Method::POST
        } else {
            http::Method::GET
        };
        if method != wanted {
            return text_response(
                http::StatusCode::METHOD_NOT_ALLOWED,
                format!("{method} is not allowed on {path}: use {wanted}"),
            );
        }
        if let Some((id, _)) = action
            && !valid_id(id)
        {
            return text_response(
                http::StatusCode::BAD_REQUEST,
                format!("invalid camera id {id:?}: 1 to 63 letters, digits, '-', '_' or '.'"),
            );
        }
        let Some(dir) = socket_dir else {
            return text_response(
                http::StatusCode::NOT_FOUND,
                "this agent serves no embodied runtime's devices (it runs without --embodied-socket-dir)",
            );
        };
        let socket = dir.join(CAMERA_SOCKET);
        if !socket.exists() {
            return text_response(
                http::StatusCode::NOT_FOUND,
                format!("no camera runtime: {} does not exist", socket.display()),
            );
        }
        if action.is_none() && wants_watch(query) {
            return match tokio::time::timeout(Duration::from_secs(30), watch(&socket)).await {
                Ok(Ok(response)) => response,
                Ok(Err((status, message))) => text_response(status, message),
                Err(_) => text_response(
                    http::StatusCode::BAD_GATEWAY,
                    "the camera runtime did not answer within 30s",
                ),
            };
        }
        return match tokio::time::timeout(Duration::from_secs(30), control(&socket, action)).await {
            Ok(Ok(value)) => json_response(&value),
            Ok(Err((status, message))) => text_response(status, message),
            Err(_) => text_response(
                http::StatusCode::BAD_GATEWAY,
                "the camera runtime did not answer within 30s",
            ),
        };
    }
    if method != http::Method::GET {
        return text_response(
            http::StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} is not allowed: use GET"),
        );
    }
    let (id, fps) = match parse_request(path, query) {
        Ok(parsed) => parsed,
        Err((code, message)) => {
            let status = http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_REQUEST);
            return text_response(status, message);
        }
    };
    let Some(dir) = socket_dir else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            "this agent serves no embodied runtime's devices (it runs without --embodied-socket-dir)",
        );
    };
    stream(&dir.join(CAMERA_SOCKET), id, fps, shutdown).await
}

/// Whether a query asks for a watch (`watch=1` or `watch=true`).
fn wants_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=1" || pair == "watch=true")
}

/// `GET /v1/cameras?watch=1`: the cameras as one JSON line, now and after every change.
async fn watch(socket: &Path) -> Result<http::Response<ApiBody>, (http::StatusCode, String)> {
    use futures::StreamExt as _;
    let channel = rlark_proto::client::connect(socket)
        .await
        .map_err(|e| (http::StatusCode::BAD_GATEWAY, e.to_string()))?;
    let mut lists = CameraControllerClient::new(channel)
        .watch_cameras(WatchCamerasRequest {})
        .await
        .map_err(|status| {
            (
                http::StatusCode::BAD_GATEWAY,
                format!("WatchCameras: {}", status.message()),
            )
        })?
        .into_inner();
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        loop {
            let item = tokio::select! {
                () = tx.closed() => break,
                item = lists.next() => item,
            };
            let line = match item {
                Some(Ok(list)) => {
                    let cameras: Vec<serde_json::Value> =
                        list.cameras.iter().map(camera_json).collect();
                    serde_json::json!({ "items": cameras })
                }
                Some(Err(status)) => {
                    serde_json::json!({ "error": format!("WatchCameras: {}", status.message()) })
                }
                None => serde_json::json!({ "error": "the camera runtime ended the watch" }),
            };
            let last = line.get("error").is_some();
            if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() || last {
                break;
            }
        }
    });
    let body = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|line| line.map(|l| Ok::<_, std::io::Error>(Frame::data(l))))
    });
    let mut response = http::Response::new(StreamBody::new(body).boxed_unsync());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/x-ndjson"),
    );
    response.headers_mut().insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    Ok(response)
}

async fn stream(
    socket: &Path,
    id: String,
    fps: u32,
    shutdown: &CancellationToken,
) -> http::Response<ApiBody> {
    if !socket.exists() {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("no camera runtime: {} does not exist", socket.display()),
        );
    }
    let start = async {
        let channel = rlark_proto::client::connect(socket)
            .await
            .map_err(|e| (http::StatusCode::BAD_GATEWAY, e.to_string()))?;
        CameraControllerClient::new(channel)
            .watch_frames(WatchFramesRequest {
                camera_id: id.clone(),
                encoding: Some("jpeg".to_string()),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| {
                let code = match status.code() {
                    tonic::Code::NotFound => http::StatusCode::NOT_FOUND,
                    tonic::Code::FailedPrecondition => http::StatusCode::CONFLICT,
                    tonic::Code::InvalidArgument => http::StatusCode::BAD_REQUEST,
                    _ => http::StatusCode::BAD_GATEWAY,
                };
                let hint = if code == http::StatusCode::CONFLICT {
                    format!(" (open it with `rlark camera open {id}`)")
                } else {
                    String::new()
                };
                (code, format!("camera {id}: {}{hint}", status.message()))
            })
    };
    let mut frames = match tokio::time::timeout(CONNECT_TIMEOUT, start).await {
        Ok(Ok(frames)) => frames,
        Ok(Err((code, message))) => return text_response(code, message),
        Err(_) => {
            return text_response(
                http::StatusCode::BAD_GATEWAY,
                format!("camera {id}: the runtime did not answer within {CONNECT_TIMEOUT:?}"),
            );
        }
    };
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(2);
    let shutdown = shutdown.clone();
    let interval = Duration::from_secs(1) / fps;
    tokio::spawn(async move {
        let mut last: Option<tokio::time::Instant> = None;
        let mut sent = 0u64;
        loop {
            let frame = tokio::select! {
                () = shutdown.cancelled() => break,
                () = tx.closed() => break,
                frame = frames.message() => frame,
            };
            match frame {
                Ok(Some(frame)) => {
                    let now = tokio::time::Instant::now();
                    if last.is_some_and(|at| now.duration_since(at) < interval) {
                        continue;
                    }
                    last = Some(now);
                    if tx.send(Ok(part(&frame.data))).await.is_err() {
                        break;
                    }
                    sent += 1;
                }
                Ok(None) => break,
                Err(status) => {
                    tracing::debug!(camera = %id, error = %status.message(), "camera stream ended");
                    break;
                }
            }
        }
        tracing::debug!(camera = %id, frames = sent, "camera view ended");
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        Some((item.map(Frame::data), rx))
    });
    let mut response = http::Response::new(StreamBody::new(body).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(MJPEG_CONTENT_TYPE),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_a_camera_and_a_rate() {
        assert_eq!(
            parse_request("/v1/cameras/cam-0/stream", None),
            Ok(("cam-0".to_string(), DEFAULT_FPS))
        );
        assert_eq!(
            parse_request("/v1/cameras/cam.1/stream", Some("fps=12")),
            Ok(("cam.1".to_string(), 12))
        );
        for (path, query, code) in [
            ("/v1/cameras/cam-0", None, 404),
            ("/v1/cameras//stream", None, 400),
            ("/v1/cameras/a b/stream", None, 400),
            ("/v1/cameras/cam-0/stream", Some("fps=0"), 400),
            ("/v1/cameras/cam-0/stream", Some("fps=31"), 400),
            ("/v1/cameras/cam-0/stream", Some("fps=x"), 400),
            ("/v1/cameras/cam-0/stream", Some("size=big"), 400),
        ] {
            let error = parse_request(path, query).unwrap_err();
            assert_eq!(error.0, code, "{path} {query:?}: {}", error.1);
        }
    }

    #[test]
    fn parts_carry_their_length() {
        let part = part(b"JPEG");
        assert_eq!(
            &part[..],
            b"--rlarkframe\r\nContent-Type: image/jpeg\r\nContent-Length: 4\r\n\r\nJPEG\r\n"
        );
    }

    #[tokio::test]
    async fn an_agent_without_embodied_runtime_or_camera_socket_says_so() {
        let stop = CancellationToken::new();
        let get = http::Method::GET;
        let response = handle(None, &stop, &get, "/v1/cameras/cam-0/stream", None).await;
        assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let response = handle(Some(&path), &stop, &get, "/v1/cameras/cam-0/stream", None).await;
        assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("camera-ctrl.sock"),
            "{body:?}"
        );
        let post = http::Method::POST;
        let response = handle(Some(&path), &stop, &post, "/v1/cameras/cam-0/stream", None).await;
        assert_eq!(response.status(), http::StatusCode::METHOD_NOT_ALLOWED);
        // The control routes: method, id, then the runtime.
        let response = handle(Some(&path), &stop, &get, "/v1/cameras/cam-0/open", None).await;
        assert_eq!(response.status(), http::StatusCode::METHOD_NOT_ALLOWED);
        let response = handle(Some(&path), &stop, &post, "/v1/cameras/a b/open", None).await;
        assert_eq!(response.status(), http::StatusCode::BAD_REQUEST);
        let response = handle(Some(&path), &stop, &get, "/v1/cameras", None).await;
        assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
        assert!(is_camera_path("/v1/cameras") && is_camera_path("/v1/cameras/x/close"));
        assert!(!is_camera_path("/v1/camerasx"));
        assert_eq!(control_request("/v1/cameras/c/close"), Some(("c", "close")));
        assert_eq!(control_request("/v1/cameras/c/stream"), None);
    }

    #[tokio::test]
    async fn a_real_runtime_s_cameras_are_watched() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let shutdown = CancellationToken::new();
        let config = rlark_embodied::EmbodiedConfig::from_yaml(
            "cameras:\n  - {id: cam-0, driver: sim, width: 64, height: 48, fps: 10, encoding: jpeg}\n",
        )
        .unwrap();
        let running = rlark_embodied::serve(config, &run, shutdown.clone())
            .await
            .unwrap();
        let get = http::Method::GET;
        let watched = handle(Some(&run), &shutdown, &get, "/v1/cameras", Some("watch=1")).await;
        assert_eq!(watched.status(), http::StatusCode::OK);
        assert_eq!(
            watched.headers()[http::header::CONTENT_TYPE],
            "application/x-ndjson"
        );
        let mut body = watched.into_body();
        let mut pending = Vec::new();
        let mut next_state = async || -> String {
            loop {
                if let Some(end) = pending.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    let value: serde_json::Value = serde_json::from_slice(&line).unwrap();
                    return value["items"][0]["state"].as_str().unwrap().to_string();
                }
                let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                    .await
                    .expect("a line within 10 s")
                    .expect("the stream goes on")
                    .unwrap();
                if let Ok(data) = frame.into_data() {
                    pending.extend_from_slice(&data);
                }
            }
        };
        assert_eq!(next_state().await, "CLOSED");
        let opened = handle(
            Some(&run),
            &shutdown,
            &http::Method::POST,
            "/v1/cameras/cam-0/open",
            None,
        )
        .await;
        assert_eq!(opened.status(), http::StatusCode::OK);
        assert_eq!(next_state().await, "OPEN");
        shutdown.cancel();
        running.wait().await.unwrap();
    }
}
