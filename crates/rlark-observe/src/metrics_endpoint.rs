//! The one `/metrics` responder of every rlark process: a Prometheus-client [`Registry`] in
//! OpenMetrics text ([`exposition`]), and the small plain-HTTP/1 listener that serves it
//! ([`MetricsListener`]: `rlark agent --metrics-listen`, `rlark embodied --metrics-listen`,
//! `rlark controller-manager`). `rlark server` answers its authenticated `/metrics` route
//! with [`exposition`] too.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The content type of [`exposition`]'s body (what prometheus-client's text encoder writes).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A complete response of the metrics listener.
pub type Response = http::Response<Full<Bytes>>;

/// `registry` in OpenMetrics text, followed by the metrics every process shares
/// ([`crate::process_metrics`]: `process_*` and `rlark_build_info`): `200` with
/// [`CONTENT_TYPE`], or `500` naming the encoding error (a collector that failed to encode).
pub fn exposition(registry: &Registry) -> Response {
    use prometheus_client::encoding::text::{encode_eof, encode_registry};
    let process = crate::process_metrics::registry(&crate::process_metrics::sample());
    let mut body = String::new();
    let encoded = encode_registry(&mut body, registry)
        .and_then(|()| encode_registry(&mut body, &process))
        .and_then(|()| encode_eof(&mut body));
    match encoded {
        Ok(()) => text(StatusCode::OK, CONTENT_TYPE, body),
        Err(error) => {
            tracing::error!(%error, "encoding metrics failed");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                format!("encode metrics: {error}\n"),
            )
        }
    }
}

/// The answer of a metrics-only listener to `GET path`: [`exposition`] for `/metrics`, `404`
/// for anything else.
pub fn response(path: &str, registry: &Registry) -> Response {
    if path == "/metrics" {
        exposition(registry)
    } else {
        text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".to_string(),
        )
    }
}

/// A response with `status`, `content_type` and `body`.
pub fn text(status: StatusCode, content_type: &'static str, body: String) -> Response {
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A bound, not yet serving, plain-HTTP/1 metrics listener. Bind it before the rest of the
/// process starts, so that a bad address fails fast, and serve it once the registry exists.
#[derive(Debug)]
pub struct MetricsListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl MetricsListener {
    /// Bind `addr` (port 0 picks a free port; see [`MetricsListener::local_addr`]).
    pub async fn bind(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        Ok(MetricsListener { listener, addr })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serve `GET /metrics` from `registry` (anything else `404`, see [`response`]) until
    /// `shutdown` is cancelled.
    pub async fn serve(self, registry: Arc<Registry>, shutdown: CancellationToken) {
        self.serve_with(move |path| response(path, &registry), shutdown)
            .await;
    }

    /// Answer every request with `route(path)` (for a listener that serves more than
    /// `/metrics`, such as health checks) until `shutdown` is cancelled; open connections
    /// are dropped then. Accept errors (e.g. out of file descriptors) are logged and retried.
    pub async fn serve_with<R>(self, route: R, shutdown: CancellationToken)
    where
        R: Fn(&str) -> Response + Send + Sync + 'static,
    {
        let route = Arc::new(route);
        loop {
            let stream = tokio::select! {
                () = shutdown.cancelled() => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        tracing::warn!(%error, addr = %self.addr, "metrics listener accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let route = route.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: http::Request<Incoming>| {
                        let response = route(request.uri().path());
                        async move { Ok::<_, Infallible>(response) }
                    });
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    result = conn => if let Err(error) = result {
                        tracing::debug!(%error, "metrics connection ended");
                    },
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;
    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn registry_with_counter() -> Registry {
        let mut registry = Registry::with_prefix("test");
        let counter = Counter::<u64>::default();
        counter.inc_by(3);
        registry.register("things", "Things seen", counter);
        registry
    }

    async fn body(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_text_and_other_paths_404() {
        let registry = registry_with_counter();
        let ok = response("/metrics", &registry);
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        let text = body(ok).await;
        assert!(text.contains("test_things_total 3"), "{text}");
        assert!(text.contains("process_resident_memory_bytes "), "{text}");
        assert!(text.contains("rlark_build_info{version=\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        assert_eq!(
            response("/", &registry).status(),
            StatusCode::NOT_FOUND,
            "only /metrics is served"
        );
    }

    #[tokio::test]
    async fn the_listener_serves_over_http_until_shutdown() {
        let listener = MetricsListener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = listener.local_addr();
        assert_ne!(addr.port(), 0, "the bound port, not the requested one");
        let shutdown = CancellationToken::new();
        let server =
            tokio::spawn(listener.serve(Arc::new(registry_with_counter()), shutdown.clone()));

        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.contains("test_things_total 3"), "{answer}");

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serving stops on shutdown")
            .unwrap();
    }
}
