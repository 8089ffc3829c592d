//! The audit log file: one JSON object per line, appended to `DATA_DIR/audit.log`
//! (mode 0600), and mirrored to `tracing` (target `rlark::audit`).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rlark_apiserver::audit::{AuditEntry, AuditSink, log_entry};

/// File name of the audit log inside the data directory.
pub const AUDIT_LOG_FILE: &str = "audit.log";

/// Appends audit records to a file. Each record is written with one `write` call on a file
/// opened with `O_APPEND`, so lines from concurrent writers never interleave.
#[derive(Debug)]
pub(crate) struct FileAudit {
    path: PathBuf,
    file: Mutex<File>,
}

impl FileAudit {
    /// Open (create, mode 0600) `path` for appending.
    pub(crate) fn open(path: &Path) -> std::io::Result<FileAudit> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(FileAudit {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }
}

impl AuditSink for FileAudit {
    fn record(&self, entry: AuditEntry) {
        log_entry(&entry);
        let mut line = match serde_json::to_vec(&entry) {
            Ok(line) => line,
            Err(error) => {
                tracing::error!(%error, "encoding audit record failed");
                return;
            }
        };
        line.push(b'\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(error) = file.write_all(&line) {
            // The record is still in the tracing output above.
            tracing::error!(%error, path = %self.path.display(), "writing audit log failed");
        }
    }
}
