//! Who an SSH client is, and where it may go: the login name names the destination, the
//! key or certificate names the user.
//!
//! **Login names** ([`Target::parse`]): `TASK` (replica 0), `TASK.N` (replica N),
//! `TASK.NAMESPACE` and `TASK.N.NAMESPACE` (when the task name is in several namespaces),
//! or `menu` for the list of reachable tasks.
//!
//! **Credentials**, each checked again at every authentication and, for open sessions,
//! after every revocation ([`revoked`]):
//!
//! - an OpenSSH user certificate of the installation's SSH CA with role `ssh-guest`: the
//!   principal is the user (no groups). Its serial (hex) must not be revoked (SSH
//!   certificates are recorded like X.509 ones, so `rlark cert revoke SERIAL` and
//!   `--user U` reach them). `domain` certificates log in whatever the name (they are the pod
//!   network's: [`Target::Domain`], forwards only, docs/ssh.md).
//! - a public key registered through `/rlark/v1/sshkeys` ([`super::keys`]): its owner,
//!   while the credential it was registered with is not revoked and the key is not removed.
//! - the `sshPublicKey` of the Task named by the login (copied from its Job): identity
//!   `sshPublicKey:NAMESPACE/TASK`, valid for that task only.

use std::sync::Arc;

use rlark_apiserver::auth::Identity;
use russh::keys::ssh_key::{Certificate, PublicKey};
use serde_json::Value;

use super::SshState;
use super::keys::RegisteredWith;
use crate::task_access::{self, AccessError};

/// The login name that opens the menu.
pub(crate) const MENU: &str = "menu";

/// Where a login goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A replica of a task.
    Task {
        name: String,
        index: u32,
        namespace: Option<String>,
    },
    /// The menu of reachable tasks.
    Menu,
    /// A `domain` certificate's pod-network forwards ([`super::domain`]): flows of the
    /// members that cluster `cluster` runs in Domain `domain`. The login name is not read
    /// (RLark's agents log in as `client` or `root`).
    Domain { domain: String, cluster: String },
}

