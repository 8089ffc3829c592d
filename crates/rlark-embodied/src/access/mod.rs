//! Who may call a device (docs/embodied.md, "Who may call a device"; docs/security.md).
//!
//! rlark's agent gives each replica the robots and cameras it holds, and publishes in the
//! socket directory who runs and who holds what: [`HOLDERS_FILE`] ([`Holders`], written by
//! [`publish`]; the file is `rlark_proto::holders`, re-exported here). Each entry is one
//! replica of the agent on this host, holding devices or not: its name, the processes that
//! root it (PID and `/proc` start ticks), optionally uids only it runs as, whether it is
//! starting, and the devices it holds (Node device IDs: `robot-arm-0`, `camera-cam-0`).
//!
//! The runtime ([`Authorizer`]) decides every call that names one device (StartRobot,
//! StopRobot, GetRobotStatus, SwitchMode, ListModes, GetRobotLogs, ResetRobot;
//! GetCameraInfo, OpenCamera, CloseCamera, CaptureFrame, each camera of CaptureFrames,
//! WatchFrames) from what the kernel says of the caller, never from what it sends: the
//! PID and uid of the connection (SO_PEERCRED, [`crate::peer`]), and from `/proc` the
//! caller's session and its ancestors. The rule is [`decide`] (pure):
//!
//! 1. No holders file was ever seen in the socket directory: every call is allowed (a
//!    runtime no rlark agent allocates from: standalone, or the kubelet device plugin's,
//!    where pods are not identified). Once seen, the runtime enforces for as long as it
//!    runs; a file that disappears or cannot be trusted (not owned by root or the
//!    runtime's user, writable by others, unparsable) counts as no replicas at all.
//! 2. The caller **belongs to a replica** when its session leader or one of its ancestors
//!    is a root of that replica (same PID and start ticks), or its uid is one of the
//!    replica's own. Such a caller may call the devices its replica holds, and nothing
//!    else: PERMISSION_DENIED naming the device and its holder. The ancestor rule covers
//!    a process that left the replica's session (`setsid`): the supervisor is a child
//!    subreaper, so the replica's orphans stay its descendants.
//! 3. Any other caller whose uid is 0 or the runtime's own may call every device: rlark's
//!    agent (its end-of-run stop, the console's robot actions and live view), host admins.
//! 4. Everyone else is refused. While a replica is starting, such a call first waits (at
//!    most [`PENDING_WAIT`]) for the agent to publish the replica's processes: a replica
//!    may call before the agent has written its supervisor's PID.
//!
//! List calls (ListRobots, WatchRobots, ListCameras, WatchCameras) answer with the devices
//! the caller may call ([`Visible`]); package calls and DeviceService (devinit) are not
//! about one device and stay as they were.

mod decide;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use crate::peer::{PeerInfo, ProcStat, live_stat, start_ticks};
pub use rlark_proto::holders::{
    HOLDERS_FILE, Holders, ProcessRef, PublishError, ReplicaHolder, camera_device_id, publish,
    read, robot_device_id,
};

pub use decide::{Decision, Standing, Visible, decide, standing, visible};

/// How long a call from an unidentified process waits for a starting replica to be
/// published before it is refused.
pub const PENDING_WAIT: Duration = Duration::from_secs(5);
/// How often the file is looked at during that wait.
const PENDING_POLL: Duration = Duration::from_millis(25);
/// How often a runtime that has seen no holders file looks for one.
const ENFORCE_POLL: Duration = Duration::from_millis(500);
/// How many ancestors of a caller are looked at, at most.
const MAX_LINEAGE: usize = 256;

/// The caller of one call, as the kernel reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caller {
    /// PID of the connection's process (SO_PEERCRED), if known.
    pub pid: Option<i32>,
    /// Its uid (SO_PEERCRED).
    pub uid: Option<u32>,
    /// The process, then its parent, and so on up (empty when `/proc` could not tell, or
    /// the process that connected is gone).
    pub lineage: Vec<ProcessRef>,
    /// Its session leader, when alive.
    pub session: Option<ProcessRef>,
}

