//! What an isolated raw replica may see and be (docs/security.md, "Replica isolation").
//!
//! The agent decides a [`Sandbox`] for each replica it starts (its user, what of the host's
//! files it must not see, what it must see anyway, its control groups) and writes it as
//! `REPLICA_DIR/sandbox.json` (root's, 0600) before it starts the supervisor. The
//! supervisor ([`crate::supervisor`], `--sandbox FILE`) applies it in the single-threaded
//! process the task is started from:
//!
//! 1. in a mount namespace of its own (slave of the host's), every path of
//!    [`Sandbox::hide`] gets an empty read-only tmpfs on top of it (the agent's data
//!    directory with its PKI and every replica's directory, the server's under `rlark up`,
//!    the embodied runtime's socket directory);
//! 2. every [`Bind`] is then bind-mounted back at its target, opened before the hiding
//!    (the replica's own directory, the CA certificate of `RLARK_CA_FILE`, the sockets of
//!    the devices it holds);
//! 3. with [`Sandbox::users`], `/etc/passwd` and `/etc/group` are covered by the host's
//!    files plus the replica's user and group, written into the tmpfs of the first hidden
//!    path (in memory: no file of the host's filesystem per start);
//! 4. a new `proc` instance with `hidepid=invisible` covers `/proc`: the task sees the
//!    processes of its own user only, and each replica has a user of its own;
//! 5. the task is moved into its control groups ([`crate::runtime::cgroup`]) and starts
//!    with `no_new_privs`, as [`Sandbox::uid`]/[`Sandbox::gid`] with no supplementary
//!    groups.
//!
//! `rlark exec` (and so the SSH shell of a task) enters the same namespaces, control groups
//! and user through [`enter_argv`]: the supervisor binary with `--enter PID`, which joins
//! the network and mount namespaces of the replica's process, then execs the command.
//!
//! Everything that touches the host here is a plain function over paths, so the mount
//! sequence is tested in a real mount namespace (`tests/integration/isolation.rs`) and the plan's
//! parts ([`Sandbox::mount_plan`]) without one.

use std::ffi::OsString;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file in a replica directory that holds its [`Sandbox`].
pub const SANDBOX_FILE: &str = "sandbox.json";

/// A path bind-mounted into the sandbox after the hiding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bind {
    /// What is mounted (a directory, a file or a socket), as the agent sees it.
    pub source: PathBuf,
    /// Where the task sees it (usually the same path).
    pub target: PathBuf,
    /// Read-write (the replica's own directory); otherwise read-only.
    #[serde(default)]
    pub writable: bool,
}

/// One replica's isolation (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// The user the task runs as.
    pub uid: u32,
    /// Its group.
    pub gid: u32,
    /// Paths covered by an empty tmpfs.
    #[serde(default)]
    pub hide: Vec<PathBuf>,
    /// Paths bound back in after the hiding.
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Cover `/proc` with an instance that shows only the task's own processes.
    #[serde(default)]
    pub hide_pids: bool,
    /// The control groups the task starts in (one directory per hierarchy).
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
    /// The replica's own entries of `/etc/passwd` and `/etc/group` (tools look their user
    /// up: OpenSSH's scp and sftp-server refuse to run without a passwd entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<UserEntries>,
}

/// One line of `/etc/passwd` and one of `/etc/group`, each added to the host's file unless
/// it already has an entry of that id (the third field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserEntries {
    pub passwd: String,
    pub group: String,
}

/// Where the replica's `/etc/passwd` and `/etc/group` are written, inside the tmpfs of the
/// first hidden path.
const USER_FILES_DIR: &str = ".rlark-etc";

/// `host` (a passwd or group file) with `line` added unless an entry has the same id.
pub fn with_entry(host: &str, line: &str) -> String {
    let id = |l: &str| l.split(':').nth(2).map(str::to_string);
    let mut out = host.to_string();
    if id(line).is_some_and(|wanted| host.lines().any(|l| id(l).as_deref() == Some(&*wanted))) {
        return out;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line.trim_end_matches('\n'));
    out.push('\n');
    out
}

