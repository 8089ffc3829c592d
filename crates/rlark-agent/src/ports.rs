//! A connection to a port **of a replica**, for the task HTTP proxy, `ssh -L` and
//! `kubectl port-forward` (the server's `tunnel::portforward::Destination`):
//! `GET /ports/{namespace}/{pod}/{port}` with `Connection: Upgrade` and
//! `Upgrade: rlark-port` on the local API. The answer is `101` followed by the
//! connection's bytes both ways, or an error naming what is wrong.
//!
//! A raw or docker replica without a Domain shares its node's network: its ports are on
//! the node's loopback, next to every other service of the node (the agent's, other
//! tasks', a database). A plain dial to `127.0.0.1:PORT` would reach any of them, so the
//! agent first checks that the port is the replica's:
//!
//! - the **listening sockets** on the port that a connection to `127.0.0.1` (or, when
//!   nothing is there, `::1`) would reach — bound to that address, to the wildcard
//!   address, or the IPv4-mapped form — are read from `/proc/net/tcp` and
//!   `/proc/net/tcp6` (the agent's network namespace, which such a replica shares);
//! - **every one** of them must be held by a process of the replica: a process of its
//!   process group, a descendant of its main process (`state.json`), or its TensorBoard
//!   (`tensorboard.pid`, its own process group) — found through `/proc/PID/fd`;
//! - then the agent connects to that address and port and answers `101`.
//!
//! `403` when a process outside the replica listens there (named by pid), `404` when the
//! replica never ran on this agent, `409` when it does not run, `502` when nothing
//! listens on the port or the connection fails, `400` for a bad name or upgrade.
//! A listener that a replica process started in a new session and process group and
//! reparented away from the main process is not found: it is not reachable from outside.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::api_body::{ApiBody, text_response};
use crate::runs::find_runs;
use crate::tasks::{ReplicaState, STATE_FILE};

/// Path prefix of the route on the local API.
pub const PORTS_PREFIX: &str = "/ports/";
/// The `Upgrade` token of the route.
pub const PORTS_UPGRADE: &str = "rlark-port";
/// Deadline of the connection to the replica's port.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A listening TCP socket of this network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Listener {
    pub addr: IpAddr,
    pub port: u16,
    pub inode: u64,
}

/// The listening sockets of `/proc/net/tcp` (`v6` false) or `/proc/net/tcp6` text.
pub(crate) fn parse_listeners(text: &str, v6: bool) -> Vec<Listener> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if fields.get(3) != Some(&"0A") {
                return None;
            }
            let (addr, port) = fields.get(1)?.split_once(':')?;
            let port = u16::from_str_radix(port, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            // Each 32-bit word is printed in host byte order.
            let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
            let addr = if v6 {
                if addr.len() != 32 {
                    return None;
                }
                let mut bytes = [0u8; 16];
                for i in 0..4 {
                    bytes[i * 4..i * 4 + 4].copy_from_slice(&word(addr.get(i * 8..i * 8 + 8)?)?);
                }
                IpAddr::V6(Ipv6Addr::from(bytes))
            } else {
                IpAddr::V4(Ipv4Addr::from(word(addr)?))
            };
            Some(Listener { addr, port, inode })
        })
        .collect()
}

/// Whether a connection to `target` would reach a socket listening on `bound`.
fn reaches(bound: IpAddr, target: IpAddr) -> bool {
    if bound == target || bound.is_unspecified() {
        return true;
    }
    match (bound, target) {
        // A dual-stack socket sees IPv4 peers as mapped addresses.
        (IpAddr::V6(v6), IpAddr::V4(v4)) => v6
            .to_ipv4_mapped()
            .is_some_and(|mapped| mapped == v4 || mapped.is_unspecified()),
        _ => false,
    }
}

/// How a port of the replica may be reached, or why not.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Dial this address.
    Dial(SocketAddr),
    /// Nothing listens on the port at the node's loopback.
    NothingListens,
    /// Someone else listens there: the inodes of the foreign listeners.
    Foreign(Vec<u64>),
}

