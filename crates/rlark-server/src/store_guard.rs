//! Refuse to start on a store that has lost the installation's data.
//!
//! The CA in `DATA_DIR/pki` is created at the first start. A later start that finds the CA
//! but a missing `rlark.db`, or one to which nothing was ever written (revision 0), would
//! silently begin again with no objects, tokens or certificate records while every
//! certificate of the CA still works; it is refused with [`ServerError::StoreLost`] unless
//! `ServerConfig::reinitialize_store` is set. Every start writes a marker record
//! (`installations.security.rlark.io/installation`: how and when the store was set up, and
//! the CA's hash then) right after opening the store if it is not there yet, so that a
//! first start that fails later (say, the port is taken) leaves a store that counts as
//! written. A store from a version without the marker holds data (revision above 0) and
//! is used and marked: an upgrade is not a loss.

use std::path::Path;

use rlark_store::{ObjectKey, Store, StoreError};
use serde_json::json;

use crate::{ServerError, ServerStore};

/// Store resource of the installation marker (not served by the API).
pub(crate) const INSTALLATIONS: &str = "installations.security.rlark.io";
/// Name of the one marker record.
pub(crate) const MARKER: &str = "installation";

/// Why the store cannot be used as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lost {
    /// `rlark.db` does not exist.
    Missing,
    /// It exists but holds nothing (never written, no marker).
    Empty,
}

/// The refusal, saying what is wrong and how to go on.
pub(crate) fn lost_error(lost: Lost, data_dir: &Path, db_path: &Path) -> ServerError {
    let what = match lost {
        Lost::Missing => "is missing",
        Lost::Empty => "is empty",
    };
    ServerError::StoreLost(format!(
        "refusing to start: the store {db} {what}, but the data directory {dir} has a CA \
         (pki/ca.crt), so a server has run here before. Starting would silently begin with \
         no objects, no tokens and no certificate records, while every certificate this CA \
         signed stays valid. To recover the data, restore {db} from a backup (with the server \
         stopped) and start again. To start with an empty store on purpose (the database is \
         lost for good, or this is the first start of a new replica given a copy of pki/), \
         start once with --reinitialize-store (config file: reinitializeStore: true); \
         revocations are kept beside the CA in pki/revocations.json and stay in force.",
        db = db_path.display(),
        dir = data_dir.display(),
    ))
}

/// Before opening the store: `Err` when the CA existed before this start, `db_path` is
/// missing and reinitializing was not asked for (opening would create an empty store).
pub(crate) fn check_before_open(
    ca_existed: bool,
    reinitialize: bool,
    data_dir: &Path,
    db_path: &Path,
) -> Result<(), ServerError> {
    if ca_existed && !reinitialize && !db_path.exists() {
        return Err(lost_error(Lost::Missing, data_dir, db_path));
    }
    Ok(())
}

/// After opening: refuse an empty store (revision 0) of an installation whose CA existed
/// before this start, unless reinitializing; write the marker when it is missing.
pub(crate) async fn check_after_open(
    store: &ServerStore,
    ca_existed: bool,
    reinitialize: bool,
    ca_cert_hash: &str,
    data_dir: &Path,
) -> Result<(), ServerError> {
    let key = ObjectKey::new(INSTALLATIONS, "", MARKER);
    let store_err = |source: StoreError| ServerError::OpenStore {
        path: store.location(),
        source,
    };
    let how = match (store.revision() > 0, ca_existed) {
        (true, _) if store.get(&key).await.map_err(store_err)?.is_some() => return Ok(()),
        (true, true) => {
            tracing::info!(
                store = %store.location().display(),
                "marking a store written by a version without installation markers"
            );
            "upgraded"
        }
        (true, false) => {
            tracing::warn!(
                store = %store.location().display(),
                "the store holds data but the data directory had no CA: a new CA was created, \
                 and certificates issued before are not valid any more"
            );
            "new-ca"
        }
        (false, false) => "created",
        (false, true) if reinitialize => {
            tracing::warn!(
                store = %store.location().display(),
                "--reinitialize-store: starting this installation on an empty store; its \
                 earlier objects, tokens and certificate records are gone (revocations are \
                 restored from pki/revocations.json)"
            );
            "reinitialized"
        }
        (false, true) => return Err(lost_error(Lost::Empty, data_dir, &store.location())),
    };
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let marker = json!({
        "metadata": {"name": MARKER},
        "spec": {"how": how, "at": now, "caHash": ca_cert_hash},
    });
    match store.create(&key, marker).await {
        Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
        Err(source) => Err(store_err(source)),
    }
}
