//! The Pod status an agent reports for a replica, as typed merge patches.
//!
//! Every write of a replica's status is a merge patch on the Pod's `status` subresource:
//! some fields set, some removed (written as `null`), the others left as they are. A
//! [`StatusPatch`] says exactly that with `rlark_api` types; the functions here build the
//! one of each transition (docs/tasks.md, "Pod status").

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value};

use super::{
    REASON_AGENT_LOST, REASON_AGENT_SHUTDOWN, REASON_BACKOFF, REASON_COMPLETED,
    REASON_DEADLINE_EXCEEDED, REASON_DEVICE_UNHEALTHY, REASON_ERROR, REASON_STOPPED,
    REASON_UNSUPPORTED_AGENT_TYPE,
};
use crate::types::{PodPhase, PodStatus};

/// A field of [`PodStatus`] a patch can remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusField {
    /// `phase`.
    Phase,
    /// `message`.
    Message,
    /// `reason`.
    Reason,
    /// `node`.
    Node,
    /// `exitCode`.
    ExitCode,
    /// `restartCount`.
    RestartCount,
    /// `startTime`.
    StartTime,
    /// `finishTime`.
    FinishTime,
    /// `tensorBoard`.
    TensorBoard,
}

impl StatusField {
    /// The JSON name of the field.
    pub fn json_name(self) -> &'static str {
        match self {
            StatusField::Phase => "phase",
            StatusField::Message => "message",
            StatusField::Reason => "reason",
            StatusField::Node => "node",
            StatusField::ExitCode => "exitCode",
            StatusField::RestartCount => "restartCount",
            StatusField::StartTime => "startTime",
            StatusField::FinishTime => "finishTime",
            StatusField::TensorBoard => "tensorBoard",
        }
    }

    fn clear(self, status: &mut PodStatus) {
        match self {
            StatusField::Phase => status.phase = None,
            StatusField::Message => status.message = None,
            StatusField::Reason => status.reason = None,
            StatusField::Node => status.node = None,
            StatusField::ExitCode => status.exit_code = None,
            StatusField::RestartCount => status.restart_count = None,
            StatusField::StartTime => status.start_time = None,
            StatusField::FinishTime => status.finish_time = None,
            StatusField::TensorBoard => status.tensor_board = None,
        }
    }
}

/// A merge patch of a Pod's status: the fields set in [`StatusPatch::set`] are written,
/// the ones in [`StatusPatch::clear`] removed, every other field is left as it is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusPatch {
    /// The values written.
    pub set: PodStatus,
    /// The fields removed (none of them is set in `set`).
    pub clear: Vec<StatusField>,
}

impl StatusPatch {
    /// The patch's `status` value: `{"status": <this>}` is the merge patch.
    pub fn to_json(&self) -> Value {
        let mut map = match serde_json::to_value(&self.set) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        for field in &self.clear {
            map.insert(field.json_name().to_string(), Value::Null);
        }
        Value::Object(map)
    }

    /// Apply the patch to `status` (what the Pod's status is after the write).
    pub fn apply(&self, status: &mut PodStatus) {
        let set = &self.set;
        macro_rules! merge {
            ($($field:ident),*) => {$(
                if set.$field.is_some() {
                    status.$field.clone_from(&set.$field);
                }
            )*};
        }
        merge!(
            phase,
            message,
            reason,
            node,
            ip,
            exit_code,
            restart_count,
            start_time,
            finish_time,
            tensor_board
        );
        if !set.devices.is_empty() {
            status.devices.clone_from(&set.devices);
        }
        for field in &self.clear {
            field.clear(status);
        }
    }

    /// The phase this patch writes, if any.
    pub fn phase(&self) -> Option<PodPhase> {
        self.set.phase
    }

    /// Set `exitCode` to `code`, or remove it when `None`.
    fn exit_code(mut self, code: Option<i32>) -> Self {
        match code {
            Some(code) => self.set.exit_code = Some(code),
            None => self.clear.push(StatusField::ExitCode),
        }
        self
    }
}

/// Why a replica's process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCause {
    /// The main process exited on its own.
    Exited,
    /// The agent stopped it.
    Terminated,
    /// Its `activeDeadlineSeconds` passed and it was killed.
    DeadlineExceeded,
}

