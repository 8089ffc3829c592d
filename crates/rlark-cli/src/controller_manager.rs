//! `rlark controller-manager`: the Job, Workflow, Task and Node controllers as a process of
//! their own, against any rlark API server (use with `rlark server --controllers=false`, or
//! as a standby: with leader election only one manager — or server — acts at a time).
//!
//! Serves `/metrics` (Prometheus text) and `/healthz` on a small plain-HTTP listener
//! (loopback by default). SIGTERM or SIGINT stops the controllers gracefully and releases
//! the Lease.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Args};
use http::StatusCode;
use prometheus_client::registry::Registry;
use rlark_controllers::ControllerConfig;
use rlark_controllers::manager::{Manager, ManagerOptions};
use rlark_observe::metrics_endpoint::{self, MetricsListener, Response};
use rlark_observe::parse_duration;
use tokio_util::sync::CancellationToken;

use super::ClientArgs;
use super::client::Session;
use super::server::watch_signals;

#[derive(Debug, Args)]
pub(crate) struct ControllerManagerArgs {
    #[arg(skip)]
    pub client: ClientArgs,
    /// Act only while holding the leader-election Lease (`--leader-elect=false` to run
    /// unconditionally: only when no other manager or server runs the controllers).
    #[arg(long, value_name = "BOOL", action = ArgAction::Set, num_args = 0..=1,
          default_value_t = true, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, value_name = "NS", default_value = "default")]
    pub leader_elect_namespace: String,
    /// Name of the leader-election Lease (shared with `rlark server`'s in-process
    /// controllers).
    #[arg(long, value_name = "NAME", default_value = "rlark-controller-manager")]
    pub leader_elect_name: String,
    /// Identity in the Lease (default: host name plus a random suffix).
    #[arg(long, value_name = "ID")]
    pub identity: Option<String>,
    /// Address of the plain-HTTP `/metrics` and `/healthz` listener; port 0 picks one
    /// (printed on stdout).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:10257")]
    pub metrics_listen: SocketAddr,
    /// A Node whose heartbeat is older than this becomes Offline (e.g. `40s`, `2m`,
    /// `1500ms`).
    #[arg(long, value_name = "DURATION", default_value = "40s", value_parser = parse_duration)]
    pub node_grace_period: Duration,
    /// How often Node heartbeats are checked.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub node_check_interval: Duration,
}

fn default_identity(random: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{random}")
}

pub(crate) async fn controller_manager(args: ControllerManagerArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone())?;
    let session = Session::connect(&args.client).await?;
    let defaults = ControllerConfig::default();
    let config = ControllerConfig {
        node_grace_period: args.node_grace_period,
        node_check_interval: args.node_check_interval,
        identity: args
            .identity
            .clone()
            .unwrap_or_else(|| default_identity(&defaults.identity)),
        ..defaults
    };
    let options = ManagerOptions {
        leader_election: args.leader_elect,
        lease_namespace: args.leader_elect_namespace.clone(),
        lease_name: args.leader_elect_name.clone(),
        ..ManagerOptions::default()
    };
    tracing::info!(
        identity = %config.identity,
        leader_election = options.leader_election,
        lease = %format!("{}/{}", options.lease_namespace, options.lease_name),
        "starting controller-manager"
    );
    let manager = Manager::new(session.client, config, options);
    let mut registry = Registry::default();
    manager.register_metrics(&mut registry);
    let leading = manager.leading();

    let listener = MetricsListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("bind metrics listener {}", args.metrics_listen))?;
    let addr = listener.local_addr();
    println!("rlark controller-manager: /metrics and /healthz on http://{addr}");
    let registry = Arc::new(registry);
    let http = tokio::spawn(listener.serve_with(
        move |path| respond(path, &registry, *leading.borrow()),
        shutdown.clone(),
    ));

    let result = manager.run(shutdown.clone()).await;
    shutdown.cancel();
    let _ = http.await;
    result.context("controllers")?;
    tracing::info!("controller-manager stopped");
    Ok(())
}

/// The answer to `GET path`: `/healthz`, `/livez` and `/readyz` (`ok`), `/leader` (whether
/// this manager holds the Lease), `/metrics`; anything else 404.
fn respond(path: &str, registry: &Registry, leading: bool) -> Response {
    match path {
        "/healthz" | "/livez" | "/readyz" => {
            metrics_endpoint::text(StatusCode::OK, "text/plain", "ok".into())
        }
        "/leader" => metrics_endpoint::text(StatusCode::OK, "text/plain", leading.to_string()),
        _ => metrics_endpoint::response(path, registry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let registry = Registry::default();
        assert_eq!(
            respond("/healthz", &registry, false).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond("/metrics", &registry, true).status(),
            StatusCode::OK
        );
        assert_eq!(
            respond("/nope", &registry, true).status(),
            StatusCode::NOT_FOUND
        );
    }
}
