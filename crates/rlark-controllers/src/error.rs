//! Errors of reconcilers, named by the failed step.

/// A reconcile failure. Every variant is retried with capped backoff by the error policy
/// of the controller that hit it, except where the reconciler decides otherwise.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("object {0} has no name")]
    MissingName(String),
    #[error("decode {what}: {source}")]
    Decode {
        what: String,
        source: serde_json::Error,
    },
    #[error("{0}")]
    Invalid(String),
    /// The Pod cache of the Task controller stopped (its watch ended for good).
    #[error("pod cache unavailable: {0}")]
    CacheUnavailable(String),
    /// A controller task ended before shutdown was requested (it panicked or its watch
    /// stream ended).
    #[error("controller {controller} stopped unexpectedly: {message}")]
    ControllerStopped {
        controller: &'static str,
        message: String,
    },
}

impl Error {
    /// Whether the API answered 409 Conflict (a stale resourceVersion): worth an immediate
    /// retry on fresh data rather than a long backoff.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 409)
    }

    /// Whether the API answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(status)) if status.code == 404)
    }
}
