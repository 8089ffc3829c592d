//! HTTP routes of the hub:
//!
//! | route | who | what |
//! |---|---|---|
//! | `GET /api/connect` | agents (client certificate) | WebSocket upgrade carrying the tunnel session |
//! | `ANY /api/proxy/{clusterID}/{scheme}/{host}:{port}/{path}` | admin | HTTP reverse proxy through the agent, WebSocket upgrades included; `scheme` is `http`, `https` (the target's certificate verified, see [`super::ProxyTls`]) or `https+insecure` (TLS without verification, as kube-apiserver's service proxy) |
//! | `GET /api/v1/tunnels` | admin, viewer, peer | live sessions (agent, node, replica, since, streams, bytes) |
//! | `POST /rlark/v1/peer/streams` | peers (other replicas) | upgrade carrying a stream through this replica's own session of an agent (`peer.rs`) |
//! | `GET /rlark/v1/namespaces/{ns}/pods/{pod}/log` | admin, viewer | a replica's log from its agent (`logs.rs`) |
//! | `GET /rlark/v1/namespaces/{ns}/nodes/{node}/cameras/{camera}/stream`, `.../robots`, `POST .../robots/{robot}/{action}` | who may get the Node; robot actions admins | cameras' live view and robots, from their agent (`devices.rs`) |
//! | `GET /api/v1/namespaces/{ns}/pods/{pod}/log`, `.../exec` | as the rlark routes | kubectl's URLs for the same (`core_pods.rs`; not when core Pods are an extra kind) |

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_tunnel::dial::DialError;
use rlark_tunnel::header::Status;
use serde_json::json;

use super::Hub;
use crate::security::AuthMethod;

/// Header an agent's node-level connection names its node with.
pub(crate) const NODE_HEADER: &str = "x-rlark-node";

pub(crate) fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/connect", get(connect))
        .route("/api/proxy/{cluster}/{scheme}/{target}", any(proxy_root))
        // `{*path}` does not match an empty path: the target's root with a trailing slash.
        .route("/api/proxy/{cluster}/{scheme}/{target}/", any(proxy_root))
        .route("/api/proxy/{cluster}/{scheme}/{target}/{*path}", any(proxy))
        .route("/api/v1/tunnels", get(list))
        .route(
            super::peer::ROUTE,
            axum::routing::post(super::peer::open_stream),
        )
        .route(super::logs::ROUTE, get(super::logs::pod_log))
        .with_state(hub)
}

fn identity_of(request: &Request) -> Option<Identity> {
    request.extensions().get::<Identity>().cloned()
}

fn forbidden(identity: &Identity, what: &str) -> Response {
    ApiError::new(
        403,
        "Forbidden",
        format!("forbidden: User \"{}\" cannot {what}", identity.user),
    )
    .into_response()
}

/// The `Status` of a failed dial: 503 when no agent is there, 502 when the agent could
/// not reach the target, 504 on timeout.
pub(crate) fn dial_error_response(target: &str, cluster: &str, error: &DialError) -> Response {
    let (code, reason) = match error.status {
        Status::NoSuchAgent | Status::Limit => (503, "ServiceUnavailable"),
        Status::Timeout => (504, "Timeout"),
        Status::Forbidden => (403, "Forbidden"),
        Status::BadRequest => (400, "BadRequest"),
        _ => (502, "BadGateway"),
    };
    ApiError::new(
        code,
        reason,
        format!("dial {target} through cluster {cluster:?}: {error}"),
    )
    .into_response()
}

