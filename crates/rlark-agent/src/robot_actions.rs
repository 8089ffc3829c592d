//! The robots of the host's embodied runtime (`--embodied-socket-dir`) on the agent's local
//! API, for the web console's Devices page (relayed by the server, which authorizes):
//!
//! - `GET /v1/robots`: every robot of every robot controller socket present
//!   (`ros-ctrl.sock`, `ros2-ctrl.sock`) as JSON `{"items": [{"id", "type", "backend",
//!   "state", "mode", "message", "ownerPid"}]}`;
//! - `POST /v1/robots/{id}/start` (body `{"mode": "M", "args": {"NAME": "VALUE"}}`, both
//!   optional: the type's default mode; `args` as `rlark robot start --arg NAME=VALUE`; or
//!   a custom launch instead of a mode, `{"package": "P", "launchFile": "F", "args": ...}`,
//!   which the runtime allows for its `allowedLaunchPackages` only),
//!   `.../stop`, `.../switch` (body `{"mode": "M", "args": {...}}`, mode required),
//!   `.../reset`: the RPC of that name on the
//!   socket that serves the robot; answers the robot as in the list. Robots started here are
//!   detached (no owner), like `rlark robot start`: stop them with `stop`;
//! - `GET /v1/robots?watch=1`: the same list as one JSON line (`application/x-ndjson`) now
//!   and again after every change of a robot's state (the runtime's `WatchRobots` on every
//!   socket), until the client goes; a runtime that ends its watch ends the stream with a
//!   line `{"error": "..."}`;
//! - `GET /v1/robots/{id}/logs`: the robot's recent output (launch processes, controller
//!   notes), oldest first, at most [`LOG_LINES`]: `{"robotId", "lines": [...]}`;
//! - `GET /v1/robots/{id}/modes`: the modes it can start in, with their launch files:
//!   `{"robotId", "modes": [{"name", "package", "launchFile", "args": {...}}]}`.
//!
//! Errors are plain text: `403` a custom launch from a package the runtime does not allow;
//! `404` no embodied runtime, no robot socket or no such robot;
//! `409` the action does not fit the robot's state (FailedPrecondition); `400` a bad id,
//! action or body; `405` another method; `502` the runtime failed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use rlark_proto::robot::v1 as pb;
use rlark_proto::robot::v1::robot_controller_client::RobotControllerClient;
use rlark_proto::sockets::{ROS_SOCKET, ROS2_SOCKET};
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::api_body::{ApiBody, text_response};

/// Prefix of the routes.
pub const ROBOTS_PREFIX: &str = "/v1/robots";
/// Largest request body.
const MAX_BODY: usize = 16 * 1024;
/// Most log lines `GET .../logs` answers (the runtime keeps its own bounded ring).
pub const LOG_LINES: i32 = 1000;
/// How long one call to the runtime may take (a start waits for the launch).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A refused request: HTTP status and message.
type Refusal = (http::StatusCode, String);

/// Whether `path` is one of these routes.
pub fn is_robot_path(path: &str) -> bool {
    path == ROBOTS_PREFIX
        || path
            .strip_prefix(ROBOTS_PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum RobotRequest {
    List,
    Action { id: String, action: Action },
    Read { id: String, read: Read },
}

/// A read about one robot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    /// Its recent output.
    Logs,
    /// Its modes and their launch files.
    Modes,
}

/// A robot action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Start,
    Stop,
    Switch,
    Reset,
}

