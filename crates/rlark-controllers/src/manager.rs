//! Runs the Job, Workflow, Task, Node and Domain controllers together until shutdown, optionally
//! only while holding leadership of a Lease.
//!
//! With leader election, the controllers start when this process becomes leader and are
//! **aborted** the moment leadership is lost (no reconcile keeps writing after another
//! candidate may have taken over); the manager then campaigns again. On shutdown the
//! controllers stop gracefully (in-flight reconciles finish) and the Lease is released,
//! so a standby takes over at once.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), rlark_controllers::Error> {
//! use rlark_controllers::manager::{Manager, ManagerOptions};
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let manager = Manager::new(client, Default::default(), ManagerOptions::default());
//! let mut registry = prometheus_client::registry::Registry::default();
//! manager.register_metrics(&mut registry);
//! manager.run(shutdown).await
//! # }
//! ```

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, ControllerConfig, Metrics};
use crate::error::Error;
use crate::leader::{self, LeaderElector};

/// How long a graceful stop waits for the controllers before aborting them.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Requests the controllers have in flight at most. Each HTTP/1.1 request in flight holds
/// a connection of its own, the server admits 512 connections per source address
/// (`connections.maxConnectionsPerIp`), and controllers running inside the server all
/// connect from loopback: a burst of a thousand Jobs must not open a thousand connections
/// and be refused. (A watch gives its slot back once its response head has arrived.)
pub const MAX_REQUESTS_IN_FLIGHT: usize = 128;

/// `client` with at most [`MAX_REQUESTS_IN_FLIGHT`] requests in flight; the others wait.
pub fn bounded_client(client: kube::Client) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let send = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let client = client.clone();
        async move { client.send(request).await }
    });
    kube::Client::new(
        tower::limit::ConcurrencyLimit::new(send, MAX_REQUESTS_IN_FLIGHT),
        namespace,
    )
}

/// How the manager runs.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    /// Run the controllers only while holding the Lease (default true).
    pub leader_election: bool,
    /// Namespace of the Lease (`default`).
    pub lease_namespace: String,
    /// Name of the Lease (`rlark-controller-manager`).
    pub lease_name: String,
    /// See [`LeaderElector::lease_duration`] (15 s).
    pub lease_duration: Duration,
    /// See [`LeaderElector::renew_deadline`] (10 s).
    pub renew_deadline: Duration,
    /// See [`LeaderElector::retry_period`] (2 s).
    pub retry_period: Duration,
}

impl Default for ManagerOptions {
    fn default() -> Self {
        Self {
            leader_election: true,
            lease_namespace: "default".into(),
            lease_name: "rlark-controller-manager".into(),
            lease_duration: leader::DEFAULT_LEASE_DURATION,
            renew_deadline: leader::DEFAULT_RENEW_DEADLINE,
            retry_period: leader::DEFAULT_RETRY_PERIOD,
        }
    }
}

/// A configured controller-manager.
pub struct Manager {
    ctx: Arc<Context>,
    options: ManagerOptions,
    leader_tx: watch::Sender<bool>,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("ctx", &self.ctx)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// The controllers use `client` with at most [`MAX_REQUESTS_IN_FLIGHT`] requests in
    /// flight ([`bounded_client`]).
    pub fn new(client: kube::Client, config: ControllerConfig, options: ManagerOptions) -> Self {
        let (leader_tx, _) = watch::channel(false);
        Self {
            ctx: Arc::new(Context::new(bounded_client(client), config)),
            options,
            leader_tx,
        }
    }

    /// The shared context (client, config, recorder, metrics).
    pub fn context(&self) -> Arc<Context> {
        self.ctx.clone()
    }

    /// The controllers' metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.ctx.metrics.clone()
    }

    /// Add the controllers' metrics to `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        self.ctx.metrics.register(registry);
    }

    /// `true` while the controllers run (always, once started, without leader election).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.leader_tx.subscribe()
    }

    fn set_leading(&self, leading: bool) {
        self.ctx.metrics.set_leader(leading);
        self.leader_tx.send_replace(leading);
    }

    /// Run until `shutdown` is cancelled. Errors: invalid leader-election timings, or a
    /// controller that stopped on its own (a bug: they run until told to stop).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        if !self.options.leader_election {
            self.set_leading(true);
            // Same bounded stop as under leader election: a controller that does not
            // honour cancellation in time is aborted rather than hanging the shutdown.
            let mut running = AbortOnDrop(tokio::spawn(run_controllers(
                self.ctx.clone(),
                shutdown.child_token(),
            )));
            let result = tokio::select! {
                result = &mut running.0 => match result {
                    Ok(result) => result,
                    Err(join) => Err(Error::ControllerStopped {
                        controller: "manager",
                        message: join.to_string(),
                    }),
                },
                _ = shutdown.cancelled() => {
                    stop_bounded(&mut running.0).await;
                    Ok(())
                }
            };
            self.set_leading(false);
            return result;
        }
        let elector = LeaderElector::new(
            self.ctx.client.clone(),
            &self.options.lease_namespace,
            &self.options.lease_name,
            &self.ctx.config.identity,
        )
        .with_timings(
            self.options.lease_duration,
            self.options.renew_deadline,
            self.options.retry_period,
        )?;
        loop {
            let Some(leadership) = elector.acquire(&shutdown).await else {
                return Ok(());
            };
            self.set_leading(true);
            let controllers = shutdown.child_token();
            // Aborted if this future is dropped (the manager task aborted), so no controller
            // outlives the leadership that allowed it.
            let mut running = AbortOnDrop(tokio::spawn(run_controllers(
                self.ctx.clone(),
                controllers.clone(),
            )));
            tokio::select! {
                _ = leadership.lost() => {
                    // Stop acting at once: abort, do not wait for reconciles to finish.
                    tracing::warn!("leadership lost: stopping all controllers");
                    running.0.abort();
                    let _ = (&mut running.0).await;
                    self.set_leading(false);
                    drop(leadership);
                }
                _ = shutdown.cancelled() => {
                    controllers.cancel();
                    stop_bounded(&mut running.0).await;
                    self.set_leading(false);
                    if let Err(error) = leadership.release().await {
                        tracing::warn!(%error, "releasing the lease failed; a successor waits for it to expire");
                    }
                    return Ok(());
                }
                result = &mut running.0 => {
                    self.set_leading(false);
                    if let Err(error) = leadership.release().await {
                        tracing::warn!(%error, "releasing the lease failed");
                    }
                    return match result {
                        Ok(result) => result,
                        Err(join) => Err(Error::ControllerStopped {
                            controller: "manager",
                            message: join.to_string(),
                        }),
                    };
                }
            }
        }
    }
}

