//! `DATA_DIR/pki/revocations.json`: every revocation, kept beside the CA as well as in the
//! store.
//!
//! The store is where revocations are shared and listed, but a store can be lost while the
//! CA survives (`rlark server --reinitialize-store`, or a new replica started from a copy of
//! `pki/`); the certificates that CA signed stay valid, so their revocations must survive
//! too. The file is rewritten atomically (write a temporary file, fsync, rename; mode 0600)
//! each time a revocation is added, before the revocation is reported done, and read at
//! every start, where it is merged with the store's revocations both ways.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::records::RevocationRecord;

/// File name of the revocation list inside the PKI directory.
pub const REVOCATIONS_FILE: &str = "revocations.json";

/// Errors of reading or writing the file; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum RevocationFileError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a valid revocation list ({message}); restore it from a backup \
         (it must be JSON: {{\"revocations\": [...]}})"
    )]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Write(#[from] rlark_pki::PkiError),
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    revocations: Vec<RevocationRecord>,
}

/// The file and what it holds, by serial.
#[derive(Debug)]
pub(crate) struct RevocationFile {
    path: PathBuf,
    records: Mutex<BTreeMap<String, RevocationRecord>>,
}

impl RevocationFile {
    /// Read `path`; a missing file is an empty list, a malformed one an error (starting
    /// without the revocations it holds would make revoked certificates valid again).
    pub(crate) fn load(path: &Path) -> Result<Self, RevocationFileError> {
        let records = match std::fs::read(path) {
            Ok(bytes) => {
                let contents: Contents =
                    serde_json::from_slice(&bytes).map_err(|e| RevocationFileError::Parse {
                        path: path.to_path_buf(),
                        message: e.to_string(),
                    })?;
                contents
                    .revocations
                    .into_iter()
                    .map(|r| (r.serial.clone(), r))
                    .collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(source) => {
                return Err(RevocationFileError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            records: Mutex::new(records),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, RevocationRecord>> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Every revocation in the file.
    pub(crate) fn records(&self) -> Vec<RevocationRecord> {
        self.lock().values().cloned().collect()
    }

    /// Add the records whose serial the file does not hold yet and rewrite the file when
    /// there were any. Returns how many were added. On a write error the file and this
    /// list are unchanged.
    pub(crate) fn add(
        &self,
        records: impl IntoIterator<Item = RevocationRecord>,
    ) -> Result<usize, RevocationFileError> {
        let mut held = self.lock();
        let new: Vec<RevocationRecord> = records
            .into_iter()
            .filter(|r| !held.contains_key(&r.serial))
            .collect();
        if new.is_empty() {
            return Ok(0);
        }
        let mut next = held.clone();
        for record in &new {
            next.insert(record.serial.clone(), record.clone());
        }
        let contents = Contents {
            revocations: next.values().cloned().collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&contents).map_err(|e| {
            RevocationFileError::Write(rlark_pki::PkiError::Write {
                path: self.path.clone(),
                source: std::io::Error::other(e),
            })
        })?;
        bytes.push(b'\n');
        rlark_pki::write_private_file(&self.path, &bytes)?;
        *held = next;
        Ok(new.len())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn record(serial: &str) -> RevocationRecord {
        RevocationRecord {
            serial: serial.to_string(),
            user: "system:rlark:agent:a".into(),
            reason: "test".into(),
            revoked_by: "admin".into(),
            revoked_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn records_are_added_once_written_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REVOCATIONS_FILE);
        let file = RevocationFile::load(&path).unwrap();
        assert!(file.records().is_empty(), "a missing file is an empty list");
        assert_eq!(file.add([record("0a"), record("0b")]).unwrap(), 2);
        assert_eq!(file.add([record("0a")]).unwrap(), 0);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let again = RevocationFile::load(&path).unwrap();
        assert_eq!(again.records(), [record("0a"), record("0b")]);
    }

    #[test]
    fn a_malformed_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REVOCATIONS_FILE);
        std::fs::write(&path, b"{\"revocations\": [").unwrap();
        let error = RevocationFile::load(&path).unwrap_err().to_string();
        assert!(error.contains(REVOCATIONS_FILE), "{error}");
    }
}
