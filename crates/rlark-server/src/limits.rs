//! Connection limits: what a client without credentials can hold on the listener.
//!
//! - **Timeouts.** A connection must send its first complete request within
//!   [`ConnectionLimits::header_read_timeout`] of the TLS handshake (HTTP/1.1 and HTTP/2
//!   alike); every HTTP/1.1 request head must arrive within it (hyper's header-read timer,
//!   which also closes HTTP/1.1 keep-alive connections idle that long); a connection with no
//!   request in flight for [`ConnectionLimits::idle_timeout`] is closed (HTTP/2 gets a
//!   GOAWAY first). Requests in flight — watches, log streams — keep their connection however
//!   quiet they are; a connection that carried an upgrade (agent tunnel, exec, port-forward,
//!   `CONNECT`) is never closed for idleness: the tunnel has its own keep-alive. HTTP/2
//!   connections are pinged to find dead peers and bound rapid resets and header sizes.
//! - **Caps.** Every accepted TCP connection holds a [`Permit`] from accept until the socket
//!   is closed (an upgraded connection keeps it: the permit lives inside the socket wrapper).
//!   A connection is admitted to the *general* budget when fewer than
//!   [`ConnectionLimits::max_connections`] general connections are open and its source IP
//!   holds fewer than [`ConnectionLimits::max_connections_per_ip`] of them.
//! - **Reserve.** Beyond that budget, a connection may take one of
//!   [`ConnectionLimits::reserved_connections`] reserve slots (at most
//!   [`ConnectionLimits::reserved_connections_per_ip`] per source IP, so one address cannot
//!   take them all). A reserve connection must finish its handshake within
//!   [`ConnectionLimits::reserve_deadline`]. If it presented a valid admin
//!   (`system:masters`) client certificate it is then served like any other; otherwise it
//!   is *probe-only*: `/healthz`, `/livez` and `/readyz` are answered, any other request gets
//!   a 503 `Status`, and the connection is closed at the reserve deadline. Connections that
//!   fit neither are closed at once. So an attacker who fills the budget cannot lock out the
//!   administrator or the health checks.
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard limit ([`raise_nofile_limit`]);
//! the default global cap is derived from the result ([`ConnectionLimits::effective_max_connections`]).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse as _, Response};
use http::{Request, StatusCode, header};
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// File descriptors kept out of the automatic global connection cap: the store, the audit
/// log, outgoing connections (controllers, tunnel dials, peers) and the reserve.
pub const FD_HEADROOM: u64 = 256;

/// Upper bound of the automatic global connection cap, whatever the file-descriptor limit:
/// each connection costs memory (TLS and HTTP buffers), so an unlimited descriptor budget is
/// not an unlimited connection budget.
pub const AUTO_MAX_CONNECTIONS: usize = 65_536;

/// Smallest automatic global connection cap (when the descriptor limit is tiny).
pub const MIN_AUTO_MAX_CONNECTIONS: usize = 64;

