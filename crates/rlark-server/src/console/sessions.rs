//! Console sessions and one-time login links, kept in the store.
//!
//! A session is created by exchanging a bearer token or a one-time login link; its id
//! travels only in an HttpOnly cookie, its CSRF token only in the JSON of the login answer
//! and of `GET /rlark/v1/console/session` (the page keeps it in memory). The store keeps
//! them under resources [`SESSIONS`] and [`LINKS`] (not served by the API), named by the
//! SHA-256 of the session id or link code, never the secrets themselves: every server
//! replica sharing the store knows every session, and sessions survive a restart. A link
//! is redeemed by deleting its record, so two replicas cannot both accept it.
//!
//! Expired records are ignored on read, deleted when read, and swept at most once a minute
//! when a session or link is created.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rlark_apiserver::auth::Identity;
use rlark_store::{ListOptions, ObjectKey, Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// Store resource of sessions.
pub(crate) const SESSIONS: &str = "sessions.console.rlark.io";
/// Store resource of one-time login links.
pub(crate) const LINKS: &str = "loginlinks.console.rlark.io";
/// How long a session lasts after login (no sliding renewal).
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// How long a one-time login link can be used.
pub(crate) const LINK_TTL: Duration = Duration::from_secs(15 * 60);
/// Store resource of one-time tickets to the task proxy's origin (`super::proxy_origin`).
pub(crate) const PROXY_TICKETS: &str = "proxytickets.console.rlark.io";
/// Store resource of the task proxy origin's sessions (its `__Host-rlark_proxy` cookie).
pub(crate) const PROXY_SESSIONS: &str = "proxysessions.console.rlark.io";
/// How long a ticket to the task proxy's origin can be used.
pub(crate) const TICKET_TTL: Duration = Duration::from_secs(60);
/// Least time between two sweeps of expired records.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Page size of sweeps.
const PAGE: usize = 500;

/// A logged-in browser.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub identity: Identity,
    /// The bearer token the session was created with: its revocation ends the session.
    pub token_id: Option<String>,
    /// The value state-changing requests must send in [`super::CSRF_HEADER`].
    pub csrf: String,
    pub expires: SystemTime,
}

/// A session or link as stored.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    user: String,
    groups: Vec<String>,
    #[serde(default, rename = "tokenID", skip_serializing_if = "Option::is_none")]
    token_id: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    csrf: String,
    /// Seconds since the Unix epoch.
    expires_unix: u64,
}

impl Record {
    fn expires(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(self.expires_unix)
    }

    fn identity(&self) -> Identity {
        Identity {
            user: self.user.clone(),
            groups: self.groups.clone(),
        }
    }
}

/// A ticket to the task proxy's origin, or the proxy session it became: who, bound to what
/// credential, and the task app it was asked for. Stored like a [`Record`] (whose fields it
/// has, so the sweep reads its expiry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProxyGrant {
    pub user: String,
    pub groups: Vec<String>,
    /// Digest of the console session that asked (a cookie session): its end ends the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The bearer token that asked (or that the asking session was created with): its
    /// revocation ends the grant.
    #[serde(default, rename = "tokenID", skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// The client certificate that asked: its revocation ends the grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_serial: Option<String>,
    pub namespace: String,
    pub task: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<u32>,
    pub port: u16,
    /// The app's path below its root (no leading `/`), where the login redirects to.
    #[serde(default)]
    pub path: String,
    /// Seconds since the Unix epoch.
    pub expires_unix: u64,
}

impl ProxyGrant {
    pub(crate) fn identity(&self) -> Identity {
        Identity {
            user: self.user.clone(),
            groups: self.groups.clone(),
        }
    }

    pub(crate) fn expires(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(self.expires_unix)
    }
}

