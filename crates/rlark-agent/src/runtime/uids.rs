//! The users isolated raw replicas run as: one of a configured range per replica directory,
//! claimed on disk so that it survives agent restarts and is never given to two replicas
//! at once (docs/security.md, "Replica isolation").
//!
//! A claim is the file `CLAIMS/<uid>` (created with `O_EXCL`, so two claims of one uid
//! cannot both succeed) holding the replica directory it belongs to; the replica's sandbox
//! description (`sandbox.json` in its directory, root's) names the uid in turn, so a
//! restarted replica (a new run in the same directory, whose files it owns) runs as the
//! same user again. No file of its own records the uid: every file a start creates costs
//! an inode allocation, the largest part of the agent's work per start on a filesystem
//! without a journal (docs/benchmarks.md). [`UidPool::release`] frees a uid when its
//! replica directory is deleted. The group is the uid's number.

use std::io::Write as _;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use super::sandbox::Sandbox;

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

    /// The user of the replica in `replica_dir`: the one its sandbox names when its claim
    /// is still this directory's, else a newly claimed one (the first free one from a point
    /// that depends on the directory, so concurrent starts rarely try the same uid; a claim
    /// of this directory met on the way — a start interrupted before its sandbox was
    /// written — is taken back).
    pub fn claim(&self, replica_dir: &Path) -> Result<u32, UidError> {
        if let Some(uid) = recorded_uid(replica_dir).filter(|uid| self.range.contains(uid))
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
                    return Ok(uid);
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    if self.owner(uid).as_deref() == Some(replica_dir) {
                        return Ok(uid);
                    }
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
        let Some(uid) = recorded_uid(replica_dir) else {
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

/// The user the sandbox description in `replica_dir` names, if it has one.
pub fn recorded_uid(replica_dir: &Path) -> Option<u32> {
    Sandbox::read(replica_dir).ok().flatten().map(|s| s.uid)
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
        // Each start writes its sandbox, which names the user, after the claim.
        let uids: Vec<u32> = dirs
            .iter()
            .map(|d| {
                let uid = pool.claim(d).expect("claim");
                sandbox(uid).write(d).expect("sandbox");
                uid
            })
            .collect();
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
        sandbox(uid_a).write(&b).expect("forge");
        let uid_b = pool.claim(&b).expect("b");
        assert_ne!(uid_a, uid_b);
    }

    fn sandbox(uid: u32) -> Sandbox {
        Sandbox {
            uid,
            gid: uid,
            hide: Vec::new(),
            binds: Vec::new(),
            hide_pids: true,
            cgroups: Vec::new(),
            users: None,
        }
    }

    #[test]
    fn the_sandbox_names_the_user_and_an_interrupted_claim_is_taken_back() {
        let root = tempfile::tempdir().expect("tempdir");
        let pool = UidPool::new(root.path().join("claims"), 100..=199);
        let dir = root.path().join("r");
        std::fs::create_dir(&dir).expect("dir");
        let uid = pool.claim(&dir).expect("claim");
        // Started: its sandbox names the user, and so does the claim after a restart.
        sandbox(uid).write(&dir).expect("write");
        assert_eq!(recorded_uid(&dir), Some(uid));
        assert_eq!(pool.claim(&dir).expect("again"), uid);
        // The sandbox of another uid that is not this directory's claim is not believed.
        sandbox(uid + 1).write(&dir).expect("write");
        assert_eq!(pool.claim(&dir).expect("ours"), uid);
        // A start that claimed and stopped before writing its sandbox: the same user.
        std::fs::remove_file(dir.join(crate::runtime::sandbox::SANDBOX_FILE)).expect("rm");
        assert_eq!(pool.claim(&dir).expect("taken back"), uid);
        // Released with the sandbox naming it: free for another directory.
        sandbox(uid).write(&dir).expect("write");
        pool.release(&dir);
        assert!(!root.path().join("claims").join(uid.to_string()).exists());
    }
}
