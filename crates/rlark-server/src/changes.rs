//! `GET /rlark/v1/console/changes?resources=A,B`, served beside the console's routes: a
//! push of "this list changed" for the records that are not Kubernetes resources (tokens, certificates, revocations, join
//! tokens, SSH keys), so the console's admin and SSH keys pages follow changes made
//! anywhere (the page, the CLI, another replica) without polling. Each line of the
//! `application/x-ndjson` answer is one JSON object:
//!
//! - first `{"type": "BOOKMARK", "revision": "N"}`: the watch runs from revision N; read the
//!   lists after it and no change is missed;
//! - then `{"type": "CHANGED", "resource": "tokens", "revision": "M"}` for every change of a
//!   named list (the records themselves are read from their routes, which authorize);
//! - `{"type": "ERROR", "message": "..."}` and the end when the store's change log no longer
//!   covers the watch (the client opens it again and reads the lists anew).
//!
//! **Who**: `tokens`, `jointokens`, `certificates` and `revocations` are for admins only
//! (their routes are); `sshkeys` for every user, and a non-admin hears only of their own
//! keys. A request naming a list the caller may not follow is refused whole (403).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use http::{HeaderValue, header};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;
use rlark_store::{Store, StoreError};
use serde_json::json;

use crate::security::records::{BEARER_TOKENS, BOOTSTRAP_TOKENS, CERTIFICATES, REVOCATIONS};
use crate::ssh::keys::SSH_KEYS;

/// The lists a client may follow.
const LISTS: &[List] = &[
    ("tokens", BEARER_TOKENS, true),
    ("jointokens", BOOTSTRAP_TOKENS, true),
    ("certificates", CERTIFICATES, true),
    ("revocations", REVOCATIONS, true),
    ("sshkeys", SSH_KEYS, false),
];

/// A followable list: (name in the query, store resource, admins only).
type List = (&'static str, &'static str, bool);

/// The lists a query names (`resources=A,B`, percent-encoded or not), each once, in the
/// order of [`LISTS`].
fn parse(query: Option<&str>) -> Result<Vec<&'static List>, String> {
    let mut asked = Vec::new();
    for value in query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.strip_prefix("resources="))
    {
        let value = rlark_api::agent::local::percent_decode(value)
            .map_err(|e| format!("resources: {e}"))?;
        asked.extend(
            value
                .split(',')
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(String::from),
        );
    }
    if asked.is_empty() {
        return Err(format!(
            "name the lists to follow: ?resources=A,B with A, B among {}",
            names()
        ));
    }
    if let Some(unknown) = asked.iter().find(|a| !LISTS.iter().any(|(n, _, _)| n == a)) {
        return Err(format!(
            "unknown list {unknown:?}; the lists are {}",
            names()
        ));
    }
    Ok(LISTS
        .iter()
        .filter(|(name, _, _)| asked.iter().any(|a| a == name))
        .collect())
}

fn names() -> String {
    LISTS
        .iter()
        .map(|(n, _, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

fn line(value: serde_json::Value) -> bytes::Bytes {
    let mut text = value.to_string();
    text.push('\n');
    bytes::Bytes::from(text)
}

/// The route, over the store the records are kept in.
pub(crate) fn router(store: Arc<dyn Store>) -> Router {
    Router::new()
        .route("/rlark/v1/console/changes", get(changes))
        .with_state(store)
}

/// `GET /rlark/v1/console/changes`.
async fn changes(State(store): State<Arc<dyn Store>>, request: Request) -> Response {
    let Some(identity) = request.extensions().get::<Identity>().cloned() else {
        return ApiError::unauthorized().into_response();
    };
    let lists = match parse(request.uri().query()) {
        Ok(lists) => lists,
        Err(message) => return ApiError::bad_request(message).into_response(),
    };
    let admin = identity.role() == Role::Admin;
    if let Some((name, _, _)) = lists.iter().find(|(_, _, admins)| *admins && !admin) {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "user {:?} may not follow {name}: only admins read that list",
                identity.user
            ),
        )
        .into_response();
    }
    if matches!(
        identity.role(),
        Role::Agent { .. } | Role::Task { .. } | Role::Peer { .. }
    ) {
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "{:?} is not a user: the change stream is for people",
                identity.user
            ),
        )
        .into_response();
    }
    let from = store.revision();
    let mut streams = Vec::with_capacity(lists.len());
    for (name, resource, _) in &lists {
        match store.watch(resource, None, from).await {
            Ok(stream) => streams.push(stream.map(move |event| (*name, event)).boxed()),
            Err(error) => {
                return ApiError::new(500, "InternalError", format!("watch {name}: {error}"))
                    .into_response();
            }
        }
    }
    let user = identity.user.clone();
    let events = futures::stream::select_all(streams).filter_map(move |(name, event)| {
        let own =
            |object: &serde_json::Value| admin || object["record"]["user"].as_str() == Some(&user);
        let out = match event {
            Ok(event) if name != "sshkeys" || own(&event.object) => Some(Ok(line(json!({
                "type": "CHANGED",
                "resource": name,
                "revision": event.revision.to_string(),
            })))),
            Ok(_) => None,
            Err(StoreError::Expired { .. }) => Some(Err(line(json!({
                "type": "ERROR",
                "message": "the change log no longer covers this watch: read the lists again",
            })))),
            Err(error) => Some(Err(line(json!({
                "type": "ERROR",
                "message": format!("watch {name}: {error}"),
            })))),
        };
        std::future::ready(out)
    });
    // An error is the last line.
    let events = events.scan(false, |ended, item| {
        if *ended {
            return std::future::ready(None);
        }
        let bytes = match item {
            Ok(bytes) => bytes,
            Err(bytes) => {
                *ended = true;
                bytes
            }
        };
        std::future::ready(Some(Ok::<_, std::convert::Infallible>(bytes)))
    });
    let first = futures::stream::once(std::future::ready(Ok(line(json!({
        "type": "BOOKMARK",
        "revision": from.to_string(),
    })))));
    let mut response = Body::from_stream(first.chain(events)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-store"),
    );
    response
}