/// Seconds since the Unix epoch of `t`.
pub(crate) fn unix(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Completes when `end` (the request's [`SessionEnd`] extension, if any) does; never without
/// one. For the copy loops of upgraded connections (WebSockets) to select on.
pub(crate) async fn ended_or_never(end: Option<SessionEnd>) {
    match end {
        Some(end) => end.ended().await,
        None => std::future::pending().await,
    }
}

/// `response` with a body that ends once `end` does: a watch, a followed log or an event
/// stream opened with a console session stops at its logout. A body already complete is not
/// held up.
pub(crate) fn end_with(
    response: axum::response::Response,
    end: SessionEnd,
) -> axum::response::Response {
    let (parts, body) = response.into_parts();
    axum::response::Response::from_parts(
        parts,
        axum::body::Body::new(UntilEnded {
            inner: body,
            ended: Some(Box::pin(end.ended())),
        }),
    )
}

/// A body that stops (cleanly, as if complete) when its session ends.
struct UntilEnded {
    inner: axum::body::Body,
    /// `None` once it completed.
    ended: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl http_body::Body for UntilEnded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        let Some(ended) = this.ended.as_mut() else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(frame) = std::pin::Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        if ended.as_mut().poll(cx).is_ready() {
            this.ended = None;
            tracing::debug!("stream ended: its console session ended");
            return Poll::Ready(None);
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.ended.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The session and login-link table.
pub(crate) struct Sessions {
    store: Arc<dyn Store>,
    last_sweep: Mutex<Option<SystemTime>>,
    /// Bumped whenever this replica ends sessions, so [`SessionEnd`]s look at once.
    ended: tokio::sync::watch::Sender<u64>,
}

/// How often a [`SessionEnd`] looks whether its session is still there (a logout on another
/// replica, an expiry).
pub(crate) const END_CHECK_EVERY: Duration = Duration::from_secs(1);

/// A further condition a [`SessionEnd`] checks at each look: `false` ends it (a proxy
/// session's token or certificate revoked, the proxy session expired).
pub(crate) type StillValid =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The end of one console session, for the streams opened with it (watches, logs, events,
/// WebSockets): [`SessionEnd::ended`] completes within about a second of a logout on any
/// replica (at once on this one), of the session's expiry, or of its deletion; with a
/// [`StillValid`] check (the proxy origin's sessions), also when that turns false.
#[derive(Clone)]
pub(crate) struct SessionEnd {
    sessions: Arc<Sessions>,
    /// The session's digest (its store name); `None`: no console session, only `still`.
    digest: Option<String>,
    still: Option<StillValid>,
}

impl std::fmt::Debug for SessionEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEnd").finish_non_exhaustive()
    }
}

impl SessionEnd {
    pub(crate) fn new(sessions: Arc<Sessions>, digest: String) -> Self {
        Self {
            sessions,
            digest: Some(digest),
            still: None,
        }
    }

    /// Ends with the console session `digest` (if any) or when `still` answers false.
    pub(crate) fn with_check(
        sessions: Arc<Sessions>,
        digest: Option<String>,
        still: StillValid,
    ) -> Self {
        Self {
            sessions,
            digest,
            still: Some(still),
        }
    }

    /// Completes once the session is over. A store failure is not an end (the stream goes on
    /// and the next look tries again).
    pub(crate) async fn ended(self) {
        let mut changes = self.sessions.ended.subscribe();
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        // The table is gone: nobody can end the session any more.
                        return std::future::pending().await;
                    }
                }
                () = tokio::time::sleep(END_CHECK_EVERY) => {}
            }
            if let Some(digest) = &self.digest
                && let Ok(None) = self.sessions.get_by_digest(digest).await
            {
                return;
            }
            if let Some(still) = &self.still
                && !still().await
            {
                return;
            }
        }
    }
}

/// 256 random bits as 64 hex characters (two UUIDv4 from the OS CSPRNG: 244 random bits).
pub(crate) fn random_secret() -> String {
    let mut out = String::with_capacity(64);
    out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    out.push_str(&uuid::Uuid::new_v4().simple().to_string());
    out
}

/// The SHA-256 of a secret, hex: how the store names a session, link or ticket.
pub(crate) fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn key(resource: &str, secret: &str) -> ObjectKey {
    ObjectKey::new(resource, "", digest(secret))
}

/// Constant-time comparison of two strings (CSRF tokens).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn grant_of(object: &serde_json::Value) -> Option<ProxyGrant> {
    serde_json::from_value(object.get("spec")?.clone()).ok()
}

fn record_of(object: &serde_json::Value) -> Option<Record> {
    serde_json::from_value(object.get("spec")?.clone()).ok()
}

