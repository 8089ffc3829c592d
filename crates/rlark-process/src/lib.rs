//! Processes rlark starts and watches: clean children, and facts about processes read from
//! `/proc` ([`stat`]: `/proc/PID/stat`, parsed in one place; [`signal_masks`]).
//!
//! Clean children (issue 38, point 5): every process rlark starts for someone else — a raw
//! replica's supervisor, a robot's launch processes, TensorBoard, an exec session, ffmpeg —
//! begins with default signal dispositions and an empty signal mask, whatever rlark itself
//! inherited.
//!
//! Why: a program started from a shell's `&` (or `nohup`) inherits SIGINT (SIGQUIT, SIGHUP)
//! ignored, and an ignored signal stays ignored across `exec`; a blocked one stays blocked.
//! A robot's launch process would then ignore the SIGINT of a graceful stop and be
//! SIGKILLed after the grace period. `std::process::Command` empties the mask and resets
//! SIGPIPE only; this crate resets every other signal too.
//!
//! How: [`CleanSignals::clean_signals`] adds one `pre_exec` hook (the only `unsafe` in
//! rlark's process spawning, [`reset_signals`]) that, in the forked child right before
//! `exec`, sets every signal but SIGKILL and SIGSTOP to `SIG_DFL` with `sigaction` and
//! empties the mask with `sigprocmask` — both async-signal-safe (POSIX.1-2017 §2.4.3), on
//! stack data, no allocation, no lock. Signals the C library keeps for itself refuse the
//! change (`EINVAL`), which is ignored: they are not the program's. The supervisor, which
//! spawns the task with `posix_spawn`, asks the same with `POSIX_SPAWN_SETSIGDEF` over every
//! signal and an empty `POSIX_SPAWN_SETSIGMASK` (`rlark_agent::supervisor`).
//!
//! Not covered: helpers rlark runs for itself and waits for (`nft`, `ip`, `ssh-keygen`,
//! `git`, `docker` in benchmarks): their signals are rlark's business. Docker containers
//! are started by the engine, not by rlark.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod stat;

use std::io;

pub use stat::{ProcStat, live_stat, parse_stat, read_stat, start_ticks};

/// A command whose child starts with default signal dispositions and an empty mask.
pub trait CleanSignals {
    /// Reset the child's signals before `exec` (module documentation).
    fn clean_signals(&mut self) -> &mut Self;
}

impl CleanSignals for std::process::Command {
    fn clean_signals(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt as _;
        let reset = reset_signals();
        // SAFETY: `reset` only calls async-signal-safe functions on its own stack data
        // (see `reset_signals`), as a `pre_exec` hook must.
        #[allow(unsafe_code)]
        unsafe {
            self.pre_exec(reset)
        }
    }
}

impl CleanSignals for tokio::process::Command {
    fn clean_signals(&mut self) -> &mut Self {
        let reset = reset_signals();
        // SAFETY: as for `std::process::Command`.
        #[allow(unsafe_code)]
        unsafe {
            self.pre_exec(reset)
        }
    }
}

/// [`CleanSignals`] for the exec PTY's command (a builder that takes itself by value).
#[cfg(feature = "pty")]
pub fn clean_pty(command: pty_process::Command) -> pty_process::Command {
    let reset = reset_signals();
    // SAFETY: as for `std::process::Command`. pty-process runs its own session setup
    // (`setsid`, the controlling terminal) before this hook.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(reset)
    }
}

/// The hook run in the child: every signal but SIGKILL and SIGSTOP to `SIG_DFL`, then an
/// empty mask. The highest signal number is read here, in the parent.
#[allow(unsafe_code)]
pub fn reset_signals() -> impl FnMut() -> io::Result<()> + Send + Sync + 'static {
    let last = libc::SIGRTMAX();
    move || {
        // SAFETY: sigemptyset, sigaction and sigprocmask are async-signal-safe; every
        // pointer is to a local value that outlives the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&raw mut action.sa_mask);
            for signal in 1..=last {
                if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                    continue;
                }
                if libc::sigaction(signal, &raw const action, std::ptr::null_mut()) != 0 {
                    // The C library refuses its own signals (glibc: 32 and 33); an
                    // ignored one would still reach the program: ask the kernel.
                    default_by_syscall(signal);
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut empty);
            if libc::sigprocmask(libc::SIG_SETMASK, &raw const empty, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The kernel's `struct sigaction` where it has `sa_restorer` (x86_64, aarch64).
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: libc::sighandler_t,
    mask: u64,
}

/// `rt_sigaction(signal, SIG_DFL)`, bypassing the C library (a raw system call:
/// async-signal-safe). Errors are ignored.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
#[allow(unsafe_code)]
fn default_by_syscall(signal: libc::c_int) {
    let action = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: a pointer to a local struct of the kernel's layout and its mask size.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            signal,
            &raw const action,
            std::ptr::null_mut::<KernelSigaction>(),
            std::mem::size_of::<u64>(),
        );
    }
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn default_by_syscall(_signal: libc::c_int) {}

