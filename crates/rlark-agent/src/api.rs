//! The agent's local API: HTTP/1.1 served on the tunnel's `agent-api` streams (DESIGN §6).
//!
//! # Reachability and authentication
//!
//! This API is never bound to a socket. The hub opens an `agent-api` stream on the agent's
//! tunnel session (`rlark_tunnel::dial::open` with `StreamRequest::AgentApi`), the tunnel
//! answers `ok` and hands the stream to [`LocalApi`] ([`rlark_tunnel::agent::AgentApi`]).
//! The tunnel is a TLS connection the agent itself opened to a server it verified against
//! the installation CA, so every stream on it comes from the hub. There is therefore **no
//! authentication or authorization here**: the hub authorizes the caller (e.g. the
//! server's `GET /rlark/v1/namespaces/{ns}/pods/{pod}/log`: admins and viewers) before it
//! opens a stream.
//!
//! # Routes
//!
//! `GET /logs/{namespace}/{pod}?tail=N&follow=true&previous=false&limitBytes=N`: the log
//! of replica `i` of Task `task`, where the Pod is `<task>-<i>` ([`crate::tasks::pod_name`]),
//! as `text/plain`:
//!
//! - the replica is found by scanning `DATA_DIR/tasks/<namespace>/<task>/*/<i>/`
//!   ([`crate::tasks::replica_dir`]): one directory per Task UID. The *current* run is the
//!   one whose process runs (its `state.json` names a live process), else the most recently
//!   modified directory (a directory changes whenever its state file is written or removed,
//!   and runs of one replica never overlap); `previous=true` selects the run before it
//!   (an earlier Task of the same name). Restarts under a restart policy (and a resume)
//!   append to the same `current.log`, after a separator line
//!   ([`crate::runtime::logs::restart_separator`]), so there is no "previous" per restart;
//! - only `logs/current.log` is read (not the rotated `current.log.1`, `.2`), like the
//!   kubelet; `tail=N` starts at the N-th line from its end; `limitBytes=N` stops after N
//!   bytes;
//! - `follow=true` keeps sending what is appended until the replica's process has exited
//!   (its `state.json` is gone, carries a final status, or names a dead process) and the
//!   file is fully read, or the client goes away, or the agent stops. A copy-truncate
//!   rotation ([`crate::runtime::logs`]) is followed: the bytes not sent yet are read from
//!   `current.log.1`, then `current.log` from its start. A replica that restarts after a
//!   backoff ends the follow at the exit (as `kubectl logs -f` does at a container exit);
//! - `404` with a message when no such replica ever ran on this agent (or no previous
//!   run), `400` for a bad name or parameter, `405` for another method;
//! - on a Kubernetes agent ([`LocalApi::set_member`]), a Pod whose rlark object carries
//!   the annotation `rlark.io/member-pod` is read from the member API instead
//!   ([`crate::kubernetes::member::logs`]: `container` or the default one, `tail` → `tailLines`, `previous` = the
//!   container's previous instance); the member API's refusals keep its code and message.
//!
//! `GET /exec/{namespace}/{pod}?command=...`: a command in the running replica, over a
//! WebSocket (Kubernetes' remotecommand protocol); see [`crate::exec`]. On a Kubernetes
//! agent, a Pod with the annotation `rlark.io/member-pod` is exec'd into through the member
//! API's `pods/exec` instead ([`crate::kubernetes::member::exec`]).
//!
//! `GET /ports/{namespace}/{pod}/{port}` (`Upgrade: rlark-port`): a connection to a port
//! the replica's own processes listen on, for the task proxy, `ssh -L` and port-forward;
//! see [`crate::ports`].
//!
//! `GET /v1/cameras/{id}/stream?fps=N`: the live view of a camera of the host's embodied
//! runtime as MJPEG; `GET /v1/cameras`, `POST /v1/cameras/{id}/{open,close}`: the cameras;
//! see [`crate::camera_stream`].
//!
//! `GET /v1/robots`, `POST /v1/robots/{id}/{start|stop|switch|reset}`: the host's robots;
//! see [`crate::robot_actions`].
//!
//! `POST /v1/net/check` with `{"pod": "<task>-<i>", "to": "<ip>", "port": p}` (`port`
//! optional): a test connection from that replica of this agent to the domain address
//! `to` along the route its own connections take ([`rlark_net::router::Router::check`]):
//! with `port`, a TCP connection to it (closed at once); without, a probe that the
//! destination's agent authorizes without touching the replica. `200` with
//! `{"path": "local|direct|relay", "setupMicros": n}`; errors are JSON
//! `{"message": "...", "status": "..."}` (`status`: the failed path's answer, when one
//! came): `400` bad request or `to` outside the replica's domain, `404` pod not attached
//! or no member at `to`, `409` the replica has no address, `502` the path refused or
//! failed, `503` no pod network on this agent, `405` another method.

