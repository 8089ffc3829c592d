//! A Kubernetes-compatible HTTP API over an rlark [`Store`](rlark_store::Store).
//!
//! Serves the `rlinf.io/v1alpha1` resources (defined by CRDs from `rlark-api`), core
//! `v1/Namespace` and `coordination.k8s.io/v1/Lease` well enough that kubectl, kube-rs and
//! the official Python client work unmodified, and core `v1/Pod` as a read-only view of
//! rlark's replicas ([`replicas`]). A program may serve more kinds, e.g. the Kubernetes
//! built-in kinds a member cluster serves: [`ApiServerOptions::extra_kinds`] (a hook set in
//! code; `rlark server` never sets it, the test kit's simulated member cluster does), with
//! the logs and exec of stored core Pods from [`ApiServerOptions::pod_sources`]
//! ([`pod_sources`]). The router is a plain `axum::Router`; the
//! process around it (TLS, identity extraction) lives in `rlark-server`, which inserts an
//! [`auth::Identity`] request extension for every authenticated request.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
// `ApiError` (a whole Kubernetes `Status`) is the error of every request path. It is built
// at most once per failed request, so its size does not matter; boxing it everywhere would.
#![allow(clippy::result_large_err)]

pub mod agent_admission;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod discovery;
pub mod error;
pub mod jsonpath;
pub mod limits;
pub mod node_names;
pub mod openapi;
pub mod pod_sources;
pub mod protobuf;
pub mod registry;
pub mod replicas;
pub mod table;

mod admission;
mod body;
mod builtin;
mod domain_admission;
mod event_encodings;
mod eventgc;
mod fieldvalidation;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod gc;
mod handlers;
mod lifecycle;
mod list;
mod list_body;
mod metrics;
mod object;
mod output;
mod patch;
mod podexec;
mod podlog;
mod request;
mod scale;
mod selectors;
mod watch;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rlark_store::Store;
use tokio_util::sync::CancellationToken;

use crate::audit::{AuditSink, TracingAudit};
use crate::error::ApiError;
pub use crate::watch::MAX_WATCH_TIMEOUT;

/// Tunables of the API server. Defaults follow kube-apiserver.
#[derive(Clone, Debug)]
pub struct ApiServerOptions {
    /// Request bodies larger than this are refused with 413 (kube-apiserver: 3 MiB).
    pub max_request_bytes: usize,
    /// How often an idle watch gets a BOOKMARK when the client asked for bookmarks.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Most Nodes an agent may create in its namespace `rlark-<clusterID>` (counting every
    /// Node there); one more is refused with 403. Admins are not limited.
    pub max_nodes_per_agent: usize,
    /// Event sizes and expiry, per-identity write rates and object-count quotas.
    pub limits: limits::Limits,
    /// Kinds served besides the built-in ones, as stored objects with the server's usual
    /// behaviour (validated by their own [`registry::ResourceType::validator`]); one with the
    /// group, version and plural of a built-in kind replaces it
    /// ([`registry::Registry::with_extra_kinds`]). Empty (the default, and always for
    /// `rlark server`): only the built-in kinds. The test kit's simulated member cluster
    /// serves the Kubernetes built-in kinds a workload runtime uses this way, its own core
    /// Pods replacing the replicas' view.
    pub extra_kinds: Vec<Arc<registry::ResourceType>>,
    /// Where the logs and exec of core Pods served as stored objects (an extra Pod kind
    /// with [`registry::ResourceType::log_subresource`]) come from. None by default: their
    /// log and exec answer `404`.
    pub pod_sources: pod_sources::PodSources,
}

/// Default of [`ApiServerOptions::max_nodes_per_agent`].
pub const DEFAULT_MAX_NODES_PER_AGENT: usize = 64;

impl Default for ApiServerOptions {
    fn default() -> Self {
        Self {
            max_request_bytes: 3 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(30 * 60),
            max_nodes_per_agent: DEFAULT_MAX_NODES_PER_AGENT,
            limits: limits::Limits::default(),
            extra_kinds: Vec::new(),
            pod_sources: pod_sources::PodSources::default(),
        }
    }
}

impl ApiServerOptions {
    /// Whether core `v1` Pods are the read-only view of rlark's replicas ([`replicas`]):
    /// no extra kind replaces them. Their `log`, `exec` and `portforward` are then the
    /// process's to serve (`rlark-server` routes them to the agents).
    pub fn core_pods_are_replicas(&self) -> bool {
        !self
            .extra_kinds
            .iter()
            .any(|rt| rt.is_served_as("", "v1", "pods"))
    }
}

/// The API server: shared state behind the router plus background work (garbage collection).
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

