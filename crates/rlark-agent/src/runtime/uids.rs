//! The users isolated raw replicas run as: one of a configured range per replica directory,
//! claimed on disk so that it survives agent restarts and is never given to two replicas
//! at once (docs/security.md, "Replica isolation").
//!
//! A claim is the file `CLAIMS/<uid>` (created with `O_EXCL`, so two claims of one uid
//! cannot both succeed) holding the replica directory it belongs to; the replica directory
//! holds the uid in `uid` in turn, so a restarted replica (a new run in the same directory,
//! whose files it owns) runs as the same user again. [`UidPool::release`] frees a uid
//! when its replica directory is deleted. The group is the uid's number.

use std::io::Write as _;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

/// The file in a replica directory that names its user.
pub const UID_FILE: &str = "uid";

/// Default range of replica users: above the 32-bit `nobody` conventions and any
/// distribution's allocation ranges (Debian's system and user ranges end at 59999 and
/// 65533; systemd's dynamic users at 65519), below 2^31 (which some tools mishandle).
pub const DEFAULT_RANGE: RangeInclusive<u32> = 2_000_000_000..=2_000_065_535;

/// Why no user could be claimed.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    #[error("every replica user of {start}..={end} is claimed (see {})", dir.display())]
    Exhausted { start: u32, end: u32, dir: PathBuf },
    #[error("{step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The claims directory and the range.
#[derive(Clone, Debug)]
pub struct UidPool {
    dir: PathBuf,
    range: RangeInclusive<u32>,
}

impl UidPool {
    /// A pool claiming in `dir` (root's, 0700; made when missing).
    pub fn new(dir: impl Into<PathBuf>, range: RangeInclusive<u32>) -> Self {
        UidPool {
            dir: dir.into(),
            range,
        }
    }

    /// The user of the replica in `replica_dir`: the one it had, else a newly claimed one
    /// (the first free one from a point that depends on the directory, so concurrent
    /// starts rarely try the same uid).
    pub fn claim(&self, replica_dir: &Path) -> Result<u32, UidError> {
        let uid_file = replica_dir.join(UID_FILE);
        if let Some(uid) = std::fs::read_to_string(&uid_file)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .filter(|uid| self.range.contains(uid))
            && self.owner(uid).as_deref() == Some(replica_dir)
        {
            return Ok(uid);
        }
        self.make_dir()?;
        std::fs::create_dir_all(replica_dir).map_err(|source| UidError::Io {
            step: "make the replica directory",
            path: replica_dir.to_path_buf(),
            source,
        })?;
        let (start, end) = (*self.range.start(), *self.range.end());
        let size = u64::from(end - start) + 1;
        let first = fnv(replica_dir.as_os_str().as_encoded_bytes()) % size;
        // Each uid is tried once, and once more after a stale claim of it was removed.
        let mut retried = None;
        let mut step = 0;
        while step < size {
            let offset = (first + step) % size;
            // `offset < size <= 2^32`, and `start + offset <= end`.
            let Ok(uid) = u32::try_from(u64::from(start) + offset) else {
                step += 1;
                continue;
            };
            let claim = self.dir.join(uid.to_string());
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&claim)
            {
                Ok(mut file) => {
                    file.write_all(replica_dir.as_os_str().as_encoded_bytes())
                        .and_then(|()| file.sync_all())
                        .map_err(|source| UidError::Io {
                            step: "write the claim",
                            path: claim.clone(),
                            source,
                        })?;
                    std::fs::write(&uid_file, uid.to_string()).map_err(|source| UidError::Io {
                        step: "record the replica's user in",
                        path: uid_file.clone(),
                        source,
                    })?;
                    return Ok(uid);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    // A claim left by a replica directory that is gone is free again.
                    if retried != Some(uid)
                        && self
                            .owner(uid)
                            .is_some_and(|owner| !owner.exists() && owner != replica_dir)
                        && std::fs::remove_file(&claim).is_ok()
                    {
                        retried = Some(uid);
                        continue;
                    }
                    step += 1;
                }
                Err(source) => {
                    return Err(UidError::Io {
                        step: "claim",
                        path: claim,
                        source,
                    });
                }
            }
        }
        Err(UidError::Exhausted {
            start,
            end,
            dir: self.dir.clone(),
        })
    }

    /// Free the user of `replica_dir` (its directory is being deleted).
    pub fn release(&self, replica_dir: &Path) {
        let Some(uid) = std::fs::read_to_string(replica_dir.join(UID_FILE))
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
        else {
            return;
        };
        if self.owner(uid).as_deref() == Some(replica_dir) {
            let _ = std::fs::remove_file(self.dir.join(uid.to_string()));
        }
    }

    /// The replica directory that claimed `uid`.
    fn owner(&self, uid: u32) -> Option<PathBuf> {
        let bytes = std::fs::read(self.dir.join(uid.to_string())).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        Some(PathBuf::from(text))
    }

    fn make_dir(&self) -> Result<(), UidError> {
        use std::os::unix::fs::DirBuilderExt as _;
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
        {
            Ok(()) => Ok(()),
            Err(source) => Err(UidError::Io {
                step: "make the replica user claims directory",
                path: self.dir.clone(),
                source,
            }),
        }
    }
}

/// FNV-1a: a stable spread of directories over the range (not a security property).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_get_distinct_users_kept_across_restarts_and_freed_with_their_directory() {
        let root = tempfile::tempdir().expect("tempdir");
        let pool = UidPool::new(root.path().join("claims"), 100..=102);
        let dirs: Vec<PathBuf> = (0..3).map(|i| root.path().join(format!("r{i}"))).collect();
        for dir in &dirs {
            std::fs::create_dir(dir).expect("dir");
        }
        let uids: Vec<u32> = dirs.iter().map(|d| pool.claim(d).expect("claim")).collect();
        let mut sorted = uids.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [100, 101, 102], "distinct, within the range");
        assert_eq!(pool.claim(&dirs[1]).expect("again"), uids[1], "kept");

        let extra = root.path().join("r3");
        std::fs::create_dir(&extra).expect("dir");
        let error = pool.claim(&extra).expect_err("exhausted");
        assert!(error.to_string().contains("100..=102"), "{error}");

        pool.release(&dirs[0]);
        assert_eq!(pool.claim(&extra).expect("freed"), uids[0]);

        // A claim whose directory vanished without a release is taken over.
        std::fs::remove_dir_all(&dirs[2]).expect("rm");
        let late = root.path().join("r4");
        std::fs::create_dir(&late).expect("dir");
        assert_eq!(pool.claim(&late).expect("stale claim"), uids[2]);
    }

    #[test]
    fn a_forged_uid_file_does_not_take_another_replicas_user() {
        let root = tempfile::tempdir().expect("tempdir");
        let pool = UidPool::new(root.path().join("claims"), 100..=101);
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        std::fs::create_dir(&a).expect("a");
        std::fs::create_dir(&b).expect("b");
        let uid_a = pool.claim(&a).expect("a");
        std::fs::write(b.join(UID_FILE), uid_a.to_string()).expect("forge");
        let uid_b = pool.claim(&b).expect("b");
        assert_ne!(uid_a, uid_b);
    }
}
