//! The audit log file: one JSON object per line, appended to `DATA_DIR/audit.log`
//! (mode 0600), and mirrored to `tracing` (target `rlark::audit`).
//!
//! The log is rotated by size: before a record would make `audit.log` larger than
//! [`AuditLogConfig::max_file_bytes`], `audit.log.N-1` becomes `audit.log.N` (the oldest,
//! `audit.log.N`, is overwritten), ..., `audit.log` becomes `audit.log.1`, and a new
//! `audit.log` is started. The files together never hold more than
//! `(max_files + 1) × max_file_bytes` (plus one record, when a single record is larger than
//! a file may be).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rlark_apiserver::audit::{AuditEntry, AuditSink, log_entry};

/// File name of the audit log inside the data directory.
pub const AUDIT_LOG_FILE: &str = "audit.log";

/// Size bounds of the audit log (config file section `auditLog`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditLogConfig {
    /// `audit.log` is rotated before it would grow past this many bytes (default 100 MiB).
    pub max_file_bytes: u64,
    /// Rotated files kept, `audit.log.1` (newest) to `audit.log.N` (default 5); older
    /// records are deleted.
    pub max_files: u32,
}

impl AuditLogConfig {
    /// Smallest accepted `maxFileBytes` (a few records must fit in one file).
    pub const MIN_FILE_BYTES: u64 = 64 * 1024;
    /// Largest accepted `maxFiles`.
    pub const MAX_FILES: u32 = 1000;
}

impl Default for AuditLogConfig {
    /// 100 MiB per file, 5 rotated files: at most 600 MiB in all.
    fn default() -> Self {
        Self {
            max_file_bytes: 100 * 1024 * 1024,
            max_files: 5,
        }
    }
}

/// Appends audit records to a file, rotating it by size. Each record is written with one
/// `write` call on a file opened with `O_APPEND`, under a lock, so lines never interleave
/// and a rotation never splits a record.
#[derive(Debug)]
pub(crate) struct FileAudit {
    path: PathBuf,
    limits: AuditLogConfig,
    current: Mutex<Current>,
}

/// The open `audit.log` and its size.
#[derive(Debug)]
struct Current {
    file: File,
    size: u64,
}

fn open_append(path: &Path) -> std::io::Result<Current> {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)?;
    let size = file.metadata()?.len();
    Ok(Current { file, size })
}

impl FileAudit {
    /// Open (create, mode 0600) `path` for appending, rotating by `limits`.
    pub(crate) fn open(path: &Path, limits: AuditLogConfig) -> std::io::Result<FileAudit> {
        Ok(FileAudit {
            path: path.to_path_buf(),
            limits,
            current: Mutex::new(open_append(path)?),
        })
    }

    /// `audit.log.<n>`.
    fn rotated(&self, n: u32) -> PathBuf {
        let mut name = self.path.clone().into_os_string();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// Shift `audit.log.1..N-1` up by one (overwriting `audit.log.N`), move `audit.log` to
    /// `audit.log.1` and start a new `audit.log`.
    fn rotate(&self, current: &mut Current) -> std::io::Result<()> {
        current.file.sync_all()?;
        for n in (1..self.limits.max_files).rev() {
            match std::fs::rename(self.rotated(n), self.rotated(n + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        std::fs::rename(&self.path, self.rotated(1))?;
        *current = open_append(&self.path)?;
        Ok(())
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
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let len = line.len() as u64;
        // On a failed rotation keep appending to the current file rather than losing
        // records; the error repeats at every record until the cause is fixed.
        if current.size > 0
            && current.size.saturating_add(len) > self.limits.max_file_bytes
            && let Err(error) = self.rotate(&mut current)
        {
            tracing::error!(%error, path = %self.path.display(), "rotating audit log failed");
        }
        match current.file.write_all(&line) {
            Ok(()) => current.size = current.size.saturating_add(len),
            // The record is still in the tracing output above.
            Err(error) => {
                tracing::error!(%error, path = %self.path.display(), "writing audit log failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn entry(i: usize) -> AuditEntry {
        let mut entry = AuditEntry::now("join", "denied");
        entry.verb = "join".into();
        entry.resource = "bootstraptokens".into();
        entry.name = format!("guess{i:06}");
        entry.reason = "bootstrap token is unknown".into();
        entry
    }

    /// Many records through small limits: the log rotates, keeps at most `max_files` old
    /// files, stays under the cap in total, keeps mode 0600 and loses no record of the
    /// newest files.
    #[test]
    fn the_audit_log_rotates_and_stays_under_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_LOG_FILE);
        let limits = AuditLogConfig {
            max_file_bytes: 4096,
            max_files: 3,
        };
        let audit = FileAudit::open(&path, limits.clone()).unwrap();
        let records = 2000;
        for i in 0..records {
            audit.record(entry(i));
        }
        drop(audit);

        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3"],
            "files in the data directory"
        );
        let mut total = 0;
        let mut newest_first = Vec::new();
        for name in ["audit.log", "audit.log.1", "audit.log.2", "audit.log.3"] {
            let file = dir.path().join(name);
            let meta = std::fs::metadata(&file).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "mode of {name}");
            assert!(
                meta.len() <= limits.max_file_bytes,
                "{name} has {} bytes, more than {}",
                meta.len(),
                limits.max_file_bytes
            );
            total += meta.len();
            let text = std::fs::read_to_string(&file).unwrap();
            let mut names_in_file: Vec<String> = text
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).expect("JSON line");
                    v["name"].as_str().unwrap().to_string()
                })
                .collect();
            names_in_file.reverse();
            newest_first.extend(names_in_file);
        }
        assert!(
            total <= u64::from(limits.max_files + 1) * limits.max_file_bytes,
            "{total} bytes in all"
        );
        // The kept records are the newest ones, contiguous and in order.
        assert_eq!(newest_first[0], format!("guess{:06}", records - 1));
        for (k, name) in newest_first.iter().enumerate() {
            assert_eq!(*name, format!("guess{:06}", records - 1 - k));
        }
    }

    /// A log left over from before rotation existed (larger than the limit) is rotated at
    /// the first record.
    #[test]
    fn an_oversized_log_from_before_is_rotated_at_the_first_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(AUDIT_LOG_FILE);
        std::fs::write(&path, vec![b'x'; 10_000]).unwrap();
        let audit = FileAudit::open(
            &path,
            AuditLogConfig {
                max_file_bytes: 4096,
                max_files: 1,
            },
        )
        .unwrap();
        audit.record(entry(1));
        assert_eq!(
            std::fs::metadata(dir.path().join("audit.log.1"))
                .unwrap()
                .len(),
            10_000
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