use std::convert::Infallible;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt as _, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper_util::rt::{TokioIo, TokioTimer};
use rlark_tunnel::agent::AgentApi;
use rlark_tunnel::mux::MuxStream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::runs::{container_param, run_containers};
use crate::runtime::docker::container_log_file;

/// How often a followed log is checked for new bytes and its replica for an exit.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// Largest piece of a log sent at once.
const CHUNK: usize = 32 * 1024;
/// How long the agent waits for a request's headers on a new stream.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The local API (see the module documentation). Cheap to clone.
#[derive(Clone, Debug)]
pub struct LocalApi {
    inner: Arc<Inner>,
}

struct Inner {
    tasks_dir: PathBuf,
    node: String,
    shutdown: CancellationToken,
    router: std::sync::OnceLock<rlark_net::router::Router>,
    /// The engine of a docker agent: exec into container replicas goes through it.
    docker: std::sync::OnceLock<crate::runtime::docker::DockerClient>,
    /// A Kubernetes agent's clients: logs and exec of the Pods it mirrors go to the member
    /// cluster's API.
    member: std::sync::OnceLock<crate::kubernetes::member::logs::MemberPods>,
    /// The embodied runtime's socket directory: cameras' live view.
    embodied: std::sync::OnceLock<PathBuf>,
    /// The replica supervisor command: exec enters isolated replicas through it.
    supervisor: std::sync::OnceLock<Vec<std::ffi::OsString>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("tasks_dir", &self.tasks_dir)
            .field("node", &self.node)
            .field("router", &self.router.get().is_some())
            .finish_non_exhaustive()
    }
}

