//! The safety watchdog: a robot is not left running for a client that is gone.
//!
//! The rule (also in `docs/embodied.md`, "Safety watchdog"):
//!
//! - A StartRobot call gives the robot an **owner**, unless it carries the metadata
//!   `rlark-detach: true` (what `rlark robot start` sends outside a replica, as the CLI exits
//!   right away). SwitchMode keeps the owner; StopRobot, ResetRobot and any stop clear it.
//! - **Process owner** (the default): the calling process, its PID from SO_PEERCRED. When
//!   it exits the robot is stopped (checked every tick; a PID reused by a new process does
//!   not count as the owner: the process start time must match, and a zombie counts as
//!   exited). When it has had no open connection to this controller (any of its sockets)
//!   for longer than the watchdog (`watchdog`, default 2 s), the robot is stopped too; a
//!   client that reconnects within the watchdog keeps its robot.
//! - **Replica owner**: a call that carries `rlark-owner: LABEL` (the SDKs send the value
//!   of `RLINF_EMBODIED_OWNER`, which rlark's agent gives every replica holding devices)
//!   is owned by the caller's **session**: the runtime reads the calling process's session
//!   ID from `/proc/PID/stat` (the PID from SO_PEERCRED) and follows the session leader
//!   (rlark's per-replica supervisor, or a container's init). The robot is stopped when that
//!   leader exits (same start-time and zombie rules); the calling process may exit before
//!   (a short-lived helper that started the robot). The connection rule does not apply: a
//!   replica need not keep a channel open. `LABEL` is only shown (logs, messages): what is
//!   followed is what the kernel says of the caller, so a label names no one else's
//!   robot and cannot make the watchdog stop one. A caller whose session leader is gone
//!   or unreadable falls back to the process rule.
//!
//! The check runs every quarter of the watchdog (at least every 250 ms, at most every
//! 10 ms). A stop made by the watchdog leaves `safety stop: ...` in the robot's message and
//! log.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Caller, RobotController};

/// Whom a robot's watchdog follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnerScope {
    /// The process that started it (the process and connection rules).
    Process,
    /// The replica (session) of the process that started it: only its session leader's
    /// exit counts.
    Replica {
        /// What the caller said it is (`rlark-owner`); shown, never trusted.
        label: String,
        /// The process that made the StartRobot call.
        caller: i32,
    },
}

/// The process a robot's watchdog follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The followed process: the caller ([`OwnerScope::Process`]) or its session leader
    /// ([`OwnerScope::Replica`]). `GetRobotStatus.owner_pid` reports it.
    pub pid: i32,
    /// Start time of the process (clock ticks after boot, `/proc/PID/stat` field 22), to tell
    /// it from a later process with the same PID. `None` when /proc could not be read: then
    /// only the connection rule applies.
    pub start_time: Option<u64>,
    /// Whom the watchdog follows.
    pub scope: OwnerScope,
    /// Since when the owner has had no connection, if it has none now.
    pub disconnected_since: Option<Instant>,
    /// A safety stop is on its way.
    pub stopping: bool,
}

impl Owner {
    /// How logs and messages name the owner: `process 1234`, or `replica LABEL (session
    /// leader process 1234)`.
    pub fn describe(&self) -> String {
        match &self.scope {
            OwnerScope::Process => format!("process {}", self.pid),
            OwnerScope::Replica { label, .. } => {
                format!("replica {label} (session leader process {})", self.pid)
            }
        }
    }
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
    let state = process_state(pid);
    if let Some(label) = &caller.owner {
        // The session as the kernel reports it for the calling process, never what the
        // caller says.
        let leader = match state {
            ProcessState::Alive { session, .. } if session > 0 => Some(session),
            _ => None,
        };
        let leader_state = leader.map(|sid| (sid, process_state(sid)));
        if let Some((sid, ProcessState::Alive { start_time, .. })) = leader_state {
            return Some(Owner {
                pid: sid,
                start_time: Some(start_time),
                scope: OwnerScope::Replica {
                    label: label.clone(),
                    caller: pid,
                },
                disconnected_since: None,
                stopping: false,
            });
        }
        tracing::warn!(
            robot,
            pid,
            owner = %label,
            session = leader,
            "the caller's session leader cannot be followed; the calling process owns the robot"
        );
    }
    let start_time = match state {
        ProcessState::Alive { start_time, .. } => Some(start_time),
        _ => None,
    };
    Some(Owner {
        pid,
        start_time,
        scope: OwnerScope::Process,
        disconnected_since: None,
        stopping: false,
    })
}

