//! `GET /rlark/v1/backup` (admins only): every object of the store at one revision, in the
//! backup format of [`rlark_store::backup`], streamed from memory. What `rlark backup` saves
//! from a running server; `rlark restore` writes it into an empty store (docs/operations.md).

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http::{StatusCode, header};
use rlark_apiserver::auth::{Identity, Role};
use rlark_apiserver::error::ApiError;

use crate::ServerStore;

/// The route.
pub(crate) const ROUTE: &str = "/rlark/v1/backup";
/// Body frames of about this size.
const CHUNK_BYTES: usize = 64 * 1024;
/// The revision of the snapshot, also in the body's first line.
pub(crate) const REVISION_HEADER: &str = "x-rlark-revision";

/// The route, over the server's store.
pub(crate) fn router(store: ServerStore) -> Router {
    Router::new().route(ROUTE, get(backup)).with_state(store)
}

async fn backup(
    State(store): State<ServerStore>,
    identity: Option<axum::Extension<Identity>>,
) -> Response {
    let Some(axum::Extension(identity)) = identity else {
        return ApiError::new(401, "Unauthorized", "Unauthorized".to_string()).into_response();
    };
    // A backup holds every object, tokens and Secrets included: admins only.
    if identity.role() != Role::Admin {
        tracing::warn!(user = %identity.user, "backup refused: not an admin");
        return ApiError::new(
            403,
            "Forbidden",
            format!(
                "forbidden: User \"{}\" cannot get path \"{ROUTE}\": only admins may take a backup",
                identity.user
            ),
        )
        .into_response();
    }
    let snapshot = Arc::new(store.snapshot());
    tracing::info!(
        user = %identity.user,
        objects = snapshot.objects.len(),
        revision = snapshot.revision,
        "backup taken"
    );
    let revision = snapshot.revision.to_string();
    let chunks = snapshot
        .chunks(CHUNK_BYTES)
        .map(|chunk| Ok::<_, std::convert::Infallible>(bytes::Bytes::from(chunk)));
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::HeaderName::from_static(REVISION_HEADER),
                revision.as_str(),
            ),
        ],
        Body::from_stream(futures::stream::iter(chunks)),
    )
        .into_response()
}
