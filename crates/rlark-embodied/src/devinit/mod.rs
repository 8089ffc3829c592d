//! DeviceService (`device.v1`, RLark's devinit) on `devinit.sock`: `Setup` creates the
//! configured macvlan interfaces (bridge mode) inside the **calling process's** network
//! namespace, so a pod's init container (`rlark devinit setup`) gets L2 access to the
//! robots' network.
//!
//! The caller is the process on the other end of the unix socket (SO_PEERCRED, see
//! [`crate::peer`]); its namespace is `/proc/PID/ns/net`. A caller sharing the host's
//! namespace (a hostNetwork pod) gets `host_network` and nothing is changed. For each
//! configured interface, in order:
//!
//! 1. If the caller's namespace already has an interface of that name, it must be a
//!    macvlan: it is kept (its address added if missing, brought up) and reported in
//!    `skipped` — Setup is idempotent.
//! 2. Otherwise, from the host's namespace: the macvlan is created on the parent under a
//!    temporary name (`rlk…`), moved into the caller's namespace by file descriptor, then —
//!    through a netlink socket opened in the caller's namespace — renamed, given its
//!    address and brought up. A failure after the creation deletes the half-made link.
//!
//! Everything goes through rtnetlink ([`netlink`]); nothing runs `ip`. Auto-picked
//! addresses (`network:`) are the first host address of the network that is not on a host
//! interface, not a neighbour the host has seen on the parent (its ARP cache), not another
//! entry's static address, and not leased to another interface ([`leases`], a state file in
//! the socket directory). Setup calls are served one at a time.

pub mod leases;
pub mod netlink;

use std::collections::BTreeSet;
use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ipnet::Ipv4Net;
use rlark_proto::device::v1::device_service_server::{DeviceService, DeviceServiceServer};
use rlark_proto::device::v1::{InterfaceInfo, SetupRequest, SetupResponse};
use tonic::{Request, Response, Status};

use self::leases::{Lease, Leases, NetnsId};
use self::netlink::{Link, Netlink, NetlinkError};
use crate::config::macvlan::{Addressing, Macvlan};
use crate::peer::PeerInfo;

/// Longest a Setup may take before it is abandoned.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why Setup failed; the text names the interface, the parent and the cause.
#[derive(Debug, thiserror::Error)]
pub enum DevinitError {
    /// The parent interface does not exist (`NotFound`).
    #[error("{0}")]
    NotFound(String),
    /// The runtime lacks the privilege (`PermissionDenied`).
    #[error("{0}")]
    PermissionDenied(String),
    /// Something on the host or in the caller's namespace is in the way
    /// (`FailedPrecondition`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// No free address is left in a network (`ResourceExhausted`).
    #[error("{0}")]
    Exhausted(String),
    /// Anything else (`Internal`).
    #[error("{0}")]
    Internal(String),
}

impl From<DevinitError> for Status {
    fn from(error: DevinitError) -> Self {
        let code = match &error {
            DevinitError::NotFound(_) => tonic::Code::NotFound,
            DevinitError::PermissionDenied(_) => tonic::Code::PermissionDenied,
            DevinitError::FailedPrecondition(_) => tonic::Code::FailedPrecondition,
            DevinitError::Exhausted(_) => tonic::Code::ResourceExhausted,
            DevinitError::Internal(_) => tonic::Code::Internal,
        };
        Status::new(code, error.to_string())
    }
}

const EPERM: i32 = nix::errno::Errno::EPERM as i32;
const EACCES: i32 = nix::errno::Errno::EACCES as i32;
const ENODEV: i32 = nix::errno::Errno::ENODEV as i32;
const EEXIST: i32 = nix::errno::Errno::EEXIST as i32;

/// A netlink failure while doing `what`, as the error the client sees.
fn netlink_error(what: &str, error: NetlinkError) -> DevinitError {
    match error.errno {
        Some(EPERM | EACCES) => DevinitError::PermissionDenied(format!(
            "{what}: {} (devinit needs CAP_NET_ADMIN on the host: run rlark embodied as root)",
            error.message
        )),
        Some(ENODEV) => DevinitError::NotFound(format!("{what}: {}", error.message)),
        Some(EEXIST) => DevinitError::FailedPrecondition(format!("{what}: {}", error.message)),
        _ => DevinitError::Internal(format!("{what}: {}", error.message)),
    }
}

