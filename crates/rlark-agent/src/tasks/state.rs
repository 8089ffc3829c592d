//! A replica's state file, `DATA_DIR/<ns>/<task>/<uid>/<i>/state.json` (see the module
//! documentation of [`crate::tasks`], "Crash safety").

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::runtime::{ContainerRecord, ProcessRecord, ReplicaRecord};

/// Name of a replica's state file.
pub const STATE_FILE: &str = "state.json";

/// `state.json` of a started replica (see the module documentation).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaState {
    /// Namespace of the Task (and Pod).
    pub namespace: String,
    /// Task name.
    pub task: String,
    /// Task UID.
    pub uid: String,
    /// Replica index.
    pub index: usize,
    /// [`run_key`] of the run.
    pub run_key: String,
    /// Pid of the main process.
    pub pid: u32,
    /// Its process group.
    pub pgid: i32,
    /// Its start in clock ticks after boot (`/proc/<pid>/stat`), to tell it from a later
    /// process with the same pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_start_ticks: Option<u64>,
    /// Engine ids of the replica's containers, the main one first (a replica of a `docker`
    /// task; `pid` is then the host pid of the main container's process). Empty for a
    /// process replica — and in the state files of agents before the docker runtime.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    /// The containers' names in the Task, in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_names: Vec<String>,
    /// When it was started (RFC 3339).
    pub start_time: String,
    /// SIGTERM → SIGKILL grace period.
    pub grace_seconds: u64,
    /// The final Pod status, once the exit was seen but before it was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_status: Option<Value>,
}

impl ReplicaState {
    /// What it says about the replica's process or containers.
    pub fn record(&self) -> ReplicaRecord {
        if self.containers.is_empty() {
            ReplicaRecord::Process(ProcessRecord {
                pid: self.pid,
                pgid: self.pgid,
                start_ticks: self.proc_start_ticks,
            })
        } else {
            ReplicaRecord::Container(ContainerRecord {
                ids: self.containers.clone(),
                names: self.container_names.clone(),
                pid: self.pid,
                start_ticks: self.proc_start_ticks,
            })
        }
    }

    /// Read a state file.
    pub fn read(path: &Path) -> io::Result<ReplicaState> {
        let text = std::fs::read(path)?;
        serde_json::from_slice(&text).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// Write a state file atomically (temporary file, then rename).
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(self).map_err(io::Error::other)?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }
}

/// Remove the state file at `path` (absent is fine).
pub(super) fn remove_state_file(path: &Path) {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            tracing::warn!(file = %path.display(), %error, "remove replica state file");
        }
        _ => {}
    }
}

/// `<root>/<task>/<uid>/<index>/state.json` files.
pub(super) fn find_state_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for task in subdirs(root) {
        for uid in subdirs(&task) {
            for index in subdirs(&uid) {
                let file = index.join(STATE_FILE);
                if file.is_file() {
                    files.push(file);
                }
            }
        }
    }
    files
}

/// The subdirectories of `dir` (none when it cannot be read).
pub(super) fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::replica_dir;
    use super::*;

    #[test]
    fn replica_dirs_and_state_files_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let replica = replica_dir(dir.path(), "rlark-c", "j-a", "u1", 0);
        assert!(replica.ends_with("rlark-c/j-a/u1/0"));
        std::fs::create_dir_all(&replica).expect("mkdir");
        let state = ReplicaState {
            namespace: "rlark-c".into(),
            task: "j-a".into(),
            uid: "u1".into(),
            index: 0,
            run_key: "u1//n1".into(),
            pid: 42,
            pgid: 42,
            proc_start_ticks: Some(7),
            containers: Vec::new(),
            container_names: Vec::new(),
            start_time: "2026-01-01T00:00:00Z".into(),
            grace_seconds: 30,
            final_status: None,
        };
        let path = replica.join(STATE_FILE);
        state.write(&path).expect("write");
        assert_eq!(ReplicaState::read(&path).expect("read"), state);
        assert_eq!(
            find_state_files(&dir.path().join("rlark-c")),
            vec![path.clone()]
        );
        // No container fields for a process replica: what earlier agents wrote.
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(!text.contains("containers"), "{text}");

        let mut container = state.clone();
        container.containers = vec!["abc".into(), "def".into()];
        container.container_names = vec!["main".into(), "side".into()];
        container.write(&path).expect("write");
        assert_eq!(ReplicaState::read(&path).expect("read"), container);
    }

    #[test]
    fn state_files_of_the_previous_version_read_as_process_replicas() {
        // Written by the agent before the docker runtime (no container fields).
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(STATE_FILE);
        std::fs::write(
            &path,
            r#"{
  "namespace": "rlark-c",
  "task": "j-a",
  "uid": "u1",
  "index": 0,
  "runKey": "u1//n1",
  "pid": 42,
  "pgid": 42,
  "procStartTicks": 7,
  "startTime": "2026-01-01T00:00:00Z",
  "graceSeconds": 30
}"#,
        )
        .expect("write");
        let state = ReplicaState::read(&path).expect("read");
        assert!(state.containers.is_empty());
        assert_eq!(
            state.record(),
            crate::runtime::ReplicaRecord::Process(crate::runtime::ProcessRecord {
                pid: 42,
                pgid: 42,
                start_ticks: Some(7),
            })
        );
        let mut docker = state.clone();
        docker.containers = vec!["c1".into()];
        docker.container_names = vec!["main".into()];
        assert!(matches!(
            docker.record(),
            crate::runtime::ReplicaRecord::Container(c) if c.ids == ["c1"] && c.pid == 42
        ));
    }
}