/// Parse the method and path of a request under [`ROBOTS_PREFIX`].
pub fn parse(method: &http::Method, path: &str) -> Result<RobotRequest, (u16, String)> {
    let rest = path.strip_prefix(ROBOTS_PREFIX).unwrap_or_default();
    if rest.is_empty() || rest == "/" {
        if method != http::Method::GET {
            return Err((405, format!("{method} is not allowed on {path}: use GET")));
        }
        return Ok(RobotRequest::List);
    }
    let Some((id, action)) = rest
        .strip_prefix('/')
        .and_then(|r| r.split_once('/'))
        .filter(|(_, a)| !a.contains('/'))
    else {
        return Err((
            404,
            format!(
                "not found: {path}; use GET {ROBOTS_PREFIX}, GET {ROBOTS_PREFIX}/{{id}}/{{logs|modes}} or POST {ROBOTS_PREFIX}/{{id}}/{{start|stop|switch|reset}}"
            ),
        ));
    };
    let valid = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !valid {
        return Err((
            400,
            format!("invalid robot id {id:?}: 1 to 63 letters, digits, '-', '_' or '.'"),
        ));
    }
    let read = match action {
        "logs" => Some(Read::Logs),
        "modes" => Some(Read::Modes),
        _ => None,
    };
    if let Some(read) = read {
        if method != http::Method::GET {
            return Err((405, format!("{method} is not allowed on {path}: use GET")));
        }
        return Ok(RobotRequest::Read {
            id: id.to_string(),
            read,
        });
    }
    let action = match action {
        "start" => Action::Start,
        "stop" => Action::Stop,
        "switch" => Action::Switch,
        "reset" => Action::Reset,
        other => {
            return Err((
                400,
                format!(
                    "unknown robot action {other:?}; expected start, stop, switch or reset \
                     (POST), or logs or modes (GET)"
                ),
            ));
        }
    };
    if method != http::Method::POST {
        return Err((405, format!("{method} is not allowed on {path}: use POST")));
    }
    Ok(RobotRequest::Action {
        id: id.to_string(),
        action,
    })
}

/// What an action's JSON body asks for: a mode (or a custom launch: package and launch
/// file) and launch arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ActionBody {
    pub mode: Option<String>,
    pub package: Option<String>,
    pub launch_file: Option<String>,
    pub args: std::collections::BTreeMap<String, String>,
}

/// Parse an action's JSON body (an empty body: nothing asked).
pub fn parse_body(body: &[u8]) -> Result<ActionBody, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ActionBody::default());
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    let Some(object) = value.as_object() else {
        return Err("the body must be a JSON object like {\"mode\": \"teleop\"}".into());
    };
    const FIELDS: [&str; 4] = ["mode", "package", "launchFile", "args"];
    if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {unknown:?}; expected mode, package, launchFile and args"
        ));
    }
    let text = |field: &str| match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.is_empty() => Ok(Some(text.clone())),
        Some(_) => Err(format!("{field} must be a non-empty string")),
    };
    let mode = text("mode")?;
    let package = text("package")?;
    let launch_file = text("launchFile")?;
    if mode.is_some() && package.is_some() {
        return Err("give a mode or a custom launch (package and launchFile), not both".into());
    }
    if package.is_some() != launch_file.is_some() {
        return Err("a custom launch needs both package and launchFile".into());
    }
    let mut args = std::collections::BTreeMap::new();
    match object.get("args") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (name, value) in map {
                let Some(value) = value.as_str() else {
                    return Err(format!("args.{name} must be a string"));
                };
                if name.is_empty() {
                    return Err("args has an empty name".into());
                }
                args.insert(name.clone(), value.to_string());
            }
        }
        Some(_) => return Err("args must be an object of strings".into()),
    }
    Ok(ActionBody {
        mode,
        package,
        launch_file,
        args,
    })
}

/// The custom launch and launch arguments as the runtime takes them (none: the mode's own).
fn mode_config(
    package: Option<String>,
    launch_file: Option<String>,
    args: std::collections::BTreeMap<String, String>,
) -> Option<pb::ModeConfig> {
    (package.is_some() || !args.is_empty()).then(|| pb::ModeConfig {
        package: package.unwrap_or_default(),
        launch_file: launch_file.unwrap_or_default(),
        args: args.into_iter().collect(),
        ..Default::default()
    })
}

