//! A worker's first steps: what an earlier agent left (adopt a replica still running, end
//! one that exited, or start over with a fresh Pod), and waiting while the Task is stopped.

use super::*;

impl Worker {
    /// Decide from what an earlier agent left (`recovered`) and the existing Pod (an
    /// earlier agent's, an earlier run's, or none).
    pub(super) async fn first_step(&mut self, recovered: Vec<Recovered>) -> Step {
        tracing::debug!(pod = %self.pod, recovered = recovered.len(), "replica worker started");
        // Replicas of other runs end first: this run may use the same directory.
        let mut mine = None;
        for r in recovered {
            if mine.is_none() && r.state.run_key == self.key && r.state.uid == self.uid() {
                mine = Some(r);
            } else {
                end_recovered(&self.shared, r, false).await;
            }
        }
        if mine.is_none() && !self.pod_may_exist && !self.task.spec.stopped {
            // A replica of a Task that appeared since the last listing: its Pod is new.
            self.prefetch_task_token();
            match self.create_new_pod().await {
                Some(true) => {
                    self.reported = PodStatus::default();
                    return Step::Start;
                }
                // There after all (another run's, or created since the listing): read it.
                Some(false) => {}
                None => return Step::Exit,
            }
        }
        let Some(existing) = self.get_pod().await else {
            return Step::Exit;
        };
        let existing = existing.filter(|pod| {
            // A Pod under deletion is as good as gone.
            pod.metadata.deletion_timestamp.is_none()
        });
        let ours = existing.as_ref().filter(|pod| self.is_ours(pod));
        if let Some(pod) = ours {
            self.reported = pod.status.clone().unwrap_or_default();
        }
        if let Some(r) = mine {
            return self.adopt(r, ours.cloned()).await;
        }
        if self.task.spec.stopped {
            if let Some(pod) = ours
                && !pod_is_terminal(pod)
            {
                self.write_status(status::stopped_before_start(Timestamp::now()), false)
                    .await;
            }
            return Step::Stopped;
        }
        match (ours, &existing) {
            (Some(pod), _) => match pod_phase(pod) {
                Some(PodPhase::Succeeded) => Step::Finished,
                Some(PodPhase::Failed) if pod_reason(pod) == Some(REASON_STOPPED) => {
                    // Stopped, and the Task is not stopped any more: a resume.
                    self.fresh_pod(existing.as_ref()).await
                }
                Some(PodPhase::Failed) => Step::Finished,
                Some(PodPhase::Running) if pod_reason(pod) == Some(REASON_BACKOFF) => {
                    // An earlier agent stopped while the replica waited to restart
                    // (nothing runs then): restart it now.
                    let (restarts, first_start) = pod_progress(pod, None);
                    tracing::info!(pod = %self.pod, restarts, "restarting a replica an earlier agent left waiting to restart");
                    self.resume = Some(Resume {
                        restarts: restarts.saturating_add(1),
                        first_start,
                        at: AdoptedAt::Restart,
                        running: None,
                    });
                    Step::Start
                }
                Some(PodPhase::Running) => {
                    let status = status::agent_lost(
                        "the agent has no record of this replica's process (it was reported \
                         Running before the agent restarted); the outcome of the run is unknown"
                            .to_string(),
                        Timestamp::now(),
                    );
                    self.write_status(status, false).await;
                    Step::Finished
                }
                // Created but never started: start it.
                Some(PodPhase::Pending) | None => Step::Start,
            },
            (None, _) => self.fresh_pod(existing.as_ref()).await,
        }
    }

