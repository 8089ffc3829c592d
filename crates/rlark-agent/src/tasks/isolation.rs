//! Which [`Sandbox`] each raw replica gets: the agent's isolation policy
//! ([`crate::IsolationConfig`]) applied to a Task (docs/security.md, "Replica isolation").
//!
//! - **User**: `raw.runAsUser` when the policy allows it (a listed range; root only for a
//!   Job in `--replica-root-jobs`, and then no sandbox at all: root could undo it), else the
//!   replica's own user from the [`UidPool`].
//! - **Hidden**: the agent's whole data directory (identity, PKI, every replica), the
//!   embodied runtime's socket directory, and the configured paths.
//! - **Seen anyway**: the replica's own directory (read-write; its `work/` is the user's),
//!   the CA certificate of `RLARK_CA_FILE` (read-only), and the sockets of the kinds of
//!   devices it holds (read-only; the runtime still checks each call's caller).
//! - **Control groups**: `<parent>/<namespace>_<pod>` with the Task's CPU and memory limits,
//!   its CPU request as a share, and the agent's process limit.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use rlark_api::quantity::parse_quantity;
use rlark_api::types::{RawTaskSpec, ResourceList};

use crate::config::IsolationConfig;
use crate::runtime::cgroup::{Hierarchies, Limits};
use crate::runtime::sandbox::{Bind, Sandbox, UserEntries};
use crate::runtime::uids::UidPool;

/// The policy, prepared once at agent start.
#[derive(Clone, Debug)]
pub struct Isolation {
    pool: UidPool,
    hide: Vec<PathBuf>,
    expose: Vec<PathBuf>,
    allowed_users: Vec<RangeInclusive<u32>>,
    root_jobs: Vec<String>,
    /// `None`: no usable control group hierarchies (the start-up log said why).
    hierarchies: Option<Hierarchies>,
    cgroup_parent: PathBuf,
    pids_limit: u64,
}

/// What a replica asks of the policy.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    /// The Task's Job (`rlinf.io/job`), empty for a bare Task.
    pub job: &'a str,
    pub raw: &'a RawTaskSpec,
    pub replica_dir: &'a Path,
    pub ca_file: &'a Path,
    /// Sockets of the embodied runtime the replica's devices are served on.
    pub sockets: Vec<PathBuf>,
}

/// The outcome for one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Run it in this sandbox.
    Isolated(Sandbox),
    /// Run it as root, unisolated: its Job is allowed to.
    Root,
}

impl Isolation {
    /// The policy of `config` for an agent whose data directory is `data_dir` and whose
    /// embodied runtime serves in `socket_dir`; `None` when isolation is off.
    pub fn prepare(
        config: &IsolationConfig,
        data_dir: &Path,
        socket_dir: Option<&Path>,
    ) -> Option<Isolation> {
        if !config.enabled {
            if nix::unistd::geteuid().is_root() {
                tracing::warn!(
                    "replica isolation is off (--replica-isolation=false): raw replicas run \
                     as root in the host's namespaces and can read this agent's keys"
                );
            }
            return None;
        }
        if let Some(missing) = missing_capabilities() {
            // An unprivileged container: the agent can neither switch users nor make mount
            // namespaces. The container is then the replicas' boundary; say so loudly.
            tracing::warn!(
                missing = %missing,
                "replica isolation is unavailable: the agent lacks {missing}; raw replicas run \
                 as the agent's user in its namespaces (run the agent as root with its \
                 capabilities to isolate them)"
            );
            return None;
        }
        let hierarchies = match Hierarchies::detect().and_then(|found| {
            found.create_parent(&config.cgroup_parent)?;
            Ok(found)
        }) {
            Ok(found) => Some(found),
            Err(error) => {
                tracing::warn!(%error, "replicas run without control groups (no CPU, memory or process limits)");
                None
            }
        };
        let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let data_dir = absolute(data_dir);
        let mut hide = vec![data_dir.clone()];
        // A replica reaches its own directory by its path: when an ancestor of the data
        // directory is closed to other users (a home directory, a 0700 temporary one), the
        // replica's view of that ancestor is an empty tmpfs instead, with the mount points.
        hide.extend(closed_ancestor(&data_dir));
        for path in &config.expose {
            hide.extend(closed_ancestor(&absolute(path)));
        }
        hide.extend(socket_dir.map(absolute));
        hide.extend(config.hide.iter().map(|p| absolute(p)));
        Some(Isolation {
            pool: UidPool::new(data_dir.join("replica-users"), config.uid_range.clone()),
            hide,
            expose: config.expose.iter().map(|p| absolute(p)).collect(),
            allowed_users: config.allowed_users.clone(),
            root_jobs: config.root_jobs.clone(),
            hierarchies,
            cgroup_parent: config.cgroup_parent.clone(),
            pids_limit: config.pids_limit,
        })
    }

