//! What filesystem a bench's data directories are on, said beside its figures: on an ext4
//! without a journal every inode allocation skips the inodes deleted in the last few
//! minutes one by one (the kernel's `recently_deleted`), so a bench that creates and
//! deletes files per operation (`rlark bench agent`: a replica's directories and records)
//! costs more per operation the more files earlier operations and runs deleted
//! (docs/benchmarks.md, "The agent bench and the filesystem").

use std::path::Path;

/// The filesystem holding `path`, as `fstype (source)`, with `, without a journal` or
/// `, with a journal` for ext4; `unknown` when `/proc/self/mountinfo` does not say.
pub fn describe(path: &Path) -> String {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return "unknown".into();
    };
    let Some((fstype, source)) = mount_of(&mountinfo, path) else {
        return "unknown".into();
    };
    let journal = (fstype == "ext4")
        .then(|| {
            let device = source.rsplit('/').next().unwrap_or_default();
            std::fs::read_to_string(format!("/sys/fs/ext4/{device}/journal_task")).ok()
        })
        .flatten()
        .map(|task| journal_text(&task));
    match journal {
        Some(journal) => format!("{fstype} ({source}), {journal}"),
        None => format!("{fstype} ({source})"),
    }
}

/// ext4's `journal_task` (`<none>` without a journal) in words.
fn journal_text(task: &str) -> &'static str {
    if task.trim() == "<none>" {
        "without a journal"
    } else {
        "with a journal"
    }
}

/// The type and source of the mount holding `path` (the longest mount point that is a
/// prefix of it) in a `mountinfo` text.
fn mount_of(mountinfo: &str, path: &Path) -> Option<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let point = left.split(' ').nth(4)?.replace("\\040", " ");
            let mut right = right.split(' ');
            let fstype = right.next()?.to_string();
            let source = right.next()?.to_string();
            path.starts_with(&point).then_some((point, fstype, source))
        })
        .max_by_key(|(point, _, _)| point.len())
        .map(|(_, fstype, source)| (fstype, source))
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 22 0:27 / /tmp/fast rw shared:9 - tmpfs tmpfs rw,size=1024k
41 22 7:0 / /mnt/j rw,relatime shared:20 - ext4 /dev/loop0 rw
";

    #[test]
    fn the_longest_mount_point_holds_the_path() {
        let of = |p: &str| mount_of(INFO, Path::new(p));
        assert_eq!(of("/tmp/x"), Some(("ext4".into(), "/dev/vda".into())));
        assert_eq!(of("/tmp/fast/x"), Some(("tmpfs".into(), "tmpfs".into())));
        assert_eq!(of("/mnt/j/a/b"), Some(("ext4".into(), "/dev/loop0".into())));
        // A sibling whose name only starts like a mount point is not under it.
        assert_eq!(of("/mnt/jj"), Some(("ext4".into(), "/dev/vda".into())));
        assert_eq!(journal_text("<none>\n"), "without a journal");
        assert_eq!(journal_text("1234\n"), "with a journal");
    }

    #[test]
    fn this_process_has_a_filesystem() {
        let described = describe(&std::env::temp_dir());
        assert_ne!(described, "unknown");
    }
}
