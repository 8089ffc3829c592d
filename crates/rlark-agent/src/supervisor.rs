//! The per-replica supervisor process: `rlark supervise`, or the same code as a small
//! binary of its own — `rlark-supervise` (the `rlark` package; used by the agent when
//! installed beside `rlark`, see [`crate::runtime::default_supervisor`]) and
//! `rlark-agent-supervise` (this crate's, for its tests).
//!
//! ```text
//! rlark supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME]
//!                 [--netns PATH] [--hosts FILE] -- PROGRAM [ARGS...]
//! ```
//!
//! The agent starts one per replica ([`crate::runtime::spawn_replica`]) with the replica's
//! working directory, environment and log file (stdout and stderr) already set; the
//! supervisor runs `PROGRAM` with them, so the task's exit is seen and recorded even when
//! the agent is not running. It is plain `std` code (no async runtime, no threads), so it
//! stays small. What it does:
//!
//! 1. it leaves the agent's session and process group (`setsid`), so signals aimed at the
//!    agent (a terminal's Ctrl-C, `kill -9` of the agent) never reach it, and becomes a
//!    child subreaper, so the task's orphaned descendants are reparented to it and reaped;
//! 2. with `--netns PATH` (a replica of a domain task, [`rlark_net::netns`]) it enters
//!    that network namespace (`setns`; the supervisor is single-threaded, so the whole
//!    process moves), and with `--netns` or `--hosts` it unshares a mount namespace of its
//!    own whose mounts are slaves of the host's (`/` recursively `MS_SLAVE`: the host's
//!    later mounts and unmounts still arrive, nothing done here leaks back); there it
//!    mounts a fresh `/sys` (with `--netns`: `/sys/class/net` then shows the namespace's
//!    devices, as under `ip netns exec`) and bind-mounts `FILE` over `/etc/hosts` (as `ip
//!    netns exec` does with `/etc/netns/NAME/hosts`). The agent rewrites `FILE` in place
//!    (same inode), so the task sees each update; a failure here is a start error;
//! 3. it starts `PROGRAM` (argv\[0\] = `NAME` when given) as the leader of a new process
//!    group, stdin `/dev/null`, everything else inherited;
//! 4. it writes `REPLICA_DIR/pid.json` ([`PidRecord`]: task pid, process group, `/proc`
//!    start ticks, its own pid and start ticks, start time);
//! 5. when the main process ends it writes `REPLICA_DIR/exit.json` ([`ExitRecord`]: `code`
//!    or `signal`, `finishedAt`) before anything else; then it SIGKILLs what is left of the
//!    process group (a replica is its whole tree) — except during a stop, see below — waits
//!    (bounded) until the group is gone, and exits 0;
//! 6. a start error (`ENOENT`, `EACCES`, `ENOEXEC`, ...) is written to `exit.json` as
//!    `error` (+ `errno`) and the supervisor exits 1.
//!
//! # Signals
//!
//! SIGTERM and SIGINT sent to the supervisor are forwarded to the task's process group:
//! that is how the agent stops a replica, and a human's `kill SUPERVISOR_PID` stops the task
//! cleanly too. The first one starts a stop: when the main process has exited, the rest of
//! the group gets what is left of the grace period (`--grace-ms`, default 30 s, counted from
//! that first signal) before SIGKILL, and once the grace period is over the whole group is
//! SIGKILLed (`exit.json` then says `"killed": true`). SIGHUP is ignored. SIGKILL of the
//! supervisor cannot be caught: the task keeps running unsupervised and the agent reports
//! its outcome as unknown (`AgentLost`).
//!
//! Signals are taken through a `signalfd` (blocked, then read). The task is started with
//! `posix_spawn`, which gives it an empty signal mask (a blocked mask would otherwise be
//! inherited across `exec`, and a shell would never see SIGTERM) and every signal's default
//! disposition (SIGPIPE, which Rust programs ignore, and whatever the agent inherited
//! ignored, e.g. SIGINT from a shell's `&`: issue 38, "clean children", `rlark_process`).