/// `GET /api/connect`: an agent's tunnel. Only an agent certificate may open one: its
/// cluster ID comes from the certificate, never from the request.
async fn connect(State(hub): State<Arc<Hub>>, mut request: Request) -> Response {
    let Some(identity) = identity_of(&request) else {
        return ApiError::unauthorized().into_response();
    };
    let Role::Agent { cluster_id } = identity.role() else {
        return forbidden(&identity, "open an agent tunnel (agent certificates only)");
    };
    let Some(AuthMethod::Certificate { serial }) =
        request.extensions().get::<AuthMethod>().cloned()
    else {
        return forbidden(
            &identity,
            "open an agent tunnel without a client certificate",
        );
    };
    let node = match request.headers().get(NODE_HEADER).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(node)) if valid_node_name(node) => Some(node.to_string()),
        Some(_) => {
            return ApiError::bad_request(format!(
                "{NODE_HEADER} must be a node name (lowercase letters, digits, '-' and '.')"
            ))
            .into_response();
        }
    };
    let key = match websocket_key(request.headers()) {
        Ok(key) => key,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let remote = request
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0)
        .unwrap_or_else(|| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
    let on_upgrade = hyper::upgrade::on(&mut request);
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, cluster = %cluster_id, "tunnel upgrade failed");
                return;
            }
        };
        let transport = rlark_tunnel::transport::WsTransport::from_raw_socket(
            TokioIo::new(upgraded),
            rlark_tunnel::ws::Role::Server,
        );
        let (control, incoming) = rlark_tunnel::mux::Session::new(
            transport,
            rlark_tunnel::mux::Role::Server,
            hub.config().mux.clone(),
        );
        let id = hub.register(
            cluster_id.clone(),
            node.clone(),
            remote,
            serial,
            control.clone(),
        );
        tracing::info!(cluster = %cluster_id, node = ?node, %remote, "agent tunnel connected");
        // Agent-opened streams: the pod-network relay (`relay.rs`), served for as long as
        // the session lives, with the session's certified cluster as the caller.
        let serving = tokio::spawn(super::relay::serve_incoming(
            Arc::clone(&hub),
            cluster_id.clone(),
            incoming,
        ));
        control.closed().await;
        serving.abort();
        hub.unregister(&cluster_id, id);
        tracing::info!(cluster = %cluster_id, node = ?node, %remote, "agent tunnel disconnected");
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// The `Sec-WebSocket-Key` of a valid WebSocket upgrade request, or why it is not one.
fn websocket_key(headers: &HeaderMap) -> Result<String, String> {
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::UPGRADE, "websocket") {
        return Err(
            "/api/connect is a WebSocket endpoint: send Connection: Upgrade and Upgrade: websocket"
                .into(),
        );
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .and_then(|v| v.to_str().ok())
        != Some("13")
    {
        return Err("Sec-WebSocket-Version must be 13".into());
    }
    headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| "Sec-WebSocket-Key is missing".to_string())
}

/// The connection a proxied request goes over: a tunnel stream, or TLS on one.
pub(crate) trait ProxyIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> ProxyIo for T {}

/// Whether `name` (lowercase) is a forwarding header a client may not pass to a proxied
/// target: `Forwarded` (RFC 7239) and every `X-Forwarded-*`.
pub(crate) fn is_forwarding_header(name: &str) -> bool {
    name == "forwarded" || name.starts_with("x-forwarded-")
}

/// The forwarding headers the proxy sets on a request it relays: the client's address
/// (`X-Forwarded-For`, from the connection), the host it asked for (`X-Forwarded-Host`),
/// `X-Forwarded-Proto: https`, the mount point (`X-Forwarded-Prefix`, with `prefix`), and
/// the same as one RFC 7239 `Forwarded` header.
pub(crate) fn forwarding_headers(
    parts: &http::request::Parts,
    prefix: Option<&str>,
) -> Vec<(&'static str, HeaderValue)> {
    let client = parts
        .extensions
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|info| info.0.ip());
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .filter(|h| HeaderValue::from_str(h).is_ok());
    let mut headers = Vec::new();
    let mut forwarded = Vec::new();
    if let Some(ip) = client {
        headers.push(("x-forwarded-for", ip.to_string()));
        forwarded.push(match ip {
            std::net::IpAddr::V4(v4) => format!("for={v4}"),
            std::net::IpAddr::V6(v6) => format!("for=\"[{v6}]\""),
        });
    }
    if let Some(host) = &host {
        headers.push(("x-forwarded-host", host.clone()));
        forwarded.push(format!("host=\"{}\"", host.replace(['"', '\\'], "")));
    }
    headers.push(("x-forwarded-proto", "https".to_string()));
    forwarded.push("proto=https".to_string());
    if let Some(prefix) = prefix {
        headers.push(("x-forwarded-prefix", prefix.to_string()));
    }
    headers.push(("forwarded", forwarded.join(";")));
    headers
        .into_iter()
        .filter_map(|(name, value)| HeaderValue::from_str(&value).ok().map(|v| (name, v)))
        .collect()
}

