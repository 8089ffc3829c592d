//! The controllers (`rlark_controllers::manager`) run inside the server process.
//!
//! They talk to the server through its own HTTPS listener with an in-process
//! `kube::Client` authenticated by the admin certificate (exactly what an external
//! `rlark controller-manager` does), so they see the same API, admission and watch
//! semantics as any client. With leader election (the default) they act only while this
//! process holds the `default/rlark-controller-manager` Lease, so a server and a separate
//! controller-manager (or several server replicas) never both act.

use std::hash::{Hash as _, Hasher as _};
use std::path::Path;
use std::time::Duration;

use prometheus_client::registry::Registry;
use rlark_controllers::ControllerConfig;
use rlark_controllers::manager::{Manager, ManagerOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ServerError;
use crate::config::ControllersConfig;

/// How long shutdown waits for the controllers (graceful stop and Lease release) before
/// the listener closes.
const STOP_TIMEOUT: Duration = Duration::from_secs(12);

/// A configured manager, not running yet.
pub(crate) struct Prepared {
    manager: Manager,
}

/// The running manager.
pub(crate) struct Running {
    token: CancellationToken,
    task: JoinHandle<()>,
}

/// Build the manager with a client for `kubeconfig_yaml` (the admin kubeconfig of this
/// server) and register its metrics in `registry`.
pub(crate) async fn prepare(
    config: &ControllersConfig,
    data_dir: &Path,
    kubeconfig_yaml: &str,
    registry: &mut Registry,
) -> Result<Prepared, ServerError> {
    // kube's TLS uses the process-wide rustls provider; Err means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let failed =
        |step: &str, e: &dyn std::fmt::Display| ServerError::Controllers(format!("{step}: {e}"));
    let kubeconfig = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml)
        .map_err(|e| failed("parse admin kubeconfig", &e))?;
    let client_config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| failed("load admin kubeconfig", &e))?;
    let client = kube::Client::try_from(client_config).map_err(|e| failed("create client", &e))?;
    let controller_config = ControllerConfig {
        node_grace_period: config.node_grace_period,
        component: "rlark-server".into(),
        identity: identity(data_dir),
        ..ControllerConfig::default()
    };
    let options = ManagerOptions {
        leader_election: config.leader_election,
        ..ManagerOptions::default()
    };
    let manager = Manager::new(client, controller_config, options);
    manager.register_metrics(registry);
    Ok(Prepared { manager })
}

impl Prepared {
    /// Start the controllers (they connect lazily, so the listener may still be starting).
    pub(crate) fn start(self) -> Running {
        let token = CancellationToken::new();
        let run = self.manager.run(token.clone());
        let task = tokio::spawn(async move {
            if let Err(error) = run.await {
                tracing::error!(%error, "in-process controllers failed");
            }
        });
        Running { token, task }
    }
}

impl Running {
    /// Stop gracefully (release the Lease) while the listener still serves; bounded.
    pub(crate) async fn stop(mut self) {
        self.token.cancel();
        if tokio::time::timeout(STOP_TIMEOUT, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("controllers did not stop in time; aborting them");
            self.task.abort();
        }
    }
}

/// `rlark-server-<host>-<hash of the data directory>`: stable across restarts of the
/// same server (so it renews its own Lease at once), distinct between servers.
fn identity(data_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into());
    let dir = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut hasher = std::hash::DefaultHasher::new();
    dir.hash(&mut hasher);
    format!("rlark-server-{host}-{:08x}", hasher.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_stable_per_data_dir() {
        let a = identity(Path::new("/var/lib/rlark-a"));
        assert_eq!(a, identity(Path::new("/var/lib/rlark-a")));
        assert_ne!(a, identity(Path::new("/var/lib/rlark-b")));
        assert!(a.starts_with("rlark-server-"), "{a}");
    }
}
