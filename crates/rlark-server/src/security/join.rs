//! Bootstrap tokens and join: creating a token, and a cluster's first certificate for its
//! CSR, refused when the token or the cluster ID does not allow it.

use std::time::{Duration, SystemTime};

use super::records::{
    BOOTSTRAP_TOKENS, BootstrapTokenRecord, CERTIFICATES, CLUSTERS, CertificateRecord,
    ClusterRecord, REVOCATIONS, RevocationRecord,
};
use super::{
    CertRole, Issued, SecResult, Security, SecurityError, key, parse_rfc3339, records, rfc3339,
    validate_cluster_id,
};
use rlark_apiserver::audit::AuditEntry;
use rlark_apiserver::auth::{self, Identity};
use rlark_pki::{ParsedCsr, Token, TokenKind};
use rlark_store::StoreError;

impl Security {
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
}
