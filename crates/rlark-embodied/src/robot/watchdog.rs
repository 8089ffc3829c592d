//! The safety watchdog: a robot is not left running for a client that is gone.
//!
//! The rule (also in `docs/embodied.md`):
//!
//! - The process that calls StartRobot (its PID from SO_PEERCRED) becomes the robot's
//!   **owner**, unless the call carries the metadata `rlark-detach: true` (what
//!   `rlark robot start` sends, as the CLI exits right away). SwitchMode keeps the owner;
//!   StopRobot, ResetRobot and any stop clear it.
//! - When the owner process exits, the robot is stopped (checked every tick; a PID reused
//!   by a new process does not count as the owner: the process start time must match, and a
//!   zombie counts as exited).
//! - When the owner has had no open connection to this controller (any of its sockets) for
//!   longer than the watchdog (`watchdog`, default 2 s), the robot is stopped. A client
//!   that reconnects within the watchdog keeps its robot (re-claimed by being connected
//!   again); gRPC clients reconnect on their own.
//!
//! The check runs every quarter of the watchdog (at least every 250 ms, at most every
//! 10 ms). A stop made by the watchdog leaves `safety stop: ...` in the robot's message and
//! log.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Caller, RobotController};

/// The process a robot's watchdog follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    /// Start time of the process (clock ticks after boot, `/proc/PID/stat` field 22), to tell
    /// it from a later process with the same PID. `None` when /proc could not be read: then
    /// only the connection rule applies.
    pub start_time: Option<u64>,
    /// Since when the owner has had no connection, if it has none now.
    pub disconnected_since: Option<Instant>,
    /// A safety stop is on its way.
    pub stopping: bool,
}

/// The owner a StartRobot call gives the robot (`None` when detached or unknown).
pub fn claim(robot: &str, caller: &Caller) -> Option<Owner> {
    if caller.detach {
        tracing::info!(
            robot,
            pid = caller.pid,
            "robot started detached: no safety watchdog"
        );
        return None;
    }
    let Some(pid) = caller.pid else {
        tracing::warn!(
            robot,
            "caller's process is unknown (no peer credentials): no safety watchdog"
        );
        return None;
    };
    let start_time = match process_state(pid) {
        ProcessState::Alive { start_time } => Some(start_time),
        _ => None,
    };
    Some(Owner {
        pid,
        start_time,
        disconnected_since: None,
        stopping: false,
    })
}

/// What `/proc/PID/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    Alive {
        start_time: u64,
    },
    /// Gone, or a zombie.
    Exited,
    /// `/proc` could not be read.
    Unknown,
}

/// Read `/proc/PID/stat`.
pub fn process_state(pid: i32) -> ProcessState {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(text) => parse_stat(&text).map_or(ProcessState::Unknown, |(state, start_time)| {
            if matches!(state, 'Z' | 'X' | 'x') {
                ProcessState::Exited
            } else {
                ProcessState::Alive { start_time }
            }
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcessState::Exited,
        Err(_) => ProcessState::Unknown,
    }
}

/// (state, start time) from the text of `/proc/PID/stat`. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 come next; field 22 is the start time.
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

/// Whether the owner process is still the one that claimed the robot.
fn owner_alive(owner: &Owner) -> bool {
    match (process_state(owner.pid), owner.start_time) {
        (ProcessState::Exited, _) => false,
        (ProcessState::Alive { start_time }, Some(claimed)) => start_time == claimed,
        _ => true,
    }
}

/// The check interval for a watchdog.
pub fn tick(watchdog: Duration) -> Duration {
    (watchdog / 4).clamp(Duration::from_millis(10), Duration::from_millis(250))
}

/// Run the watchdog of `controller` until its background token is cancelled or it is
/// dropped.
pub fn spawn(controller: &Arc<RobotController>) {
    let weak = Arc::downgrade(controller);
    let stop = controller.background().clone();
    let watchdog = controller.config().watchdog;
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(tick(watchdog));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = interval.tick() => {}
            }
            let Some(controller) = weak.upgrade() else {
                break;
            };
            check(&controller, watchdog);
        }
    });
}

/// One pass over the owned robots; stops run in their own tasks (they wait for the robot's
/// operation lock).
fn check(controller: &Arc<RobotController>, watchdog: Duration) {
    let now = Instant::now();
    for (id, owner) in controller.owned() {
        if owner.stopping {
            continue;
        }
        let reason = if !owner_alive(&owner) {
            Some(format!("safety stop: owner process {} exited", owner.pid))
        } else if controller.tracker().open_connections(owner.pid) == 0 {
            match owner.disconnected_since {
                None => {
                    controller.update_owner(&id, owner.pid, |o| o.disconnected_since = Some(now));
                    None
                }
                Some(since) if now.duration_since(since) > watchdog => Some(format!(
                    "safety stop: owner process {} has had no connection to the controller for more than {watchdog:?}",
                    owner.pid
                )),
                Some(_) => None,
            }
        } else {
            if owner.disconnected_since.is_some() {
                controller.update_owner(&id, owner.pid, |o| o.disconnected_since = None);
            }
            None
        };
        if let Some(reason) = reason {
            controller.update_owner(&id, owner.pid, |o| o.stopping = true);
            let controller = controller.clone();
            tokio::spawn(async move {
                controller.safety_stop(&id, owner.pid, &reason).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_odd_command_names() {
        let text = "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(text), Some(('S', 987654)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let ProcessState::Alive { start_time } = process_state(me) else {
            panic!("this process should be alive");
        };
        assert!(owner_alive(&Owner {
            pid: me,
            start_time: Some(start_time),
            disconnected_since: None,
            stopping: false,
        }));
        // Same PID, different start time: a reused PID is not the owner.
        assert!(!owner_alive(&Owner {
            pid: me,
            start_time: Some(start_time + 1),
            disconnected_since: None,
            stopping: false,
        }));
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let pid = i32::try_from(child.id()).expect("pid");
        child.wait().expect("wait");
        assert_eq!(process_state(pid), ProcessState::Exited);
    }

    #[test]
    fn ticks_scale_with_the_watchdog() {
        assert_eq!(tick(Duration::from_secs(2)), Duration::from_millis(250));
        assert_eq!(tick(Duration::from_millis(200)), Duration::from_millis(50));
        assert_eq!(tick(Duration::from_millis(1)), Duration::from_millis(10));
    }
}
