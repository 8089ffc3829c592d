//! The pod network of the whole agent, as the Task worker uses it: [`DomainNet`] owns the
//! router, the membership watch, the direct listener, the datagram planes and the hosts
//! files, and gives each replica of a domain task its network ([`DomainNet::attach`]) and
//! takes it back ([`DomainNet::release`]).
//!
//! A replica's life in the network:
//!
//! 1. the worker waits for the replica's address ([`DomainNet::wait_addresses`]): the
//!    Domain controller lists it in the namespace's DomainPeer, or lists the replica under
//!    `pending` (reason `NoDomainIP`, reported on the Pod while it waits);
//! 2. [`DomainNet::attach`] creates (or, after an agent restart, adopts) its network
//!    namespace `rlark-<hash>` with the addresses, writes its hosts file, attaches the
//!    router (the redirect listener inside the namespace) and starts its datagram plane on
//!    the namespace's TUN device; the runtime then starts the process inside
//!    ([`ReplicaNetwork`]);
//! 3. restarts of the process keep all of it (same namespace, same address);
//! 4. when the run ends for good (finished, stopped, removed, superseded) [`DomainNet::release`]
//!    detaches it and deletes the namespace. An agent that exits and leaves replicas running
//!    keeps their namespaces: the next agent attaches them again.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ipnet::IpNet;
use rlark_api::types::DomainPendingPod;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use super::datagram::{DatagramMetrics, DatagramPlane, Limits, PlaneConfig};
use super::hosts_files::HostsFiles;
use super::inbound::DatagramPlanes;
use super::membership::{Membership, MembershipView};
use super::netns::{Mode, NetError, NetnsSpec, ReplicaNetns};
use super::router::{ReplicaOpener, ReplicaTcp, Router};
use super::stack::TcpStack;

/// Where a replica of a domain task runs, network-wise (the supervisor's `--netns` and
/// `--hosts`; the agent's runtime starts the process inside).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaNetwork {
    /// The replica's network namespace, `/run/netns/<name>`
    /// ([`crate::netns::ReplicaNetns::path`]).
    pub netns_path: PathBuf,
    /// The file the task sees as `/etc/hosts` (bind-mounted); the agent rewrites it in place
    /// ([`crate::netns::rewrite_in_place`]) and the task sees each update. Must exist
    /// when the replica starts.
    pub hosts_file: PathBuf,
}

/// How the agent runs the pod network.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// How TCP leaving a replica is terminated.
    pub mode: Mode,
    /// The redirect listener's port inside each namespace (kernel mode).
    pub redirect_port: u16,
    /// Host-loopback TCP ports a task may reach as `127.0.0.1:<port>` (the control plane's
    /// port when the agent reaches the server on loopback).
    pub loopback_passthrough: Vec<u16>,
    /// Where the hosts files live (`DATA_DIR/net`).
    pub state_dir: PathBuf,
}

/// Failures of [`DomainNet::attach`]; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("network namespace of pod {pod}: {source}")]
    Netns {
        pod: String,
        #[source]
        source: NetError,
    },
    #[error("hosts file {}: {source}", path.display())]
    Hosts {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Router(#[from] super::router::AttachError),
}

impl AttachError {
    /// The Pod reason of a replica that could not be attached.
    pub fn reason(&self) -> &'static str {
        "DomainNetworkError"
    }
}

/// A replica's network, as the runtime needs it and as the Pod reports it.
#[derive(Clone, Debug)]
pub struct Attachment {
    /// The namespace and hosts file the process starts with.
    pub network: ReplicaNetwork,
    /// The replica's virtual IPs.
    pub addresses: Vec<IpAddr>,
}

/// One attached replica (its datagram plane is in [`Inner::planes`]).
struct Attached {
    domain: String,
    netns: Arc<ReplicaNetns>,
    hosts_file: PathBuf,
    /// Cancelled on release or leave: ends the replica's TCP stack (tun mode).
    stop: CancellationToken,
}

/// The agent's pod network (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct DomainNet {
    inner: Arc<Inner>,
}

struct Inner {
    router: Router,
    membership: Membership,
    datagrams: DatagramMetrics,
    /// The datagram planes of attached replicas, which the router's destination side
    /// serves inbound datagram flows with.
    planes: DatagramPlanes,
    config: NetConfig,
    attached: Mutex<HashMap<String, Attached>>,
    /// The attached replicas' hosts files, kept current.
    hosts: HostsFiles,
    /// The agent's shutdown (each replica's `stop` is a child of it).
    shutdown: CancellationToken,
}