/// `SigIgn` and `SigBlk` of process `pid` (`/proc/PID/status`, hexadecimal masks), for
/// tests and diagnostics.
pub fn signal_masks(pid: u32) -> io::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> io::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .ok_or_else(|| io::Error::other(format!("no {name} in /proc/{pid}/status")))
    };
    Ok((field("SigIgn:")?, field("SigBlk:")?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, Signal};

    /// The signals of a `sleep` started through `command` (SigIgn, SigBlk).
    fn masks_of(mut command: std::process::Command) -> (u64, u64) {
        let mut child = command.spawn().expect("spawn sleep");
        let masks = signal_masks(child.id()).expect("masks");
        let _ = child.kill();
        let _ = child.wait();
        masks
    }

    /// Issue 38, point 5: a parent that inherited SIGINT/SIGQUIT ignored (a shell's `&`)
    /// and blocks a signal starts clean children; a plain `Command` passes the ignored
    /// ones on (what made a robot's graceful stop a SIGKILL). The test runs in a child
    /// (`sh` ignores the signals, then execs this binary's helper) so this process's own
    /// signals are not touched.
    #[test]
    fn children_start_with_default_signals_whatever_the_parent_inherited() {
        let output = std::process::Command::new("sh")
            .arg("-c")
            .arg("trap '' INT QUIT; exec \"$0\" --exact tests::dirty_parent_helper --ignored --nocapture --test-threads=1")
            .arg(std::env::current_exe().expect("exe"))
            .env("RLARK_PROCESS_HELPER", "1")
            .output()
            .expect("run helper");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let value = |key: &str| -> u64 {
            stdout
                .lines()
                .find_map(|l| l.split_once(&format!("{key}=")).map(|(_, v)| v.trim()))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {stdout}"))
        };
        let int = 1 << (libc::SIGINT - 1);
        let quit = 1 << (libc::SIGQUIT - 1);
        let usr1 = 1 << (libc::SIGUSR1 - 1);
        assert_eq!(
            value("parent_ign") & (int | quit),
            int | quit,
            "the parent ignores them"
        );
        assert_eq!(
            value("parent_blk") & usr1,
            usr1,
            "the parent blocks SIGUSR1"
        );
        assert_eq!(
            value("plain_ign") & int,
            int,
            "a plain Command passes SIGINT's SIG_IGN on"
        );
        assert_eq!((value("clean_ign"), value("clean_blk")), (0, 0), "{stdout}");
        assert_eq!((value("tokio_ign"), value("tokio_blk")), (0, 0), "{stdout}");
    }

    #[test]
    #[ignore = "helper of children_start_with_default_signals_whatever_the_parent_inherited"]
    fn dirty_parent_helper() {
        if std::env::var_os("RLARK_PROCESS_HELPER").is_none() {
            return;
        }
        let mut blocked = SigSet::empty();
        blocked.add(Signal::SIGUSR1);
        blocked.thread_block().expect("block SIGUSR1");
        let me = std::process::id();
        let (ign, blk) = signal_masks(me).expect("own masks");
        // The libtest thread blocked SIGUSR1: its Status shows the main thread; read ours.
        let tid = nix::unistd::gettid();
        let thread_blk = std::fs::read_to_string(format!("/proc/{me}/task/{tid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("SigBlk:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(blk);
        println!("parent_ign={ign}\nparent_blk={thread_blk}");
        let sleep = || {
            let mut command = std::process::Command::new("sleep");
            command.arg("30");
            command
        };
        let (plain_ign, _) = masks_of(sleep());
        println!("plain_ign={plain_ign}");
        let mut clean = sleep();
        clean.clean_signals();
        let (clean_ign, clean_blk) = masks_of(clean);
        println!("clean_ign={clean_ign}\nclean_blk={clean_blk}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (tokio_ign, tokio_blk) = runtime.block_on(async {
            let mut command = tokio::process::Command::new("sleep");
            command.arg("30").kill_on_drop(true).clean_signals();
            let child = command.spawn().expect("spawn");
            signal_masks(child.id().expect("pid")).expect("masks")
        });
        println!("tokio_ign={tokio_ign}\ntokio_blk={tokio_blk}");
    }
}
