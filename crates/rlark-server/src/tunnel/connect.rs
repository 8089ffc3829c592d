//! HTTP `CONNECT <host>.<clusterID>.agent:<port>` on the server's HTTPS port: unmodified
//! tools (curl `-x`/`--proxy`, Prometheus `proxy_url`, kubectl `proxy-url`) reach addresses
//! behind an agent, as yurt-tunnel's interceptor lets them. `<host>` is resolved by the
//! agent, so `127.0.0.1.edge.agent:9100` is port 9100 on the `edge` agent's own host.
//!
//! Authentication is the connection's client certificate or `Proxy-Authorization: Bearer`
//! (see `auth.rs`); only admins may tunnel.

use std::sync::Arc;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{Request, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;

use super::{Hub, parse_agent_authority, routes::dial_error_response};

/// Bytes per copy each way between the client connection and the tunnel stream.
const COPY_BUFFER: usize = 64 * 1024;

/// Serve one CONNECT request (already authenticated, or anonymous).
pub(crate) async fn handle(hub: Arc<Hub>, mut request: Request<Incoming>) -> Response {
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
    let Some(authority) = request.uri().authority().map(|a| a.to_string()) else {
        return ApiError::bad_request(
            "CONNECT needs an authority: <host>.<clusterID>.agent:<port>",
        )
        .into_response();
    };
    let (host, cluster, port) = match parse_agent_authority(&authority) {
        Ok(parsed) => parsed,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let stream = match hub.dial(&cluster, None, &host, port).await {
        Ok(stream) => stream,
        Err(error) => {
            return dial_error_response(&format!("{host}:{port}"), &cluster, &error);
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
