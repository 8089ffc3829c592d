//! The agent's connection loop: keep one tunnel session to every configured server.
//!
//! For each server URL an independent task loops: TCP connect, TLS (tokio-rustls, with the
//! *current* client config from [`ClientConfig::tls`], so renewed certificates are used on
//! the next connection), WebSocket upgrade to `wss://host:port/api/connect` (header
//! `X-Rlark-Node` for node agents), then a mux session ([`Role::Client`]) whose incoming
//! streams are served by [`agent::serve`]. When the session ends the task reconnects after a
//! capped exponential backoff with full jitter ([`backoff_delay`]); the attempt counter is
//! reset after a session that lasted at least [`STABLE_SESSION`]. Servers are independent:
//! an agent given several hub replicas is connected to all of them (no load balancer).
//!
//! Two entry points: [`run`] (the contract's; runs until `shutdown` and every server task has
//! stopped) and [`spawn`], which returns a [`ClientHandle`] telling which servers are
//! connected right now ([`ClientHandle::connected`], [`ClientHandle::wait_connected`]) —
//! for tests and status reporting. [`run_with_observer`] is [`run`] publishing the same list
//! to a caller's `watch` channel.
//!
//! Streams also go the other way: [`HubStreams`] ([`ClientConfig::hub`], also
//! [`ClientHandle::hub`]) opens streams from the agent towards the hub on the newest live
//! session — the pod network's relay streams ([`HubStreams::open_relay`]).

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::tungstenite::Error as WsError;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::{self, AgentConfig};
use crate::dial::{self, DialError};
use crate::header::{Status, StreamRequest};
use crate::mux::{Control, MuxConfig, MuxStream, Role, Session};
use crate::relay::RelayHeader;
use crate::transport::{self, ReadAhead, WsTransport};

/// Path of the tunnel endpoint on the hub (appended to the server URL's path).
pub const CONNECT_PATH: &str = "/api/connect";
/// Header naming the node, sent by node agents.
pub const NODE_HEADER: &str = "x-rlark-node";
/// Bound on one connection attempt: TCP connect, TLS handshake and WebSocket upgrade.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A session that lasted at least this long resets the backoff.
pub const STABLE_SESSION: Duration = Duration::from_secs(10);
/// After `shutdown`, how long a session may take to close (GOAWAY, WebSocket close).
const CLOSE_WAIT: Duration = Duration::from_secs(3);

/// What the agent connects to and how.
#[derive(Clone)]
pub struct ClientConfig {
    /// `https://host[:port][/prefix]` (or `wss://...`) each; one connection per entry,
    /// independently. The default port is 443.
    pub servers: Vec<String>,
    /// The current TLS client config (CA + agent certificate); read at every connection
    /// attempt, so a renewed certificate is used from the next connection on.
    pub tls: watch::Receiver<Arc<rustls::ClientConfig>>,
    /// Multiplexer settings for every session (windows, stream limit, keep-alive).
    pub mux: MuxConfig,
    /// How the agent serves the streams the hub opens (TCP dials, local API, relays).
    pub agent: AgentConfig,
    /// Backoff bounds: the delay before reconnect attempt `n` is uniform in
    /// `[0, min(backoff_max, backoff_min * 2^n)]` (full jitter). Defaults 1 s and 30 s.
    pub backoff_min: Duration,
    /// Upper backoff bound: no reconnect waits longer than this (see `backoff_min`).
    pub backoff_max: Duration,
    /// Sent as `X-Rlark-Node` (node agents); `None` for a cluster agent.
    pub node: Option<String>,
    /// More servers, discovered at run time (the hub's `GET /rlark/v1/replicas`, polled by
    /// the agent): every URL in the latest list that is not in [`ClientConfig::servers`]
    /// gets its own connection loop, and loses it when a later list drops it. `None`: the
    /// configured servers only.
    pub discovered: Option<watch::Receiver<Vec<String>>>,
    /// Where the client registers its live sessions, so the agent can open streams towards
    /// the hub. [`ClientConfig::new`] makes an empty one; clone it before [`spawn`]ing to
    /// hand it to code built before the client (e.g. the pod network's router).
    pub hub: HubStreams,
}

