//! What an exec runs in: the replica's live process (its working directory and environment
//! from `/proc`, or the fallback from `state.json`) and, for an isolated replica, the
//! supervisor's `--enter` into its sandbox.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStringExt as _;
use std::path::{Path, PathBuf};

use crate::runtime::sandbox::{SANDBOX_FILE, Sandbox};
use crate::tasks::{ReplicaState, STATE_FILE};

use super::MAX_ENVIRON;

/// Where and how the exec'd process runs: the replica's working directory and environment.
#[derive(Clone, Debug)]
pub(super) struct ProcessTarget {
    pub(super) cwd: PathBuf,
    pub(super) env: Vec<(OsString, OsString)>,
    /// The container of a container replica the command runs in (the main one unless
    /// the request names another), through the engine's exec API (its working directory
    /// and environment are the container's).
    pub(super) container: Option<String>,
    /// Engine ids of the replica's containers, main first (empty for processes).
    pub(super) containers: Vec<String>,
    /// Their names in the Task, in the same order.
    pub(super) container_names: Vec<String>,
    /// A process replica that does not run where the agent does: an isolated one
    /// ([`crate::runtime::sandbox`]), or one in a Domain's network namespace. The command
    /// then runs through [`crate::runtime::sandbox::enter_argv`] in the replica's network
    /// and mount namespaces (names and addresses as the task sees them) and, isolated, as
    /// its user, never as the agent's.
    pub(super) enter: Option<Enter>,
}

/// How a command gets into a replica's namespaces (and sandbox).
#[derive(Clone, Debug)]
pub(super) struct Enter {
    pub(super) pid: u32,
    /// The replica's sandbox description, when it is isolated.
    pub(super) sandbox_file: Option<PathBuf>,
    pub(super) supervisor: Vec<OsString>,
}

impl ProcessTarget {
    /// Read the live replica process of `run_dir` (see the module documentation); an error
    /// when its state file is gone meanwhile.
    pub(super) fn of(run_dir: &Path) -> Result<ProcessTarget, String> {
        let state = ReplicaState::read(&run_dir.join(STATE_FILE)).map_err(|e| {
            format!(
                "the replica in {} is not running any more ({STATE_FILE}: {e})",
                run_dir.display()
            )
        })?;
        let proc_dir = PathBuf::from(format!("/proc/{}", state.pid));
        let cwd = std::fs::read_link(proc_dir.join("cwd"))
            .ok()
            .filter(|cwd| cwd.is_dir())
            .unwrap_or_else(|| run_dir.join("work"));
        let env = read_environ(&proc_dir.join("environ"))
            .ok()
            .filter(|env| !env.is_empty())
            .unwrap_or_else(|| fallback_env(&state));
        let sandbox_file = Sandbox::read(run_dir)
            .map_err(|e| e.to_string())?
            .map(|_| run_dir.join(SANDBOX_FILE));
        let enter = (state.containers.is_empty()
            && (sandbox_file.is_some() || in_other_namespaces(state.pid)))
        .then(|| Enter {
            pid: state.pid,
            sandbox_file,
            supervisor: Vec::new(),
        });
        Ok(ProcessTarget {
            cwd,
            env,
            container: state.containers.first().cloned(),
            containers: state.containers.clone(),
            container_names: state.container_names.clone(),
            enter,
        })
    }
}

/// Whether process `pid` runs in another network or mount namespace than the agent (a
/// replica of a Domain task). A process that cannot be inspected counts as not.
fn in_other_namespaces(pid: u32) -> bool {
    ["net", "mnt"].iter().any(|kind| {
        match (
            std::fs::read_link(format!("/proc/{pid}/ns/{kind}")),
            std::fs::read_link(format!("/proc/self/ns/{kind}")),
        ) {
            (Ok(theirs), Ok(ours)) => theirs != ours,
            _ => false,
        }
    })
}

/// `NAME=VALUE\0...` of a process.
pub(super) fn read_environ(path: &Path) -> io::Result<Vec<(OsString, OsString)>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_ENVIRON)
        .read_to_end(&mut bytes)?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=').filter(|at| *at > 0)?;
            Some((
                OsString::from_vec(entry[..at].to_vec()),
                OsString::from_vec(entry[at + 1..].to_vec()),
            ))
        })
        .collect())
}

/// The agent's environment plus the `RLARK_*` variables the state file knows.
fn fallback_env(state: &ReplicaState) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    for (name, value) in [
        ("RLARK_NAMESPACE", state.namespace.clone()),
        ("RLARK_TASK", state.task.clone()),
        ("RLARK_TASK_UID", state.uid.clone()),
        (
            "RLARK_POD_NAME",
            crate::tasks::pod_name(&state.task, state.index),
        ),
        ("RLARK_REPLICA_INDEX", state.index.to_string()),
    ] {
        env.push((name.into(), value.into()));
    }
    env
}
