//! What the runtime is asked to run: the replica spec of a raw or Docker Task, with the raw
//! replica's sandbox.

use super::*;

impl Worker {
    pub(super) fn replica_spec(
        &self,
        raw: &RawTaskSpec,
        deadline: Option<Instant>,
    ) -> Result<ReplicaSpec, RuntimeError> {
        let mut spec = ReplicaSpec::new(raw.entrypoint.clone(), self.replica_dir());
        spec.env = replica_env(&self.task, self.index, &self.shared.ctx);
        spec.working_dir = raw.working_dir.as_ref().map(PathBuf::from);
        spec.artifact = raw.artifact.clone();
        spec.artifact_sha256 = raw.artifact_sha256.clone();
        spec.artifact_cache = self
            .shared
            .ctx
            .data_dir
            .parent()
            .map(|d| d.join("artifacts"));
        spec.deadline = deadline;
        spec.grace = self.grace();
        spec.supervisor = self.shared.ctx.supervisor.clone();
        if let Some(access) = &self.shared.ctx.devices {
            spec.env.extend(crate::devices::allocator::replica_env(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            ));
        }
        if let Some(attachment) = &self.network {
            if let Some(ip) = attachment.addresses.first() {
                spec.env.push(("RLARK_POD_IP".to_string(), ip.to_string()));
            }
            spec.network = Some(attachment.network.clone());
        }
        spec.sandbox = self.sandbox(raw)?;
        if spec.sandbox.is_some() {
            // The agent's own HOME (root's) is not the replica user's: its work directory
            // is, unless the Task says otherwise.
            let home = spec.default_work_dir().display().to_string();
            let user = crate::tasks::isolation::REPLICA_USER.to_string();
            for (name, value) in [("HOME", home), ("USER", user.clone()), ("LOGNAME", user)] {
                if !spec.env.iter().any(|(k, _)| k == name) {
                    spec.env.push((name.to_string(), value));
                }
            }
        }
        Ok(spec)
    }

    /// The isolation of this replica under the agent's policy ([`crate::tasks::isolation`]).
    pub(super) fn sandbox(&self, raw: &RawTaskSpec) -> Result<Option<Sandbox>, RuntimeError> {
        let Some(isolation) = &self.shared.ctx.isolation else {
            return Ok(None);
        };
        let sockets = match &self.shared.ctx.devices {
            Some(access) => {
                let mut names: Vec<&str> = self.devices.iter().map(|d| d.socket).collect();
                names.sort_unstable();
                names.dedup();
                names
                    .into_iter()
                    .map(|name| access.socket_dir.join(name))
                    .collect()
            }
            None => Vec::new(),
        };
        let replica_dir = self.replica_dir();
        let job = crate::tasks::task_job(&self.task);
        let request = crate::tasks::isolation::Request {
            namespace: &self.shared.namespace,
            pod: &self.pod,
            job: &job,
            raw,
            replica_dir: &replica_dir,
            ca_file: &self.shared.ctx.ca_file,
            sockets,
        };
        match isolation.decide(&request) {
            Ok(crate::tasks::isolation::Decision::Isolated(sandbox)) => Ok(Some(sandbox)),
            Ok(crate::tasks::isolation::Decision::Root) => {
                tracing::info!(pod = %self.pod, %job, "replica runs as root: its Job is allowed to");
                Ok(None)
            }
            Err(message) => Err(RuntimeError::Isolation(message)),
        }
    }

    /// The spec of a replica of a `docker` task: its containers, the environment contract,
    /// the identity labels.
    pub(super) fn container_spec(
        &self,
        docker: &DockerTaskSpec,
        deadline: Option<Instant>,
    ) -> ReplicaSpec {
        let mut spec = ReplicaSpec::new(Vec::new(), self.replica_dir());
        spec.env = replica_env(&self.task, self.index, &self.shared.ctx);
        spec.deadline = deadline;
        spec.grace = self.grace();
        let task = self.task.name_any();
        let uid = self.uid();
        let namespace = &self.shared.namespace;
        spec.containers = Some(ContainerSet {
            containers: docker.containers.clone(),
            labels: docker_labels(
                &self.shared.ctx.node_name,
                namespace,
                &task,
                &uid,
                self.index,
                &self.key,
            ),
            names: docker
                .containers
                .iter()
                .map(|c| container_name(namespace, &task, &uid, self.index, &c.name))
                .collect(),
            read_only_files: vec![self.shared.ctx.ca_file.clone()],
            read_write_dirs: Vec::new(),
        });
        // Devices: the same environment as a raw replica's, and the runtime's socket
        // directory at the same path inside (so the socket paths in it are valid).
        if let Some(access) = &self.shared.ctx.devices
            && !self.devices.is_empty()
        {
            spec.env.extend(crate::devices::allocator::replica_env(
                &access.socket_dir,
                &self.devices,
                &self.owner_label(),
            ));
            if let Some(set) = spec.containers.as_mut() {
                set.read_write_dirs.push(access.socket_dir.clone());
            }
        }
        spec
    }
}