/// A robot as the list shows it.
fn robot_json(info: &pb::RobotInfo) -> Value {
    let state = pb::RobotState::try_from(info.state)
        .unwrap_or(pb::RobotState::Unspecified)
        .as_str_name()
        .trim_start_matches("ROBOT_STATE_")
        .to_string();
    json!({
        "id": info.robot_id,
        "type": info.robot_type,
        "backend": info.backend,
        "state": state,
        "mode": info.mode,
        "message": info.message,
        "ownerPid": info.owner_pid,
    })
}

fn json_response(value: &Value) -> http::Response<ApiBody> {
    let body = Full::new(Bytes::from(value.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = http::Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn rpc_refusal(what: &str, status: &tonic::Status) -> Refusal {
    let code = match status.code() {
        tonic::Code::NotFound => http::StatusCode::NOT_FOUND,
        tonic::Code::FailedPrecondition => http::StatusCode::CONFLICT,
        tonic::Code::InvalidArgument => http::StatusCode::BAD_REQUEST,
        tonic::Code::PermissionDenied => http::StatusCode::FORBIDDEN,
        _ => http::StatusCode::BAD_GATEWAY,
    };
    (code, format!("{what}: {}", status.message()))
}

/// The robot controller sockets present in `dir`.
fn sockets(dir: &Path) -> Vec<PathBuf> {
    [ROS_SOCKET, ROS2_SOCKET]
        .iter()
        .map(|name| dir.join(name))
        .filter(|path| path.exists())
        .collect()
}

async fn client(socket: &Path) -> Result<RobotControllerClient<Channel>, Refusal> {
    let channel = rlark_proto::client::connect(socket)
        .await
        .map_err(|e| (http::StatusCode::BAD_GATEWAY, e.to_string()))?;
    Ok(RobotControllerClient::new(channel))
}

async fn list(dir: &Path) -> Result<Vec<pb::RobotInfo>, Refusal> {
    let mut robots = Vec::new();
    for socket in sockets(dir) {
        let reply = client(&socket)
            .await?
            .list_robots(pb::ListRobotsRequest {})
            .await
            .map_err(|s| rpc_refusal("ListRobots", &s))?;
        robots.extend(reply.into_inner().robots);
    }
    Ok(robots)
}

/// The client of the socket that serves robot `id`, and the robot.
async fn find(
    dir: &Path,
    id: &str,
) -> Result<(RobotControllerClient<Channel>, pb::RobotInfo), Refusal> {
    for socket in sockets(dir) {
        let mut client = client(&socket).await?;
        let reply = client
            .list_robots(pb::ListRobotsRequest {})
            .await
            .map_err(|s| rpc_refusal("ListRobots", &s))?;
        if let Some(robot) = reply
            .into_inner()
            .robots
            .into_iter()
            .find(|r| r.robot_id == id)
        {
            return Ok((client, robot));
        }
    }
    Err((
        http::StatusCode::NOT_FOUND,
        format!("no robot {id:?} on this host"),
    ))
}

async fn act(dir: &Path, id: &str, action: Action, body: ActionBody) -> Result<Value, Refusal> {
    let ActionBody {
        mode,
        package,
        launch_file,
        args,
    } = body;
    if package.is_some() && action != Action::Start {
        return Err((
            http::StatusCode::BAD_REQUEST,
            "a custom launch (package and launchFile) is for start only".into(),
        ));
    }
    let (mut client, _) = find(dir, id).await?;
    match action {
        Action::Start => {
            let mut request = tonic::Request::new(pb::StartRobotRequest {
                robot_id: id.to_string(),
                mode: mode.unwrap_or_default(),
                mode_config: mode_config(package, launch_file, args),
            });
            rlark_proto::client::Ownership::Detached.apply(&mut request);
            client
                .start_robot(request)
                .await
                .map_err(|s| rpc_refusal(&format!("start {id}"), &s))?;
        }
        Action::Stop => {
            client
                .stop_robot(pb::StopRobotRequest {
                    robot_id: id.to_string(),
                })
                .await
                .map_err(|s| rpc_refusal(&format!("stop {id}"), &s))?;
        }
        Action::Switch => {
            let Some(mode) = mode else {
                return Err((
                    http::StatusCode::BAD_REQUEST,
                    "switch needs a mode: {\"mode\": \"M\"}".into(),
                ));
            };
            client
                .switch_mode(pb::SwitchModeRequest {
                    robot_id: id.to_string(),
                    mode,
                    mode_config: mode_config(None, None, args),
                })
                .await
                .map_err(|s| rpc_refusal(&format!("switch {id}"), &s))?;
        }
        Action::Reset => {
            client
                .reset_robot(pb::ResetRobotRequest {
                    robot_id: id.to_string(),
                })
                .await
                .map_err(|s| rpc_refusal(&format!("reset {id}"), &s))?;
        }
    }
    let (_, robot) = find(dir, id).await?;
    Ok(robot_json(&robot))
}

/// A robot's logs or modes, as JSON.
async fn read(dir: &Path, id: &str, what: Read) -> Result<Value, Refusal> {
    let (mut client, _) = find(dir, id).await?;
    match what {
        Read::Logs => {
            let reply = client
                .get_robot_logs(pb::GetRobotLogsRequest {
                    robot_id: id.to_string(),
                    tail: LOG_LINES,
                })
                .await
                .map_err(|s| rpc_refusal(&format!("logs of {id}"), &s))?
                .into_inner();
            Ok(json!({"robotId": reply.robot_id, "lines": reply.lines}))
        }
        Read::Modes => {
            let reply = client
                .list_modes(pb::ListModesRequest {
                    robot_id: id.to_string(),
                })
                .await
                .map_err(|s| rpc_refusal(&format!("modes of {id}"), &s))?
                .into_inner();
            let modes: Vec<Value> = reply
                .modes
                .iter()
                .map(|m| {
                    let args: std::collections::BTreeMap<_, _> = m.args.iter().collect();
                    json!({
                        "name": m.name,
                        "package": m.package,
                        "launchFile": m.launch_file,
                        "args": args,
                    })
                })
                .collect();
            Ok(json!({"robotId": reply.robot_id, "modes": modes}))
        }
    }
}

/// Whether a query asks for a watch (`watch=1` or `watch=true`).
fn wants_watch(query: Option<&str>) -> bool {
    query
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair == "watch=1" || pair == "watch=true")
}

/// `GET /v1/robots?watch=1`: the robots of every socket as one JSON line, now and after
/// every change (see the module documentation).
async fn watch(dir: &Path) -> Result<http::Response<ApiBody>, Refusal> {
    use futures::StreamExt as _;
    let mut streams = Vec::new();
    for (i, socket) in sockets(dir).into_iter().enumerate() {
        let lists = client(&socket)
            .await?
            .watch_robots(pb::WatchRobotsRequest {})
            .await
            .map_err(|s| rpc_refusal("WatchRobots", &s))?
            .into_inner();
        streams.push(lists.map(move |item| (i, item)).boxed());
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        // The latest list of each socket; a line once every socket has sent one.
        let mut latest: Vec<Option<Vec<pb::RobotInfo>>> = vec![None; streams.len()];
        let mut merged = futures::stream::select_all(streams);
        loop {
            let item = tokio::select! {
                () = tx.closed() => break,
                item = merged.next() => item,
            };
            let line = match item {
                Some((i, Ok(list))) => {
                    latest[i] = Some(list.robots);
                    if latest.iter().any(Option::is_none) {
                        continue;
                    }
                    let robots: Vec<Value> =
                        latest.iter().flatten().flatten().map(robot_json).collect();
                    json!({ "items": robots })
                }
                Some((_, Err(status))) => {
                    json!({ "error": format!("WatchRobots: {}", status.message()) })
                }
                None => json!({ "error": "the embodied runtime ended the watch" }),
            };
            let last = line.get("error").is_some();
            if tx.send(Bytes::from(format!("{line}\n"))).await.is_err() || last {
                break;
            }
        }
    });
    let body = futures::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|line| line.map(|l| Ok::<_, std::io::Error>(hyper::body::Frame::data(l))))
    });
    let mut response = http::Response::new(http_body_util::StreamBody::new(body).boxed_unsync());
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

