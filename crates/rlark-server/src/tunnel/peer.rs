//! Streams through another replica: a request that reaches this replica for an agent
//! tunnelled only to another one (an agent that has not discovered this replica yet, or
//! cannot reach it) is carried over an mTLS link to the replica that holds the tunnel.
//!
//! - **Caller side** ([`PeerLink::open`]): when the hub has no session for the cluster, it
//!   asks every other replica it knows (the registered replicas of `replicas.rs` and the
//!   configured peers), in turn, to open the stream: `POST /rlark/v1/peer/streams` with
//!   `Connection: Upgrade`, `Upgrade: rlark-peer-stream/1` and the stream's parameters in
//!   headers. The connection is TLS with this replica's own **peer** client certificate
//!   (`system:rlark:peer:<name>`, group `rlark:peers`, issued by the installation's CA at
//!   every start and recorded like any other, so it can be listed and revoked), and the
//!   other replica's serving certificate is verified against the installation's CA and the
//!   URL's host: never skipped.
//! - **Answering side** ([`open_stream`]): peers only; the stream is opened through this
//!   replica's **own** sessions only (never forwarded again, so there is no loop), then the
//!   upgraded connection and the tunnel stream are spliced. A replica without the session
//!   answers 404 at once, and the caller tries the next.
//!
//! The caller authorized the user before dialing (every route does); the answering replica
//! trusts its peer for that, as replicas of one installation share every decision's inputs
//! through the store.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::{Status, StreamRequest};
use rlark_tunnel::mux::MuxStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::replicas::Replicas;
use super::{Hub, Pick};

/// The route.
pub(crate) const ROUTE: &str = "/rlark/v1/peer/streams";
/// The upgrade token.
const PROTOCOL: &str = "rlark-peer-stream/1";
const CLUSTER: &str = "x-rlark-peer-cluster";
/// The node to prefer; with [`EXACT`] `true`, the only node accepted.
const NODE: &str = "x-rlark-peer-node";
const EXACT: &str = "x-rlark-peer-node-exact";
/// `tcp` (with [`HOST`], [`PORT`], [`TIMEOUT`]) or `agent-api`.
const KIND: &str = "x-rlark-peer-kind";
const HOST: &str = "x-rlark-peer-host";
const PORT: &str = "x-rlark-peer-port";
const TIMEOUT: &str = "x-rlark-peer-timeout-ms";
/// On refusals: the dial status (`no-such-agent`, `refused`, ...).
const STATUS: &str = "x-rlark-dial-status";
/// Connecting and the TLS handshake to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A stream to an agent: through one of this replica's own sessions, or through a peer;
/// with the caller's place in the agent's per-user stream share when it was opened for a
/// user ([`super::Hub::user_share`]), given back when the stream is dropped.
pub(crate) struct HubStream {
    io: HubIo,
    _share: Option<super::StreamShare>,
}

enum HubIo {
    Local(MuxStream),
    Upgraded(TokioIo<hyper::upgrade::Upgraded>),
}

impl HubStream {
    pub(crate) fn local(stream: MuxStream) -> HubStream {
        HubStream {
            io: HubIo::Local(stream),
            _share: None,
        }
    }

    /// A stream through a peer replica, or a connection the agent's local API upgraded.
    pub(crate) fn upgraded(stream: TokioIo<hyper::upgrade::Upgraded>) -> HubStream {
        HubStream {
            io: HubIo::Upgraded(stream),
            _share: None,
        }
    }

    /// This stream, counted in `share` until it is dropped.
    pub(crate) fn with_share(mut self, share: super::StreamShare) -> HubStream {
        self._share = Some(share);
        self
    }
}

