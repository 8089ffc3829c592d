//! A control group per isolated raw replica, with the Task's CPU, memory and process
//! limits (docs/security.md, "Replica isolation").
//!
//! The agent finds the hierarchies once ([`Hierarchies::detect`] reads
//! `/proc/self/mountinfo`): the unified (v2) hierarchy when it has the `cpu`, `memory` and
//! `pids` controllers, else the v1 hierarchies that carry them (a host may mix both, as
//! this project's CI machines do: v1 `cpu`, `memory`, `pids` beside a v2 mount with no
//! controllers). For each replica it makes `<hierarchy><parent>/<name>` in each and writes
//! the limits ([`Limits`]); the supervisor moves itself into them just long enough to
//! start the task (so the task is in them from its first instruction and the supervisor
//! is not subject to the task's memory limit), and removes them when the task's group is
//! gone ([`remove`]).
//!
//! | Task | v2 | v1 |
//! |---|---|---|
//! | `resources.limits.cpu` | `cpu.max` | `cpu.cfs_quota_us` / `cpu.cfs_period_us` |
//! | `resources.requests.cpu` | `cpu.weight` | `cpu.shares` |
//! | `resources.limits.memory` | `memory.max` (+ `memory.swap.max` 0) | `memory.limit_in_bytes` |
//! | the agent's `--replica-pids-limit` | `pids.max` | `pids.max` |

use std::path::{Path, PathBuf};

/// The CFS period limits are expressed in (100 ms, the kernel's default).
const CFS_PERIOD_US: u64 = 100_000;

/// Why a control group could not be made, limited or joined; names the file.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("make control group {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {value:?} to {}: {source}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        source: std::io::Error,
    },
    #[error(
        "no control group hierarchy carries the {0} controller (neither cgroup v2 with it \
         enabled nor a v1 hierarchy of it is mounted)"
    )]
    Missing(&'static str),
}

/// Which kind of hierarchy a directory belongs to (their files differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One mounted hierarchy holding some of the controllers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    /// Its mount point.
    pub mount: PathBuf,
    /// Which of `cpu`, `memory`, `pids` it carries.
    pub controllers: Vec<&'static str>,
}

/// The hierarchies replicas' groups are made in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchies(pub Vec<Hierarchy>);

/// What one replica's groups enforce. `None`: no limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// CPU limit in millicores.
    pub cpu_limit_millis: Option<u64>,
    /// CPU request in millicores (a share of contended CPU).
    pub cpu_request_millis: Option<u64>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids: Option<u64>,
}

const WANTED: [&str; 3] = ["cpu", "memory", "pids"];

impl Hierarchies {
    /// The hierarchies of this host (see the module documentation).
    pub fn detect() -> Result<Hierarchies, CgroupError> {
        let path = PathBuf::from("/proc/self/mountinfo");
        let text = std::fs::read_to_string(&path).map_err(|source| CgroupError::Read {
            path: path.clone(),
            source,
        })?;
        Hierarchies::from_mountinfo(&text, |mount| {
            std::fs::read_to_string(mount.join("cgroup.controllers")).ok()
        })
    }