/// Deleting what is already gone is fine (another replica or request was first).
fn ignore_missing(result: Result<Arc<serde_json::Value>, StoreError>) -> Result<bool, StoreError> {
    match result {
        Ok(_) => Ok(true),
        Err(StoreError::NotFound(_)) => Ok(false),
        Err(error) => Err(error),
    }
}

impl Sessions {
    pub(crate) fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            last_sweep: Mutex::new(None),
            ended: tokio::sync::watch::Sender::new(0),
        }
    }

    async fn put(
        &self,
        resource: &str,
        secret: &str,
        record: &impl Serialize,
    ) -> Result<(), StoreError> {
        let key = key(resource, secret);
        let object = json!({
            "metadata": {"name": key.name},
            "spec": serde_json::to_value(record).unwrap_or_default(),
        });
        self.store.create(&key, object).await?;
        Ok(())
    }

    /// A new session; returns its id (the cookie value) and the session.
    pub(crate) async fn create(
        &self,
        identity: Identity,
        token_id: Option<String>,
    ) -> Result<(String, Session), StoreError> {
        self.sweep().await;
        let id = random_secret();
        let session = Session {
            identity,
            token_id,
            csrf: random_secret(),
            // Whole seconds, as stored.
            expires: SystemTime::UNIX_EPOCH
                + Duration::from_secs(unix(SystemTime::now() + SESSION_TTL)),
        };
        let record = Record {
            user: session.identity.user.clone(),
            groups: session.identity.groups.clone(),
            token_id: session.token_id.clone(),
            csrf: session.csrf.clone(),
            expires_unix: unix(session.expires),
        };
        self.put(SESSIONS, &id, &record).await?;
        Ok((id, session))
    }

    /// The live session with this id.
    pub(crate) async fn get(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.get_by_digest(&digest(id)).await
    }

    /// The live session whose id has this digest (what a proxy session or a stream keeps).
    pub(crate) async fn get_by_digest(&self, digest: &str) -> Result<Option<Session>, StoreError> {
        let key = ObjectKey::new(SESSIONS, "", digest);
        let Some(object) = self.store.get(&key).await? else {
            return Ok(None);
        };
        let Some(record) = record_of(&object) else {
            tracing::warn!(name = %key.name, "a console session record has an unexpected shape; ignored");
            return Ok(None);
        };
        if record.expires() <= SystemTime::now() {
            ignore_missing(self.store.delete(&key, None).await)?;
            return Ok(None);
        }
        Ok(Some(Session {
            identity: record.identity(),
            token_id: record.token_id,
            csrf: record.csrf,
            expires: SystemTime::UNIX_EPOCH + Duration::from_secs(record.expires_unix),
        }))
    }

    /// End the session with this id; whether it existed.
    pub(crate) async fn remove(&self, id: &str) -> Result<bool, StoreError> {
        let removed = ignore_missing(self.store.delete(&key(SESSIONS, id), None).await);
        self.ended.send_modify(|n| *n += 1);
        removed
    }

    /// Delete the records of `resource` that `doomed` picks.
    async fn delete_where(
        &self,
        resource: &str,
        doomed: impl Fn(&Record) -> bool,
    ) -> Result<usize, StoreError> {
        let mut options = ListOptions {
            limit: Some(PAGE),
            ..ListOptions::default()
        };
        let mut deleted = 0;
        loop {
            let page = self.store.list(resource, &options).await?;
            for object in &page.items {
                let name = object["metadata"]["name"].as_str().unwrap_or_default();
                if record_of(object).is_some_and(|r| doomed(&r)) {
                    let key = ObjectKey::new(resource, "", name);
                    if ignore_missing(self.store.delete(&key, None).await)? {
                        deleted += 1;
                    }
                }
            }
            match page.continue_after {
                Some(key) => options.start_after = Some((key.namespace, key.name)),
                None => return Ok(deleted),
            }
        }
    }

    /// End every session created with bearer token `token_id`.
    pub(crate) async fn remove_token_sessions(&self, token_id: &str) -> Result<usize, StoreError> {
        let removed = self
            .delete_where(SESSIONS, |r| r.token_id.as_deref() == Some(token_id))
            .await;
        self.ended.send_modify(|n| *n += 1);
        removed
    }

    /// Delete expired sessions and links, at most once per [`SWEEP_EVERY`]; failures are
    /// logged (the next sweep tries again).
    async fn sweep(&self) {
        let now = SystemTime::now();
        {
            let mut last = self
                .last_sweep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|t| now.duration_since(t).is_ok_and(|d| d < SWEEP_EVERY)) {
                return;
            }
            *last = Some(now);
        }
        for resource in [SESSIONS, LINKS, PROXY_TICKETS, PROXY_SESSIONS] {
            match self.delete_where(resource, |r| r.expires() <= now).await {
                Ok(0) => {}
                Ok(deleted) => tracing::debug!(resource, deleted, "expired console records swept"),
                Err(error) => {
                    tracing::warn!(resource, %error, "sweep of expired console records failed")
                }
            }
        }
    }

    /// A one-time login link code for `identity`, valid for [`LINK_TTL`].
    pub(crate) async fn create_link(&self, identity: Identity) -> Result<String, StoreError> {
        self.sweep().await;
        let code = random_secret();
        let record = Record {
            user: identity.user,
            groups: identity.groups,
            token_id: None,
            csrf: String::new(),
            expires_unix: unix(SystemTime::now() + LINK_TTL),
        };
        self.put(LINKS, &code, &record).await?;
        Ok(code)
    }

    /// Store `grant` under a new random secret in `resource` ([`PROXY_TICKETS`] or
    /// [`PROXY_SESSIONS`]); returns the secret.
    pub(crate) async fn create_grant(
        &self,
        resource: &str,
        grant: &ProxyGrant,
    ) -> Result<String, StoreError> {
        self.sweep().await;
        let secret = random_secret();
        self.put(resource, &secret, grant).await?;
        Ok(secret)
    }

    /// Use a ticket to the task proxy's origin: its grant, once; `None` if unknown, used or
    /// expired. Deleting is the redemption, as for links: one replica wins.
    pub(crate) async fn redeem_ticket(
        &self,
        ticket: &str,
    ) -> Result<Option<ProxyGrant>, StoreError> {
        let object = match self.store.delete(&key(PROXY_TICKETS, ticket), None).await {
            Ok(object) => object,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(grant_of(&object).filter(|g| g.expires() > SystemTime::now()))
    }

    /// The live proxy session whose cookie is `secret` (expired ones are deleted).
    pub(crate) async fn proxy_session(
        &self,
        secret: &str,
    ) -> Result<Option<ProxyGrant>, StoreError> {
        let key = key(PROXY_SESSIONS, secret);
        let Some(object) = self.store.get(&key).await? else {
            return Ok(None);
        };
        match grant_of(&object) {
            Some(grant) if grant.expires() > SystemTime::now() => Ok(Some(grant)),
            _ => {
                ignore_missing(self.store.delete(&key, None).await)?;
                Ok(None)
            }
        }
    }

    /// Use a login link: its identity, once; `None` if unknown, used or expired.
    pub(crate) async fn redeem_link(&self, code: &str) -> Result<Option<Identity>, StoreError> {
        // Deleting is the redemption: of two concurrent uses, one gets NotFound.
        let object = match self.store.delete(&key(LINKS, code), None).await {
            Ok(object) => object,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(error) => return Err(error),
        };
        Ok(record_of(&object)
            .filter(|r| r.expires() > SystemTime::now())
            .map(|r| r.identity()))
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

    async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        Arc::new(
            rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
                dir.path().join("rlark.db"),
            ))
            .await
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn links_work_once_and_sessions_end_on_remove() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Sessions::new(store(&dir).await);
        let code = sessions.create_link(alice()).await.unwrap();
        assert_eq!(code.len(), 64);
        assert_eq!(sessions.redeem_link(&code).await.unwrap(), Some(alice()));
        assert_eq!(
            sessions.redeem_link(&code).await.unwrap(),
            None,
            "a link works once"
        );
        assert_eq!(sessions.redeem_link("not-a-code").await.unwrap(), None);

        let (id, session) = sessions.create(alice(), Some("tok1".into())).await.unwrap();
        assert_ne!(id, session.csrf);
        assert_eq!(sessions.get(&id).await.unwrap(), Some(session));
        assert!(sessions.remove(&id).await.unwrap());
        assert!(sessions.get(&id).await.unwrap().is_none());
        assert!(!sessions.remove(&id).await.unwrap());

        let (id, _) = sessions.create(alice(), Some("tok1".into())).await.unwrap();
        let (other, _) = sessions.create(alice(), None).await.unwrap();
        assert_eq!(sessions.remove_token_sessions("tok1").await.unwrap(), 1);
        assert!(sessions.get(&id).await.unwrap().is_none());
        assert!(sessions.get(&other).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn the_store_keeps_digests_and_sessions_outlive_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let (id, session) = Sessions::new(Arc::clone(&store))
            .create(alice(), None)
            .await
            .unwrap();
        // Another replica (or this server after a restart) sharing the store knows it.
        let again = Sessions::new(Arc::clone(&store));
        assert_eq!(again.get(&id).await.unwrap(), Some(session));
        let listed = store.list(SESSIONS, &ListOptions::default()).await.unwrap();
        let text = serde_json::to_string(&listed.items).unwrap();
        assert!(
            !text.contains(&id),
            "the session id is stored as its digest only"
        );
        assert!(text.contains(&digest(&id)));
    }

    #[tokio::test]
    async fn expired_sessions_and_links_are_refused_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let sessions = Sessions::new(Arc::clone(&store));
        let expired = Record {
            user: "alice".into(),
            groups: vec![],
            token_id: None,
            csrf: "c".into(),
            expires_unix: unix(SystemTime::now()) - 1,
        };
        sessions.put(SESSIONS, "old", &expired).await.unwrap();
        sessions.put(LINKS, "oldlink", &expired).await.unwrap();
        assert!(sessions.get("old").await.unwrap().is_none());
        assert!(store.get(&key(SESSIONS, "old")).await.unwrap().is_none());
        assert_eq!(sessions.redeem_link("oldlink").await.unwrap(), None);
        // A sweep removes what nobody reads any more.
        sessions.put(SESSIONS, "old2", &expired).await.unwrap();
        sessions.create(alice(), None).await.unwrap();
        assert!(store.get(&key(SESSIONS, "old2")).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_session_end_fires_at_logout_at_once_here_and_within_a_second_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let here = Arc::new(Sessions::new(Arc::clone(&store)));
        // Another replica sharing the store.
        let there = Arc::new(Sessions::new(Arc::clone(&store)));
        let (id, _) = here.create(alice(), None).await.unwrap();
        let end_here = tokio::spawn(SessionEnd::new(Arc::clone(&here), digest(&id)).ended());
        let end_there = tokio::spawn(SessionEnd::new(Arc::clone(&there), digest(&id)).ended());
        tokio::time::sleep(END_CHECK_EVERY + Duration::from_millis(300)).await;
        assert!(
            !end_here.is_finished() && !end_there.is_finished(),
            "the session lives"
        );
        let started = std::time::Instant::now();
        assert!(here.remove(&id).await.unwrap());
        tokio::time::timeout(Duration::from_millis(300), end_here)
            .await
            .expect("at once on the replica that logged out")
            .unwrap();
        tokio::time::timeout(END_CHECK_EVERY + Duration::from_millis(500), end_there)
            .await
            .expect("within about a second on another replica")
            .unwrap();
        assert!(started.elapsed() < END_CHECK_EVERY + Duration::from_millis(500));
    }

    #[tokio::test]
    async fn a_session_end_with_a_check_fires_when_the_check_fails() {
        let dir = tempfile::tempdir().unwrap();
        let sessions = Arc::new(Sessions::new(store(&dir).await));
        let valid = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let check = {
            let valid = Arc::clone(&valid);
            Arc::new(move || {
                let valid = valid.load(std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move { valid })
                    as std::pin::Pin<Box<dyn Future<Output = bool> + Send>>
            })
        };
        let end = tokio::spawn(SessionEnd::with_check(Arc::clone(&sessions), None, check).ended());
        tokio::time::sleep(END_CHECK_EVERY + Duration::from_millis(300)).await;
        assert!(!end.is_finished());
        valid.store(false, std::sync::atomic::Ordering::SeqCst);
        tokio::time::timeout(END_CHECK_EVERY + Duration::from_millis(500), end)
            .await
            .expect("ends within about a second")
            .unwrap();
    }

    #[test]
    fn secrets_compare_in_full() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert!(!same_secret("", "a"));
    }
}
