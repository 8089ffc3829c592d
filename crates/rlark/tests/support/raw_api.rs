//! Raw HTTP calls to an rlark server through a `kube::Client` (its TLS and credentials), for
//! tests that look at exactly what the server answered: status, headers, the body as text
//! and as JSON. Included with `#[path = "support/raw_api.rs"] mod raw_api;`.

// Each test binary that includes this file uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use http_body_util::BodyExt as _;
use serde_json::Value;

/// Upper bound of one call, answer and body included: a server that never answers fails
/// the test instead of hanging it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the server answered: status, headers, body text and the body as JSON (`Null` when
/// not JSON).
#[derive(Debug)]
pub struct Resp {
    pub code: u16,
    pub headers: http::HeaderMap,
    pub text: String,
    pub json: Value,
}

impl Resp {
    /// The `message` of a Kubernetes `Status` body (empty when there is none).
    pub fn message(&self) -> &str {
        self.json["message"].as_str().unwrap_or_default()
    }

    /// The `Retry-After` header.
    pub fn retry_after(&self) -> Option<&str> {
        self.headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
    }

    /// At most 400 characters of the body, for error messages (a refused 2.9 MB body is
    /// echoed in nothing but its Status, but a wrongly accepted one comes back whole).
    pub fn brief(&self) -> String {
        self.text.chars().take(400).collect()
    }
}

/// `method path` with `headers` and `body`; whatever the server answered within
/// [`CALL_TIMEOUT`].
pub async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Result<Resp> {
    let mut request = http::Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(kube::client::Body::from(body))
        .context("build request")?;
    let exchange = async {
        let response = client
            .send(request)
            .await
            .with_context(|| format!("{method} {path}"))?;
        let code = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response
            .into_body()
            .collect()
            .await
            .with_context(|| format!("read body of {method} {path}"))?
            .to_bytes();
        anyhow::Ok(Resp {
            code,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
            json: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    };
    tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .with_context(|| format!("{method} {path}: no answer within {CALL_TIMEOUT:?}"))?
}

/// Send `body` (raw bytes, of `content_type`), accepting JSON.
pub async fn call_raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Result<Resp> {
    let headers = [
        (http::header::CONTENT_TYPE.as_str(), content_type),
        (http::header::ACCEPT.as_str(), "application/json"),
    ];
    send(client, method, path, &headers, body).await
}

/// Send a JSON body (a merge patch for `PATCH`); `None` sends an empty body.
pub async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Resp> {
    let content_type = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    call_raw(client, method, path, content_type, bytes).await
}

/// Like [`call`], requiring a 2xx answer; returns its JSON.
pub async fn call_ok(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Value> {
    let resp = call(client, method, path, body).await?;
    ensure!(
        (200..300).contains(&resp.code),
        "{method} {path}: {} {}",
        resp.code,
        resp.brief()
    );
    Ok(resp.json)
}
