//! `/rlark/v1/sshkeys` — users register the public keys they `ssh` with — and
//! `/rlark/v1/sshinfo`, what a client needs to reach the SSH endpoint.
//!
//! | route | who | what |
//! |---|---|---|
//! | `POST /rlark/v1/sshkeys` `{publicKey, ttlSeconds?}` | any user (not agents, tasks or peers) | register a key for the caller (with `ttlSeconds`, it logs nobody in after that; expired keys are deleted a day later, at the owner's next registration); 409 when the key is registered already |
//! | `GET /rlark/v1/sshkeys` | any user | the caller's keys (an admin: everyone's, or `?user=U`) |
//! | `DELETE /rlark/v1/sshkeys/{id}` | the owner, an admin | remove a key (by id or `SHA256:` fingerprint); its open SSH connections close |
//! | `GET /rlark/v1/sshinfo` | anyone authenticated | `{enabled, port, hostKey, hostKeyFingerprint, caPublicKey}` |
//!
//! Registering, removing and refusals are audited.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use serde::Deserialize;
use serde_json::json;

use super::SshEndpoint;
use super::keys::{KeyError, RegisteredWith, SshKeys};
use crate::security::AuthMethod;

/// Largest request body.
const MAX_BODY: usize = 64 * 1024;

/// State of the routes.
#[derive(Clone)]
pub(crate) struct KeyRoutes {
    pub keys: Arc<SshKeys>,
    pub audit: Arc<dyn AuditSink>,
    /// The SSH endpoint, when on.
    pub endpoint: Option<SshEndpoint>,
    /// The installation's SSH CA public key line.
    pub ca_public_key: String,
}

pub(crate) fn router(state: KeyRoutes) -> Router {
    Router::new()
        .route("/rlark/v1/sshkeys", get(list).post(add))
        .route("/rlark/v1/sshkeys/{id}", delete(remove))
        .route("/rlark/v1/sshinfo", get(info))
        .with_state(state)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AddRequest {
    public_key: String,
    /// Seconds until the key stops logging anyone in (1 .. a day); absent: no expiry.
    #[serde(default)]
    ttl_seconds: Option<u64>,
}

fn error(error: KeyError) -> Response {
    match error {
        KeyError::BadRequest(m) => ApiError::bad_request(m),
        KeyError::Conflict(m) => ApiError::new(409, "Conflict", m),
        KeyError::NotFound(m) => ApiError::new(404, "NotFound", m),
        KeyError::Forbidden(m) => ApiError::new(403, "Forbidden", m),
        KeyError::Store(e) => ApiError::new(500, "InternalError", e.to_string()),
    }
    .into_response()
}

/// The caller, when it is a user (not an agent, task or peer).
fn user(request: &Request) -> Result<Identity, Box<Response>> {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return Err(Box::new(ApiError::unauthorized().into_response()));
    };
    match identity.role() {
        Role::Agent { .. } | Role::Task { .. } | Role::Peer { .. } => {
            Err(Box::new(error(KeyError::Forbidden(format!(
                "{:?} is not a user: only users register SSH keys",
                identity.user
            )))))
        }
        _ => Ok(identity),
    }
}

async fn add(State(state): State<KeyRoutes>, request: Request) -> Response {
    let identity = match user(&request) {
        Ok(identity) => identity,
        Err(response) => return *response,
    };
    let registered_with = match request.extensions().get::<AuthMethod>() {
        Some(AuthMethod::Certificate { serial }) => RegisteredWith::Certificate {
            serial: serial.clone(),
        },
        Some(AuthMethod::Bearer { id }) | Some(AuthMethod::Session { token_id: Some(id) }) => {
            RegisteredWith::Token { id: id.clone() }
        }
        _ => {
            return error(KeyError::BadRequest(
                "register SSH keys with a client certificate or a bearer token (the key \
                 stays valid while that credential is)"
                    .into(),
            ));
        }
    };
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(_) => {
            return error(KeyError::BadRequest(format!(
                "request body is larger than {MAX_BODY} bytes"
            )));
        }
    };
    let body: AddRequest = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => {
            return error(KeyError::BadRequest(format!(
                "request body is not {{\"publicKey\": \"ssh-ed25519 AAAA...\"}}: {e}"
            )));
        }
    };
    match state
        .keys
        .add(
            &identity,
            registered_with,
            &body.public_key,
            body.ttl_seconds.map(std::time::Duration::from_secs),
        )
        .await
    {
        Ok(record) => {
            state.audit.record(AuditEntry {
                verb: "create".into(),
                resource: "sshkeys".into(),
                name: record.fingerprint.clone(),
                reason: format!("SSH key {} ({})", record.id, record.comment),
                ..AuditEntry::now("sshkey-add", "allowed").by(Some(&identity))
            });
            (http::StatusCode::CREATED, axum::Json(json!(record))).into_response()
        }
        Err(e) => error(e),
    }
}

async fn list(State(state): State<KeyRoutes>, request: Request) -> Response {
    let identity = match user(&request) {
        Ok(identity) => identity,
        Err(response) => return *response,
    };
    let asked = request
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("user="))
        .map(|u| rlark_api::agent::local::percent_decode(u).unwrap_or_default());
    let admin = identity.role() == Role::Admin;
    let user = match (&asked, admin) {
        (Some(user), true) => Some(user.clone()),
        (None, true) => None,
        (Some(user), false) if *user != identity.user => {
            return error(KeyError::Forbidden(format!(
                "user {:?} may list only its own SSH keys",
                identity.user
            )));
        }
        _ => Some(identity.user.clone()),
    };
    match state.keys.list(user.as_deref()).await {
        Ok(items) => axum::Json(json!({"items": items})).into_response(),
        Err(e) => error(e),
    }
}

async fn remove(
    State(state): State<KeyRoutes>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    let identity = match user(&request) {
        Ok(identity) => identity,
        Err(response) => return *response,
    };
    let admin = identity.role() == Role::Admin;
    match state.keys.remove(&id, &identity, admin).await {
        Ok(record) => {
            state.audit.record(AuditEntry {
                verb: "delete".into(),
                resource: "sshkeys".into(),
                name: record.fingerprint.clone(),
                reason: format!("SSH key {} of user {:?}", record.id, record.user),
                ..AuditEntry::now("sshkey-remove", "allowed").by(Some(&identity))
            });
            axum::Json(json!(record)).into_response()
        }
        Err(e) => error(e),
    }
}

async fn info(State(state): State<KeyRoutes>, request: Request) -> Response {
    if request.extensions().get::<Identity>().is_none() {
        return ApiError::unauthorized().into_response();
    }
    match &state.endpoint {
        Some(endpoint) => axum::Json(json!({
            "enabled": true,
            "port": endpoint.addr.port(),
            "hostKey": endpoint.host_key,
            "hostKeyFingerprint": endpoint.host_key_fingerprint,
            "caPublicKey": state.ca_public_key,
        }))
        .into_response(),
        None => axum::Json(json!({"enabled": false, "caPublicKey": state.ca_public_key}))
            .into_response(),
    }
}