impl AsyncRead for HubStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            HubIo::Local(stream) => Pin::new(stream).poll_read(cx, buf),
            HubIo::Upgraded(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for HubStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match &mut self.get_mut().io {
            HubIo::Local(stream) => Pin::new(stream).poll_write(cx, buf),
            HubIo::Upgraded(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            HubIo::Local(stream) => Pin::new(stream).poll_flush(cx),
            HubIo::Upgraded(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match &mut self.get_mut().io {
            HubIo::Local(stream) => Pin::new(stream).poll_shutdown(cx),
            HubIo::Upgraded(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// This replica's way to the others.
pub(crate) struct PeerLink {
    replicas: Arc<Replicas>,
    /// This replica's advertise URL (skipped in the list).
    me: Option<String>,
    tls: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

/// Why a peer did not open the stream.
enum PeerRefusal {
    /// It has no session for the agent either: try the next.
    NoSuchAgent,
    Failed(DialError),
}

impl PeerLink {
    /// `tls`: the installation's CA as the only root, this replica's peer certificate as the
    /// client certificate.
    pub(crate) fn new(
        replicas: Arc<Replicas>,
        me: Option<String>,
        tls: Arc<rustls::ClientConfig>,
    ) -> PeerLink {
        PeerLink { replicas, me, tls }
    }

    /// Open `request` towards the agent of `cluster` through whichever other replica holds
    /// its session.
    pub(super) async fn open(
        &self,
        cluster: &str,
        pick: Pick<'_>,
        request: &StreamRequest,
        deadline: Duration,
    ) -> Result<HubStream, DialError> {
        let peers: Vec<String> = match self.replicas.list().await {
            Ok(list) => list
                .into_iter()
                .map(|replica| replica.peer_address().to_string())
                .filter(|url| Some(url) != self.me.as_ref())
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "list replicas for a peer stream");
                Vec::new()
            }
        };
        let mut failure = None;
        for url in &peers {
            let attempt =
                tokio::time::timeout(deadline, self.open_at(url, cluster, pick, request)).await;
            match attempt {
                Ok(Ok(stream)) => {
                    tracing::debug!(%cluster, peer = %url, "stream opened through a peer replica");
                    return Ok(HubStream::upgraded(stream));
                }
                Ok(Err(PeerRefusal::NoSuchAgent)) => {}
                Ok(Err(PeerRefusal::Failed(error))) => {
                    tracing::debug!(%cluster, peer = %url, error = %error.message, "peer stream failed");
                    failure.get_or_insert(error);
                }
                Err(_) => {
                    failure.get_or_insert(DialError {
                        status: Status::Timeout,
                        message: format!("replica {url} did not answer within {deadline:?}"),
                    });
                }
            }
        }
        Err(failure.unwrap_or_else(|| DialError {
            status: Status::NoSuchAgent,
            message: format!(
                "no agent of cluster {cluster:?} is connected to this server or to any of its {} \
                 peer replicas",
                peers.len()
            ),
        }))
    }

    async fn open_at(
        &self,
        url: &str,
        cluster: &str,
        pick: Pick<'_>,
        request: &StreamRequest,
    ) -> Result<TokioIo<hyper::upgrade::Upgraded>, PeerRefusal> {
        let failed = |message: String| {
            PeerRefusal::Failed(DialError {
                status: Status::Unreachable,
                message,
            })
        };
        let (host, port) = host_port(url).map_err(failed)?;
        let server_name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| failed(format!("replica URL {url}: {e}")))?;
        let connect = async {
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
                .connect(server_name, tcp)
                .await
        };
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| failed(format!("connecting to replica {url} timed out")))?
            .map_err(|e| failed(format!("connecting to replica {url}: {e}")))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| failed(format!("HTTP to replica {url}: {e}")))?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%error, "peer connection ended");
            }
        });
        let mut builder = http::Request::post(ROUTE)
            .header(header::HOST, format!("{host}:{port}"))
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, PROTOCOL)
            .header(CLUSTER, cluster);
        builder = match pick {
            Pick::Prefer(Some(node)) => builder.header(NODE, node),
            Pick::Prefer(None) => builder,
            Pick::Exactly(node) => builder.header(NODE, node).header(EXACT, "true"),
        };
        builder = match request {
            StreamRequest::DialTcp {
                host,
                port,
                timeout,
            } => builder
                .header(KIND, "tcp")
                .header(HOST, host.as_str())
                .header(PORT, port.to_string())
                .header(TIMEOUT, timeout.as_millis().to_string()),
            StreamRequest::AgentApi => builder.header(KIND, "agent-api"),
            other => {
                return Err(failed(format!(
                    "{other:?} streams are not carried through peers"
                )));
            }
        };
        let request = builder
            .body(Body::empty())
            .map_err(|e| failed(format!("peer request: {e}")))?;
        let mut response = sender
            .send_request(request)
            .await
            .map_err(|e| failed(format!("request to replica {url}: {e}")))?;
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let upgraded = hyper::upgrade::on(&mut response)
                .await
                .map_err(|e| failed(format!("upgrade from replica {url}: {e}")))?;
            return Ok(TokioIo::new(upgraded));
        }
        let status = response
            .headers()
            .get(STATUS)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_status);
        match status {
            Some(Status::NoSuchAgent) => Err(PeerRefusal::NoSuchAgent),
            Some(status) => Err(PeerRefusal::Failed(DialError {
                status,
                message: format!("through replica {url}: the agent could not open the stream"),
            })),
            None => Err(failed(format!(
                "replica {url} refused the peer stream: HTTP {}",
                response.status()
            ))),
        }
    }
}

