//! The files a replica's supervisor process (`supervisor.rs`) writes into the replica
//! directory, and the agent reads: `pid.json` once the process started, `exit.json` once it
//! ended (or could not start). Both are written atomically (a temporary file, then a
//! rename), so a reader sees a whole file or none; they survive an agent crash, not a power
//! loss (no fsync: after a reboot nothing of the replica runs anyway).

use std::io;
use std::path::Path;
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::ExitStatus;

/// Bumped whenever the supervisor's arguments or its records (`pid.json`, `exit.json`)
/// change, so an agent never drives a `rlark-supervise` binary of another protocol.
pub const PROTOCOL: u32 = 1;

/// FNV-1a of the sources that make up the supervisor's behaviour (`supervisor.rs`,
/// these records and the process helpers it uses), computed at compile time: two builds that differ
/// in any of them print different `--version` lines, so `cargo run` (which rebuilds `rlark`
/// but not `rlark-supervise`) never pairs a new agent with a stale supervisor binary.
const SOURCE_HASH: u64 = {
    let parts: [&[u8]; 3] = [
        include_bytes!("../supervisor.rs"),
        include_bytes!("record.rs"),
        include_bytes!("process.rs"),
    ];
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut p = 0;
    while p < parts.len() {
        let bytes = parts[p];
        let mut i = 0;
        while i < bytes.len() {
            hash ^= bytes[i] as u64;
            hash = hash.wrapping_mul(0x0100_0000_01b3);
            i += 1;
        }
        p += 1;
    }
    hash
};

/// What the supervisor's `--version` prints: the crate version, [`PROTOCOL`] and a hash of the
/// supervisor's sources. The agent uses a separate `rlark-supervise` binary only when it
/// prints exactly this line.
pub fn version_line() -> String {
    format!(
        "rlark-supervise {} protocol {PROTOCOL} source {SOURCE_HASH:016x}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Name of the supervisor's start record in the replica directory.
pub const PID_FILE: &str = "pid.json";
/// Name of the supervisor's exit record in the replica directory.
pub const EXIT_FILE: &str = "exit.json";

/// `pid.json`: what the supervisor started.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PidRecord {
    /// Pid of the task's main process.
    pub pid: u32,
    /// Its process group (it leads it: the pid).
    pub pgid: i32,
    /// Its start in clock ticks after boot (`/proc/<pid>/stat`), to tell it from a later
    /// process with the same pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proc_start_ticks: Option<u64>,
    /// Pid of the supervisor process.
    pub supervisor_pid: u32,
    /// The supervisor's start in clock ticks after boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor_start_ticks: Option<u64>,
    /// When the main process was started.
    pub started_at: DateTime<Utc>,
}

/// `exit.json`: how the main process ended (`code` or `signal`), or why it could not be
/// started (`error`, with the OS error number when there is one).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExitRecord {
    /// The exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// The signal that killed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it could not be started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The OS error number of `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// The supervisor had to SIGKILL the process group at the end of a stop's grace period.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub killed: bool,
    /// When the exit (or the start error) was seen.
    pub finished_at: DateTime<Utc>,
}

impl ExitRecord {
    /// A record of an exit with `status`, seen now.
    pub fn exited(status: ExitStatus) -> Self {
        let (code, signal) = match status {
            ExitStatus::Code(code) => (Some(code), None),
            ExitStatus::Signal(signal) => (None, Some(signal)),
            ExitStatus::Unknown => (None, None),
        };
        ExitRecord {
            code,
            signal,
            error: None,
            errno: None,
            killed: false,
            finished_at: Utc::now(),
        }
    }

    /// A record of a start that failed with `error`.
    pub fn start_failed(error: String, errno: Option<i32>) -> Self {
        ExitRecord {
            code: None,
            signal: None,
            error: Some(error),
            errno,
            killed: false,
            finished_at: Utc::now(),
        }
    }

    /// How the process ended; `None` for a start error (or a record saying neither).
    pub fn status(&self) -> Option<ExitStatus> {
        match (self.code, self.signal) {
            (Some(code), _) => Some(ExitStatus::Code(code)),
            (None, Some(signal)) => Some(ExitStatus::Signal(signal)),
            (None, None) => None,
        }
    }

    /// `finished_at` as a [`SystemTime`].
    pub fn finished_at(&self) -> SystemTime {
        self.finished_at.into()
    }
}

/// Read a record; `Ok(None)` when the file does not exist.
pub fn read<T: serde::de::DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Write a record atomically: `<path>.tmp`, then a rename over `path`.
pub fn write<T: Serialize>(path: &Path, record: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Make `path` hold `bytes` with `mode`, for files the agent derives again at every start
/// (a replica's sandbox description, its `/etc/passwd`): nothing is written when the file
/// already holds them (a restart), else a temporary file is renamed over `path`, so a
/// reader sees the old or the new content. Not synced: a crash loses nothing that the
/// next start does not write again.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    if let Ok(existing) = std::fs::metadata(path)
        && existing.permissions().mode() & 0o7777 == mode
        && existing.len() == bytes.len() as u64
        && std::fs::read(path).is_ok_and(|held| held == bytes)
    {
        return Ok(());
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    // A temporary file left by an interrupted write goes first; the new one is created
    // exclusively, so nothing already at that path (a link) is followed.
    let _ = std::fs::remove_file(&tmp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have narrowed the mode given at creation.
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Remove `path`; a missing file is fine.
pub fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_say_how_the_process_ended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(EXIT_FILE);
        assert_eq!(read::<ExitRecord>(&path).expect("read missing"), None);
        let mut exit = ExitRecord::exited(ExitStatus::Signal(9));
        exit.killed = true;
        write(&path, &exit).expect("write");
        let back: ExitRecord = read(&path).expect("read").expect("present");
        assert_eq!(back, exit);
        assert_eq!(back.status(), Some(ExitStatus::Signal(9)));
        let text = std::fs::read_to_string(&path).expect("text");
        assert!(
            text.contains("\"signal\": 9") && text.contains("finishedAt"),
            "{text}"
        );

        let failed = ExitRecord::start_failed("start x: denied".into(), Some(13));
        assert_eq!(failed.status(), None);
        assert_eq!(
            ExitRecord::exited(ExitStatus::Code(3)).status(),
            Some(ExitStatus::Code(3))
        );

        std::fs::write(&path, "{not json").expect("write junk");
        let err = read::<ExitRecord>(&path).expect_err("junk");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        remove(&path).expect("remove");
        remove(&path).expect("remove again");
    }
}
