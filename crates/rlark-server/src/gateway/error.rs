//! The gateway's errors, and the one place they become responses. RLark's console reads a
//! failed call's JSON body as `{"error": ...}` (its cluster pages as `{"success": false,
//! "message": ...}`), so every error answer carries both.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

/// Why a gateway request failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    /// No credentials, or a session that ended (401).
    #[error("{0}")]
    Unauthenticated(String),
    /// Credentials that may not do this (403).
    #[error("{0}")]
    Forbidden(String),
    /// A malformed request (400).
    #[error("{0}")]
    BadRequest(String),
    /// Something the request names does not exist (404).
    #[error("{0}")]
    NotFound(String),
    /// A request body of the wrong media type (415).
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// A RLark gateway feature rlark does not have (501).
    #[error("{feature} is not provided by rlark: {why}")]
    NotProvided {
        feature: &'static str,
        why: &'static str,
    },
    /// The error answer of one of rlark's own routes, passed on with its code and reason.
    #[error("{message}")]
    Upstream {
        code: StatusCode,
        reason: String,
        message: String,
    },
    /// A failure of the gateway itself (500).
    #[error("{0}")]
    Internal(String),
}

impl GatewayError {
    fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotProvided { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::Upstream { code, .. } => *code,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn reason(&self) -> &str {
        match self {
            Self::Unauthenticated(_) => "Unauthorized",
            Self::Forbidden(_) => "Forbidden",
            Self::BadRequest(_) => "BadRequest",
            Self::NotFound(_) => "NotFound",
            Self::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Self::NotProvided { .. } => "NotProvided",
            Self::Upstream { reason, .. } => reason,
            Self::Internal(_) => "InternalError",
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        let message = self.to_string();
        if status.is_server_error() && !matches!(self, Self::NotProvided { .. }) {
            tracing::warn!(code = status.as_u16(), %message, "gateway request failed");
        }
        let mut body = json!({
            "success": false,
            "error": message,
            "message": message,
            "reason": self.reason(),
            "code": status.as_u16(),
        });
        if let Self::NotProvided { feature, .. } = &self {
            body["feature"] = json!(feature);
        }
        (status, Json(body)).into_response()
    }
}