impl LocalApi {
    /// The API of the agent whose replicas live under `tasks_dir` (`DATA_DIR/tasks`), on
    /// node `node` (named in messages). Every connection and follow ends on `shutdown`.
    pub fn new(tasks_dir: impl Into<PathBuf>, node: &str, shutdown: CancellationToken) -> Self {
        LocalApi {
            inner: Arc::new(Inner {
                tasks_dir: tasks_dir.into(),
                node: node.to_string(),
                shutdown,
                router: std::sync::OnceLock::new(),
                docker: std::sync::OnceLock::new(),
                member: std::sync::OnceLock::new(),
                embodied: std::sync::OnceLock::new(),
                supervisor: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Serve `POST /v1/net/check` with `router` (once; later calls are ignored and return
    /// false).
    pub fn set_router(&self, router: rlark_net::router::Router) -> bool {
        self.inner.router.set(router).is_ok()
    }

    /// Exec into container replicas through the engine `client` (a docker agent; once,
    /// later calls are ignored and return false).
    pub fn set_docker(&self, client: crate::runtime::docker::DockerClient) -> bool {
        self.inner.docker.set(client).is_ok()
    }

    /// Serve logs and exec of the Pods a Kubernetes agent mirrors (those with the annotation
    /// [`crate::kubernetes::member::logs::MEMBER_POD_ANNOTATION`]) from the member cluster through
    /// `pods` (once; later calls are ignored and return false).
    pub fn set_member(&self, pods: crate::kubernetes::member::logs::MemberPods) -> bool {
        self.inner.member.set(pods).is_ok()
    }

    /// Enter isolated replicas for exec with the supervisor command `command` (once;
    /// later calls are ignored and return false). Without it, exec into an isolated
    /// replica is refused rather than run as the agent's user.
    pub fn set_supervisor(&self, command: Vec<std::ffi::OsString>) -> bool {
        self.inner.supervisor.set(command).is_ok()
    }

    /// Serve `GET /v1/cameras/{id}/stream` and the robot routes (`/v1/robots`) from the
    /// embodied runtime whose sockets are in
    /// `dir` (once; later calls are ignored and return false).
    pub fn set_embodied_socket_dir(&self, dir: PathBuf) -> bool {
        self.inner.embodied.set(dir).is_ok()
    }

    /// Serve HTTP/1.1 on `io` until the peer closes it, it fails, or the agent stops.
    pub async fn serve_connection<S>(&self, io: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let inner = self.inner.clone();
        let service =
            hyper::service::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
                let inner = inner.clone();
                async move {
                    if request.uri().path() == NET_CHECK_PATH {
                        return Ok(net_check(inner.router.get(), request).await);
                    }
                    if crate::robot_actions::is_robot_path(request.uri().path()) {
                        return Ok(
                            crate::robot_actions::handle(inner.embodied.get(), request).await
                        );
                    }
                    if crate::camera_stream::is_camera_path(request.uri().path()) {
                        let uri = request.uri();
                        return Ok(crate::camera_stream::handle(
                            inner.embodied.get(),
                            &inner.shutdown,
                            request.method(),
                            uri.path(),
                            uri.query(),
                        )
                        .await);
                    }
                    if request.uri().path().starts_with(crate::ports::PORTS_PREFIX) {
                        let (dir, node, stop) = (&inner.tasks_dir, &inner.node, &inner.shutdown);
                        return Ok(crate::ports::handle(dir, node, stop, request).await);
                    }
                    if request.uri().path().starts_with(crate::exec::EXEC_PREFIX) {
                        // A Pod a Kubernetes agent mirrors: exec goes to the member API.
                        if let Some(member) = inner.member.get()
                            && let Some(response) = crate::kubernetes::member::exec::handle(
                                member,
                                &inner.shutdown,
                                &mut request,
                            )
                            .await
                        {
                            return Ok(response);
                        }
                        let (dir, node, stop) = (&inner.tasks_dir, &inner.node, &inner.shutdown);
                        let docker = inner.docker.get();
                        let supervisor = inner.supervisor.get().map(Vec::as_slice);
                        return Ok(crate::exec::handle(
                            dir, node, docker, supervisor, stop, request,
                        )
                        .await);
                    }
                    Ok::<_, Infallible>(inner.handle(&request).await)
                }
            });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        tokio::select! {
            () = self.inner.shutdown.cancelled() => {}
            result = conn => if let Err(error) = result {
                tracing::debug!(%error, "agent API connection ended");
            },
        }
    }
}

impl AgentApi for LocalApi {
    fn serve(&self, stream: MuxStream) {
        let api = self.clone();
        tokio::spawn(async move { api.serve_connection(stream).await });
    }
}

pub use rlark_api::agent::local::LogOptions;
pub use rlark_api::agent::parse_pod_name;

pub use crate::api_body::ApiBody;
use crate::api_body::text_response;
use crate::runs::{find_runs, replica_running};

/// Offset of the start of the `lines`-th line from the end of `file` (a last line without
/// its newline counts as a line).
fn tail_offset(file: &std::fs::File, len: u64, lines: u64) -> io::Result<u64> {
    if lines == 0 {
        return Ok(len);
    }
    let mut end = len;
    let mut buf = vec![0u8; 8192];
    let mut found = 0u64;
    // The newline that ends the file ends the last line; it does not start one.
    let mut skip_last = true;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..usize::try_from(end - start).unwrap_or(0)];
        file.read_exact_at(chunk, start)?;
        for (i, byte) in chunk.iter().enumerate().rev() {
            let at = start + i as u64;
            if *byte != b'\n' {
                skip_last = false;
                continue;
            }
            if skip_last && at + 1 == len {
                skip_last = false;
                continue;
            }
            found += 1;
            if found == lines {
                return Ok(at + 1);
            }
        }
        end = start;
    }
    Ok(0)
}

impl Inner {
    async fn handle<B>(self: &Arc<Self>, request: &http::Request<B>) -> http::Response<ApiBody> {
        let path = request.uri().path();
        let Some(rest) = path.strip_prefix("/logs/") else {
            return text_response(
                http::StatusCode::NOT_FOUND,
                format!("not found: {path}; the agent API serves GET /logs/{{namespace}}/{{pod}}"),
            );
        };
        if request.method() != http::Method::GET {
            return text_response(
                http::StatusCode::METHOD_NOT_ALLOWED,
                format!("{} is not allowed: use GET", request.method()),
            );
        }
        let Some((namespace, pod)) = rest.split_once('/').filter(|(_, p)| !p.contains('/')) else {
            return text_response(
                http::StatusCode::NOT_FOUND,
                format!("not found: {path}; use GET /logs/{{namespace}}/{{pod}}"),
            );
        };
        let options = match LogOptions::parse(request.uri().query()) {
            Ok(options) => options,
            Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
        };
        let container = match container_param(request.uri().query()) {
            Ok(container) => container,
            Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
        };
        self.logs(namespace, pod, options, container.as_deref())
            .await
    }

