//! The in-process server the benchmarks measure, started through the product's own API
//! (`rlark_server::start`, as `rlark up` does), and an admin client for it.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use rlark_server::{RunningServer, ServerConfig};

/// The configuration of a benchmark server on `dir`: `127.0.0.1:0`, a 2 s shutdown grace,
/// controllers as [`ServerConfig::new`] leaves them (callers set what they measure).
pub(crate) fn config_for(dir: impl Into<PathBuf>) -> ServerConfig {
    let mut config = ServerConfig::new(dir);
    config.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    config.shutdown_grace = Duration::from_secs(2);
    config
}

/// Start the server of `config` in this process.
pub(crate) async fn start(config: ServerConfig) -> anyhow::Result<RunningServer> {
    let controllers = config.controllers.enabled;
    let server = rlark_server::start(config)
        .await
        .context("start the server")?;
    tracing::info!(addr = %server.local_addr, controllers, "benchmark server started");
    Ok(server)
}

/// A kube client with the admin credentials of `kubeconfig`.
pub(crate) async fn admin_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("load kubeconfig")?;
    kube::Client::try_from(config).context("build kube client")
}