/// Largest accepted value of every duration setting of [`ConnectionLimits`].
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// The paths a probe-only reserve connection may request.
const PROBE_PATHS: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// Connection timeouts and caps of the HTTPS listener (the `connections` section of the
/// config file). See the module documentation for how they work together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections in the general budget, all sources together. `None` (the default)
    /// derives it at start from the soft `RLIMIT_NOFILE` after raising it: the limit minus
    /// [`FD_HEADROOM`] minus the reserve, between [`MIN_AUTO_MAX_CONNECTIONS`] and
    /// [`AUTO_MAX_CONNECTIONS`]. File field `maxConnections`, flag `--max-connections`.
    pub max_connections: Option<usize>,
    /// Open connections in the general budget from one source IP (default 512). File field
    /// `maxConnectionsPerIP`, flag `--max-connections-per-ip`.
    pub max_connections_per_ip: usize,
    /// Reserve slots beyond the general budget, kept for admin clients and health probes
    /// (default 32; 0 disables the reserve). File field `reservedConnections`.
    pub reserved_connections: usize,
    /// Reserve slots one source IP may hold (default 2, at most `reservedConnections`).
    /// File field `reservedConnectionsPerIP`.
    pub reserved_connections_per_ip: usize,
    /// A reserve connection must finish its TLS handshake within this time of being
    /// accepted; a probe-only one is closed then (default 5 s). File field
    /// `reserveDeadlineSeconds`.
    pub reserve_deadline: Duration,
    /// The first request of a connection, and every HTTP/1.1 request head, must arrive
    /// within this time (default 30 s). HTTP/1.1 keep-alive connections idle this long are
    /// closed. File field `headerReadTimeoutSeconds`, flag `--header-read-timeout`.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed (default 90 s, as
    /// kube-apiserver). File field `idleTimeoutSeconds`, flag `--idle-timeout`.
    pub idle_timeout: Duration,
    /// HTTP/2 keep-alive ping interval (default 30 s; `None` = no pings). File field
    /// `http2KeepaliveIntervalSeconds` (0 = off).
    pub http2_keepalive_interval: Option<Duration>,
    /// An unanswered HTTP/2 ping closes the connection after this long (default 20 s). File
    /// field `http2KeepaliveTimeoutSeconds`.
    pub http2_keepalive_timeout: Duration,
    /// Concurrent HTTP/2 streams per connection (default 250). File field
    /// `http2MaxConcurrentStreams`.
    pub http2_max_concurrent_streams: u32,
    /// Largest HTTP/2 header block a client may send, in bytes (default 256 KiB). File
    /// field `http2MaxHeaderListBytes`.
    pub http2_max_header_list_size: u32,
    /// HTTP/2 streams reset by the client before the server accepted them, pending at once,
    /// before the connection is closed — the "rapid reset" bound (default 20). File field
    /// `http2MaxPendingAcceptResetStreams`.
    pub http2_max_pending_accept_reset_streams: usize,
    /// HTTP/2 streams the server may reset because of client protocol errors before the
    /// connection is closed (default 1024). File field `http2MaxLocalErrorResetStreams`.
    pub http2_max_local_error_reset_streams: usize,
}

impl Default for ConnectionLimits {
    /// The defaults documented on each field.
    fn default() -> Self {
        Self {
            max_connections: None,
            max_connections_per_ip: 512,
            reserved_connections: 32,
            reserved_connections_per_ip: 2,
            reserve_deadline: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(20),
            http2_max_concurrent_streams: 250,
            http2_max_header_list_size: 256 * 1024,
            http2_max_pending_accept_reset_streams: 20,
            http2_max_local_error_reset_streams: 1024,
        }
    }
}

impl ConnectionLimits {
    /// The global cap of the general budget: [`ConnectionLimits::max_connections`] when
    /// set, else derived from the soft descriptor limit `nofile` (`None` = unlimited).
    pub fn effective_max_connections(&self, nofile: Option<u64>) -> usize {
        if let Some(max) = self.max_connections {
            return max;
        }
        let Some(nofile) = nofile else {
            return AUTO_MAX_CONNECTIONS;
        };
        let budget = nofile
            .saturating_sub(FD_HEADROOM)
            .saturating_sub(self.reserved_connections as u64);
        usize::try_from(budget)
            .unwrap_or(usize::MAX)
            .clamp(MIN_AUTO_MAX_CONNECTIONS, AUTO_MAX_CONNECTIONS)
    }