impl Target {
    /// Parse a login name; the error says what is expected.
    pub(crate) fn parse(login: &str) -> Result<Target, String> {
        if login == MENU {
            return Ok(Target::Menu);
        }
        let parts: Vec<&str> = login.split('.').collect();
        let bad = || {
            format!(
                "login {login:?} names no task: use TASK, TASK.REPLICA, TASK.NAMESPACE, \
                 TASK.REPLICA.NAMESPACE or {MENU}"
            )
        };
        let label = |s: &str| {
            !s.is_empty()
                && s.len() <= 253
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        let index = |s: &str| -> Option<u32> {
            (!s.is_empty() && s.len() <= 5 && s.chars().all(|c| c.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let (name, index, namespace) = match parts.as_slice() {
            [name] => (*name, 0, None),
            [name, second] => match index(second) {
                Some(i) => (*name, i, None),
                None => (*name, 0, Some(*second)),
            },
            [name, i, namespace] => (*name, index(i).ok_or_else(bad)?, Some(*namespace)),
            _ => return Err(bad()),
        };
        if !label(name) || namespace.is_some_and(|n| !label(n)) {
            return Err(bad());
        }
        Ok(Target::Task {
            name: name.to_string(),
            index,
            namespace: namespace.map(str::to_string),
        })
    }
}

/// What a client authenticated with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// An SSH certificate (serial, hex as revocations spell it).
    Certificate { serial: String },
    /// A registered key.
    RegisteredKey {
        id: String,
        registered_with: RegisteredWith,
    },
    /// The `sshPublicKey` of Task `namespace/name`.
    TaskKey {
        namespace: String,
        name: String,
        key: String,
    },
}

impl Credential {
    /// For audit records.
    pub(crate) fn describe(&self) -> String {
        match self {
            Credential::Certificate { serial } => format!("SSH certificate {serial}"),
            Credential::RegisteredKey { id, .. } => format!("registered key {id}"),
            Credential::TaskKey {
                namespace, name, ..
            } => format!("sshPublicKey of task {namespace}/{name}"),
        }
    }
}

/// An authenticated, authorized login.
#[derive(Debug, Clone)]
pub(crate) struct Login {
    pub identity: Identity,
    pub credential: Credential,
    pub target: Target,
    /// The Task, for task logins (resolved and authorized at authentication).
    pub task: Option<Arc<Value>>,
}

/// A refused login: why, for the audit log (the client learns nothing).
#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub identity: Option<Identity>,
    pub reason: String,
}

fn refuse(identity: Option<&Identity>, reason: impl Into<String>) -> Refusal {
    Refusal {
        identity: identity.cloned(),
        reason: reason.into(),
    }
}

/// Authenticate `key` (ownership proven by the handshake) for login `login`.
pub(crate) async fn by_key(
    state: &SshState,
    login: &str,
    key: &PublicKey,
) -> Result<Login, Refusal> {
    let target = Target::parse(login).map_err(|e| refuse(None, e))?;
    let registered = state
        .keys
        .find(key)
        .await
        .map_err(|e| refuse(None, e.to_string()))?;
    if let Some(record) = registered {
        if record.expired(chrono::Utc::now()) {
            return Err(refuse(
                Some(&record.identity()),
                format!(
                    "SSH key {} expired at {}",
                    record.fingerprint,
                    record.expires_at.as_deref().unwrap_or_default()
                ),
            ));
        }
        let credential = Credential::RegisteredKey {
            id: record.id.clone(),
            registered_with: record.registered_with.clone(),
        };
        let identity = record.identity();
        if let Some(reason) = revoked(state, &credential).await {
            return Err(refuse(Some(&identity), reason));
        }
        return authorize(state, identity, credential, target).await;
    }
    // The task's own key, for that task only.
    if let Target::Task {
        name, namespace, ..
    } = &target
        && let Ok(task) = task_access::find_task(&*state.store, name, namespace.as_deref()).await
        && task_key_matches(&task, key)
    {
        let (namespace, name) = task_access::namespace_and_name(&task);
        let identity = Identity {
            user: format!("sshPublicKey:{namespace}/{name}"),
            groups: Vec::new(),
        };
        return Ok(Login {
            identity,
            credential: Credential::TaskKey {
                namespace,
                name,
                key: public_line(key),
            },
            target,
            task: Some(task),
        });
    }
    Err(refuse(
        None,
        format!(
            "public key {} is not registered (rlark ssh-key add) and is not the task's \
             sshPublicKey",
            key.fingerprint(russh::keys::ssh_key::HashAlg::Sha256)
        ),
    ))
}

/// Authenticate an OpenSSH certificate (ownership of its key proven by the handshake).
pub(crate) async fn by_certificate(
    state: &SshState,
    login: &str,
    certificate: &Certificate,
) -> Result<Login, Refusal> {
    let text = certificate
        .to_openssh()
        .map_err(|e| refuse(None, format!("encode the certificate: {e}")))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let verified = rlark_pki::ssh::verify_ssh_cert(
        &text,
        std::slice::from_ref(&state.ssh_ca_fingerprint),
        now,
    )
    .map_err(|e| refuse(None, e.to_string()))?;
    let credential = Credential::Certificate {
        serial: format!("{:x}", verified.serial),
    };
    let identity = Identity {
        user: verified.role.principal(),
        groups: Vec::new(),
    };
    let target = match &verified.role {
        rlark_pki::ssh::SshCertRole::Guest { .. } => {
            Target::parse(login).map_err(|e| refuse(Some(&identity), e))?
        }
        rlark_pki::ssh::SshCertRole::Domain { domain, cluster_id } => Target::Domain {
            domain: domain.clone(),
            cluster: cluster_id.clone(),
        },
    };
    if let Some(reason) = revoked(state, &credential).await {
        return Err(refuse(Some(&identity), reason));
    }
    authorize(state, identity, credential, target).await
}

/// Resolve the target and check that `identity` may reach it.
async fn authorize(
    state: &SshState,
    identity: Identity,
    credential: Credential,
    target: Target,
) -> Result<Login, Refusal> {
    let task = match &target {
        Target::Menu | Target::Domain { .. } => None,
        Target::Task {
            name, namespace, ..
        } => {
            let task = task_access::find_task(&*state.store, name, namespace.as_deref())
                .await
                .map_err(|e| refuse(Some(&identity), e.to_string()))?;
            match task_access::authorize(&*state.store, &identity, &task).await {
                Ok(()) => Some(task),
                Err(error @ (AccessError::Denied(_) | AccessError::Store(_))) => {
                    return Err(refuse(Some(&identity), error.to_string()));
                }
                Err(other) => return Err(refuse(Some(&identity), other.to_string())),
            }
        }
    };
    Ok(Login {
        identity,
        credential,
        target,
        task,
    })
}

/// Why `credential` no longer authenticates, if it does not.
pub(crate) async fn revoked(state: &SshState, credential: &Credential) -> Option<String> {
    match credential {
        Credential::Certificate { serial } => state
            .security
            .is_revoked(serial)
            .then(|| format!("SSH certificate {serial} is revoked")),
        Credential::RegisteredKey {
            id,
            registered_with,
        } => {
            match state.keys.find_by_id(id).await {
                Ok(Some(_)) => {}
                Ok(None) => return Some(format!("SSH key {id} was removed")),
                Err(error) => return Some(format!("SSH key {id}: {error}")),
            }
            match registered_with {
                RegisteredWith::Certificate { serial } => {
                    state.security.is_revoked(serial).then(|| {
                        format!(
                            "SSH key {id} was registered with certificate {serial}, which is \
                             revoked"
                        )
                    })
                }
                RegisteredWith::Token { id: token } => {
                    state.security.bearer_token_revoked(token).await.then(|| {
                        format!("SSH key {id} was registered with token {token}, which is revoked")
                    })
                }
            }
        }
        Credential::TaskKey {
            namespace,
            name,
            key,
        } => match task_access::find_task(&*state.store, name, Some(namespace)).await {
            Ok(task)
                if PublicKey::from_openssh(key).is_ok_and(|key| task_key_matches(&task, &key)) =>
            {
                None
            }
            _ => Some(format!(
                "the sshPublicKey of task {namespace}/{name} changed or the task is gone"
            )),
        },
    }
}

/// Whether `key` is one of the keys in `task`'s `spec.sshPublicKey` (one key per line, as
/// in `authorized_keys`).
fn task_key_matches(task: &Value, key: &PublicKey) -> bool {
    task["spec"]["sshPublicKey"]
        .as_str()
        .into_iter()
        .flat_map(str::lines)
        .filter_map(|line| PublicKey::from_openssh(line.trim()).ok())
        .any(|allowed| allowed.key_data() == key.key_data())
}

fn public_line(key: &PublicKey) -> String {
    PublicKey::new(key.key_data().clone(), "")
        .to_openssh()
        .map(|l| l.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_names_parse() {
        let task = |name: &str, index: u32, namespace: Option<&str>| Target::Task {
            name: name.into(),
            index,
            namespace: namespace.map(str::to_string),
        };
        assert_eq!(Target::parse("menu"), Ok(Target::Menu));
        assert_eq!(Target::parse("ppo-actor"), Ok(task("ppo-actor", 0, None)));
        assert_eq!(Target::parse("ppo-actor.3"), Ok(task("ppo-actor", 3, None)));
        assert_eq!(
            Target::parse("ppo-actor.rlark-a"),
            Ok(task("ppo-actor", 0, Some("rlark-a")))
        );
        assert_eq!(
            Target::parse("ppo-actor.2.rlark-a"),
            Ok(task("ppo-actor", 2, Some("rlark-a")))
        );
        for bad in ["", "A", "a..b", "a.b.c", "a.1.2.3", "a b"] {
            assert!(Target::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn task_keys_match_by_key_not_comment() {
        let key =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
        let task =
            serde_json::json!({"spec": {"sshPublicKey": format!("# mine\n{key} someone@host\n")}});
        let parsed = PublicKey::from_openssh(key).unwrap();
        assert!(task_key_matches(&task, &parsed));
        assert!(!task_key_matches(&serde_json::json!({"spec": {}}), &parsed));
    }
}
