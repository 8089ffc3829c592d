//! Process and process-group helpers (Linux `/proc`, signals through `nix`).

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// What `/proc/<pid>/stat` says about a process: `rlark_process::stat`, shared with the
/// embodied runtime.
pub use rlark_process::ProcStat;

/// How often a dying process group is checked for remaining members.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Send `signal` to process group `pgid`. A group that no longer exists is fine (`Ok`).
/// Groups 0 and 1 are refused (they would mean "our own group" and "every process").
pub fn signal_group(pgid: i32, signal: Signal) -> nix::Result<()> {
    if pgid <= 1 {
        return Err(Errno::EINVAL);
    }
    match killpg(Pid::from_raw(pgid), signal) {
        Err(Errno::ESRCH) => Ok(()),
        other => other,
    }
}

/// Whether process group `pgid` still has a member (zombies included).
pub fn group_exists(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    !matches!(killpg(Pid::from_raw(pgid), None), Err(Errno::ESRCH))
}

/// SIGTERM the group, wait until it is gone or `grace` has passed, then SIGKILL it.
/// Returns whether SIGKILL was needed.
pub async fn kill_group(pgid: i32, grace: Duration) -> bool {
    if let Err(error) = signal_group(pgid, Signal::SIGTERM) {
        tracing::warn!(pgid, %error, "SIGTERM process group");
    }
    if wait_group_gone(pgid, grace).await {
        return false;
    }
    if let Err(error) = signal_group(pgid, Signal::SIGKILL) {
        tracing::warn!(pgid, %error, "SIGKILL process group");
    }
    true
}

/// Wait until group `pgid` has no member or `timeout` passed; returns whether it is gone.
pub async fn wait_group_gone(pgid: i32, timeout: Duration) -> bool {
    // Cut like every grace period, so the sum is a clock reading.
    let until = tokio::time::Instant::now() + timeout.min(super::MAX_GRACE);
    loop {
        if !group_exists(pgid) {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

/// Read `/proc/<pid>/stat`, whatever the process's state (zombies too); `None` when there
/// is no such process (or its line cannot be read).
pub fn proc_stat(pid: u32) -> Option<ProcStat> {
    // A pid past i32::MAX names no process (the kernel's pid_max is far below).
    rlark_process::read_stat(i32::try_from(pid).ok()?).ok()
}

/// Whether process `pid` runs (not a zombie) and, when `start_ticks` is given, is the
/// process that started then (not a later one that reused the pid).
pub fn process_running(pid: u32, start_ticks: Option<u64>) -> bool {
    match proc_stat(pid) {
        Some(stat) => {
            !matches!(stat.state, 'Z' | 'X') && start_ticks.is_none_or(|t| t == stat.start_ticks)
        }
        None => false,
    }
}

/// `SIGTERM`, `SIGKILL`, ... for a signal number (or `signal N`).
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {signal}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_running_and_groups_zero_and_one_are_refused() {
        let me = std::process::id();
        let stat = proc_stat(me).expect("own stat");
        assert!(process_running(me, Some(stat.start_ticks)));
        assert!(!process_running(me, Some(stat.start_ticks + 1)));
        assert_eq!(signal_group(0, Signal::SIGTERM), Err(Errno::EINVAL));
        assert_eq!(signal_group(1, Signal::SIGTERM), Err(Errno::EINVAL));
        assert!(!group_exists(1));
        assert_eq!(signal_name(15), "SIGTERM");
    }
}