impl ClientConfig {
    /// A config with the defaults: default mux and agent settings, backoff 1 s .. 30 s,
    /// no node name.
    pub fn new(servers: Vec<String>, tls: watch::Receiver<Arc<rustls::ClientConfig>>) -> Self {
        ClientConfig {
            servers,
            tls,
            mux: MuxConfig::default(),
            agent: AgentConfig::default(),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            node: None,
            discovered: None,
            hub: HubStreams::new(),
        }
    }
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("servers", &self.servers)
            .field("mux", &self.mux)
            .field("agent", &self.agent)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("node", &self.node)
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

/// Why one connection attempt failed (logged; the loop retries).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server URL cannot be used (not retried).
    #[error("invalid server URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as configured or discovered.
        url: String,
        /// What is wrong with it (scheme, host, port, ...).
        reason: String,
    },
    /// The node name is not a valid header value (not retried).
    #[error("invalid node name {0:?} for the {NODE_HEADER} header")]
    BadNode(String),
    /// The TCP connection to the server could not be made.
    #[error("TCP connect to {addr}: {source}")]
    Tcp {
        /// The `host:port` dialled.
        addr: String,
        /// The I/O error from the connect.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (server certificate not trusted, client certificate
    /// rejected, connection dropped, ...).
    #[error("TLS handshake with {host}: {source}")]
    Tls {
        /// The server name the certificate was checked against.
        host: String,
        /// The handshake error, as rustls reports it through tokio-rustls.
        #[source]
        source: std::io::Error,
    },
    /// The server answered the upgrade with an HTTP error (401/403: certificate not
    /// accepted, 404: no tunnel endpoint, ...).
    #[error("websocket upgrade refused: HTTP {status}{}", body_suffix(.body))]
    Refused {
        /// The HTTP status of the answer.
        status: http::StatusCode,
        /// The start of the answer's body (at most 256 bytes, control characters replaced
        /// by spaces), empty if there was none.
        body: String,
    },
    /// The WebSocket upgrade failed for another reason (bad answer, I/O error, ...).
    #[error("websocket handshake: {0}")]
    Handshake(#[source] WsError),
    /// TCP connect, TLS handshake and upgrade together took longer than the carried bound
    /// ([`CONNECT_TIMEOUT`]).
    #[error("no connection within {0:?}")]
    Timeout(Duration),
}

fn body_suffix(body: &str) -> String {
    if body.is_empty() {
        String::new()
    } else {
        format!(": {body}")
    }
}

impl ConnectError {
    /// Whether retrying can help (a bad URL or node name never gets better).
    pub fn is_permanent(&self) -> bool {
        matches!(self, ConnectError::BadUrl { .. } | ConnectError::BadNode(_))
    }

    fn from_ws(e: WsError) -> Self {
        match e {
            WsError::Http(response) => {
                let status = response.status();
                let body = response
                    .body()
                    .as_deref()
                    .map(|b| {
                        let text = String::from_utf8_lossy(&b[..b.len().min(256)]);
                        text.trim().replace(|c: char| c.is_control(), " ")
                    })
                    .unwrap_or_default();
                ConnectError::Refused { status, body }
            }
            other => ConnectError::Handshake(other),
        }
    }
}

/// One parsed server URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// As configured (the name in logs and in the connected list).
    url: String,
    /// Host without IPv6 brackets.
    host: String,
    port: u16,
    /// `wss://host:port/prefix/api/connect`.
    ws_uri: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, ConnectError> {
        let bad = |reason: &str| ConnectError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
        match uri.scheme_str() {
            Some("https" | "wss") => {}
            Some(other) => return Err(bad(&format!("scheme {other:?}: use https://"))),
            None => return Err(bad("no scheme: use https://host:port")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if authority.as_str().contains('@') {
            return Err(bad("user info is not supported"));
        }
        let host_in_uri = authority.host();
        if host_in_uri.is_empty() {
            return Err(bad("no host"));
        }
        let host = host_in_uri
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host_in_uri)
            .to_owned();
        let port = authority.port_u16().unwrap_or(443);
        let prefix = uri.path().trim_end_matches('/');
        Ok(Target {
            url: url.to_owned(),
            ws_uri: format!("wss://{host_in_uri}:{port}{prefix}{CONNECT_PATH}"),
            host,
            port,
        })
    }

    fn server_name(&self) -> Result<ServerName<'static>, ConnectError> {
        if let Ok(ip) = self.host.parse::<IpAddr>() {
            return Ok(ServerName::IpAddress(ip.into()));
        }
        ServerName::try_from(self.host.clone()).map_err(|e| ConnectError::BadUrl {
            url: self.url.clone(),
            reason: format!("host is not a valid TLS server name: {e}"),
        })
    }
}

/// The delay before reconnect attempt `attempt` (0-based): uniform in
/// `[0, min(max, min * 2^attempt)]` ("full jitter"), drawn from `random`.
pub fn backoff_delay(attempt: u32, min: Duration, max: Duration, random: u64) -> Duration {
    let ceiling = min
        .as_nanos()
        .saturating_mul(1u128 << attempt.min(64))
        .min(max.as_nanos());
    let nanos = u128::from(random) % (ceiling + 1);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// 64 random bits from the OS generator (via a v4 UUID; folding the halves covers its
/// fixed version and variant bits).
fn random_u64() -> u64 {
    let v = uuid::Uuid::new_v4().as_u128();
    ((v >> 64) as u64) ^ (v as u64)
}

/// Runs the agent's connection loop until `shutdown` is cancelled: one independent task per
/// server. Returns once every server task has stopped (after `shutdown`; or, without it, when
/// every server URL was invalid).
pub async fn run(config: ClientConfig, shutdown: CancellationToken) {
    let (observer, _) = watch::channel(Vec::new());
    run_with_observer(config, shutdown, observer).await;
}

/// [`run`], publishing the URLs of the servers with an established session (in
/// configuration order) to `observer` whenever that set changes.
pub async fn run_with_observer(
    config: ClientConfig,
    shutdown: CancellationToken,
    observer: watch::Sender<Vec<String>>,
) {
    let servers = config.servers.clone();
    let mut discovered = config.discovered.clone();
    let config = Arc::new(config);
    let observer = Arc::new(observer);
    let mut tasks = JoinSet::new();
    let spawn_loop = |tasks: &mut JoinSet<()>, url: String, stop: CancellationToken| {
        let span = tracing::info_span!("tunnel_client", server = %url);
        tasks.spawn(server_loop(url, config.clone(), stop, observer.clone()).instrument(span));
    };
    for url in servers {
        spawn_loop(&mut tasks, url, shutdown.clone());
    }
    // Loops of discovered servers, each with its own stop token (a child of `shutdown`).
    let mut extra: std::collections::HashMap<String, CancellationToken> = Default::default();
    if let Some(rx) = discovered.as_mut() {
        // A list published before this client started counts too.
        let latest = rx.borrow_and_update().clone();
        update_discovered(&config, latest, &mut extra, &shutdown, |url, stop| {
            spawn_loop(&mut tasks, url, stop)
        });
    }
    loop {
        if tasks.is_empty() && (discovered.is_none() || shutdown.is_cancelled()) {
            break;
        }
        tokio::select! {
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            listed = next_list(&mut discovered), if discovered.is_some() && !shutdown.is_cancelled() => {
                match listed {
                    Some(latest) => update_discovered(&config, latest, &mut extra, &shutdown, |url, stop| {
                        spawn_loop(&mut tasks, url, stop)
                    }),
                    // The sender is gone: keep what runs, stop listening.
                    None => discovered = None,
                }
            }
            _ = shutdown.cancelled(), if tasks.is_empty() => {}
        }
    }
}

/// The next discovered list; `None` once its sender is gone.
async fn next_list(discovered: &mut Option<watch::Receiver<Vec<String>>>) -> Option<Vec<String>> {
    let rx = discovered.as_mut()?;
    rx.changed().await.ok()?;
    Some(rx.borrow_and_update().clone())
}

/// Start loops for newly discovered servers (not configured, not running) and stop the
/// loops of discovered servers no longer listed.
fn update_discovered(
    config: &ClientConfig,
    latest: Vec<String>,
    extra: &mut std::collections::HashMap<String, CancellationToken>,
    shutdown: &CancellationToken,
    mut spawn: impl FnMut(String, CancellationToken),
) {
    let configured = |url: &str| config.servers.iter().any(|s| same_server(s, url));
    extra.retain(|url, stop| {
        let keep = latest.iter().any(|u| same_server(u, url));
        if !keep {
            tracing::info!(server = %url, "server no longer listed by the hub; disconnecting");
            stop.cancel();
        }
        keep
    });
    for url in latest {
        if configured(&url) || extra.keys().any(|u| same_server(u, &url)) {
            continue;
        }
        tracing::info!(server = %url, "hub listed another server replica; connecting");
        let stop = shutdown.child_token();
        extra.insert(url.clone(), stop.clone());
        spawn(url, stop);
    }
}

/// Whether two server URLs name the same endpoint (scheme `https`/`wss` alike, case of the
/// host and a trailing slash ignored).
fn same_server(a: &str, b: &str) -> bool {
    fn norm(url: &str) -> String {
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("wss://"))
            .unwrap_or(url);
        rest.trim_end_matches('/').to_ascii_lowercase()
    }
    norm(a) == norm(b)
}