    /// Check every field: `Err((field, message))` names the config-file field.
    pub(crate) fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.max_connections == Some(0) {
            return Err(("connections.maxConnections", "must be positive".into()));
        }
        if self.max_connections_per_ip == 0 {
            return Err(("connections.maxConnectionsPerIP", "must be positive".into()));
        }
        if self.reserved_connections > 0
            && (self.reserved_connections_per_ip == 0
                || self.reserved_connections_per_ip > self.reserved_connections)
        {
            return Err((
                "connections.reservedConnectionsPerIP",
                format!(
                    "must be between 1 and connections.reservedConnections ({}), got {}",
                    self.reserved_connections, self.reserved_connections_per_ip
                ),
            ));
        }
        for (field, value) in [
            ("connections.reserveDeadlineSeconds", self.reserve_deadline),
            (
                "connections.headerReadTimeoutSeconds",
                self.header_read_timeout,
            ),
            ("connections.idleTimeoutSeconds", self.idle_timeout),
            (
                "connections.http2KeepaliveTimeoutSeconds",
                self.http2_keepalive_timeout,
            ),
        ] {
            if value.is_zero() || value > MAX_DURATION {
                return Err((
                    field,
                    format!(
                        "must be between 1 and {} seconds, got {}",
                        MAX_DURATION.as_secs(),
                        value.as_secs()
                    ),
                ));
            }
        }
        if self
            .http2_keepalive_interval
            .is_some_and(|i| i.is_zero() || i > MAX_DURATION)
        {
            return Err((
                "connections.http2KeepaliveIntervalSeconds",
                format!("must be at most {} seconds", MAX_DURATION.as_secs()),
            ));
        }
        if self.http2_max_concurrent_streams == 0 {
            return Err((
                "connections.http2MaxConcurrentStreams",
                "must be positive".into(),
            ));
        }
        // Below a few KiB ordinary requests (bearer tokens, kubectl's headers) fail.
        if self.http2_max_header_list_size < 16 * 1024 {
            return Err((
                "connections.http2MaxHeaderListBytes",
                "must be at least 16384".into(),
            ));
        }
        if self.http2_max_pending_accept_reset_streams == 0 {
            return Err((
                "connections.http2MaxPendingAcceptResetStreams",
                "must be positive".into(),
            ));
        }
        if self.http2_max_local_error_reset_streams == 0 {
            return Err((
                "connections.http2MaxLocalErrorResetStreams",
                "must be positive".into(),
            ));
        }
        Ok(())
    }

    /// The hyper connection builder with these limits (timers on tokio).
    pub(crate) fn http_builder(
        &self,
    ) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
        use hyper_util::rt::{TokioExecutor, TokioTimer};
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.http2_keepalive_interval)
            .keep_alive_timeout(self.http2_keepalive_timeout)
            .max_concurrent_streams(self.http2_max_concurrent_streams)
            .max_header_list_size(self.http2_max_header_list_size)
            .max_pending_accept_reset_streams(self.http2_max_pending_accept_reset_streams)
            .max_local_error_reset_streams(self.http2_max_local_error_reset_streams);
        builder
    }
}

/// The soft and hard `RLIMIT_NOFILE` (`None` = unlimited) after [`raise_nofile_limit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NofileLimit {
    /// Soft limit before.
    pub before: Option<u64>,
    /// Soft limit now.
    pub soft: Option<u64>,
    /// Hard limit.
    pub hard: Option<u64>,
}

/// Raise the soft `RLIMIT_NOFILE` of this process to its hard limit. Many systems start
/// processes with a soft limit of 1,024, which a crowd of idle connections exhausts (then
/// `accept` fails with "Too many open files" for everyone). Failing to raise it is logged,
/// not fatal: the connection caps are then sized from the current limit.
pub fn raise_nofile_limit() -> NofileLimit {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    if limit.current == limit.maximum {
        tracing::info!(
            soft = ?limit.current,
            hard = ?limit.maximum,
            "file descriptor limit already at its hard limit"
        );
        return NofileLimit {
            before,
            soft: before,
            hard: limit.maximum,
        };
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            let now = getrlimit(Resource::Nofile);
            tracing::info!(
                from = ?before,
                to = ?now.current,
                "raised the file descriptor limit (RLIMIT_NOFILE) to its hard limit"
            );
            NofileLimit {
                before,
                soft: now.current,
                hard: now.maximum,
            }
        }
        Err(error) => {
            tracing::warn!(
                %error,
                soft = ?before,
                hard = ?limit.maximum,
                "could not raise the file descriptor limit (RLIMIT_NOFILE); connection caps are sized from the current one"
            );
            NofileLimit {
                before,
                soft: before,
                hard: limit.maximum,
            }
        }
    }
}

