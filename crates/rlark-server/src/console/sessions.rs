//! Console sessions and one-time login links, kept in this server's memory.
//!
//! A session is created by exchanging a bearer token or a one-time login link; its id
//! travels only in an HttpOnly cookie, its CSRF token only in the JSON of
//! `GET /rlark/v1/console/session` (the page keeps it in memory). The store keeps SHA-256
//! digests of ids and link codes, never the secrets themselves. Sessions are per server
//! process: a restart, or another replica behind a load balancer, asks the user to log in
//! again (docs/console.md).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use rlark_apiserver::auth::Identity;
use sha2::{Digest as _, Sha256};

/// How long a session lasts after login (no sliding renewal).
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time login link can be used.
pub(crate) const LINK_TTL: Duration = Duration::from_secs(15 * 60);
/// At most this many live sessions; the oldest is dropped to make room.
const MAX_SESSIONS: usize = 10_000;
/// At most this many unused login links; the oldest is dropped to make room.
const MAX_LINKS: usize = 1_000;

/// A logged-in browser.
#[derive(Clone, Debug)]
pub(crate) struct Session {
    pub identity: Identity,
    /// The bearer token the session was created with: its revocation ends the session.
    pub token_id: Option<String>,
    /// The value state-changing requests must send in [`super::CSRF_HEADER`].
    pub csrf: String,
    pub expires: SystemTime,
}

#[derive(Clone, Debug)]
struct Link {
    identity: Identity,
    expires: SystemTime,
}

#[derive(Default)]
struct Inner {
    /// By SHA-256 of the session id.
    sessions: HashMap<String, Session>,
    /// By SHA-256 of the link code.
    links: HashMap<String, Link>,
}

/// The session and login-link table.
#[derive(Default)]
pub(crate) struct Sessions {
    inner: Mutex<Inner>,
}

/// 256 random bits as 64 hex characters (two UUIDv4 from the OS CSPRNG: 244 random bits).
pub(crate) fn random_secret() -> String {
    let mut out = String::with_capacity(64);
    out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    out
}

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Constant-time comparison of two strings (CSRF tokens).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new session; returns its id (the cookie value) and the session.
    pub(crate) fn create(&self, identity: Identity, token_id: Option<String>) -> (String, Session) {
        let id = random_secret();
        let now = SystemTime::now();
        let session = Session {
            identity,
            token_id,
            csrf: random_secret(),
            expires: now + SESSION_TTL,
        };
        let mut inner = self.lock();
        inner.sessions.retain(|_, s| s.expires > now);
        if inner.sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = inner
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            inner.sessions.remove(&oldest);
        }
        inner.sessions.insert(digest(&id), session.clone());
        (id, session)
    }

    /// The live session with this id.
    pub(crate) fn get(&self, id: &str) -> Option<Session> {
        let key = digest(id);
        let mut inner = self.lock();
        match inner.sessions.get(&key) {
            Some(session) if session.expires > SystemTime::now() => Some(session.clone()),
            Some(_) => {
                inner.sessions.remove(&key);
                None
            }
            None => None,
        }
    }

    /// End the session with this id; whether it existed.
    pub(crate) fn remove(&self, id: &str) -> bool {
        self.lock().sessions.remove(&digest(id)).is_some()
    }

    /// End every session created with bearer token `token_id`.
    pub(crate) fn remove_token_sessions(&self, token_id: &str) {
        self.lock()
            .sessions
            .retain(|_, s| s.token_id.as_deref() != Some(token_id));
    }

    /// A one-time login link code for `identity`, valid for [`LINK_TTL`].
    pub(crate) fn create_link(&self, identity: Identity) -> String {
        let code = random_secret();
        let now = SystemTime::now();
        let mut inner = self.lock();
        inner.links.retain(|_, l| l.expires > now);
        if inner.links.len() >= MAX_LINKS
            && let Some(oldest) = inner
                .links
                .iter()
                .min_by_key(|(_, l)| l.expires)
                .map(|(k, _)| k.clone())
        {
            inner.links.remove(&oldest);
        }
        inner.links.insert(
            digest(&code),
            Link {
                identity,
                expires: now + LINK_TTL,
            },
        );
        code
    }

    /// Use a login link: its identity, once; `None` if unknown, used or expired.
    pub(crate) fn redeem_link(&self, code: &str) -> Option<Identity> {
        let link = self.lock().links.remove(&digest(code))?;
        (link.expires > SystemTime::now()).then_some(link.identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity {
            user: "alice".into(),
            groups: vec!["rlark:viewers".into()],
        }
    }

    #[test]
    fn links_work_once_and_sessions_end_on_remove() {
        let sessions = Sessions::default();
        let code = sessions.create_link(alice());
        assert_eq!(code.len(), 64);
        assert_eq!(sessions.redeem_link(&code), Some(alice()));
        assert_eq!(sessions.redeem_link(&code), None, "a link works once");
        assert_eq!(sessions.redeem_link("not-a-code"), None);

        let (id, session) = sessions.create(alice(), Some("tok1".into()));
        assert_ne!(id, session.csrf);
        assert_eq!(sessions.get(&id).unwrap().identity, alice());
        assert!(sessions.remove(&id));
        assert!(sessions.get(&id).is_none());
        assert!(!sessions.remove(&id));

        let (id, _) = sessions.create(alice(), Some("tok1".into()));
        let (other, _) = sessions.create(alice(), None);
        sessions.remove_token_sessions("tok1");
        assert!(sessions.get(&id).is_none());
        assert!(sessions.get(&other).is_some());
    }

    #[test]
    fn secrets_compare_in_full() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "a"));
    }
}
