//! A replica's log files: `logs/current.log` plus size-capped rotated copies.
//!
//! The process writes its stdout and stderr straight into `current.log` (opened with
//! `O_APPEND`), so it never depends on the agent to drain a pipe and keeps running (and
//! logging) when the agent stops. Rotation is therefore *copy-truncate*, like logrotate's
//! `copytruncate`: when `current.log` exceeds [`LogLimits::max_bytes`], the older copies
//! shift (`current.log.1` → `current.log.2`, ...), `current.log` is copied to
//! `current.log.1` and truncated to zero; the process's next append lands at the start.
//! Two consequences, accepted: output written between the copy and the truncation is lost,
//! and `current.log` can exceed the cap by whatever the process writes between two checks
//! (the supervisor checks about every second, see [`super::ReplicaHandle`]).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// Name of the live log file in a replica's `logs/` directory.
pub const LOG_FILE: &str = "current.log";

/// Size cap and number of files kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLimits {
    /// `current.log` is rotated once it is larger than this.
    pub max_bytes: u64,
    /// Files kept in all, `current.log` included (at least 1: then rotation only truncates).
    pub files: usize,
}

impl Default for LogLimits {
    /// 10 MiB × 3 files.
    fn default() -> Self {
        Self {
            max_bytes: 10 * 1024 * 1024,
            files: 3,
        }
    }
}

/// The log files of one replica.
#[derive(Clone, Debug)]
pub struct LogFiles {
    path: PathBuf,
    limits: LogLimits,
}

impl LogFiles {
    /// The files `dir/current.log`, `dir/current.log.1`, ... with `limits`.
    pub fn new(dir: &Path, limits: LogLimits) -> Self {
        Self {
            path: dir.join(LOG_FILE),
            limits,
        }
    }

    /// The files `dir/<name>`, `dir/<name>.1`, ... with `limits` (a sidecar container's).
    pub fn named(dir: &Path, name: &str, limits: LogLimits) -> Self {
        Self {
            path: dir.join(name),
            limits,
        }
    }

    /// Path of `current.log`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of rotated copy number `n` (1 = newest).
    pub fn rotated(&self, n: usize) -> PathBuf {
        let mut name = self.path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    }

    /// Open `current.log` for appending (created when missing).
    pub fn open_append(&self) -> io::Result<File> {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
    }

    /// Open `current.log` for a start of the replica's process: when the file already
    /// holds output (an earlier start in this run: a restart under the restart policy, or a
    /// resume after `spec.stopped`), a line [`restart_separator`] goes in first, so that
    /// `logs -f` and the console show where the new start begins.
    pub fn open_for_start(&self, now: chrono::DateTime<chrono::Utc>) -> io::Result<File> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&self.path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            // A newline first when the earlier output did not end with one.
            let mut last = [0u8; 1];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut last, len - 1)?;
            let mut line = restart_separator(now);
            if last[0] != b'\n' {
                line.insert(0, '\n');
            }
            io::Write::write_all(&mut file, line.as_bytes())?;
        }
        Ok(file)
    }

    /// Rotate when `current.log` is over the cap; returns whether it rotated. Blocking.
    pub fn rotate_if_needed(&self) -> io::Result<bool> {
        let len = match fs::metadata(&self.path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        if len <= self.limits.max_bytes {
            return Ok(false);
        }
        let keep = self.limits.files.max(1) - 1;
        if keep > 0 {
            // Drop the oldest, shift the others up by one.
            remove_if_exists(&self.rotated(keep))?;
            for n in (1..keep).rev() {
                match fs::rename(self.rotated(n), self.rotated(n + 1)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            fs::copy(&self.path, self.rotated(1))?;
        }
        OpenOptions::new()
            .write(true)
            .open(&self.path)?
            .set_len(0)?;
        Ok(true)
    }
}

/// The line written between two starts of a replica in one log.
pub fn restart_separator(now: chrono::DateTime<chrono::Utc>) -> String {
    format!(
        "--- rlark: the replica started again at {}; the lines above are from its earlier start ---\n",
        now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_start_is_marked_in_the_log_and_a_first_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = LogFiles::new(dir.path(), LogLimits::default());
        let now = chrono::DateTime::parse_from_rfc3339("2026-12-07T19:40:01Z")
            .expect("time")
            .with_timezone(&chrono::Utc);
        let mut first = logs.open_for_start(now).expect("open");
        std::io::Write::write_all(&mut first, b"count 0\ncount 1").expect("write");
        drop(first);
        let mut second = logs.open_for_start(now).expect("open again");
        std::io::Write::write_all(&mut second, b"count 0\n").expect("write");
        drop(second);
        // After output that ended its line: no blank line.
        drop(logs.open_for_start(now).expect("open a third time"));
        let text = fs::read_to_string(logs.path()).expect("read");
        assert_eq!(
            text,
            "count 0\ncount 1\n--- rlark: the replica started again at 2026-12-07T19:40:01Z; \
             the lines above are from its earlier start ---\ncount 0\n--- rlark: the replica \
             started again at 2026-12-07T19:40:01Z; the lines above are from its earlier start \
             ---\n"
        );
    }
    use std::io::Write as _;

    #[test]
    fn rotation_keeps_the_newest_files_within_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = LogFiles::new(
            dir.path(),
            LogLimits {
                max_bytes: 10,
                files: 3,
            },
        );
        let mut writer = logs.open_append().expect("open");
        assert!(
            !logs.rotate_if_needed().expect("rotate"),
            "empty: no rotation"
        );
        for round in 0..4 {
            writeln!(writer, "round {round} ............").expect("write");
            assert!(logs.rotate_if_needed().expect("rotate"));
            assert_eq!(fs::metadata(logs.path()).expect("meta").len(), 0);
        }
        // The same (appending) descriptor keeps writing to the start of the live file.
        writeln!(writer, "after").expect("write");
        assert_eq!(fs::read_to_string(logs.path()).expect("read"), "after\n");
        let one = fs::read_to_string(logs.rotated(1)).expect("read .1");
        let two = fs::read_to_string(logs.rotated(2)).expect("read .2");
        assert!(one.starts_with("round 3"), "{one}");
        assert!(two.starts_with("round 2"), "{two}");
        assert!(!logs.rotated(3).exists(), "only 3 files in all");
    }

    #[test]
    fn a_single_file_is_truncated_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = LogFiles::new(
            dir.path(),
            LogLimits {
                max_bytes: 1,
                files: 1,
            },
        );
        fs::write(logs.path(), "0123456789").expect("write");
        assert!(logs.rotate_if_needed().expect("rotate"));
        assert_eq!(fs::metadata(logs.path()).expect("meta").len(), 0);
        assert!(!logs.rotated(1).exists());
    }
}