/// The agent's live tunnel sessions, for opening streams towards the hub (agent-opened
/// streams: the pod network's relay). Cheap to clone; every clone sees the same sessions.
/// A session is listed from the moment its mux session starts until it ends.
#[derive(Clone, Default)]
pub struct HubStreams {
    inner: Arc<Mutex<HubSessions>>,
}

#[derive(Default)]
struct HubSessions {
    /// Sequence number of the next session (newer sessions have larger numbers).
    next: u64,
    /// (sequence, server URL, session), oldest first.
    live: Vec<(u64, String, Control)>,
}

impl fmt::Debug for HubStreams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HubStreams")
            .field("servers", &self.servers())
            .finish()
    }
}

impl HubStreams {
    /// An empty registry (what [`ClientConfig::new`] uses).
    pub fn new() -> Self {
        HubStreams::default()
    }

    /// The servers of the live sessions, newest first.
    pub fn servers(&self) -> Vec<String> {
        self.newest_first()
            .into_iter()
            .map(|(url, _)| url)
            .collect()
    }

    /// Opens a relay stream towards the hub carrying `header` and waits (at most
    /// `timeout`) for the hub's answer, which is the destination's answer when the hub
    /// forwarded the flow. Uses the newest live session; when that session turns out to
    /// be closing, the next newest. Ok: the stream positioned at the first payload byte.
    /// Err: the answer's status and message, [`Status::BadRequest`] for a header that
    /// cannot be encoded, [`Status::NoSuchAgent`] when no session to the hub is up.
    pub async fn open_relay(
        &self,
        header: &RelayHeader,
        timeout: Duration,
    ) -> Result<MuxStream, DialError> {
        let request = header
            .to_request()
            .map_err(|e| DialError::new(Status::BadRequest, e.to_string()))?;
        self.open(&request, timeout).await
    }

    /// Opens a stream towards the hub with any request header (see
    /// [`HubStreams::open_relay`]; the hub serves only `relay`).
    pub async fn open(
        &self,
        request: &StreamRequest,
        timeout: Duration,
    ) -> Result<MuxStream, DialError> {
        let mut last = None;
        for (url, control) in self.newest_first() {
            if control.is_closed() {
                continue;
            }
            match dial::open(&control, request, timeout).await {
                // The session went away under us (not the hub's answer): try the next one.
                Err(e) if e.status == Status::NoSuchAgent && control.is_closed() => {
                    tracing::debug!(server = %url, error = %e, "hub session closed while opening; trying the next");
                    last = Some(e);
                }
                result => return result,
            }
        }
        Err(last.unwrap_or_else(|| {
            DialError::new(Status::NoSuchAgent, "no tunnel session to the hub is up")
        }))
    }

    fn newest_first(&self) -> Vec<(String, Control)> {
        let sessions = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        sessions
            .live
            .iter()
            .rev()
            .map(|(_, url, control)| (url.clone(), control.clone()))
            .collect()
    }

    /// Lists `control` until the returned guard is dropped.
    fn register(&self, url: &str, control: Control) -> RegisteredSession {
        let mut sessions = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let seq = sessions.next;
        sessions.next += 1;
        sessions.live.push((seq, url.to_owned(), control));
        RegisteredSession {
            hub: self.clone(),
            seq,
        }
    }
}

/// Removes a session from [`HubStreams`] when dropped.
struct RegisteredSession {
    hub: HubStreams,
    seq: u64,
}