/// Device calls refused (one counter per process; `rlark_embodied_calls_denied_total`).
pub fn calls_denied() -> &'static prometheus_client::metrics::counter::Counter {
    static DENIED: std::sync::OnceLock<prometheus_client::metrics::counter::Counter> =
        std::sync::OnceLock::new();
    DENIED.get_or_init(Default::default)
}

/// The holders table as last read, and when it changes.
#[derive(Debug, Default)]
struct Cache {
    /// What identified the file's version read last (device, inode, size, mtime).
    stamp: Option<(u64, u64, u64, i64, i64)>,
    /// A holders file was seen once: enforce from then on.
    enforcing: bool,
    holders: Arc<Holders>,
}

/// The runtime's side: reads [`HOLDERS_FILE`] when it changes, and decides calls.
#[derive(Debug)]
pub struct Authorizer {
    path: PathBuf,
    /// uid 0 and the runtime's own.
    admin_uids: Vec<u32>,
    cache: Mutex<Cache>,
    /// The sockets whose calls are authorized here: 0660 until the runtime enforces, then
    /// 0666 (replicas run as users of their own; every call is checked).
    sockets: Mutex<Vec<PathBuf>>,
}

impl Authorizer {
    /// The authorizer of the runtime serving in `socket_dir`.
    pub fn new(socket_dir: &Path) -> Arc<Self> {
        let me = nix::unistd::geteuid().as_raw();
        let mut admin_uids = vec![0];
        if me != 0 {
            admin_uids.push(me);
        }
        let authorizer = Arc::new(Self {
            path: socket_dir.join(HOLDERS_FILE),
            admin_uids,
            cache: Mutex::default(),
            sockets: Mutex::default(),
        });
        authorizer.current();
        authorizer
    }

    /// Follow `sockets` (bound, 0660): opened to every user (0666) once the runtime
    /// enforces, as every call on them is then checked; a replica running as a user of its
    /// own could not connect otherwise.
    pub fn serve_sockets(&self, sockets: &[PathBuf]) {
        self.sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(sockets);
        if self.current().is_some() {
            self.open_sockets();
        }
    }