use rlark_process::CleanSignals as _;
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsFd as _, AsRawFd as _};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, PosixSpawnFlags, posix_spawn};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::runtime::record::{self, EXIT_FILE, ExitRecord, PID_FILE, PidRecord};
use crate::runtime::sandbox::Sandbox;
use crate::runtime::{ExitStatus, cgroup, process};

pub use crate::runtime::record::{PROTOCOL, version_line};

/// Grace period of a stop when `--grace-ms` is not given.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);
/// How long the supervisor waits for a SIGKILLed process group to be gone before it exits
/// anyway (a process stuck in uninterruptible sleep cannot be waited for forever).
const KILLED_GROUP_WAIT: Duration = Duration::from_secs(5);
/// Longest pause between two checks of a dying process group.
const GROUP_POLL: Duration = Duration::from_millis(50);

const USAGE: &str = "usage: rlark supervise --dir REPLICA_DIR [--grace-ms N] [--arg0 NAME] \
                     [--netns PATH] [--hosts FILE] [--sandbox FILE] -- PROGRAM [ARGS...]\n       \
                     rlark supervise --enter PID [--sandbox FILE] --cwd DIR -- PROGRAM [ARGS...]";

/// Parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorArgs {
    /// Where `pid.json` and `exit.json` go.
    pub dir: PathBuf,
    /// Grace period of a stop (SIGTERM → SIGKILL).
    pub grace: Duration,
    /// argv\[0\] of the task, when not `program`.
    pub arg0: Option<OsString>,
    /// The network namespace to run the task in (`/run/netns/<name>`).
    pub netns: Option<PathBuf>,
    /// A file bind-mounted over `/etc/hosts` for the task.
    pub hosts: Option<PathBuf>,
    /// The replica's isolation ([`crate::runtime::sandbox::Sandbox`], a JSON file).
    pub sandbox: Option<PathBuf>,
    /// `--enter PID`: instead of supervising, run PROGRAM where the replica whose process
    /// is PID runs, by `exec`: its network and mount namespaces, and with `--sandbox` its
    /// control groups and user too.
    pub enter: Option<u32>,
    /// With `--enter`: the working directory there.
    pub cwd: Option<PathBuf>,
    /// The program to run: a path (absolute, or relative to the working directory; no
    /// `PATH` lookup — the agent resolves the program before it starts the supervisor).
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
}

