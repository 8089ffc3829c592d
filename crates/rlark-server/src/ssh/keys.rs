//! Users' registered SSH public keys, kept in the store beside the other security records
//! (resource `sshkeys.security.rlark.io`, which the API registry does not serve), so they
//! survive restarts and reach every replica sharing the store.
//!
//! A key belongs to one user (the identity that registered it, with its groups at the
//! time) and records the credential it was registered with — a client certificate's serial
//! or a bearer token's id. The key authenticates only while that credential is not revoked
//! (`rlark cert revoke --user U` revokes every certificate and token of U, so every key U
//! registered stops working too), and only until it is removed.

use std::sync::Arc;

use rlark_apiserver::auth::Identity;
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use russh::keys::ssh_key::{HashAlg, PublicKey};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Store resource of registered keys (name = [`key_id`]).
pub(crate) const SSH_KEYS: &str = "sshkeys.security.rlark.io";
/// Most keys one user may register.
pub(crate) const MAX_KEYS_PER_USER: usize = 32;
/// Longest `ttlSeconds` of a key (a day): expiring keys are for one-time use.
pub(crate) const MAX_KEY_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
/// How long an expired key stays listed before a registration by its owner deletes it (its
/// connections close then).
pub(crate) const EXPIRED_KEPT: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The credential a key was registered with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub(crate) enum RegisteredWith {
    /// A client certificate (normalized hex serial).
    Certificate { serial: String },
    /// A bearer token (its id).
    Token { id: String },
}

/// One registered key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SshKeyRecord {
    /// [`key_id`] of the key.
    pub id: String,
    /// The owner.
    pub user: String,
    /// The owner's groups when it registered the key.
    pub groups: Vec<String>,
    /// The key, one OpenSSH line without comment.
    pub public_key: String,
    /// `SHA256:...`.
    pub fingerprint: String,
    /// The comment the key was given (its name, for people).
    #[serde(default)]
    pub comment: String,
    /// RFC 3339.
    pub created_at: String,
    /// What the owner authenticated with when registering it.
    pub registered_with: RegisteredWith,
    /// RFC 3339: after it the key logs nobody in (connections opened before stay open).
    /// Absent: no expiry. `rlark ssh` registers its one-time key with one, so a killed
    /// `rlark ssh` leaves behind a key that no longer works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl SshKeyRecord {
    /// Past its `expiresAt` (an unreadable one counts as expired).
    pub fn expired(&self, now: chrono::DateTime<chrono::Utc>) -> bool {
        self.expires_at
            .as_deref()
            .is_some_and(|at| chrono::DateTime::parse_from_rfc3339(at).map_or(true, |at| at <= now))
    }

    /// The owner as an identity.
    pub fn identity(&self) -> Identity {
        Identity {
            user: self.user.clone(),
            groups: self.groups.clone(),
        }
    }
}

/// Why a key could not be registered or removed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// The id of a key: the hex SHA-256 of its wire encoding (one key, one id, whatever its
/// comment).
pub(crate) fn key_id(key: &PublicKey) -> String {
    let fingerprint = key.fingerprint(HashAlg::Sha256);
    fingerprint
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Parse one OpenSSH public key line (a comment allowed); the error names the problem.
pub(crate) fn parse_public_key(text: &str) -> Result<PublicKey, KeyError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(KeyError::BadRequest("publicKey is empty".into()));
    }
    if text.len() > rlark_pki::ssh::MAX_SSH_INPUT {
        return Err(KeyError::BadRequest(format!(
            "publicKey is {} bytes, more than {}",
            text.len(),
            rlark_pki::ssh::MAX_SSH_INPUT
        )));
    }
    if text.contains("-cert-v01@openssh.com") {
        return Err(KeyError::BadRequest(
            "publicKey is a certificate: register the plain public key (id_*.pub), or log \
             in with the certificate itself"
                .into(),
        ));
    }
    PublicKey::from_openssh(text).map_err(|e| {
        KeyError::BadRequest(format!(
            "publicKey is not an OpenSSH public key line (`ssh-ed25519 AAAA... comment`): {e}"
        ))
    })
}