    async fn logs(
        self: &Arc<Self>,
        namespace: &str,
        pod: &str,
        options: LogOptions,
        container: Option<&str>,
    ) -> http::Response<ApiBody> {
        // The names become path components: only DNS-1123 names, never `..` or `/`.
        if let Err(e) = rlark_api::names::dns1123_label(namespace) {
            return text_response(
                http::StatusCode::BAD_REQUEST,
                format!("invalid namespace {namespace:?}: {e}"),
            );
        }
        if let Err(e) = rlark_api::names::dns1123_subdomain(pod) {
            return text_response(
                http::StatusCode::BAD_REQUEST,
                format!("invalid pod name {pod:?}: {e}"),
            );
        }
        if let Some(member) = self.member.get() {
            match member.resolve(namespace, pod).await {
                Ok(Some((member_ns, member_pod))) => {
                    return self
                        .member_log(member, &member_ns, &member_pod, &options, container)
                        .await;
                }
                Ok(None) => {}
                Err(error) => return text_response(error.status(), error.to_string()),
            }
        }
        let Some((task, index)) = parse_pod_name(pod) else {
            return text_response(
                http::StatusCode::NOT_FOUND,
                format!(
                    "pod {namespace}/{pod} is not a replica of a task (replica pods are named \
                     <task>-<index>)"
                ),
            );
        };
        let (tasks_dir, ns, task_name) = (
            self.tasks_dir.clone(),
            namespace.to_string(),
            task.to_string(),
        );
        let runs =
            tokio::task::spawn_blocking(move || find_runs(&tasks_dir, &ns, &task_name, index))
                .await
                .unwrap_or_default();
        let node = &self.node;
        let run = match (runs.as_slice(), options.previous) {
            ([], _) => {
                return text_response(
                    http::StatusCode::NOT_FOUND,
                    format!(
                        "pod {namespace}/{pod}: replica {index} of task {task:?} has not run on \
                         node {node:?}"
                    ),
                );
            }
            ([_], true) => {
                return text_response(
                    http::StatusCode::NOT_FOUND,
                    format!(
                        "pod {namespace}/{pod}: no previous run of replica {index} of task \
                         {task:?} on node {node:?} (only the current one)"
                    ),
                );
            }
            (_, true) => runs[1].clone(),
            ([current, ..], false) => current.clone(),
        };
        let names = run_containers(&run.dir);
        let file = match container_log_file(&names, container) {
            Ok(file) => file,
            Err(message) => {
                return text_response(
                    http::StatusCode::BAD_REQUEST,
                    format!("pod {namespace}/{pod}: {message}"),
                );
            }
        };
        let logs = run.dir.join("logs");
        let mut follower = Follower {
            path: logs.join(&file),
            rotated: logs.join(format!("{file}.1")),
            offset: 0,
            remaining: options.limit_bytes,
            dir: run.dir,
        };
        if let Some(lines) = options.tail {
            let path = follower.path.clone();
            let offset = tokio::task::spawn_blocking(move || -> io::Result<u64> {
                let file = std::fs::File::open(&path)?;
                let len = file.metadata()?.len();
                tail_offset(&file, len, lines)
            })
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)));
            match offset {
                Ok(offset) => follower.offset = offset,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return text_response(
                        http::StatusCode::INTERNAL_SERVER_ERROR,
                        format!("read the log of pod {namespace}/{pod}: {e}"),
                    );
                }
            }
        }
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
        let shutdown = self.shutdown.clone();
        let follow = options.follow;
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = follower.run(&tx, follow) => {}
            }
        });
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let item = rx.recv().await?;
            Some((item.map(Frame::data), rx))
        });
        let mut response = http::Response::new(StreamBody::new(stream).boxed_unsync());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

