//! `DATA_DIR/pki/revocations.json`: every revocation — certificates' and bearer tokens' —
//! kept beside the CA as well as in the store.
//!
//! The store is where revocations are shared and listed, but a store can be lost while the
//! CA survives (`rlark server --reinitialize-store`, or a new replica started from a copy of
//! `pki/`), or be replaced by an older copy (`rlark restore` of a backup taken before a
//! revocation); the certificates that CA signed stay valid, and so do the bearer tokens
//! the older copy holds, so their revocations must survive too. The file is rewritten
//! atomically (write a temporary file, fsync, rename; mode 0600) each time a revocation is
//! added, before the revocation is reported done, and read at every start, where it is
//! merged with the store's revocations both ways.

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
         (it must be JSON: {{\"revocations\": [...], \"bearerTokens\": [...]}})"
    )]
    Parse { path: PathBuf, message: String },
    #[error("{0}")]
    Write(#[from] rlark_pki::PkiError),
}

/// A revoked bearer token (a user's or a task's), by id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevocation {
    pub id: String,
    /// The token's user.
    #[serde(default)]
    pub user: String,
    /// RFC 3339.
    pub revoked_at: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Contents {
    revocations: Vec<RevocationRecord>,
    /// Absent in files written before token revocations were kept here (and while there
    /// are none, so that an earlier version still reads the file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    bearer_tokens: Vec<TokenRevocation>,
}

/// What the file holds: certificate revocations by serial, token revocations by id.
#[derive(Clone, Debug, Default)]
struct Held {
    certificates: BTreeMap<String, RevocationRecord>,
    tokens: BTreeMap<String, TokenRevocation>,
}

/// The file and what it holds.
#[derive(Debug)]
pub(crate) struct RevocationFile {
    path: PathBuf,
    held: Mutex<Held>,
}

impl RevocationFile {
    /// Read `path`; a missing file is an empty list, a malformed one an error (starting
    /// without the revocations it holds would make revoked certificates valid again).
    pub(crate) fn load(path: &Path) -> Result<Self, RevocationFileError> {
        let held = match std::fs::read(path) {
            Ok(bytes) => {
                let contents: Contents =
                    serde_json::from_slice(&bytes).map_err(|e| RevocationFileError::Parse {
                        path: path.to_path_buf(),
                        message: e.to_string(),
                    })?;
                Held {
                    certificates: contents
                        .revocations
                        .into_iter()
                        .map(|r| (r.serial.clone(), r))
                        .collect(),
                    tokens: contents
                        .bearer_tokens
                        .into_iter()
                        .map(|t| (t.id.clone(), t))
                        .collect(),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Held::default(),
            Err(source) => {
                return Err(RevocationFileError::Read {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            held: Mutex::new(held),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Every certificate revocation in the file.
    pub(crate) fn records(&self) -> Vec<RevocationRecord> {
        self.lock().certificates.values().cloned().collect()
    }

    /// Every bearer-token revocation in the file.
    pub(crate) fn token_records(&self) -> Vec<TokenRevocation> {
        self.lock().tokens.values().cloned().collect()
    }

    /// Add the certificate revocations whose serial the file does not hold yet and rewrite
    /// the file when there were any. Returns how many were added. On a write error the file
    /// and this list are unchanged.
    pub(crate) fn add(
        &self,
        records: impl IntoIterator<Item = RevocationRecord>,
    ) -> Result<usize, RevocationFileError> {
        self.update(|next| {
            let mut added = 0;
            for record in records {
                if !next.certificates.contains_key(&record.serial) {
                    next.certificates.insert(record.serial.clone(), record);
                    added += 1;
                }
            }
            added
        })
    }

    /// [`Self::add`] for bearer-token revocations, by token id.
    pub(crate) fn add_tokens(
        &self,
        records: impl IntoIterator<Item = TokenRevocation>,
    ) -> Result<usize, RevocationFileError> {
        self.update(|next| {
            let mut added = 0;
            for record in records {
                if !next.tokens.contains_key(&record.id) {
                    next.tokens.insert(record.id.clone(), record);
                    added += 1;
                }
            }
            added
        })
    }

    /// Apply `change` to a copy of what is held; when it added anything, write the copy
    /// and keep it.
    fn update(
        &self,
        change: impl FnOnce(&mut Held) -> usize,
    ) -> Result<usize, RevocationFileError> {
        let mut held = self.lock();
        let mut next = held.clone();
        let added = change(&mut next);
        if added == 0 {
            return Ok(0);
        }
        let contents = Contents {
            revocations: next.certificates.values().cloned().collect(),
            bearer_tokens: next.tokens.values().cloned().collect(),
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
        Ok(added)
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

    /// Token revocations are kept beside certificate revocations; a file without them (an
    /// earlier version's) still reads, and one without token revocations is written as an
    /// earlier version reads it.
    #[test]
    fn token_revocations_are_kept_too() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REVOCATIONS_FILE);
        let file = RevocationFile::load(&path).unwrap();
        assert_eq!(file.add([record("0a")]).unwrap(), 1);
        assert!(
            !std::fs::read_to_string(&path)
                .unwrap()
                .contains("bearerTokens")
        );
        let token = TokenRevocation {
            id: "abc123".into(),
            user: "tess".into(),
            revoked_at: "2026-01-01T00:00:00Z".into(),
        };
        assert_eq!(file.add_tokens([token.clone()]).unwrap(), 1);
        assert_eq!(file.add_tokens([token.clone()]).unwrap(), 0);
        let again = RevocationFile::load(&path).unwrap();
        assert_eq!(again.token_records(), [token]);
        assert_eq!(again.records(), [record("0a")]);
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
