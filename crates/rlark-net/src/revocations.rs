//! The revoked agent certificates this agent refuses on the direct path
//! ([`crate::direct`]).
//!
//! The server publishes the revoked serials of agent certificates at
//! `GET /rlark/v1/agentrevocations` (`rlark-server/src/security/agent_revocations.rs`).
//! [`Revocations::follow`] reads it at start and then long-polls it (`If-None-Match` with
//! the last `ETag`, `waitSeconds=`[`POLL_WAIT`]), so a revocation reaches the agent at once.
//! A failed read keeps the last known set and is retried after a delay that doubles from
//! [`RETRY_MIN`] to [`RETRY_MAX`]; each failure is logged and counted.
//!
//! Until the first read succeeds the set is unknown, and the direct path is closed both
//! ways: the listener does not accept ([`Revocations::wait_known`]) and the dialer refuses
//! (the router relays instead, through the hub, which checks revocation itself).
//!
//! Connections opened while a peer's certificate was good are tracked by its serial
//! ([`Revocations::track`]); when a new set names that serial, they are cut
//! ([`Revocable`] fails its reads and writes).
//!
//! Metrics (names relative to the agent's registry, `rlark_agent_` in front):
//! `domain_direct_refused_total{direction="inbound"|"outbound",reason}` with reason
//! `revoked` (at the handshake), `revoked-while-open` (a live connection cut) or
//! `revocations-unknown` (before the first read); `domain_revocation_fetch_failures_total`;
//! `domain_revoked_agent_serials` (the size of the set).

use std::collections::{HashMap, HashSet};
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The server's route.
pub const ROUTE: &str = "/rlark/v1/agentrevocations";
/// How long the server may hold one poll (it answers at once when the set changes).
pub const POLL_WAIT: Duration = Duration::from_secs(30);
/// First delay after a failed read.
pub const RETRY_MIN: Duration = Duration::from_secs(1);
/// Longest delay between failed reads.
pub const RETRY_MAX: Duration = Duration::from_secs(60);
/// Largest answer read (about 480,000 serials).
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// Longest serial accepted: 20 bytes (RFC 5280) in hex.
const MAX_SERIAL_CHARS: usize = 40;

/// Which end of a direct connection this agent is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The peer connected to this agent's listener.
    Inbound,
    /// This agent dialed the peer.
    Outbound,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

/// Why a peer is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("certificate {serial} is revoked")]
    Revoked { serial: String },
    #[error("the revoked agent certificates are not known yet (first read of {ROUTE} pending)")]
    Unknown,
}

impl Refusal {
    fn label(&self) -> &'static str {
        match self {
            Refusal::Revoked { .. } => "revoked",
            Refusal::Unknown => "revocations-unknown",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    direction: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Default)]
struct RevocationMetrics {
    refused: Family<RefusedLabels, Counter>,
    fetch_failures: Counter,
    serials: Gauge,
}

/// The revoked serials, shared by the direct listener, the dialer and [`Revocations::follow`].
/// Cheap to clone.
#[derive(Clone, Debug)]
pub struct Revocations {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// `None` until the first read.
    set: RwLock<Option<Arc<HashSet<String>>>>,
    /// Live connections by peer serial, each with its own id.
    live: Mutex<HashMap<String, HashMap<u64, CancellationToken>>>,
    next_id: AtomicU64,
    known: watch::Sender<bool>,
    metrics: RevocationMetrics,
}

impl Default for Revocations {
    fn default() -> Self {
        Self::unknown()
    }
}

impl Revocations {
    /// A set not read yet: every peer is refused until [`Revocations::replace`].
    pub fn unknown() -> Self {
        let (known, _) = watch::channel(false);
        Revocations {
            inner: Arc::new(Inner {
                set: RwLock::new(None),
                live: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                known,
                metrics: RevocationMetrics::default(),
            }),
        }
    }

    /// A known set (tests, and agents given one).
    pub fn known(serials: impl IntoIterator<Item = String>) -> Self {
        let revocations = Self::unknown();
        revocations.replace(serials);
        revocations
    }