impl Inner {
    /// The log of member Pod `namespace/pod` (see [`crate::kubernetes::member::logs`]), until it ends,
    /// the client leaves or the agent stops.
    async fn member_log(
        &self,
        member: &crate::kubernetes::member::logs::MemberPods,
        namespace: &str,
        pod: &str,
        options: &LogOptions,
        container: Option<&str>,
    ) -> http::Response<ApiBody> {
        use futures::StreamExt as _;
        let stream = match member.log(namespace, pod, options, container).await {
            Ok(stream) => stream,
            Err(error) => return text_response(error.status(), error.to_string()),
        };
        let stream = stream
            .take_until(self.shutdown.clone().cancelled_owned())
            .map(|item| item.map(Frame::data));
        let mut response = http::Response::new(StreamBody::new(stream).boxed_unsync());
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        response
    }
}

/// The net check route.
pub const NET_CHECK_PATH: &str = "/v1/net/check";
/// Largest net check request body.
const NET_CHECK_MAX_BODY: usize = 4096;

/// The body of `POST /v1/net/check`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NetCheckRequest {
    pod: String,
    to: String,
    #[serde(default)]
    port: Option<u16>,
}

/// The answer of `POST /v1/net/check`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct NetCheckAnswer {
    path: &'static str,
    setup_micros: u64,
}

fn json_response(status: http::StatusCode, value: &serde_json::Value) -> http::Response<ApiBody> {
    let body = http_body_util::Full::new(Bytes::from(value.to_string()))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

fn json_error(status: http::StatusCode, message: impl Into<String>) -> http::Response<ApiBody> {
    json_response(status, &serde_json::json!({ "message": message.into() }))
}

/// `POST /v1/net/check` (see the module documentation).
async fn net_check<B>(
    router: Option<&rlark_net::router::Router>,
    request: http::Request<B>,
) -> http::Response<ApiBody>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    use http::StatusCode;
    use rlark_net::router::RouteError;
    if request.method() != http::Method::POST {
        return json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed: use POST", request.method()),
        );
    }
    let body = match http_body_util::Limited::new(request.into_body(), NET_CHECK_MAX_BODY)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                format!("read the body (at most {NET_CHECK_MAX_BODY} bytes): {e}"),
            );
        }
    };
    let check: NetCheckRequest = match serde_json::from_slice(&body) {
        Ok(check) => check,
        Err(e) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"pod\", \"to\", \"port\"?}}: {e}"),
            );
        }
    };
    let Ok(to) = check.to.parse::<std::net::IpAddr>() else {
        return json_error(
            StatusCode::BAD_REQUEST,
            format!("to {:?} is not an IP address", check.to),
        );
    };
    if check.port == Some(0) {
        return json_error(StatusCode::BAD_REQUEST, "port 0 is not a port (1..=65535)");
    }
    let Some(router) = router else {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the pod network is not enabled on this agent",
        );
    };
    match router.check(&check.pod, to, check.port).await {
        Ok(result) => json_response(
            StatusCode::OK,
            &serde_json::to_value(NetCheckAnswer {
                path: result.path.as_str(),
                setup_micros: u64::try_from(result.setup.as_micros()).unwrap_or(u64::MAX),
            })
            .unwrap_or_default(),
        ),
        Err(error) => {
            let status = match &error {
                RouteError::NotInDomain { .. } | RouteError::Spoofed { .. } => {
                    StatusCode::BAD_REQUEST
                }
                RouteError::UnknownPod { .. } | RouteError::NoMember { .. } => {
                    StatusCode::NOT_FOUND
                }
                RouteError::NoAddress { .. } => StatusCode::CONFLICT,
                RouteError::Failed { .. } => StatusCode::BAD_GATEWAY,
                RouteError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            };
            let mut value = serde_json::json!({ "message": error.to_string() });
            if let RouteError::Failed {
                path,
                status: answer,
                ..
            } = &error
            {
                value["path"] = path.as_str().into();
                value["status"] = answer.as_str().into();
            }
            json_response(status, &value)
        }
    }
}

/// Whether to go on after sending.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    /// The byte limit was reached, or the client went away.
    Stop,
}

/// Sends a replica's `current.log` from `offset` on.
struct Follower {
    dir: PathBuf,
    path: PathBuf,
    rotated: PathBuf,
    offset: u64,
    remaining: Option<u64>,
}