/// The end of a replica's process, as the runtime saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitReport {
    /// The shell's exit code: the code, or 128 + the signal; `None` when unknown (the
    /// runtime lost track of how the process ended).
    pub code: Option<i32>,
    /// How it ended, as the end of a sentence starting "the process ": `exited with code
    /// 3`, `was killed by SIGKILL`.
    pub description: String,
    /// Why it ended.
    pub cause: ExitCause,
    /// The process group had to be sent SIGKILL after the grace period.
    pub killed: bool,
    /// When the end was seen.
    pub finished_at: Timestamp,
}

impl ExitReport {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

fn failed(reason: &str, message: String, finish: Timestamp) -> StatusPatch {
    StatusPatch {
        set: PodStatus {
            phase: Some(PodPhase::Failed),
            reason: Some(reason.to_string()),
            message: Some(message),
            finish_time: Some(Time(finish)),
            ..PodStatus::default()
        },
        clear: Vec::new(),
    }
}

fn with_restarts(mut patch: StatusPatch, restarts: i32) -> StatusPatch {
    patch.set.restart_count = Some(restarts);
    patch
}

/// A fresh run that is slow to start: `Pending` on `node`, `restartCount` 0, and whatever
/// an earlier run reported removed.
pub fn pending(node: &str) -> StatusPatch {
    StatusPatch {
        set: PodStatus {
            phase: Some(PodPhase::Pending),
            node: Some(node.to_string()),
            restart_count: Some(0),
            ..PodStatus::default()
        },
        clear: vec![
            StatusField::Reason,
            StatusField::Message,
            StatusField::ExitCode,
            StatusField::StartTime,
            StatusField::FinishTime,
        ],
    }
}

/// Not started yet and waiting for something outside the agent (the replica's domain
/// address): `Pending` with `reason` and `message`.
pub fn waiting(node: &str, reason: &str, message: String) -> StatusPatch {
    let mut patch = pending(node);
    patch.set.reason = Some(reason.to_string());
    patch.set.message = Some(message);
    patch
        .clear
        .retain(|f| !matches!(f, StatusField::Reason | StatusField::Message));
    patch
}

/// The process runs (`startTime`: the run's first start).
pub fn running(node: &str, start_time: Timestamp, restarts: i32) -> StatusPatch {
    StatusPatch {
        set: PodStatus {
            phase: Some(PodPhase::Running),
            node: Some(node.to_string()),
            start_time: Some(Time(start_time)),
            restart_count: Some(restarts),
            ..PodStatus::default()
        },
        clear: vec![
            StatusField::Reason,
            StatusField::Message,
            StatusField::ExitCode,
            StatusField::FinishTime,
        ],
    }
}

/// The process exited and restarts after `backoff`: still `Running`, reason
/// [`REASON_BACKOFF`], the exit code of the process that ended. `restarts` is the count so
/// far (the message names the next one).
pub fn backoff(exit: &ExitReport, backoff: Duration, restarts: i32) -> StatusPatch {
    StatusPatch {
        set: PodStatus {
            phase: Some(PodPhase::Running),
            reason: Some(REASON_BACKOFF.to_string()),
            message: Some(format!(
                "the process {}; restarting in {}s (restart {})",
                exit.description,
                backoff.as_secs(),
                restarts + 1
            )),
            ..PodStatus::default()
        },
        clear: Vec::new(),
    }
    .exit_code(exit.code)
}

/// The final status of a process that exited beyond its restart policy: `Succeeded`
/// ([`REASON_COMPLETED`]) for code 0, else `Failed` ([`REASON_ERROR`]); an unknown exit
/// (the supervisor was killed before it could record it) is [`REASON_AGENT_LOST`].
pub fn exited(exit: &ExitReport, restarts: i32) -> StatusPatch {
    let finish = exit.finished_at;
    let patch = match exit.code {
        None => failed(
            REASON_AGENT_LOST,
            "the replica's supervisor process ended without recording how the process ended \
             (it was killed); what was left of the process group was killed; the outcome of \
             the run is unknown"
                .to_string(),
            finish,
        ),
        Some(0) => StatusPatch {
            set: PodStatus {
                phase: Some(PodPhase::Succeeded),
                reason: Some(REASON_COMPLETED.to_string()),
                message: Some("process exited with code 0".to_string()),
                finish_time: Some(Time(finish)),
                ..PodStatus::default()
            },
            clear: Vec::new(),
        },
        Some(_) => failed(
            REASON_ERROR,
            format!("process {}", exit.description),
            finish,
        ),
    };
    with_restarts(patch.exit_code(exit.code), restarts)
}

/// What happened to the group when it was stopped.
fn kill_detail(exit: &ExitReport, grace: Duration) -> String {
    if exit.killed {
        format!(
            "SIGTERM sent to the process group, SIGKILL after the {}s grace period; the process {}",
            grace.as_secs(),
            exit.description
        )
    } else {
        format!(
            "SIGTERM sent to the process group; the process {}",
            exit.description
        )
    }
}

/// Ended by `spec.stopped` ([`REASON_STOPPED`]): after a stop of the process (`exit`,
/// with the `grace` period it had), or while waiting to restart (`None`).
pub fn stopped(
    exit: Option<&ExitReport>,
    grace: Duration,
    restarts: i32,
    now: Timestamp,
) -> StatusPatch {
    let message = match exit {
        Some(exit) => format!("stopped on request: {}", kill_detail(exit, grace)),
        None => "stopped on request while waiting to restart".to_string(),
    };
    ended_by_agent(REASON_STOPPED, message, exit, restarts, now)
}

/// Failed with `reason` and `message` after the agent ended the run: the process's exit
/// code when it had been running (`exit`), and the restarts so far.
fn ended_by_agent(
    reason: &str,
    message: String,
    exit: Option<&ExitReport>,
    restarts: i32,
    now: Timestamp,
) -> StatusPatch {
    with_restarts(
        failed(reason, message, now).exit_code(exit.and_then(|e| e.code)),
        restarts,
    )
}

/// Stopped before this agent ran it (no exit code).
pub fn stopped_before_start(now: Timestamp) -> StatusPatch {
    failed(
        REASON_STOPPED,
        "stopped on request before this agent ran the replica".to_string(),
        now,
    )
}

/// Killed at its `activeDeadlineSeconds` (`seconds`, when known):
/// [`REASON_DEADLINE_EXCEEDED`], after a kill of the process (`exit`) or while waiting to
/// restart (`None`).
pub fn deadline_exceeded(
    seconds: Option<u64>,
    exit: Option<&ExitReport>,
    grace: Duration,
    restarts: i32,
    now: Timestamp,
) -> StatusPatch {
    let limit = seconds.map_or_else(String::new, |s| format!(" of {s}s"));
    let message = match exit {
        Some(exit) => format!(
            "active deadline{limit} exceeded: {}",
            kill_detail(exit, grace)
        ),
        None => format!("active deadline{limit} exceeded while waiting to restart"),
    };
    ended_by_agent(REASON_DEADLINE_EXCEEDED, message, exit, restarts, now)
}

/// Stopped because a device it holds became unhealthy and its Task says
/// `onDeviceUnhealthy: Stop` ([`REASON_DEVICE_UNHEALTHY`]); `devices` says which and why
/// (e.g. `robot-arm-0: simulated arm fault: boom`). After a kill of the process (`exit`)
/// or while waiting to restart (`None`).
pub fn device_unhealthy(
    devices: &str,
    exit: Option<&ExitReport>,
    grace: Duration,
    restarts: i32,
    now: Timestamp,
) -> StatusPatch {
    let message = match exit {
        Some(exit) => format!(
            "device unhealthy: {devices}; stopped (onDeviceUnhealthy: Stop): {}",
            kill_detail(exit, grace)
        ),
        None => format!(
            "device unhealthy: {devices}; stopped (onDeviceUnhealthy: Stop) while waiting to restart"
        ),
    };
    ended_by_agent(REASON_DEVICE_UNHEALTHY, message, exit, restarts, now)
}

/// Stopped because the agent shut down and stops its tasks on exit
/// ([`REASON_AGENT_SHUTDOWN`]).
pub fn agent_shutdown(exit: Option<&ExitReport>, now: Timestamp) -> StatusPatch {
    failed(
        REASON_AGENT_SHUTDOWN,
        "the agent shut down and stops its tasks on exit".to_string(),
        now,
    )
    .exit_code(exit.and_then(|e| e.code))
}

/// The agent lost the replica's outcome ([`REASON_AGENT_LOST`], no exit code); `message`
/// says what is unknown.
pub fn agent_lost(message: String, now: Timestamp) -> StatusPatch {
    failed(REASON_AGENT_LOST, message, now).exit_code(None)
}

/// The process could not be started: `Failed` with the runtime's `reason` and `message`.
pub fn start_failed(reason: &str, message: String, restarts: i32, now: Timestamp) -> StatusPatch {
    with_restarts(failed(reason, message, now), restarts)
}

/// A Task of an `agentType` this agent does not run ([`REASON_UNSUPPORTED_AGENT_TYPE`]).
pub fn unsupported_agent_type(agent_type: &str, now: Timestamp) -> StatusPatch {
    failed(
        REASON_UNSUPPORTED_AGENT_TYPE,
        format!("this agent runs raw tasks only; the task's agentType is {agent_type}"),
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("timestamp")
    }

    #[test]
    fn a_tensorboard_status_replaces_the_last_one_and_can_be_removed() {
        let mut status = PodStatus {
            tensor_board: Some(crate::types::PodTensorBoard {
                port: Some(41234),
                log_dir: Some("/w/runs".into()),
                message: None,
            }),
            ..PodStatus::default()
        };
        let not_started = StatusPatch {
            set: PodStatus {
                tensor_board: Some(crate::types::PodTensorBoard {
                    message: Some("TensorBoard was not started: ...".into()),
                    ..Default::default()
                }),
                ..PodStatus::default()
            },
            clear: Vec::new(),
        };
        // In the merge patch every field is there, so the earlier port goes.
        assert_eq!(
            not_started.to_json(),
            json!({"tensorBoard": {"port": null, "logDir": null,
                                   "message": "TensorBoard was not started: ..."}})
        );
        not_started.apply(&mut status);
        assert_eq!(status.tensor_board, not_started.set.tensor_board);
        let gone = StatusPatch {
            set: PodStatus::default(),
            clear: vec![StatusField::TensorBoard],
        };
        assert_eq!(gone.to_json(), json!({"tensorBoard": null}));
        gone.apply(&mut status);
        assert_eq!(status.tensor_board, None);
    }

    fn exit(code: Option<i32>, description: &str, cause: ExitCause, killed: bool) -> ExitReport {
        ExitReport {
            code,
            description: description.into(),
            cause,
            killed,
            finished_at: at(100),
        }
    }

    #[test]
    fn patches_set_and_remove_exactly_their_fields() {
        let p = pending("n1").to_json();
        assert_eq!(
            p,
            json!({"phase": "Pending", "node": "n1", "restartCount": 0, "reason": null,
                   "message": null, "exitCode": null, "startTime": null, "finishTime": null})
        );
        let r = running("n1", at(1), 2).to_json();
        assert_eq!(
            r,
            json!({"phase": "Running", "node": "n1", "startTime": Time(at(1)),
                   "restartCount": 2, "reason": null, "message": null, "exitCode": null,
                   "finishTime": null})
        );
        let mut status = PodStatus {
            reason: Some("BackOff".into()),
            exit_code: Some(3),
            ip: Some("10.0.0.1".into()),
            ..PodStatus::default()
        };
        running("n1", at(1), 2).apply(&mut status);
        assert_eq!(
            status,
            PodStatus {
                phase: Some(PodPhase::Running),
                node: Some("n1".into()),
                start_time: Some(Time(at(1))),
                restart_count: Some(2),
                ip: Some("10.0.0.1".into()),
                ..PodStatus::default()
            },
            "cleared fields go, untouched ones stay"
        );
    }

    #[test]
    fn statuses_say_how_the_replica_ended() {
        let ok = exited(
            &exit(Some(0), "exited with code 0", ExitCause::Exited, false),
            0,
        );
        assert_eq!(
            ok.to_json(),
            json!({"phase": "Succeeded", "exitCode": 0, "reason": "Completed",
                   "message": "process exited with code 0", "finishTime": Time(at(100)),
                   "restartCount": 0})
        );
        let failed = exited(
            &exit(Some(3), "exited with code 3", ExitCause::Exited, false),
            2,
        );
        assert_eq!(
            failed.to_json(),
            json!({"phase": "Failed", "exitCode": 3, "reason": "Error",
                   "message": "process exited with code 3", "finishTime": Time(at(100)),
                   "restartCount": 2})
        );
        let unknown = exited(
            &exit(
                None,
                "ended with an unknown status",
                ExitCause::Exited,
                false,
            ),
            1,
        );
        let unknown = unknown.to_json();
        assert_eq!(unknown["reason"], REASON_AGENT_LOST);
        assert_eq!(unknown["exitCode"], Value::Null);
        assert!(
            unknown["message"]
                .as_str()
                .is_some_and(|m| m.contains("unknown"))
        );

        let killed = exit(
            Some(137),
            "was killed by SIGKILL",
            ExitCause::Terminated,
            true,
        );
        let s = stopped(Some(&killed), Duration::from_secs(5), 0, at(7)).to_json();
        assert_eq!(
            s,
            json!({"phase": "Failed", "reason": "Stopped", "exitCode": 137,
                   "message": "stopped on request: SIGTERM sent to the process group, SIGKILL \
                               after the 5s grace period; the process was killed by SIGKILL",
                   "finishTime": Time(at(7)), "restartCount": 0})
        );
        let s = stopped(None, Duration::from_secs(5), 4, at(7)).to_json();
        assert_eq!(s["exitCode"], Value::Null);
        assert_eq!(s["message"], "stopped on request while waiting to restart");
        assert_eq!(s["restartCount"], 4);
        let s = stopped_before_start(at(7)).to_json();
        assert!(s.get("exitCode").is_none(), "no exit code written: {s}");
        assert!(s.get("restartCount").is_none(), "{s}");

        let termed = exit(
            Some(143),
            "was killed by SIGTERM",
            ExitCause::DeadlineExceeded,
            false,
        );
        let d = deadline_exceeded(Some(1), Some(&termed), Duration::from_secs(30), 0, at(7));
        let d = d.to_json();
        assert_eq!(d["reason"], REASON_DEADLINE_EXCEEDED);
        assert_eq!(d["exitCode"], 143);
        assert_eq!(
            d["message"],
            "active deadline of 1s exceeded: SIGTERM sent to the process group; the process \
             was killed by SIGTERM"
        );
        let d = deadline_exceeded(None, None, Duration::from_secs(30), 2, at(7)).to_json();
        assert_eq!(
            d["message"],
            "active deadline exceeded while waiting to restart"
        );
        assert_eq!(d["exitCode"], Value::Null);

        let u = device_unhealthy(
            "robot-arm-0: simulated arm fault: boom",
            Some(&termed),
            Duration::from_secs(30),
            1,
            at(7),
        )
        .to_json();
        assert_eq!(
            (
                &u["phase"],
                &u["reason"],
                &u["exitCode"],
                &u["restartCount"]
            ),
            (
                &json!("Failed"),
                &json!(REASON_DEVICE_UNHEALTHY),
                &json!(143),
                &json!(1)
            )
        );
        assert_eq!(
            u["message"],
            "device unhealthy: robot-arm-0: simulated arm fault: boom; stopped \
             (onDeviceUnhealthy: Stop): SIGTERM sent to the process group; the process was \
             killed by SIGTERM"
        );
        let u = device_unhealthy(
            "camera-cam-0: gone",
            None,
            Duration::from_secs(30),
            0,
            at(7),
        )
        .to_json();
        assert_eq!(
            u["message"],
            "device unhealthy: camera-cam-0: gone; stopped (onDeviceUnhealthy: Stop) while \
             waiting to restart"
        );

        let b = backoff(
            &exit(Some(1), "exited with code 1", ExitCause::Exited, false),
            Duration::from_secs(4),
            2,
        );
        assert_eq!(
            b.to_json(),
            json!({"phase": "Running", "reason": "BackOff", "exitCode": 1,
                   "message": "the process exited with code 1; restarting in 4s (restart 3)"})
        );

        let sd = agent_shutdown(None, at(7)).to_json();
        assert_eq!(
            sd,
            json!({"phase": "Failed", "reason": "AgentShutdown", "exitCode": null,
                   "message": "the agent shut down and stops its tasks on exit",
                   "finishTime": Time(at(7))})
        );
        let lost = agent_lost("gone".into(), at(7)).to_json();
        assert_eq!(
            lost,
            json!({"phase": "Failed", "reason": "AgentLost", "exitCode": null,
                   "message": "gone", "finishTime": Time(at(7))})
        );
        let sf = start_failed("StartError", "no such program".into(), 1, at(7)).to_json();
        assert_eq!(
            sf,
            json!({"phase": "Failed", "reason": "StartError", "message": "no such program",
                   "finishTime": Time(at(7)), "restartCount": 1})
        );
        let u = unsupported_agent_type("Docker", at(7)).to_json();
        assert_eq!(u["reason"], REASON_UNSUPPORTED_AGENT_TYPE);
        assert_eq!(
            u["message"],
            "this agent runs raw tasks only; the task's agentType is Docker"
        );
    }
}