/// Where an accepted connection was admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    General,
    Reserve,
}

#[derive(Debug, Default)]
struct GateCounts {
    general: usize,
    reserve: usize,
    /// Per source IP: (general, reserve). Entries are removed at zero.
    per_ip: HashMap<IpAddr, (usize, usize)>,
}

/// The caps a [`Gate`] admits by: a general budget, all sources together and per source
/// IP, and a reserve beyond it, all sources together and per source IP. The HTTPS listener
/// takes them from [`ConnectionLimits`]; the SSH listener from its own `ssh` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GateCaps {
    pub max_connections: usize,
    pub max_per_ip: usize,
    pub reserve: usize,
    pub reserve_per_ip: usize,
}

/// Admission control of accepted connections (see the module documentation). Shared by
/// the HTTPS listeners and the SSH listener (each has its own gate).
#[derive(Debug)]
pub(crate) struct Gate {
    /// Which listener, for log lines.
    listener: &'static str,
    max_connections: usize,
    max_per_ip: usize,
    reserve: usize,
    reserve_per_ip: usize,
    counts: Mutex<GateCounts>,
    refused: AtomicU64,
    /// Milliseconds since `started` of the last "refused" warning (rate-limits the log).
    last_warned_ms: AtomicU64,
    started: Instant,
}

/// How often at most a refused connection is logged at `warn`.
const REFUSAL_WARN_INTERVAL: Duration = Duration::from_secs(10);

impl Gate {
    /// The HTTPS listeners' gate.
    pub(crate) fn new(limits: &ConnectionLimits, nofile: Option<u64>) -> Arc<Gate> {
        Gate::with_caps(
            "https",
            GateCaps {
                max_connections: limits.effective_max_connections(nofile),
                max_per_ip: limits.max_connections_per_ip,
                reserve: limits.reserved_connections,
                reserve_per_ip: limits.reserved_connections_per_ip,
            },
        )
    }

    /// A gate with `caps`, for the listener named `listener` in its log lines.
    pub(crate) fn with_caps(listener: &'static str, caps: GateCaps) -> Arc<Gate> {
        tracing::info!(
            listener,
            max_connections = caps.max_connections,
            max_connections_per_ip = caps.max_per_ip,
            reserved_connections = caps.reserve,
            reserved_connections_per_ip = caps.reserve_per_ip,
            "connection limits"
        );
        Arc::new(Gate {
            listener,
            max_connections: caps.max_connections,
            max_per_ip: caps.max_per_ip,
            reserve: caps.reserve,
            reserve_per_ip: caps.reserve_per_ip,
            counts: Mutex::default(),
            refused: AtomicU64::new(0),
            last_warned_ms: AtomicU64::new(0),
            started: Instant::now(),
        })
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, GateCounts> {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admit a connection from `ip`, or `None` when both the budget and the reserve are
    /// exhausted for it (the caller closes it).
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        let ip = canonical(ip);
        let admission = {
            let mut counts = self.counts();
            let (ip_general, ip_reserve) = counts.per_ip.get(&ip).copied().unwrap_or((0, 0));
            let admission = if counts.general < self.max_connections && ip_general < self.max_per_ip
            {
                counts.general += 1;
                Some(Admission::General)
            } else if counts.reserve < self.reserve && ip_reserve < self.reserve_per_ip {
                counts.reserve += 1;
                Some(Admission::Reserve)
            } else {
                None
            };
            if let Some(admission) = admission {
                let entry = counts.per_ip.entry(ip).or_default();
                match admission {
                    Admission::General => entry.0 += 1,
                    Admission::Reserve => entry.1 += 1,
                }
            }
            admission
        };
        match admission {
            Some(admission) => Some(Permit {
                gate: Arc::clone(self),
                ip,
                admission,
            }),
            None => {
                let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
                let last = self.last_warned_ms.load(Ordering::Relaxed);
                let interval = REFUSAL_WARN_INTERVAL.as_millis() as u64;
                if (last == 0 || now.saturating_sub(last) >= interval)
                    && self
                        .last_warned_ms
                        .compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                {
                    tracing::warn!(
                        listener = self.listener,
                        %ip,
                        refused_total = refused,
                        max_connections = self.max_connections,
                        max_connections_per_ip = self.max_per_ip,
                        "connection refused: connection limit and reserve exhausted"
                    );
                } else {
                    tracing::debug!(
                        listener = self.listener,
                        %ip,
                        "connection refused: connection limit reached"
                    );
                }
                None
            }
        }
    }

    /// The global cap of the general budget.
    pub(crate) fn max_connections(&self) -> usize {
        self.max_connections
    }

    /// Connections refused since start.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Open connections in the general budget and in the reserve.
    pub(crate) fn open_connections(&self) -> (usize, usize) {
        let counts = self.counts();
        (counts.general, counts.reserve)
    }
}

/// IPv4-mapped IPv6 addresses count as their IPv4 address (a dual-stack listener sees them).
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One admitted connection's slot, released on drop (when the socket is closed).
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<Gate>,
    ip: IpAddr,
    admission: Admission,
}

