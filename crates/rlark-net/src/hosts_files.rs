//! The hosts files of the attached replicas, kept current: [`HostsFiles`] registers a
//! replica's file and writes it in one step, and rewrites every registered file when the
//! membership changes.
//!
//! Both steps run under one lock and render the membership's *current* view (not the view
//! that woke the rewrite). Otherwise a replica could miss a peer for good: its file written
//! before the change, the change's rewrite run before the file was registered, and no
//! further change to wake it (a head that joins while its worker attaches: the worker never
//! resolves `RLARK_HEAD_ADDRESS`).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

use super::hosts::{self, HostEntry};
use super::membership::{Membership, MembershipView};

/// One registered file: the replica's domain and the file's path.
#[derive(Clone, Debug)]
struct Registered {
    domain: String,
    path: PathBuf,
}

/// The hosts files of a [`crate::DomainNet`]'s replicas (module documentation). Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct HostsFiles {
    membership: Membership,
    files: Arc<Mutex<BTreeMap<String, Registered>>>,
}

impl HostsFiles {
    /// No file registered yet; each follows `membership`.
    pub fn new(membership: Membership) -> Self {
        HostsFiles {
            membership,
            files: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    fn files(&self) -> MutexGuard<'_, BTreeMap<String, Registered>> {
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Write replica `pod`'s file at `path` from the current view of `domain` and register
    /// it (replacing an earlier registration of `pod`). Nothing is registered when the write
    /// fails.
    pub fn add(&self, pod: &str, domain: &str, path: &Path) -> io::Result<()> {
        let mut files = self.files();
        write(path, domain, &self.membership.view())?;
        files.insert(
            pod.to_string(),
            Registered {
                domain: domain.to_string(),
                path: path.to_path_buf(),
            },
        );
        Ok(())
    }

    /// Stop keeping `pod`'s file current (the file stays); its path, if it was registered.
    pub fn forget(&self, pod: &str) -> Option<PathBuf> {
        self.files().remove(pod).map(|r| r.path)
    }

    /// Rewrite every registered file from the current view; the files that could not be
    /// written, with why.
    pub fn rewrite_all(&self) -> Vec<(PathBuf, io::Error)> {
        let files = self.files();
        let view = self.membership.view();
        files
            .values()
            .filter_map(|r| {
                write(&r.path, &r.domain, &view)
                    .err()
                    .map(|error| (r.path.clone(), error))
            })
            .collect()
    }

    /// Rewrite every registered file now (a change made before this started is not missed)
    /// and whenever the membership changes, until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut views = self.membership.subscribe();
        loop {
            // Marks the view seen; the rewrite reads it as it is now.
            views.borrow_and_update();
            for (file, error) in self.rewrite_all() {
                tracing::warn!(file = %file.display(), %error, "rewrite a replica's hosts file");
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = views.changed() => if changed.is_err() { return },
            }
        }
    }
}

/// Write the hosts file of a replica of `domain` at `path` from `view`: the host's own
/// `/etc/hosts` with the domain's block. An unchanged file is not written.
fn write(path: &Path, domain: &str, view: &MembershipView) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let base = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    let members: Vec<HostEntry> = view
        .domain(domain)
        .map(|d| {
            d.members
                .values()
                .map(|m| HostEntry {
                    pod: m.pod.clone(),
                    ip: m.ip,
                })
                .collect()
        })
        .unwrap_or_default();
    let text = hosts::render(&base, domain, &members);
    if std::fs::read_to_string(path).ok().as_deref() == Some(text.as_str()) {
        return Ok(());
    }
    super::netns::rewrite_in_place(path, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::tests::{me, peer, pod};
    use anyhow::Context as _;

    fn names(path: &Path) -> anyhow::Result<Vec<String>> {
        let text = std::fs::read_to_string(path)?;
        Ok(text
            .lines()
            .filter(|l| l.contains(".net1"))
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
            .collect())
    }

    #[test]
    fn a_file_added_after_a_change_has_the_current_view() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let membership = Membership::new(me());
        let files = HostsFiles::new(membership.clone());
        membership.replace(&[peer(
            "net1",
            "10.88.0.0/24",
            vec![pod("a", "w-0", "10.88.0.2", "n1")],
        )]);
        // The worker's file is registered and written.
        let worker = dir.path().join("w.hosts");
        files.add("w-0", "net1", &worker)?;
        assert_eq!(names(&worker)?, ["w-0.net1"]);
        // The head joins: the rewrite that follows the change reaches the worker.
        membership.replace(&[peer(
            "net1",
            "10.88.0.0/24",
            vec![
                pod("a", "w-0", "10.88.0.2", "n1"),
                pod("b", "h-0", "10.88.0.3", "nb"),
            ],
        )]);
        assert!(files.rewrite_all().is_empty());
        assert_eq!(names(&worker)?, ["h-0.net1", "w-0.net1"]);
        // A file registered after that change's rewrite already ran (the race that lost
        // the head for good) still names it: `add` renders the current view.
        let late = dir.path().join("late.hosts");
        files.add("l-0", "net1", &late)?;
        assert_eq!(names(&late)?, ["h-0.net1", "w-0.net1"]);
        // Forgotten files are no longer rewritten.
        assert_eq!(files.forget("l-0").context("registered")?, late);
        assert_eq!(files.forget("l-0"), None);
        membership.replace(&[]);
        assert!(files.rewrite_all().is_empty());
        assert!(names(&worker)?.is_empty());
        assert_eq!(names(&late)?, ["h-0.net1", "w-0.net1"]);
        Ok(())
    }

    #[test]
    fn a_file_that_cannot_be_written_is_not_registered() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let files = HostsFiles::new(Membership::new(me()));
        let blocked = dir.path().join("not-a-dir");
        std::fs::write(&blocked, "")?;
        assert!(files.add("w-0", "net1", &blocked.join("w.hosts")).is_err());
        assert_eq!(files.forget("w-0"), None);
        Ok(())
    }

    /// Polls `path` until it names `want` (bounded: 2 s).
    async fn named(path: &Path, want: &[&str]) -> anyhow::Result<Vec<String>> {
        let mut seen = Vec::new();
        for _ in 0..200 {
            seen = names(path)?;
            if seen == want {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(seen)
    }

    #[tokio::test]
    async fn run_rewrites_at_start_and_on_every_change() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let membership = Membership::new(me());
        let files = HostsFiles::new(membership.clone());
        let worker = dir.path().join("w.hosts");
        files.add("w-0", "net1", &worker)?;
        let stop = CancellationToken::new();
        let running = tokio::spawn(files.clone().run(stop.clone()));
        // Changed before `run` subscribed (the task has not run yet): the first pass has it.
        membership.replace(&[peer(
            "net1",
            "10.88.0.0/24",
            vec![pod("b", "h-0", "10.88.0.3", "nb")],
        )]);
        assert_eq!(named(&worker, &["h-0.net1"]).await?, ["h-0.net1"]);
        // Changed while it runs.
        membership.replace(&[peer(
            "net1",
            "10.88.0.0/24",
            vec![
                pod("b", "h-0", "10.88.0.3", "nb"),
                pod("b", "h-1", "10.88.0.4", "nb"),
            ],
        )]);
        let both = ["h-0.net1", "h-1.net1"];
        assert_eq!(named(&worker, &both).await?, both);
        stop.cancel();
        running.await?;
        Ok(())
    }
}