impl std::fmt::Debug for DomainNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainNet")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl DomainNet {
    /// The pod network over `router` (whose membership it follows). Registers itself as
    /// the router's destination for datagram flows and keeps every attached replica's hosts
    /// file current until `shutdown`.
    pub fn new(
        router: Router,
        datagrams: DatagramMetrics,
        config: NetConfig,
        shutdown: CancellationToken,
    ) -> Self {
        let planes = DatagramPlanes::default();
        router.inbound().set_datagrams(Arc::new(planes.clone()));
        let hosts = HostsFiles::new(router.membership().clone());
        tokio::spawn(hosts.clone().run(shutdown.clone()));
        DomainNet {
            inner: Arc::new(Inner {
                hosts,
                membership: router.membership().clone(),
                router,
                datagrams,
                planes,
                config,
                attached: Mutex::new(HashMap::new()),
                shutdown,
            }),
        }
    }

    /// The router (for the agent API's `net check`).
    pub fn router(&self) -> &Router {
        &self.inner.router
    }

    /// The mode replicas run in.
    pub fn mode(&self) -> Mode {
        self.inner.config.mode
    }

    fn attached(&self) -> std::sync::MutexGuard<'_, HashMap<String, Attached>> {
        self.inner
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait until the DomainPeer of this namespace gives replica `pod` of `domain` its
    /// addresses (with the domain's prefix). `waiting` is called with the replica's
    /// `pending` entry (reason `NoDomainIP`) whenever the view changes while it waits, or
    /// `None` while the domain does not list the replica at all yet.
    pub async fn wait_addresses(
        &self,
        domain: &str,
        pod: &str,
        mut waiting: impl FnMut(Option<&DomainPendingPod>),
    ) -> Vec<IpNet> {
        let mut views = self.inner.membership.subscribe();
        let mut last: Option<Option<DomainPendingPod>> = None;
        loop {
            let view = views.borrow_and_update().clone();
            if let Some(addresses) = addresses_in(&view, domain, pod) {
                return addresses;
            }
            let pending = view.pending(pod).map(|(_, p)| p.clone());
            if last.as_ref() != Some(&pending) {
                waiting(pending.as_ref());
                last = Some(pending);
            }
            if views.changed().await.is_err() {
                // The membership watch is gone (agent shutting down): wait to be cancelled.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Give replica `pod` (of Task namespace `namespace`) in `domain` its network at
    /// `addresses` (see the module documentation). Idempotent for an attached replica.
    pub async fn attach(
        &self,
        namespace: &str,
        pod: &str,
        domain: &str,
        addresses: Vec<IpNet>,
    ) -> Result<Attachment, AttachError> {
        let name = netns_name(&self.inner.config.state_dir, namespace, pod);
        let hosts_file = self.inner.config.state_dir.join(format!("{name}.hosts"));
        let ips: Vec<IpAddr> = addresses.iter().map(IpNet::addr).collect();
        if let Some(existing) = self.attached().get(pod) {
            return Ok(Attachment {
                network: ReplicaNetwork {
                    netns_path: existing.netns.path().to_path_buf(),
                    hosts_file: existing.hosts_file.clone(),
                },
                addresses: ips,
            });
        }
        let spec = NetnsSpec {
            name: name.clone(),
            addresses: addresses.clone(),
            mode: self.inner.config.mode,
            redirect_port: self.inner.config.redirect_port,
            loopback_passthrough: self.inner.config.loopback_passthrough.clone(),
        };
        let netns =
            Arc::new(
                ReplicaNetns::create(&spec)
                    .await
                    .map_err(|source| AttachError::Netns {
                        pod: pod.to_string(),
                        source,
                    })?,
            );
        if let Err(source) = self.inner.hosts.add(pod, domain, &hosts_file) {
            let _ = delete_netns(netns).await;
            return Err(AttachError::Hosts {
                path: hosts_file.clone(),
                source,
            });
        }
        let attached = match self.inner.config.mode {
            Mode::Kernel => self.inner.router.attach(pod, domain, netns.clone()).await,
            Mode::Tun => {
                self.inner
                    .router
                    .attach_tun(
                        pod,
                        domain,
                        netns.clone(),
                        &self.inner.config.loopback_passthrough,
                    )
                    .await
            }
        };
        if let Err(error) = attached {
            // Nothing half-attached: the namespace is created again on the next try.
            self.inner.hosts.forget(pod);
            let _ = delete_netns(netns).await;
            return Err(error.into());
        }
        let cidrs = self
            .inner
            .membership
            .view()
            .domain(domain)
            .map(|d| vec![d.cidr])
            .unwrap_or_default();
        let stop = self.inner.shutdown.child_token();
        // Tun mode: the replica's TCP goes from the TUN reader to its userspace stack.
        let tcp = (self.inner.config.mode == Mode::Tun).then(|| {
            TcpStack::start(
                netns.tun().clone(),
                Arc::new(ReplicaTcp::new(self.inner.router.clone(), pod)),
                self.inner.datagrams.clone(),
                stop.clone(),
            )
            .packets()
        });
        let plane = DatagramPlane::start_with_tcp(
            PlaneConfig {
                domain: domain.to_string(),
                cidrs,
                addresses: ips.clone(),
                limits: Limits::default(),
            },
            netns.tun().clone(),
            Arc::new(ReplicaOpener::new(self.inner.router.clone(), pod)),
            self.inner.datagrams.clone(),
            tcp,
        );
        let network = ReplicaNetwork {
            netns_path: netns.path().to_path_buf(),
            hosts_file: hosts_file.clone(),
        };
        self.inner.planes.insert(pod, plane);
        self.attached().insert(
            pod.to_string(),
            Attached {
                domain: domain.to_string(),
                netns,
                hosts_file,
                stop,
            },
        );
        tracing::info!(%pod, %domain, addresses = ?ips, netns = %name, "replica attached to its domain");
        Ok(Attachment {
            network,
            addresses: ips,
        })
    }

    /// Take replica `pod`'s network back: detach it from the router, stop its datagram
    /// plane, delete its namespace and hosts file. Nothing happens for a replica that is
    /// not attached.
    pub async fn release(&self, pod: &str) {
        let Some(attached) = self.attached().remove(pod) else {
            return;
        };
        self.inner.router.detach(pod);
        self.inner.hosts.forget(pod);
        attached.stop.cancel();
        if let Some(plane) = self.inner.planes.remove(pod) {
            plane.shutdown();
        }
        let name = attached.netns.name().to_string();
        if let Err(error) = delete_netns(attached.netns).await {
            tracing::warn!(%pod, netns = %name, %error, "delete the replica's network namespace");
        }
        if let Err(error) = std::fs::remove_file(&attached.hosts_file)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%pod, file = %attached.hosts_file.display(), %error, "remove the replica's hosts file");
        }
        tracing::info!(%pod, domain = %attached.domain, "replica released from its domain");
    }

    /// Forget replica `pod` without deleting its namespace (the agent exits and leaves it
    /// running; the next agent attaches it again).
    pub fn leave(&self, pod: &str) {
        if let Some(attached) = self.attached().remove(pod) {
            attached.stop.cancel();
            self.inner.router.detach(pod);
            self.inner.hosts.forget(pod);
            if let Some(plane) = self.inner.planes.remove(pod) {
                plane.shutdown();
            }
        }
    }
}