/// What `/proc/PID/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessState {
    Alive {
        start_time: u64,
        /// Its session ID (the PID of the session leader; 0 when the leader is outside
        /// this PID namespace).
        session: i32,
    },
    /// Gone, or a zombie.
    Exited,
    /// `/proc` could not be read.
    Unknown,
}

/// Read `/proc/PID/stat` (`rlark_process::stat`).
pub fn process_state(pid: i32) -> ProcessState {
    match rlark_process::read_stat(pid) {
        Ok(stat) if stat.is_exited() => ProcessState::Exited,
        Ok(stat) => ProcessState::Alive {
            start_time: stat.start_ticks,
            session: stat.session,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcessState::Exited,
        Err(_) => ProcessState::Unknown,
    }
}

/// Whether the owner process is still the one that claimed the robot.
fn owner_alive(owner: &Owner) -> bool {
    match (process_state(owner.pid), owner.start_time) {
        (ProcessState::Exited, _) => false,
        (ProcessState::Alive { start_time, .. }, Some(claimed)) => start_time == claimed,
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
            Some(match &owner.scope {
                OwnerScope::Process => {
                    format!("safety stop: owner process {} exited", owner.pid)
                }
                OwnerScope::Replica { label, .. } => format!(
                    "safety stop: owner replica {label} ended (its session leader, process {}, exited)",
                    owner.pid
                ),
            })
        } else if owner.scope != OwnerScope::Process {
            // A replica owner: only its session leader's life counts.
            None
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
    fn this_process_is_alive_and_a_reaped_child_is_not() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let ProcessState::Alive { start_time, .. } = process_state(me) else {
            panic!("this process should be alive");
        };
        assert!(owner_alive(&Owner {
            pid: me,
            start_time: Some(start_time),
            scope: OwnerScope::Process,
            disconnected_since: None,
            stopping: false,
        }));
        // Same PID, different start time: a reused PID is not the owner.
        assert!(!owner_alive(&Owner {
            pid: me,
            start_time: Some(start_time + 1),
            scope: OwnerScope::Process,
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
    fn a_replica_owner_is_the_callers_session_leader_whatever_its_label() {
        let me = i32::try_from(std::process::id()).expect("pid");
        let caller = Caller {
            pid: Some(me),
            detach: false,
            owner: Some("rlark-lab/someone-else".to_string()),
        };
        let owner = claim("arm-0", &caller).expect("an owner");
        let ProcessState::Alive { session, .. } = process_state(me) else {
            panic!("this process should be alive");
        };
        match process_state(session) {
            ProcessState::Alive { start_time, .. } if session > 0 => {
                assert_eq!(owner.pid, session, "the kernel's session, not the label");
                assert_eq!(owner.start_time, Some(start_time));
                assert_eq!(
                    owner.scope,
                    OwnerScope::Replica {
                        label: "rlark-lab/someone-else".into(),
                        caller: me
                    }
                );
            }
            // The session leader is not visible here: the process rule instead.
            _ => assert_eq!((owner.pid, owner.scope), (me, OwnerScope::Process)),
        }
        let detached = Caller {
            detach: true,
            ..caller
        };
        assert_eq!(claim("arm-0", &detached), None, "detach wins");
    }

    #[test]
    fn ticks_scale_with_the_watchdog() {
        assert_eq!(tick(Duration::from_secs(2)), Duration::from_millis(250));
        assert_eq!(tick(Duration::from_millis(200)), Duration::from_millis(50));
        assert_eq!(tick(Duration::from_millis(1)), Duration::from_millis(10));
    }
}