/// The DeviceService behind `devinit.sock`.
pub struct Devinit {
    macvlans: Vec<Macvlan>,
    lease_file: PathBuf,
    /// One Setup at a time: the lease file and temporary names are shared.
    lock: tokio::sync::Mutex<()>,
}

/// Numbers temporary link names within this process.
static TEMP_NAMES: AtomicU32 = AtomicU32::new(0);

impl Devinit {
    /// The service for `macvlans`, keeping its leases in `socket_dir`.
    pub fn new(macvlans: Vec<Macvlan>, socket_dir: &Path) -> Self {
        Self {
            macvlans,
            lease_file: socket_dir.join(leases::LEASE_FILE),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The gRPC server of this service.
    pub fn server(self) -> DeviceServiceServer<DevinitService> {
        DeviceServiceServer::new(DevinitService {
            inner: Arc::new(self),
        })
    }

    /// Setup for process `pid`: create the configured interfaces in its network namespace.
    pub async fn setup(&self, pid: i32) -> Result<SetupResponse, DevinitError> {
        match tokio::time::timeout(SETUP_TIMEOUT, self.setup_inner(pid)).await {
            Ok(result) => result,
            Err(_) => Err(DevinitError::Internal(format!(
                "setup for process {pid} did not finish within {SETUP_TIMEOUT:?}"
            ))),
        }
    }

    async fn setup_inner(&self, pid: i32) -> Result<SetupResponse, DevinitError> {
        let _one_at_a_time = self.lock.lock().await;
        let ns_path = format!("/proc/{pid}/ns/net");
        let target = File::open(&ns_path).map_err(|e| {
            DevinitError::FailedPrecondition(format!(
                "cannot open the network namespace of the calling process {pid} ({ns_path}: {e}); rlark embodied must run in the host's PID namespace (hostPID) and as root"
            ))
        })?;
        let target_id = NetnsId::of(
            &target
                .metadata()
                .map_err(|e| DevinitError::Internal(format!("stat {ns_path}: {e}")))?,
        );
        let host_id = NetnsId::of(
            &std::fs::metadata("/proc/self/ns/net")
                .map_err(|e| DevinitError::Internal(format!("stat /proc/self/ns/net: {e}")))?,
        );
        if target_id == host_id {
            tracing::info!(
                pid,
                "caller shares the host's network namespace: nothing to do"
            );
            return Ok(SetupResponse {
                host_network: true,
                ..Default::default()
            });
        }

        let host =
            Netlink::here().map_err(|e| netlink_error("open netlink in the host namespace", e))?;
        let pod = Netlink::in_namespace(&target).await.map_err(|e| {
            netlink_error(
                &format!("open netlink in the network namespace of process {pid}"),
                e,
            )
        })?;
        let mut leases: Option<Leases> = None;
        let mut response = SetupResponse::default();
        for macvlan in &self.macvlans {
            let ctx = Ctx {
                host: &host,
                pod: &pod,
                target: &target,
                target_id,
                pid,
            };
            let interface = self.ensure(&ctx, macvlan, &mut leases).await?;
            if interface.created {
                response.created.push(interface.name.clone());
            } else {
                response.skipped.push(interface.name.clone());
            }
            response.interfaces.push(interface);
        }
        if let Some(leases) = &leases {
            leases.save().map_err(DevinitError::Internal)?;
        }
        tracing::info!(pid, created = ?response.created, skipped = ?response.skipped, "devinit setup done");
        Ok(response)
    }

    /// The leases, loaded (and pruned of namespaces that are gone) on first use.
    fn leases<'a>(&self, leases: &'a mut Option<Leases>) -> Result<&'a mut Leases, DevinitError> {
        if leases.is_none() {
            let mut loaded = Leases::load(&self.lease_file).map_err(DevinitError::Internal)?;
            let released = loaded.prune(&leases::live_namespaces());
            if released > 0 {
                tracing::info!(
                    released,
                    "released the leases of network namespaces that are gone"
                );
            }
            return Ok(leases.insert(loaded));
        }
        leases
            .as_mut()
            .ok_or_else(|| DevinitError::Internal("the leases were not loaded".into()))
    }