    /// Register the metrics (see the module documentation).
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.inner.metrics;
        registry.register(
            "domain_direct_refused",
            "Direct-path peers refused or cut for their certificate's revocation",
            m.refused.clone(),
        );
        registry.register(
            "domain_revocation_fetch_failures",
            "Failed reads of the revoked agent certificates (the last known set is kept)",
            m.fetch_failures.clone(),
        );
        registry.register(
            "domain_revoked_agent_serials",
            "Revoked agent certificate serials this agent refuses on the direct path",
            m.serials.clone(),
        );
    }

    /// Whether a set has been read.
    pub fn is_known(&self) -> bool {
        *self.inner.known.borrow()
    }

    /// Resolves once a set has been read.
    pub async fn wait_known(&self) {
        let mut known = self.inner.known.subscribe();
        // Errors only when the sender is gone, which `self` prevents.
        let _ = known.wait_for(|known| *known).await;
    }

    /// Use `serials` from now on, and cut the live connections of peers it names.
    pub fn replace(&self, serials: impl IntoIterator<Item = String>) {
        let set: Arc<HashSet<String>> = Arc::new(serials.into_iter().collect());
        let size = i64::try_from(set.len()).unwrap_or(i64::MAX);
        *self
            .inner
            .set
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&set));
        self.inner.metrics.serials.set(size);
        self.inner
            .known
            .send_if_modified(|known| !std::mem::replace(known, true));
        let live = self
            .inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for (serial, connections) in live.iter() {
            if set.contains(serial) {
                for token in connections.values() {
                    if !token.is_cancelled() {
                        tracing::warn!(%serial, "closing a direct connection: the peer's certificate was revoked");
                        token.cancel();
                    }
                }
            }
        }
    }

    /// Whether a peer presenting the certificate with `serial` may use the direct path.
    pub fn check(&self, serial: &str) -> Result<(), Refusal> {
        let set = self
            .inner
            .set
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        match set.as_ref() {
            None => Err(Refusal::Unknown),
            Some(set) if set.contains(serial) => Err(Refusal::Revoked {
                serial: serial.to_string(),
            }),
            Some(_) => Ok(()),
        }
    }

    /// [`Revocations::check`], counting a refusal under `direction`.
    pub fn admit(&self, serial: &str, direction: Direction) -> Result<(), Refusal> {
        self.check(serial).inspect_err(|refusal| {
            self.count(direction, refusal.label());
        })
    }

    /// `Err(Refusal::Unknown)`, counted under `direction`, until a set has been read.
    pub fn ensure_known(&self, direction: Direction) -> Result<(), Refusal> {
        if self.is_known() {
            return Ok(());
        }
        self.count(direction, Refusal::Unknown.label());
        Err(Refusal::Unknown)
    }

    fn count(&self, direction: Direction, reason: &'static str) {
        self.inner
            .metrics
            .refused
            .get_or_create(&RefusedLabels {
                direction: direction.label(),
                reason,
            })
            .inc();
    }

    /// Watch a live connection with the peer certificate `serial`: `stream` fails once a
    /// new set names it (at once if the current one does).
    pub fn track<S>(&self, serial: &str, direction: Direction, stream: S) -> Revocable<S> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(serial.to_string())
            .or_default()
            .insert(id, token.clone());
        // A set that arrived between the caller's check and the registration above.
        if matches!(self.check(serial), Err(Refusal::Revoked { .. })) {
            token.cancel();
        }
        Revocable {
            inner: stream,
            cut: Box::pin(token.clone().cancelled_owned()),
            guard: LiveGuard {
                revocations: self.clone(),
                serial: serial.to_string(),
                id,
                direction,
                token,
                counted: false,
            },
        }
    }

    /// Read the set now and then follow it until `shutdown` (see the module documentation).
    pub async fn follow(self, client: kube::Client, shutdown: CancellationToken) {
        let mut etag: Option<String> = None;
        let mut retry = RETRY_MIN;
        loop {
            let wait = if etag.is_some() {
                POLL_WAIT
            } else {
                Duration::ZERO
            };
            let read = tokio::select! {
                () = shutdown.cancelled() => return,
                read = fetch(&client, etag.as_deref(), wait) => read,
            };
            let pause = match read {
                Ok(Fetched::Changed { etag: new, serials }) => {
                    tracing::info!(revoked = serials.len(), "revoked agent certificates read");
                    self.replace(serials);
                    etag = Some(new);
                    retry = RETRY_MIN;
                    Duration::ZERO
                }
                // The server held the poll as long as it would: ask again. Not at once,
                // whatever the server does.
                Ok(Fetched::Unchanged) => {
                    retry = RETRY_MIN;
                    RETRY_MIN
                }
                Err(error) => {
                    self.inner.metrics.fetch_failures.inc();
                    tracing::warn!(
                        %error,
                        retry_in = ?retry,
                        known = self.is_known(),
                        "reading the revoked agent certificates failed; keeping the last known set"
                    );
                    let pause = retry;
                    retry = (retry * 2).min(RETRY_MAX);
                    pause
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// One read of the route.
#[derive(Debug, PartialEq, Eq)]
pub enum Fetched {
    /// `304`: the set with the `ETag` given is current.
    Unchanged,
    Changed {
        etag: String,
        serials: Vec<String>,
    },
}

/// A failed read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("GET {ROUTE}: {0}")]
    Request(String),
    #[error("GET {ROUTE}: answered {status}: {body}")]
    Status { status: u16, body: String },
    #[error("GET {ROUTE}: no answer within {0:?}")]
    Timeout(Duration),
    #[error("GET {ROUTE}: bad answer: {0}")]
    Answer(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerBody {
    serials: Vec<String>,
}

/// Read the route once: with `etag`, the server answers `304` while the set is unchanged,
/// holding the request up to `wait` for a change.
pub async fn fetch(
    client: &kube::Client,
    etag: Option<&str>,
    wait: Duration,
) -> Result<Fetched, FetchError> {
    let mut request =
        http::Request::get(format!("{ROUTE}?waitSeconds={}", wait.as_secs())).body(Vec::new());
    if let (Ok(request), Some(etag)) = (&mut request, etag) {
        let value = http::HeaderValue::from_str(etag)
            .map_err(|e| FetchError::Request(format!("ETag {etag:?}: {e}")))?;
        request
            .headers_mut()
            .insert(http::header::IF_NONE_MATCH, value);
    }
    let request = request.map_err(|e| FetchError::Request(e.to_string()))?;
    let limit = wait + Duration::from_secs(30);
    let read = async {
        let response = client
            .send(request.map(kube::client::Body::from))
            .await
            .map_err(|e| FetchError::Request(e.to_string()))?;
        let status = response.status();
        let etag = response
            .headers()
            .get(http::header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| FetchError::Answer(format!("read the body: {e}")))?
            .to_bytes();
        Ok::<_, FetchError>((status, etag, body))
    };
    let (status, new_etag, body) = tokio::time::timeout(limit, read)
        .await
        .map_err(|_| FetchError::Timeout(limit))??;
    if status == http::StatusCode::NOT_MODIFIED {
        return Ok(Fetched::Unchanged);
    }
    if status != http::StatusCode::OK {
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
        return Err(FetchError::Status {
            status: status.as_u16(),
            body: text,
        });
    }
    parse_answer(new_etag, &body)
}

/// The set from a `200` answer: its `ETag` and a body `{"serials": [hex, ...]}`.
fn parse_answer(etag: Option<String>, body: &[u8]) -> Result<Fetched, FetchError> {
    let etag = etag
        .filter(|e| !e.is_empty())
        .ok_or_else(|| FetchError::Answer("no ETag".into()))?;
    let answer: AnswerBody =
        serde_json::from_slice(body).map_err(|e| FetchError::Answer(e.to_string()))?;
    for serial in &answer.serials {
        let ok = !serial.is_empty()
            && serial.len() <= MAX_SERIAL_CHARS
            && serial
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !ok {
            return Err(FetchError::Answer(format!(
                "serial {:?} is not lowercase hex of at most {MAX_SERIAL_CHARS} digits",
                serial.chars().take(64).collect::<String>()
            )));
        }
    }
    Ok(Fetched::Changed {
        etag,
        serials: answer.serials,
    })
}

/// Deregisters a tracked connection when it ends.
#[derive(Debug)]
struct LiveGuard {
    revocations: Revocations,
    serial: String,
    id: u64,
    direction: Direction,
    token: CancellationToken,
    counted: bool,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let mut live = self
            .revocations
            .inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(connections) = live.get_mut(&self.serial) {
            connections.remove(&self.id);
            if connections.is_empty() {
                live.remove(&self.serial);
            }
        }
    }
}

/// A direct connection that fails (reads and writes: `ConnectionAborted`) once its peer's
/// certificate is revoked ([`Revocations::track`]). Dropping it closes the connection.
pub struct Revocable<S> {
    inner: S,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    guard: LiveGuard,
}

impl<S> Revocable<S> {
    /// Whether it has been cut.
    pub fn is_cut(&self) -> bool {
        self.guard.token.is_cancelled()
    }

    /// `Err` once cut (counted once); registers the waker otherwise.
    fn poll_cut(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.cut.as_mut().poll(cx).is_pending() {
            return Ok(());
        }
        if !self.guard.counted {
            self.guard.counted = true;
            self.guard
                .revocations
                .count(self.guard.direction, "revoked-while-open");
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the peer's certificate {} was revoked", self.guard.serial),
        ))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Revocable<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Revocable<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = this.poll_cut(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[test]
    fn unknown_refuses_everyone_known_refuses_the_revoked() {
        let r = Revocations::unknown();
        assert!(!r.is_known());
        assert_eq!(r.check("0a"), Err(Refusal::Unknown));
        r.replace(["0b".to_string()]);
        assert!(r.is_known());
        assert_eq!(r.check("0a"), Ok(()));
        assert_eq!(
            r.admit("0b", Direction::Inbound),
            Err(Refusal::Revoked {
                serial: "0b".into()
            })
        );
        // An empty set is known, and refuses no one.
        r.replace(Vec::new());
        assert_eq!(r.check("0b"), Ok(()));
    }

    #[test]
    fn answers_are_checked() {
        let ok = parse_answer(
            Some("\"e1\"".into()),
            br#"{"kind":"AgentRevocationList","serials":["0a","ff01"]}"#,
        );
        assert_eq!(
            ok.unwrap(),
            Fetched::Changed {
                etag: "\"e1\"".into(),
                serials: vec!["0a".into(), "ff01".into()]
            }
        );
        for (etag, body, want) in [
            (None, &br#"{"serials":[]}"#[..], "no ETag"),
            (Some("\"e\""), b"{", "EOF"),
            (Some("\"e\""), br#"{"serials":["0A"]}"#, "not lowercase hex"),
            (Some("\"e\""), br#"{"serials":[""]}"#, "not lowercase hex"),
            (Some("\"e\""), br#"{"items":[]}"#, "missing field `serials`"),
        ] {
            let e = parse_answer(etag.map(str::to_string), body).unwrap_err();
            assert!(e.to_string().contains(want), "{e} lacks {want:?}");
        }
        let long = format!(r#"{{"serials":["{}"]}}"#, "a".repeat(41));
        assert!(parse_answer(Some("\"e\"".into()), long.as_bytes()).is_err());
    }

    #[tokio::test]
    async fn a_tracked_stream_is_cut_when_its_serial_is_revoked() {
        let r = Revocations::known(Vec::new());
        let (mine, mut theirs) = tokio::io::duplex(1024);
        let mut stream = r.track("0a", Direction::Outbound, mine);
        let (other, _other_peer) = tokio::io::duplex(1024);
        let other = r.track("0b", Direction::Outbound, other);
        stream.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        theirs.read_exact(&mut buf).await.unwrap();
        // A read that waits when the revocation arrives fails then.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 4];
            let read = stream.read(&mut buf).await;
            (stream, read)
        });
        tokio::task::yield_now().await;
        r.replace(["0a".to_string()]);
        let (mut stream, read) = tokio::time::timeout(Duration::from_secs(10), reader)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
        assert!(stream.is_cut());
        assert!(stream.write_all(b"more").await.is_err());
        assert!(!other.is_cut());
        // Tracking a serial already revoked cuts at once; ended connections deregister.
        let (late, _late_peer) = tokio::io::duplex(16);
        assert!(r.track("0a", Direction::Inbound, late).is_cut());
        drop((stream, other));
        assert!(r.inner.live.lock().unwrap().is_empty());
        let mut text = String::new();
        let mut registry = Registry::with_prefix("rlark_agent");
        r.register(&mut registry);
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"rlark_agent_domain_direct_refused_total{direction="outbound",reason="revoked-while-open"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("rlark_agent_domain_revoked_agent_serials 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_failed_read_keeps_the_last_set_and_is_counted() {
        // Nothing listens there: every read fails at connect.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let r = Revocations::known(["0a".to_string()]);
        let stop = CancellationToken::new();
        let follower = tokio::spawn(r.clone().follow(client, stop.clone()));
        let counted = tokio::time::timeout(Duration::from_secs(30), async {
            while r.inner.metrics.fetch_failures.get() == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        stop.cancel();
        follower.await.unwrap();
        assert!(counted.is_ok(), "no failed read counted");
        assert_eq!(
            r.check("0a"),
            Err(Refusal::Revoked {
                serial: "0a".into()
            })
        );
        assert_eq!(r.check("0b"), Ok(()));
    }
}