/// Why a sandbox could not be set up; each names the step and the path.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a sandbox description: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{step} {}: {source}", path.display())]
    Mount {
        step: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("{step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl Sandbox {
    /// Read `dir/sandbox.json`; `None` when the replica has none (not isolated).
    pub fn read(dir: &Path) -> Result<Option<Sandbox>, SandboxError> {
        let path = dir.join(SANDBOX_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SandboxError::Read { path, source }),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| SandboxError::Parse { path, source })
    }

    /// Write it as `dir/sandbox.json`, mode 0600 (root's: the task never reads it). A file
    /// that already says the same (a restarted replica) is left as it is; none is synced
    /// (it is written again at every start).
    pub fn write(&self, dir: &Path) -> Result<PathBuf, SandboxError> {
        let path = dir.join(SANDBOX_FILE);
        let failed = |source| SandboxError::Write {
            path: path.clone(),
            source,
        };
        let bytes =
            serde_json::to_vec_pretty(self).map_err(|e| failed(std::io::Error::other(e)))?;
        super::record::replace(&path, &bytes, 0o600).map_err(failed)?;
        Ok(path)
    }

    /// The mount steps, in order: the hidden paths that are not inside another hidden
    /// path (those are gone with it), then the binds whose target is inside a hidden path
    /// or differs from its source, or that are read-only (a writable bind of a visible path
    /// onto itself changes nothing).
    pub fn mount_plan(&self) -> (Vec<PathBuf>, Vec<Bind>) {
        let mut hide: Vec<PathBuf> = self.hide.clone();
        hide.sort();
        hide.dedup();
        let mut kept: Vec<PathBuf> = Vec::new();
        for path in hide {
            if !kept.iter().any(|outer| path.starts_with(outer)) {
                kept.push(path);
            }
        }
        let binds = self
            .binds
            .iter()
            .filter(|bind| {
                !bind.writable
                    || bind.source != bind.target
                    || kept.iter().any(|hidden| bind.target.starts_with(hidden))
            })
            .cloned()
            .collect();
        (kept, binds)
    }

    /// Steps 1–3 of the module documentation, in the calling process, which must be alone
    /// in a mount namespace of its own already (the supervisor unshares it first).
    pub fn apply_mounts(&self) -> Result<(), SandboxError> {
        use nix::fcntl::{OFlag, open};
        use nix::mount::{MsFlags, mount};
        use nix::sys::stat::Mode;
        let (hide, binds) = self.mount_plan();
        // Opened before anything is hidden: the sources may be inside hidden paths.
        let mut sources: Vec<(OwnedFd, &Bind, bool)> = Vec::with_capacity(binds.len());
        for bind in &binds {
            let fd = open(
                &bind.source,
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|source| SandboxError::Mount {
                step: "open",
                path: bind.source.clone(),
                source,
            })?;
            let is_dir = std::fs::metadata(&bind.source)
                .map_err(|source| SandboxError::Io {
                    step: "inspect",
                    path: bind.source.clone(),
                    source,
                })?
                .is_dir();
            sources.push((fd, bind, is_dir));
        }
        for path in &hide {
            if !path.exists() {
                continue;
            }
            mount(
                Some("tmpfs"),
                path,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("mode=0755,size=1m"),
            )
            .map_err(|source| SandboxError::Mount {
                step: "hide",
                path: path.clone(),
                source,
            })?;
        }
        for (fd, bind, is_dir) in &sources {
            make_mount_point(&bind.target, *is_dir)?;
            let from = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
            mount(
                Some(&from),
                &bind.target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|source| SandboxError::Mount {
                step: "bind-mount into",
                path: bind.target.clone(),
                source,
            })?;
            if !bind.writable {
                remount_read_only(&bind.target)?;
            }
        }
        if let Some(users) = &self.users {
            self.mount_user_files(&hide, users)?;
        }
        // The tmpfs of each hidden path read-only now that its mount points are made.
        for path in &hide {
            if !path.exists() {
                continue;
            }
            mount(
                None::<&str>,
                path,
                None::<&str>,
                MsFlags::MS_REMOUNT
                    | MsFlags::MS_RDONLY
                    | MsFlags::MS_NOSUID
                    | MsFlags::MS_NODEV
                    | MsFlags::MS_NOEXEC,
                Some("mode=0755,size=1m"),
            )
            .map_err(|source| SandboxError::Mount {
                step: "make read-only the tmpfs hiding",
                path: path.clone(),
                source,
            })?;
        }
        if self.hide_pids {
            mount(
                Some("proc"),
                "/proc",
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("hidepid=invisible"),
            )
            .map_err(|source| SandboxError::Mount {
                step: "mount a proc showing only the task's processes on",
                path: PathBuf::from("/proc"),
                source,
            })?;
        }
        Ok(())
    }
}