impl SupervisorArgs {
    /// Parse the arguments after `supervise` (the program name excluded).
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Self, String> {
        let mut args = args.into_iter();
        let mut dir = None;
        let mut grace = DEFAULT_GRACE;
        let mut arg0 = None;
        let mut netns = None;
        let mut hosts = None;
        let mut sandbox = None;
        let mut enter = None;
        let mut cwd = None;
        loop {
            let Some(flag) = args.next() else {
                return Err("missing `-- PROGRAM`".into());
            };
            let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
            match flag.to_str() {
                Some("--") => break,
                Some("--dir") => dir = Some(PathBuf::from(value("--dir")?)),
                Some("--arg0") => arg0 = Some(value("--arg0")?),
                Some("--netns") => netns = Some(PathBuf::from(value("--netns")?)),
                Some("--hosts") => hosts = Some(PathBuf::from(value("--hosts")?)),
                Some("--sandbox") => sandbox = Some(PathBuf::from(value("--sandbox")?)),
                Some("--cwd") => cwd = Some(PathBuf::from(value("--cwd")?)),
                Some("--enter") => {
                    let text = value("--enter")?;
                    let pid: u32 = text
                        .to_str()
                        .and_then(|t| t.parse().ok())
                        .filter(|pid| *pid > 0)
                        .ok_or_else(|| format!("--enter {text:?} is not a process id"))?;
                    enter = Some(pid);
                }
                Some("--grace-ms") => {
                    let text = value("--grace-ms")?;
                    let ms: u64 = text
                        .to_str()
                        .and_then(|t| t.parse().ok())
                        .ok_or_else(|| format!("--grace-ms {text:?} is not a number of ms"))?;
                    grace = Duration::from_millis(ms).min(crate::runtime::MAX_GRACE);
                }
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        let dir = match (dir, enter) {
            (Some(dir), None) => dir,
            (None, Some(_)) => PathBuf::new(),
            (Some(_), Some(_)) => return Err("--dir and --enter exclude each other".into()),
            (None, None) => return Err("--dir is required".into()),
        };
        if enter.is_some() && cwd.is_none() {
            return Err("--enter needs --cwd".into());
        }
        let program = args
            .next()
            .filter(|p| !p.is_empty())
            .ok_or("missing PROGRAM after `--`")?;
        Ok(SupervisorArgs {
            dir,
            grace,
            arg0,
            netns,
            hosts,
            sandbox,
            enter,
            cwd,
            program,
            args: args.collect(),
        })
    }
}

/// Run the supervisor with `args` (the arguments after `supervise`); returns the process
/// exit code: 0 once the task ran and its exit was recorded, 1 when it could not be
/// started or supervised, 2 for bad arguments. Messages go to stderr (the replica log).
pub fn main(args: impl Iterator<Item = OsString>) -> i32 {
    // The agent starts the supervisor with `posix_spawn` (no hook in the child): every
    // signal the agent inherited ignored (a shell's `&` ignores SIGINT and SIGQUIT) or
    // blocked is reset here, before anything else. SIGPIPE stays ignored, as in every Rust
    // program: the supervisor's writes report EPIPE instead of killing it.
    if let Err(error) = reset_own_signals() {
        eprintln!("rlark supervise: reset signals: {error}");
        return 1;
    }
    let mut args = args.peekable();
    if args.peek().is_some_and(|a| a == "--version") {
        println!("{}", version_line());
        return 0;
    }
    let args = match SupervisorArgs::parse(args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("rlark supervise: {message}\n{USAGE}");
            return 2;
        }
    };
    if let Some(pid) = args.enter {
        // Only returns when the program could not be started.
        let message = enter(&args, pid);
        eprintln!("rlark supervise: {message}");
        return 1;
    }
    match run(&args) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("rlark supervise: {message}");
            1
        }
    }
}

/// Every signal to its default disposition but SIGPIPE (ignored), and an empty mask.
fn reset_own_signals() -> std::io::Result<()> {
    rlark_process::reset_signals()()?;
    // SAFETY: no handler is installed, SIG_IGN is a disposition.
    #[allow(unsafe_code)]
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn) }
        .map(drop)
        .map_err(std::io::Error::from)
}

