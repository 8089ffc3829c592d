//! The security HTTP API under `/rlark/v1/`. Errors are Kubernetes `Status` objects.
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /rlark/v1/ca` | anyone | CA bundle and the pin of the active CA |
//! | `POST /rlark/v1/join` | anyone with a bootstrap token | sign the agent's CSR (failures rate-limited per source, see `join_limit`) |
//! | `POST /rlark/v1/renew` | certificate holders | sign a new CSR for the same subject |
//! | `GET/POST /rlark/v1/certificates` | admin | list issued / sign a CSR for a role |
//! | `POST /rlark/v1/sshcertificates` | admin | sign an OpenSSH certificate (`domain`, `ssh-guest`) |
//! | `GET/POST /rlark/v1/revocations` | admin | list / revoke a serial (and the certificates renewed from it), user, cluster or token |
//! | `GET /rlark/v1/agentrevocations` | agents, admin | the revoked agent serials, with `ETag` and a long poll (see `agent_revocations`) |
//! | `POST /rlark/v1/tokens` | admin | bootstrap token, or bearer token of a user |
//! | `POST /rlark/v1/namespaces/{ns}/tasks/{name}/token` | admin, agent of `ns` | task token |

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rlark_apiserver::ApiServer;
use rlark_apiserver::audit::AuditEntry;
use rlark_apiserver::auth::{self, Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_pki::ssh::{SshCa, SshCertRole};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{AuthMethod, CertRole, Security, SecurityError, rfc3339};

/// Largest request body of these routes.
pub(crate) const MAX_BODY_BYTES: usize = 64 * 1024;

/// Shared state of the security routes.
#[derive(Clone)]
pub(crate) struct RoutesState {
    pub security: Arc<Security>,
    pub ssh_ca: Arc<SshCa>,
    pub api: ApiServer,
    /// Cancelled when the server begins to stop: held requests (long polls) answer then.
    pub shutdown: CancellationToken,
}

/// The routes; merged into the process router.
pub(crate) fn router(state: RoutesState) -> Router {
    Router::new()
        .route("/rlark/v1/ca", get(ca))
        .route("/rlark/v1/join", post(join))
        .route("/rlark/v1/renew", post(renew))
        .route("/rlark/v1/certificates", get(list_certificates).post(sign))
        .route("/rlark/v1/sshcertificates", post(sign_ssh))
        .route("/rlark/v1/revocations", get(list_revocations).post(revoke))
        .route(super::agent_revocations::ROUTE, get(agent_revocations))
        .route("/rlark/v1/tokens", get(list_tokens).post(create_token))
        .route(
            "/rlark/v1/namespaces/{namespace}/tasks/{name}/token",
            post(task_token),
        )
        .with_state(state)
}

fn error_response(error: SecurityError) -> Response {
    let reason = match error.code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    ApiError::new(error.code, reason, error.message).into_response()
}

fn ok(value: Value) -> Response {
    axum::Json(value).into_response()
}

/// Read and decode a JSON body of at most [`MAX_BODY_BYTES`]; every failure is a 400 that
/// names the problem.
async fn json_body<T: DeserializeOwned>(request: Request) -> Result<T, SecurityError> {
    let bytes = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            SecurityError::bad_request(format!(
                "request body is larger than {MAX_BODY_BYTES} bytes"
            ))
        })?;
    if bytes.is_empty() {
        return Err(SecurityError::bad_request(
            "request body is empty; expected JSON",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut de)
        .map_err(|e| SecurityError::bad_request(format!("invalid request body: {e}")))
}

fn identity_of(request: &Request) -> Option<Identity> {
    request.extensions().get::<Identity>().cloned()
}

/// 401 for anonymous callers, 403 (audited) for non-admins.
fn require_admin(
    security: &Security,
    request: &Request,
    verb: &str,
    resource: &str,
) -> Result<Identity, SecurityError> {
    let Some(identity) = identity_of(request) else {
        return Err(SecurityError::unauthorized("Unauthorized"));
    };
    if identity.role() == Role::Admin {
        return Ok(identity);
    }
    Err(deny(
        security,
        &identity,
        verb,
        resource,
        "",
        "only admins may do this",
    ))
}

fn deny(
    security: &Security,
    identity: &Identity,
    verb: &str,
    resource: &str,
    namespace: &str,
    why: &str,
) -> SecurityError {
    let message = format!(
        "{resource} is forbidden: User \"{}\" cannot {verb} {resource}: {why}",
        identity.user
    );
    let mut entry = AuditEntry::now("denied", "denied").by(Some(identity));
    entry.verb = verb.to_string();
    entry.resource = resource.to_string();
    entry.namespace = namespace.to_string();
    entry.reason = message.clone();
    security.audit().record(entry);
    SecurityError::forbidden(message)
}

fn cert_json(issued: &super::Issued) -> Value {
    json!({
        "certificate": issued.certificate_pem,
        "caBundle": issued.ca_bundle_pem,
        "serial": issued.info.serial,
        "user": issued.info.common_name,
        "groups": issued.info.groups,
        "notAfter": rfc3339(issued.info.not_after),
    })
}

fn parse_csr(text: &str) -> Result<rlark_pki::ParsedCsr, SecurityError> {
    rlark_pki::parse_csr(text.as_bytes())
        .map_err(|e| SecurityError::bad_request(format!("csr: {e}")))
}

async fn ca(State(state): State<RoutesState>) -> Response {
    let ca = state.security.ca();
    match ca.cert_hash() {
        Ok(hash) => ok(json!({"caBundle": ca.bundle_pem(), "caHash": hash})),
        Err(e) => error_response(SecurityError::internal(e.to_string())),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct JoinRequest {
    token: String,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
    csr: String,
}

/// 429 with `Retry-After` (whole seconds, rounded up) for a source whose joins are refused.
fn too_many_joins(retry_after: Duration) -> Response {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut error = ApiError::new(
        429,
        "TooManyRequests",
        format!(
            "too many failed joins from this address; retry after {seconds}s \
             (each further failure doubles the wait)"
        ),
    );
    error.retry_after_seconds = Some(seconds.max(1));
    error.into_response()
}

async fn join(State(state): State<RoutesState>, request: Request) -> Response {
    // Every request reaching the router carries the peer address (`http::connection_service`).
    let source = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    let limiter = state.security.join_limiter();
    if let Some(ip) = source
        && let Err(retry_after) = limiter.check(ip, Instant::now())
    {
        return too_many_joins(retry_after);
    }
    let security = Arc::clone(&state.security);
    let result = async move {
        let body: JoinRequest = json_body(request).await?;
        let csr = parse_csr(&body.csr)?;
        let api = state.api.clone();
        let (cluster_id, issued) = state
            .security
            .join(
                &body.token,
                body.cluster_id.as_deref(),
                &csr,
                source,
                async |ns: &str| {
                    api.ensure_namespace(ns).await.map_err(|e| {
                        SecurityError::internal(format!("create namespace {ns}: {}", e.message))
                    })
                },
            )
            .await?;
        let mut value = cert_json(&issued);
        value["clusterID"] = json!(cluster_id);
        value["namespace"] = json!(auth::agent_namespace(&cluster_id));
        Ok::<_, SecurityError>(value)
    }
    .await;
    // Only a refused token (401) counts against the source: that is a guess, which cost a
    // store lookup and an audit record. A malformed request (400) reveals nothing, costs
    // neither, and is what a misconfigured agent sends; a server error is not the client's.
    if let (Err(error), Some(ip)) = (&result, source)
        && error.code == 401
        && let Some(blocked) = security.join_limiter().failure(ip, Instant::now())
    {
        let mut entry = AuditEntry::now("join", "denied");
        entry.verb = "join".into();
        entry.resource = "bootstraptokens".into();
        entry.reason = format!(
            "source {ip}: too many failed joins; its joins are refused for {}s (block {} in a \
             row; {} joins were refused during the previous block)",
            blocked.retry_after.as_secs(),
            blocked.blocks,
            blocked.refused_before
        );
        security.audit().record(entry);
    }
    result.map(ok).unwrap_or_else(error_response)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RenewRequest {
    csr: String,
}

async fn renew(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let Some(identity) = identity_of(&request) else {
            return Err(SecurityError::unauthorized("Unauthorized"));
        };
        if !matches!(
            request.extensions().get::<AuthMethod>(),
            Some(AuthMethod::Certificate { .. })
        ) {
            return Err(deny(
                &state.security,
                &identity,
                "renew",
                "certificates",
                "",
                "renewal needs a client certificate",
            ));
        }
        let Some(AuthMethod::Certificate { serial }) =
            request.extensions().get::<AuthMethod>().cloned()
        else {
            return Err(SecurityError::unauthorized("Unauthorized"));
        };
        let Some(role) = CertRole::from_identity(&identity) else {
            return Err(deny(
                &state.security,
                &identity,
                "renew",
                "certificates",
                "",
                "the certificate has no renewable role",
            ));
        };
        let body: RenewRequest = json_body(request).await?;
        let csr = parse_csr(&body.csr)?;
        let issued = state
            .security
            .renew(&csr, &role, &identity, &serial)
            .await?;
        Ok(cert_json(&issued))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SignRequest {
    role: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
    csr: String,
    #[serde(default)]
    validity_seconds: Option<u64>,
}

fn validity(seconds: Option<u64>) -> Result<Option<Duration>, SecurityError> {
    match seconds {
        None => Ok(None),
        Some(0) => Err(SecurityError::bad_request(
            "validitySeconds must be positive",
        )),
        Some(s) if s > 10 * 365 * 24 * 3600 => Err(SecurityError::bad_request(
            "validitySeconds may be at most 10 years",
        )),
        Some(s) => Ok(Some(Duration::from_secs(s))),
    }
}

async fn sign(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let admin = require_admin(&state.security, &request, "create", "certificates")?;
        let body: SignRequest = json_body(request).await?;
        let role =
            CertRole::from_parts(&body.role, body.name.as_deref(), body.cluster_id.as_deref())?;
        let csr = parse_csr(&body.csr)?;
        let issued = state
            .security
            .issue(
                &csr,
                &role,
                validity(body.validity_seconds)?,
                "sign",
                Some(&admin),
                None,
            )
            .await?;
        Ok(cert_json(&issued))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

async fn list_certificates(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        require_admin(&state.security, &request, "list", "certificates")?;
        let items = state.security.certificates().await?;
        Ok(json!({"items": items}))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SshSignRequest {
    role: String,
    public_key: String,
    #[serde(default)]
    domain: Option<String>,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    validity_seconds: Option<u64>,
}

async fn sign_ssh(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let admin = require_admin(&state.security, &request, "create", "sshcertificates")?;
        let body: SshSignRequest = json_body(request).await?;
        let missing =
            |field: &str| SecurityError::bad_request(format!("role {} needs {field}", body.role));
        let role = match body.role.as_str() {
            "domain" => SshCertRole::Domain {
                domain: body.domain.clone().ok_or_else(|| missing("domain"))?,
                cluster_id: body
                    .cluster_id
                    .clone()
                    .ok_or_else(|| missing("clusterID"))?,
            },
            "ssh-guest" => SshCertRole::Guest {
                user: body.user.clone().ok_or_else(|| missing("user"))?,
            },
            other => {
                return Err(SecurityError::bad_request(format!(
                    "unknown SSH role {other:?}; expected domain or ssh-guest"
                )));
            }
        };
        let validity = validity(body.validity_seconds)?.unwrap_or(Duration::from_secs(24 * 3600));
        let signed = state
            .ssh_ca
            .sign(&body.public_key, &role, validity)
            .map_err(|e| SecurityError::bad_request(e.to_string()))?;
        state
            .security
            .record_ssh_certificate(&signed, &role, &admin.user)
            .await?;
        let mut entry = AuditEntry::now("sign", "allowed").by(Some(&admin));
        entry.verb = "sign".into();
        entry.resource = "sshcertificates".into();
        entry.name = signed.serial.to_string();
        entry.reason = format!("{} principals {:?}", signed.key_id, signed.principals);
        state.security.audit().record(entry);
        Ok(json!({
            "certificate": signed.certificate_openssh,
            "serial": signed.serial,
            "serialHex": format!("{:x}", signed.serial),
            "keyID": signed.key_id,
            "principals": signed.principals,
            "validBefore": signed.valid_before,
            "caPublicKey": state.ssh_ca.public_key_openssh(),
        }))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

async fn list_revocations(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        require_admin(&state.security, &request, "list", "revocations")?;
        let items = state.security.revocations().await?;
        Ok(json!({"items": items}))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

/// `waitSeconds` of the query (0 when absent), or why it is refused.
fn wait_seconds(query: Option<&str>) -> Result<Duration, SecurityError> {
    let mut wait = Duration::ZERO;
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "waitSeconds" {
            return Err(SecurityError::bad_request(format!(
                "unknown query parameter {name:?}; expected waitSeconds"
            )));
        }
        let max = super::agent_revocations::MAX_WAIT.as_secs();
        wait = match value.parse::<u64>() {
            Ok(seconds) if seconds <= max => Duration::from_secs(seconds),
            _ => {
                return Err(SecurityError::bad_request(format!(
                    "waitSeconds {value:?} must be a whole number from 0 to {max}"
                )));
            }
        };
    }
    Ok(wait)
}

/// The revoked serials agents check peers against (`super::agent_revocations`): agents and
/// admins; `If-None-Match` answers 304 while unchanged, `waitSeconds` holds the request
/// until a change.
async fn agent_revocations(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let Some(identity) = identity_of(&request) else {
            return Err(SecurityError::unauthorized("Unauthorized"));
        };
        if !matches!(identity.role(), Role::Admin | Role::Agent { .. }) {
            return Err(deny(
                &state.security,
                &identity,
                "get",
                "agentrevocations",
                "",
                "only agents and admins may read the revoked agent certificates",
            ));
        }
        let wait = wait_seconds(request.uri().query())?;
        let known = request
            .headers()
            .get(http::header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // Subscribed before the first read, so a revocation between the two is not missed.
        let mut changes = state.security.subscribe();
        let mut list = state.security.agent_revocations().await?;
        if let Some(known) = &known {
            let deadline = tokio::time::Instant::now() + wait;
            while &list.etag == known {
                tokio::select! {
                    () = state.shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(deadline) => break,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        list = state.security.agent_revocations().await?;
                    }
                }
            }
        }
        Ok((known, list))
    }
    .await;
    let (known, list) = match result {
        Ok(answer) => answer,
        Err(error) => return error_response(error),
    };
    let etag = [(http::header::ETAG, list.etag.clone())];
    if known.as_deref() == Some(list.etag.as_str()) {
        return (http::StatusCode::NOT_MODIFIED, etag).into_response();
    }
    (
        etag,
        axum::Json(json!({"kind": "AgentRevocationList", "serials": list.serials})),
    )
        .into_response()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RevokeRequest {
    #[serde(default)]
    serial: Option<String>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
    #[serde(default, rename = "tokenID")]
    token_id: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

async fn revoke(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let admin = require_admin(&state.security, &request, "create", "revocations")?;
        let body: RevokeRequest = json_body(request).await?;
        let reason = body
            .reason
            .unwrap_or_else(|| "revoked by an admin".to_string());
        let given = [&body.serial, &body.user, &body.cluster_id, &body.token_id]
            .iter()
            .filter(|f| f.is_some())
            .count();
        if given != 1 {
            return Err(SecurityError::bad_request(
                "give exactly one of serial, user, clusterID, tokenID",
            ));
        }
        let security = &state.security;
        let serials = if let Some(serial) = body.serial {
            let normalized = rlark_pki::normalize_serial(&serial).ok_or_else(|| {
                SecurityError::bad_request(format!("serial {serial:?} is not hexadecimal"))
            })?;
            security.revoke_serial(&normalized, &reason, &admin).await?
        } else if let Some(user) = body.user {
            security.revoke_user(&user, &reason, &admin).await?
        } else if let Some(cluster_id) = body.cluster_id {
            super::validate_cluster_id(&cluster_id)?;
            security
                .revoke_cluster(&cluster_id, &reason, &admin)
                .await?
        } else if let Some(token_id) = body.token_id {
            security.revoke_bearer_token(&token_id, &admin).await?;
            Vec::new()
        } else {
            Vec::new()
        };
        Ok(json!({"revoked": serials}))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

/// `GET /rlark/v1/tokens` (admins): the bearer tokens of users and tasks, without their
/// secrets' hashes: `{"items": [{"id", "user", "groups", "expiresAt", "task", "createdBy",
/// "revokedAt"}]}`, `task` being `{"namespace", "name", "uid"}` for task tokens.
async fn list_tokens(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        require_admin(&state.security, &request, "list", "tokens")?;
        let kind = request
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|pair| pair.strip_prefix("kind="))
            .unwrap_or("user");
        match kind {
            "user" => {}
            "bootstrap" => {
                // Join tokens: who made them, for which cluster, until when, who used them;
                // never the secret's hash.
                let items: Vec<Value> = state
                    .security
                    .bootstrap_tokens()
                    .await?
                    .into_iter()
                    .map(|t| {
                        json!({
                            "id": t.id,
                            "clusterID": t.cluster_id,
                            "rejoin": t.rejoin,
                            "expiresAt": t.expires_at,
                            "usedBy": t.used_by,
                            "createdBy": t.created_by,
                        })
                    })
                    .collect();
                return Ok(json!({ "items": items }));
            }
            other => {
                return Err(SecurityError::bad_request(format!(
                    "kind {other:?}: list `user` tokens (users' and tasks' bearer tokens, the \
                     default) or `bootstrap` (join) tokens"
                )));
            }
        }
        let items: Vec<Value> = state
            .security
            .bearer_tokens()
            .await?
            .into_iter()
            .map(|t| {
                json!({
                    "id": t.id,
                    "user": t.user,
                    "groups": t.groups,
                    "expiresAt": t.expires_at,
                    "task": t.task,
                    "createdBy": t.created_by,
                    "revokedAt": t.revoked_at,
                })
            })
            .collect();
        Ok(json!({ "items": items }))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TokenRequest {
    /// `bootstrap` (default) or `user`.
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    ttl_seconds: Option<u64>,
    #[serde(default, rename = "clusterID")]
    cluster_id: Option<String>,
    /// For bootstrap tokens: may give a cluster that joined before a new identity.
    #[serde(default)]
    rejoin: bool,
    #[serde(default)]
    user: Option<String>,
    /// For user tokens: `viewer` or `admin`.
    #[serde(default)]
    role: Option<String>,
}

async fn create_token(State(state): State<RoutesState>, request: Request) -> Response {
    let result = async move {
        let admin = require_admin(&state.security, &request, "create", "tokens")?;
        let body: TokenRequest = json_body(request).await?;
        match body.kind.as_deref().unwrap_or("bootstrap") {
            "bootstrap" => {
                let ttl = Duration::from_secs(body.ttl_seconds.unwrap_or(3600));
                let cluster_id = body.cluster_id.filter(|c| !c.is_empty()).ok_or_else(|| {
                    SecurityError::bad_request(
                        "clusterID is required: a join token is bound to the one cluster \
                         that joins with it (rlark token create --cluster-id ID)",
                    )
                })?;
                let (token, record) = state
                    .security
                    .create_bootstrap_token(ttl, &cluster_id, body.rejoin, &admin)
                    .await?;
                let ca_hash = state
                    .security
                    .ca()
                    .cert_hash()
                    .map_err(|e| SecurityError::internal(e.to_string()))?;
                Ok(json!({
                    "kind": "bootstrap",
                    "id": record.id,
                    "token": token.expose(),
                    "expiresAt": record.expires_at,
                    "clusterID": record.cluster_id,
                    "rejoin": record.rejoin,
                    "caHash": ca_hash,
                }))
            }
            "user" => {
                if body.rejoin || body.cluster_id.is_some() {
                    return Err(SecurityError::bad_request(
                        "clusterID and rejoin are for bootstrap (join) tokens",
                    ));
                }
                let user = body
                    .user
                    .ok_or_else(|| SecurityError::bad_request("a user token needs user"))?;
                let role = CertRole::from_parts(
                    body.role.as_deref().unwrap_or("viewer"),
                    Some(&user),
                    None,
                )?;
                if !matches!(role, CertRole::Admin { .. } | CertRole::Viewer { .. }) {
                    return Err(SecurityError::bad_request(
                        "a user token's role must be viewer or admin",
                    ));
                }
                let ttl = validity(body.ttl_seconds)?;
                let (token, record) = state
                    .security
                    .create_bearer_token(&role.subject(), ttl, None, &admin)
                    .await?;
                Ok(json!({
                    "kind": "user",
                    "id": record.id,
                    "token": token.expose(),
                    "user": record.user,
                    "groups": record.groups,
                    "expiresAt": record.expires_at,
                }))
            }
            other => Err(SecurityError::bad_request(format!(
                "unknown token kind {other:?}; expected bootstrap or user"
            ))),
        }
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}

async fn task_token(
    State(state): State<RoutesState>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
) -> Response {
    let result = async move {
        let Some(identity) = identity_of(&request) else {
            return Err(SecurityError::unauthorized("Unauthorized"));
        };
        let allowed = match identity.role() {
            Role::Admin => true,
            Role::Agent { cluster_id } => auth::agent_namespace(&cluster_id) == namespace,
            _ => false,
        };
        if !allowed {
            return Err(deny(
                &state.security,
                &identity,
                "create",
                "tasks/token",
                &namespace,
                "only admins and the agent owning the namespace may mint task tokens",
            ));
        }
        let (token, record) = state
            .security
            .create_task_token(&namespace, &name, &identity)
            .await?;
        Ok(json!({
            "id": record.id,
            "token": token.expose(),
            "user": record.user,
            "groups": record.groups,
        }))
    }
    .await;
    result.map(ok).unwrap_or_else(error_response)
}