    /// The sandbox of one replica, its control groups made; an error names what the Task
    /// asked that the policy refuses, or what failed on the host.
    pub fn decide(&self, request: &Request<'_>) -> Result<Decision, String> {
        let (uid, gid) = match request.raw.run_as_user {
            Some(0) => {
                if self.root_allowed(request.job) {
                    return Ok(Decision::Root);
                }
                return Err(format!(
                    "raw.runAsUser 0 (root) is not allowed for {}: the agent runs Jobs as \
                     root only when listed with --replica-root-jobs",
                    if request.job.is_empty() {
                        "a Task without a Job".to_string()
                    } else {
                        format!("Job {:?}", request.job)
                    }
                ));
            }
            Some(user) => {
                let user = u32::try_from(user)
                    .map_err(|_| format!("raw.runAsUser {user} is not a user id"))?;
                if !self.allowed_users.iter().any(|r| r.contains(&user)) {
                    return Err(format!(
                        "raw.runAsUser {user} is not among the users this agent allows \
                         (--replica-allowed-users {})",
                        ranges_text(&self.allowed_users)
                    ));
                }
                let group = match request.raw.run_as_group {
                    Some(group) => u32::try_from(group)
                        .ok()
                        .filter(|g| *g != 0)
                        .ok_or_else(|| format!("raw.runAsGroup {group} is not allowed"))?,
                    None => user,
                };
                (user, group)
            }
            None => {
                let uid = self
                    .pool
                    .claim(request.replica_dir)
                    .map_err(|e| e.to_string())?;
                (uid, uid)
            }
        };
        let replica_dir = std::path::absolute(request.replica_dir)
            .unwrap_or_else(|_| request.replica_dir.to_path_buf());
        let mut binds = vec![Bind {
            source: replica_dir.clone(),
            target: replica_dir.clone(),
            writable: true,
        }];
        // Tools look their user up (OpenSSH's scp and sftp-server refuse to run without a
        // passwd entry): the supervisor adds the replica's user to the host's files.
        let users = user_entries(
            &replica_dir,
            uid,
            gid,
            &format!("{}/{}", request.namespace, request.pod),
        );
        binds.push(Bind {
            source: request.ca_file.to_path_buf(),
            target: request.ca_file.to_path_buf(),
            writable: false,
        });
        // Exposed paths that do not exist (yet) are left out rather than fail the start.
        for path in self.expose.iter().filter(|p| p.exists()) {
            binds.push(Bind {
                source: path.clone(),
                target: path.clone(),
                writable: false,
            });
        }
        for socket in &request.sockets {
            binds.push(Bind {
                source: socket.clone(),
                target: socket.clone(),
                writable: false,
            });
        }
        let cgroups = match &self.hierarchies {
            Some(hierarchies) => hierarchies
                .create(
                    &self.cgroup_parent,
                    &format!("{}_{}", request.namespace, request.pod),
                    &limits(request.raw, self.pids_limit),
                )
                .map_err(|e| e.to_string())?,
            None => Vec::new(),
        };
        Ok(Decision::Isolated(Sandbox {
            uid,
            gid,
            hide: self.hide.clone(),
            binds,
            hide_pids: true,
            cgroups,
            users: Some(users),
        }))
    }

    /// Free the user of a replica directory about to be deleted.
    pub fn release(&self, replica_dir: &Path) {
        self.pool.release(replica_dir);
    }

    fn root_allowed(&self, job: &str) -> bool {
        self.root_jobs
            .iter()
            .any(|allowed| allowed == "*" || (!job.is_empty() && allowed == job))
    }
}