    /// Take over this run's replica `r`, left by an earlier agent: adopt its running
    /// process, or go on from its recorded exit, or report it lost.
    pub(super) async fn adopt(&mut self, r: Recovered, pod: Option<Pod>) -> Step {
        let (restarts, first_start) = pod_progress_or_state(pod.as_ref(), &r.state);
        let mut spec = ReplicaSpec::new(Vec::new(), self.replica_dir());
        spec.deadline = self.deadline_from(first_start);
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        self.state = Some(r.state.clone());
        let task_stopped = self.task.spec.stopped;
        let (at, running) = match self.shared.runtime.adopt(&spec, &r.recorded()).await {
            Adopted::Running(running) => {
                tracing::info!(pod = %self.pod, pid = running.record().pid(), "adopted a running replica");
                let started_at = timestamp(running.started_at());
                (AdoptedAt::Running { started_at }, Some(running))
            }
            Adopted::Exited(exit) => {
                tracing::info!(pod = %self.pod, status = %exit.status, "a replica ended while no agent ran");
                let started_at = r
                    .state
                    .start_time
                    .parse::<Timestamp>()
                    .unwrap_or_else(|_| timestamp(exit.finished_at));
                let exit = exit_report(&exit);
                (AdoptedAt::Exited { exit, started_at }, None)
            }
            Adopted::Lost(message) => {
                let event = Event::Lost {
                    message,
                    task_stopped,
                };
                return self.drive(self.machine(), event, None, None).await;
            }
        };
        if task_stopped {
            if running.is_some() {
                tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
            }
            let event = Event::Adopt {
                at,
                restarts,
                first_start,
                task_stopped,
            };
            return self.drive(self.machine(), event, running, None).await;
        }
        self.resume = Some(Resume {
            restarts,
            first_start,
            at,
            running,
        });
        Step::Start
    }

    /// `activeDeadlineSeconds` after `first_start`, as an instant (now when it passed).
    pub(super) fn deadline_from(&self, first_start: Timestamp) -> Option<Instant> {
        let elapsed = SystemTime::now()
            .duration_since(SystemTime::from(first_start))
            .unwrap_or_default();
        // `raw` or `docker` block: both carry `activeDeadlineSeconds`.
        rlark_api::agent::deadline_after(
            self.task.spec.active_deadline_seconds(),
            Instant::now(),
            elapsed,
        )
    }

    /// Replace `existing` (if any) by a new Pod for this run.
    pub(super) async fn fresh_pod(&mut self, existing: Option<&Pod>) -> Step {
        self.reported = PodStatus::default();
        self.prefetch_task_token();
        if let Some(pod) = existing
            && !self.delete_pod(pod).await
        {
            return Step::Exit;
        }
        if self.create_pod().await {
            Step::Start
        } else {
            Step::Exit
        }
    }

    /// A replica of a new run starts next: mint the run's task token (one API round trip)
    /// while its Pod is created, rather than after. `start` finds it in the cache, or
    /// waits for this very mint.
    pub(super) fn prefetch_task_token(&self) {
        if RunBody::of(&self.task).is_some() {
            let shared = Arc::clone(&self.shared);
            let task = Arc::clone(&self.task);
            tokio::spawn(async move {
                shared
                    .task_tokens
                    .env(
                        &shared.client,
                        &shared.ctx.server_url,
                        &shared.ctx.ca_file,
                        &task,
                    )
                    .await;
            });
        }
    }

    /// Nothing runs: follow the Task until a resume, a removal or the end. Its rare calls
    /// are boxed: this future waits, allocated, for as long as the Task exists.
    pub(super) async fn idle(&mut self, step: Step) -> Step {
        loop {
            match self.next_command().await {
                Command::Run { task, resync } => {
                    self.task = task;
                    if step == Step::Stopped && !self.task.spec.stopped {
                        let existing = match Box::pin(self.get_pod()).await {
                            Some(pod) => pod.filter(|p| self.is_ours(p)),
                            None => return Step::Exit,
                        };
                        return Box::pin(self.fresh_pod(existing.as_ref())).await;
                    }
                    // A final status was written successfully (or is kept in the state
                    // file): nothing to re-assert for a replica that does not run.
                    self.resync = resync;
                }
                Command::Supersede | Command::Shutdown => return Step::Exit,
                Command::Remove => {
                    Box::pin(self.delete_own_pod()).await;
                    return Step::Exit;
                }
            }
        }
    }
}