/// Whether this agent can give replicas of domain tasks their network.
#[derive(Clone, Debug)]
pub enum PodNetwork {
    /// It can (docs/network.md).
    Ready(DomainNet),
    /// It cannot, and why (replicas of domain tasks fail with reason
    /// `DomainNetworkUnavailable` and this message).
    Unavailable(String),
}

impl Default for PodNetwork {
    fn default() -> Self {
        PodNetwork::Unavailable("the agent was started without a pod network".into())
    }
}

/// The addresses `view` gives replica `pod` of `domain`, with the domain's prefix.
fn addresses_in(view: &MembershipView, domain: &str, pod: &str) -> Option<Vec<IpNet>> {
    let d = view.domain(domain)?;
    let prefix = d.cidr.prefix_len();
    let addresses: Vec<IpNet> = view
        .addresses_of(domain, pod)
        .into_iter()
        .filter_map(|ip| IpNet::new(ip, prefix).ok())
        .collect();
    (!addresses.is_empty()).then_some(addresses)
}

/// The name of the namespace of replica `pod` in Task namespace `namespace`, for the agent
/// whose network state lives in `state_dir`:
/// `rlark-<16 hex digits of SHA-256(state_dir NUL namespace/pod)>`. Stable across agent
/// restarts and short enough for any tool that shows it. `/run/netns` is one directory for
/// the whole host, so the agent's own directory is part of the name: two agents on one host
/// (test topologies, or two clusters' agents side by side) that run a replica of the same
/// name never share, unmount or remove each other's namespace.
pub fn netns_name(state_dir: &Path, namespace: &str, pod: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(state_dir.as_os_str().as_encoded_bytes());
    hasher.update([0]);
    hasher.update(format!("{namespace}/{pod}").as_bytes());
    let digest = hasher.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("rlark-{hex}")
}

async fn delete_netns(netns: Arc<ReplicaNetns>) -> Result<(), NetError> {
    match Arc::try_unwrap(netns) {
        Ok(netns) => netns.delete().await,
        // Someone still holds it (a connection being set up): remove it by name.
        Err(shared) => super::netns::remove(shared.name()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_names_are_stable_short_and_distinct() {
        let here = Path::new("/var/lib/rlark/net");
        let a = netns_name(here, "rlark-edge", "rl-actor-0");
        assert_eq!(a, netns_name(here, "rlark-edge", "rl-actor-0"));
        assert_eq!(a.len(), "rlark-".len() + 16);
        assert_ne!(a, netns_name(here, "rlark-edge", "rl-actor-1"));
        assert_ne!(a, netns_name(here, "rlark-cloud", "rl-actor-0"));
        // Another agent's replica of the same name on the same host.
        assert_ne!(
            a,
            netns_name(Path::new("/srv/other/net"), "rlark-edge", "rl-actor-0")
        );
    }
}