/// Every status a refusal may carry.
const REFUSALS: [Status; 8] = [
    Status::NoSuchAgent,
    Status::Refused,
    Status::Unreachable,
    Status::Timeout,
    Status::Forbidden,
    Status::BadRequest,
    Status::Limit,
    Status::Internal,
];

fn parse_status(name: &str) -> Option<Status> {
    REFUSALS.into_iter().find(|status| status.as_str() == name)
}

/// Host and port of `https://host[:port][/path]` (brackets of an IPv6 literal removed).
fn host_port(url: &str) -> Result<(String, u16), String> {
    let rest = ["https://", "wss://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .ok_or_else(|| format!("replica URL {url:?} is not https://"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || host.starts_with('[') => {
            match port.parse::<u16>() {
                Ok(port) if !host.contains(':') || host.starts_with('[') => (host, port),
                _ => (authority, 443),
            }
        }
        _ => (authority, 443),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(format!("replica URL {url:?} has no host"));
    }
    Ok((host.to_string(), port))
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The stream a peer asks for, from its headers.
fn requested(headers: &HeaderMap) -> Result<(String, Option<String>, bool, StreamRequest), String> {
    let cluster = header_str(headers, CLUSTER)
        .filter(|c| !c.is_empty())
        .ok_or("the cluster header is missing")?
        .to_string();
    let node = header_str(headers, NODE).map(str::to_string);
    let exact = header_str(headers, EXACT) == Some("true");
    if exact && node.is_none() {
        return Err("an exact node pick needs a node".into());
    }
    let request = match header_str(headers, KIND) {
        Some("agent-api") => StreamRequest::AgentApi,
        Some("tcp") => {
            let host = header_str(headers, HOST)
                .filter(|h| !h.is_empty())
                .ok_or("the host header is missing")?;
            let port = header_str(headers, PORT)
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
                .ok_or("the port header is missing or not a port")?;
            let timeout = header_str(headers, TIMEOUT)
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_millis)
                .ok_or("the timeout header is missing")?;
            StreamRequest::DialTcp {
                host: host.to_string(),
                port,
                timeout: timeout.clamp(Duration::from_millis(1), Duration::from_secs(600)),
            }
        }
        other => return Err(format!("unknown stream kind {other:?}")),
    };
    Ok((cluster, node, exact, request))
}