impl Drop for RegisteredSession {
    fn drop(&mut self) {
        let mut sessions = self.hub.inner.lock().unwrap_or_else(|e| e.into_inner());
        sessions.live.retain(|(seq, _, _)| *seq != self.seq);
    }
}

/// Handle to a client started with [`spawn`].
#[derive(Debug)]
pub struct ClientHandle {
    connected: watch::Receiver<Vec<String>>,
    hub: HubStreams,
    task: tokio::task::JoinHandle<()>,
}

/// Starts [`run`] in a task and returns a handle that tells which servers are connected.
pub fn spawn(config: ClientConfig, shutdown: CancellationToken) -> ClientHandle {
    let (observer, connected) = watch::channel(Vec::new());
    let hub = config.hub.clone();
    let task = tokio::spawn(run_with_observer(config, shutdown, observer));
    ClientHandle {
        connected,
        hub,
        task,
    }
}

impl ClientHandle {
    /// Opens streams towards the hub on this client's live sessions (the same registry as
    /// [`ClientConfig::hub`]).
    pub fn hub(&self) -> HubStreams {
        self.hub.clone()
    }

    /// The servers (URLs as configured, in configuration order) with an established
    /// session right now.
    pub fn connected(&self) -> Vec<String> {
        self.connected.borrow().clone()
    }

    /// A receiver of the connected list, to wait for any condition.
    pub fn watch(&self) -> watch::Receiver<Vec<String>> {
        self.connected.clone()
    }

    /// Waits until at least `n` servers are connected; `false` if the client stopped first.
    pub async fn wait_connected(&self, n: usize) -> bool {
        let mut rx = self.connected.clone();
        rx.wait_for(|servers| servers.len() >= n).await.is_ok()
    }

    /// Waits until the client has stopped (after `shutdown` was cancelled).
    pub async fn join(self) {
        if let Err(e) = self.task.await {
            tracing::error!(error = %e, "tunnel client task failed");
        }
    }
}

/// Lists this server in the observer's list (kept in configuration order) while alive.
struct Listed<'a> {
    observer: &'a watch::Sender<Vec<String>>,
    url: &'a str,
}

impl<'a> Listed<'a> {
    fn new(observer: &'a watch::Sender<Vec<String>>, url: &'a str, order: &[String]) -> Self {
        observer.send_modify(|list| {
            list.push(url.to_owned());
            // Configured servers in configuration order, then discovered ones.
            list.sort_by_key(|u| order.iter().position(|s| s == u).unwrap_or(usize::MAX));
        });
        Listed { observer, url }
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.observer.send_modify(|list| {
            if let Some(pos) = list.iter().position(|u| u == self.url) {
                list.remove(pos);
            }
        });
    }
}

/// The connection loop for one server.
async fn server_loop(
    url: String,
    config: Arc<ClientConfig>,
    shutdown: CancellationToken,
    observer: Arc<watch::Sender<Vec<String>>>,
) {
    let target = match Target::parse(&url) {
        Ok(target) => target,
        Err(e) => {
            tracing::error!(error = %e, "tunnel server not usable; not connecting to it");
            return;
        }
    };
    let mut attempt: u32 = 0;
    loop {
        let connecting = tokio::time::timeout(CONNECT_TIMEOUT, connect(&target, &config));
        let result = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = connecting => r.unwrap_or(Err(ConnectError::Timeout(CONNECT_TIMEOUT))),
        };
        match result {
            Ok(transport) => {
                let started = tokio::time::Instant::now();
                tracing::info!(attempt, "tunnel connected");
                let (control, incoming) = Session::new(transport, Role::Client, config.mux.clone());
                let serving = tokio::spawn(
                    agent::serve(incoming, config.agent.clone())
                        .instrument(tracing::Span::current()),
                );
                let stopping = {
                    let _registered = config.hub.register(&target.url, control.clone());
                    let _listed = Listed::new(&observer, &target.url, &config.servers);
                    tokio::select! {
                        _ = control.closed() => false,
                        _ = shutdown.cancelled() => true,
                    }
                };
                if stopping {
                    control.close();
                    let _ = tokio::time::timeout(CLOSE_WAIT, control.closed()).await;
                    serving.abort();
                    tracing::info!("tunnel closed (shutdown)");
                    return;
                }
                serving.abort();
                let lasted = started.elapsed();
                if lasted >= STABLE_SESSION {
                    attempt = 0;
                }
                let delay = next_delay(&config, &mut attempt);
                tracing::warn!(?lasted, retry_in = ?delay, "tunnel session ended; reconnecting");
                if sleep_or_shutdown(delay, &shutdown).await {
                    return;
                }
            }
            Err(e) if e.is_permanent() => {
                tracing::error!(error = %e, "tunnel server not usable; not connecting to it");
                return;
            }
            Err(e) => {
                let delay = next_delay(&config, &mut attempt);
                tracing::warn!(
                    attempt,
                    error = %e,
                    retry_in = ?delay,
                    "tunnel connect failed: {e}"
                );
                if sleep_or_shutdown(delay, &shutdown).await {
                    return;
                }
            }
        }
    }
}

fn next_delay(config: &ClientConfig, attempt: &mut u32) -> Duration {
    let delay = backoff_delay(
        *attempt,
        config.backoff_min,
        config.backoff_max,
        random_u64(),
    );
    *attempt = attempt.saturating_add(1);
    delay
}

/// Sleeps `delay`; true if `shutdown` was cancelled meanwhile.
async fn sleep_or_shutdown(delay: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = shutdown.cancelled() => true,
        _ = tokio::time::sleep(delay) => false,
    }
}