    /// [`Hierarchies::detect`] over a `mountinfo` text; `controllers_of` reads a v2
    /// mount's `cgroup.controllers`.
    pub fn from_mountinfo(
        mountinfo: &str,
        controllers_of: impl Fn(&Path) -> Option<String>,
    ) -> Result<Hierarchies, CgroupError> {
        let mut v2: Option<Hierarchy> = None;
        let mut v1: Vec<Hierarchy> = Vec::new();
        for line in mountinfo.lines() {
            // ID PARENT MAJ:MIN ROOT MOUNT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let fields: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let (Some(fstype), _, Some(options)) = (right.next(), right.next(), right.next())
            else {
                continue;
            };
            let Some(mount) = fields.get(4).map(|m| PathBuf::from(unescape(m))) else {
                continue;
            };
            match fstype {
                "cgroup2" if v2.is_none() => {
                    let available = controllers_of(&mount).unwrap_or_default();
                    let controllers: Vec<&'static str> = WANTED
                        .into_iter()
                        .filter(|c| available.split_whitespace().any(|a| a == *c))
                        .collect();
                    v2 = Some(Hierarchy {
                        version: Version::V2,
                        mount,
                        controllers,
                    });
                }
                "cgroup" => {
                    let controllers: Vec<&'static str> = WANTED
                        .into_iter()
                        .filter(|c| options.split(',').any(|o| o == *c))
                        .filter(|c| !v1.iter().any(|h| h.controllers.contains(c)))
                        .collect();
                    if !controllers.is_empty() {
                        v1.push(Hierarchy {
                            version: Version::V1,
                            mount,
                            controllers,
                        });
                    }
                }
                _ => {}
            }
        }
        let mut chosen: Vec<Hierarchy> = Vec::new();
        if let Some(v2) = v2.filter(|h| !h.controllers.is_empty()) {
            chosen.push(v2);
        }
        for hierarchy in v1 {
            let missing: Vec<&'static str> = hierarchy
                .controllers
                .iter()
                .copied()
                .filter(|c| !chosen.iter().any(|h| h.controllers.contains(c)))
                .collect();
            if !missing.is_empty() {
                chosen.push(Hierarchy {
                    controllers: missing,
                    ..hierarchy
                });
            }
        }
        for wanted in WANTED {
            if !chosen.iter().any(|h| h.controllers.contains(&wanted)) {
                return Err(CgroupError::Missing(wanted));
            }
        }
        Ok(Hierarchies(chosen))
    }

    /// Make `parent` in every hierarchy (and, in v2, delegate the controllers to it): the
    /// agent's start-up check that replicas' groups can be made here.
    pub fn create_parent(&self, parent: &Path) -> Result<(), CgroupError> {
        let relative = parent.strip_prefix("/").unwrap_or(parent);
        for hierarchy in &self.0 {
            if hierarchy.version == Version::V2 {
                enable_controllers(&hierarchy.mount, relative, &hierarchy.controllers)?;
            } else {
                let mut dir = hierarchy.mount.clone();
                for part in relative.components() {
                    dir.push(part);
                    create_dir(&dir)?;
                }
            }
        }
        Ok(())
    }

    /// Make the groups `<parent>/<name>` of one replica, limited by `limits`; returns their
    /// directories (one per hierarchy). A group left by an earlier run of the same name is
    /// reused.
    pub fn create(
        &self,
        parent: &Path,
        name: &str,
        limits: &Limits,
    ) -> Result<Vec<PathBuf>, CgroupError> {
        let relative = parent.strip_prefix("/").unwrap_or(parent);
        let mut made = Vec::new();
        for hierarchy in &self.0 {
            let dir = hierarchy.mount.join(relative).join(name);
            // The parent was made at agent start ([`Hierarchies::create_parent`]); again only
            // when something removed it since.
            if let Err(CgroupError::Create { source, .. }) = create_dir(&dir)
                && source.kind() == std::io::ErrorKind::NotFound
            {
                self.create_parent(parent)?;
            }
            create_dir(&dir)?;
            for (file, value) in settings(hierarchy, limits) {
                write(&dir.join(file), &value)?;
            }
            made.push(dir);
        }
        Ok(made)
    }
}

/// Write `value` into `file`, naming both on failure.
fn write(file: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(file, value).map_err(|source| CgroupError::Write {
        path: file.to_path_buf(),
        value: value.to_string(),
        source,
    })
}

