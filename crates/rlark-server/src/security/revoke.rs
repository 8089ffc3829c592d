//! Revocation: revoking a serial, a user or a cluster, keeping the store, the revocation
//! file and memory in step, and following revocations other replicas make.

use std::collections::HashSet;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use super::records::{
    BEARER_TOKENS, BearerTokenRecord, CERTIFICATES, CertificateRecord, REVOCATIONS,
    RevocationRecord,
};
use super::{
    SecResult, Security, SecurityConfig, SecurityError, join_limit, key, records, revocation_file,
    rfc3339, token_revocation,
};
use futures::StreamExt as _;
use rlark_apiserver::audit::{AuditEntry, AuditSink};
use rlark_apiserver::auth::Identity;
use rlark_pki::Ca;
use rlark_store::{Store, StoreError};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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
    pub(super) async fn revoke_one(
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