impl Sandbox {
    /// Step 3 of the module documentation: the host's `/etc/passwd` and `/etc/group` with
    /// `users`' lines, written into the tmpfs of the first existing hidden path and bound
    /// read-only over the originals (a host without one of them gets none).
    fn mount_user_files(&self, hide: &[PathBuf], users: &UserEntries) -> Result<(), SandboxError> {
        use nix::mount::{MsFlags, mount};
        use std::os::unix::fs::PermissionsExt as _;
        let Some(tmpfs) = hide.iter().find(|p| p.exists()) else {
            return Err(SandboxError::Io {
                step: "find a hidden path to hold the replica's /etc/passwd",
                path: PathBuf::from("/etc/passwd"),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            });
        };
        let dir = tmpfs.join(USER_FILES_DIR);
        std::fs::create_dir_all(&dir).map_err(|source| SandboxError::Io {
            step: "make",
            path: dir.clone(),
            source,
        })?;
        for (name, line) in [("passwd", &users.passwd), ("group", &users.group)] {
            let target = Path::new("/etc").join(name);
            let Ok(host) = std::fs::read_to_string(&target) else {
                continue;
            };
            let file = dir.join(name);
            std::fs::write(&file, with_entry(&host, line))
                .and_then(|()| {
                    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
                })
                .map_err(|source| SandboxError::Io {
                    step: "write",
                    path: file.clone(),
                    source,
                })?;
            mount(
                Some(&file),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|source| SandboxError::Mount {
                step: "bind-mount the replica's user file over",
                path: target.clone(),
                source,
            })?;
            remount_read_only(&target)?;
        }
        Ok(())
    }
}

/// Make the bind mount at `target` read-only (and `nosuid`, `nodev`).
fn remount_read_only(target: &Path) -> Result<(), SandboxError> {
    use nix::mount::{MsFlags, mount};
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|source| SandboxError::Mount {
        step: "make read-only",
        path: target.to_path_buf(),
        source,
    })
}

/// An empty directory or file at `target` (and its parents) to mount on.
fn make_mount_point(target: &Path, is_dir: bool) -> Result<(), SandboxError> {
    let failed = |source| SandboxError::Io {
        step: "make the mount point",
        path: target.to_path_buf(),
        source,
    };
    if is_dir {
        return std::fs::create_dir_all(target).map_err(failed);
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .map(drop)
            .map_err(failed),
        Err(error) => Err(failed(error)),
    }
}

