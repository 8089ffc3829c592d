//! Watching a supervised replica: its exit, its deadline and grace, and its logs' rotation.

use super::*;

/// The supervisor process a replica's in-agent supervision watches.
#[derive(Debug)]
pub(super) enum Watched {
    /// Started by this agent: its child, waited for.
    Child {
        child: tokio::process::Child,
        pid: u32,
    },
    /// Adopted: started by an earlier agent; polled in `/proc`.
    Adopted { pid: u32, start_ticks: Option<u64> },
}

impl Watched {
    /// Wait until the supervisor process has ended.
    async fn ended(&mut self) {
        match self {
            Watched::Child { child, pid } => {
                if let Err(error) = child.wait().await {
                    tracing::warn!(pid = *pid, %error, "wait for the replica supervisor");
                    // Not our child after all: watch it like an adopted one.
                    while process::process_running(*pid, None) {
                        tokio::time::sleep(ADOPTED_POLL).await;
                    }
                }
            }
            Watched::Adopted { pid, start_ticks } => {
                while process::process_running(*pid, *start_ticks) {
                    tokio::time::sleep(ADOPTED_POLL).await;
                }
            }
        }
    }

    /// Send `signal` to the supervisor process (it forwards SIGTERM to the task's group).
    fn signal(&self, signal: Signal) {
        let pid = match self {
            // Unreaped, so its pid cannot have been reused.
            Watched::Child { pid, .. } => *pid,
            Watched::Adopted { pid, start_ticks } => {
                if !process::process_running(*pid, *start_ticks) {
                    return;
                }
                *pid
            }
        };
        let Ok(raw) = i32::try_from(pid) else {
            return;
        };
        match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => tracing::warn!(pid, %error, %signal, "signal the replica supervisor"),
        }
    }
}

/// What the in-agent supervision task owns.
pub(super) struct Supervised {
    pub(super) watched: Watched,
    pub(super) pgid: i32,
    pub(super) exit_path: PathBuf,
    pub(super) deadline: Option<Instant>,
    pub(super) deadline_grace: Duration,
    pub(super) terminate: watch::Receiver<Option<Duration>>,
    pub(super) exit: watch::Sender<Option<ReplicaExit>>,
    pub(super) logs: LogFiles,
}

pub(super) async fn supervise(mut s: Supervised) {
    // Set once a stop (or the deadline) began: why, and when SIGKILL follows.
    let mut stopping: Option<(ExitCause, Instant)> = None;
    let mut killed = false;
    let mut kill_done = false;
    let mut terminate_open = true;
    let mut rotate = tokio::time::interval(ROTATE_EVERY);
    rotate.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let kill_at = stopping.map(|(_, at)| at);
        tokio::select! {
            () = s.watched.ended() => break,
            _ = sleep_until_opt(s.deadline), if stopping.is_none() => {
                s.watched.signal(Signal::SIGTERM);
                stopping = Some((ExitCause::DeadlineExceeded, Instant::now() + s.deadline_grace.min(MAX_GRACE)));
            }
            changed = s.terminate.changed(), if stopping.is_none() && terminate_open => {
                match changed {
                    Ok(()) => {
                        if let Some(grace) = *s.terminate.borrow_and_update() {
                            s.watched.signal(Signal::SIGTERM);
                            stopping = Some((ExitCause::Terminated, Instant::now() + grace.min(MAX_GRACE)));
                        }
                    }
                    Err(_) => terminate_open = false,
                }
            }
            _ = sleep_until_opt(kill_at), if !kill_done => {
                kill_done = true;
                if process::group_exists(s.pgid) {
                    kill(s.pgid);
                    killed = true;
                }
            }
            _ = rotate.tick() => rotate_logs(&s.logs).await,
        }
    }
    let recorded = match record::read::<ExitRecord>(&s.exit_path) {
        Ok(recorded) => recorded,
        Err(error) => {
            tracing::warn!(file = %s.exit_path.display(), %error, "read the replica's exit record");
            None
        }
    };
    let (status, finished_at) = match recorded.as_ref().and_then(|r| r.status().map(|st| (r, st))) {
        Some((record, status)) => {
            killed |= record.killed;
            (status, record.finished_at())
        }
        None => {
            // The supervisor died (SIGKILL) without recording the exit: nothing may be
            // left of a replica nobody supervises any more.
            tracing::warn!(
                pgid = s.pgid,
                "the replica supervisor ended without recording the exit; killing the group"
            );
            kill(s.pgid);
            (ExitStatus::Unknown, SystemTime::now())
        }
    };
    let cause = stopping.map_or(ExitCause::Exited, |(cause, _)| cause);
    rotate_logs(&s.logs).await;
    s.exit.send_replace(Some(ReplicaExit {
        status,
        cause,
        killed,
        finished_at,
    }));
}

pub(super) async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(super) fn kill(pgid: i32) {
    if let Err(error) = process::signal_group(pgid, Signal::SIGKILL) {
        tracing::warn!(pgid, %error, "SIGKILL replica process group");
    }
}

pub(super) async fn rotate_logs(logs: &LogFiles) {
    let files = logs.clone();
    match tokio::task::spawn_blocking(move || files.rotate_if_needed()).await {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::warn!(log = %logs.path().display(), %error, "rotate replica log");
        }
        Err(error) => tracing::warn!(%error, "rotate replica log"),
    }
}
