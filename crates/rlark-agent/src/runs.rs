//! The runs of a replica on disk (`DATA_DIR/tasks/<ns>/<task>/<uid>/<i>/`), as the local
//! API (`api.rs`: logs; `exec.rs`: exec) finds them.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::runtime::process;
use crate::tasks::{ReplicaState, STATE_FILE};

/// The `container` parameter of a logs or exec request (kubectl's `-c`): `None` when
/// absent or empty (the main container), else a DNS-1123 label; `Err` names a bad value.
pub(crate) fn container_param(query: Option<&str>) -> Result<Option<String>, String> {
    let mut found = None;
    for pair in query.unwrap_or_default().split('&') {
        if let Some(value) = pair.strip_prefix("container=") {
            if value.is_empty() {
                continue;
            }
            if let Err(e) = rlark_api::names::dns1123_label(value) {
                return Err(format!("invalid container name {value:?}: {e}"));
            }
            found = Some(value.to_string());
        }
    }
    Ok(found)
}

/// The container names of the run in `run_dir` (main first), from its
/// [`crate::runtime::docker::CONTAINERS_FILE`]; empty for a process replica (no such file) or an unreadable one.
pub(crate) fn run_containers(run_dir: &Path) -> Vec<String> {
    crate::runtime::record::read::<Vec<String>>(
        &run_dir.join(crate::runtime::docker::CONTAINERS_FILE),
    )
    .ok()
    .flatten()
    .unwrap_or_default()
}

/// One run of a replica found on disk.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) dir: PathBuf,
    pub(crate) running: bool,
    modified: SystemTime,
}

/// The runs of replica `index` of `task` in `namespace`, newest first (a running one first).
pub(crate) fn find_runs(tasks_dir: &Path, namespace: &str, task: &str, index: usize) -> Vec<Run> {
    let task_dir = tasks_dir.join(namespace).join(task);
    let Ok(entries) = std::fs::read_dir(&task_dir) else {
        return Vec::new();
    };
    let mut runs: Vec<Run> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let dir = entry.path().join(index.to_string());
            let meta = std::fs::metadata(&dir).ok().filter(|m| m.is_dir())?;
            Some(Run {
                running: replica_running(&dir),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                dir,
            })
        })
        .collect();
    runs.sort_by(|a, b| (b.running, b.modified, &b.dir).cmp(&(a.running, a.modified, &a.dir)));
    runs
}

/// Whether the replica in `dir` has a live process: its state file exists, carries no
/// final status, and names a running process.
pub(crate) fn replica_running(dir: &Path) -> bool {
    match ReplicaState::read(&dir.join(STATE_FILE)) {
        Ok(state) => {
            state.final_status.is_none()
                && process::process_running(state.pid, state.proc_start_ticks)
        }
        Err(_) => false,
    }
}
