//! Identity and security of the server process: issuing certificates for CSRs (join,
//! renewal, admin signing), bootstrap and bearer tokens, revocation, and the audit trail.
//!
//! State lives in the store ([`records`]); the set of revoked serials is also kept in memory
//! because the TLS handshake checks it synchronously, and in `pki/revocations.json`
//! ([`revocation_file`]) so that it survives the loss of the store. Every revocation — made here or, with
//! a shared store, by another replica — bumps [`Security::subscribe`]'s counter; open
//! connections of the revoked identity close on that signal (see `lib.rs`).
//!
//! Files: this one holds the configuration, the errors, the name rules and [`Security`] with
//! its state and store access; `certificates` (issuing and recording certificates),
//! `join` (bootstrap tokens and join), `bearer` (bearer and task tokens), `revoke`
//! (revocation, and following other replicas' revocations).

pub(crate) mod agent_revocations;
pub(crate) mod audit_file;
mod bearer;
pub mod ca_store;
mod certificates;
mod join;
pub(crate) mod join_limit;
pub(crate) mod records;
pub(crate) mod revocation_file;
mod revoke;
pub(crate) mod routes;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rlark_apiserver::audit::AuditSink;
use rlark_apiserver::auth::{self, Identity, Role};
use rlark_pki::{Ca, CertInfo};
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use tokio::sync::watch;

use records::{BearerTokenRecord, CERTIFICATES, CertificateRecord, REVOCATIONS, RevocationRecord};

/// Lifetimes of what the security layer issues, and the join rate limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityConfig {
    /// Agent certificates (join and renewal). Agents renew at 2/3 of it.
    pub agent_cert_validity: Duration,
    /// Certificates of users (`admin`, `viewer`) and peers signed through the API.
    pub user_cert_validity: Duration,
    /// Longest lifetime of a bootstrap token.
    pub max_bootstrap_token_ttl: Duration,
    /// Rate limit of failed joins per source address.
    pub join_limit: join_limit::JoinLimitConfig,
}

impl Default for SecurityConfig {
    /// Agents 30 days, users 1 year, bootstrap tokens at most 7 days; the join limit's
    /// defaults.
    fn default() -> Self {
        Self {
            agent_cert_validity: Duration::from_secs(30 * 24 * 3600),
            user_cert_validity: Duration::from_secs(365 * 24 * 3600),
            max_bootstrap_token_ttl: Duration::from_secs(7 * 24 * 3600),
            join_limit: join_limit::JoinLimitConfig::default(),
        }
    }
}

/// A refused or failed security operation; `code` is the HTTP status it maps to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SecurityError {
    pub code: u16,
    pub message: String,
}

impl SecurityError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            message: message.into(),
        }
    }
    pub(crate) fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: 401,
            message: message.into(),
        }
    }
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self {
            code: 403,
            message: message.into(),
        }
    }
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self {
            code: 404,
            message: message.into(),
        }
    }
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self {
            code: 500,
            message: message.into(),
        }
    }
    fn store(error: StoreError) -> Self {
        Self::internal(format!("store: {error}"))
    }
}

type SecResult<T> = Result<T, SecurityError>;

/// How a request was authenticated (a request extension next to the [`Identity`], set by
/// `crate::auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AuthMethod {
    /// Client certificate with this serial (normalized hex).
    Certificate { serial: String },
    /// Bearer token with this id.
    Bearer { id: String },
    /// The web console's session cookie (`crate::console`); the bearer token the session
    /// was created with, if any.
    Session { token_id: Option<String> },
    /// The task proxy origin's cookie (`crate::console::proxy_origin`); the bearer token
    /// its grant is bound to, if any.
    ProxyCookie { token_id: Option<String> },
}

/// The certificate roles the server signs for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertRole {
    Admin { user: String },
    Viewer { user: String },
    Agent { cluster_id: String },
    Peer { name: String },
}

