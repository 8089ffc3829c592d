//! Path-prefix rewriting for apps served under a sub-path by the task proxy
//! (`/rlark/v1/namespaces/{ns}/tasks/{name}/proxy/{port}/...`): an app that thinks it is at
//! `/` (TensorBoard, the Ray dashboard, Jupyter without `base_url`) emits absolute links,
//! redirects and cookie paths that would leave the prefix. The proxy tells the app where it
//! is (`X-Forwarded-Prefix`, for apps that honor it) and rewrites what comes back:
//!
//! - `Location: /x` → `Location: PREFIX/x` (absolute URLs and `//host` are left alone);
//! - `Set-Cookie: ...; Path=/x` → `Path=PREFIX/x`;
//! - in `text/html` bodies (at most [`MAX_HTML`]), the attributes `href`, `src`, `action`,
//!   `formaction` and `poster` whose value starts with one `/` get the prefix in front.
//!
//! Links already under the prefix are left as they are. Links built by scripts at run time
//! are not rewritten: such an app must be told its base path (most have an option).

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header;
use rlark_apiserver::error::ApiError;

/// Largest HTML body rewritten.
pub(crate) const MAX_HTML: usize = 8 * 1024 * 1024;
/// The attributes whose absolute paths are rewritten.
const ATTRIBUTES: [&str; 5] = ["href", "src", "action", "formaction", "poster"];

/// `value` with `prefix` in front when it is an absolute path outside the prefix.
pub(crate) fn rewrite_path(value: &str, prefix: &str) -> Option<String> {
    let under = value == prefix
        || value
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/') || rest.starts_with('?'));
    (value.starts_with('/') && !value.starts_with("//") && !under)
        .then(|| format!("{prefix}{value}"))
}

/// A `Set-Cookie` value with its `Path` under `prefix`.
pub(crate) fn rewrite_cookie(value: &str, prefix: &str) -> String {
    value
        .split(';')
        .map(|part| {
            let trimmed = part.trim_start();
            match trimmed.get(..5) {
                Some(name) if name.eq_ignore_ascii_case("path=") => {
                    let path = &trimmed[5..];
                    match rewrite_path(path, prefix) {
                        Some(path) => format!(" Path={path}"),
                        None => part.to_string(),
                    }
                }
                _ => part.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// `html` with the absolute paths of link attributes under `prefix`.
pub(crate) fn rewrite_html(html: &str, prefix: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let bytes = html.as_bytes();
    let mut out = String::with_capacity(html.len() + 64);
    let mut copied = 0;
    let mut at = 0;
    while let Some(found) = lower[at..].find('=') {
        let eq = at + found;
        at = eq + 1;
        // The attribute name right before `=` (no spaces, as HTML writers emit).
        let name_start = lower[..eq]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map_or(0, |i| i + 1);
        if !ATTRIBUTES.contains(&&lower[name_start..eq]) || name_start == 0 {
            continue;
        }
        let Some(&quote) = bytes.get(eq + 1) else {
            break;
        };
        if quote != b'"' && quote != b'\'' {
            continue;
        }
        let value_start = eq + 2;
        let Some(value_len) = html[value_start..].find(char::from(quote)) else {
            break;
        };
        let value = &html[value_start..value_start + value_len];
        if let Some(rewritten) = rewrite_path(value, prefix) {
            out.push_str(&html[copied..value_start]);
            out.push_str(&rewritten);
            copied = value_start + value_len;
        }
        at = value_start + value_len;
    }
    out.push_str(&html[copied..]);
    out
}

/// The app's answer with its redirects, cookie paths and HTML links under `prefix`.
pub(crate) async fn rewrite_response(
    mut parts: http::response::Parts,
    body: hyper::body::Incoming,
    prefix: &str,
) -> Response {
    if let Some(location) = parts
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| rewrite_path(v, prefix))
        .and_then(|v| http::HeaderValue::from_str(&v).ok())
    {
        parts.headers.insert(header::LOCATION, location);
    }
    let cookies: Vec<http::HeaderValue> = parts
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| http::HeaderValue::from_str(&rewrite_cookie(v, prefix)).ok())
        .collect();
    if !cookies.is_empty() {
        parts.headers.remove(header::SET_COOKIE);
        for cookie in cookies {
            parts.headers.append(header::SET_COOKIE, cookie);
        }
    }
    let html = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/html"));
    let encoded = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity");
    if !html || encoded {
        return Response::from_parts(parts, Body::new(body));
    }
    let bytes = match axum::body::to_bytes(Body::new(body), MAX_HTML).await {
        Ok(bytes) => bytes,
        Err(error) => {
            return ApiError::new(
                502,
                "BadGateway",
                format!(
                    "the app's HTML page could not be read for rewriting (at most {MAX_HTML} \
                     bytes): {error}"
                ),
            )
            .into_response();
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    let rewritten = rewrite_html(&text, prefix);
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(rewritten))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/rlark/v1/namespaces/rlark-a/tasks/t/proxy/6006";

    #[test]
    fn absolute_paths_move_under_the_prefix() {
        assert_eq!(
            rewrite_path("/data/x?y=1", P),
            Some(format!("{P}/data/x?y=1"))
        );
        assert_eq!(rewrite_path("/", P), Some(format!("{P}/")));
        for unchanged in ["//cdn.example/x.js", "https://x/", "relative/x", "#top", P] {
            assert_eq!(rewrite_path(unchanged, P), None, "{unchanged}");
        }
        assert_eq!(rewrite_path(&format!("{P}/already"), P), None);
        assert_eq!(
            rewrite_cookie("sid=1; Path=/; HttpOnly", P),
            format!("sid=1; Path={P}/; HttpOnly")
        );
    }

    #[test]
    fn html_links_move_under_the_prefix() {
        let html = r#"<a HREF="/runs">runs</a> <img src='/logo.png'> <a href="//cdn/x">
<form action="/submit"><a href="rel">r</a><a data-x="/keep">k</a><p>a=b</p><a title="/t">"#;
        let out = rewrite_html(html, P);
        assert_eq!(
            out,
            format!(
                r#"<a HREF="{P}/runs">runs</a> <img src='{P}/logo.png'> <a href="//cdn/x">
<form action="{P}/submit"><a href="rel">r</a><a data-x="/keep">k</a><p>a=b</p><a title="/t">"#
            )
        );
        // Idempotent: a page rewritten once (or by an app that honors the prefix) stays.
        assert_eq!(rewrite_html(&out, P), out);
    }
}