fn create_dir(dir: &Path) -> Result<(), CgroupError> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(CgroupError::Create {
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// v2: every group from the root down to `relative` delegates the controllers to its
/// children (`+cpu +memory +pids` in `cgroup.subtree_control`).
fn enable_controllers(
    mount: &Path,
    relative: &Path,
    controllers: &[&'static str],
) -> Result<(), CgroupError> {
    let value = controllers
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut dir = mount.to_path_buf();
    write(&dir.join("cgroup.subtree_control"), &value)?;
    for part in relative.components() {
        dir.push(part);
        create_dir(&dir)?;
        write(&dir.join("cgroup.subtree_control"), &value)?;
    }
    Ok(())
}

/// The (file, value) pairs that enforce `limits` in a group of `hierarchy`.
pub fn settings(hierarchy: &Hierarchy, limits: &Limits) -> Vec<(&'static str, String)> {
    let has = |c: &str| hierarchy.controllers.contains(&c);
    // The value of a limit, or the file's word for none.
    let or = |value: Option<u64>, unlimited: &str| {
        value.map_or_else(|| unlimited.to_string(), |v| v.to_string())
    };
    let mut out = Vec::new();
    match hierarchy.version {
        Version::V2 => {
            if has("cpu") {
                let quota = or(limits.cpu_limit_millis.map(quota_us), "max");
                out.push(("cpu.max", format!("{quota} {CFS_PERIOD_US}")));
                if let Some(millis) = limits.cpu_request_millis {
                    // cgroup v2's weight for Kubernetes' shares (kubelet's conversion).
                    let shares = shares(millis);
                    let weight = 1 + ((shares.saturating_sub(2)) * 9999) / 262_142;
                    out.push(("cpu.weight", weight.clamp(1, 10_000).to_string()));
                }
            }
            if has("memory") {
                out.push(("memory.max", or(limits.memory_bytes, "max")));
            }
        }
        Version::V1 => {
            if has("cpu") {
                out.push(("cpu.cfs_period_us", CFS_PERIOD_US.to_string()));
                out.push((
                    "cpu.cfs_quota_us",
                    or(limits.cpu_limit_millis.map(quota_us), "-1"),
                ));
                if let Some(millis) = limits.cpu_request_millis {
                    out.push(("cpu.shares", shares(millis).to_string()));
                }
            }
            if has("memory") {
                out.push(("memory.limit_in_bytes", or(limits.memory_bytes, "-1")));
            }
        }
    }
    if has("pids") {
        out.push(("pids.max", or(limits.pids, "max")));
    }
    out
}

/// CFS quota per period for `millis` millicores (at least the kernel's 1 ms minimum).
fn quota_us(millis: u64) -> u64 {
    (millis.saturating_mul(CFS_PERIOD_US) / 1000).max(1000)
}

/// Kubernetes' CPU shares for a request of `millis` millicores (at least 2).
fn shares(millis: u64) -> u64 {
    (millis.saturating_mul(1024) / 1000).max(2)
}

/// Move the calling process into each of `groups` (write its pid to `cgroup.procs`).
pub fn join(groups: &[PathBuf]) -> Result<(), CgroupError> {
    let pid = std::process::id().to_string();
    for group in groups {
        write(&group.join("cgroup.procs"), &pid)?;
    }
    Ok(())
}

/// The groups the calling process is in now, in the hierarchies of `groups` (read from
/// `/proc/self/cgroup`), to go back to after starting the task.
pub fn current(groups: &[PathBuf]) -> Result<Vec<PathBuf>, CgroupError> {
    let path = PathBuf::from("/proc/self/cgroup");
    let text = std::fs::read_to_string(&path).map_err(|source| CgroupError::Read {
        path: path.clone(),
        source,
    })?;
    let mountinfo_path = PathBuf::from("/proc/self/mountinfo");
    let mountinfo =
        std::fs::read_to_string(&mountinfo_path).map_err(|source| CgroupError::Read {
            path: mountinfo_path,
            source,
        })?;
    Ok(groups
        .iter()
        .filter_map(|group| own_group_in(group, &text, &mountinfo))
        .collect())
}

/// The group this process is in within the hierarchy holding `group`.
fn own_group_in(group: &Path, proc_cgroup: &str, mountinfo: &str) -> Option<PathBuf> {
    // The mount point of `group`'s hierarchy: the longest cgroup mount that prefixes it.
    let (mount, fstype, options) = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount = left.split(' ').nth(4)?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| {
                (
                    PathBuf::from(unescape(mount)),
                    fstype.to_string(),
                    options.to_string(),
                )
            })
        })
        .filter(|(mount, _, _)| group.starts_with(mount))
        .max_by_key(|(mount, _, _)| mount.as_os_str().len())?;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let matches = if fstype == "cgroup2" {
            controllers.is_empty()
        } else {
            controllers
                .split(',')
                .any(|c| options.split(',').any(|o| o == c))
        };
        if matches {
            return Some(mount.join(path.trim_start_matches('/')));
        }
    }
    None
}