/// The TLS config for one attempt: the current one, offering only HTTP/1.1 by ALPN (the
/// WebSocket upgrade is an HTTP/1.1 request; a server picking h2 would break it).
fn current_tls(config: &ClientConfig) -> Arc<rustls::ClientConfig> {
    let current = config.tls.borrow().clone();
    let http11: &[u8] = b"http/1.1";
    if current.alpn_protocols.is_empty() || current.alpn_protocols == [http11] {
        current
    } else {
        let mut adjusted = (*current).clone();
        adjusted.alpn_protocols = vec![http11.to_vec()];
        Arc::new(adjusted)
    }
}

/// One connection attempt: TCP, TLS, WebSocket upgrade.
async fn connect(
    target: &Target,
    config: &ClientConfig,
) -> Result<WsTransport<TlsStream<ReadAhead<TcpStream>>>, ConnectError> {
    let server_name = target.server_name()?;
    let mut request =
        target
            .ws_uri
            .as_str()
            .into_client_request()
            .map_err(|e| ConnectError::BadUrl {
                url: target.url.clone(),
                reason: e.to_string(),
            })?;
    if let Some(node) = &config.node {
        let value = HeaderValue::from_str(node).map_err(|_| ConnectError::BadNode(node.clone()))?;
        request.headers_mut().insert(NODE_HEADER, value);
    }
    let tcp = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|source| ConnectError::Tcp {
            addr: format!("{}:{}", target.host, target.port),
            source,
        })?;
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "set TCP_NODELAY");
    }
    let mut tls = TlsConnector::from(current_tls(config))
        .connect(server_name, ReadAhead::new(tcp))
        .await
        .map_err(|source| ConnectError::Tls {
            host: target.host.clone(),
            source,
        })?;
    tls.get_mut()
        .1
        .set_buffer_limit(Some(transport::TLS_BUFFER_LIMIT));
    let (ws, _response) = transport::connect(request, tls)
        .await
        .map_err(ConnectError::from_ws)?;
    Ok(ws)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

    use super::*;
    use crate::dial;
    use crate::header::StreamRequest;
    use crate::mux::Control;

    #[test]
    fn backoff_bounds_cap_and_jitter() {
        let min = Duration::from_secs(1);
        let max = Duration::from_secs(30);
        // random = 0 is the bottom, u64::MAX (mod ceiling+1) stays within the ceiling.
        for attempt in 0..100 {
            let ceiling = min
                .saturating_mul(2u32.saturating_pow(attempt.min(31)))
                .min(max);
            assert_eq!(backoff_delay(attempt, min, max, 0), Duration::ZERO);
            for r in [1, 12345, u64::MAX / 3, u64::MAX] {
                let d = backoff_delay(attempt, min, max, r);
                assert!(d <= ceiling, "attempt {attempt}: {d:?} > {ceiling:?}");
            }
        }
        // Exactly the ceiling is reachable.
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap();
        assert_eq!(backoff_delay(0, min, max, nanos(min)), min);
        assert_eq!(backoff_delay(3, min, max, nanos(min) * 8), min * 8);
        assert_eq!(backoff_delay(20, min, max, nanos(max)), max);
        // Huge attempts do not overflow.
        assert!(backoff_delay(u32::MAX, min, max, u64::MAX) <= max);
        assert!(backoff_delay(u32::MAX, Duration::MAX, Duration::MAX, u64::MAX) <= Duration::MAX);
        // max < min: max wins.
        assert!(backoff_delay(0, max, min, u64::MAX) <= min);
    }

    #[test]
    fn backoff_is_spread_with_real_randomness() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(30);
        let samples: Vec<Duration> = (0..200)
            .map(|_| backoff_delay(5, min, max, random_u64()))
            .collect();
        let ceiling = Duration::from_millis(3200);
        assert!(samples.iter().all(|d| *d <= ceiling));
        let mut distinct = samples.clone();
        distinct.sort();
        distinct.dedup();
        assert!(
            distinct.len() > 150,
            "only {} distinct delays",
            distinct.len()
        );
        // Roughly uniform: both halves of the range are used.
        let low = samples.iter().filter(|d| **d < ceiling / 2).count();
        assert!((50..150).contains(&low), "{low} of 200 in the lower half");
    }

    #[test]
    fn server_urls() {
        let t = Target::parse("https://hub.example.com:8443").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.ws_uri.as_str()),
            (
                "hub.example.com",
                8443,
                "wss://hub.example.com:8443/api/connect"
            )
        );
        assert!(matches!(t.server_name().unwrap(), ServerName::DnsName(_)));
        let t = Target::parse("https://hub.example.com/").unwrap();
        assert_eq!(t.port, 443);
        assert_eq!(t.ws_uri, "wss://hub.example.com:443/api/connect");
        let t = Target::parse("wss://10.0.0.1:9443/rlark/").unwrap();
        assert_eq!(t.ws_uri, "wss://10.0.0.1:9443/rlark/api/connect");
        assert!(matches!(t.server_name().unwrap(), ServerName::IpAddress(_)));
        let t = Target::parse("https://[fd00::1]:8443").unwrap();
        assert_eq!(t.host, "fd00::1");
        assert_eq!(t.ws_uri, "wss://[fd00::1]:8443/api/connect");
        assert!(matches!(t.server_name().unwrap(), ServerName::IpAddress(_)));
        for bad in [
            "http://hub:80",
            "hub:8443",
            "https://",
            "https://user@hub",
            "not a url",
        ] {
            let e = Target::parse(bad).unwrap_err();
            assert!(e.is_permanent(), "{bad}: {e}");
        }
    }

    #[test]
    fn refused_upgrade_shows_the_http_status() {
        let response = http::Response::builder()
            .status(403)
            .body(Some(b"certificate not accepted\n".to_vec()))
            .unwrap();
        let e = ConnectError::from_ws(WsError::Http(Box::new(response)));
        assert_eq!(
            e.to_string(),
            "websocket upgrade refused: HTTP 403 Forbidden: certificate not accepted"
        );
        let response = http::Response::builder().status(401).body(None).unwrap();
        let e = ConnectError::from_ws(WsError::Http(Box::new(response)));
        assert_eq!(
            e.to_string(),
            "websocket upgrade refused: HTTP 401 Unauthorized"
        );
        assert!(!e.is_permanent());
    }

    // ------------------------------------------------------------------------------------
    // A test hub: TLS with required client certificates, WebSocket upgrade on /api/connect.
    // ------------------------------------------------------------------------------------

    struct Pki {
        _dir: tempfile::TempDir,
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        /// Trusts the CA but presents no client certificate.
        anonymous: Arc<rustls::ClientConfig>,
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rlark_pki::tls_provider())
    }

    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = rlark_pki::Ca::load_or_create(&dir.path().join("ca")).unwrap();
        let day = Duration::from_secs(86_400);
        let serving = ca
            .issue_serving(&["127.0.0.1".to_owned(), "localhost".to_owned()], day)
            .unwrap();
        let agent = ca.issue_client("agent-1", &[], day).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for anchor in ca.trust_anchors() {
            roots.add(anchor).unwrap();
        }
        let roots = Arc::new(roots);
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
                .build()
                .unwrap();
        let mut chain = vec![CertificateDer::from_pem_slice(serving.cert_pem.as_bytes()).unwrap()];
        chain.extend(ca.serving_chain_tail());
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                chain,
                PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        let builder = || {
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots.clone())
        };
        let mut client = builder()
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(agent.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(agent.key_pem.as_bytes()).unwrap(),
            )
            .unwrap();
        // Whatever ALPN the caller configured, the client must speak HTTP/1.1.
        client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Pki {
            _dir: dir,
            server: Arc::new(server),
            client: Arc::new(client),
            anonymous: Arc::new(builder().with_no_client_auth()),
        }
    }

    /// A connected agent as the hub sees it.
    struct Accepted {
        control: Control,
        node: Option<String>,
        /// Streams the agent opens towards the hub.
        incoming: crate::mux::Incoming,
    }

    struct Hub {
        url: String,
        sessions: mpsc::UnboundedReceiver<Accepted>,
        /// Upgrade requests seen (TLS handshakes that got as far as HTTP).
        attempts: Arc<AtomicUsize>,
    }

    /// Serves `/api/connect`; the first `reject` upgrade requests get HTTP 403.
    async fn hub(pki: &Pki, host: &str, reject: usize) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, sessions) = mpsc::unbounded_channel();
        let attempts = Arc::new(AtomicUsize::new(0));
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server.clone());
        let counter = attempts.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return; // e.g. no client certificate
                    };
                    let node = Arc::new(Mutex::new(None));
                    let seen = node.clone();
                    // The error type is tungstenite's (an http::Response), not ours to shrink.
                    #[allow(clippy::result_large_err)]
                    let callback = move |req: &Request, resp: Response| {
                        let n = counter.fetch_add(1, Ordering::SeqCst);
                        if req.uri().path() != CONNECT_PATH {
                            let mut e = ErrorResponse::new(Some("no such endpoint".into()));
                            *e.status_mut() = http::StatusCode::NOT_FOUND;
                            return Err(e);
                        }
                        if n < reject {
                            let mut e = ErrorResponse::new(Some("go away".into()));
                            *e.status_mut() = http::StatusCode::FORBIDDEN;
                            return Err(e);
                        }
                        *seen.lock().unwrap() = req
                            .headers()
                            .get(NODE_HEADER)
                            .map(|v| v.to_str().unwrap().to_owned());
                        Ok(resp)
                    };
                    let Ok(ws) = transport::accept_hdr(tls, callback).await else {
                        return;
                    };
                    let (control, incoming) = Session::new(ws, Role::Server, MuxConfig::default());
                    let node = node.lock().unwrap().take();
                    let _ = tx.send(Accepted {
                        control: control.clone(),
                        node,
                        incoming,
                    });
                    control.closed().await;
                });
            }
        });
        Hub {
            url: format!("https://{host}:{port}"),
            sessions,
            attempts,
        }
    }

    async fn next_session(hub: &mut Hub) -> Accepted {
        tokio::time::timeout(Duration::from_secs(10), hub.sessions.recv())
            .await
            .expect("agent connected in time")
            .unwrap()
    }

    fn fast(mut config: ClientConfig) -> ClientConfig {
        config.backoff_min = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(50);
        config
    }

    /// Dials a local echo server through the hub's session to the agent.
    async fn echo_through(control: &Control) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let (mut r, mut w) = s.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
        });
        let request = StreamRequest::DialTcp {
            host: "127.0.0.1".into(),
            port,
            timeout: Duration::from_secs(5),
        };
        let mut s = dial::open(control, &request, Duration::from_secs(10))
            .await
            .unwrap();
        s.write_all(b"through the tunnel").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"through the tunnel");
    }

    #[tokio::test]
    async fn connects_to_every_server_and_serves_streams() {
        let pki = pki();
        let mut hub_a = hub(&pki, "127.0.0.1", 0).await;
        let mut hub_b = hub(&pki, "localhost", 0).await;
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        let mut config = fast(ClientConfig::new(
            vec![hub_a.url.clone(), hub_b.url.clone()],
            tls,
        ));
        config.node = Some("node-7".into());
        let shutdown = CancellationToken::new();
        let handle = spawn(config, shutdown.clone());

        let a = next_session(&mut hub_a).await;
        let b = next_session(&mut hub_b).await;
        assert_eq!(a.node.as_deref(), Some("node-7"));
        assert_eq!(b.node.as_deref(), Some("node-7"));
        assert!(
            tokio::time::timeout(Duration::from_secs(5), handle.wait_connected(2))
                .await
                .unwrap()
        );
        assert_eq!(
            handle.connected(),
            vec![hub_a.url.clone(), hub_b.url.clone()]
        );
        echo_through(&a.control).await;
        echo_through(&b.control).await;

        // Shutdown closes both sessions and stops the client.
        shutdown.cancel();
        let watch = handle.watch();
        tokio::time::timeout(Duration::from_secs(10), handle.join())
            .await
            .expect("client stops after shutdown");
        assert!(watch.borrow().is_empty());
        for control in [&a.control, &b.control] {
            tokio::time::timeout(Duration::from_secs(5), control.closed())
                .await
                .expect("hub sees the session end");
        }
    }

    #[tokio::test]
    async fn connects_to_discovered_servers_and_drops_unlisted_ones() {
        let pki = pki();
        let mut hub_a = hub(&pki, "127.0.0.1", 0).await;
        let mut hub_b = hub(&pki, "localhost", 0).await;
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        let mut config = fast(ClientConfig::new(vec![hub_a.url.clone()], tls));
        // The hub lists itself (spelled differently: trailing slash, WSS) and one more.
        let (list_tx, list) = watch::channel(vec![format!("{}/", hub_a.url)]);
        config.discovered = Some(list);
        let shutdown = CancellationToken::new();
        let handle = spawn(config, shutdown.clone());
        let a = next_session(&mut hub_a).await;
        assert!(handle.wait_connected(1).await);
        list_tx
            .send(vec![
                hub_a.url.replace("https://", "wss://"),
                hub_b.url.clone(),
            ])
            .unwrap();
        let b = next_session(&mut hub_b).await;
        assert!(
            tokio::time::timeout(Duration::from_secs(5), handle.wait_connected(2))
                .await
                .unwrap()
        );
        assert_eq!(
            handle.connected(),
            vec![hub_a.url.clone(), hub_b.url.clone()],
            "configured first, then discovered"
        );
        echo_through(&b.control).await;
        assert!(
            hub_a.sessions.try_recv().is_err(),
            "no second session to the same server"
        );

        // Dropped from the list: its session closes and is not re-opened; the configured
        // server stays even when the list no longer names it.
        list_tx.send(Vec::new()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), b.control.closed())
            .await
            .expect("the unlisted server's session closes");
        let mut watch = handle.watch();
        tokio::time::timeout(
            Duration::from_secs(5),
            watch.wait_for(|list| list.len() == 1),
        )
        .await
        .expect("one server left")
        .unwrap();
        assert_eq!(handle.connected(), vec![hub_a.url.clone()]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(hub_b.sessions.try_recv().is_err(), "no reconnect to b");
        echo_through(&a.control).await;

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), handle.join())
            .await
            .expect("client stops after shutdown");
    }

    fn relay_header() -> RelayHeader {
        RelayHeader {
            domain: "ray".into(),
            protocol: crate::relay::Protocol::Tcp,
            source: "10.8.0.2".parse().unwrap(),
            destination: "10.8.0.3".parse().unwrap(),
            port: 80,
            source_port: 40000,
            source_cluster: None,
        }
    }

    /// The hub side of one agent-opened relay stream: checks the header, answers ok,
    /// echoes `tag` + what it reads.
    async fn answer_relay(incoming: &mut crate::mux::Incoming, tag: &'static [u8]) {
        use futures::StreamExt;
        let mut s = tokio::time::timeout(Duration::from_secs(10), incoming.next())
            .await
            .expect("a stream in time")
            .expect("session alive");
        let request = crate::header::read_request(&mut s).await.unwrap();
        let StreamRequest::Relay(body) = request else {
            panic!("not a relay: {request}");
        };
        assert_eq!(RelayHeader::decode(&body).unwrap(), relay_header());
        s.write_all(&crate::header::StreamResponse::ok().encode())
            .await
            .unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        s.write_all(tag).await.unwrap();
        s.write_all(&got).await.unwrap();
        s.shutdown().await.unwrap();
    }

    async fn relay_through(hub: &HubStreams) -> Vec<u8> {
        let mut s = hub
            .open_relay(&relay_header(), Duration::from_secs(10))
            .await
            .unwrap();
        s.write_all(b"hello").await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).await.unwrap();
        back
    }

    #[tokio::test]
    async fn agent_opens_relay_streams_on_the_live_session() {
        let pki = pki();
        let mut hub_server = hub(&pki, "127.0.0.1", 0).await;
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        let config = fast(ClientConfig::new(vec![hub_server.url.clone()], tls));
        // Taken before spawning, as code built before the client does.
        let streams = config.hub.clone();
        let err = streams
            .open_relay(&relay_header(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::NoSuchAgent, "{err}");
        let shutdown = CancellationToken::new();
        let handle = spawn(config, shutdown.clone());
        let mut first = next_session(&mut hub_server).await;
        assert!(handle.wait_connected(1).await);
        let from_handle = handle.hub();
        let (back, ()) = tokio::join!(
            relay_through(&from_handle),
            answer_relay(&mut first.incoming, b"first:")
        );
        assert_eq!(back, b"first:hello");
        assert_eq!(streams.servers(), vec![hub_server.url.clone()]);

        // After a reconnect the new session carries them.
        first.control.close();
        let mut second = next_session(&mut hub_server).await;
        tokio::time::timeout(Duration::from_secs(5), async {
            // Only the new session is listed: the old one was unregistered when it ended.
            while !matches!(&streams.newest_first()[..], [(_, c)] if !c.is_closed()) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the new session is registered");
        let (back, ()) = tokio::join!(
            relay_through(&streams),
            answer_relay(&mut second.incoming, b"second:")
        );
        assert_eq!(back, b"second:hello");

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), handle.join())
            .await
            .expect("client stops after shutdown");
        assert!(
            streams.servers().is_empty(),
            "no session listed after shutdown"
        );
        let err = streams
            .open_relay(&relay_header(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::NoSuchAgent, "{err}");
    }

    #[tokio::test]
    async fn hub_streams_prefer_the_newest_session_and_skip_closed_ones() {
        use crate::transport::memory_pair;
        let streams = HubStreams::new();
        let mut hubs = Vec::new();
        let mut guards = Vec::new();
        for url in ["old", "new"] {
            let (a, b) = memory_pair(16);
            let (hub_control, hub_in) = Session::new(a, Role::Server, MuxConfig::default());
            let (agent, _agent_in) = Session::new(b, Role::Client, MuxConfig::default());
            guards.push(streams.register(url, agent.clone()));
            hubs.push((hub_control, hub_in, agent));
        }
        assert_eq!(streams.servers(), vec!["new", "old"]);
        let (back, ()) = tokio::join!(
            relay_through(&streams),
            answer_relay(&mut hubs[1].1, b"new:")
        );
        assert_eq!(back, b"new:hello");
        // The newest session is closed (but not yet unregistered): the older one is used.
        hubs[1].2.close();
        let (back, ()) = tokio::join!(
            relay_through(&streams),
            answer_relay(&mut hubs[0].1, b"old:")
        );
        assert_eq!(back, b"old:hello");
        // An answer other than ok is the hub's, not retried elsewhere.
        let refuse = async {
            use futures::StreamExt;
            let mut s = hubs[0].1.next().await.unwrap();
            crate::header::read_request(&mut s).await.unwrap();
            let answer = crate::header::StreamResponse::error(
                Status::NoSuchAgent,
                "cluster b has no session",
            );
            s.write_all(&answer.encode()).await.unwrap();
            s.shutdown().await.unwrap();
        };
        let header = relay_header();
        let (result, ()) =
            tokio::join!(streams.open_relay(&header, Duration::from_secs(5)), refuse);
        assert_eq!(
            result.unwrap_err(),
            DialError::new(Status::NoSuchAgent, "cluster b has no session")
        );
        // A header that cannot be encoded opens nothing.
        let err = streams
            .open_relay(
                &RelayHeader {
                    port: 0,
                    ..relay_header()
                },
                Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert_eq!(err.status, Status::BadRequest);
        drop(guards);
        assert!(streams.servers().is_empty());
        let err = streams
            .open_relay(&relay_header(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            DialError::new(Status::NoSuchAgent, "no tunnel session to the hub is up")
        );
    }

    #[tokio::test]
    async fn refused_upgrades_are_retried_with_backoff() {
        let pki = pki();
        let mut hub = hub(&pki, "127.0.0.1", 3).await;
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        let shutdown = CancellationToken::new();
        let handle = spawn(
            fast(ClientConfig::new(vec![hub.url.clone()], tls)),
            shutdown.clone(),
        );
        let session = next_session(&mut hub).await;
        assert_eq!(hub.attempts.load(Ordering::SeqCst), 4);
        assert_eq!(session.node, None);
        assert!(handle.wait_connected(1).await);
        shutdown.cancel();
        handle.join().await;
    }

    #[tokio::test]
    async fn reconnects_after_the_session_ends() {
        let pki = pki();
        let mut hub = hub(&pki, "127.0.0.1", 0).await;
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        let shutdown = CancellationToken::new();
        let handle = spawn(
            fast(ClientConfig::new(vec![hub.url.clone()], tls)),
            shutdown.clone(),
        );
        let first = next_session(&mut hub).await;
        assert!(handle.wait_connected(1).await);
        first.control.close();
        let second = next_session(&mut hub).await;
        echo_through(&second.control).await;
        assert!(handle.wait_connected(1).await);
        assert_eq!(handle.connected(), vec![hub.url.clone()]);
        shutdown.cancel();
        handle.join().await;
    }

    #[tokio::test]
    async fn uses_the_current_tls_config() {
        // Without a client certificate the hub refuses the TLS handshake; once the watch
        // carries the real config, the next attempt connects.
        let pki = pki();
        let mut hub = hub(&pki, "127.0.0.1", 0).await;
        let (tls_tx, tls) = watch::channel(pki.anonymous.clone());
        let shutdown = CancellationToken::new();
        let handle = spawn(
            fast(ClientConfig::new(vec![hub.url.clone()], tls)),
            shutdown.clone(),
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(handle.connected().is_empty());
        assert!(hub.sessions.try_recv().is_err());
        tls_tx.send(pki.client.clone()).unwrap();
        let session = next_session(&mut hub).await;
        echo_through(&session.control).await;
        shutdown.cancel();
        handle.join().await;
    }

    #[tokio::test]
    async fn invalid_servers_are_skipped_and_run_returns_on_shutdown() {
        let pki = pki();
        let (_tls_tx, tls) = watch::channel(pki.client.clone());
        // Only invalid URLs: every task stops at once, run returns without shutdown.
        let config = ClientConfig::new(vec!["http://plain:80".into(), "nope".into()], tls.clone());
        tokio::time::timeout(
            Duration::from_secs(5),
            run(config, CancellationToken::new()),
        )
        .await
        .expect("run returns when no server is usable");
        // A server that is down: run keeps retrying until shutdown.
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().port()
        };
        let config = fast(ClientConfig::new(
            vec![format!("https://127.0.0.1:{port}")],
            tls,
        ));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(run(config, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!running.is_finished());
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("run returns after shutdown")
            .unwrap();
    }
}
