//! The devices a replica holds: taking them before it starts, publishing who holds them to
//! the embodied runtime, stopping held robots and releasing them when it ends.

use super::*;

impl Worker {
    /// Takes the robots and cameras the Task requests for this run (none requested: no
    /// change), records them in the Pod's status, and gives the process their environment
    /// ([`Self::replica_spec`]). An adopted run prefers what its Pod recorded. Devices that
    /// cannot be had fail the run with `DevicesUnavailable`, as a kubelet fails a pod its
    /// device plugins cannot serve.
    pub(super) async fn take_devices(&mut self, body: &RunBody) -> Result<(), Step> {
        use crate::devices::allocator::{self, REASON_DEVICES_UNAVAILABLE};
        // Per replica: the raw block's requests, or the sum over a docker task's containers
        // (as placement counts them).
        let lists: Vec<&rlark_api::types::ResourceList> = match body {
            RunBody::Raw(raw) => raw.resources.iter().map(|r| &r.requests).collect(),
            RunBody::Docker(docker) => docker
                .containers
                .iter()
                .filter_map(|c| c.resources.as_ref())
                .map(|r| &r.requests)
                .collect(),
        };
        let wanted = allocator::device_requests_of(&lists).and_then(|wants| {
            if wants.is_empty() {
                return Ok(Vec::new());
            }
            let Some(access) = &self.shared.ctx.devices else {
                return Err(
                    "this agent has no embodied runtime (rlark agent --embodied-socket-dir)"
                        .to_string(),
                );
            };
            let prefer = self.reported.devices.clone();
            access.allocate(&self.pod, &wants, &prefer)
        });
        match wanted {
            Ok(devices) if devices.is_empty() => Ok(()),
            Ok(devices) => {
                let ids: Vec<String> = devices.iter().map(|o| o.device.id.clone()).collect();
                tracing::info!(pod = %self.pod, devices = ?ids, "devices given to the replica");
                self.devices = devices;
                let patch = StatusPatch {
                    set: PodStatus {
                        devices: ids,
                        ..PodStatus::default()
                    },
                    clear: Vec::new(),
                };
                self.write_status(patch, true).await;
                Ok(())
            }
            Err(message) => {
                tracing::warn!(pod = %self.pod, %message, "the replica's devices cannot be given");
                let patch =
                    status::start_failed(REASON_DEVICES_UNAVAILABLE, message, 0, Timestamp::now());
                self.write_status(patch, true).await;
                Err(Step::Finished)
            }
        }
    }

    /// The replica stays running after this worker (the agent exits and leaves its tasks
    /// for the next agent to adopt).
    pub(super) fn left_running(&self) -> bool {
        self.shared.shutdown.is_cancelled() && !self.shared.ctx.stop_tasks_on_exit
    }

    /// `<namespace>/<pod>`: how the replica is named to the embodied runtime
    /// (`RLINF_EMBODIED_OWNER`, robots' stop messages).
    pub(super) fn owner_label(&self) -> String {
        format!("{}/{}", self.shared.namespace, self.pod)
    }

    /// The backstop of the runtime's safety watchdog: the run is over, so every robot it
    /// held that still runs for an owner is stopped (a detached one is left alone), even if
    /// some process outside the replica started it
    /// ([`crate::devices::stop_held_robots`]).
    pub(super) async fn stop_held_robots(&self) {
        if self.devices.is_empty() {
            return;
        }
        if let Some(access) = &self.shared.ctx.devices {
            crate::devices::stop_held_robots(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            )
            .await;
        }
    }

    /// What the replica's devices say now, when its Task wants it stopped on an unhealthy
    /// device (`onDeviceUnhealthy: Stop`) and it holds some: a receiver of the holders'
    /// problems. `None`: nothing to follow.
    pub(super) fn device_watch(&self) -> Option<watch::Receiver<crate::devices::Problems>> {
        if self.devices.is_empty()
            || self.task.spec.on_device_unhealthy != Some(DeviceUnhealthyPolicy::Stop)
        {
            return None;
        }
        self.shared.ctx.devices.as_ref().map(|a| a.problems())
    }

    /// Frees this run's devices for other replicas, and tells the embodied runtime the
    /// replica is gone (not when it is left running for the next agent: it keeps its
    /// devices meanwhile).
    pub(super) fn release_devices(&mut self) {
        let Some(access) = &self.shared.ctx.devices else {
            return;
        };
        let leaving = !self.left_running();
        if !self.devices.is_empty() {
            access.release(&self.pod, leaving);
        }
        self.devices.clear();
        if leaving {
            access.replica_ended(&self.pod);
        }
    }

    /// Tells the embodied runtime (when the agent has one) that this replica is starting
    /// (`roots` `None`) or runs with `roots`.
    pub(super) fn publish_replica(&self, roots: Option<Vec<rlark_proto::holders::ProcessRef>>) {
        if let Some(access) = &self.shared.ctx.devices {
            let name = self.owner_label();
            match roots {
                None => access.replica_starting(&self.pod, &name),
                Some(roots) => {
                    access.replica_running(&self.pod, &name, roots, self.own_user());
                }
            }
        }
    }

    /// The user only this replica runs as: an isolated raw replica's from the agent's pool
    /// (named by its sandbox description, root's, in the replica's directory). Empty otherwise (a
    /// `runAsUser` others may share, root, a container).
    pub(super) fn own_user(&self) -> Vec<u32> {
        let pooled = self.shared.ctx.isolation.is_some()
            && self
                .task
                .spec
                .raw
                .as_ref()
                .is_some_and(|raw| raw.run_as_user.is_none());
        if !pooled {
            return Vec::new();
        }
        crate::runtime::uids::recorded_uid(&self.replica_dir())
            .into_iter()
            .collect()
    }
}
