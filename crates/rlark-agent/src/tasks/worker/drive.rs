//! Running a replica: start it through the runtime, drive the replica state machine with
//! its events until it ends, TensorBoard beside it, and pruning old runs.

use super::*;

impl Worker {
    /// Run the replica, with restarts, until it ends for good or the worker is told
    /// otherwise. Takes up [`Worker::resume`] when set.
    pub(super) async fn run_replica(&mut self) -> Step {
        let resume = self.resume.take();
        let body = match RunBody::of(&self.task) {
            Some(RunBody::Docker(_)) if self.shared.ctx.docker.is_none() => None,
            body => body,
        };
        let Some(body) = body else {
            let status = status::unsupported_agent_type(
                self.task.spec.agent_type.as_str(),
                Timestamp::now(),
            );
            Box::pin(self.write_status(status, true)).await;
            return Step::Finished;
        };
        if let RunBody::Docker(_) = body
            && let Some(domain) = self.task.spec.domain.as_deref().filter(|d| !d.is_empty())
        {
            // Planned: containers joining the pod network (docs/tasks.md, "Docker runtime").
            let message = format!(
                "task is in domain {domain}, but the Docker runtime does not join Domains yet"
            );
            let patch = status::start_failed(
                REASON_DOMAIN_NETWORK_UNAVAILABLE,
                message,
                0,
                Timestamp::now(),
            );
            Box::pin(self.write_status(patch, true)).await;
            return Step::Finished;
        }
        if let Err(step) = Box::pin(self.take_devices(&body)).await {
            return step;
        }
        if let Some(domain) = self.task.spec.domain.clone().filter(|d| !d.is_empty())
            && let Err(step) = Box::pin(self.join_domain(&domain)).await
        {
            return step;
        }
        let machine = self.machine();
        match resume {
            None => self.drive(machine, Event::Start, None, Some(body)).await,
            Some(resume) => {
                if let Some(running) = &resume.running {
                    self.publish_replica(Some(running.roots()));
                    Box::pin(self.start_tensorboard(true)).await;
                }
                let event = Event::Adopt {
                    at: resume.at,
                    restarts: resume.restarts,
                    first_start: resume.first_start,
                    task_stopped: false,
                };
                self.drive(machine, event, resume.running, Some(body)).await
            }
        }
    }

    /// Feed `first` to `machine`, then every event that follows (the process's exit, the
    /// Task's changes, wake-ups), executing the machine's actions, until the run is over.
    /// `running` is the process of an adopted run; `body` the Task's runtime block as the
    /// run began (what a start uses when the Task has none any more).
    pub(super) async fn drive(
        &mut self,
        mut machine: Replica<Instant>,
        first: Event,
        mut running: Option<Box<dyn RunningReplica>>,
        body: Option<RunBody>,
    ) -> Step {
        let mut actions: VecDeque<Action<Instant>> = machine.step(first, now()).into();
        let mut wake_at: Option<Instant> = None;
        loop {
            while let Some(action) = actions.pop_front() {
                let event = match action {
                    Action::Spawn {
                        deadline,
                        restarts,
                        pending,
                    } => {
                        self.publish_replica(None);
                        let spawned = match RunBody::of(&self.task).or_else(|| body.clone()) {
                            Some(body) => {
                                Box::pin(self.start(&body, deadline, restarts, pending)).await
                            }
                            None => Err(RuntimeError::Internal(
                                "the task has no raw or docker spec to start".to_string(),
                            )),
                        };
                        let roots = spawned.as_ref().map(|s| s.roots()).unwrap_or_default();
                        self.publish_replica(Some(roots));
                        match spawned {
                            Ok(started) => {
                                let at = timestamp(started.started_at());
                                running = Some(started);
                                // Reported by the Running write that follows.
                                Box::pin(self.start_tensorboard(false)).await;
                                Some(Event::Started { at })
                            }
                            Err(error) => {
                                tracing::warn!(pod = %self.pod, %error, "replica did not start");
                                Some(Event::StartFailed {
                                    reason: error.reason().to_string(),
                                    message: error.to_string(),
                                })
                            }
                        }
                    }
                    Action::SaveState => {
                        if let Some(started) = running.as_deref() {
                            self.save_state(started);
                        }
                        None
                    }
                    Action::Kill { grace } => match running.take() {
                        Some(mut process) => {
                            let exit = Box::pin(process.terminate(grace)).await;
                            self.stop_tensorboard();
                            Some(Event::Exited(exit_report(&exit)))
                        }
                        None => None,
                    },
                    Action::Detach => {
                        // The next agent starts a TensorBoard for the replica it adopts.
                        self.stop_tensorboard();
                        if let Some(process) = running.take() {
                            // Keep running; the state file tells the next agent about it.
                            tracing::info!(pod = %self.pod, pid = process.record().pid(), "leaving replica running");
                            process.detach();
                        }
                        None
                    }
                    Action::WriteStatus(patch) => {
                        Box::pin(self.write_status(patch, true)).await;
                        None
                    }
                    Action::Finish(patch) => {
                        Box::pin(self.finish(patch)).await;
                        None
                    }
                    Action::FinishExited(patch) => {
                        Box::pin(self.finish_exited(patch)).await;
                        None
                    }
                    Action::DeleteState => {
                        self.remove_state();
                        None
                    }
                    Action::DeletePod => {
                        Box::pin(self.delete_own_pod()).await;
                        None
                    }
                    Action::PruneOldRuns => {
                        Box::pin(self.prune_old_runs()).await;
                        None
                    }
                    Action::WakeAt(at) => {
                        wake_at = Some(at);
                        None
                    }
                    Action::Done(end) => return end.into(),
                };
                if let Some(event) = event {
                    // The machine answers the event before the actions still queued.
                    let mut next: VecDeque<_> = machine.step(event, now()).into();
                    next.extend(actions);
                    actions = next;
                }
            }
            let event = self
                .next_event(&mut machine, &mut running, &mut wake_at)
                .await;
            if let Some(event) = event {
                actions = machine.step(event, now()).into();
            }
        }
    }