impl Permit {
    pub(crate) fn admission(&self) -> Admission {
        self.admission
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut counts = self.gate.counts();
        match self.admission {
            Admission::General => counts.general = counts.general.saturating_sub(1),
            Admission::Reserve => counts.reserve = counts.reserve.saturating_sub(1),
        }
        if let Some(entry) = counts.per_ip.get_mut(&self.ip) {
            match self.admission {
                Admission::General => entry.0 = entry.0.saturating_sub(1),
                Admission::Reserve => entry.1 = entry.1.saturating_sub(1),
            }
            if *entry == (0, 0) {
                counts.per_ip.remove(&self.ip);
            }
        }
    }
}

/// A socket that holds its connection's [`Permit`] until it is dropped — also after an
/// HTTP upgrade hands the socket to a tunnel.
#[derive(Debug)]
pub(crate) struct Counted<S> {
    io: S,
    _permit: Permit,
}

impl<S> Counted<S> {
    pub(crate) fn new(io: S, permit: Permit) -> Self {
        Self {
            io,
            _permit: permit,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Request activity of one connection, for the idle timeout.
#[derive(Clone, Copy, Debug)]
struct ActivityState {
    /// Requests in flight (until their response body is done).
    active: usize,
    /// Requests seen so far.
    requests: u64,
    /// When `active` last became 0 (or the handshake ended).
    idle_since: Instant,
    /// An upgrade succeeded: the connection carries a tunnel and is never idle.
    tunneling: bool,
}

/// Tracks a connection's requests; [`Activity::idle_expired`] fires when it has been idle
/// too long.
#[derive(Debug)]
pub(crate) struct Activity {
    state: tokio::sync::watch::Sender<ActivityState>,
}

/// Holds one request as in flight until dropped (with the response body).
#[derive(Debug)]
struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.state.send_modify(|s| {
            s.active = s.active.saturating_sub(1);
            if s.active == 0 {
                s.idle_since = Instant::now();
            }
        });
    }
}

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: tokio::sync::watch::Sender::new(ActivityState {
                active: 0,
                requests: 0,
                idle_since: Instant::now(),
                tunneling: false,
            }),
        })
    }

    fn start(self: &Arc<Self>) -> RequestGuard {
        self.state.send_modify(|s| {
            s.active += 1;
            s.requests += 1;
        });
        RequestGuard(Arc::clone(self))
    }

    fn mark_tunneling(&self) {
        self.state.send_modify(|s| s.tunneling = true);
    }

    /// Resolves once the connection has had no request in flight for `idle` (`first`
    /// before its first request); never while a request runs or after an upgrade.
    pub(crate) async fn idle_expired(&self, first: Duration, idle: Duration) {
        let mut changes = self.state.subscribe();
        loop {
            let state = *changes.borrow_and_update();
            let deadline = if state.tunneling || state.active > 0 {
                None
            } else if state.requests == 0 {
                Some(state.idle_since + first)
            } else {
                Some(state.idle_since + idle)
            };
            match deadline {
                None => {
                    if changes.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                }
                Some(deadline) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(deadline.into()) => return,
                        changed = changes.changed() => if changed.is_err() {
                            return std::future::pending().await;
                        },
                    }
                }
            }
        }
    }
}