    /// Look for the holders file every [`ENFORCE_POLL`] until one appears (then the
    /// sockets open, see [`Self::serve_sockets`]) or `shutdown`: a replica of another user
    /// cannot connect, and so cannot make the runtime look, before.
    pub async fn watch_for_holders(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        while self.current().is_none() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(ENFORCE_POLL) => {}
            }
        }
    }

    fn open_sockets(&self) {
        use std::os::unix::fs::PermissionsExt as _;
        for socket in self
            .sockets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            if let Err(error) =
                std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))
            {
                tracing::warn!(socket = %socket.display(), %error, "cannot open the socket to replicas' users");
            }
        }
    }

    /// The holders table now; `None` while no holders file was ever seen (every call is
    /// allowed).
    pub fn current(&self) -> Option<Arc<Holders>> {
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let meta = match std::fs::symlink_metadata(&self.path) {
            Ok(meta) => meta,
            Err(error) => {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(file = %self.path.display(), %error, "cannot read the holders file");
                }
                if cache.enforcing && cache.stamp.take().is_some() {
                    tracing::warn!(file = %self.path.display(), "the holders file is gone: no replica may call a device until it is back");
                    cache.holders = Arc::default();
                }
                return cache.enforcing.then(|| Arc::clone(&cache.holders));
            }
        };
        let stamp = (
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.mtime(),
            meta.mtime_nsec(),
        );
        // A file rewritten within one tick of the file-system clock may show the same
        // stamp (an inode number is reused at once): a recent one is read again.
        let recent = meta.modified().ok().is_none_or(|at| {
            at.elapsed()
                .map_or(true, |age| age < Duration::from_millis(100))
        });
        if cache.enforcing && cache.stamp == Some(stamp) && !recent {
            return Some(Arc::clone(&cache.holders));
        }
        if !cache.enforcing {
            cache.enforcing = true;
            drop(cache);
            tracing::info!(file = %self.path.display(), "holders published: device calls are authorized by their caller from now on");
            self.open_sockets();
            cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        }
        cache.stamp = Some(stamp);
        cache.holders = Arc::new(self.load(&meta).unwrap_or_else(|why| {
            tracing::error!(file = %self.path.display(), %why, "holders file not trusted: no replica may call a device");
            Holders::default()
        }));
        Some(Arc::clone(&cache.holders))
    }

    /// Read the file, if it can be trusted.
    fn load(&self, meta: &std::fs::Metadata) -> Result<Holders, String> {
        if !meta.file_type().is_file() {
            return Err("not a regular file".into());
        }
        if !self.admin_uids.contains(&meta.uid()) {
            return Err(format!(
                "owned by uid {}, not by root or this runtime's user",
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "mode {:o}: writable by group or others",
                meta.mode() & 0o777
            ));
        }
        let text = std::fs::read(&self.path).map_err(|e| e.to_string())?;
        serde_json::from_slice(&text).map_err(|e| e.to_string())
    }

    /// Allow or refuse a call for `device` (a Node device ID) from `peer` (module
    /// documentation). A refusal is PERMISSION_DENIED naming the device and its holder.
    pub async fn check(&self, peer: Option<&PeerInfo>, device: &str) -> Result<(), tonic::Status> {
        let deadline = tokio::time::Instant::now() + PENDING_WAIT;
        loop {
            let Some(holders) = self.current() else {
                return Ok(());
            };
            let caller = caller_of(peer);
            let message = match decide(&holders, device, &caller, &self.admin_uids) {
                Decision::Allow => return Ok(()),
                Decision::Deny(message) => message,
                Decision::Wait(message) => {
                    if tokio::time::Instant::now() < deadline {
                        tokio::time::sleep(PENDING_POLL).await;
                        continue;
                    }
                    message
                }
            };
            calls_denied().inc();
            tracing::warn!(device, pid = caller.pid, uid = caller.uid, %message, "device call refused");
            return Err(tonic::Status::permission_denied(message));
        }
    }

    /// The devices `peer` may call, for list calls (waits for a starting replica as
    /// [`Self::check`] does; never refuses).
    pub async fn visible(&self, peer: Option<&PeerInfo>) -> Visible {
        let deadline = tokio::time::Instant::now() + PENDING_WAIT;
        loop {
            let Some(holders) = self.current() else {
                return Visible::All;
            };
            let caller = caller_of(peer);
            let starting = holders.replicas.iter().any(|r| r.starting);
            let seen = visible(&holders, &caller, &self.admin_uids);
            if seen != Visible::Only(Vec::new())
                || !starting
                || tokio::time::Instant::now() >= deadline
            {
                return seen;
            }
            tokio::time::sleep(PENDING_POLL).await;
        }
    }

    /// [`Self::visible`] without waiting (each list of a watch).
    pub fn visible_now(&self, peer: Option<&PeerInfo>) -> Visible {
        match self.current() {
            None => Visible::All,
            Some(holders) => visible(&holders, &caller_of(peer), &self.admin_uids),
        }
    }
}