impl Follower {
    async fn run(&mut self, tx: &mpsc::Sender<io::Result<Bytes>>, follow: bool) {
        // Set once the replica was seen not running: one more poll, then the end.
        let mut exited = false;
        loop {
            match self.pump(tx).await {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => return,
                Err(error) => {
                    tracing::debug!(log = %self.path.display(), %error, "read replica log");
                    let _ = tx.send(Err(error)).await;
                    return;
                }
            }
            if !follow {
                return;
            }
            let dir = self.dir.clone();
            let running = tokio::task::spawn_blocking(move || replica_running(&dir))
                .await
                .unwrap_or(false);
            if running {
                exited = false;
            } else if exited {
                // Seen exited twice, one poll apart, and everything read since: done.
                return;
            } else {
                exited = true;
            }
            tokio::select! {
                () = tokio::time::sleep(FOLLOW_POLL) => {}
                () = tx.closed() => return,
            }
        }
    }

    /// Send whatever the file holds past `offset` (following a copy-truncate first).
    async fn pump(&mut self, tx: &mpsc::Sender<io::Result<Bytes>>) -> io::Result<Flow> {
        let file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Flow::Continue),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        if len < self.offset {
            // Rotated (copied to `.1`, then truncated): the rest of what we were reading
            // is at the end of the copy.
            if let Ok(copy) = std::fs::File::open(&self.rotated) {
                let copy_len = copy.metadata()?.len();
                if copy_len >= self.offset
                    && self.send_range(&copy, copy_len, tx).await? == Flow::Stop
                {
                    return Ok(Flow::Stop);
                }
            }
            self.offset = 0;
        }
        self.send_range(&file, len, tx).await
    }

    /// Send `file` from `offset` to `end`, advancing `offset`.
    async fn send_range(
        &mut self,
        file: &std::fs::File,
        end: u64,
        tx: &mpsc::Sender<io::Result<Bytes>>,
    ) -> io::Result<Flow> {
        while self.offset < end {
            let mut want = (end - self.offset).min(CHUNK as u64);
            if let Some(remaining) = self.remaining {
                want = want.min(remaining);
            }
            let mut buf = vec![0u8; usize::try_from(want).unwrap_or(CHUNK)];
            let n = file.read_at(&mut buf, self.offset)?;
            if n == 0 {
                // Truncated meanwhile: the next pump sees it.
                return Ok(Flow::Continue);
            }
            buf.truncate(n);
            self.offset += n as u64;
            if tx.send(Ok(Bytes::from(buf))).await.is_err() {
                return Ok(Flow::Stop);
            }
            if let Some(remaining) = self.remaining.as_mut() {
                *remaining -= n as u64;
                if *remaining == 0 {
                    return Ok(Flow::Stop);
                }
            }
        }
        Ok(Flow::Continue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::LOG_FILE;
    use crate::runtime::docker::CONTAINERS_FILE;
    use crate::tasks::{ReplicaState, STATE_FILE};
    use std::io::Write as _;
    use std::path::Path;

    #[test]
    fn tail_counts_lines_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let check = |content: &str, lines: u64, expect: &str| {
            std::fs::write(&path, content).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            let offset = tail_offset(&file, content.len() as u64, lines).unwrap();
            assert_eq!(
                &content[offset as usize..],
                expect,
                "{content:?} tail {lines}"
            );
        };
        check("a\nb\nc\n", 1, "c\n");
        check("a\nb\nc\n", 2, "b\nc\n");
        check("a\nb\nc\n", 5, "a\nb\nc\n");
        check("a\nb\nc", 1, "c");
        check("a\nb\nc", 2, "b\nc");
        check("a\nb\nc\n", 0, "");
        check("", 3, "");
        check("\n\n", 1, "\n");
        let long: String = (0..5000).map(|i| format!("line {i}\n")).collect();
        check(&long, 2, "line 4998\nline 4999\n");
    }

    /// `GET path` on a fresh connection to `api`; status and the whole body.
    async fn get(api: &LocalApi, path: &str) -> (http::StatusCode, String) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let serving = api.clone();
        tokio::spawn(async move { serving.serve_connection(server).await });
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let request = http::Request::get(path)
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
            .await
            .expect("response in time")
            .expect("response");
        let status = response.status();
        let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
            .await
            .expect("body in time")
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// `POST path` with `body` on a fresh connection to `api`; status and the whole body.
    async fn post(api: &LocalApi, path: &str, body: &str) -> (http::StatusCode, String) {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let serving = api.clone();
        tokio::spawn(async move { serving.serve_connection(server).await });
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let request = http::Request::post(path)
            .body(http_body_util::Full::new(Bytes::from(body.to_string())))
            .expect("request");
        let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
            .await
            .expect("response in time")
            .expect("response");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn net_check_requests_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let api = LocalApi::new(dir.path(), "n1", CancellationToken::new());
        let good = r#"{"pod": "w-0", "to": "10.88.0.3"}"#;
        let (status, text) = post(&api, NET_CHECK_PATH, good).await;
        assert_eq!(status, http::StatusCode::SERVICE_UNAVAILABLE, "{text}");
        assert_eq!(
            text,
            r#"{"message":"the pod network is not enabled on this agent"}"#
        );
        let shutdown = CancellationToken::new();
        let router = rlark_net::router::Router::new(
            rlark_net::membership::Membership::new(rlark_net::membership::LocalIdentity {
                cluster: "a".into(),
                node: "n1".into(),
            }),
            rlark_net::metrics::DomainMetrics::new(),
            None,
            None,
            rlark_net::router::RouterConfig::new(Arc::new(|_: &tokio::net::TcpStream| {
                Err(io::Error::other("unused"))
            })),
            shutdown,
        );
        assert!(api.set_router(router.clone()));
        assert!(!api.set_router(router));
        let (status, text) = post(&api, NET_CHECK_PATH, good).await;
        assert_eq!(status, http::StatusCode::NOT_FOUND, "{text}");
        assert!(text.contains("pod w-0 is not attached"), "{text}");
        for (body, needle) in [
            (r#"{"pod": "w-0"}"#, "missing field `to`"),
            (r#"{"pod": "w-0", "to": "w-1.d"}"#, "is not an IP address"),
            (r#"{"pod": "w-0", "to": "10.0.0.1", "port": 0}"#, "port 0"),
            (
                r#"{"pod": "w-0", "to": "10.0.0.1", "extra": 1}"#,
                "unknown field",
            ),
            ("not json", "the body must be"),
        ] {
            let (status, text) = post(&api, NET_CHECK_PATH, body).await;
            assert_eq!(status, http::StatusCode::BAD_REQUEST, "{body}: {text}");
            assert!(text.contains(needle), "{body}: {text}");
        }
        let (status, _) = get(&api, NET_CHECK_PATH).await;
        assert_eq!(status, http::StatusCode::METHOD_NOT_ALLOWED);
    }

    fn replica(tasks: &Path, uid: &str, content: &str) -> PathBuf {
        let dir = tasks.join("rlark-a/job-main").join(uid).join("0");
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("logs").join(LOG_FILE), content).unwrap();
        dir
    }

    /// `container=`: the main container's log is `current.log`, a sidecar's
    /// `<name>.log`; an unknown name is a 400 listing the containers; a process replica
    /// has none to choose.
    #[tokio::test]
    async fn container_logs_pick_the_main_or_a_sidecar_file() {
        let dir = tempfile::tempdir().unwrap();
        let api = LocalApi::new(dir.path(), "n1", CancellationToken::new());
        let run = replica(dir.path(), "uid-1", "from main\n");
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?container=main").await,
            (
                http::StatusCode::BAD_REQUEST,
                "pod rlark-a/job-main-0: container \"main\": this replica runs processes, not \
                 containers (omit the container)\n"
                    .into()
            )
        );
        crate::runtime::record::write(&run.join(CONTAINERS_FILE), &["main", "tb"]).unwrap();
        std::fs::write(run.join("logs/tb.log"), "from the sidecar\n").unwrap();
        for (query, expected) in [
            ("", "from main\n"),
            ("?container=main", "from main\n"),
            ("?container=tb", "from the sidecar\n"),
            ("?container=tb&tail=1", "from the sidecar\n"),
        ] {
            assert_eq!(
                get(&api, &format!("/logs/rlark-a/job-main-0{query}")).await,
                (http::StatusCode::OK, expected.into()),
                "{query}"
            );
        }
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?container=db").await,
            (
                http::StatusCode::BAD_REQUEST,
                "pod rlark-a/job-main-0: container \"db\" is not in this replica: its \
                 containers are main, tb\n"
                    .into()
            )
        );
        let (status, text) = get(&api, "/logs/rlark-a/job-main-0?container=Bad_Name").await;
        assert_eq!(status, http::StatusCode::BAD_REQUEST);
        assert!(
            text.contains("invalid container name \"Bad_Name\""),
            "{text}"
        );
    }

    #[tokio::test]
    async fn logs_of_the_current_and_previous_runs() {
        let dir = tempfile::tempdir().unwrap();
        let api = LocalApi::new(dir.path(), "n1", CancellationToken::new());
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0").await.0,
            http::StatusCode::NOT_FOUND
        );
        replica(dir.path(), "uid-1", "old 1\nold 2\n");
        std::thread::sleep(Duration::from_millis(20));
        replica(dir.path(), "uid-2", "new 1\nnew 2\nnew 3\n");
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0").await,
            (http::StatusCode::OK, "new 1\nnew 2\nnew 3\n".into())
        );
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?tail=1").await,
            (http::StatusCode::OK, "new 3\n".into())
        );
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?limitBytes=8").await,
            (http::StatusCode::OK, "new 1\nne".into())
        );
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?previous=true").await,
            (http::StatusCode::OK, "old 1\nold 2\n".into())
        );
        // Following a replica without a live process ends at the end of its file.
        assert_eq!(
            get(&api, "/logs/rlark-a/job-main-0?follow=true&tail=2").await,
            (http::StatusCode::OK, "new 2\nnew 3\n".into())
        );
        let (status, text) = get(&api, "/logs/rlark-a/job-main-1").await;
        assert_eq!(status, http::StatusCode::NOT_FOUND);
        assert!(text.contains("has not run on node \"n1\""), "{text}");
        for bad in [
            "/logs/rlark-a/..",
            "/logs/../x-0",
            "/logs/rlark-a/job-main-0?tail=x",
        ] {
            assert_eq!(
                get(&api, bad).await.0,
                http::StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        assert_eq!(get(&api, "/other").await.0, http::StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn follow_streams_appends_across_a_rotation_until_the_process_exits() {
        let dir = tempfile::tempdir().unwrap();
        let replica_dir = replica(dir.path(), "uid-1", "first\n");
        // A live process: this test's own, named in the state file.
        let state = ReplicaState {
            namespace: "rlark-a".into(),
            task: "job-main".into(),
            uid: "uid-1".into(),
            index: 0,
            run_key: "k".into(),
            pid: std::process::id(),
            pgid: 0,
            proc_start_ticks: None,
            containers: Vec::new(),
            container_names: Vec::new(),
            start_time: String::new(),
            grace_seconds: 1,
            final_status: None,
        };
        state.write(&replica_dir.join(STATE_FILE)).unwrap();
        let api = LocalApi::new(dir.path(), "n1", CancellationToken::new());
        let fetch = tokio::spawn({
            let api = api.clone();
            async move { get(&api, "/logs/rlark-a/job-main-0?follow=true").await }
        });
        let log = replica_dir.join("logs").join(LOG_FILE);
        let logs = crate::runtime::LogFiles::new(
            log.parent().unwrap(),
            crate::runtime::LogLimits {
                max_bytes: 1,
                files: 2,
            },
        );
        tokio::time::sleep(FOLLOW_POLL * 2).await;
        let mut writer = logs.open_append().unwrap();
        writeln!(writer, "second").unwrap();
        tokio::time::sleep(FOLLOW_POLL * 2).await;
        // Written and rotated before the follower looks again.
        writeln!(writer, "third").unwrap();
        assert!(logs.rotate_if_needed().unwrap());
        writeln!(writer, "fourth").unwrap();
        tokio::time::sleep(FOLLOW_POLL * 2).await;
        assert!(!fetch.is_finished(), "the process still runs");
        std::fs::remove_file(replica_dir.join(STATE_FILE)).unwrap();
        let (status, text) = tokio::time::timeout(Duration::from_secs(10), fetch)
            .await
            .expect("the follow ends once the process is gone")
            .unwrap();
        assert_eq!(status, http::StatusCode::OK);
        assert_eq!(text, "first\nsecond\nthird\nfourth\n");
    }
}
