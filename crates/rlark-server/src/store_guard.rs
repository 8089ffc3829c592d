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
//!
//! The marker also records the installation's CA fingerprint (`caHash`, the `sha256:` pin
//! agents join with), and a start on a store whose marker names another CA is refused with
//! [`ServerError::ForeignStore`]: a store copied from another installation would otherwise
//! be served with its bearer tokens (an admin's among them) valid here (issue 38). A CA
//! rotation is not another installation: a marker naming a CA this server still trusts
//! (`pki/trusted/`, during the rotation) is moved to the new CA, keeping the old
//! fingerprints in `previousCaHashes`. A marker without a fingerprint gets the current one.

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

/// The refusal of a store whose marker names CA `stored` while this data directory's CA
/// is `current` (made by this start when `ca_existed` is false).
pub(crate) fn foreign_error(
    stored: &str,
    current: &str,
    ca_existed: bool,
    data_dir: &Path,
    location: &Path,
) -> ServerError {
    let pki = data_dir.join(crate::PKI_DIR);
    let ours = if ca_existed {
        format!(
            "this data directory's CA ({}/ca.crt) is {current}",
            pki.display()
        )
    } else {
        format!(
            "this data directory had no CA, so this start made one ({current}, in {})",
            pki.display()
        )
    };
    ServerError::ForeignStore(format!(
        "refusing to start: the store {store} belongs to another installation: it was set \
         up with the CA {stored}, and {ours}. Serving it here would accept that \
         installation's bearer tokens and find none of this one's certificates. To serve \
         this store, use the pki/ of the installation that wrote it: copy that data \
         directory's pki/ into {pki} (replacing what is there), or, when that installation \
         sealed its CA into the store (--ca-secret-file), start on an empty data directory \
         with the same secret. To keep this installation, point it at its own store (restore \
         one of its backups: rlark restore FILE --to ...).",
        store = location.display(),
        pki = pki.display(),
    ))
}

/// Check the marker `marker` of a store that holds data against this installation's CA
/// (`ca_cert_hash`; `previous`: the fingerprints of CAs a rotation still trusts), moving it
/// to the current CA after a rotation and filling in a missing fingerprint.
async fn check_marker(
    store: &ServerStore,
    marker: &serde_json::Value,
    ca_cert_hash: &str,
    previous: &[String],
    ca_existed: bool,
    data_dir: &Path,
) -> Result<(), ServerError> {
    let key = ObjectKey::new(INSTALLATIONS, "", MARKER);
    let stored = marker
        .pointer("/spec/caHash")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    if stored == ca_cert_hash {
        return Ok(());
    }
    if !stored.is_empty() && !previous.contains(&stored) {
        return Err(foreign_error(
            &stored,
            ca_cert_hash,
            ca_existed,
            data_dir,
            &store.location(),
        ));
    }
    let mut updated = marker.clone();
    if !stored.is_empty() {
        tracing::info!(from = %stored, to = %ca_cert_hash, "the store's installation marker follows the CA rotation");
        let mut history: Vec<serde_json::Value> = marker
            .pointer("/spec/previousCaHashes")
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default();
        history.push(json!(stored));
        updated["spec"]["previousCaHashes"] = json!(history);
    }
    updated["spec"]["caHash"] = json!(ca_cert_hash);
    match store.update(&key, updated, None).await {
        Ok(_) => Ok(()),
        Err(source) => Err(ServerError::OpenStore {
            path: store.location(),
            source,
        }),
    }
}

/// After opening: refuse an empty store (revision 0) of an installation whose CA existed
/// before this start, unless reinitializing, and a store of another installation (its
/// marker names another CA than `ca_cert_hash` or a CA a rotation still trusts,
/// `previous`); write the marker when it is missing.
pub(crate) async fn check_after_open(
    store: &ServerStore,
    ca_existed: bool,
    reinitialize: bool,
    ca_cert_hash: &str,
    previous: &[String],
    data_dir: &Path,
) -> Result<(), ServerError> {
    let key = ObjectKey::new(INSTALLATIONS, "", MARKER);
    let store_err = |source: StoreError| ServerError::OpenStore {
        path: store.location(),
        source,
    };
    if store.revision() > 0
        && let Some(marker) = store.get(&key).await.map_err(store_err)?
    {
        return check_marker(store, &marker, ca_cert_hash, previous, ca_existed, data_dir).await;
    }
    let how = match (store.revision() > 0, ca_existed) {
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
        Ok(_) => Ok(()),
        // Another replica marked it a moment ago: it must be this installation's too.
        Err(StoreError::AlreadyExists(_)) => match store.get(&key).await.map_err(store_err)? {
            Some(marker) => {
                check_marker(store, &marker, ca_cert_hash, previous, ca_existed, data_dir).await
            }
            None => Ok(()),
        },
        Err(source) => Err(store_err(source)),
    }
}
