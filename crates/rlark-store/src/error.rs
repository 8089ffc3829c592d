use crate::ObjectKey;

/// Errors of store operations, named by what failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{} {:?} already exists", .0.resource, display_name(.0))]
    AlreadyExists(ObjectKey),
    #[error("{} {:?} not found", .0.resource, display_name(.0))]
    NotFound(ObjectKey),
    #[error("conflict on {} {:?}: expected resourceVersion {expected}, stored {actual}", .key.resource, display_name(.key))]
    Conflict {
        key: ObjectKey,
        expected: u64,
        actual: u64,
    },
    #[error("revision {requested} has been compacted (oldest available is {oldest})")]
    Expired { requested: u64, oldest: u64 },
    #[error("invalid object: {0}")]
    InvalidObject(String),
    #[error("database: {0}")]
    Database(String),
    /// The database cannot be reached right now (connection lost, server down); nothing of
    /// the request was applied, and trying again later may succeed (HTTP 503 with
    /// `Retry-After`).
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("store is shut down")]
    Closed,
}

fn display_name(key: &ObjectKey) -> String {
    if key.namespace.is_empty() {
        key.name.clone()
    } else {
        format!("{}/{}", key.namespace, key.name)
    }
}