/// What `/proc` says of the process that made a connection: its lineage and session. A
/// process that is gone (its PID's start time is not the one seen when it connected) has
/// neither.
pub fn caller_of(peer: Option<&PeerInfo>) -> Caller {
    let Some(peer) = peer else {
        return Caller::default();
    };
    let mut caller = Caller {
        pid: peer.pid,
        uid: peer.uid,
        ..Caller::default()
    };
    let Some(pid) = peer.pid.filter(|p| *p > 0) else {
        return caller;
    };
    let Some(first) = live_stat(pid) else {
        return caller;
    };
    if peer.start_ticks.is_some_and(|t| t != first.start_ticks) {
        return caller;
    }
    if first.session > 0
        && let Some(leader) = live_stat(first.session)
    {
        caller.session = Some(ProcessRef {
            pid: first.session,
            start_ticks: leader.start_ticks,
        });
    }
    let mut current = Some((pid, first));
    while let Some((pid, stat)) = current {
        caller.lineage.push(ProcessRef {
            pid,
            start_ticks: stat.start_ticks,
        });
        if stat.ppid <= 1 || caller.lineage.len() >= MAX_LINEAGE {
            break;
        }
        current = live_stat(stat.ppid).map(|s| (stat.ppid, s));
    }
    caller
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_lineage_up_to_init() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let peer = PeerInfo {
            connection: 1,
            pid: Some(me),
            uid: Some(0),
            start_ticks: start_ticks(me),
        };
        let caller = caller_of(Some(&peer));
        assert_eq!(caller.lineage.first().map(|p| p.pid), Some(me));
        // The session leader is named only when this PID namespace can see it: under a
        // container runtime the test may run in a session whose leader is outside
        // (the kernel reports session 0) or already gone.
        let sid = live_stat(me).map(|s| s.session).unwrap_or(0);
        let leader_visible = sid > 0 && live_stat(sid).is_some();
        assert_eq!(
            caller.session.map(|s| s.pid),
            leader_visible.then_some(sid),
            "session {sid}, visible: {leader_visible}"
        );
        // A different start time: the process that connected is gone.
        let gone = PeerInfo {
            start_ticks: peer.start_ticks.map(|t| t + 1),
            ..peer
        };
        assert!(caller_of(Some(&gone)).lineage.is_empty());
    }

    #[test]
    fn publish_replaces_the_file_whole_and_the_authorizer_follows() {
        let dir = tempfile::tempdir().expect("dir");
        let authorizer = Authorizer::new(dir.path());
        assert_eq!(authorizer.current(), None, "no file: open");
        let socket = dir.path().join("x.sock");
        std::fs::write(&socket, "").expect("socket stand-in");
        std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o660))
            .expect("chmod");
        authorizer.serve_sockets(std::slice::from_ref(&socket));
        let socket_mode = || std::fs::metadata(&socket).expect("socket").mode() & 0o777;
        assert_eq!(socket_mode(), 0o660, "closed while open to every call");
        let mut holders = Holders::default();
        holders.replicas.push(ReplicaHolder {
            name: "ns/a".into(),
            devices: vec!["robot-arm-0".into()],
            ..ReplicaHolder::default()
        });
        publish(dir.path(), &holders).expect("publish");
        assert_eq!(authorizer.current().as_deref(), Some(&holders));
        assert_eq!(socket_mode(), 0o666, "every call is checked now");
        let mode = std::fs::metadata(dir.path().join(HOLDERS_FILE))
            .expect("file")
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        holders.replicas.clear();
        publish(dir.path(), &holders).expect("publish again");
        assert_eq!(authorizer.current().as_deref(), Some(&holders));
        // Gone: enforced with nobody; untrusted: the same.
        std::fs::remove_file(dir.path().join(HOLDERS_FILE)).expect("remove");
        assert_eq!(authorizer.current().as_deref(), Some(&Holders::default()));
        std::fs::write(
            dir.path().join(HOLDERS_FILE),
            "{\"replicas\": [{\"name\": \"x\", \"devices\": [\"robot-arm-0\"]}]}",
        )
        .expect("write");
        std::fs::set_permissions(
            dir.path().join(HOLDERS_FILE),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .expect("chmod");
        assert_eq!(
            authorizer.current().as_deref(),
            Some(&Holders::default()),
            "writable by others: not trusted"
        );
    }
}
