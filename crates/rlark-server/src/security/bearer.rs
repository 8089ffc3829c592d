//! Bearer tokens: creating and revoking them, authenticating a request by one, and the task
//! tokens bound to a running Task.

use std::time::{Duration, SystemTime};

use super::records::{BEARER_TOKENS, BearerTokenRecord, TaskBinding};
use super::{
    SecResult, Security, SecurityError, key, parse_rfc3339, records, rfc3339, token_revocation,
};
use rlark_apiserver::audit::AuditEntry;
use rlark_apiserver::auth::Identity;
use rlark_pki::{Token, TokenKind};
use rlark_store::ObjectKey;
use serde_json::Value;

impl Security {
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
}
