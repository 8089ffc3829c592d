//! Response bodies of the agent's local API (`api.rs`: logs; `exec.rs`: exec).

use std::io;

use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;

/// A response body of the local API.
pub type ApiBody = UnsyncBoxBody<Bytes, io::Error>;

/// A plain-text response of `status` with `message` (a newline added when missing).
pub(crate) fn text_response(
    status: http::StatusCode,
    message: impl Into<String>,
) -> http::Response<ApiBody> {
    let mut text = message.into();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let body = Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