/// The capabilities isolating a replica needs (`CAP_SETUID`, `CAP_SETGID`,
/// `CAP_SYS_ADMIN` for its mount namespace) that this process lacks, named; `None` when it
/// has them all.
fn missing_capabilities() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let effective = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())?;
    let missing: Vec<&str> = [(6, "CAP_SETGID"), (7, "CAP_SETUID"), (21, "CAP_SYS_ADMIN")]
        .into_iter()
        .filter(|(bit, _)| effective & (1u64 << bit) == 0)
        .map(|(_, name)| name)
        .collect();
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The name the replica's user has in its `/etc/passwd`.
pub const REPLICA_USER: &str = "rlark-replica";

/// The replica's `/etc/passwd` and `/etc/group` entries (added by the supervisor unless the
/// host has entries of those ids; [`crate::runtime::sandbox::UserEntries`]).
fn user_entries(replica_dir: &Path, uid: u32, gid: u32, owner: &str) -> UserEntries {
    UserEntries {
        passwd: format!(
            "{REPLICA_USER}:x:{uid}:{gid}:rlark replica {owner}:{}:/bin/sh",
            replica_dir.join("work").display()
        ),
        group: format!("{REPLICA_USER}:x:{gid}:"),
    }
}

/// The outermost ancestor of `path` that other users cannot traverse (no `o+x`), if any.
fn closed_ancestor(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .filter(|a| a.parent().is_some())
        .find(|a| std::fs::metadata(a).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
        .map(Path::to_path_buf)
}

/// `FIRST-LAST,...`, or `none`.
fn ranges_text(ranges: &[RangeInclusive<u32>]) -> String {
    if ranges.is_empty() {
        return "none".to_string();
    }
    ranges
        .iter()
        .map(|r| format!("{}-{}", r.start(), r.end()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The Task's limits in control group terms.
pub fn limits(raw: &RawTaskSpec, pids: u64) -> Limits {
    let resources = raw.resources.as_ref();
    let quantity = |list: Option<&ResourceList>, name: &str, milli: bool| {
        let text = list?.get(name)?;
        let value = parse_quantity(&text.0).ok()?;
        let number = if milli {
            value.milli_value()?
        } else {
            value.value()?
        };
        u64::try_from(number).ok().filter(|n| *n > 0)
    };
    let requests = resources.map(|r| &r.requests);
    let limits = resources.map(|r| &r.limits);
    Limits {
        cpu_limit_millis: quantity(limits, "cpu", true),
        cpu_request_millis: quantity(requests, "cpu", true),
        memory_bytes: quantity(limits, "memory", false),
        pids: Some(pids),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use rlark_api::types::ResourceRequirements;

    fn policy(root: &Path, config: IsolationConfig) -> Isolation {
        let mut isolation =
            Isolation::prepare(&config, &root.join("agent"), Some(&root.join("sockets")))
                .expect("enabled");
        // Unit tests make no control groups.
        isolation.hierarchies = None;
        isolation
    }

    fn request<'a>(raw: &'a RawTaskSpec, dir: &'a Path, ca: &'a Path, job: &'a str) -> Request<'a> {
        Request {
            namespace: "rlark-a",
            pod: "t-0",
            job,
            raw,
            replica_dir: dir,
            ca_file: ca,
            sockets: vec![PathBuf::from("/s/ros-ctrl.sock")],
        }
    }

    #[test]
    fn a_replica_gets_its_own_user_its_directory_and_the_ca_and_nothing_of_the_agent() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))
            .expect("open the root to others");
        let isolation = policy(
            root.path(),
            IsolationConfig {
                uid_range: 5000..=5001,
                hide: vec!["/srv/rlark-server".into()],
                ..IsolationConfig::default()
            },
        );
        let dir = root.path().join("agent/tasks/rlark-a/t/u/0");
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = root.path().join("agent/identity/ca.crt");
        let raw = RawTaskSpec::default();
        let Decision::Isolated(sandbox) = isolation
            .decide(&request(&raw, &dir, &ca, "job"))
            .expect("decided")
        else {
            panic!("isolated expected");
        };
        assert!((5000..=5001).contains(&sandbox.uid));
        assert_eq!(sandbox.gid, sandbox.uid);
        assert_eq!(
            sandbox.hide,
            [
                root.path().join("agent"),
                root.path().join("sockets"),
                PathBuf::from("/srv/rlark-server")
            ]
        );
        let targets: Vec<(&Path, bool)> = sandbox
            .binds
            .iter()
            .map(|b| (b.target.as_path(), b.writable))
            .collect();
        assert_eq!(
            targets,
            [
                (dir.as_path(), true),
                (ca.as_path(), false),
                (Path::new("/s/ros-ctrl.sock"), false)
            ]
        );
        // The user files are the supervisor's to write (in its tmpfs): none in the directory.
        assert!(!dir.join("passwd").exists() && !dir.join("group").exists());
        assert_eq!(
            sandbox.users,
            Some(UserEntries {
                passwd: format!(
                    "{REPLICA_USER}:x:{0}:{0}:rlark replica rlark-a/t-0:{1}:/bin/sh",
                    sandbox.uid,
                    dir.join("work").display()
                ),
                group: format!("{REPLICA_USER}:x:{}:", sandbox.uid),
            })
        );
        assert!(sandbox.hide_pids);
    }

    #[test]
    fn a_closed_ancestor_of_the_data_directory_is_hidden_too() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700))
            .expect("close the root");
        std::fs::create_dir_all(root.path().join("agent")).expect("agent");
        let isolation = policy(root.path(), IsolationConfig::default());
        assert!(
            isolation.hide.contains(&root.path().to_path_buf()),
            "{:?}",
            isolation.hide
        );
        assert_eq!(closed_ancestor(Path::new("/usr/bin")), None);
    }

    #[test]
    fn root_and_other_users_only_where_the_policy_allows() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("r");
        std::fs::create_dir_all(&dir).expect("dir");
        let ca = root.path().join("ca.crt");
        let strict = policy(root.path(), IsolationConfig::default());
        let as_root = RawTaskSpec {
            run_as_user: Some(0),
            ..RawTaskSpec::default()
        };
        let error = strict
            .decide(&request(&as_root, &dir, &ca, "train"))
            .expect_err("root refused");
        assert!(
            error.contains("--replica-root-jobs") && error.contains("\"train\""),
            "{error}"
        );
        let as_1000 = RawTaskSpec {
            run_as_user: Some(1000),
            ..RawTaskSpec::default()
        };
        let error = strict
            .decide(&request(&as_1000, &dir, &ca, "train"))
            .expect_err("user refused");
        assert!(error.contains("1000") && error.contains("none"), "{error}");

        let lenient = policy(
            root.path(),
            IsolationConfig {
                root_jobs: vec!["train".into()],
                allowed_users: vec![1000..=1999],
                ..IsolationConfig::default()
            },
        );
        assert_eq!(
            lenient
                .decide(&request(&as_root, &dir, &ca, "train"))
                .expect("root"),
            Decision::Root
        );
        assert!(
            lenient
                .decide(&request(&as_root, &dir, &ca, "other"))
                .is_err()
        );
        assert!(lenient.decide(&request(&as_root, &dir, &ca, "")).is_err());
        let Decision::Isolated(sandbox) = lenient
            .decide(&request(&as_1000, &dir, &ca, "train"))
            .expect("user 1000")
        else {
            panic!("isolated expected");
        };
        assert_eq!((sandbox.uid, sandbox.gid), (1000, 1000));
    }

    #[test]
    fn the_tasks_resources_become_limits() {
        let quantities = |pairs: &[(&str, &str)]| -> ResourceList {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect()
        };
        let raw = RawTaskSpec {
            resources: Some(ResourceRequirements {
                limits: quantities(&[("cpu", "1500m"), ("memory", "256Mi")]),
                requests: quantities(&[("cpu", "0.5")]),
            }),
            ..RawTaskSpec::default()
        };
        assert_eq!(
            limits(&raw, 64),
            Limits {
                cpu_limit_millis: Some(1500),
                cpu_request_millis: Some(500),
                memory_bytes: Some(256 << 20),
                pids: Some(64),
            }
        );
        assert_eq!(
            limits(&RawTaskSpec::default(), 8),
            Limits {
                pids: Some(8),
                ..Limits::default()
            }
        );
    }
}