/// Decide where `port` of a replica owning the socket inodes `owned` is: the first of
/// `127.0.0.1` and `::1` at which every listener is the replica's.
pub(crate) fn decide(listeners: &[Listener], owned: &HashSet<u64>, port: u16) -> Decision {
    let mut foreign = Vec::new();
    for target in [
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(Ipv6Addr::LOCALHOST),
    ] {
        let there: Vec<&Listener> = listeners
            .iter()
            .filter(|l| l.port == port && reaches(l.addr, target))
            .collect();
        if there.is_empty() {
            continue;
        }
        let strangers: Vec<u64> = there
            .iter()
            .filter(|l| !owned.contains(&l.inode))
            .map(|l| l.inode)
            .collect();
        if strangers.is_empty() {
            return Decision::Dial(SocketAddr::new(target, port));
        }
        foreign.extend(strangers);
    }
    if foreign.is_empty() {
        Decision::NothingListens
    } else {
        foreign.sort_unstable();
        foreign.dedup();
        Decision::Foreign(foreign)
    }
}

/// `(ppid, pgrp)` of every process.
fn process_table() -> HashMap<u32, (u32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = rlark_process::read_stat(i32::try_from(pid).ok()?).ok()?;
            Some((pid, (u32::try_from(stat.ppid).ok()?, stat.pgrp)))
        })
        .collect()
}

/// The processes of a replica: its main process `pid` and its descendants, and every
/// process of the groups `groups` (each > 1).
pub(crate) fn replica_processes(
    table: &HashMap<u32, (u32, i32)>,
    pid: u32,
    groups: &[i32],
) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&child, &(ppid, _)) in table {
        children.entry(ppid).or_default().push(child);
    }
    let mut found: HashSet<u32> = table
        .iter()
        .filter(|(_, (_, pgrp))| *pgrp > 1 && groups.contains(pgrp))
        .map(|(&p, _)| p)
        .collect();
    let mut visited = HashSet::new();
    let mut queue = vec![pid];
    while let Some(next) = queue.pop() {
        if visited.insert(next) {
            found.insert(next);
            queue.extend(children.get(&next).into_iter().flatten().copied());
        }
    }
    found
}

/// The socket inodes the processes `pids` hold.
fn socket_inodes(pids: &HashSet<u32>) -> HashSet<u64> {
    let mut inodes = HashSet::new();
    for pid in pids {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            if let Ok(target) = std::fs::read_link(fd.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse().ok())
            {
                inodes.insert(inode);
            }
        }
    }
    inodes
}

/// Who holds socket `inode` (a pid), for messages.
fn holder(inode: u64) -> Option<u32> {
    let wanted = format!("socket:[{inode}]");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.filter_map(Result::ok).any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == wanted.as_str())
                })
            })
        })
}

/// Find where `port` of the replica whose run directory is `run_dir` is (blocking: reads
/// `/proc`). `Err((status, message))`.
fn locate(run_dir: &Path, port: u16) -> Result<SocketAddr, (http::StatusCode, String)> {
    let state = ReplicaState::read(&run_dir.join(STATE_FILE)).map_err(|e| {
        (
            http::StatusCode::CONFLICT,
            format!("the replica is not running any more ({STATE_FILE}: {e})"),
        )
    })?;
    let mut groups = vec![state.pgid];
    if let Ok(text) = std::fs::read_to_string(run_dir.join(crate::tasks::tensorboard::PID_FILE))
        && let Some(pid) = text
            .split_whitespace()
            .next()
            .and_then(|p| p.parse::<i32>().ok())
    {
        // TensorBoard leads its own process group.
        groups.push(pid);
    }
    let table = process_table();
    let pids = replica_processes(&table, state.pid, &groups);
    let owned = socket_inodes(&pids);
    let mut listeners = Vec::new();
    for (path, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
        if let Ok(text) = std::fs::read_to_string(path) {
            listeners.extend(parse_listeners(&text, v6));
        }
    }
    match decide(&listeners, &owned, port) {
        Decision::Dial(addr) => Ok(addr),
        Decision::NothingListens => Err((
            http::StatusCode::BAD_GATEWAY,
            format!("nothing listens on port {port} of the node's loopback"),
        )),
        Decision::Foreign(inodes) => {
            let who = inodes
                .first()
                .and_then(|inode| holder(*inode))
                .map(|pid| format!(" (pid {pid})"))
                .unwrap_or_default();
            Err((
                http::StatusCode::FORBIDDEN,
                format!(
                    "port {port} of the node's loopback is not the replica's: a process outside \
                     the replica{who} listens there; only ports the replica's own processes \
                     listen on are reachable"
                ),
            ))
        }
    }
}