/// Headers that describe one hop and are not forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

async fn proxy_root(
    State(hub): State<Arc<Hub>>,
    Path((cluster, scheme, target)): Path<(String, String, String)>,
    request: Request,
) -> Response {
    forward(hub, cluster, scheme, target, String::new(), request).await
}

async fn proxy(
    State(hub): State<Arc<Hub>>,
    Path((cluster, scheme, target, path)): Path<(String, String, String, String)>,
    request: Request,
) -> Response {
    forward(hub, cluster, scheme, target, path, request).await
}

async fn forward(
    hub: Arc<Hub>,
    cluster: String,
    scheme: String,
    target: String,
    path: String,
    request: Request,
) -> Response {
    let Some(identity) = identity_of(&request) else {
        return ApiError::unauthorized().into_response();
    };
    if identity.role() != Role::Admin {
        return forbidden(
            &identity,
            &format!("proxy to cluster {cluster:?} (admins only)"),
        );
    }
    // Whatever answers behind the agent would run in the browser on the console's origin
    // with the admin's session: not for a console cookie (the console never uses this
    // route; task web apps have the task proxy's own origin).
    if matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Session { .. })
    ) {
        return ApiError::new(
            403,
            "Forbidden",
            "forbidden: /api/proxy does not serve browser sessions of the web console (the \
             page would run on the console's origin); use a bearer token or a client \
             certificate, or open task web apps from the console (the task proxy's origin)",
        )
        .into_response();
    }
    let tls = match scheme.as_str() {
        "http" => None,
        "https" => Some(hub.proxy_tls().verified()),
        "https+insecure" => Some(hub.proxy_tls().insecure()),
        _ => {
            return ApiError::bad_request(format!(
                "proxy scheme {scheme:?} is not supported: use http, https (the target's \
                 certificate is verified) or https+insecure (it is not)"
            ))
            .into_response();
        }
    };
    let Some((host, port)) = target
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok().filter(|p| *p > 0)?)))
    else {
        return ApiError::bad_request(format!("proxy target {target:?} must be <host>:<port>"))
            .into_response();
    };
    let server_name = match &tls {
        None => None,
        Some(_) => match rustls::pki_types::ServerName::try_from(
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_string(),
        ) {
            Ok(name) => Some(name),
            Err(_) => {
                return ApiError::bad_request(format!(
                    "proxy target host {host:?} is neither a DNS name nor an IP address"
                ))
                .into_response();
            }
        },
    };
    let stream = match hub.dial(&cluster, None, &host, port).await {
        Ok(stream) => stream,
        Err(error) => return dial_error_response(&target, &cluster, &error),
    };
    let stream: Box<dyn ProxyIo> = match (tls, server_name) {
        (Some(config), Some(name)) => {
            match tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
            {
                Ok(tls) => Box::new(tls),
                Err(error) => {
                    return ApiError::new(
                        502,
                        "BadGateway",
                        format!("proxy to {scheme}://{target}: TLS handshake: {error}"),
                    )
                    .into_response();
                }
            }
        }
        _ => Box::new(stream),
    };
    relay(stream, &target, &path, request, None).await
}

