//! `rlark embodied`: run the embodied runtime of an edge host (see `rlark_embodied`) until
//! SIGTERM or SIGINT: robots as RobotController services on unix sockets, then every robot
//! stopped on the way out.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::server::watch_signals;

#[derive(Debug, Args)]
pub(crate) struct EmbodiedArgs {
    /// Configuration file: robot types and modes, robots, allowed launch packages, cameras,
    /// watchdog (YAML; docs/embodied.md).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Directory of the sockets (ros-ctrl.sock, ros2-ctrl.sock); created if missing.
    #[arg(long, value_name = "DIR", default_value = rlark_proto::sockets::DEFAULT_SOCKET_DIR)]
    pub socket_dir: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9102; port 0 picks
    /// a free port). Off by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

pub(crate) async fn embodied(args: EmbodiedArgs) -> anyhow::Result<()> {
    // Refuse a bad configuration before touching the socket directory.
    let config = rlark_embodied::EmbodiedConfig::from_file(&args.config)
        .with_context(|| format!("configuration {}", args.config.display()))?;
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;
    let options = rlark_embodied::ServeOptions {
        metrics_listen: args.metrics_listen,
    };
    let running = rlark_embodied::serve_with(config, &args.socket_dir, options, shutdown).await?;
    if let Some(addr) = running.metrics_addr() {
        println!("metrics at http://{addr}/metrics");
    }
    for socket in running.sockets() {
        println!("serving {}", socket.display());
    }
    running.wait().await?;
    Ok(())
}
