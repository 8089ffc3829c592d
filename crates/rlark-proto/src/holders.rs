//! The holders file (docs/embodied.md, "Who may call a device"; docs/security.md): who
//! runs and who holds what, as rlark's agent publishes it for the embodied runtime.
//!
//! rlark's agent gives each replica the robots and cameras it holds, and publishes in the
//! socket directory [`HOLDERS_FILE`] ([`Holders`], written by [`publish`], atomically, by a
//! root-owned process). Each entry is one replica of the agent on this host, holding
//! devices or not: its name (`<namespace>/<pod>`), the processes that root it (a raw
//! replica's supervisor, a docker replica's main container's init: PID and `/proc` start
//! ticks, so a reused PID does not count), optionally uids only it runs as, whether it is
//! starting (its processes not known yet), and the devices it holds (Node device IDs:
//! [`robot_device_id`], [`camera_device_id`]). The runtime reads it and decides every
//! device call from it (`rlark_embodied::access`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file in the socket directory that says who holds what.
pub const HOLDERS_FILE: &str = "holders.json";

/// Who runs and who holds what, as the agent publishes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holders {
    /// Every replica of the agent on this host.
    #[serde(default)]
    pub replicas: Vec<ReplicaHolder>,
}

/// One replica in [`Holders`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaHolder {
    /// `<namespace>/<pod>`.
    pub name: String,
    /// The processes whose session members and descendants are the replica.
    #[serde(default)]
    pub roots: Vec<ProcessRef>,
    /// Uids no other process on the host runs as (a per-replica user).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uids: Vec<u32>,
    /// Being started: its roots are not known yet.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub starting: bool,
    /// The devices it holds (Node device IDs).
    #[serde(default)]
    pub devices: Vec<String>,
}

/// A process: its PID and its start time (clock ticks after boot, `/proc/PID/stat` field
/// 22), which tells it from a later process given the same PID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessRef {
    pub pid: i32,
    pub start_ticks: u64,
}

/// Why the holders file could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("create {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("encode the holders: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Write `holders` to [`HOLDERS_FILE`] in `socket_dir` (made if missing): a temporary
/// file (0644) renamed over it, so the runtime reads the old or the new table, whole.
pub fn publish(socket_dir: &Path, holders: &Holders) -> Result<(), PublishError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::create_dir_all(socket_dir).map_err(|source| PublishError::CreateDir {
        path: socket_dir.to_path_buf(),
        source,
    })?;
    let body = serde_json::to_vec_pretty(holders)?;
    let path = socket_dir.join(HOLDERS_FILE);
    let temp = socket_dir.join(format!(".{HOLDERS_FILE}.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&temp)?;
        file.write_all(&body)?;
        // The mode given at creation is masked by the umask; the file must not be
        // writable by others, or the runtime distrusts it.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        std::fs::rename(&temp, &path)
    };
    write().map_err(|source| {
        let _ = std::fs::remove_file(&temp);
        PublishError::Write {
            path: path.clone(),
            source,
        }
    })
}

/// The device ID of robot `id` (as the Node lists it).
pub fn robot_device_id(id: &str) -> String {
    format!("robot-{id}")
}

/// The device ID of camera `id`.
pub fn camera_device_id(id: &str) -> String {
    format!("camera-{id}")
}

/// The holders file in `socket_dir` as it is now (`None`: there is none, or it cannot be
/// read or parsed).
pub fn read(socket_dir: &Path) -> Option<Holders> {
    let text = std::fs::read(socket_dir.join(HOLDERS_FILE)).ok()?;
    serde_json::from_slice(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_holders_read_back_whole_and_not_writable_by_others() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let run = dir.path().join("run");
        assert_eq!(read(&run), None, "no file yet");
        let holders = Holders {
            replicas: vec![ReplicaHolder {
                name: "ns/a".into(),
                roots: vec![ProcessRef {
                    pid: 42,
                    start_ticks: 7,
                }],
                devices: vec![robot_device_id("arm-0"), camera_device_id("cam-0")],
                ..ReplicaHolder::default()
            }],
        };
        publish(&run, &holders).expect("publish");
        assert_eq!(read(&run), Some(holders));
        let text = std::fs::read_to_string(run.join(HOLDERS_FILE)).expect("file");
        assert!(text.contains("\"startTicks\": 7"), "{text}");
        assert!(
            text.contains("robot-arm-0") && text.contains("camera-cam-0"),
            "{text}"
        );
        let mode = std::fs::metadata(run.join(HOLDERS_FILE))
            .expect("meta")
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }
}
