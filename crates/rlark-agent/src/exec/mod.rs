//! Exec into a running replica: `GET /exec/{namespace}/{pod}?command=...&stdin=..&stdout=..
//! &stderr=..&tty=..` on the agent's local API (`api.rs`), a WebSocket speaking
//! Kubernetes' remotecommand protocol (`v5.channel.k8s.io`, else `v4.channel.k8s.io`; the
//! vocabulary is `rlark_api::agent::local`). Like the rest of the local API it is reached
//! only through the tunnel; the hub authorizes the caller (admins only) before it opens the
//! stream.
//!
//! # What runs
//!
//! In an isolated replica (`REPLICA_DIR/sandbox.json`, docs/security.md, "Replica
//! isolation") the command runs through the supervisor's `--enter`: in the replica's
//! network and mount namespaces and control groups, as its user; otherwise it runs as the
//! agent's user. Either way it starts in the replica's **current** working
//! directory with the replica's **environment** (the Task's `environment` and the `RLARK_*`
//! contract): both are read from `/proc/<pid>/cwd` and `/proc/<pid>/environ` of the process
//! the replica's `state.json` names, which must be live (else `409`). When `/proc` cannot
//! be read (another user, a vanished process), the fallback is the replica's `work/`
//! directory and the agent's own environment plus the `RLARK_*` variables `state.json`
//! knows (`RLARK_NAMESPACE`, `RLARK_TASK`, `RLARK_TASK_UID`, `RLARK_POD_NAME`,
//! `RLARK_REPLICA_INDEX`).
//!
//! - `tty=true`: the process gets a new PTY as controlling terminal, is the leader of a new
//!   session, and has `TERM=xterm` unless the environment sets `TERM`. Its initial size is
//!   the first resize message when one arrives within [`INITIAL_SIZE_WAIT`] of the upgrade
//!   (clients send it first), else 80×24; later resize messages resize the PTY (`SIGWINCH`).
//!   Stdin bytes go to the PTY; everything the PTY prints goes out on channel 1 (stderr is
//!   merged, as in Kubernetes). A terminal has no end of input: closing channel 0 is
//!   ignored (send `exit` or `^D`).
//! - `tty=false`: pipes, the process leads a new process group. Stdout goes out on
//!   channel 1, stderr on channel 2 (each only if asked for, else `/dev/null`); with
//!   `stdin=true` channel 0 feeds its stdin, and a v5 close of channel 0 closes it (`cat`
//!   sees its end of input). Without `stdin=true` its stdin is `/dev/null`.
//!
//! # Lifecycle
//!
//! - When the process exits, whatever is left of its process group (and, with a PTY, its
//!   session) is killed (SIGKILL) — an exec leaves nothing behind, as a replica does not —,
//!   the output is sent to its end (at most [`DRAIN_TIMEOUT`] more), then the status on
//!   channel 3 (`Success`, or `NonZeroExitCode` with the code; `128+n` for a signal `n`), then
//!   a normal WebSocket close; the connection ends once the client answered it (at most
//!   [`CLOSE_TIMEOUT`]).
//! - A program that cannot be started gets a `Failure` status (reason `InternalError`)
//!   naming the problem, then the close.
//! - When the client goes away (close message, error, the tunnel stream ends) or the agent
//!   stops, the process group (and session) gets SIGHUP, then SIGKILL after [`HANGUP_GRACE`]:
//!   no orphan is left.
//! - Messages are at most [`MAX_EXEC_MESSAGE`] bytes; output is sent in pieces of at most
//!   [`CHUNK`] bytes through a bounded queue, so a slow client slows the process down
//!   instead of growing a buffer.
//!
//! # Errors before the upgrade
//!
//! `400` for a bad name, query or upgrade request (each named), `404` when the replica never
//! ran on this agent, `409` when it is not running (no live process), `405` for a method other
//! than `GET`.

mod docker;
mod process;
mod session;
mod target;
#[cfg(test)]
mod tests;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rlark_api::agent::local::{ExecOptions, MAX_EXEC_MESSAGE};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

use rlark_api::agent::parse_pod_name;

use crate::api_body::{ApiBody, text_response};
use crate::runs::{container_param, find_runs};
use crate::runtime::docker::{DockerClient, container_index};

use docker::{DockerSession, run_docker_session};
use session::run_session;
use target::ProcessTarget;

/// Path prefix of the exec route on the local API.
pub const EXEC_PREFIX: &str = "/exec/";
/// How long a terminal session waits for the client's first resize before it starts the
/// process at 80×24.
pub const INITIAL_SIZE_WAIT: Duration = Duration::from_millis(250);
/// SIGHUP → SIGKILL grace when the client goes away.
pub const HANGUP_GRACE: Duration = Duration::from_secs(2);
/// How long output is still read once the process (and its group) has exited.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest piece of output sent in one message.
pub const CHUNK: usize = 32 * 1024;
/// Output messages queued towards the client.
pub(super) const OUT_QUEUE: usize = 8;
/// How long the final status and close may take to leave, and the client's close to
/// answer.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a dying process group is checked.
pub(super) const GONE_POLL: Duration = Duration::from_millis(50);
/// Most of `/proc/<pid>/environ` read.
pub(super) const MAX_ENVIRON: u64 = 4 * 1024 * 1024;