/// Serve one request under [`ROBOTS_PREFIX`] (see the module documentation).
pub(crate) async fn handle<B>(
    socket_dir: Option<&PathBuf>,
    request: http::Request<B>,
) -> http::Response<ApiBody>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let parsed = match parse(request.method(), request.uri().path()) {
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
    if sockets(dir).is_empty() {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("no robot controller socket in {}", dir.display()),
        );
    }
    if parsed == RobotRequest::List && wants_watch(request.uri().query()) {
        return match tokio::time::timeout(CALL_TIMEOUT, watch(dir)).await {
            Ok(Ok(response)) => response,
            Ok(Err((status, message))) => text_response(status, message),
            Err(_) => {
                let (status, message) = timeout();
                text_response(status, message)
            }
        };
    }
    let result = match parsed {
        RobotRequest::List => tokio::time::timeout(CALL_TIMEOUT, list(dir))
            .await
            .unwrap_or_else(|_| Err(timeout()))
            .map(|robots| json!({"items": robots.iter().map(robot_json).collect::<Vec<_>>()})),
        RobotRequest::Read { id, read: what } => {
            tokio::time::timeout(CALL_TIMEOUT, read(dir, &id, what))
                .await
                .unwrap_or_else(|_| Err(timeout()))
        }
        RobotRequest::Action { id, action } => {
            let body = match http_body_util::Limited::new(request.into_body(), MAX_BODY)
                .collect()
                .await
            {
                Ok(body) => body.to_bytes(),
                Err(error) => {
                    return text_response(
                        http::StatusCode::BAD_REQUEST,
                        format!("request body: {error} (at most {MAX_BODY} bytes)"),
                    );
                }
            };
            let body = match parse_body(&body) {
                Ok(body) => body,
                Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
            };
            tracing::info!(robot = %id, ?action, mode = ?body.mode, args = ?body.args, "robot action from the control plane");
            tokio::time::timeout(CALL_TIMEOUT, act(dir, &id, action, body))
                .await
                .unwrap_or_else(|_| Err(timeout()))
        }
    };
    match result {
        Ok(value) => json_response(&value),
        Err((status, message)) => text_response(status, message),
    }
}

