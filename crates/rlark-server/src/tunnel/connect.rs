//! HTTP `CONNECT` on the server's HTTPS port: unmodified tools (curl `-x`/`--proxy`,
//! Prometheus `proxy_url`, kubectl `proxy-url`) reach addresses behind an agent, as
//! yurt-tunnel's interceptor lets them. Two forms of authority:
//!
//! - `<host>.<clusterID>.agent:<port>` (admins only): `<host>` as the agent resolves it,
//!   so `127.0.0.1.edge.agent:9100` is port 9100 on the `edge` agent's own host;
//! - `<pod>.<namespace>.pod:<port>`: a port of replica `namespace/pod`, reached as
//!   `kubectl port-forward` reaches it (the same authorization — admins, or the Job's
//!   `spec.access` — the same destination, audit and per-user stream share;
//!   [`super::portforward::locate`]). `rlark port-forward pod/NAME` and `task/NAME` use it.
//!
//! Authentication is the connection's client certificate or `Proxy-Authorization: Bearer`
//! (see `auth.rs`).

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{Request, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;

use super::exec::{ExecState, PodCaller};
use super::{HubStream, parse_agent_authority, routes::dial_error_response};

/// Bytes per copy each way between the client connection and the tunnel stream.
const COPY_BUFFER: usize = 64 * 1024;

/// Serve one CONNECT request (already authenticated, or anonymous).
pub(crate) async fn handle(state: ExecState, mut request: Request<Incoming>) -> Response {
    let hub = Arc::clone(&state.hub);
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        let mut response = ApiError::new(
            407,
            "Unauthorized",
            "CONNECT needs a client certificate or Proxy-Authorization: Bearer <token>",
        )
        .into_response();
        response.headers_mut().insert(
            header::PROXY_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer"),
        );
        return response;
    };
    let Some(authority) = request.uri().authority().map(|a| a.to_string()) else {
        return ApiError::bad_request(
            "CONNECT needs an authority: <host>.<clusterID>.agent:<port> or \
             <pod>.<namespace>.pod:<port>",
        )
        .into_response();
    };
    let (stream, cluster, host, port) = match parse_pod_authority(&authority) {
        Some(parsed) => {
            let (namespace, pod, port) = match parsed {
                Ok(parsed) => parsed,
                Err(message) => return ApiError::bad_request(message).into_response(),
            };
            match pod_stream(&state, identity.clone(), &namespace, &pod, port).await {
                Ok((stream, cluster, host)) => (stream, cluster, host, port),
                Err(response) => return *response,
            }
        }
        None => {
            if identity.role() != Role::Admin {
                return ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "forbidden: User \"{}\" cannot CONNECT through agents (admins only)",
                        identity.user
                    ),
                )
                .into_response();
            }
            let (host, cluster, port) = match parse_agent_authority(&authority) {
                Ok(parsed) => parsed,
                Err(message) => return ApiError::bad_request(message).into_response(),
            };
            match hub.dial(&cluster, None, &host, port).await {
                Ok(stream) => (stream, cluster, host, port),
                Err(error) => {
                    return dial_error_response(&format!("{host}:{port}"), &cluster, &error);
                }
            }
        }
    };
    let on_upgrade = hyper::upgrade::on(&mut request);
    let user = identity.user;
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "CONNECT upgrade failed");
                return;
            }
        };
        let mut client = TokioIo::new(upgraded);
        let mut stream = stream;
        // 64 KiB copies: a TLS record carries up to 16 KiB, and tokio's default 8 KiB
        // buffers halve every record into two writes on a bulk transfer.
        match tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut stream,
            COPY_BUFFER,
            COPY_BUFFER,
        )
        .await
        {
            Ok((up, down)) => {
                tracing::debug!(%user, %cluster, %host, port, up, down, "CONNECT tunnel closed")
            }
            Err(error) => {
                tracing::debug!(%user, %cluster, %host, port, %error, "CONNECT tunnel ended")
            }
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::OK;
    response
}

/// `<pod>.<namespace>.pod:<port>` → (namespace, pod, port); `None` when the authority is
/// not of that form (no `.pod` before the port), `Some(Err)` naming what is wrong when it
/// is but does not parse.
fn parse_pod_authority(authority: &str) -> Option<Result<(String, String, u16), String>> {
    let (name, port) = authority.rsplit_once(':')?;
    let rest = name.strip_suffix(".pod")?;
    let parsed = (|| {
        let port: u16 =
            port.parse().ok().filter(|p| *p > 0).ok_or_else(|| {
                format!("{authority:?}: port {port:?} is not a number in 1..=65535")
            })?;
        let (pod, namespace) = rest
            .rsplit_once('.')
            .filter(|(pod, namespace)| !pod.is_empty() && !namespace.is_empty())
            .ok_or_else(|| {
                format!(
                    "{authority:?} names no pod and namespace; use <pod>.<namespace>.pod:<port>"
                )
            })?;
        Ok((namespace.to_string(), pod.to_string(), port))
    })();
    Some(parsed)
}

/// A stream to `port` of replica `namespace/pod`, authorized and audited as
/// `pods/portforward` (module docs): (stream, cluster, host dialed).
async fn pod_stream(
    state: &ExecState,
    identity: Identity,
    namespace: &str,
    pod: &str,
    port: u16,
) -> Result<(HubStream, String, String), Box<Response>> {
    let caller = PodCaller::authorize(state, Some(identity), namespace, pod, "portforward")
        .await
        .map_err(|error| Box::new((*error).into_response()))?;
    let (cluster, destination) = super::portforward::locate(state, namespace, pod)
        .await
        .map_err(|error| Box::new((*error).into_response()))?;
    caller.audit(
        "portforward",
        format!("CONNECT to port {port} at {}", destination.host),
    );
    let share = state
        .hub
        .user_share(&cluster, &caller.identity.user)
        .map_err(|error| {
            Box::new(dial_error_response(
                &format!("{pod}:{port}"),
                &cluster,
                &error,
            ))
        })?;
    let stream = destination
        .dial(&state.hub, &cluster, port)
        .await
        .map_err(|error| {
            Box::new(dial_error_response(
                &format!("port {port} of pod {namespace}/{pod}"),
                &cluster,
                &error,
            ))
        })?;
    Ok((stream.with_share(share), cluster, destination.host))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_authorities_parse_and_others_are_left_to_the_agent_form() {
        assert_eq!(
            parse_pod_authority("echo-main-0.rlark-edge.pod:8080"),
            Some(Ok(("rlark-edge".into(), "echo-main-0".into(), 8080)))
        );
        assert_eq!(parse_pod_authority("127.0.0.1.edge.agent:9100"), None);
        assert_eq!(parse_pod_authority("example.com:443"), None);
        for bad in [
            "x.rlark-a.pod:0",
            "x.rlark-a.pod:http",
            ".pod:80",
            "x.pod:80",
        ] {
            assert!(matches!(parse_pod_authority(bad), Some(Err(_))), "{bad}");
        }
    }
}
