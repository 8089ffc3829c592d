//! Binding the unix sockets the runtime serves on (the controllers' sockets in the socket
//! directory, the device plugin's in the kubelet directory).
//!
//! A socket file is created with mode 0660; a stale socket file left by a previous run is
//! removed, but a socket some live server still answers on is refused, as is a path that
//! is not a socket.

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Why a socket could not be bound at a path.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("{} is in use: another server answers on it", path.display())]
    InUse { path: PathBuf },
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("remove stale socket {}: {source}", path.display())]
    RemoveStale {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bind {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("set permissions of {}: {source}", path.display())]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Bind a socket at `path` (0660), replacing a stale socket file.
pub async fn bind(path: &Path) -> Result<UnixListener, BindError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if tokio::net::UnixStream::connect(path).await.is_ok() {
                return Err(BindError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(|source| BindError::RemoveStale {
                path: path.to_path_buf(),
                source,
            })?;
            tracing::info!(socket = %path.display(), "removed stale socket");
        }
        Ok(_) => {
            return Err(BindError::NotASocket {
                path: path.to_path_buf(),
            });
        }
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|source| BindError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)).map_err(|source| {
        BindError::Permissions {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(listener)
}