    /// Make one configured interface exist in the caller's namespace.
    async fn ensure(
        &self,
        ctx: &Ctx<'_>,
        macvlan: &Macvlan,
        leases: &mut Option<Leases>,
    ) -> Result<InterfaceInfo, DevinitError> {
        let name = &macvlan.name;
        let addressing = macvlan.addressing().map_err(|(field, message)| {
            DevinitError::FailedPrecondition(format!("macvlan {name}: {field}: {message}"))
        })?;
        let pod_addresses = |index: u32| async move {
            ctx.pod
                .ipv4_addresses()
                .await
                .map(|all| {
                    all.into_iter()
                        .filter(|(i, _)| *i == index)
                        .map(|(_, net)| net)
                        .collect::<Vec<_>>()
                })
                .map_err(|e| {
                    netlink_error(
                        &format!("list the addresses of {name} in the caller's namespace"),
                        e,
                    )
                })
        };

        // 1. Already there: keep it.
        if let Some(link) =
            ctx.pod.link_by_name(name).await.map_err(|e| {
                netlink_error(&format!("look up {name} in the caller's namespace"), e)
            })?
        {
            if !link.is_macvlan() {
                return Err(DevinitError::FailedPrecondition(format!(
                    "interface {name} already exists in the caller's network namespace and is not a macvlan (it is {}); rename or remove it",
                    link.kind
                        .as_deref()
                        .map_or("a plain device".to_string(), |k| format!("a {k}"))
                )));
            }
            let present = pod_addresses(link.index).await?;
            let address = match addressing {
                Addressing::Static(want) => {
                    if !present.contains(&want) {
                        ctx.pod.add_address(link.index, want).await.map_err(|e| {
                            netlink_error(&format!("add address {want} to {name}"), e)
                        })?;
                    }
                    want
                }
                Addressing::Auto(network) => match present
                    .iter()
                    .find(|a| network.contains(&a.addr()))
                {
                    Some(existing) => {
                        let existing = *existing;
                        self.leases(leases)?
                            .record(lease(ctx, macvlan, &macvlan.parent, existing));
                        existing
                    }
                    None => {
                        let parent = self.parent(ctx, macvlan, network).await?;
                        let picked = self.pick(ctx, macvlan, &parent, network, leases).await?;
                        ctx.pod.add_address(link.index, picked).await.map_err(|e| {
                            netlink_error(&format!("add address {picked} to {name}"), e)
                        })?;
                        picked
                    }
                },
            };
            if !link.up {
                ctx.pod
                    .set_up(link.index)
                    .await
                    .map_err(|e| netlink_error(&format!("bring {name} up"), e))?;
            }
            tracing::info!(pid = ctx.pid, interface = %name, %address, "macvlan already present");
            return Ok(info(macvlan, &macvlan.parent, &link, address, false));
        }

        // 2. Create it: on the parent in the host namespace, move, rename, address, up.
        let network = addressing.network();
        let parent = self.parent(ctx, macvlan, network).await?;
        let address = match addressing {
            Addressing::Static(address) => address,
            Addressing::Auto(network) => self.pick(ctx, macvlan, &parent, network, leases).await?,
        };
        let temp = self.create_temp(ctx, macvlan, &parent).await?;
        let moved = ctx.host.move_to(temp.index, ctx.target).await;
        if let Err(e) = moved {
            let _ = ctx.host.delete(temp.index).await;
            return Err(netlink_error(
                &format!(
                    "move macvlan {name} (parent {}) into the caller's network namespace",
                    parent.name
                ),
                e,
            ));
        }
        match self.finish(ctx, macvlan, &temp.name, address).await {
            Ok(link) => {
                if matches!(addressing, Addressing::Auto(_)) {
                    self.leases(leases)?
                        .record(lease(ctx, macvlan, &parent.name, address));
                }
                tracing::info!(pid = ctx.pid, interface = %name, parent = %parent.name, %address, "macvlan created");
                Ok(info(macvlan, &parent.name, &link, address, true))
            }
            Err((index, error)) => {
                if let Some(index) = index {
                    let _ = ctx.pod.delete(index).await;
                }
                Err(error)
            }
        }
    }