/// The registered keys, with a signal for removals.
pub(crate) struct SshKeys {
    store: Arc<dyn Store>,
    changes: watch::Sender<u64>,
}

impl SshKeys {
    pub(crate) fn new(store: Arc<dyn Store>) -> Arc<SshKeys> {
        Arc::new(SshKeys {
            store,
            changes: watch::channel(0).0,
        })
    }

    /// A receiver that changes whenever a key is removed.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Register `public_key` for `owner`. 409 when the key is registered already (to anyone).
    pub(crate) async fn add(
        &self,
        owner: &Identity,
        registered_with: RegisteredWith,
        public_key: &str,
        ttl: Option<std::time::Duration>,
    ) -> Result<SshKeyRecord, KeyError> {
        let key = parse_public_key(public_key)?;
        let now = chrono::Utc::now();
        if let Some(ttl) = ttl
            && (ttl.is_zero() || ttl > MAX_KEY_TTL)
        {
            return Err(KeyError::BadRequest(format!(
                "ttlSeconds must be between 1 and {} (a day)",
                MAX_KEY_TTL.as_secs()
            )));
        }
        // Keys of this owner that expired long ago go first (one-time keys of a killed
        // `rlark ssh`).
        let cutoff = now - chrono::Duration::from_std(EXPIRED_KEPT).unwrap_or_default();
        let mut mine = 0;
        for record in self.list(Some(&owner.user)).await? {
            if record.expired(cutoff) {
                match self
                    .store
                    .delete(&ObjectKey::new(SSH_KEYS, "", &record.id), None)
                    .await
                {
                    Ok(_) | Err(StoreError::NotFound(_)) => {
                        self.changes.send_modify(|n| *n += 1);
                    }
                    Err(e) => return Err(e.into()),
                }
            } else {
                mine += 1;
            }
        }
        if mine >= MAX_KEYS_PER_USER {
            return Err(KeyError::BadRequest(format!(
                "user {:?} has {mine} SSH keys registered, the most allowed: remove one first",
                owner.user
            )));
        }
        let id = key_id(&key);
        let record = SshKeyRecord {
            id: id.clone(),
            user: owner.user.clone(),
            groups: owner.groups.clone(),
            public_key: PublicKey::new(key.key_data().clone(), "")
                .to_openssh()
                .map_err(|e| KeyError::BadRequest(e.to_string()))?
                .trim()
                .to_string(),
            fingerprint: key.fingerprint(HashAlg::Sha256).to_string(),
            comment: key.comment().to_string(),
            created_at: now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            registered_with,
            expires_at: ttl.map(|ttl| {
                (now + chrono::Duration::from_std(ttl).unwrap_or_default())
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            }),
        };
        let object = to_object(&record);
        match self
            .store
            .create(&ObjectKey::new(SSH_KEYS, "", &id), object)
            .await
        {
            Ok(_) => Ok(record),
            Err(StoreError::AlreadyExists(_)) => Err(KeyError::Conflict(format!(
                "SSH key {} is registered already",
                record.fingerprint
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// The keys of `user` (`None`: everyone's).
    pub(crate) async fn list(&self, user: Option<&str>) -> Result<Vec<SshKeyRecord>, KeyError> {
        let all = self.store.list(SSH_KEYS, &ListOptions::default()).await?;
        Ok(all
            .items
            .iter()
            .filter_map(|o| serde_json::from_value::<SshKeyRecord>(o["record"].clone()).ok())
            .filter(|r| user.is_none_or(|u| r.user == u))
            .collect())
    }

    /// The record of `key`, if registered (catching up once with other replicas of a shared
    /// store when it is not found: it may have been registered there a moment ago).
    pub(crate) async fn find(&self, key: &PublicKey) -> Result<Option<SshKeyRecord>, KeyError> {
        let id = key_id(key);
        if let Some(found) = self.find_by_id(&id).await? {
            return Ok(Some(found));
        }
        self.store.sync().await?;
        self.find_by_id(&id).await
    }

    /// The record with id `id`, if registered.
    pub(crate) async fn find_by_id(&self, id: &str) -> Result<Option<SshKeyRecord>, KeyError> {
        let object = self.store.get(&ObjectKey::new(SSH_KEYS, "", id)).await?;
        Ok(object.and_then(|o| serde_json::from_value(o["record"].clone()).ok()))
    }

    /// Remove key `id` (its id or `SHA256:` fingerprint). `by` must own it or be an admin.
    pub(crate) async fn remove(
        &self,
        id_or_fingerprint: &str,
        by: &Identity,
        admin: bool,
    ) -> Result<SshKeyRecord, KeyError> {
        let record = self
            .list(None)
            .await?
            .into_iter()
            .find(|r| r.id == id_or_fingerprint || r.fingerprint == id_or_fingerprint)
            .ok_or_else(|| {
                KeyError::NotFound(format!("SSH key {id_or_fingerprint:?} is not registered"))
            })?;
        if record.user != by.user && !admin {
            // Not telling whose it is.
            return Err(KeyError::NotFound(format!(
                "SSH key {id_or_fingerprint:?} is not registered"
            )));
        }
        match self
            .store
            .delete(&ObjectKey::new(SSH_KEYS, "", &record.id), None)
            .await
        {
            Ok(_) | Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        self.changes.send_modify(|n| *n += 1);
        Ok(record)
    }
}

fn to_object(record: &SshKeyRecord) -> Value {
    json!({
        "apiVersion": "security.rlark.io/v1",
        "kind": "SshKey",
        "metadata": {"name": record.id},
        "record": record,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl laptop";

    #[test]
    fn keys_parse_and_have_stable_ids() {
        let key = parse_public_key(KEY).unwrap();
        assert_eq!(key.comment().to_string(), "laptop");
        let without_comment = parse_public_key(KEY.trim_end_matches(" laptop")).unwrap();
        assert_eq!(key_id(&key), key_id(&without_comment));
        assert_eq!(key_id(&key).len(), 64);
        for (bad, says) in [
            ("", "empty"),
            ("ssh-ed25519 notbase64", "not an OpenSSH public key"),
            ("ssh-ed25519-cert-v01@openssh.com AAAA", "is a certificate"),
        ] {
            let error = parse_public_key(bad).unwrap_err().to_string();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    async fn keys() -> (Arc<SshKeys>, rlark_store::SqliteStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("dir");
        let store = rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
            dir.path().join("rlark.db"),
        ))
        .await
        .expect("store");
        (SshKeys::new(Arc::new(store.clone())), store, dir)
    }

    /// A key with `ttlSeconds` carries its expiry; out-of-range lifetimes are refused; a key
    /// expired for longer than a day is deleted at its owner's next registration, one that
    /// expired recently is kept (and counted).
    #[tokio::test]
    async fn expiring_keys() {
        let (keys, store, _dir) = keys().await;
        let alice = Identity {
            user: "alice".into(),
            groups: vec![],
        };
        let with = || RegisteredWith::Token { id: "t".into() };
        for ttl in [0, MAX_KEY_TTL.as_secs() + 1] {
            let error = keys
                .add(
                    &alice,
                    with(),
                    KEY,
                    Some(std::time::Duration::from_secs(ttl)),
                )
                .await
                .expect_err("out of range")
                .to_string();
            assert!(error.contains("ttlSeconds"), "{error}");
        }
        let record = keys
            .add(
                &alice,
                with(),
                KEY,
                Some(std::time::Duration::from_secs(600)),
            )
            .await
            .expect("add");
        let now = chrono::Utc::now();
        assert!(!record.expired(now));
        assert!(record.expired(now + chrono::Duration::seconds(601)));

        // Age it: expired two days ago.
        let mut old = record.clone();
        old.expires_at = Some(
            (now - chrono::Duration::days(2)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
        store
            .update(
                &ObjectKey::new(SSH_KEYS, "", &old.id),
                to_object(&old),
                None,
            )
            .await
            .expect("age the key");
        let other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDkNOdy0xXWy0VThO/pXCIThb8O5ex4qpPqp7HzsDTCM other";
        keys.add(&alice, with(), other, None)
            .await
            .expect("add another");
        let listed: Vec<String> = keys
            .list(Some("alice"))
            .await
            .expect("list")
            .into_iter()
            .map(|k| k.comment)
            .collect();
        assert_eq!(listed, ["other"], "the long-expired key is gone");
    }
}
