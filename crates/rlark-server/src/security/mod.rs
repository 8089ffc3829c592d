//! Identity and security of the server process: issuing certificates for CSRs (join,
//! renewal, admin signing), bootstrap and bearer tokens, revocation, and the audit trail.
//!
//! State lives in the store ([`records`]); the set of revoked serials is also kept in memory
//! because the TLS handshake checks it synchronously, and in `pki/revocations.json`
//! ([`revocation_file`]) so that it survives the loss of the store. Every revocation — made here or, with
//! a shared store, by another replica — bumps [`Security::subscribe`]'s counter; open
//! connections of the revoked identity close on that signal (see `lib.rs`).

pub(crate) mod agent_revocations;
pub(crate) mod audit_file;
pub mod ca_store;
pub(crate) mod join_limit;
pub(crate) mod records;
pub(crate) mod revocation_file;
pub(crate) mod routes;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::{self, Identity, Role};
use rlark_pki::{Ca, CertInfo, ParsedCsr, Token, TokenKind};
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use records::{
    BEARER_TOKENS, BOOTSTRAP_TOKENS, BearerTokenRecord, BootstrapTokenRecord, CERTIFICATES,
    CLUSTERS, CertificateRecord, ClusterRecord, REVOCATIONS, RevocationRecord, TaskBinding,
};

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
    /// Load the revocations of the store and of `revocation_file` and merge them both ways:
    /// the file's that the store lacks (it was reinitialized) are written to the store, the
    /// store's that the file lacks (an installation from before the file existed) to the file.
    pub(crate) async fn load(
        ca: Arc<Ca>,
        store: Arc<dyn Store>,
        audit: Arc<dyn AuditSink>,
        config: SecurityConfig,
        revocation_file: revocation_file::RevocationFile,
    ) -> SecResult<Arc<Security>> {
        let (changes, _) = watch::channel(0);
        let join_limiter = join_limit::JoinLimiter::new(config.join_limit.clone());
        let security = Arc::new(Security {
            ca,
            store,
            audit,
            config,
            revoked: RwLock::new(HashSet::new()),
            revocation_file,
            join_limiter,
            changes,
            agent_revocations: tokio::sync::Mutex::new(None),
        });
        let in_store = security.list::<RevocationRecord>(REVOCATIONS).await?;
        let stored: HashSet<String> = in_store.iter().map(|r| r.serial.clone()).collect();
        let from_file: Vec<RevocationRecord> = security
            .revocation_file
            .records()
            .into_iter()
            .filter(|r| !stored.contains(&r.serial))
            .collect();
        for record in &from_file {
            security.store_revocation(record).await?;
        }
        if !from_file.is_empty() {
            tracing::warn!(
                count = from_file.len(),
                file = %security.revocation_file.path().display(),
                "revocations missing from the store were restored from the revocation file"
            );
        }
        let added = security
            .revocation_file
            .add(in_store.iter().cloned())
            .map_err(|e| SecurityError::internal(e.to_string()))?;
        if added > 0 {
            tracing::info!(
                count = added,
                file = %security.revocation_file.path().display(),
                "revocations of the store copied to the revocation file"
            );
        }
        {
            let mut revoked = security.revoked_write();
            revoked.extend(in_store.into_iter().map(|r| r.serial));
            revoked.extend(from_file.into_iter().map(|r| r.serial));
        }
        security.merge_token_revocations().await?;
        Ok(security)
    }

    /// The bearer-token half of [`Security::load`]'s merge: a token the file says is revoked
    /// is marked revoked in the store (an older copy of the store was restored), and the
    /// store's revoked tokens the file lacks are added to it.
    async fn merge_token_revocations(&self) -> SecResult<()> {
        let mut revived = 0;
        for revocation in self.revocation_file.token_records() {
            let Some((mut record, revision)) = self
                .get::<BearerTokenRecord>(BEARER_TOKENS, &revocation.id)
                .await?
            else {
                continue;
            };
            if record.revoked_at.is_some() {
                continue;
            }
            record.revoked_at = Some(revocation.revoked_at.clone());
            self.store
                .update(
                    &key(BEARER_TOKENS, &record.id),
                    records::to_object(&record.id, &record),
                    revision,
                )
                .await
                .map_err(SecurityError::store)?;
            revived += 1;
        }
        if revived > 0 {
            tracing::warn!(
                count = revived,
                file = %self.revocation_file.path().display(),
                "bearer tokens the store held as valid were revoked again from the revocation \
                 file (the store is older than their revocation)"
            );
        }
        let revoked: Vec<_> = self
            .list::<BearerTokenRecord>(BEARER_TOKENS)
            .await?
            .iter()
            .filter_map(token_revocation)
            .collect();
        let added = self
            .revocation_file
            .add_tokens(revoked)
            .map_err(|e| SecurityError::internal(e.to_string()))?;
        if added > 0 {
            tracing::info!(
                count = added,
                file = %self.revocation_file.path().display(),
                "bearer-token revocations of the store copied to the revocation file"
            );
        }
        Ok(())
    }

    /// Write `record` to the store (idempotent).
    async fn store_revocation(&self, record: &RevocationRecord) -> SecResult<()> {
        let name = format!("serial-{}", record.serial);
        match self
            .store
            .create(&key(REVOCATIONS, &name), records::to_object(&name, record))
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(SecurityError::store(e)),
        }
    }

    /// Copy revocations another replica made into the revocation file (best effort: they
    /// are in the shared store already).
    fn mirror_to_file(&self, record: RevocationRecord) {
        if let Err(error) = self.revocation_file.add([record]) {
            tracing::error!(%error, "copying a revocation to the revocation file failed");
        }
    }

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

    /// Record an issued certificate (idempotent by serial).
    pub(crate) async fn record_certificate(
        &self,
        info: &CertInfo,
        role: &str,
        cluster_id: Option<String>,
        issued_by: &str,
        renewed_from: Option<&str>,
    ) -> SecResult<()> {
        let record = CertificateRecord {
            serial: info.serial.clone(),
            user: info.common_name.clone(),
            groups: info.groups.clone(),
            role: role.to_string(),
            cluster_id,
            issuer: info.issuer.clone(),
            not_before: rfc3339(info.not_before),
            not_after: rfc3339(info.not_after),
            key_hash: info.key_hash.clone(),
            issued_by: issued_by.to_string(),
            renewed_from: renewed_from.map(str::to_string),
            revoked_at: None,
        };
        match self
            .store
            .create(
                &key(CERTIFICATES, &info.serial),
                records::to_object(&info.serial, &record),
            )
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(SecurityError::store(e)),
        }
    }

    /// Record an OpenSSH certificate the SSH CA signed, as a certificate record whose serial
    /// is the SSH serial in hex: `rlark cert list` shows it, `rlark cert revoke SERIAL` and
    /// `--user USER` revoke it, and the SSH endpoint checks it at every login.
    pub(crate) async fn record_ssh_certificate(
        &self,
        signed: &rlark_pki::ssh::SignedSshCert,
        role: &rlark_pki::ssh::SshCertRole,
        issued_by: &str,
    ) -> SecResult<()> {
        let serial = format!("{:x}", signed.serial);
        let (user, cluster_id) = match role {
            rlark_pki::ssh::SshCertRole::Guest { user } => (user.clone(), None),
            rlark_pki::ssh::SshCertRole::Domain { cluster_id, .. } => {
                (role.principal(), Some(cluster_id.clone()))
            }
        };
        let now = SystemTime::now();
        let record = CertificateRecord {
            serial: serial.clone(),
            user,
            groups: Vec::new(),
            role: format!("ssh-{}", role.role_name().trim_start_matches("ssh-")),
            cluster_id,
            issuer: rlark_pki::ssh::SSH_CA_COMMENT.to_string(),
            not_before: rfc3339(now),
            not_after: rfc3339(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(signed.valid_before),
            ),
            key_hash: signed.key_id.clone(),
            issued_by: issued_by.to_string(),
            renewed_from: None,
            revoked_at: None,
        };
        match self
            .store
            .create(
                &key(CERTIFICATES, &serial),
                records::to_object(&serial, &record),
            )
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(SecurityError::store(e)),
        }
    }

    /// Sign `csr` for `role`, record the certificate and audit it. `by` is the acting
    /// identity (`None` for a bootstrap-token join); `renewed_from` the serial of the
    /// certificate a renewal was authenticated with.
    pub(crate) async fn issue(
        &self,
        csr: &ParsedCsr,
        role: &CertRole,
        validity: Option<Duration>,
        action: &str,
        by: Option<&Identity>,
        renewed_from: Option<&str>,
    ) -> SecResult<Issued> {
        role.validate()?;
        let validity = validity.unwrap_or(match role {
            CertRole::Agent { .. } => self.config.agent_cert_validity,
            _ => self.config.user_cert_validity,
        });
        let subject = role.subject();
        let (pem, info) = self
            .ca
            .sign_client_csr(csr, &subject.user, &subject.groups, validity)
            .map_err(|e| SecurityError::internal(format!("sign certificate: {e}")))?;
        let issued_by = by
            .map(|i| i.user.clone())
            .unwrap_or_else(|| action.to_string());
        self.record_certificate(
            &info,
            role.name(),
            role.cluster_id(),
            &issued_by,
            renewed_from,
        )
        .await?;
        let mut entry = AuditEntry::now(action, "allowed").by(by);
        entry.verb = action.to_string();
        entry.resource = "certificates".to_string();
        entry.name = info.serial.clone();
        entry.reason = format!(
            "issued {} certificate for {} (groups {:?}) until {}",
            role.name(),
            info.common_name,
            info.groups,
            rfc3339(info.not_after)
        );
        if let Some(from) = renewed_from {
            entry.reason.push_str(&format!("; renews {from}"));
        }
        self.audit.record(entry);
        Ok(Issued {
            certificate_pem: pem,
            info,
            ca_bundle_pem: self.ca.bundle_pem(),
        })
    }

    /// Renew: sign `csr` for the same `role` as the certificate `serial` the request was
    /// authenticated with, recording that serial as the new certificate's `renewedFrom`.
    /// Revoking `serial` later revokes the new certificate too ([`Security::revoke_serial`]);
    /// a revocation of `serial` that lands while this runs revokes the new certificate here
    /// (the record is written before the check, and a revocation marks the serial before it
    /// looks for renewals, so one of the two sees the other).
    pub(crate) async fn renew(
        &self,
        csr: &ParsedCsr,
        role: &CertRole,
        by: &Identity,
        serial: &str,
    ) -> SecResult<Issued> {
        let issued = self
            .issue(csr, role, None, "renew", Some(by), Some(serial))
            .await?;
        if self.is_revoked(serial) {
            self.revoke_one(
                &issued.info.serial,
                &format!("renewed from {serial}, which was revoked during the renewal"),
                by,
            )
            .await?;
            return Err(SecurityError::unauthorized(format!(
                "client certificate {serial} has been revoked"
            )));
        }
        Ok(issued)
    }

    /// All issued certificates, by serial.
    pub(crate) async fn certificates(&self) -> SecResult<Vec<CertificateRecord>> {
        let mut records = self.list::<CertificateRecord>(CERTIFICATES).await?;
        let revoked = self
            .revoked
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for record in &mut records {
            if record.revoked_at.is_none() && revoked.contains(&record.serial) {
                record.revoked_at = Some(String::from("(revoked)"));
            }
        }
        Ok(records)
    }

    /// All bearer tokens (users' and tasks'), revoked ones included.
    pub(crate) async fn bearer_tokens(&self) -> SecResult<Vec<BearerTokenRecord>> {
        self.list(BEARER_TOKENS).await
    }

    /// All bootstrap (join) tokens, expired and used ones included.
    pub(crate) async fn bootstrap_tokens(&self) -> SecResult<Vec<BootstrapTokenRecord>> {
        self.list(BOOTSTRAP_TOKENS).await
    }

    /// All revocations.
    pub(crate) async fn revocations(&self) -> SecResult<Vec<RevocationRecord>> {
        self.list(REVOCATIONS).await
    }

    /// Revoke certificate `serial` (normalized) and every certificate renewed from it,
    /// transitively (renewals record the serial they were authenticated with). The
    /// certificates `serial` itself was renewed from stay valid: revoke by user or cluster
    /// ID to cut a holder off entirely. Idempotent. Returns `serial` and the renewals it
    /// revoked now.
    pub(crate) async fn revoke_serial(
        &self,
        serial: &str,
        reason: &str,
        by: &Identity,
    ) -> SecResult<Vec<String>> {
        self.revoke_one(serial, reason, by).await?;
        let mut revoked = vec![serial.to_string()];
        let certificates = self.list::<CertificateRecord>(CERTIFICATES).await?;
        let mut visited: HashSet<String> = HashSet::from([serial.to_string()]);
        let mut parents = vec![serial.to_string()];
        while let Some(parent) = parents.pop() {
            for cert in &certificates {
                if cert.renewed_from.as_deref() != Some(parent.as_str())
                    || !visited.insert(cert.serial.clone())
                {
                    continue;
                }
                if !self.is_revoked(&cert.serial) {
                    self.revoke_one(
                        &cert.serial,
                        &format!("{reason} (renewed from revoked {parent})"),
                        by,
                    )
                    .await?;
                    revoked.push(cert.serial.clone());
                }
                parents.push(cert.serial.clone());
            }
        }
        Ok(revoked)
    }

    /// Revoke one certificate serial (normalized). Idempotent. Takes effect at once: the
    /// in-memory set is updated before this returns and open connections are signalled.
    /// The revocation is in the store and in the revocation file before it is reported.
    async fn revoke_one(
        &self,
        serial: &str,
        reason: &str,
        by: &Identity,
    ) -> SecResult<RevocationRecord> {
        let cert = self.get::<CertificateRecord>(CERTIFICATES, serial).await?;
        let record = RevocationRecord {
            serial: serial.to_string(),
            user: cert
                .as_ref()
                .map(|(c, _)| c.user.clone())
                .unwrap_or_default(),
            reason: reason.to_string(),
            revoked_by: by.user.clone(),
            revoked_at: rfc3339(SystemTime::now()),
        };
        self.store_revocation(&record).await?;
        self.revoked_write().insert(serial.to_string());
        self.notify();
        // The revocation is in force (store and memory) even if the file cannot be written;
        // that is reported after the rest is done.
        let saved = self.revocation_file.add([record.clone()]);
        if let Some((mut cert, revision)) = cert
            && cert.revoked_at.is_none()
        {
            cert.revoked_at = Some(record.revoked_at.clone());
            let object = records::to_object(serial, &cert);
            if let Err(error) = self
                .store
                .update(&key(CERTIFICATES, serial), object, revision)
                .await
            {
                // The revocation itself is stored; only the listing's mark is late.
                tracing::warn!(%error, serial, "marking certificate record revoked failed");
            }
        }
        let mut entry = AuditEntry::now("revoke", "allowed").by(Some(by));
        entry.verb = "revoke".into();
        entry.resource = "certificates".into();
        entry.name = serial.to_string();
        entry.reason = format!("user {:?}: {reason}", record.user);
        self.audit.record(entry);
        if let Err(error) = saved {
            return Err(SecurityError::internal(format!(
                "certificate {serial} is revoked, but saving the revocation beside the CA \
                 failed, so it would be lost if the store were reinitialized; fix the cause \
                 and revoke serial {serial} again: {error}"
            )));
        }
        Ok(record)
    }

    /// Revoke every certificate issued to `user` (and every bearer token of that user).
    /// Returns the revoked serials.
    pub(crate) async fn revoke_user(
        &self,
        user: &str,
        reason: &str,
        by: &Identity,
    ) -> SecResult<Vec<String>> {
        let mut serials = Vec::new();
        for cert in self.list::<CertificateRecord>(CERTIFICATES).await? {
            if cert.user == user && !self.is_revoked(&cert.serial) {
                self.revoke_one(&cert.serial, reason, by).await?;
                serials.push(cert.serial);
            }
        }
        for token in self.list::<BearerTokenRecord>(BEARER_TOKENS).await? {
            if token.user == user && token.revoked_at.is_none() {
                self.revoke_bearer_token(&token.id, by).await?;
            }
        }
        Ok(serials)
    }

    /// Revoke everything cluster `cluster_id` holds: its agent's certificates and bearer
    /// tokens ([`Security::revoke_user`] of its agent identity) and the `domain` SSH
    /// certificates signed for it. Returns the revoked serials.
    pub(crate) async fn revoke_cluster(
        &self,
        cluster_id: &str,
        reason: &str,
        by: &Identity,
    ) -> SecResult<Vec<String>> {
        let mut serials = self
            .revoke_user(&Identity::agent(cluster_id).user, reason, by)
            .await?;
        for cert in self.list::<CertificateRecord>(CERTIFICATES).await? {
            if cert.cluster_id.as_deref() == Some(cluster_id) && !self.is_revoked(&cert.serial) {
                self.revoke_one(&cert.serial, reason, by).await?;
                serials.push(cert.serial);
            }
        }
        Ok(serials)
    }

    // ---- bootstrap tokens and join ----

    /// Make a bootstrap token valid for `ttl`, bound to cluster `cluster_id`; `rejoin`: it
    /// may give that cluster a new identity even if it joined before or was revoked.
    pub(crate) async fn create_bootstrap_token(
        &self,
        ttl: Duration,
        cluster_id: &str,
        rejoin: bool,
        by: &Identity,
    ) -> SecResult<(Token, BootstrapTokenRecord)> {
        if ttl.is_zero() || ttl > self.config.max_bootstrap_token_ttl {
            return Err(SecurityError::bad_request(format!(
                "token TTL must be between 1s and {}s",
                self.config.max_bootstrap_token_ttl.as_secs()
            )));
        }
        validate_cluster_id(cluster_id)?;
        let token = Token::generate(TokenKind::Bootstrap);
        let record = BootstrapTokenRecord {
            id: token.id.clone(),
            secret_hash: token.secret_hash(),
            expires_at: rfc3339(SystemTime::now() + ttl),
            cluster_id: Some(cluster_id.to_string()),
            used_by: Vec::new(),
            created_by: by.user.clone(),
            rejoin,
        };
        self.store
            .create(
                &key(BOOTSTRAP_TOKENS, &record.id),
                records::to_object(&record.id, &record),
            )
            .await
            .map_err(SecurityError::store)?;
        let mut entry = AuditEntry::now("token-create", "allowed").by(Some(by));
        entry.verb = "create".into();
        entry.resource = "bootstraptokens".into();
        entry.name = record.id.clone();
        entry.reason = format!(
            "expires {}; cluster {}{}",
            record.expires_at,
            cluster_id,
            if rejoin {
                "; rejoin: may give the cluster a new identity if it joined before or was revoked"
            } else {
                ""
            }
        );
        self.audit.record(entry);
        Ok((token, record))
    }

    fn join_denied(
        &self,
        source: Option<std::net::IpAddr>,
        token_id: &str,
        cluster_id: &str,
        reason: &str,
    ) -> SecurityError {
        let mut entry = AuditEntry::now("join", "denied");
        entry.verb = "join".into();
        entry.resource = "bootstraptokens".into();
        entry.name = token_id.to_string();
        if !cluster_id.is_empty() {
            entry.namespace = auth::agent_namespace(cluster_id);
        }
        entry.reason = match source {
            Some(ip) => format!("{reason} (source {ip})"),
            None => reason.to_string(),
        };
        self.audit.record(entry);
        SecurityError::unauthorized(reason.to_string())
    }

    /// Join: check the bootstrap token (exists, secret matches, not expired, bound cluster,
    /// not used by this cluster yet), mark it used for `cluster_id`, make the agent
    /// namespace, and sign the CSR as that cluster's agent. The token is marked used before
    /// the certificate is issued, with an optimistic-concurrency update, so two concurrent
    /// joins with one token cannot both succeed. `source` (the client's address) goes into
    /// the audit records of refusals.
    pub(crate) async fn join(
        &self,
        token_text: &str,
        cluster_id: Option<&str>,
        csr: &ParsedCsr,
        source: Option<std::net::IpAddr>,
        ensure_namespace: impl AsyncFnOnce(&str) -> SecResult<()>,
    ) -> SecResult<(String, Issued)> {
        let token = Token::parse(TokenKind::Bootstrap, token_text.trim())
            .map_err(|e| SecurityError::bad_request(format!("bootstrap token: {e}")))?;
        let Some((mut record, revision)) = self
            .get::<BootstrapTokenRecord>(BOOTSTRAP_TOKENS, &token.id)
            .await?
        else {
            return Err(self.join_denied(
                source,
                &token.id,
                cluster_id.unwrap_or(""),
                "bootstrap token is unknown",
            ));
        };
        if !token.matches(&record.secret_hash) {
            return Err(self.join_denied(
                source,
                &token.id,
                cluster_id.unwrap_or(""),
                "bootstrap token is invalid",
            ));
        }
        let cluster_id = match (cluster_id.filter(|c| !c.is_empty()), &record.cluster_id) {
            (Some(asked), Some(bound)) if asked != bound => {
                return Err(self.join_denied(
                    source,
                    &token.id,
                    asked,
                    &format!("bootstrap token is for cluster {bound:?}, not {asked:?}"),
                ));
            }
            (_, Some(bound)) => bound.clone(),
            (asked, None) => {
                // Made by a version that allowed unbound tokens: such a token could join
                // as any cluster.
                return Err(self.join_denied(
                    source,
                    &token.id,
                    asked.unwrap_or(""),
                    "bootstrap token is not bound to a cluster ID (an earlier version made \
                     it); make a new one with `rlark token create --cluster-id ID`",
                ));
            }
        };
        validate_cluster_id(&cluster_id)?;
        let expired = parse_rfc3339(&record.expires_at).is_none_or(|t| t <= SystemTime::now());
        if expired {
            return Err(self.join_denied(
                source,
                &token.id,
                &cluster_id,
                &format!("bootstrap token expired at {}", record.expires_at),
            ));
        }
        if record.used_by.contains(&cluster_id) {
            return Err(self.join_denied(
                source,
                &token.id,
                &cluster_id,
                &format!("bootstrap token was already used to join cluster {cluster_id:?}"),
            ));
        }
        let joined_before = self.cluster_joined_before(&cluster_id).await?;
        if joined_before && !record.rejoin {
            return Err(self.join_refused_existing(source, &token.id, &cluster_id));
        }
        record.used_by.push(cluster_id.clone());
        match self
            .store
            .update(
                &key(BOOTSTRAP_TOKENS, &record.id),
                records::to_object(&record.id, &record),
                revision,
            )
            .await
        {
            Ok(_) => {}
            Err(StoreError::Conflict { .. }) => {
                return Err(self.join_denied(
                    source,
                    &token.id,
                    &cluster_id,
                    "bootstrap token was used concurrently; retry",
                ));
            }
            Err(e) => return Err(SecurityError::store(e)),
        }
        // The cluster's identity is created once: of two joins of one new cluster ID (two
        // tokens, any replicas), one creates this record and the other is refused.
        let cluster = ClusterRecord {
            cluster_id: cluster_id.clone(),
            joined_at: rfc3339(SystemTime::now()),
            token_id: record.id.clone(),
        };
        let cluster_key = key(CLUSTERS, &cluster_id);
        match self
            .store
            .create(&cluster_key, records::to_object(&cluster_id, &cluster))
            .await
        {
            Ok(_) => {}
            Err(StoreError::AlreadyExists(_)) if record.rejoin => {
                if let Err(error) = self
                    .store
                    .update(
                        &cluster_key,
                        records::to_object(&cluster_id, &cluster),
                        None,
                    )
                    .await
                {
                    tracing::warn!(%error, cluster = %cluster_id, "recording a rejoin failed");
                }
            }
            Err(StoreError::AlreadyExists(_)) => {
                return Err(self.join_refused_existing(source, &token.id, &cluster_id));
            }
            Err(e) => return Err(SecurityError::store(e)),
        }
        ensure_namespace(&auth::agent_namespace(&cluster_id)).await?;
        let role = CertRole::Agent {
            cluster_id: cluster_id.clone(),
        };
        let issued = self.issue(csr, &role, None, "join", None, None).await?;
        if record.rejoin {
            let mut entry = AuditEntry::now("join", "allowed");
            entry.verb = "join".into();
            entry.resource = "bootstraptokens".into();
            entry.namespace = auth::agent_namespace(&cluster_id);
            entry.name = record.id.clone();
            entry.reason = format!(
                "rejoin: cluster {cluster_id:?} {} with bootstrap token {} that {} made with \
                 --rejoin; new certificate {}",
                if joined_before {
                    "had joined before (or was revoked) and got a new identity"
                } else {
                    "joined for the first time"
                },
                record.id,
                record.created_by,
                issued.info.serial
            );
            self.audit.record(entry);
        }
        Ok((cluster_id, issued))
    }

    /// Whether cluster `cluster_id` has an identity already: it joined (a cluster record, or
    /// a certificate issued by a join or a renewal, from before the records), or a
    /// certificate of its agent was revoked. An agent certificate an admin signed (and did
    /// not revoke) does not count.
    async fn cluster_joined_before(&self, cluster_id: &str) -> SecResult<bool> {
        if self
            .store
            .get(&key(CLUSTERS, cluster_id))
            .await
            .map_err(SecurityError::store)?
            .is_some()
        {
            return Ok(true);
        }
        let agent = Identity::agent(cluster_id).user;
        let certificates = self.list::<CertificateRecord>(CERTIFICATES).await?;
        let holds = certificates.iter().any(|c| {
            c.role == "agent"
                && c.cluster_id.as_deref() == Some(cluster_id)
                && (c.issued_by == "join"
                    || c.issued_by == agent
                    || c.revoked_at.is_some()
                    || self.is_revoked(&c.serial))
        });
        if holds {
            return Ok(true);
        }
        Ok(self
            .list::<RevocationRecord>(REVOCATIONS)
            .await?
            .iter()
            .any(|r| r.user == agent))
    }

    /// 403 (audited): a join as a cluster that has an identity already, with a token not
    /// made for that.
    fn join_refused_existing(
        &self,
        source: Option<std::net::IpAddr>,
        token_id: &str,
        cluster_id: &str,
    ) -> SecurityError {
        let reason = format!(
            "cluster {cluster_id:?} has joined before (its agent holds or held a \
             certificate, or was revoked): a join token does not hand an existing cluster's \
             identity to a new machine. If that is what you mean (its credentials were lost, \
             or the revoked cluster comes back), make a token for it: rlark token create \
             --cluster-id {cluster_id} --rejoin"
        );
        let mut error = self.join_denied(source, token_id, cluster_id, &reason);
        error.code = 403;
        error
    }

    // ---- bearer tokens ----

    /// Mint a bearer token for `identity`, valid for `ttl` (`None`: until revoked), bound to
    /// a task run when `task` is given.
    pub(crate) async fn create_bearer_token(
        &self,
        identity: &Identity,
        ttl: Option<Duration>,
        task: Option<TaskBinding>,
        by: &Identity,
    ) -> SecResult<(Token, BearerTokenRecord)> {
        let token = Token::generate(TokenKind::Bearer);
        let record = BearerTokenRecord {
            id: token.id.clone(),
            secret_hash: token.secret_hash(),
            user: identity.user.clone(),
            groups: identity.groups.clone(),
            expires_at: ttl.map(|ttl| rfc3339(SystemTime::now() + ttl)),
            task,
            created_by: by.user.clone(),
            revoked_at: None,
        };
        self.store
            .create(
                &key(BEARER_TOKENS, &record.id),
                records::to_object(&record.id, &record),
            )
            .await
            .map_err(SecurityError::store)?;
        let mut entry = AuditEntry::now("token-create", "allowed").by(Some(by));
        entry.verb = "create".into();
        entry.resource = "bearertokens".into();
        entry.name = record.id.clone();
        entry.reason = format!("for {} {:?}", record.user, record.groups);
        self.audit.record(entry);
        Ok((token, record))
    }

    /// Revoke a bearer token by id. The revocation is in the store and in the revocation
    /// file (so that restoring an older copy of the store does not bring the token back)
    /// before it is reported.
    pub(crate) async fn revoke_bearer_token(&self, id: &str, by: &Identity) -> SecResult<()> {
        let Some((mut record, revision)) = self.get::<BearerTokenRecord>(BEARER_TOKENS, id).await?
        else {
            return Err(SecurityError::not_found(format!("no token with id {id:?}")));
        };
        if record.revoked_at.is_none() {
            record.revoked_at = Some(rfc3339(SystemTime::now()));
            self.store
                .update(
                    &key(BEARER_TOKENS, id),
                    records::to_object(id, &record),
                    revision,
                )
                .await
                .map_err(SecurityError::store)?;
        }
        self.notify();
        let saved = self.revocation_file.add_tokens(token_revocation(&record));
        let mut entry = AuditEntry::now("revoke", "allowed").by(Some(by));
        entry.verb = "revoke".into();
        entry.resource = "bearertokens".into();
        entry.name = id.to_string();
        entry.reason = format!("token of {}", record.user);
        self.audit.record(entry);
        if let Err(error) = saved {
            return Err(SecurityError::internal(format!(
                "bearer token {id} is revoked, but saving the revocation beside the CA failed, \
                 so restoring an older copy of the store would make it valid again; fix the \
                 cause and revoke token {id} again: {error}"
            )));
        }
        Ok(())
    }

    /// Resolve an `Authorization: Bearer` credential. Returns the identity and the token id
    /// (connections remember it, to close themselves when it is revoked). Every failure is a
    /// 401 with a reason; the secret never appears in messages or logs.
    pub(crate) async fn authenticate_bearer(&self, text: &str) -> SecResult<(Identity, String)> {
        let token = Token::parse(TokenKind::Bearer, text.trim())
            .map_err(|e| SecurityError::unauthorized(format!("bearer token: {e}")))?;
        let mut found = self
            .get::<BearerTokenRecord>(BEARER_TOKENS, &token.id)
            .await?;
        if found.is_none() {
            // Created a moment ago on another replica of a shared store? Catch up once (a
            // no-op on a store with one writer).
            if let Err(e) = self.store.sync().await {
                tracing::debug!(error = %e, "store sync for an unknown bearer token");
            }
            found = self
                .get::<BearerTokenRecord>(BEARER_TOKENS, &token.id)
                .await?;
        }
        let Some((record, _)) = found else {
            return Err(SecurityError::unauthorized("bearer token is unknown"));
        };
        if !token.matches(&record.secret_hash) {
            return Err(SecurityError::unauthorized("bearer token is invalid"));
        }
        if record.revoked_at.is_some() {
            return Err(SecurityError::unauthorized("bearer token was revoked"));
        }
        if let Some(expires) = &record.expires_at
            && parse_rfc3339(expires).is_none_or(|t| t <= SystemTime::now())
        {
            return Err(SecurityError::unauthorized(format!(
                "bearer token expired at {expires}"
            )));
        }
        if let Some(task) = &record.task {
            self.check_task_running(task).await?;
        }
        Ok((
            Identity {
                user: record.user,
                groups: record.groups,
            },
            record.id,
        ))
    }

    /// A task token is valid only while its Task (this very run: same uid) exists and has
    /// not finished.
    async fn check_task_running(&self, task: &TaskBinding) -> SecResult<()> {
        let object = self
            .store
            .get(&ObjectKey::new(
                "tasks.rlinf.io",
                &task.namespace,
                &task.name,
            ))
            .await
            .map_err(SecurityError::store)?;
        let Some(object) = object else {
            return Err(SecurityError::unauthorized(format!(
                "token of task {}/{}, which no longer exists",
                task.namespace, task.name
            )));
        };
        let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
        if uid != Some(task.uid.as_str()) {
            return Err(SecurityError::unauthorized(format!(
                "token of an earlier run of task {}/{}",
                task.namespace, task.name
            )));
        }
        let phase = object
            .pointer("/status/phase")
            .and_then(Value::as_str)
            .unwrap_or("Pending");
        if matches!(phase, "Succeeded" | "Failed" | "Stopped")
            || object.pointer("/metadata/deletionTimestamp").is_some()
        {
            return Err(SecurityError::unauthorized(format!(
                "token of task {}/{}, which is no longer running (phase {phase})",
                task.namespace, task.name
            )));
        }
        Ok(())
    }

    /// Mint a token for the current run of Task `namespace/name` (which must exist and not
    /// be finished).
    pub(crate) async fn create_task_token(
        &self,
        namespace: &str,
        name: &str,
        by: &Identity,
    ) -> SecResult<(Token, BearerTokenRecord)> {
        let object = self
            .store
            .get(&ObjectKey::new("tasks.rlinf.io", namespace, name))
            .await
            .map_err(SecurityError::store)?
            .ok_or_else(|| {
                SecurityError::not_found(format!(
                    "tasks.rlinf.io \"{name}\" not found in {namespace}"
                ))
            })?;
        let uid = object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let binding = TaskBinding {
            namespace: namespace.to_string(),
            name: name.to_string(),
            uid,
        };
        self.check_task_running(&binding)
            .await
            .map_err(|e| SecurityError::bad_request(e.message))?;
        self.create_bearer_token(&Identity::task(namespace, name), None, Some(binding), by)
            .await
    }

    /// Whether bearer token `id` has been revoked (or deleted). Used by connections that
    /// authenticated with it when a revocation is signalled.
    pub(crate) async fn bearer_token_revoked(&self, id: &str) -> bool {
        match self.get::<BearerTokenRecord>(BEARER_TOKENS, id).await {
            Ok(Some((record, _))) => record.revoked_at.is_some(),
            Ok(None) => true,
            // Unknown: keep the connection; the next request re-checks.
            Err(_) => false,
        }
    }

    /// Follow revocations written by other replicas (a shared store) until `shutdown`:
    /// certificates' ([`Security::follow_certificate_revocations`]) and bearer tokens'
    /// ([`Security::follow_token_revocations`]).
    pub(crate) async fn follow_revocations(self: Arc<Self>, shutdown: CancellationToken) {
        tokio::join!(
            Arc::clone(&self).follow_certificate_revocations(shutdown.clone()),
            self.follow_token_revocations(shutdown),
        );
    }

    /// Copy the bearer-token revocations other replicas make into the revocation file
    /// (they are in force already: every request reads the token's record). Restarts the
    /// watch from a fresh list when the store says the position expired.
    async fn follow_token_revocations(self: Arc<Self>, shutdown: CancellationToken) {
        let mut from = self.store.revision();
        loop {
            let mut stream = match self.store.watch(BEARER_TOKENS, None, from).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::warn!(%error, "watching bearer tokens failed; relisting");
                    from = self.relist_token_revocations().await;
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(event)) => {
                        let revoked = records::from_object::<BearerTokenRecord>(&event.object)
                            .as_ref()
                            .and_then(token_revocation);
                        if let Some(revoked) = revoked
                            && let Err(error) = self.revocation_file.add_tokens([revoked])
                        {
                            tracing::error!(%error, "copying a token revocation to the revocation file failed");
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "bearer token watch ended; relisting");
                        from = self.relist_token_revocations().await;
                        break;
                    }
                    None => return,
                }
            }
        }
    }

    async fn relist_token_revocations(&self) -> u64 {
        let revision = self.store.revision();
        match self.list::<BearerTokenRecord>(BEARER_TOKENS).await {
            Ok(tokens) => {
                let revoked: Vec<_> = tokens.iter().filter_map(token_revocation).collect();
                if let Err(error) = self.revocation_file.add_tokens(revoked) {
                    tracing::error!(%error, "copying token revocations to the revocation file failed");
                }
            }
            Err(error) => tracing::warn!(%error, "listing bearer tokens failed"),
        }
        revision
    }

    /// Follow certificate revocations written by other replicas until `shutdown`: add them
    /// to the in-memory set and signal connections. Restarts the watch from a fresh list
    /// when the store says the position expired.
    async fn follow_certificate_revocations(self: Arc<Self>, shutdown: CancellationToken) {
        let mut from = self.store.revision();
        loop {
            let stream = match self.store.watch(REVOCATIONS, None, from).await {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::warn!(%error, "watching revocations failed; relisting");
                    from = self.relist_revocations().await;
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            let mut stream = stream;
            loop {
                let next = tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(event)) => {
                        if let Some(record) =
                            records::from_object::<RevocationRecord>(&event.object)
                        {
                            let new = self.revoked_write().insert(record.serial.clone());
                            if new {
                                self.notify();
                            }
                            self.mirror_to_file(record);
                        }
                    }
                    Some(Err(error)) => {
                        tracing::warn!(%error, "revocation watch ended; relisting");
                        from = self.relist_revocations().await;
                        break;
                    }
                    None => return,
                }
            }
        }
    }

    async fn relist_revocations(&self) -> u64 {
        let revision = self.store.revision();
        match self.list::<RevocationRecord>(REVOCATIONS).await {
            Ok(records) => {
                let mut revoked = self.revoked_write();
                let before = revoked.len();
                revoked.extend(records.iter().map(|r| r.serial.clone()));
                let grew = revoked.len() != before;
                drop(revoked);
                if grew {
                    self.notify();
                }
                if let Err(error) = self.revocation_file.add(records) {
                    tracing::error!(%error, "copying revocations to the revocation file failed");
                }
            }
            Err(error) => tracing::warn!(%error, "listing revocations failed"),
        }
        revision
    }
}

#[cfg(test)]
mod tests;