/// State shared by the router, the watches and the garbage collector.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) registry: Arc<registry::Registry>,
    pub(crate) options: ApiServerOptions,
    pub(crate) metrics: metrics::Metrics,
    /// Cancelled when the process shuts down ([`ApiServer::run_background`]'s token fired):
    /// open watches end.
    pub(crate) shutdown: CancellationToken,
    /// Where denied requests are recorded ([`ApiServer::with_audit`]).
    pub(crate) audit: Arc<dyn AuditSink>,
    /// Held by an agent's Node create from counting the namespace's Nodes to the write
    /// ([`ApiServerOptions::max_nodes_per_agent`]).
    pub(crate) agent_nodes: tokio::sync::Mutex<()>,
    /// Held by a Domain or Job write (or a Domain delete) from its pod network admission
    /// checks to its store write ([`domain_admission`]).
    pub(crate) network: tokio::sync::Mutex<()>,
    /// Per-identity write rates ([`limits::RateLimiter`]), shared with the process's own
    /// write routes through [`ApiServer::rate_limiter`].
    pub(crate) rate_limiter: Arc<limits::RateLimiter>,
    /// Watch event lines shared by the watchers that send the same bytes.
    pub(crate) event_encodings: Arc<event_encodings::EventEncodings>,
}

impl ApiServer {
    /// Build over a store. Metrics are registered into `metrics` (served by the process).
    /// Audit records go to [`TracingAudit`] until [`Self::with_audit`] says otherwise.
    pub fn new(
        store: Arc<dyn Store>,
        options: ApiServerOptions,
        metrics: &mut prometheus_client::registry::Registry,
    ) -> Self {
        let rate_limiter = Arc::new(limits::RateLimiter::new(options.limits.clone()));
        let event_encodings = Arc::new(event_encodings::EventEncodings::new(
            event_encodings::DEFAULT_BUDGET_BYTES,
        ));
        event_encodings.register(metrics);
        let registry = registry::Registry::with_extra_kinds(&options.extra_kinds);
        Self {
            inner: Arc::new(Inner {
                store,
                registry: Arc::new(registry),
                options,
                rate_limiter,
                metrics: metrics::Metrics::new(metrics),
                shutdown: CancellationToken::new(),
                audit: Arc::new(TracingAudit),
                agent_nodes: tokio::sync::Mutex::new(()),
                network: tokio::sync::Mutex::new(()),
                event_encodings,
            }),
        }
    }

    /// Send audit records (every denied request) to `sink`. Call it right after
    /// [`Self::new`]: routers built and background work started before keep the previous
    /// sink (clones of this server made before share everything else).
    pub fn with_audit(mut self, sink: Arc<dyn AuditSink>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.audit = sink,
            None => {
                let shared = &self.inner;
                self.inner = Arc::new(Inner {
                    store: Arc::clone(&shared.store),
                    registry: Arc::clone(&shared.registry),
                    options: shared.options.clone(),
                    metrics: shared.metrics.clone(),
                    shutdown: shared.shutdown.clone(),
                    audit: sink,
                    agent_nodes: tokio::sync::Mutex::new(()),
                    network: tokio::sync::Mutex::new(()),
                    rate_limiter: Arc::clone(&shared.rate_limiter),
                    event_encodings: Arc::clone(&shared.event_encodings),
                });
            }
        }
        self
    }

    /// The per-identity write rate limiter of this server, for write routes outside the
    /// Kubernetes API (task reports) to draw from the same buckets.
    pub fn rate_limiter(&self) -> Arc<limits::RateLimiter> {
        Arc::clone(&self.inner.rate_limiter)
    }

    /// The audit sink in use (the process's security routes write to the same one).
    pub fn audit(&self) -> Arc<dyn AuditSink> {
        Arc::clone(&self.inner.audit)
    }

    /// The HTTP API: discovery, OpenAPI and every resource URL. Every route requires an
    /// [`auth::Identity`] request extension (401 `Status` otherwise). Discovery and OpenAPI
    /// are open to every authenticated identity; resource requests are authorized by
    /// [`authz::authorize`] (403 `Status` and a `denied` audit record otherwise).
    pub fn router(&self) -> axum::Router {
        let inner = Arc::clone(&self.inner);
        axum::Router::new()
            .merge(discovery::router(Arc::clone(&self.inner.registry)))
            .merge(openapi::router(Arc::clone(&self.inner.registry)))
            .fallback(move |request: Request| handlers::serve(Arc::clone(&inner), request))
            .layer(axum::middleware::from_fn(require_identity))
    }

    /// Create the `default` namespace unless it exists (also done by [`Self::run_background`]).
    pub async fn ensure_default_namespace(&self) -> Result<(), ApiError> {
        self.inner.ensure_default_namespace().await
    }

    /// Create namespace `name` unless it exists (e.g. an agent's `rlark-<clusterID>` when it
    /// joins). Validated like any API create: an invalid name is a 422 `ApiError`.
    pub async fn ensure_namespace(&self, name: &str) -> Result<(), ApiError> {
        self.inner.ensure_namespace(name).await
    }

    /// Background work until `shutdown` fires: ensures the `default` namespace, then runs
    /// ownerReference / namespace / foreground garbage collection, and expires Events (TTL,
    /// gone involvedObject). When `shutdown` fires, open watches end too.
    pub async fn run_background(&self, shutdown: CancellationToken) {
        tokio::join!(
            gc::run(Arc::clone(&self.inner), shutdown.clone()),
            eventgc::run(Arc::clone(&self.inner), shutdown.clone()),
        );
        shutdown.cancelled().await;
        self.inner.shutdown.cancel();
    }
}

/// 401 unless the transport layer authenticated the caller.
async fn require_identity(request: Request, next: Next) -> Response {
    if request.extensions().get::<auth::Identity>().is_none() {
        return ApiError::unauthorized().into_response();
    }
    next.run(request).await
}
