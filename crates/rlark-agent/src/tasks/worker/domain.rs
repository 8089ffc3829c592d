//! A replica in a Domain: waiting for its addresses, attaching its network namespace and
//! leaving it.

use super::*;

impl Worker {
    /// Give the replica its place in `domain` before it starts: wait for its address
    /// (reporting the Pod `Pending` with reason `NoDomainIP` while the Domain's pool is
    /// full), then attach it ([`rlark_net::replica::DomainNet::attach`]). Err: the step to
    /// take instead of starting (a command came, or the network cannot be had).
    pub(super) async fn join_domain(&mut self, domain: &str) -> Result<(), Step> {
        let net = match &self.shared.ctx.network {
            PodNetwork::Ready(net) => net.clone(),
            PodNetwork::Unavailable(why) => {
                let message = format!(
                    "task is in domain {domain}, but this agent runs no pod network: {why}"
                );
                let patch = status::start_failed(
                    REASON_DOMAIN_NETWORK_UNAVAILABLE,
                    message,
                    0,
                    Timestamp::now(),
                );
                self.write_status(patch, true).await;
                return Err(Step::Finished);
            }
        };
        let pod = self.pod.clone();
        let (tx, mut pending) = watch::channel::<Option<Option<DomainPendingPod>>>(None);
        let wait = net.wait_addresses(domain, &pod, move |p| {
            let _ = tx.send(Some(p.cloned()));
        });
        tokio::pin!(wait);
        enum Waited {
            Addresses(Vec<ipnet::IpNet>),
            Pending(Option<DomainPendingPod>),
            Command(Command),
        }
        let addresses = loop {
            let waited = tokio::select! {
                addresses = &mut wait => Waited::Addresses(addresses),
                Ok(()) = pending.changed() => Waited::Pending(pending.borrow_and_update().clone().flatten()),
                command = self.next_command() => Waited::Command(command),
            };
            match waited {
                Waited::Addresses(addresses) => break addresses,
                Waited::Pending(entry) => {
                    let (reason, message) = match entry {
                        Some(entry) => (entry.reason, entry.message),
                        None => (
                            REASON_WAITING_FOR_DOMAIN_IP.to_string(),
                            format!("waiting for an address in domain {domain}"),
                        ),
                    };
                    let patch = status::waiting(&self.shared.ctx.node_name, &reason, message);
                    self.write_status(patch, true).await;
                }
                Waited::Command(Command::Run { task, .. }) => {
                    self.task = task;
                    if self.task.spec.stopped {
                        self.write_status(status::stopped_before_start(Timestamp::now()), false)
                            .await;
                        return Err(Step::Stopped);
                    }
                }
                Waited::Command(Command::Remove) => {
                    self.delete_own_pod().await;
                    return Err(Step::Exit);
                }
                Waited::Command(Command::Supersede | Command::Shutdown) => return Err(Step::Exit),
            }
        };
        let namespace = self.task.namespace().unwrap_or_default();
        match net.attach(&namespace, &pod, domain, addresses).await {
            Ok(attachment) => {
                let ip = attachment.addresses.first().map(ToString::to_string);
                self.network = Some(attachment);
                let patch = StatusPatch {
                    set: PodStatus {
                        ip,
                        ..PodStatus::default()
                    },
                    clear: Vec::new(),
                };
                self.write_status(patch, true).await;
                Ok(())
            }
            Err(error) => {
                tracing::warn!(pod = %self.pod, %error, "replica could not join its domain");
                let patch =
                    status::start_failed(error.reason(), error.to_string(), 0, Timestamp::now());
                self.write_status(patch, true).await;
                Err(Step::Finished)
            }
        }
    }

    /// The run is over for this worker: give the replica's network back (deleted, unless
    /// the agent exits and leaves the replica running for the next agent).
    pub(super) async fn leave_domain(&mut self) {
        if self.network.take().is_none() {
            return;
        }
        let PodNetwork::Ready(net) = &self.shared.ctx.network else {
            return;
        };
        if self.shared.shutdown.is_cancelled() && !self.shared.ctx.stop_tasks_on_exit {
            net.leave(&self.pod);
        } else {
            net.release(&self.pod).await;
        }
    }
}
