//! The console's built files (`web/dist/`), embedded at build time by `build.rs`.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};

/// `(path, content type, bytes)` of every file under `web/dist/`, sorted by path.
static ASSETS: &[(&str, &str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/console_assets.rs"));

/// What the console's page may load and do: only this server's scripts, styles and API;
/// no inline scripts, no inline styles (`style` attributes, `<style>` elements), no
/// framing, no plugins. The app sets computed sizes through the CSSOM (`element.style`),
/// which a policy does not govern, and gives the terminal's (xterm.js) generated rules to
/// the page as constructed style sheets instead of `<style>` elements (`web/src/cspStyles.ts`).
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; font-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

pub(crate) fn find(path: &str) -> Option<(&'static str, &'static [u8])> {
    ASSETS
        .binary_search_by(|(p, _, _)| (*p).cmp(path))
        .ok()
        .map(|i| (ASSETS[i].1, ASSETS[i].2))
}

fn serve(path: &str, cache: &'static str) -> Response {
    let Some((content_type, bytes)) = find(path) else {
        return (StatusCode::NOT_FOUND, "not found").into_response();
    };
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// `GET /`: the app's page (never cached: it names the current asset files).
pub(crate) async fn index() -> Response {
    serve("/index.html", "no-cache")
}

/// `GET /assets/{path}`: content-hashed files, cached for good.
pub(crate) async fn asset(Path(path): Path<String>) -> Response {
    serve(
        &format!("/assets/{path}"),
        "public, max-age=31536000, immutable",
    )
}

/// `GET /favicon.svg`.
pub(crate) async fn favicon() -> Response {
    serve("/favicon.svg", "public, max-age=86400")
}