    /// The parent link in the host namespace: the configured one, or the one host interface
    /// with an address in `network`.
    async fn parent(
        &self,
        ctx: &Ctx<'_>,
        macvlan: &Macvlan,
        network: Ipv4Net,
    ) -> Result<Link, DevinitError> {
        let name = &macvlan.name;
        if !macvlan.parent.is_empty() {
            return ctx
                .host
                .link_by_name(&macvlan.parent)
                .await
                .map_err(|e| netlink_error(&format!("look up parent {} of macvlan {name}", macvlan.parent), e))?
                .ok_or_else(|| {
                    DevinitError::NotFound(format!(
                        "parent interface {} of macvlan {name} does not exist in the host's network namespace",
                        macvlan.parent
                    ))
                });
        }
        let addresses = ctx
            .host
            .ipv4_addresses()
            .await
            .map_err(|e| netlink_error("list the host's addresses", e))?;
        let indexes: BTreeSet<u32> = addresses
            .iter()
            .filter(|(_, net)| network.contains(&net.addr()))
            .map(|(index, _)| *index)
            .collect();
        let mut candidates = Vec::new();
        for index in indexes {
            if let Some(link) = ctx
                .host
                .link_by_index(index)
                .await
                .map_err(|e| netlink_error("look up a host interface", e))?
            {
                candidates.push(link);
            }
        }
        match candidates.len() {
            1 => Ok(candidates.remove(0)),
            0 => Err(DevinitError::NotFound(format!(
                "macvlan {name} has no parent set and no host interface has an address in {network}: set macvlans[].parent"
            ))),
            _ => Err(DevinitError::FailedPrecondition(format!(
                "macvlan {name} has no parent set and several host interfaces have an address in {network} ({}): set macvlans[].parent",
                candidates
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// The first free address of `network` for this interface (its earlier lease if that
    /// is still free).
    async fn pick(
        &self,
        ctx: &Ctx<'_>,
        macvlan: &Macvlan,
        parent: &Link,
        network: Ipv4Net,
        leases: &mut Option<Leases>,
    ) -> Result<Ipv4Net, DevinitError> {
        let name = &macvlan.name;
        let mut taken: BTreeSet<Ipv4Addr> = BTreeSet::new();
        let host_addresses = ctx
            .host
            .ipv4_addresses()
            .await
            .map_err(|e| netlink_error("list the host's addresses", e))?;
        taken.extend(host_addresses.iter().map(|(_, net)| net.addr()));
        let neighbours = ctx
            .host
            .live_ipv4_neighbours(parent.index)
            .await
            .map_err(|e| netlink_error(&format!("list the neighbours on {}", parent.name), e))?;
        taken.extend(neighbours);
        taken.extend(self.macvlans.iter().filter_map(|m| match m.addressing() {
            Ok(Addressing::Static(net)) => Some(net.addr()),
            _ => None,
        }));
        let leases = self.leases(leases)?;
        taken.extend(leases.taken_by_others(ctx.target_id, name));
        let previous = leases
            .lease_of(ctx.target_id, name)
            .map(|l| l.address)
            .filter(|a| network.contains(a) && !taken.contains(a));
        let address = previous
            .or_else(|| leases::first_free(network, &taken))
            .ok_or_else(|| {
                DevinitError::Exhausted(format!(
                    "no free address left in {network} for macvlan {name} on {} ({} in use or leased)",
                    parent.name,
                    taken.iter().filter(|a| network.contains(*a)).count()
                ))
            })?;
        Ipv4Net::new(address, network.prefix_len())
            .map_err(|e| DevinitError::Internal(format!("{address}/{}: {e}", network.prefix_len())))
    }

    /// Create the macvlan on `parent` in the host namespace under a temporary name.
    async fn create_temp(
        &self,
        ctx: &Ctx<'_>,
        macvlan: &Macvlan,
        parent: &Link,
    ) -> Result<Link, DevinitError> {
        let name = &macvlan.name;
        let what = || format!("create macvlan {name} on {}", parent.name);
        // A name left by a crashed run (or another process) is skipped; a few tries suffice.
        for _ in 0..8 {
            let temp = format!(
                "rlk{:05x}{:04x}",
                std::process::id() & 0xf_ffff,
                TEMP_NAMES.fetch_add(1, Ordering::Relaxed) & 0xffff
            );
            match ctx.host.add_macvlan(&temp, parent.index, macvlan.mtu).await {
                Ok(()) => {}
                Err(e) if e.errno == Some(EEXIST) => continue,
                Err(e) => return Err(netlink_error(&what(), e)),
            }
            return ctx
                .host
                .link_by_name(&temp)
                .await
                .map_err(|e| netlink_error(&what(), e))?
                .ok_or_else(|| {
                    DevinitError::Internal(format!("{}: the new link {temp} vanished", what()))
                });
        }
        Err(DevinitError::Internal(format!(
            "{}: no free temporary name",
            what()
        )))
    }

    /// In the caller's namespace: rename the moved link, add its address, bring it up.
    /// On failure, the link's index there (if found) for clean-up, and the error.
    async fn finish(
        &self,
        ctx: &Ctx<'_>,
        macvlan: &Macvlan,
        temp: &str,
        address: Ipv4Net,
    ) -> Result<Link, (Option<u32>, DevinitError)> {
        let name = &macvlan.name;
        let link = ctx
            .pod
            .link_by_name(temp)
            .await
            .map_err(|e| {
                (
                    None,
                    netlink_error(&format!("find macvlan {name} in the caller's namespace"), e),
                )
            })?
            .ok_or_else(|| {
                (
                    None,
                    DevinitError::Internal(format!(
                        "macvlan {name} ({temp}) is not in the caller's namespace after the move"
                    )),
                )
            })?;
        let index = link.index;
        let fail = |what: String| move |e| (Some(index), netlink_error(&what, e));
        ctx.pod.rename(index, name).await.map_err(fail(format!(
            "rename macvlan {temp} to {name} in the caller's namespace"
        )))?;
        ctx.pod
            .add_address(index, address)
            .await
            .map_err(fail(format!("add address {address} to {name}")))?;
        ctx.pod
            .set_up(index)
            .await
            .map_err(fail(format!("bring {name} up")))?;
        ctx.pod
            .link_by_index(index)
            .await
            .map_err(fail(format!("read back {name}")))?
            .ok_or_else(|| {
                (
                    None,
                    DevinitError::Internal(format!(
                        "macvlan {name} vanished from the caller's namespace"
                    )),
                )
            })
    }
}

/// The namespaces and caller of one Setup.
struct Ctx<'a> {
    host: &'a Netlink,
    pod: &'a Netlink,
    target: &'a File,
    target_id: NetnsId,
    pid: i32,
}

fn lease(ctx: &Ctx<'_>, macvlan: &Macvlan, parent: &str, address: Ipv4Net) -> Lease {
    Lease {
        address: address.addr(),
        prefix_len: address.prefix_len(),
        parent: parent.to_string(),
        name: macvlan.name.clone(),
        netns: ctx.target_id,
        pid: ctx.pid,
    }
}

fn info(
    macvlan: &Macvlan,
    parent: &str,
    link: &Link,
    address: Ipv4Net,
    created: bool,
) -> InterfaceInfo {
    InterfaceInfo {
        name: macvlan.name.clone(),
        parent: parent.to_string(),
        address: address.to_string(),
        mac: link.mac.clone().unwrap_or_default(),
        mtu: link.mtu.unwrap_or(0),
        created,
    }
}

/// The tonic service: Setup for the peer process of the connection.
pub struct DevinitService {
    inner: Arc<Devinit>,
}

#[tonic::async_trait]
impl DeviceService for DevinitService {
    async fn setup(
        &self,
        request: Request<SetupRequest>,
    ) -> Result<Response<SetupResponse>, Status> {
        let pid = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|p| p.pid)
            .filter(|pid| *pid > 0)
            .ok_or_else(|| {
                Status::failed_precondition(
                    "the calling process is unknown (no peer credentials on the connection, or it is in a PID namespace this runtime cannot see: run rlark embodied with hostPID)",
                )
            })?;
        match self.inner.setup(pid).await {
            Ok(response) => Ok(Response::new(response)),
            Err(error) => {
                tracing::warn!(pid, error = %error, "devinit setup failed");
                Err(error.into())
            }
        }
    }
}
