//! RLark's gateway REST (`/api/v1/...`, what RLark's own React console calls), served by
//! rlark on its own authentication and mapped onto its own objects (docs/rlark-gateway.md).
//!
//! - [`resources`] — `/api/v1/rlinf.io/v1alpha1/{nodes,workflows,jobs,tasks,pods,domains}`,
//!   onto rlark's Kubernetes API;
//! - [`clusters`] — `/api/v1/clusters`, RLark's cluster view from rlark's Nodes;
//! - [`auth`] — `/api/v1/auth/login` (an rlark bearer token as the password) and the
//!   gateway's session cookie;
//! - [`logs`] — a Job's logs and a Pod's events;
//! - [`ssh_keys`] — `/api/v1/ssh-user-keys` onto rlark's SSH keys;
//! - [`terminal`] — a Pod's terminal WebSocket onto rlark's exec;
//! - [`certificates`] — `GET /api/v1/certificates/agent`, the clusters' agent certificates;
//! - [`unsupported`] — 501 for RLark features rlark does not have.
//!
//! Every call into rlark goes through [`forward::Backend`], rlark's own router, as the
//! caller: the gateway adds no permission of its own.

pub(crate) mod auth;
mod certificates;
mod clusters;
mod error;
pub(crate) mod forward;
mod logs;
mod resources;
mod ssh_keys;
mod terminal;
mod unsupported;

use std::sync::Arc;

use axum::Router;
use axum::routing::{delete, get, post};

use crate::console::sessions::Sessions;
use crate::security::Security;
use forward::Backend;

/// The gateway's shared state.
#[derive(Clone, Debug)]
pub(crate) struct Gateway {
    backend: Backend,
    auth: auth::GatewayAuth,
}

impl Gateway {
    /// A gateway calling into `backend` (rlark's routes, without the gateway's), with
    /// browser sessions in `sessions` (the console's store).
    pub(crate) fn new(backend: Router, sessions: Arc<Sessions>, security: Arc<Security>) -> Self {
        Self {
            backend: Backend::new(backend),
            auth: auth::GatewayAuth { sessions, security },
        }
    }

    /// What [`auth::layer`] needs.
    pub(crate) fn auth(&self) -> auth::GatewayAuth {
        self.auth.clone()
    }
}

/// The path prefixes the gateway serves (and its session cookie authenticates).
const PREFIXES: &[&str] = &[
    "/api/v1/rlinf.io/",
    "/api/v1/clusters",
    "/api/v1/auth/",
    "/api/v1/ssh-user-keys",
];

/// Whether `path` is one of the gateway's (a prefix followed by nothing or a `/`).
pub(crate) fn is_gateway_path(path: &str) -> bool {
    PREFIXES
        .iter()
        .copied()
        .chain(unsupported::prefixes())
        .any(|prefix| {
            path.strip_prefix(prefix).is_some_and(|rest| {
                prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/')
            })
        })
}

const RESOURCE: &str = "/api/v1/rlinf.io/v1alpha1/{resource}";
const OBJECT: &str = "/api/v1/rlinf.io/v1alpha1/{resource}/{name}";

/// The gateway's routes.
pub(crate) fn router(gateway: Gateway) -> Router {
    let auth_routes = Router::new()
        .route("/api/v1/auth/login", post(auth::login))
        .route("/api/v1/auth/logout", post(auth::logout))
        .with_state(gateway.auth());
    Router::new()
        .route(RESOURCE, get(resources::list).post(resources::create))
        .route(
            OBJECT,
            get(resources::get)
                .put(resources::update)
                .patch(resources::patch)
                .delete(resources::delete),
        )
        .route(
            "/api/v1/rlinf.io/v1alpha1/jobs/{name}/logs",
            get(logs::job_logs),
        )
        .route(
            "/api/v1/rlinf.io/v1alpha1/pods/{name}/events",
            get(logs::pod_events),
        )
        .route(
            "/api/v1/rlinf.io/v1alpha1/pods/{name}/terminal",
            get(terminal::terminal),
        )
        .route(
            "/api/v1/ssh-user-keys",
            get(ssh_keys::list).post(ssh_keys::add),
        )
        .route("/api/v1/ssh-user-keys/{index}", delete(ssh_keys::remove))
        .route(
            "/api/v1/certificates/agent",
            get(certificates::list).fallback(unsupported::certificates),
        )
        .route("/api/v1/clusters", get(clusters::list))
        .route("/api/v1/clusters/{cluster_id}", get(clusters::get))
        .with_state(gateway)
        .merge(auth_routes)
        .merge(unsupported::router())
}

#[cfg(test)]
mod tests;