/// Send `request` (its path replaced by `/{path}`, the query kept, `Host: host`) over
/// `stream` and relay the answer, upgrades (WebSocket) included. Hop-by-hop headers are
/// dropped both ways, and so are the caller's rlark credentials (a bearer token, the
/// console's cookie and CSRF header). The client's own forwarding headers
/// (`Forwarded`, `X-Forwarded-*`) are dropped: the target gets this server's
/// ([`forwarding_headers`]), so a client cannot pose as another address or host. With
/// `prefix` (the task proxy), the app learns where it is mounted (`X-Forwarded-Prefix`)
/// and its absolute links are rewritten under the prefix ([`super::prefix`]).
pub(crate) async fn relay(
    stream: Box<dyn ProxyIo>,
    host: &str,
    path: &str,
    mut request: Request,
    prefix: Option<&str>,
) -> Response {
    let target = host;
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(error) => {
            return ApiError::new(502, "BadGateway", format!("proxy to {target}: {error}"))
                .into_response();
        }
    };
    tokio::spawn(async move {
        if let Err(error) = conn.with_upgrades().await {
            tracing::debug!(%error, "proxied connection ended");
        }
    });

    let upgrade = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));
    // A WebSocket opened with a console or proxy session closes when that session ends.
    let session_end = request
        .extensions()
        .get::<crate::console::sessions::SessionEnd>()
        .cloned();
    let bearer = matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Bearer { .. })
    );
    let session = matches!(
        request.extensions().get::<AuthMethod>(),
        Some(AuthMethod::Session { .. })
    );
    let query = request
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let (parts, body) = request.into_parts();
    let forwarding = forwarding_headers(&parts, prefix);
    let mut out = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("/{path}{query}"));
    for (name, value) in &parts.headers {
        let lower = name.as_str();
        if HOP_BY_HOP.contains(&lower) || lower == "host" {
            continue;
        }
        // Forwarding headers are this server's to set, never the client's.
        if is_forwarding_header(lower) {
            continue;
        }
        // A bearer token authenticated the caller to rlark; it is not the target's.
        if bearer && name == header::AUTHORIZATION {
            continue;
        }
        // Nor is the console's session cookie (with the whole `Cookie` header: on the
        // console's origin every cookie is the console's) or its CSRF token.
        if session && (name == header::COOKIE || lower == crate::console::CSRF_HEADER) {
            continue;
        }
        // Nor are rlark's own cookies elsewhere (the proxy origin's); the app's are.
        if name == header::COOKIE {
            if let Some(value) = app_cookies(value) {
                out = out.header(name, value);
            }
            continue;
        }
        out = out.header(name, value);
    }
    out = out.header(header::HOST, target);
    for (name, value) in forwarding {
        out = out.header(name, value);
    }
    if prefix.is_some() {
        // The body may be rewritten: ask for it unencoded.
        if let Some(headers) = out.headers_mut() {
            headers.remove(header::ACCEPT_ENCODING);
        }
    }
    if let Some(upgrade) = &upgrade {
        out = out
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, upgrade);
    }
    let out = match out.body(body) {
        Ok(out) => out,
        Err(error) => return ApiError::bad_request(error.to_string()).into_response(),
    };
    let mut response = match sender.send_request(out).await {
        Ok(response) => response,
        Err(error) => {
            return ApiError::new(502, "BadGateway", format!("proxy to {target}: {error}"))
                .into_response();
        }
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let target_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                match tokio::try_join!(client_upgrade, target_upgrade) {
                    Ok((client, target)) => {
                        let mut client = TokioIo::new(client);
                        let mut target = TokioIo::new(target);
                        let ended = crate::console::sessions::ended_or_never(session_end);
                        tokio::select! {
                            copied = tokio::io::copy_bidirectional(&mut client, &mut target) => {
                                if let Err(error) = copied {
                                    tracing::debug!(%error, "proxied upgrade ended");
                                }
                            }
                            () = ended => tracing::debug!("proxied upgrade closed: its session ended"),
                        }
                    }
                    Err(error) => tracing::debug!(%error, "proxied upgrade failed"),
                }
            });
        }
        let (parts, _) = response.into_parts();
        return Response::from_parts(parts, Body::empty());
    }
    let (mut parts, body) = response.into_parts();
    for name in HOP_BY_HOP {
        parts.headers.remove(name);
    }
    match prefix {
        Some(prefix) => super::prefix::rewrite_response(parts, body, prefix).await,
        None => Response::from_parts(parts, Body::new(body)),
    }
}

