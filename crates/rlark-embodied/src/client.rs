//! Dialing the embodied runtime's unix sockets (the CLI, tests, other Rust clients).

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
