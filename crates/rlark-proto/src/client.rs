//! Dialing the embodied runtime's unix sockets (rlark's agent and CLI, tests, other Rust
//! clients), and asking StartRobot for an owner ([`Ownership`]).

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A socket could not be reached.
#[derive(Debug, thiserror::Error)]
#[error("connect to {}: {message}", path.display())]
pub struct ConnectError {
    pub path: PathBuf,
    pub message: String,
}

/// A gRPC channel to the unix socket at `path`. Connects now (so a missing or dead socket
/// fails here) and reconnects to the same path when the connection drops.
pub async fn connect(path: impl AsRef<Path>) -> Result<Channel, ConnectError> {
    let path = path.as_ref().to_path_buf();
    let target = path.clone();
    // The URI is required by the API but unused: every connection goes to `path`.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let target = target.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(target).await?)) }
        }))
        .await
        .map_err(|e| {
            // tonic's transport error hides the io error in its source chain.
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(inner) = source {
                message = format!("{message}: {inner}");
                source = inner.source();
            }
            ConnectError { path, message }
        })
}

/// Who a StartRobot call asks to own the robot (docs/embodied.md, "Safety watchdog").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// The calling process (no metadata): the robot stops when it exits or stays
    /// disconnected past the watchdog.
    Process,
    /// The caller's replica (`rlark-owner: LABEL`): the robot stops when the caller's
    /// session leader exits.
    Replica(String),
    /// Nobody (`rlark-detach: true`): no watchdog; stop it yourself.
    Detached,
}

impl Ownership {
    /// [`Ownership::Replica`] with the label in `RLINF_EMBODIED_OWNER` (set by rlark's
    /// agent for replicas holding devices) when it is set and not empty, else `otherwise`.
    pub fn from_env_or(otherwise: Ownership) -> Ownership {
        match std::env::var(crate::sockets::OWNER_ENV) {
            Ok(label) if !label.trim().is_empty() => Ownership::Replica(label.trim().to_string()),
            _ => otherwise,
        }
    }

    /// Put the metadata for this ownership on a StartRobot request. A label that is not
    /// valid metadata is left out (the runtime then applies the process rule).
    pub fn apply<T>(&self, request: &mut tonic::Request<T>) {
        use crate::sockets::{DETACH_METADATA, OWNER_METADATA};
        match self {
            Ownership::Process => {}
            Ownership::Detached => {
                request.metadata_mut().insert(
                    DETACH_METADATA,
                    tonic::metadata::MetadataValue::from_static("true"),
                );
            }
            Ownership::Replica(label) => match label.parse() {
                Ok(value) => {
                    request.metadata_mut().insert(OWNER_METADATA, value);
                }
                Err(_) => {
                    tracing::warn!(owner = %label, "owner label is not valid gRPC metadata; not sent");
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_becomes_metadata() {
        let mut request = tonic::Request::new(());
        Ownership::Replica("rlark-lab/job-0".into()).apply(&mut request);
        assert_eq!(
            request
                .metadata()
                .get("rlark-owner")
                .and_then(|v| v.to_str().ok()),
            Some("rlark-lab/job-0")
        );
        assert!(request.metadata().get("rlark-detach").is_none());
        let mut request = tonic::Request::new(());
        Ownership::Detached.apply(&mut request);
        assert_eq!(
            request
                .metadata()
                .get("rlark-detach")
                .and_then(|v| v.to_str().ok()),
            Some("true")
        );
        let mut request = tonic::Request::new(());
        Ownership::Process.apply(&mut request);
        assert!(request.metadata().is_empty());
    }
}