/// Shorthand for [`Manager::new`] + [`Manager::run`].
pub async fn run(
    client: kube::Client,
    config: ControllerConfig,
    options: ManagerOptions,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    Manager::new(client, config, options).run(shutdown).await
}

/// A task handle that aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn stop_bounded(running: &mut tokio::task::JoinHandle<Result<(), Error>>) {
    if tokio::time::timeout(STOP_TIMEOUT, &mut *running)
        .await
        .is_err()
    {
        tracing::warn!(
            timeout_s = STOP_TIMEOUT.as_secs(),
            "controllers did not stop in time; aborting"
        );
        running.abort();
    }
}

/// Run every controller until `shutdown`; if one ends on its own, stop the others and
/// report it. Dropping this future aborts them all (they live in a [`JoinSet`]).
pub async fn run_controllers(ctx: Arc<Context>, shutdown: CancellationToken) -> Result<(), Error> {
    // Cancelled by `shutdown`, or by us when one controller ends on its own.
    let stop = shutdown.child_token();
    type Run = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
    let controllers: [(&'static str, Run); 5] = [
        (
            crate::job::CONTROLLER,
            Box::pin(crate::job::run(ctx.clone(), stop.clone())),
        ),
        (
            crate::workflow::CONTROLLER,
            Box::pin(crate::workflow::run(ctx.clone(), stop.clone())),
        ),
        (
            crate::task::CONTROLLER,
            Box::pin(crate::task::run(ctx.clone(), stop.clone())),
        ),
        (
            crate::node::CONTROLLER,
            Box::pin(crate::node::run(ctx.clone(), stop.clone())),
        ),
        (
            crate::domain::CONTROLLER,
            Box::pin(crate::domain::run(ctx.clone(), stop.clone())),
        ),
    ];
    let mut set = JoinSet::new();
    for (name, run) in controllers {
        set.spawn(async move {
            run.await;
            name
        });
    }
    tracing::info!(identity = %ctx.config.identity, "controllers started");
    let mut result = Ok(());
    while let Some(joined) = set.join_next().await {
        if shutdown.is_cancelled() {
            continue;
        }
        let (controller, message) = match joined {
            Ok(name) => (name, "its loop ended".to_string()),
            Err(e) => ("unknown", e.to_string()),
        };
        tracing::error!(controller, %message, "controller stopped unexpectedly; stopping the others");
        if result.is_ok() {
            result = Err(Error::ControllerStopped {
                controller,
                message,
            });
        }
        stop.cancel();
    }
    tracing::info!("controllers stopped");
    result
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A client whose every request takes 20 ms; records the most requests in flight.
    fn slow_server(peak: Arc<AtomicUsize>) -> kube::Client {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let service = tower::service_fn(move |_request: http::Request<kube::client::Body>| {
            let (peak, in_flight) = (peak.clone(), in_flight.clone());
            async move {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(br#"{"kind":"Status"}"#.to_vec()))
                        .expect("response"),
                )
            }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn the_controllers_client_keeps_at_most_the_bound_in_flight() {
        let peak = Arc::new(AtomicUsize::new(0));
        let client = bounded_client(slow_server(peak.clone()));
        assert_eq!(client.default_namespace(), "default");
        let requests = (0..3 * MAX_REQUESTS_IN_FLIGHT).map(|_| {
            let client = client.clone();
            async move {
                let request = http::Request::get("/api/v1/namespaces")
                    .body(Vec::new())
                    .expect("request");
                client.request_text(request).await
            }
        });
        let answers = futures::future::join_all(requests).await;
        assert!(answers.iter().all(Result::is_ok));
        assert_eq!(peak.load(Ordering::SeqCst), MAX_REQUESTS_IN_FLIGHT);
    }
}