/// A response body that keeps its request in flight until it is dropped (sent or
/// abandoned). Forwards the size hint, so responses keep their `Content-Length`.
struct TrackedBody {
    inner: Body,
    _in_flight: RequestGuard,
}

impl http_body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `request` is a health probe (served on probe-only reserve connections).
fn is_probe(request: &Request<Incoming>) -> bool {
    request.method() == http::Method::GET && PROBE_PATHS.contains(&request.uri().path())
}

/// The answer to a non-probe request on a probe-only reserve connection.
fn at_capacity() -> Response {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server is at its connection limit: this connection is served for health probes and admin clients only; retry later",
        "reason": "ServiceUnavailable", "code": 503,
    });
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::RETRY_AFTER, "1"),
            (header::CONNECTION, "close"),
        ],
        body.to_string(),
    )
        .into_response()
}

/// Wrap a connection's service: count its requests in `activity` (a request stays in
/// flight until its response body is dropped), note upgrades, and on a `probe_only`
/// connection answer anything but a health probe with 503.
pub(crate) fn track<S>(
    inner: S,
    activity: Arc<Activity>,
    probe_only: bool,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
> + Clone
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    hyper::service::service_fn(move |request: Request<Incoming>| {
        let guard = activity.start();
        let activity = Arc::clone(&activity);
        let connect = request.method() == http::Method::CONNECT;
        let refused = probe_only && !is_probe(&request);
        let call = (!refused).then(|| inner.call(request));
        async move {
            let Some(call) = call else {
                drop(guard);
                return Ok(at_capacity());
            };
            let response = call.await?;
            let status = response.status();
            if status == StatusCode::SWITCHING_PROTOCOLS || (connect && status.is_success()) {
                activity.mark_tunneling();
            }
            Ok(response.map(|body| {
                Body::new(TrackedBody {
                    inner: body,
                    _in_flight: guard,
                })
            }))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(
        max: usize,
        per_ip: usize,
        reserve: usize,
        reserve_per_ip: usize,
    ) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: Some(max),
            max_connections_per_ip: per_ip,
            reserved_connections: reserve,
            reserved_connections_per_ip: reserve_per_ip,
            ..ConnectionLimits::default()
        }
    }

    #[test]
    fn gate_admits_per_ip_then_reserve_then_refuses() {
        let gate = Gate::new(&limits(3, 2, 2, 1), None);
        let a: IpAddr = "127.0.0.2".parse().expect("ip");
        let b: IpAddr = "127.0.0.3".parse().expect("ip");
        let a1 = gate.admit(a).expect("a1");
        let a2 = gate.admit(a).expect("a2");
        assert_eq!(a1.admission(), Admission::General);
        assert_eq!(a2.admission(), Admission::General);
        // Per-IP budget full: into the reserve, one slot per IP.
        let a3 = gate.admit(a).expect("a3");
        assert_eq!(a3.admission(), Admission::Reserve);
        assert!(gate.admit(a).is_none(), "a's reserve share is used");
        // Another IP still has general budget (global 3).
        let b1 = gate.admit(b).expect("b1");
        assert_eq!(b1.admission(), Admission::General);
        // Global budget full: b goes to the reserve, then nothing is left.
        let b2 = gate.admit(b).expect("b2");
        assert_eq!(b2.admission(), Admission::Reserve);
        assert!(gate.admit(b).is_none());
        assert_eq!(gate.open_connections(), (3, 2));
        assert_eq!(gate.refused(), 2);
        // Closing releases the slots.
        drop((a1, a3));
        assert_eq!(gate.open_connections(), (2, 1));
        assert_eq!(
            gate.admit(a).expect("again").admission(),
            Admission::General
        );
        drop((a2, b1, b2));
        assert_eq!(gate.open_connections(), (0, 0));
        assert!(gate.counts().per_ip.is_empty());
    }

    #[test]
    fn tracked_bodies_keep_their_size_and_their_request_in_flight() {
        use http_body::Body as _;
        let activity = Activity::new();
        let body = TrackedBody {
            inner: Body::from("hello"),
            _in_flight: activity.start(),
        };
        // Without the exact size hint hyper would switch to chunked encoding.
        assert_eq!(body.size_hint().exact(), Some(5));
        assert_eq!(activity.state.borrow().active, 1);
        drop(body);
        let state = *activity.state.borrow();
        assert_eq!((state.active, state.requests), (0, 1));
    }

    #[test]
    fn ipv4_mapped_addresses_share_the_ipv4_budget() {
        let gate = Gate::new(&limits(10, 1, 0, 0), None);
        let _v4 = gate.admit("10.0.0.1".parse().expect("ip")).expect("v4");
        assert!(gate.admit("::ffff:10.0.0.1".parse().expect("ip")).is_none());
    }

    #[test]
    fn automatic_cap_follows_the_descriptor_limit() {
        let auto = ConnectionLimits::default();
        assert_eq!(
            auto.effective_max_connections(Some(1024)),
            1024 - FD_HEADROOM as usize - auto.reserved_connections
        );
        assert_eq!(
            auto.effective_max_connections(Some(100)),
            MIN_AUTO_MAX_CONNECTIONS
        );
        assert_eq!(auto.effective_max_connections(None), AUTO_MAX_CONNECTIONS);
        assert_eq!(
            auto.effective_max_connections(Some(10_000_000)),
            AUTO_MAX_CONNECTIONS
        );
        assert_eq!(limits(7, 1, 0, 0).effective_max_connections(Some(1024)), 7);
    }

    #[test]
    fn nofile_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{Resource, getrlimit};
        let limit = raise_nofile_limit();
        let now = getrlimit(Resource::Nofile);
        assert_eq!(limit.soft, now.current);
        assert_eq!(limit.hard, now.maximum);
        // Raising to the hard limit never needs privileges.
        assert_eq!(
            now.current, now.maximum,
            "soft limit left below the hard limit"
        );
        assert!(limit.before <= limit.soft || limit.soft.is_none());
    }

    #[test]
    fn validation_names_the_field() {
        type Change = fn(&mut ConnectionLimits);
        let cases: [(Change, &str); 8] = [
            (
                |l| l.max_connections = Some(0),
                "connections.maxConnections",
            ),
            (
                |l| l.max_connections_per_ip = 0,
                "connections.maxConnectionsPerIP",
            ),
            (
                |l| l.reserved_connections_per_ip = 100,
                "connections.reservedConnectionsPerIP",
            ),
            (
                |l| l.header_read_timeout = Duration::ZERO,
                "connections.headerReadTimeoutSeconds",
            ),
            (
                |l| l.idle_timeout = Duration::from_secs(u64::MAX),
                "connections.idleTimeoutSeconds",
            ),
            (
                |l| l.http2_max_concurrent_streams = 0,
                "connections.http2MaxConcurrentStreams",
            ),
            (
                |l| l.http2_max_header_list_size = 10,
                "connections.http2MaxHeaderListBytes",
            ),
            (
                |l| l.http2_max_pending_accept_reset_streams = 0,
                "connections.http2MaxPendingAcceptResetStreams",
            ),
        ];
        assert!(ConnectionLimits::default().validate().is_ok());
        for (change, field) in cases {
            let mut l = ConnectionLimits::default();
            change(&mut l);
            let (got, _) = l.validate().expect_err(field);
            assert_eq!(got, field);
        }
    }
}