/// Answer `GET /ports/{namespace}/{pod}/{port}` (see the module documentation).
pub(crate) async fn handle<B>(
    tasks_dir: &Path,
    node: &str,
    shutdown: &CancellationToken,
    mut request: http::Request<B>,
) -> http::Response<ApiBody> {
    let path = request.uri().path().to_string();
    if request.method() != http::Method::GET {
        return text_response(
            http::StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not allowed: use GET with an upgrade",
                request.method()
            ),
        );
    }
    let parts: Vec<&str> = path
        .strip_prefix(PORTS_PREFIX)
        .unwrap_or_default()
        .split('/')
        .collect();
    let [namespace, pod, port_text] = parts.as_slice() else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("not found: {path}; use GET /ports/{{namespace}}/{{pod}}/{{port}}"),
        );
    };
    let (namespace, pod) = (*namespace, *pod);
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
    let Some(port) = port_text.parse::<u16>().ok().filter(|p| *p > 0) else {
        return text_response(
            http::StatusCode::BAD_REQUEST,
            format!("port {port_text:?} is not a port (1-65535)"),
        );
    };
    let upgrade = request
        .headers()
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(PORTS_UPGRADE.as_bytes()));
    if !upgrade {
        return text_response(
            http::StatusCode::BAD_REQUEST,
            format!("a connection to a replica's port needs Upgrade: {PORTS_UPGRADE}"),
        );
    }
    let Some((task, index)) = rlark_api::agent::parse_pod_name(pod) else {
        return text_response(
            http::StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod} is not a replica of a task (<task>-<index>)"),
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
                "pod {namespace}/{pod}: replica {index} of task {task:?} has not run on node {node:?}"
            ),
        );
    };
    if !run.running {
        return text_response(
            http::StatusCode::CONFLICT,
            format!(
                "pod {namespace}/{pod}: replica {index} of task {task:?} is not running on node {node:?}"
            ),
        );
    }
    let run_dir = run.dir.clone();
    let addr = match tokio::task::spawn_blocking(move || locate(&run_dir, port)).await {
        Ok(Ok(addr)) => addr,
        Ok(Err((status, message))) => {
            tracing::info!(namespace, pod, port, %message, "replica port refused");
            return text_response(status, format!("pod {namespace}/{pod}: {message}"));
        }
        Err(e) => return text_response(http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => {
            return text_response(
                http::StatusCode::BAD_GATEWAY,
                format!("pod {namespace}/{pod}: connect to {addr}: {e}"),
            );
        }
        Err(_) => {
            return text_response(
                http::StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "pod {namespace}/{pod}: connect to {addr}: no answer within {CONNECT_TIMEOUT:?}"
                ),
            );
        }
    };
    let _ = tcp.set_nodelay(true);
    let on_upgrade = hyper::upgrade::on(&mut request);
    let shutdown = shutdown.clone();
    let what = format!("{namespace}/{pod}:{port}");
    tokio::spawn(async move {
        let mut tcp = tcp;
        match on_upgrade.await {
            Ok(upgraded) => {
                let mut upgraded = TokioIo::new(upgraded);
                tokio::select! {
                    copied = tokio::io::copy_bidirectional(&mut upgraded, &mut tcp) => {
                        tracing::debug!(target = %what, ?copied, "replica port connection ended");
                    }
                    () = shutdown.cancelled() => {}
                }
            }
            Err(error) => tracing::debug!(%error, target = %what, "replica port upgrade failed"),
        }
    });
    let mut response = http::Response::new(ApiBody::default());
    *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("Upgrade"),
    );
    response.headers_mut().insert(
        http::header::UPGRADE,
        http::HeaderValue::from_static(PORTS_UPGRADE),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 100 0 0 10 0
   2: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 333 1 0000000000000000 20 4 30 10 -1
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn proc_net_tcp_listeners_parse() {
        let v4 = parse_listeners(TCP, false);
        assert_eq!(
            v4,
            vec![
                Listener {
                    addr: "127.0.0.1".parse().unwrap(),
                    port: 8080,
                    inode: 111
                },
                Listener {
                    addr: "0.0.0.0".parse().unwrap(),
                    port: 22,
                    inode: 222
                },
            ],
            "established sockets are not listeners"
        );
        let v6 = parse_listeners(TCP6, true);
        assert_eq!(v6[0].addr, "::1".parse::<IpAddr>().unwrap());
        assert_eq!(v6[0].port, 8081);
        assert_eq!(v6[1].addr, "::".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn only_ports_every_listener_of_which_is_the_replicas_are_dialed() {
        let mut all = parse_listeners(TCP, false);
        all.extend(parse_listeners(TCP6, true));
        let owned: HashSet<u64> = [111, 444].into_iter().collect();
        assert_eq!(
            decide(&all, &owned, 8080),
            Decision::Dial("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(
            decide(&all, &owned, 8081),
            Decision::Dial("[::1]:8081".parse().unwrap())
        );
        // sshd on 0.0.0.0:22, a wildcard on [::]:80: not the replica's.
        assert_eq!(decide(&all, &owned, 22), Decision::Foreign(vec![222]));
        assert_eq!(decide(&all, &owned, 80), Decision::Foreign(vec![555]));
        assert_eq!(decide(&all, &owned, 9999), Decision::NothingListens);
        // A foreign listener beside the replica's on the same port (SO_REUSEPORT): refused.
        let shared = [
            all[0],
            Listener {
                inode: 999,
                ..all[0]
            },
        ];
        assert_eq!(decide(&shared, &owned, 8080), Decision::Foreign(vec![999]));
    }

    #[test]
    fn a_replicas_processes_are_its_group_and_its_descendants() {
        // 10 main (group 10) → 14 (group 10) → 11 (setsid: group 11) → 12; 20 another
        // task; 30 TensorBoard.
        let table: HashMap<u32, (u32, i32)> = [
            (10, (1, 10)),
            (14, (10, 10)),
            (11, (14, 11)),
            (12, (11, 11)),
            (13, (1, 10)),
            (20, (1, 20)),
            (30, (1, 30)),
            (31, (30, 30)),
        ]
        .into_iter()
        .collect();
        let mut found: Vec<u32> = replica_processes(&table, 10, &[10, 30])
            .into_iter()
            .collect();
        found.sort_unstable();
        assert_eq!(found, vec![10, 11, 12, 13, 14, 30, 31]);
    }

    #[test]
    fn this_process_owns_its_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id();
        let pids: HashSet<u32> = [me].into_iter().collect();
        let owned = socket_inodes(&pids);
        let text = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let listeners = parse_listeners(&text, false);
        assert_eq!(
            decide(&listeners, &owned, port),
            Decision::Dial(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port))
        );
        assert!(matches!(
            decide(&listeners, &HashSet::new(), port),
            Decision::Foreign(_)
        ));
    }
}