/// Whether a cookie (`name=value...`) is one of rlark's: its name starts with
/// `__Host-rlark` (compared without case, as some browsers match prefixes).
pub(crate) fn is_rlark_cookie(pair: &[u8]) -> bool {
    const PREFIX: &[u8] = b"__host-rlark";
    let trimmed = pair.trim_ascii_start();
    trimmed.len() >= PREFIX.len() && trimmed[..PREFIX.len()].eq_ignore_ascii_case(PREFIX)
}

/// A `Cookie` header without rlark's own cookies; `None` when nothing is left.
fn app_cookies(value: &http::HeaderValue) -> Option<http::HeaderValue> {
    let text = value.to_str().ok()?;
    let kept: Vec<&str> = text
        .split(';')
        .map(str::trim)
        .filter(|pair| !pair.is_empty() && !is_rlark_cookie(pair.as_bytes()))
        .collect();
    if kept.is_empty() {
        return None;
    }
    http::HeaderValue::from_str(&kept.join("; ")).ok()
}

/// `GET /api/v1/tunnels`.
async fn list(State(hub): State<Arc<Hub>>, request: Request) -> Response {
    let Some(identity) = identity_of(&request) else {
        return ApiError::unauthorized().into_response();
    };
    if !matches!(
        identity.role(),
        Role::Admin | Role::Viewer | Role::Peer { .. }
    ) {
        return forbidden(&identity, "list tunnels");
    }
    axum::Json(json!({
        "kind": "TunnelList",
        "apiVersion": "v1",
        "items": hub.list(),
    }))
    .into_response()
}

#[cfg(test)]
mod tests {

