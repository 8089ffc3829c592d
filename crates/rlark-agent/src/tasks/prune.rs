//! Old runs on disk: the directories `<task>/<uid>/` of a Task name.

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::state::{STATE_FILE, subdirs};

/// Runs of one Task name kept on disk: the current one and the one before it (the logs
/// API's `previous=true`).
pub const RUNS_KEPT: usize = 2;

/// Retention of a Task's run directories `<task_dir>/<uid>/`: besides `current_uid`, the
/// newest other run is kept (by the latest change to it or its replica directories) and
/// the older ones are deleted — except any that still holds a state file (a replica
/// running, or whose final status is not reported yet). Returns the directories removed.
pub fn prune_runs(task_dir: &Path, current_uid: &str) -> Vec<PathBuf> {
    let modified = |dir: &Path| {
        std::iter::once(dir.to_path_buf())
            .chain(subdirs(dir))
            .filter_map(|d| std::fs::metadata(d).and_then(|m| m.modified()).ok())
            .max()
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut others: Vec<(SystemTime, PathBuf)> = subdirs(task_dir)
        .into_iter()
        .filter(|dir| dir.file_name().and_then(|n| n.to_str()) != Some(current_uid))
        .map(|dir| (modified(&dir), dir))
        .collect();
    others.sort_by(|a, b| b.cmp(a));
    let mut removed = Vec::new();
    for (_, dir) in others.into_iter().skip(RUNS_KEPT - 1) {
        if subdirs(&dir).iter().any(|r| r.join(STATE_FILE).exists()) {
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => removed.push(dir),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "remove the directory of an old run");
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn old_runs_are_pruned_but_the_previous_one_and_unreported_ones_stay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let task_dir = dir.path().join("rlark-c").join("j-a");
        let run = |uid: &str, age_secs: u64, state: bool| {
            let replica = task_dir.join(uid).join("0");
            std::fs::create_dir_all(replica.join("logs")).expect("mkdir");
            if state {
                std::fs::write(replica.join(STATE_FILE), "{}").expect("state");
            }
            let when = SystemTime::now() - Duration::from_secs(age_secs);
            for d in [task_dir.join(uid), replica] {
                std::fs::File::open(&d)
                    .and_then(|f| f.set_modified(when))
                    .expect("set mtime");
            }
        };
        run("u1", 400, false);
        run("u2", 300, true);
        run("u3", 200, false);
        run("u4", 100, false);
        run("u5", 0, false);
        let mut removed = prune_runs(&task_dir, "u5");
        removed.sort();
        assert_eq!(removed, [task_dir.join("u1"), task_dir.join("u3")]);
        let mut left: Vec<String> = subdirs(&task_dir)
            .iter()
            .filter_map(|d| d.file_name()?.to_str().map(str::to_string))
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["u2", "u4", "u5"],
            "current, previous, and one with a state file"
        );
        assert!(
            prune_runs(&task_dir, "u5").is_empty(),
            "nothing more to prune"
        );
        assert!(prune_runs(&dir.path().join("missing"), "u1").is_empty());
    }
}