fn run(args: &SupervisorArgs) -> Result<(), String> {
    // Blocked first, so no SIGCHLD or SIGTERM can be missed (or kill us by default).
    let mut mask = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(signal);
    }
    mask.thread_block()
        .map_err(|e| format!("block signals: {e}"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))?;
    // Out of the agent's session and group. EPERM means we lead a group already (started
    // by hand from a job-control shell): keep going in it.
    let _ = nix::unistd::setsid();
    if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("rlark supervise: cannot become a child subreaper ({error}); continuing");
    }

    let exit_path = args.dir.join(EXIT_FILE);
    let start_failed = |message: String| {
        let record = ExitRecord::start_failed(message.clone(), None);
        if let Err(e) = record::write(&exit_path, &record) {
            eprintln!("rlark supervise: write {}: {e}", exit_path.display());
        }
        message
    };
    let sandbox = match &args.sandbox {
        Some(path) => Some(read_sandbox(path).map_err(start_failed)?),
        None => None,
    };
    // Opened before `/sys` may be covered by the network namespace's sysfs.
    let groups = match &sandbox {
        Some(sandbox) => Some(GroupFiles::open(&sandbox.cgroups).map_err(start_failed)?),
        None => None,
    };
    enter_network(args, sandbox.as_ref()).map_err(start_failed)?;
    let spawned = match (&sandbox, &groups) {
        (Some(sandbox), Some(groups)) => spawn_isolated(args, sandbox, groups),
        _ => spawn(args),
    };
    let child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let message = format!("start {:?}: {error}", args.program);
            let record = ExitRecord::start_failed(message.clone(), error.raw_os_error());
            if let Err(e) = record::write(&exit_path, &record) {
                eprintln!("rlark supervise: write {}: {e}", exit_path.display());
            }
            return Err(message);
        }
    };
    let pgid = child.as_raw();
    let pid = u32::try_from(pgid).map_err(|_| format!("pid {pgid} out of range"))?;
    let me = std::process::id();
    let started = PidRecord {
        pid,
        pgid,
        proc_start_ticks: process::proc_stat(pid).map(|s| s.start_ticks),
        supervisor_pid: me,
        supervisor_start_ticks: process::proc_stat(me).map(|s| s.start_ticks),
        started_at: Utc::now(),
    };
    if let Err(error) = record::write(&args.dir.join(PID_FILE), &started) {
        // Unrecorded, the agent could not find it again: do not leave it running.
        signal_group(pgid, Signal::SIGKILL);
        return Err(format!(
            "write {}: {error}",
            args.dir.join(PID_FILE).display()
        ));
    }
    let supervised = Supervision::new(pgid, args.grace, exit_path).run(&signals);
    if let Some(groups) = &groups {
        groups.remove();
    }
    supervised
}

/// Read the `--sandbox` file.
fn read_sandbox(path: &std::path::Path) -> Result<Sandbox, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let sandbox: Sandbox = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not a sandbox description: {e}", path.display()))?;
    if sandbox.uid == 0 || sandbox.gid == 0 {
        return Err(format!(
            "{} asks for uid {} gid {}: a sandbox never runs as root",
            path.display(),
            sandbox.uid,
            sandbox.gid
        ));
    }
    Ok(sandbox)
}

/// The `cgroup.procs` files of a replica's control groups and of the supervisor's own, to
/// move the supervisor in for the task's start and out again.
struct GroupFiles {
    replica: Vec<(PathBuf, std::fs::File)>,
    own: Vec<(PathBuf, std::fs::File)>,
    /// Each replica group's parent directory and name, to remove it at the end.
    parents: Vec<(std::fs::File, OsString)>,
}

impl GroupFiles {
    fn open(groups: &[PathBuf]) -> Result<GroupFiles, String> {
        let open = |dir: &PathBuf| {
            let path = dir.join("cgroup.procs");
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map(|file| (path.clone(), file))
                .map_err(|e| format!("open {}: {e}", path.display()))
        };
        let own = cgroup::current(groups).map_err(|e| e.to_string())?;
        let parents = groups
            .iter()
            .filter_map(|dir| Some((dir.parent()?, dir.file_name()?)))
            .map(|(parent, name)| {
                std::fs::File::open(parent)
                    .map(|file| (file, name.to_os_string()))
                    .map_err(|e| format!("open {}: {e}", parent.display()))
            })
            .collect::<Result<_, _>>()?;
        Ok(GroupFiles {
            replica: groups.iter().map(open).collect::<Result<_, _>>()?,
            own: own.iter().map(open).collect::<Result<_, _>>()?,
            parents,
        })
    }

    /// Remove the replica's groups (empty once its process group is gone).
    fn remove(&self) {
        use nix::unistd::{UnlinkatFlags, unlinkat};
        for (parent, name) in &self.parents {
            match unlinkat(parent, name.as_os_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(error) => {
                    eprintln!("rlark supervise: remove control group {name:?}: {error}");
                }
            }
        }
    }