impl CertRole {
    /// Parse an API/CLI role name with its subject.
    pub fn from_parts(
        role: &str,
        name: Option<&str>,
        cluster_id: Option<&str>,
    ) -> SecResult<CertRole> {
        let need_name = |what: &str| {
            name.filter(|n| !n.is_empty())
                .map(str::to_string)
                .ok_or_else(|| SecurityError::bad_request(format!("role {what} needs a name")))
        };
        let role = match role {
            "admin" => CertRole::Admin {
                user: need_name("admin")?,
            },
            "viewer" => CertRole::Viewer {
                user: need_name("viewer")?,
            },
            "peer" => CertRole::Peer {
                name: need_name("peer")?,
            },
            "agent" => CertRole::Agent {
                cluster_id: cluster_id
                    .or(name)
                    .map(str::to_string)
                    .ok_or_else(|| SecurityError::bad_request("role agent needs a clusterID"))?,
            },
            other => {
                return Err(SecurityError::bad_request(format!(
                    "unknown role {other:?}; expected admin, viewer, agent or peer"
                )));
            }
        };
        role.validate()?;
        Ok(role)
    }

    fn validate(&self) -> SecResult<()> {
        match self {
            CertRole::Admin { user } | CertRole::Viewer { user } => validate_user_name(user),
            CertRole::Agent { cluster_id } => validate_cluster_id(cluster_id),
            CertRole::Peer { name } => validate_cluster_id(name).map_err(|e| {
                SecurityError::bad_request(e.message.replace("cluster ID", "peer name"))
            }),
        }
    }

    /// `admin`, `viewer`, `agent` or `peer`.
    pub fn name(&self) -> &'static str {
        match self {
            CertRole::Admin { .. } => "admin",
            CertRole::Viewer { .. } => "viewer",
            CertRole::Agent { .. } => "agent",
            CertRole::Peer { .. } => "peer",
        }
    }

    /// The certificate subject: (CN, O values).
    pub fn subject(&self) -> Identity {
        match self {
            CertRole::Admin { user } => Identity {
                user: user.clone(),
                groups: vec![auth::ADMIN_GROUP.to_string()],
            },
            CertRole::Viewer { user } => Identity {
                user: user.clone(),
                groups: vec![auth::VIEWER_GROUP.to_string()],
            },
            CertRole::Agent { cluster_id } => Identity::agent(cluster_id),
            CertRole::Peer { name } => Identity::peer(name),
        }
    }

    /// The role a certificate subject was issued for (renewal keeps it).
    pub fn from_identity(identity: &Identity) -> Option<CertRole> {
        match identity.role() {
            Role::Admin => Some(CertRole::Admin {
                user: identity.user.clone(),
            }),
            Role::Viewer => Some(CertRole::Viewer {
                user: identity.user.clone(),
            }),
            Role::Agent { cluster_id } => Some(CertRole::Agent { cluster_id }),
            Role::Peer { name } => Some(CertRole::Peer { name }),
            Role::Task { .. } | Role::Other => None,
        }
    }

    fn cluster_id(&self) -> Option<String> {
        match self {
            CertRole::Agent { cluster_id } => Some(cluster_id.clone()),
            _ => None,
        }
    }
}

/// A cluster ID must make a valid namespace `rlark-<id>`: a DNS-1123 label of at most 57
/// characters.
pub fn validate_cluster_id(id: &str) -> SecResult<()> {
    let ok = !id.is_empty()
        && id.len() <= 57
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
        && !id.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(SecurityError::bad_request(format!(
            "cluster ID {id:?} is invalid: use 1 to 57 lowercase letters, digits and '-', \
             starting and ending with a letter or digit"
        )))
    }
}

/// A human user name: 1–253 printable characters, no whitespace or ':'-free `system:` prefix.
pub fn validate_user_name(user: &str) -> SecResult<()> {
    if user.is_empty() || user.len() > 253 {
        return Err(SecurityError::bad_request(format!(
            "user name {user:?} must be 1 to 253 characters"
        )));
    }
    if user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(SecurityError::bad_request(format!(
            "user name {user:?} may not contain whitespace or control characters"
        )));
    }
    if user.starts_with(auth::SYSTEM_USER_PREFIX) {
        return Err(SecurityError::bad_request(format!(
            "user name {user:?} is reserved: names starting with {:?} belong to built-in roles",
            auth::SYSTEM_USER_PREFIX
        )));
    }
    Ok(())
}

/// The result of a successful join or renewal.
#[derive(Clone, Debug)]
pub struct Issued {
    pub certificate_pem: String,
    pub info: CertInfo,
    pub ca_bundle_pem: String,
}