fn timeout() -> Refusal {
    (
        http::StatusCode::BAD_GATEWAY,
        format!("the embodied runtime did not answer within {CALL_TIMEOUT:?}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods_name_a_request() {
        let get = http::Method::GET;
        let post = http::Method::POST;
        assert_eq!(parse(&get, "/v1/robots"), Ok(RobotRequest::List));
        assert!(is_robot_path("/v1/robots") && is_robot_path("/v1/robots/arm-0/stop"));
        assert!(!is_robot_path("/v1/robotsx") && !is_robot_path("/logs/a/b"));
        assert_eq!(
            parse(&post, "/v1/robots/arm-0/start"),
            Ok(RobotRequest::Action {
                id: "arm-0".into(),
                action: Action::Start
            })
        );
        assert_eq!(
            parse(&get, "/v1/robots/arm-0/logs"),
            Ok(RobotRequest::Read {
                id: "arm-0".into(),
                read: Read::Logs
            })
        );
        assert_eq!(
            parse(&get, "/v1/robots/arm-0/modes"),
            Ok(RobotRequest::Read {
                id: "arm-0".into(),
                read: Read::Modes
            })
        );
        for (method, path, code) in [
            (&post, "/v1/robots/arm-0/logs", 405),
            (&post, "/v1/robots/arm-0/modes", 405),
            (&get, "/v1/robots/a b/logs", 400),
            (&post, "/v1/robots", 405),
            (&get, "/v1/robots/arm-0/stop", 405),
            (&post, "/v1/robots/arm-0/fly", 400),
            (&post, "/v1/robots/a b/stop", 400),
            (&post, "/v1/robots/arm-0", 404),
            (&post, "/v1/robots/arm-0/stop/now", 404),
        ] {
            assert_eq!(parse(method, path).unwrap_err().0, code, "{method} {path}");
        }
    }

    #[test]
    fn bodies_give_an_optional_mode_and_args() {
        assert_eq!(parse_body(b""), Ok(ActionBody::default()));
        assert_eq!(parse_body(b"{}"), Ok(ActionBody::default()));
        let body = parse_body(br#"{"mode": "teleop", "args": {"target": "0.1,0.2"}}"#).unwrap();
        assert_eq!(body.mode.as_deref(), Some("teleop"));
        assert_eq!(body.args.get("target").map(String::as_str), Some("0.1,0.2"));
        assert!(mode_config(None, None, body.args).is_some());
        assert!(mode_config(None, None, Default::default()).is_none());
        let custom =
            parse_body(br#"{"package": "rlark_sim", "launchFile": "arm.launch"}"#).unwrap();
        let config = mode_config(custom.package, custom.launch_file, custom.args).unwrap();
        assert_eq!(
            (config.package.as_str(), config.launch_file.as_str()),
            ("rlark_sim", "arm.launch")
        );
        for (body, why) in [
            (&br#"{"package": "p"}"#[..], "both"),
            (br#"{"launchFile": "f"}"#, "both"),
            (
                br#"{"mode": "m", "package": "p", "launchFile": "f"}"#,
                "not both",
            ),
            (br#"{"package": 1, "launchFile": "f"}"#, "package"),
        ] {
            let error = parse_body(body).unwrap_err();
            assert!(error.contains(why), "{error}");
        }
        assert!(parse_body(br#"{"mode": ""}"#).is_err());
        assert!(parse_body(br#"{"mode": 1}"#).is_err());
        assert!(
            parse_body(br#"{"speed": 1}"#)
                .unwrap_err()
                .contains("speed")
        );
        assert!(
            parse_body(br#"{"args": {"a": 1}}"#)
                .unwrap_err()
                .contains("args.a")
        );
        assert!(parse_body(br#"{"args": [1]}"#).is_err());
        assert!(parse_body(b"[1]").is_err());
        assert!(parse_body(b"{").is_err());
    }

    #[tokio::test]
    async fn an_agent_without_robot_sockets_says_so() {
        let request = || {
            http::Request::get("/v1/robots")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap()
        };
        assert_eq!(
            handle(None, request()).await.status(),
            http::StatusCode::NOT_FOUND
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let response = handle(Some(&path), request()).await;
        assert_eq!(response.status(), http::StatusCode::NOT_FOUND);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("no robot controller socket"),
            "{body:?}"
        );
    }

    const SIM: &str = r#"
types:
  - type: sim-arm
    backend: sim
    defaultMode: idle
    modes:
      idle: {package: rlark_sim, launchFile: arm.launch, args: {speed: "2.0"}, argFrom: {joints: dof}}
      teleop: {package: rlark_sim, launchFile: arm.launch, args: {speed: "4.0"}, argFrom: {joints: dof}}
robots:
  - {id: arm-0, type: sim-arm, params: {dof: 3}}
allowedLaunchPackages: [rlark_sim]
watchdog: 60s
"#;

    fn request(method: &str, uri: &str, body: &'static str) -> http::Request<Full<Bytes>> {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    }

    async fn json_of(response: http::Response<ApiBody>) -> Value {
        assert_eq!(response.status(), http::StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&body).unwrap()
    }

    /// The next line of a streamed body, as JSON (within 10 s).
    async fn next_line(body: &mut ApiBody, pending: &mut Vec<u8>) -> Value {
        loop {
            if let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap();
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
    }

    #[tokio::test]
    async fn a_real_runtime_s_robots_are_watched_and_their_logs_and_modes_read() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let shutdown = tokio_util::sync::CancellationToken::new();
        let config = rlark_embodied::EmbodiedConfig::from_yaml(SIM).unwrap();
        let running = rlark_embodied::serve(config, &run, shutdown.clone())
            .await
            .unwrap();

        let watched = handle(Some(&run), request("GET", "/v1/robots?watch=1", "")).await;
        assert_eq!(watched.status(), http::StatusCode::OK);
        assert_eq!(
            watched.headers()[http::header::CONTENT_TYPE],
            "application/x-ndjson"
        );
        let mut body = watched.into_body();
        let mut pending = Vec::new();
        let now = next_line(&mut body, &mut pending).await;
        assert_eq!(now["items"][0]["id"], "arm-0");
        assert_eq!(now["items"][0]["state"], "STOPPED");

        let started = handle(
            Some(&run),
            request("POST", "/v1/robots/arm-0/start", r#"{"mode": "teleop"}"#),
        )
        .await;
        assert_eq!(json_of(started).await["state"], "RUNNING");
        // The watch tells without being asked (STARTING may come first).
        loop {
            let line = next_line(&mut body, &mut pending).await;
            if line["items"][0]["state"] == "RUNNING" {
                assert_eq!(line["items"][0]["mode"], "teleop");
                break;
            }
            assert_eq!(line["items"][0]["state"], "STARTING", "{line}");
        }

        let logs =
            json_of(handle(Some(&run), request("GET", "/v1/robots/arm-0/logs", "")).await).await;
        assert_eq!(logs["robotId"], "arm-0");
        let lines: Vec<&str> = logs["lines"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            lines.iter().any(|l| l.contains("RUNNING in mode teleop")),
            "{lines:?}"
        );
        let modes =
            json_of(handle(Some(&run), request("GET", "/v1/robots/arm-0/modes", "")).await).await;
        let names: Vec<&str> = modes["modes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["name"].as_str())
            .collect();
        assert_eq!(names, ["idle", "teleop"]);
        assert_eq!(modes["modes"][1]["launchFile"], "arm.launch");
        assert_eq!(modes["modes"][1]["package"], "rlark_sim");
        assert_eq!(modes["modes"][1]["args"]["speed"], "4.0");
        let unknown = handle(Some(&run), request("GET", "/v1/robots/arm-9/logs", "")).await;
        assert_eq!(unknown.status(), http::StatusCode::NOT_FOUND);

        handle(Some(&run), request("POST", "/v1/robots/arm-0/stop", "")).await;
        // A custom launch: from an allowed package it runs, named package/launch file;
        // from another package the runtime's refusal is a 403 with its reason.
        let custom = handle(
            Some(&run),
            request(
                "POST",
                "/v1/robots/arm-0/start",
                r#"{"package": "rlark_sim", "launchFile": "arm.launch", "args": {"speed": "3"}}"#,
            ),
        )
        .await;
        let custom = json_of(custom).await;
        assert_eq!(
            (&custom["state"], &custom["mode"]),
            (&json!("RUNNING"), &json!("rlark_sim/arm.launch"))
        );
        handle(Some(&run), request("POST", "/v1/robots/arm-0/stop", "")).await;
        let refused = handle(
            Some(&run),
            request(
                "POST",
                "/v1/robots/arm-0/start",
                r#"{"package": "other_pkg", "launchFile": "x.launch"}"#,
            ),
        )
        .await;
        assert_eq!(refused.status(), http::StatusCode::FORBIDDEN);
        let reason = refused.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&reason).contains("not allowed"),
            "{reason:?}"
        );
        drop(body);
        shutdown.cancel();
        running.wait().await.unwrap();
    }
}