    /// Wait for what happens next to a run the machine waits on: its process's exit, a
    /// wake-up, or a change of the Task (`None`: nothing for the machine).
    pub(super) async fn next_event(
        &mut self,
        machine: &mut Replica<Instant>,
        running: &mut Option<Box<dyn RunningReplica>>,
        wake_at: &mut Option<Instant>,
    ) -> Option<Event> {
        let devices = self.device_watch();
        let pod = self.pod.clone();
        let command = tokio::select! {
            exit = wait_exit(running) => {
                *running = None;
                self.stop_tensorboard();
                return Some(Event::Exited(exit_report(&exit)));
            }
            devices = device_trouble(devices, pod) => {
                tracing::warn!(pod = %self.pod, %devices, "a device the replica holds is unhealthy; stopping it (onDeviceUnhealthy: Stop)");
                return Some(Event::DeviceUnhealthy { devices });
            }
            () = sleep_until_opt(*wake_at) => {
                *wake_at = None;
                return Some(Event::Wake);
            }
            command = self.next_command() => command,
        };
        match command {
            Command::Run { task, resync } => {
                self.task = task;
                if RunBody::of(&self.task).is_some() {
                    machine.set_spec(self.run_spec());
                }
                if self.task.spec.stopped {
                    if running.is_some() {
                        tracing::info!(pod = %self.pod, "stopping replica (task stopped)");
                    }
                    return Some(Event::Stop);
                }
                Box::pin(self.maybe_resync(resync)).await;
                None
            }
            Command::Supersede => Some(Event::Supersede),
            Command::Remove => Some(Event::Remove),
            Command::Shutdown => Some(Event::Shutdown {
                stop_replicas: self.shared.ctx.stop_tasks_on_exit,
            }),
        }
    }

    /// Start the replica's process through the runtime; `pending` (the Pending status of a
    /// fresh run) is written, concurrently, when starting takes longer than
    /// [`PENDING_AFTER`], and always before whatever is reported next.
    pub(super) async fn start(
        &mut self,
        body: &RunBody,
        deadline: Option<Instant>,
        restarts: i32,
        pending: Option<StatusPatch>,
    ) -> Result<Box<dyn RunningReplica>, RuntimeError> {
        let mut spec = match body {
            RunBody::Raw(raw) => self.replica_spec(raw, deadline)?,
            RunBody::Docker(docker) => self.container_spec(docker, deadline),
        };
        let shared = Arc::clone(&self.shared);
        let task = Arc::clone(&self.task);
        let pod = self.pod.clone();
        let starting = async move {
            let reports = shared.task_tokens.env(
                &shared.client,
                &shared.ctx.server_url,
                &shared.ctx.ca_file,
                &task,
            );
            spec.env.extend(reports.await);
            tracing::debug!(%pod, "task token ready; starting the process");
            shared.runtime.start(spec).await
        };
        let spawned = match pending {
            Some(pending) => {
                tokio::pin!(starting);
                tokio::select! {
                    spawned = &mut starting => spawned,
                    () = tokio::time::sleep(PENDING_AFTER) => {
                        let (_, spawned) =
                            tokio::join!(self.write_status(pending, true), starting);
                        spawned
                    }
                }
            }
            None => starting.await,
        };
        if let Ok(started) = &spawned {
            tracing::info!(pod = %self.pod, pid = started.record().pid(), restarts, "replica started");
        }
        spawned
    }

