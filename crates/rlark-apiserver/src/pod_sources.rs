//! Where the logs and exec of core Pods come from when this server stores them: the seams
//! behind `GET .../pods/{name}/log` and `.../pods/{name}/exec` for a Pod kind served as
//! stored objects (an extra kind with
//! [`log_subresource`](crate::registry::ResourceType::log_subresource), given in
//! [`ApiServerOptions::extra_kinds`](crate::ApiServerOptions::extra_kinds)).
//!
//! The server checks each request as kube-apiserver does (the Pod exists, the container is
//! one of its containers, it has started or runs) and then asks the source the
//! [`PodSources`] of [`ApiServerOptions::pod_sources`](crate::ApiServerOptions::pod_sources)
//! names: [`PodLogSource`] for the text of a log, [`PodExecSource`] for the local process
//! that stands for the container's in an exec (no container, no terminal). Without a source,
//! the subresource answers `404`.
//!
//! `rlark server` sets none of this: its core Pods are the read-only view of the replicas
//! ([`crate::replicas`]), whose log and exec the process routes to the agents itself. The
//! test kit's simulated member cluster (`rlark_testkit::kubesim`) is what uses it.

use std::sync::Arc;

use futures::stream::BoxStream;

/// The sources of stored Pods' logs and execs ([`ApiServerOptions::pod_sources`](crate::ApiServerOptions::pod_sources)).
#[derive(Clone, Default)]
pub struct PodSources {
    /// Answers every `GET .../pods/{name}/log` the server has checked (the Pod exists, the
    /// container is one of its containers); without one, log is answered `404`.
    pub logs: Option<Arc<dyn PodLogSource>>,
    /// Prepares the process of every `GET .../pods/{name}/exec` the server has checked;
    /// without one, exec is answered `404`.
    pub exec: Option<Arc<dyn PodExecSource>>,
}

impl std::fmt::Debug for PodSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSources")
            .field("logs", &self.logs.is_some())
            .field("exec", &self.exec.is_some())
            .finish()
    }
}

/// One log request, as `PodLogOptions` gives it, after the server resolved the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLogRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Keep the stream open and send what is written later, until the container ends.
    pub follow: bool,
    /// The previous (terminated) instance of the container.
    pub previous: bool,
    /// Only the last this many lines.
    pub tail_lines: Option<u64>,
    /// Only lines written at most this many seconds ago (`sinceSeconds`, or `sinceTime`
    /// converted by the server).
    pub since_seconds: Option<u64>,
    /// Prefix each line with its RFC 3339 time and a space.
    pub timestamps: bool,
}

/// The text of a log: chunks of bytes, in order, ending when the log is complete (at once
/// without `follow`; when the container ends with it).
pub type LogStream = BoxStream<'static, bytes::Bytes>;

/// Why a log cannot be read or an exec cannot start; the server answers with the matching
/// `Status`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PodLogError {
    /// 400, e.g. `previous terminated container "c" in pod "p" not found`.
    #[error("{0}")]
    BadRequest(String),
    /// 404.
    #[error("{0}")]
    NotFound(String),
}

/// A source of container logs (the test kit's simulated member cluster has one).
pub trait PodLogSource: Send + Sync + 'static {
    /// Open the log `request` names. Called only for a Pod that exists and a container
    /// of its spec.
    fn open(&self, request: &PodLogRequest) -> Result<LogStream, PodLogError>;
}

/// One exec request, after the server checked the Pod and resolved the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodExecRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// Program and arguments, as given (no shell).
    pub command: Vec<String>,
}

/// What runs an exec into a stored Pod (the test kit's simulated member cluster has one): a
/// local process stands for the container's.
pub trait PodExecSource: Send + Sync + 'static {
    /// The process for `request`: program, arguments, working directory and environment.
    /// The server sets its stdio and starts it; it is killed when the client goes away.
    /// Called only for a Pod that exists and a running container of its spec.
    fn command(&self, request: &PodExecRequest) -> Result<std::process::Command, PodLogError>;
}
