//! A Kubernetes-compatible HTTP API over an rlark [`Store`](rlark_store::Store).
//!
//! Serves the `rlinf.io/v1alpha1` resources (defined by CRDs from `rlark-api`), core
//! `v1/Namespace` and `coordination.k8s.io/v1/Lease` well enough that kubectl, kube-rs and
//! the official Python client work unmodified. The router is a plain `axum::Router`; the
//! process around it (TLS, identity extraction) lives in `rlark-server`, which inserts an
//! [`auth::Identity`] request extension for every authenticated request.

pub mod auth;
pub mod error;
pub mod registry;

use std::sync::Arc;
use std::time::Duration;

use rlark_store::Store;
use tokio_util::sync::CancellationToken;

/// Tunables of the API server. Defaults follow kube-apiserver.
#[derive(Clone, Debug)]
pub struct ApiServerOptions {
    /// Request bodies larger than this are refused with 413 (kube-apiserver: 3 MiB).
    pub max_request_bytes: usize,
    /// How often an idle watch gets a BOOKMARK when the client asked for bookmarks.
    pub bookmark_interval: Duration,
    /// Watch duration when the client gives no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
}

impl Default for ApiServerOptions {
    fn default() -> Self {
        Self {
            max_request_bytes: 3 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// The API server: shared state behind the router plus background work (garbage collection).
#[derive(Clone)]
pub struct ApiServer {
    inner: Arc<Inner>,
}

#[allow(dead_code)] // filled in by the handlers being written
struct Inner {
    store: Arc<dyn Store>,
    registry: Arc<registry::Registry>,
    options: ApiServerOptions,
}

impl ApiServer {
    /// Build over a store. Metrics are registered into `metrics` (served by the process).
    pub fn new(
        store: Arc<dyn Store>,
        options: ApiServerOptions,
        _metrics: &mut prometheus_client::registry::Registry,
    ) -> Self {
        Self { inner: Arc::new(Inner { store, registry: Arc::new(registry::Registry::builtin()), options }) }
    }

    /// The HTTP API. Expects an [`auth::Identity`] extension on authenticated requests.
    pub fn router(&self) -> axum::Router {
        axum::Router::new()
    }

    /// Background work (ownerReference garbage collection) until `shutdown` fires.
    pub async fn run_background(&self, shutdown: CancellationToken) {
        shutdown.cancelled().await;
    }
}
