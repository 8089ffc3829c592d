//! One server process per data directory: `DATA_DIR/rlark.lock`, locked (`flock`,
//! exclusive) for as long as the server runs and holding its pid, so a second server (or
//! `rlark up`) on the same directory is refused at once with the pid of the first instead
//! of waiting on SQLite's lock and failing with "database is locked".
//!
//! The lock is the kernel's: it goes with the process however the process ends, so a
//! crashed server never leaves a stale lock behind (the file itself stays; its content is
//! only read to name the holder).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

/// Name of the lock file in the data directory.
pub const LOCK_FILE: &str = "rlark.lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("another rlark is using {dir}{holder}", holder = match pid {
        Some(pid) => format!(" (pid {pid})"),
        None => String::new(),
    })]
    InUse {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, as it wrote it (absent when unreadable).
        pid: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("lock {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// The held lock; dropping it releases it.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

/// Lock `data_dir` (which must exist) for this process, or say who holds it.
pub fn acquire(data_dir: &Path) -> Result<DataDirLock, LockError> {
    let path = data_dir.join(LOCK_FILE);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let pid = file
                .read_to_string(&mut text)
                .ok()
                .and_then(|_| text.trim().parse().ok());
            return Err(LockError::InUse {
                dir: data_dir.to_path_buf(),
                pid,
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    file.flush().map_err(io)?;
    Ok(DataDirLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder_and_a_dropped_lock_is_free() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = acquire(dir.path()).expect("first lock");
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).expect("read");
        assert_eq!(text.trim(), std::process::id().to_string());
        // flock locks belong to the open file description: a second open in the same
        // process conflicts as another process's would.
        match acquire(dir.path()) {
            Err(LockError::InUse { dir: d, pid }) => {
                assert_eq!(d, dir.path());
                assert_eq!(pid, Some(std::process::id()));
                let message = acquire(dir.path()).expect_err("still held").to_string();
                assert_eq!(
                    message,
                    format!(
                        "another rlark is using {} (pid {})",
                        dir.path().display(),
                        std::process::id()
                    )
                );
            }
            other => panic!("expected InUse, got {other:?}"),
        }
        drop(held);
        acquire(dir.path()).expect("free after drop");
    }

    #[test]
    fn a_missing_directory_is_an_io_error_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope");
        let error = acquire(&missing).expect_err("no directory");
        assert!(
            error
                .to_string()
                .starts_with(&format!("lock {}: ", missing.join(LOCK_FILE).display())),
            "{error}"
        );
    }
}
