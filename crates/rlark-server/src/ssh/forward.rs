//! `ssh -L LOCAL:HOST:PORT TASK@server`: a `direct-tcpip` channel into the replica's network
//! view, dialed by its agent through the tunnel exactly as a port-forward is
//! (`tunnel::portforward::Destination`: a raw or docker replica's ports are on its node's
//! loopback, a member Pod's at its IP; a raw replica in a Domain is refused, as for
//! port-forward).
//!
//! HOST must be the replica itself: `localhost`, `127.0.0.1` or `::1` (the replica's
//! loopback), or the replica's own IP; anything else is refused ("administratively
//! prohibited"), so a forward cannot reach other hosts of the agent's network. On a node's
//! loopback, PORT must be one the replica's own processes listen on (the agent checks,
//! `tunnel::replica_port`), so a forward cannot reach the node's other services either.
//! Each forward holds one of its user's share of the agent's streams
//! (`Hub::user_share`). Each forward is audited (`action: ssh-forward`).

use std::sync::Arc;

use rlark_apiserver::audit::AuditEntry;
use russh::ChannelOpenFailure;
use russh::server::{ChannelOpenHandle, Msg};

use super::SshState;
use super::auth::{Login, Target};
use super::session::Closing;
use crate::task_access;
use crate::tunnel::portforward::Destination;

/// Why a forward was not opened.
enum Refused {
    /// Not allowed: audited as denied.
    Denied(String),
    /// Allowed, but the agent could not connect.
    Unreachable(String),
    /// The user holds their share of the agent's streams.
    Limit(String),
}

/// The replica and a stream to `host:port` in its network view.
async fn connect(
    state: &SshState,
    login: &Login,
    host: &str,
    port: u32,
) -> Result<(String, crate::tunnel::HubStream, u16), Refused> {
    let (Target::Task { index, .. }, Some(task)) = (&login.target, &login.task) else {
        return Err(Refused::Denied(
            "forwarding needs a task login (TASK@server), not the menu".into(),
        ));
    };
    let port = match u16::try_from(port) {
        Ok(port) if port > 0 => port,
        _ => return Err(Refused::Denied(format!("port {port} is out of range"))),
    };
    let replica = task_access::running_replica(&*state.store, Arc::clone(task), *index)
        .await
        .map_err(|e| Refused::Denied(e.to_string()))?;
    let destination =
        Destination::of(&replica.pod, Some(&replica.task)).map_err(Refused::Denied)?;
    let own_ip = replica.pod["status"]["ip"].as_str().unwrap_or_default();
    if !matches!(host, "localhost" | "127.0.0.1" | "::1") && host != own_ip {
        return Err(Refused::Denied(format!(
            "forward to {host}:{port} refused: only the replica itself (localhost, \
             127.0.0.1, ::1 or its IP) may be reached"
        )));
    }
    let share = state
        .hub
        .user_share(replica.cluster(), &login.identity.user)
        .map_err(|e| {
            state.metrics.refused("agent-streams-per-user");
            Refused::Limit(e.message)
        })?;
    let stream = match destination.dial(&state.hub, replica.cluster(), port).await {
        Ok(stream) => stream.with_share(share),
        // A port that is not the replica's (another service of the node): not allowed.
        Err(e) if e.status == rlark_tunnel::header::Status::Forbidden => {
            return Err(Refused::Denied(format!(
                "{}: forward to port {port} refused: {}",
                replica.pod_name, e.message
            )));
        }
        Err(e) => {
            return Err(Refused::Unreachable(format!(
                "{}: dial port {port}: {e}",
                replica.pod_name
            )));
        }
    };
    Ok((replica.pod_name, stream, port))
}

/// Open the forward, or refuse the channel.
pub(crate) async fn open(
    state: Arc<SshState>,
    login: Arc<Login>,
    channel: russh::Channel<Msg>,
    host: String,
    port: u32,
    reply: ChannelOpenHandle,
    closing: Closing,
) {
    let (pod, stream, port) = match connect(&state, &login, &host, port).await {
        Ok(connected) => connected,
        Err(Refused::Denied(reason)) => {
            audit(&state, &login, None, &reason, "denied");
            reply
                .reject(ChannelOpenFailure::Other {
                    code: 1,
                    reason: format!("rlark: {reason}"),
                })
                .await;
            return;
        }
        Err(Refused::Unreachable(reason)) => {
            audit(&state, &login, None, &reason, "allowed");
            reply.reject(ChannelOpenFailure::ConnectFailed).await;
            return;
        }
        Err(Refused::Limit(reason)) => {
            audit(&state, &login, None, &reason, "denied");
            reply
                .reject(ChannelOpenFailure::Other {
                    // RFC 4254 SSH_OPEN_RESOURCE_SHORTAGE
                    code: 4,
                    reason: format!("rlark: {reason}"),
                })
                .await;
            return;
        }
    };
    reply.accept().await;
    let mut client = channel.into_stream();
    let mut target = stream;
    let copied = tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut target) => copied.ok(),
        () = closing.token.cancelled() => None,
    };
    let detail = match copied {
        Some((up, down)) => format!("port {port}: bytes in {up} out {down}"),
        None => format!(
            "port {port}: ended ({})",
            closing.reason.get().map_or("error", String::as_str)
        ),
    };
    audit(&state, &login, Some(&pod), &detail, "allowed");
}

fn audit(state: &SshState, login: &Login, pod: Option<&str>, detail: &str, decision: &str) {
    let (namespace, task) = login
        .task
        .as_deref()
        .map(task_access::namespace_and_name)
        .unwrap_or_default();
    state.audit.record(AuditEntry {
        verb: "ssh-forward".into(),
        resource: "pods.rlinf.io/ssh".into(),
        namespace,
        name: pod.map(str::to_string).unwrap_or(task),
        reason: format!("{detail} via {}", login.credential.describe()),
        ..AuditEntry::now("ssh-forward", decision).by(Some(&login.identity))
    });
}