/// The command that runs `command` where the replica whose process is `pid` runs: its
/// network and mount namespaces, and with `sandbox_file` its control groups and user too
/// (see the module documentation):
/// `SUPERVISOR... --enter PID [--sandbox FILE] --cwd DIR -- PROGRAM ARGS...`.
pub fn enter_argv(
    supervisor: &[OsString],
    pid: u32,
    sandbox_file: Option<&Path>,
    cwd: &Path,
    command: &[String],
) -> Vec<OsString> {
    let mut argv: Vec<OsString> = supervisor.to_vec();
    argv.push("--enter".into());
    argv.push(pid.to_string().into());
    if let Some(file) = sandbox_file {
        argv.push("--sandbox".into());
        argv.push(file.into());
    }
    argv.push("--cwd".into());
    argv.push(cwd.into());
    argv.push("--".into());
    argv.extend(command.iter().map(OsString::from));
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bind(source: &str, target: &str, writable: bool) -> Bind {
        Bind {
            source: source.into(),
            target: target.into(),
            writable,
        }
    }

    #[test]
    fn nested_hides_collapse_and_visible_writable_self_binds_are_dropped() {
        let sandbox = Sandbox {
            uid: 70_000,
            gid: 70_000,
            hide: vec!["/data/agent".into(), "/data".into(), "/data/agent/x".into()],
            binds: vec![
                bind(
                    "/data/agent/tasks/ns/t/u/0",
                    "/data/agent/tasks/ns/t/u/0",
                    true,
                ),
                bind("/srv/shared", "/srv/shared", true),
                bind("/srv/ca.crt", "/srv/ca.crt", false),
            ],
            hide_pids: true,
            cgroups: Vec::new(),
            users: None,
        };
        let (hide, binds) = sandbox.mount_plan();
        assert_eq!(hide, [PathBuf::from("/data")]);
        assert_eq!(
            binds,
            [
                bind(
                    "/data/agent/tasks/ns/t/u/0",
                    "/data/agent/tasks/ns/t/u/0",
                    true
                ),
                bind("/srv/ca.crt", "/srv/ca.crt", false),
            ]
        );
    }

    #[test]
    fn an_entry_is_added_once_and_only_for_an_id_the_host_lacks() {
        let host = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/false";
        let added = with_entry(host, "rlark-replica:x:7:7::/w:/bin/sh");
        assert_eq!(
            added,
            "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/bin/false\n\
             rlark-replica:x:7:7::/w:/bin/sh\n"
        );
        assert_eq!(with_entry(&added, "rlark-replica:x:7:7::/w:/bin/sh"), added);
        // The host already names the id: its entry stays, none is added.
        assert_eq!(with_entry(host, "other:x:65534:1::/:/bin/sh"), host);
        assert_eq!(with_entry("", "g:x:9:\n"), "g:x:9:\n");
    }

    #[test]
    fn the_file_round_trips_and_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(Sandbox::read(dir.path()).expect("none"), None);
        let sandbox = Sandbox {
            uid: 1,
            gid: 2,
            hide: vec!["/a".into()],
            binds: vec![bind("/a/b", "/a/b", true)],
            hide_pids: true,
            cgroups: vec!["/sys/fs/cgroup/x".into()],
            users: Some(UserEntries {
                passwd: "rlark-replica:x:1:2::/w:/bin/sh".into(),
                group: "rlark-replica:x:2:".into(),
            }),
        };
        let path = sandbox.write(dir.path()).expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Sandbox::read(dir.path()).expect("read"), Some(sandbox));
        std::fs::write(&path, b"{").expect("corrupt");
        let error = Sandbox::read(dir.path()).expect_err("bad");
        assert!(
            error.to_string().contains("not a sandbox description"),
            "{error}"
        );
    }

    #[test]
    fn enter_argv_puts_the_command_after_the_separator() {
        let argv = enter_argv(
            &["rlark".into(), "supervise".into()],
            42,
            Some(Path::new("/r/sandbox.json")),
            Path::new("/r/work"),
            &["sh".to_string(), "-c".to_string(), "id".to_string()],
        );
        let text: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            text,
            [
                "rlark",
                "supervise",
                "--enter",
                "42",
                "--sandbox",
                "/r/sandbox.json",
                "--cwd",
                "/r/work",
                "--",
                "sh",
                "-c",
                "id"
            ]
        );
        // An unisolated replica (in a Domain's network namespace): no sandbox file.
        let argv = enter_argv(
            &["rlark-supervise".into()],
            7,
            None,
            Path::new("/w"),
            &["true".to_string()],
        );
        assert_eq!(
            argv,
            [
                "rlark-supervise",
                "--enter",
                "7",
                "--cwd",
                "/w",
                "--",
                "true"
            ]
            .map(OsString::from)
        );
    }
}