/// Remove the groups (each must be empty: the task's group is gone). Missing ones are
/// fine; the first other failure is returned after trying all.
pub fn remove(groups: &[PathBuf]) -> Result<(), CgroupError> {
    let mut first = None;
    for group in groups {
        match std::fs::remove_dir(group) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                first.get_or_insert(CgroupError::Create {
                    path: group.clone(),
                    source,
                });
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// `mountinfo` escapes spaces, tabs, newlines and backslashes as octal.
fn unescape(text: &str) -> String {
    text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_mixed_host_uses_the_v1_hierarchies_when_v2_has_no_controllers() {
        let found = Hierarchies::from_mountinfo(MIXED, |_| Some("hugetlb".into())).expect("found");
        let mounts: Vec<(&Path, Vec<&str>)> = found
            .0
            .iter()
            .map(|h| (h.mount.as_path(), h.controllers.clone()))
            .collect();
        assert_eq!(
            mounts,
            [
                (Path::new("/sys/fs/cgroup/cpu"), vec!["cpu"]),
                (Path::new("/sys/fs/cgroup/memory"), vec!["memory"]),
                (Path::new("/sys/fs/cgroup/pids"), vec!["pids"]),
            ]
        );
        assert!(found.0.iter().all(|h| h.version == Version::V1));
    }

    #[test]
    fn a_v2_host_with_the_controllers_uses_the_unified_hierarchy_alone() {
        let info = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let found = Hierarchies::from_mountinfo(info, |_| Some("cpuset cpu io memory pids".into()))
            .expect("found");
        assert_eq!(
            found.0,
            [Hierarchy {
                version: Version::V2,
                mount: "/sys/fs/cgroup".into(),
                controllers: vec!["cpu", "memory", "pids"],
            }]
        );
        let none = Hierarchies::from_mountinfo(info, |_| Some("cpu pids".into()));
        assert!(
            none.expect_err("no memory")
                .to_string()
                .contains("memory controller"),
        );
    }

    #[test]
    fn limits_become_the_files_of_each_version() {
        let limits = Limits {
            cpu_limit_millis: Some(500),
            cpu_request_millis: Some(250),
            memory_bytes: Some(64 << 20),
            pids: Some(128),
        };
        let v2 = Hierarchy {
            version: Version::V2,
            mount: "/x".into(),
            controllers: vec!["cpu", "memory", "pids"],
        };
        assert_eq!(
            settings(&v2, &limits),
            [
                ("cpu.max", "50000 100000".to_string()),
                ("cpu.weight", "10".to_string()),
                ("memory.max", (64u64 << 20).to_string()),
                ("pids.max", "128".to_string()),
            ]
        );
        let v1 = Hierarchy {
            version: Version::V1,
            mount: "/x".into(),
            controllers: vec!["cpu", "memory", "pids"],
        };
        assert_eq!(
            settings(&v1, &limits),
            [
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "50000".to_string()),
                ("cpu.shares", "256".to_string()),
                ("memory.limit_in_bytes", (64u64 << 20).to_string()),
                ("pids.max", "128".to_string()),
            ]
        );
        assert_eq!(
            settings(&v1, &Limits::default()),
            [
                ("cpu.cfs_period_us", "100000".to_string()),
                ("cpu.cfs_quota_us", "-1".to_string()),
                ("memory.limit_in_bytes", "-1".to_string()),
                ("pids.max", "max".to_string()),
            ]
        );
    }

    #[test]
    fn own_group_is_found_per_hierarchy() {
        let proc_cgroup = "4:memory:/process_api/abc\n8:pids:/\n0::/\n";
        assert_eq!(
            own_group_in(
                Path::new("/sys/fs/cgroup/memory/rlark.slice/r"),
                proc_cgroup,
                MIXED
            ),
            Some(PathBuf::from("/sys/fs/cgroup/memory/process_api/abc"))
        );
        assert_eq!(
            own_group_in(
                Path::new("/sys/fs/cgroup/pids/rlark.slice/r"),
                proc_cgroup,
                MIXED
            ),
            Some(PathBuf::from("/sys/fs/cgroup/pids/"))
        );
    }
}