    /// Start TensorBoard beside the replica that just started (or was adopted running) when
    /// its Task is a raw one with `tensorBoardDir`, and report it in the Pod's
    /// `status.tensorBoard`: its port, or why it does not run ([`tensorboard`]) — written
    /// now with `write_now`, else with the next status write.
    pub(super) async fn start_tensorboard(&mut self, write_now: bool) {
        if self.task.spec.raw.is_none() && self.task.spec.docker.is_none() {
            return;
        }
        let Some(dir) = self
            .task
            .spec
            .tensor_board_dir
            .as_deref()
            .filter(|d| !d.is_empty())
        else {
            return;
        };
        if let Some(mut previous) = self.tensorboard.take() {
            previous.stop();
        }
        let replica_dir = self.replica_dir();
        let mut work_dir = replica_dir.join("work");
        // A raw replica's directory and environment; a Docker replica's logs are read on
        // the node through the main container's bind mount (host network: the proxy reaches
        // the node's loopback either way), by the agent's `tensorboard`.
        let plan = match (&self.task.spec.raw, &self.task.spec.docker) {
            (Some(raw), _) => {
                if let Some(working_dir) = &raw.working_dir {
                    work_dir = work_dir.join(working_dir);
                }
                let env = replica_env(&self.task, self.index, &self.shared.ctx);
                Ok((dir.to_string(), env))
            }
            (None, Some(docker)) => match docker.containers.first() {
                Some(main) => tensorboard::docker_log_dir(main, dir)
                    .inspect(|_| work_dir.clone_from(&replica_dir))
                    .map(|host| (host.display().to_string(), Vec::new())),
                None => Err("the Task has no container".to_string()),
            },
            (None, None) => return,
        };
        let status = match (
            self.task.spec.domain.as_deref().filter(|d| !d.is_empty()),
            plan,
        ) {
            (Some(domain), _) => tensorboard::not_started(format!(
                "the replica is in Domain {domain}: its ports are in its own network \
                 namespace, which the task proxy does not reach"
            )),
            (None, Err(why)) => tensorboard::not_started(why),
            (None, Ok((log_dir, env))) => {
                let (running, status) = tensorboard::start(&Beside {
                    tensor_board_dir: &log_dir,
                    work_dir: &work_dir,
                    replica_dir: &replica_dir,
                    env: &env,
                });
                self.tensorboard = running.map(Box::new);
                status
            }
        };
        if let Some(message) = &status.message {
            tracing::warn!(pod = %self.pod, %message, "no TensorBoard beside the replica");
            if !std::mem::replace(&mut self.tensorboard_warned, true) {
                crate::task_events::warn_task(
                    &self.shared.client,
                    &self.task,
                    tensorboard::REASON_NOT_STARTED,
                    format!("replica {}: {message}", self.index),
                )
                .await;
            }
        }
        self.clear_tensorboard = false;
        self.pending_tensorboard = Some(Box::new(status));
        if write_now {
            self.write_status(StatusPatch::default(), true).await;
        }
    }

    /// Kill the replica's TensorBoard, if any; the next status write removes
    /// `status.tensorBoard`.
    pub(super) fn stop_tensorboard(&mut self) {
        if let Some(mut running) = self.tensorboard.take() {
            running.stop();
        }
        self.pending_tensorboard = None;
        // Gone from what a resync re-asserts, too.
        if self.reported.tensor_board.take().is_some() {
            self.clear_tensorboard = true;
        }
    }

    /// Apply the retention rule to this Task's older runs ([`prune_runs`]).
    pub(super) async fn prune_old_runs(&self) {
        let task_dir = self
            .shared
            .ctx
            .data_dir
            .join(&self.shared.namespace)
            .join(self.task.name_any());
        let current = self.uid();
        let removed = tokio::task::spawn_blocking(move || prune_runs(&task_dir, &current))
            .await
            .unwrap_or_default();
        for dir in removed {
            tracing::info!(dir = %dir.display(), "removed the directory of an old run");
        }
    }
}