/// The server's security state. Cheap to share (`Arc`).
pub struct Security {
    ca: Arc<Ca>,
    store: Arc<dyn Store>,
    audit: Arc<dyn AuditSink>,
    config: SecurityConfig,
    revoked: RwLock<HashSet<String>>,
    /// The revocations again, beside the CA.
    revocation_file: revocation_file::RevocationFile,
    join_limiter: join_limit::JoinLimiter,
    changes: watch::Sender<u64>,
    /// What `GET /rlark/v1/agentrevocations` answers, recomputed after a change.
    agent_revocations: tokio::sync::Mutex<agent_revocations::Cached>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security").finish_non_exhaustive()
    }
}

fn rfc3339(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| SystemTime::from(t.with_timezone(&chrono::Utc)))
}

fn key(resource: &str, name: &str) -> ObjectKey {
    ObjectKey::new(resource, "", name)
}

/// The revocation-file entry of `token`, when it is revoked.
fn token_revocation(token: &BearerTokenRecord) -> Option<revocation_file::TokenRevocation> {
    token
        .revoked_at
        .as_ref()
        .map(|at| revocation_file::TokenRevocation {
            id: token.id.clone(),
            user: token.user.clone(),
            revoked_at: at.clone(),
        })
}

impl Security {
    /// The join rate limit.
    pub(crate) fn join_limiter(&self) -> &join_limit::JoinLimiter {
        &self.join_limiter
    }

    fn revoked_write(&self) -> std::sync::RwLockWriteGuard<'_, HashSet<String>> {
        self.revoked
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The installation CA.
    pub(crate) fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The audit sink.
    pub(crate) fn audit(&self) -> &Arc<dyn AuditSink> {
        &self.audit
    }

    /// Whether the certificate with `serial` (normalized hex) is revoked. Synchronous: the
    /// TLS handshake calls it.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.revoked
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(serial)
    }

    /// A receiver that changes whenever something was revoked (certificate or token).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The revoked serials agents are told about ([`agent_revocations`]), computed from the
    /// store again only when something was revoked since the last call.
    pub(crate) async fn agent_revocations(
        &self,
    ) -> SecResult<Arc<agent_revocations::AgentRevocations>> {
        // One computation at a time: the others wait for it and then share it.
        let mut cached = self.agent_revocations.lock().await;
        // Read before listing: a revocation stored after this moves the counter again, so
        // the list computed here is never kept past it.
        let version = *self.changes.borrow();
        if let Some((at, list)) = cached.as_ref()
            && *at == version
        {
            return Ok(Arc::clone(list));
        }
        let revocations = self.list::<RevocationRecord>(REVOCATIONS).await?;
        let certificates: HashMap<String, CertificateRecord> = self
            .list::<CertificateRecord>(CERTIFICATES)
            .await?
            .into_iter()
            .map(|c| (c.serial.clone(), c))
            .collect();
        let list = Arc::new(agent_revocations::published(
            &revocations,
            &certificates,
            SystemTime::now(),
        ));
        *cached = Some((version, Arc::clone(&list)));
        Ok(list)
    }

    fn notify(&self) {
        self.changes.send_modify(|n| *n += 1);
    }

    async fn list<T: for<'de> serde::Deserialize<'de>>(&self, resource: &str) -> SecResult<Vec<T>> {
        let listed = self
            .store
            .list(resource, &ListOptions::default())
            .await
            .map_err(SecurityError::store)?;
        Ok(listed
            .items
            .iter()
            .filter_map(|o| {
                let record = records::from_object(o);
                if record.is_none() {
                    tracing::error!(resource, object = %o, "malformed security record ignored");
                }
                record
            })
            .collect())
    }

    async fn get<T: for<'de> serde::Deserialize<'de>>(
        &self,
        resource: &str,
        name: &str,
    ) -> SecResult<Option<(T, Option<u64>)>> {
        let object = self
            .store
            .get(&key(resource, name))
            .await
            .map_err(SecurityError::store)?;
        Ok(object.and_then(|o| records::from_object(&o).map(|r| (r, records::revision_of(&o)))))
    }
}

#[cfg(test)]
mod tests;
