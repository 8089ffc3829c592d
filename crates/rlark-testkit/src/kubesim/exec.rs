//! `pods/exec` of the simulated member cluster: the command runs as a **local process** of
//! the test, not in a container — in a directory of its own per Pod and container
//! (`<root>/<namespace>/<pod>/<container>`, kept for the simulator's life so files written
//! by one exec are seen by the next), with `PATH` from the test's environment and
//! `HOSTNAME` = the Pod's name. The server has already checked that the Pod exists and the
//! container runs.

use std::path::PathBuf;
use std::sync::Arc;

use rlark_apiserver::pod_sources::{PodExecRequest, PodExecSource, PodLogError};

/// The simulator's exec source (cheap to clone; the directories go with the last clone).
#[derive(Clone)]
pub struct SimExec {
    root: Arc<tempfile::TempDir>,
}

impl SimExec {
    /// A source working under a new temporary directory.
    pub fn new() -> std::io::Result<Self> {
        Ok(SimExec {
            root: Arc::new(tempfile::tempdir()?),
        })
    }

    /// The working directory of the execs into `container` of Pod `namespace/pod`.
    pub fn dir(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        self.root.path().join(namespace).join(pod).join(container)
    }
}

impl PodExecSource for SimExec {
    fn command(&self, request: &PodExecRequest) -> Result<std::process::Command, PodLogError> {
        let dir = self.dir(&request.namespace, &request.pod, &request.container);
        std::fs::create_dir_all(&dir).map_err(|e| {
            PodLogError::BadRequest(format!("prepare {} for the exec: {e}", dir.display()))
        })?;
        let mut command = std::process::Command::new(&request.command[0]);
        command
            .args(&request.command[1..])
            .current_dir(&dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOSTNAME", &request.pod);
        Ok(command)
    }
}