/// `POST /rlark/v1/peer/streams` (peers only).
pub(crate) async fn open_stream(State(hub): State<Arc<Hub>>, mut request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    if !matches!(identity.role(), Role::Peer { .. }) {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot open peer streams (server replicas only)",
                identity.user
            ),
        )
        .into_response();
    }
    let upgrade = header_str(request.headers(), header::UPGRADE.as_str());
    if upgrade != Some(PROTOCOL) {
        return ApiError::bad_request(format!("{ROUTE} needs Upgrade: {PROTOCOL}")).into_response();
    }
    let (cluster, node, exact, stream_request) = match requested(request.headers()) {
        Ok(requested) => requested,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let pick = match (&node, exact) {
        (Some(node), true) => Pick::Exactly(node),
        (node, _) => Pick::Prefer(node.as_deref()),
    };
    let deadline = match &stream_request {
        StreamRequest::DialTcp { timeout, .. } => *timeout + Duration::from_secs(1),
        _ => hub.config().dial_timeout,
    };
    let stream = match hub
        .open_local(&cluster, pick, &stream_request, deadline)
        .await
    {
        Ok(stream) => stream,
        Err(error) => {
            let code = if error.status == Status::NoSuchAgent {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::BAD_GATEWAY
            };
            let mut response =
                ApiError::new(code.as_u16(), "PeerStream", error.message).into_response();
            if let Ok(value) = HeaderValue::from_str(error.status.as_str()) {
                response.headers_mut().insert(STATUS, value);
            }
            return response;
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let peer = identity.user;
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "peer stream upgrade failed");
                return;
            }
        };
        let mut upgraded = TokioIo::new(upgraded);
        let mut stream = stream;
        match tokio::io::copy_bidirectional_with_sizes(
            &mut upgraded,
            &mut stream,
            64 * 1024,
            64 * 1024,
        )
        .await
        {
            Ok((up, down)) => tracing::debug!(%peer, %cluster, up, down, "peer stream closed"),
            Err(error) => tracing::debug!(%peer, %cluster, %error, "peer stream ended"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, PROTOCOL)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_urls_give_host_and_port() {
        let cases = [
            ("https://127.0.0.1:8443", ("127.0.0.1", 8443)),
            ("https://cp-1.example", ("cp-1.example", 443)),
            ("https://cp-1.example:9443/base", ("cp-1.example", 9443)),
            ("https://[::1]:8443", ("::1", 8443)),
            ("wss://[fd00::1]", ("fd00::1", 443)),
        ];
        for (url, (host, port)) in cases {
            assert_eq!(host_port(url), Ok((host.to_string(), port)), "{url}");
        }
        assert!(host_port("http://a:1").is_err());
        assert!(host_port("https://").is_err());
    }

    #[test]
    fn stream_parameters_round_trip_through_headers() {
        let mut headers = HeaderMap::new();
        headers.insert(CLUSTER, HeaderValue::from_static("edge"));
        headers.insert(NODE, HeaderValue::from_static("n1"));
        headers.insert(EXACT, HeaderValue::from_static("true"));
        headers.insert(KIND, HeaderValue::from_static("tcp"));
        headers.insert(HOST, HeaderValue::from_static("127.0.0.1"));
        headers.insert(PORT, HeaderValue::from_static("8080"));
        headers.insert(TIMEOUT, HeaderValue::from_static("3000"));
        let (cluster, node, exact, request) = requested(&headers).expect("parsed");
        assert_eq!(
            (cluster.as_str(), node.as_deref(), exact),
            ("edge", Some("n1"), true)
        );
        assert!(matches!(
            request,
            StreamRequest::DialTcp { ref host, port: 8080, timeout }
                if host == "127.0.0.1" && timeout == Duration::from_secs(3)
        ));
        headers.insert(PORT, HeaderValue::from_static("0"));
        assert!(requested(&headers).unwrap_err().contains("port"));
        headers.insert(KIND, HeaderValue::from_static("relay"));
        assert!(
            requested(&headers)
                .unwrap_err()
                .contains("unknown stream kind")
        );
        headers.remove(CLUSTER);
        assert!(requested(&headers).unwrap_err().contains("cluster"));
    }

    #[test]
    fn every_dial_status_is_recognised() {
        for status in REFUSALS {
            assert_eq!(parse_status(status.as_str()), Some(status));
        }
        assert_eq!(parse_status("nonsense"), None);
    }
}
