//! Errors as Kubernetes `Status` objects. Every failure of a request becomes one
//! [`ApiError`], and this is the one place that turns it into a response.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use rlark_store::StoreError;
use serde_json::{Value, json};

use crate::registry::ResourceType;

/// One cause inside `Status.details.causes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    /// Kubernetes CauseType, e.g. `FieldValueInvalid`, `FieldValueNotSupported`.
    pub reason: String,
    pub message: String,
    /// JSON path of the field, e.g. `spec.tasks[0].role`.
    pub field: String,
}

/// A failed request, rendered as a `meta/v1 Status` with matching HTTP code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    /// StatusReason, e.g. `NotFound`, `Invalid`, `Conflict`.
    pub reason: &'static str,
    pub message: String,
    /// `details.name`, `details.group`, `details.kind` when about one object.
    pub name: Option<String>,
    pub group: Option<String>,
    /// For details: the resource's plural (Kubernetes puts the resource here for most
    /// errors and the kind for `Invalid`).
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    /// Seconds the client should wait before retrying (429/503/504).
    pub retry_after_seconds: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: Vec::new(),
            retry_after_seconds: None,
        }
    }

    fn about(mut self, rt: &ResourceType, name: &str, kind: String) -> Self {
        self.name = Some(name.to_string());
        self.group = Some(rt.group.clone());
        self.kind = Some(kind);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// A request the caller may not make, worded as kube-apiserver's `NewForbidden`:
    /// `jobs.rlinf.io "j1" is forbidden: <reason>` (`plural` alone for the core group; no
    /// quoted name when `name` is `None` or empty), with `details: {name, group, kind:
    /// <plural>}` (empty name and group omitted). `resource` is the plural without
    /// subresource; the reason names the subresource when there is one.
    pub fn forbidden_resource(
        group: &str,
        resource: &str,
        name: Option<&str>,
        reason: &str,
    ) -> Self {
        let qualified = if group.is_empty() {
            resource.to_string()
        } else {
            format!("{resource}.{group}")
        };
        let name = name.filter(|n| !n.is_empty());
        let message = match name {
            Some(name) => format!("{qualified} \"{name}\" is forbidden: {reason}"),
            None => format!("{qualified} is forbidden: {reason}"),
        };
        let mut error = Self::new(403, "Forbidden", message);
        error.name = name.map(str::to_string);
        error.group = Some(group.to_string());
        error.kind = Some(resource.to_string());
        error
    }

    /// `jobs.rlinf.io "x" not found`
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", rt.qualified_name(), name),
        )
        .about(rt, name, rt.plural.clone())
    }

    /// A path or resource that this server does not serve.
    pub fn path_not_found(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", rt.qualified_name(), name),
        )
        .about(rt, name, rt.plural.clone())
    }

    /// Optimistic-concurrency failure, worded as kube-apiserver words it.
    pub fn conflict(rt: &ResourceType, name: &str, detail: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                rt.qualified_name(),
                name,
                detail
            ),
        )
        .about(rt, name, rt.plural.clone())
    }

    /// Validation failure: 422 with one cause per field problem.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| {
                if c.field.is_empty() {
                    c.message.clone()
                } else {
                    format!("{}: {}", c.field, c.message)
                }
            })
            .collect();
        // Kubernetes qualifies the kind with its group (`Job.rlinf.io "x" is invalid`).
        let kind = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let message = match summary.len() {
            1 => format!("{} \"{}\" is invalid: {}", kind, name, summary[0]),
            _ => format!("{} \"{}\" is invalid: [{}]", kind, name, summary.join(", ")),
        };
        let mut error = Self::new(422, "Invalid", message).about(rt, name, rt.kind.clone());
        error.causes = causes;
        error
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/json-patch+json (got {content_type:?})"
            ),
        )
    }

    pub fn request_entity_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit} bytes"),
        )
    }

    /// A resourceVersion too old to serve (watch or continue token).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        let mut error = Self::new(503, "ServiceUnavailable", message);
        error.retry_after_seconds = Some(1);
        error
    }

    /// Translate a store failure about object `name` of `rt`.
    pub fn from_store(error: StoreError, rt: &ResourceType, name: &str) -> Self {
        match error {
            StoreError::AlreadyExists(_) => Self::already_exists(rt, name),
            StoreError::NotFound(_) => Self::not_found(rt, name),
            StoreError::Conflict { .. } => Self::conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ),
            StoreError::Expired { requested, oldest } => {
                Self::gone(format!("too old resource version: {requested} ({oldest})"))
            }
            StoreError::InvalidObject(message) => Self::bad_request(message),
            StoreError::Database(message) => Self::internal(message),
            StoreError::Unavailable(message) => {
                Self::service_unavailable(format!("the store is unavailable: {message}"))
            }
            StoreError::Closed => Self::service_unavailable("the server is shutting down"),
        }
    }

    /// The `Status` object (also used inside watch `ERROR` events).
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(name) = &self.name {
            details.insert("name".into(), json!(name));
        }
        if let Some(group) = self.group.as_ref().filter(|g| !g.is_empty()) {
            details.insert("group".into(), json!(group));
        }
        if let Some(kind) = &self.kind {
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(seconds) = self.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(seconds));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl From<&rlark_api::validation::FieldError> for Cause {
    fn from(error: &rlark_api::validation::FieldError) -> Self {
        Self {
            reason: error.cause_type().to_string(),
            message: error.body(),
            field: error.field.clone(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.status().to_string();
        let mut response = (
            code,
            [(http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response();
        if let Some(seconds) = self.retry_after_seconds
            && let Ok(value) = http::HeaderValue::from_str(&seconds.to_string())
        {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_lists_every_cause_in_message_and_details() {
        let rt = ResourceType::namespace();
        let error = ApiError::invalid(
            &rt,
            "x",
            vec![
                Cause {
                    reason: "FieldValueRequired".into(),
                    message: "Required value".into(),
                    field: "spec.a".into(),
                },
                Cause {
                    reason: "FieldValueInvalid".into(),
                    message: "bad".into(),
                    field: "spec.b".into(),
                },
            ],
        );
        assert_eq!(error.code, 422);
        assert_eq!(
            error.message,
            "Namespace \"x\" is invalid: [spec.a: Required value, spec.b: bad]"
        );
        let status = error.status();
        assert_eq!(status["details"]["causes"][1]["field"], "spec.b");
        assert_eq!(status["details"]["kind"], "Namespace");
        assert_eq!(status["reason"], "Invalid");
    }

    /// A store that cannot reach its database (PostgreSQL down) answers 503 with
    /// `Retry-After`, which clients retry; any other database error stays a 500.
    #[test]
    fn unavailable_store_is_503_with_retry_after() {
        let rt = ResourceType::namespace();
        let error = ApiError::from_store(
            StoreError::Unavailable("connection refused".into()),
            &rt,
            "x",
        );
        assert_eq!((error.code, error.retry_after_seconds), (503, Some(1)));
        assert!(
            error.message.contains("connection refused"),
            "{}",
            error.message
        );
        let response = error.into_response();
        assert_eq!(
            response
                .headers()
                .get(http::header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        let error = ApiError::from_store(StoreError::Database("disk I/O error".into()), &rt, "x");
        assert_eq!((error.code, error.retry_after_seconds), (500, None));
    }

    #[test]
    fn forbidden_resource_follows_kube_apiserver() {
        let status =
            ApiError::forbidden_resource("rlinf.io", "jobs", Some("j1"), "because").status();
        assert_eq!(
            status["message"],
            "jobs.rlinf.io \"j1\" is forbidden: because"
        );
        assert_eq!(
            (status["code"].as_u64(), status["reason"].as_str()),
            (Some(403), Some("Forbidden"))
        );
        assert_eq!(
            status["details"],
            json!({"name": "j1", "group": "rlinf.io", "kind": "jobs"})
        );
        let status = ApiError::forbidden_resource("", "events", None, "no").status();
        assert_eq!(status["message"], "events is forbidden: no");
        assert_eq!(status["details"], json!({"kind": "events"}));
    }

    #[test]
    fn not_found_names_the_resource() {
        let rt = ResourceType::lease();
        let status = ApiError::not_found(&rt, "l1").status();
        assert_eq!(
            status["message"],
            "leases.coordination.k8s.io \"l1\" not found"
        );
        assert_eq!(status["details"]["group"], "coordination.k8s.io");
        assert_eq!(status["code"], 404);
    }
}