    /// Write this process's pid into each file of `files`.
    fn join(files: &[(PathBuf, std::fs::File)]) -> Result<(), String> {
        use std::io::Write as _;
        let pid = std::process::id().to_string();
        for (path, file) in files {
            (&*file)
                .write_all(pid.as_bytes())
                .map_err(|e| format!("join control group {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

/// Start the task of an isolated replica: as its user, with no supplementary groups and
/// `no_new_privs`, in its control groups (the supervisor joins them for the start only),
/// the leader of a new process group, stdin `/dev/null`, every signal at its default and
/// none blocked (`rlark_process`).
fn spawn_isolated(
    args: &SupervisorArgs,
    sandbox: &Sandbox,
    groups: &GroupFiles,
) -> std::io::Result<Pid> {
    use std::os::unix::process::CommandExt as _;
    nix::sys::prctl::set_no_new_privs().map_err(std::io::Error::from)?;
    GroupFiles::join(&groups.replica).map_err(std::io::Error::other)?;
    let mut command = std::process::Command::new(&args.program);
    command
        .arg0(args.arg0.as_deref().unwrap_or(&args.program))
        .args(&args.args)
        .process_group(0)
        .uid(sandbox.uid)
        .gid(sandbox.gid)
        .stdin(std::process::Stdio::null())
        // Whatever the supervisor inherited (it may be started by hand).
        .clean_signals();
    let spawned = command.spawn();
    if let Err(message) = GroupFiles::join(&groups.own) {
        eprintln!("rlark supervise: {message}; the supervisor stays in the replica's groups");
    }
    let child = spawned?;
    let pid = i32::try_from(child.id())
        .map_err(|_| std::io::Error::other(format!("pid {} out of range", child.id())))?;
    // Reaped by `waitpid` in the wait loop, not through `child`.
    drop(child);
    Ok(Pid::from_raw(pid))
}

/// `--enter PID`: join the network and mount namespaces of the replica whose process is
/// PID (so names, addresses and `/etc/hosts` are the task's), with `--sandbox` also its
/// control groups, `no_new_privs` and its user, and exec the program in `--cwd`. Returns
/// only the reason it failed.
fn enter(args: &SupervisorArgs, pid: u32) -> String {
    use nix::sched::{CloneFlags, setns};
    use std::os::unix::process::CommandExt as _;
    let Some(cwd) = &args.cwd else {
        return "--enter needs --cwd".to_string();
    };
    let sandbox = match args.sandbox.as_deref().map(read_sandbox).transpose() {
        Ok(sandbox) => sandbox,
        Err(message) => return message,
    };
    let namespace = |kind: &str| {
        let path = PathBuf::from(format!("/proc/{pid}/ns/{kind}"));
        std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))
    };
    let (net, mnt) = match (namespace("net"), namespace("mnt")) {
        (Ok(net), Ok(mnt)) => (net, mnt),
        (Err(message), _) | (_, Err(message)) => return message,
    };
    if let Some(sandbox) = &sandbox
        && let Err(error) = cgroup::join(&sandbox.cgroups)
    {
        return error.to_string();
    }
    if let Err(error) = setns(&net, CloneFlags::CLONE_NEWNET) {
        return format!("enter the network namespace of process {pid}: {error}");
    }
    if let Err(error) = setns(&mnt, CloneFlags::CLONE_NEWNS) {
        return format!("enter the mount namespace of process {pid}: {error}");
    }
    if let Err(error) = std::env::set_current_dir(cwd) {
        return format!("change to {} in the replica: {error}", cwd.display());
    }
    let mut command = std::process::Command::new(&args.program);
    command.args(&args.args).clean_signals();
    if let Some(sandbox) = &sandbox {
        if let Err(error) = nix::sys::prctl::set_no_new_privs() {
            return format!("set no_new_privs: {error}");
        }
        command.uid(sandbox.uid).gid(sandbox.gid);
    }
    let error = command.exec();
    format!("start {:?} in the replica: {error}", args.program)
}

/// Step 2 of the module documentation: the network namespace, the mount namespace,
/// `/sys`, `/etc/hosts` and the sandbox's mounts. Nothing to do without `--netns`,
/// `--hosts` and `--sandbox`. The error names the step and the path.
fn enter_network(args: &SupervisorArgs, sandbox: Option<&Sandbox>) -> Result<(), String> {
    use nix::mount::{MsFlags, mount};
    use nix::sched::{CloneFlags, setns, unshare};
    if let Some(path) = &args.netns {
        let namespace = std::fs::File::open(path)
            .map_err(|e| format!("open network namespace {}: {e}", path.display()))?;
        setns(&namespace, CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("enter network namespace {}: {e}", path.display()))?;
    }
    if args.netns.is_some() && sandbox.is_some() {
        // Unprivileged ICMP echo sockets (`ping`) for every group in the replica's own
        // network namespace, as container runtimes set it: a new namespace allows none.
        if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647") {
            eprintln!("rlark supervise: allow ping in the network namespace: {e}; continuing");
        }
    }
    if args.netns.is_none() && args.hosts.is_none() && sandbox.is_none() {
        return Ok(());
    }
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare the mount namespace: {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| format!("make / a recursive slave mount: {e}"))?;
    if args.netns.is_some() {
        // As `ip netns exec`: sysfs shows the network devices of the namespace that mounts
        // it. Mounted on top of the host's `/sys` (not after unmounting it, as `ip` does),
        // so a failure leaves the task the host's `/sys` rather than none; not fatal: the
        // network itself works without it.
        if let Err(e) = mount(
            Some("sysfs"),
            "/sys",
            Some("sysfs"),
            MsFlags::empty(),
            None::<&str>,
        ) {
            eprintln!("rlark supervise: mount /sys for the network namespace: {e}; continuing");
        }
    }
    if let Some(hosts) = &args.hosts {
        mount(
            Some(hosts.as_path()),
            "/etc/hosts",
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind-mount {} over /etc/hosts: {e}", hosts.display()))?;
    }
    if let Some(sandbox) = sandbox {
        sandbox.apply_mounts().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Start the task: `args.program` as the leader of a new process group, stdin
/// `/dev/null`, stdout, stderr, working directory and environment inherited; every signal
/// back to its default and unblocked (see the module documentation).
fn spawn(args: &SupervisorArgs) -> std::io::Result<Pid> {
    fn c_string(text: &OsStr) -> std::io::Result<CString> {
        CString::new(text.as_bytes()).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{text:?} contains a NUL byte"),
            )
        })
    }
    let argv = std::iter::once(args.arg0.as_deref().unwrap_or(&args.program))
        .chain(args.args.iter().map(OsString::as_os_str))
        .map(c_string)
        .collect::<std::io::Result<Vec<CString>>>()?;
    let envp = std::env::vars_os()
        .map(|(key, value)| {
            let mut pair = key;
            pair.push("=");
            pair.push(value);
            c_string(&pair)
        })
        .collect::<std::io::Result<Vec<CString>>>()?;
    // Every signal, not only those this process blocks or Rust ignores (SIGPIPE): one
    // ignored by whoever started the agent (a shell's `&` ignores SIGINT) would otherwise
    // stay ignored in the task (rlark_process).
    let defaults = SigSet::all();
    let mut attr = PosixSpawnAttr::init()?;
    attr.set_flags(
        PosixSpawnFlags::POSIX_SPAWN_SETPGROUP
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGMASK
            | PosixSpawnFlags::POSIX_SPAWN_SETSIGDEF,
    )?;
    attr.set_pgroup(Pid::from_raw(0))?;
    attr.set_sigmask(&SigSet::empty())?;
    attr.set_sigdefault(&defaults)?;
    // Opened close-on-exec; the dup2 onto 0 is not.
    let null = std::fs::File::open("/dev/null")?;
    let mut actions = PosixSpawnFileActions::init()?;
    actions.add_dup2(null.as_raw_fd(), 0)?;
    Ok(posix_spawn(
        args.program.as_os_str(),
        &actions,
        &attr,
        &argv,
        &envp,
    )?)
}

/// The wait loop's state.
struct Supervision {
    pgid: i32,
    grace: Duration,
    exit_path: PathBuf,
    /// How the main process ended, once it did.
    status: Option<ExitStatus>,
    /// The record written for it.
    written: Option<ExitRecord>,
    /// When the stop's grace period ends (set by the first SIGTERM/SIGINT).
    kill_at: Option<Instant>,
    /// When the group was sent SIGKILL.
    killed_at: Option<Instant>,
    /// That SIGKILL ended a stop's grace period (recorded as `killed`).
    killed_after_grace: bool,
}

impl Supervision {
    fn new(pgid: i32, grace: Duration, exit_path: PathBuf) -> Self {
        Supervision {
            pgid,
            grace,
            exit_path,
            status: None,
            written: None,
            kill_at: None,
            killed_at: None,
            killed_after_grace: false,
        }
    }

    fn run(mut self, signals: &SignalFd) -> Result<(), String> {
        loop {
            self.take_signals(signals)?;
            self.reap();
            let now = Instant::now();
            if self.status.is_some() && self.written.is_none() {
                if let Err(error) = self.record_exit() {
                    // Unrecorded, the exit reads as unknown: leave nothing running.
                    signal_group(self.pgid, Signal::SIGKILL);
                    return Err(error);
                }
                if self.kill_at.is_none() {
                    // Ended on its own: the rest of its tree goes with it.
                    self.kill(now, false);
                }
            }
            if let Some(kill_at) = self.kill_at
                && now >= kill_at
                && self.killed_at.is_none()
                && process::group_exists(self.pgid)
            {
                self.kill(now, true);
            }
            if self.status.is_some() {
                if !process::group_exists(self.pgid) {
                    return Ok(());
                }
                if self
                    .killed_at
                    .is_some_and(|at| now.duration_since(at) >= KILLED_GROUP_WAIT)
                {
                    eprintln!(
                        "rlark supervise: process group {} still has members {:?} after \
                         its SIGKILL; exiting anyway",
                        self.pgid, KILLED_GROUP_WAIT
                    );
                    return Ok(());
                }
            }
            self.wait(signals, now)?;
        }
    }

    /// Handle every pending signal.
    fn take_signals(&mut self, signals: &SignalFd) -> Result<(), String> {
        loop {
            let info = match signals.read_signal() {
                Ok(Some(info)) => info,
                Ok(None) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(error) => return Err(format!("read signals: {error}")),
            };
            let Ok(signal) = Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) else {
                continue;
            };
            if matches!(signal, Signal::SIGTERM | Signal::SIGINT) {
                signal_group(self.pgid, signal);
                if self.kill_at.is_none() {
                    self.kill_at = Some(Instant::now() + self.grace);
                }
            }
            // SIGCHLD: reaped below. SIGHUP: ignored.
        }
    }

    /// Reap every exited child: the main process (its status is kept) and the orphans
    /// reparented to this subreaper.
    fn reap(&mut self) {
        loop {
            match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => {
                    if pid.as_raw() == self.pgid {
                        self.status = Some(ExitStatus::Code(code));
                    }
                }
                Ok(WaitStatus::Signaled(pid, signal, _)) => {
                    if pid.as_raw() == self.pgid {
                        self.status = Some(ExitStatus::Signal(signal as i32));
                    }
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Err(Errno::EINTR) => {}
                Err(error) => {
                    eprintln!("rlark supervise: waitpid: {error}");
                    return;
                }
                // Stopped/continued (not asked for) and ptrace events.
                Ok(_) => {}
            }
        }
    }

    /// Write `exit.json` for the main process's status.
    fn record_exit(&mut self) -> Result<(), String> {
        let status = self.status.unwrap_or(ExitStatus::Unknown);
        let mut record = ExitRecord::exited(status);
        record.killed = self.killed_after_grace;
        record::write(&self.exit_path, &record)
            .map_err(|e| format!("write {}: {e}", self.exit_path.display()))?;
        self.written = Some(record);
        Ok(())
    }

    /// SIGKILL the group; `after_grace` records it as the end of a stop's grace period.
    fn kill(&mut self, now: Instant, after_grace: bool) {
        signal_group(self.pgid, Signal::SIGKILL);
        self.killed_at = Some(now);
        self.killed_after_grace |= after_grace;
        if after_grace && let Some(record) = self.written.as_mut() {
            record.killed = true;
            if let Err(error) = record::write(&self.exit_path, &*record) {
                eprintln!(
                    "rlark supervise: write {}: {error}",
                    self.exit_path.display()
                );
            }
        }
    }

    /// Sleep until a signal arrives or the next deadline (a dying group is polled).
    fn wait(&mut self, signals: &SignalFd, now: Instant) -> Result<(), String> {
        let mut timeout: Option<Duration> = None;
        if let Some(kill_at) = self.kill_at
            && self.killed_at.is_none()
        {
            timeout = Some(kill_at.saturating_duration_since(now));
        }
        if self.status.is_some() {
            // Members reparented elsewhere (an intermediate subreaper) send no SIGCHLD here.
            timeout = Some(timeout.map_or(GROUP_POLL, |t| t.min(GROUP_POLL)));
        }
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(t) => {
                PollTimeout::try_from(t.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => Ok(()),
            Err(error) => Err(format!("poll: {error}")),
        }
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    if let Err(error) = process::signal_group(pgid, signal) {
        eprintln!("rlark supervise: {signal} to process group {pgid}: {error}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<SupervisorArgs, String> {
        SupervisorArgs::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_named() {
        let args = parse(&[
            "--dir",
            "/r",
            "--grace-ms",
            "1500",
            "--arg0",
            "sh",
            "--",
            "/bin/sh",
            "-c",
            "exit 3",
        ])
        .expect("parse");
        assert_eq!(args.dir, PathBuf::from("/r"));
        assert_eq!(args.grace, Duration::from_millis(1500));
        assert_eq!(args.arg0, Some(OsString::from("sh")));
        assert_eq!(args.program, OsString::from("/bin/sh"));
        assert_eq!(args.args, [OsString::from("-c"), OsString::from("exit 3")]);
        assert_eq!((args.netns, args.hosts), (None, None));
        let args = parse(&[
            "--dir",
            "/r",
            "--netns",
            "/run/netns/x",
            "--hosts",
            "/r/hosts",
            "--",
            "/bin/true",
        ])
        .expect("parse network flags");
        assert_eq!(args.netns, Some(PathBuf::from("/run/netns/x")));
        assert_eq!(args.hosts, Some(PathBuf::from("/r/hosts")));
        assert!(
            parse(&["--dir", "/r", "--netns"])
                .expect_err("no value")
                .contains("--netns needs a value")
        );
        assert_eq!(
            parse(&["--dir", "/r", "--", "x"]).expect("defaults").grace,
            DEFAULT_GRACE
        );

        assert!(parse(&["--", "x"]).expect_err("no dir").contains("--dir"));
        assert!(parse(&["--dir", "/r"]).expect_err("no --").contains("--"));
        assert!(
            parse(&["--dir", "/r", "--"])
                .expect_err("no program")
                .contains("PROGRAM")
        );
        assert!(
            parse(&["--dir"])
                .expect_err("no value")
                .contains("--dir needs a value")
        );
        assert!(
            parse(&["--grace-ms", "soon", "--dir", "/r", "--", "x"])
                .expect_err("bad grace")
                .contains("soon")
        );
        assert!(
            parse(&["--what", "--", "x"])
                .expect_err("unknown")
                .contains("--what")
        );
        assert_eq!(main(["--bogus"].iter().map(OsString::from)), 2);
    }
}