    #[test]
    fn forwarding_headers_are_the_proxys_own() {
        let mut request = http::Request::get("/x")
            .header(header::HOST, "rlark.example:8443")
            .header("x-forwarded-for", "203.0.113.66")
            .body(())
            .expect("request");
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
                [10, 0, 0, 7],
                5555,
            ))));
        let (parts, ()) = request.into_parts();
        let set: Vec<(String, String)> = forwarding_headers(&parts, Some("/p"))
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().expect("ascii").to_string()))
            .collect();
        let get = |name: &str| set.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(get("x-forwarded-for"), Some("10.0.0.7"));
        assert_eq!(get("x-forwarded-host"), Some("rlark.example:8443"));
        assert_eq!(get("x-forwarded-proto"), Some("https"));
        assert_eq!(get("x-forwarded-prefix"), Some("/p"));
        assert_eq!(
            get("forwarded"),
            Some("for=10.0.0.7;host=\"rlark.example:8443\";proto=https")
        );
        for name in ["forwarded", "x-forwarded-for", "x-forwarded-anything"] {
            assert!(is_forwarding_header(name), "{name}");
        }
        assert!(!is_forwarding_header("x-forward"));
    }
    use super::*;
    use http_body_util::BodyExt as _;
    use std::convert::Infallible;

    /// An app behind the relay that echoes the `Cookie` it got and tries to set rlark's
    /// cookies next to its own.
    async fn app(request: http::Request<hyper::body::Incoming>) -> Result<Response, Infallible> {
        let cookie = request
            .headers()
            .get(header::COOKIE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        Ok(Response::builder()
            .header(
                header::SET_COOKIE,
                "__Host-rlark_session=stolen; Path=/; Secure",
            )
            .header(
                header::SET_COOKIE,
                "__HOST-RLARK_proxy=stolen; Path=/; Secure",
            )
            .header(header::SET_COOKIE, "app=1; Path=/")
            .body(Body::from(cookie))
            .unwrap())
    }

    /// `/api/proxy` serves whatever answers behind an agent: never to a console session (it
    /// would run on the console's origin), still to a token or certificate.
    #[tokio::test]
    async fn the_api_proxy_refuses_console_sessions() {
        use tower::ServiceExt as _;
        let app = router(Hub::new("test".into(), Default::default()));
        let admin = Identity {
            user: "admin".into(),
            groups: vec![rlark_apiserver::auth::ADMIN_GROUP.into()],
        };
        let ask = |method: AuthMethod| {
            let mut request = Request::get("/api/proxy/edge/http/10.0.0.1:8080/page")
                .body(Body::empty())
                .unwrap();
            request.extensions_mut().insert(admin.clone());
            request.extensions_mut().insert(method);
            app.clone().oneshot(request)
        };
        let refused = ask(AuthMethod::Session { token_id: None }).await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        let body = refused.into_body().collect().await.unwrap().to_bytes();
        assert!(
            String::from_utf8_lossy(&body).contains("does not serve browser sessions"),
            "{body:?}"
        );
        // A bearer token gets as far as the hub (no agent of cluster edge here).
        let bearer = ask(AuthMethod::Bearer { id: "t1".into() }).await.unwrap();
        assert_ne!(bearer.status(), StatusCode::FORBIDDEN);
    }

    #[tokio::test]
    async fn rlark_cookies_neither_reach_the_app_nor_come_back_from_it() {
        let (near, far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(
            hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(far), hyper::service::service_fn(app)),
        );
        let mut request = Request::get("/x")
            .header(
                header::COOKIE,
                "__Host-rlark_proxy=secret; app=1; __Host-rlark_session=secret2",
            )
            .body(Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(AuthMethod::ProxyCookie { token_id: None });
        let prefix = "/rlark/v1/namespaces/n/tasks/t/proxy/80";
        let mut response = relay(Box::new(near), "app:80", "x", request, Some(prefix)).await;
        super::super::task_proxy::strip_rlark_cookies(response.headers_mut());
        let cookies: Vec<&str> = response
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(cookies, [format!("app=1; Path={prefix}/")]);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "app=1", "only the app's own cookie is forwarded");
        assert!(is_rlark_cookie(b" __Host-rlark_x=1"));
        assert!(!is_rlark_cookie(b"__Host-other=1"));
    }

    /// An app that accepts any upgrade and echoes the bytes after it.
    async fn echo_app(
        mut request: http::Request<hyper::body::Incoming>,
    ) -> Result<Response, Infallible> {
        let upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = upgrade.await {
                let (mut read, mut write) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut read, &mut write).await;
            }
        });
        Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .body(Body::empty())
            .unwrap())
    }

    #[tokio::test]
    async fn a_proxied_websocket_closes_when_its_console_session_ends() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn rlark_store::Store> = Arc::new(
            rlark_store::SqliteStore::open(rlark_store::SqliteStoreConfig::new(
                dir.path().join("rlark.db"),
            ))
            .await
            .unwrap(),
        );
        let sessions = Arc::new(crate::console::sessions::Sessions::new(store));
        let alice = Identity {
            user: "alice".into(),
            groups: vec![],
        };
        let (id, _) = sessions.create(alice, None).await.unwrap();
        let end = crate::console::sessions::SessionEnd::new(
            Arc::clone(&sessions),
            crate::console::sessions::digest(&id),
        );
        // The front: what the server does with an upgrade request it relays.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let end = end.clone();
                    async move {
                        let (near, far) = tokio::io::duplex(64 * 1024);
                        tokio::spawn(
                            hyper::server::conn::http1::Builder::new()
                                .serve_connection(
                                    TokioIo::new(far),
                                    hyper::service::service_fn(echo_app),
                                )
                                .with_upgrades(),
                        );
                        let mut request = request.map(Body::new);
                        request.extensions_mut().insert(end);
                        Ok::<_, Infallible>(
                            relay(Box::new(near), "app:80", "ws", request, None).await,
                        )
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades()
                .await;
        });
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /ws HTTP/1.1\r\nHost: rlark\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            client.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        client.write_all(b"ping").await.unwrap();
        let mut echo = [0u8; 4];
        client.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, b"ping");
        // Logout: the upgraded connection closes.
        assert!(sessions.remove(&id).await.unwrap());
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            client.read_to_end(&mut rest),
        )
        .await
        .expect("the WebSocket closes with the session");
        assert_eq!(closed.unwrap(), 0);
    }
}