/// WebSocket limits of an exec session: [`MAX_EXEC_MESSAGE`] per message and frame.
pub fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_EXEC_MESSAGE))
        .max_frame_size(Some(MAX_EXEC_MESSAGE))
}

/// Answer `GET /exec/{namespace}/{pod}?...` (see the module documentation): a `101` whose
/// upgraded connection then carries the session, or an error response.
pub(crate) async fn handle<B>(
    tasks_dir: &Path,
    node: &str,
    docker: Option<&DockerClient>,
    supervisor: Option<&[OsString]>,
    shutdown: &CancellationToken,
    mut request: http::Request<B>,
) -> http::Response<ApiBody> {
    let path = request.uri().path().to_string();
    if request.method() != http::Method::GET {
        return text_response(
            http::StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not allowed: exec is GET with a WebSocket upgrade",
                request.method()
            ),
        );
    }
    let Some((namespace, pod)) = path
        .strip_prefix(EXEC_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .filter(|(_, pod)| !pod.contains('/'))
    else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("not found: {path}; use GET /exec/{{namespace}}/{{pod}}"),
        );
    };
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
    let options = match ExecOptions::parse(request.uri().query()) {
        Ok(options) => options,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let container = match container_param(request.uri().query()) {
        Ok(container) => container,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let upgrade = match rlark_api::agent::local::exec_upgrade(request.headers()) {
        Ok(upgrade) => upgrade,
        Err(message) => return text_response(http::StatusCode::BAD_REQUEST, message),
    };
    let Some((task, index)) = parse_pod_name(pod) else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!(
                "pod {namespace}/{pod} is not a replica of a task (replica pods are named \
                 <task>-<index>)"
            ),
        );
    };
    let (dir, ns, task_name) = (
        tasks_dir.to_path_buf(),
        namespace.to_string(),
        task.to_string(),
    );
    let runs = tokio::task::spawn_blocking(move || find_runs(&dir, &ns, &task_name, index))
        .await
        .unwrap_or_default();
    let Some(run) = runs.first() else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!(
                "pod {namespace}/{pod}: replica {index} of task {task:?} has not run on node \
                 {node:?}"
            ),
        );
    };
    if !run.running {
        return text_response(
            http::StatusCode::CONFLICT,
            format!(
                "pod {namespace}/{pod}: replica {index} of task {task:?} is not running on node \
                 {node:?} (no live process to exec into)"
            ),
        );
    }
    let run_dir = run.dir.clone();
    let mut target = match tokio::task::spawn_blocking(move || ProcessTarget::of(&run_dir)).await {
        Ok(Ok(target)) => target,
        Ok(Err(message)) => return text_response(http::StatusCode::CONFLICT, message),
        Err(e) => return text_response(http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    if let Some(enter) = target.enter.as_mut() {
        match supervisor {
            Some(command) if !command.is_empty() => enter.supervisor = command.to_vec(),
            _ => {
                return text_response(
                    http::StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "pod {namespace}/{pod}: replica {index} of task {task:?} runs in \
                         namespaces of its own and this agent has no supervisor command to \
                         enter them with"
                    ),
                );
            }
        }
    }
    // `-c NAME`: that container of a docker replica (a sidecar), else the main one.
    match container_index(&target.container_names, container.as_deref()) {
        Ok(i) => target.container = target.containers.get(i).cloned(),
        Err(message) => {
            return text_response(
                http::StatusCode::BAD_REQUEST,
                format!("pod {namespace}/{pod}: {message}"),
            );
        }
    }
    let engine = match (&target.container, docker) {
        (None, _) => None,
        (Some(_), Some(client)) => Some(client.clone()),
        (Some(container), None) => {
            return text_response(
                http::StatusCode::CONFLICT,
                format!(
                    "pod {namespace}/{pod}: replica {index} of task {task:?} runs in container \
                     {container}, and this agent has no Docker engine to exec through"
                ),
            );
        }
    };
    tracing::info!(
        namespace,
        pod,
        command = ?options.command,
        tty = options.tty,
        stdin = options.stdin,
        "exec"
    );

    let on_upgrade = hyper::upgrade::on(&mut request);
    let shutdown = shutdown.clone();
    let what = format!("{namespace}/{pod}");
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let ws = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(ws_config()),
                )
                .await;
                let outcome = match (engine, target.container.clone()) {
                    (Some(client), Some(container)) => {
                        let session = DockerSession { client, container };
                        run_docker_session(ws, upgrade.protocol, options, session, shutdown).await
                    }
                    _ => run_session(ws, upgrade.protocol, options, target, shutdown).await,
                };
                tracing::info!(pod = %what, outcome = ?outcome, "exec ended");
            }
            Err(error) => tracing::debug!(%error, pod = %what, "exec upgrade failed"),
        }
    });
    switching_protocols(&upgrade)
}

/// The `101` accepting the exec WebSocket `upgrade` asks for.
pub(crate) fn switching_protocols(
    upgrade: &rlark_api::agent::local::ExecUpgrade,
) -> http::Response<ApiBody> {
    let accept =
        tokio_tungstenite::tungstenite::handshake::derive_accept_key(upgrade.key.as_bytes());
    let mut response = http::Response::new(ApiBody::default());
    *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    headers.insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(upgrade.protocol),
    );
    match http::HeaderValue::from_str(&accept) {
        Ok(value) => {
            headers.insert(http::header::SEC_WEBSOCKET_ACCEPT, value);
        }
        Err(e) => return text_response(http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
    response
}
