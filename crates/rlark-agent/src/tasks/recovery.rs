//! Startup recovery: the state files an earlier agent left (see the module documentation
//! of [`crate::tasks`], "Crash safety").

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use rlark_api::types::Pod;
use serde_json::{Value, json};

use super::pods::{Retry, delete_pod, is_run_of, is_status, pod_is_terminal};
use super::state::{find_state_files, remove_state_file};
use super::{ReplicaState, Shared, pod_name};
use crate::runtime::{Adopted, LogLimits, MAX_GRACE, RecordedReplica, ReplicaSpec};

/// A replica left by an earlier agent (its state file has no final status), waiting for
/// the worker of its replica to adopt or end it (or for [`Reconciler::sweep`]).
#[derive(Debug)]
pub(super) struct Recovered {
    /// Its `state.json`.
    pub(super) path: PathBuf,
    pub(super) state: ReplicaState,
}

impl Recovered {
    pub(super) fn replica_dir(&self) -> PathBuf {
        self.path
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf)
    }

    pub(super) fn grace(&self) -> Duration {
        // Written by an agent, perhaps an older one that did not cut the grace period.
        Duration::from_secs(self.state.grace_seconds).min(MAX_GRACE)
    }

    pub(super) fn remove_state(&self) {
        remove_state_file(&self.path);
    }

    /// What its state file says about its process.
    pub(super) fn recorded(&self) -> RecordedReplica {
        RecordedReplica {
            record: self.state.record(),
            grace: Duration::from_secs(self.state.grace_seconds),
        }
    }
}

/// Handle the state files left by an earlier agent (see the module documentation): a
/// recorded final status is reported now; every other replica waits in
/// [`Shared::recovered`] for its worker.
pub(super) async fn recover(shared: &Shared) {
    let root = shared.ctx.data_dir.join(&shared.namespace);
    let files = tokio::task::spawn_blocking(move || find_state_files(&root))
        .await
        .unwrap_or_default();
    let mut left = Vec::new();
    for path in files {
        let state = match ReplicaState::read(&path) {
            Ok(state) if state.namespace == shared.namespace => state,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(file = %path.display(), %error, "unreadable replica state file; removing it");
                remove_state_file(&path);
                continue;
            }
        };
        left.push(Recovered { path, state });
    }
    // What the runtime runs that no state file names goes before anything starts.
    let known: Vec<_> = left.iter().map(|r| r.state.record()).collect();
    shared.runtime.sweep(&known).await;
    let (reported, waiting): (Vec<Recovered>, Vec<Recovered>) = left
        .into_iter()
        .partition(|r| r.state.final_status.is_some());
    futures::future::join_all(reported.iter().map(|r| async move {
        let status = r.state.final_status.clone().unwrap_or_default();
        if report_left_status(shared, &r.state, status).await {
            tracing::info!(task = %r.state.task, index = r.state.index, "reported the final status an earlier agent recorded");
            r.remove_state();
        }
    }))
    .await;
    let mut recovered = shared.recovered.lock().unwrap_or_else(|e| e.into_inner());
    for r in waiting {
        tracing::info!(task = %r.state.task, index = r.state.index, pid = r.state.pid, "found a replica left by an earlier agent");
        recovered
            .entry((r.state.task.clone(), r.state.index))
            .or_default()
            .push(r);
    }
}

/// Write `status` to the Pod of `state`'s replica if the Pod is still that run's and not
/// final yet. Returns false only when the agent shut down first.
async fn report_left_status(shared: &Shared, state: &ReplicaState, status: Value) -> bool {
    let api: Api<Pod> = shared.pods();
    let name = pod_name(&state.task, state.index);
    let mut retry = Retry::new();
    loop {
        let attempt = async {
            let Some(pod) = api.get_opt(&name).await? else {
                return Ok(());
            };
            if is_run_of(&pod, state) && !pod_is_terminal(&pod) {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "status": status })),
                )
                .await?;
            }
            Ok(())
        };
        match attempt.await {
            Ok(()) => return true,
            Err(error) if is_status(&error, 404) => return true,
            Err(error) => {
                if !retry
                    .again(shared, "report a replica left by an earlier agent", &error)
                    .await
                {
                    return false;
                }
            }
        }
    }
}

/// End a replica left by an earlier agent that no worker takes over (another run, a Task
/// deleted, stopped placing it here, or scaled down): a running one is stopped (SIGTERM,
/// SIGKILL after its grace period), stragglers are killed; with `delete_own_pod`, the Pod is
/// deleted if it is still that run's. The state file goes.
pub(super) async fn end_recovered(shared: &Shared, r: Recovered, delete_own_pod: bool) {
    let mut spec = ReplicaSpec::new(Vec::new(), r.replica_dir());
    spec.grace = r.grace();
    spec.log_limits = LogLimits::default();
    match shared.runtime.adopt(&spec, &r.recorded()).await {
        Adopted::Running(mut running) => {
            let exit = running.terminate(r.grace()).await;
            tracing::info!(task = %r.state.task, index = r.state.index, status = %exit.status, "stopped a replica left by an earlier agent that is no longer wanted");
        }
        Adopted::Exited(_) | Adopted::Lost(_) => {}
    }
    if delete_own_pod {
        let api = shared.pods();
        let name = pod_name(&r.state.task, r.state.index);
        let mut retry = Retry::new();
        loop {
            let result = match api.get_opt(&name).await {
                Ok(Some(pod)) if is_run_of(&pod, &r.state) => delete_pod(&api, &pod).await,
                Ok(_) => Ok(()),
                Err(error) => Err(error),
            };
            match result {
                Ok(()) => break,
                Err(error) => {
                    if !retry.again(shared, "delete pod", &error).await {
                        break;
                    }
                }
            }
        }
    }
    r.remove_state();
}
