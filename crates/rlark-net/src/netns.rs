//! Per-replica network namespaces: the virtual IP of a domain replica lives in a namespace
//! of its own, which the agent creates, configures, reaches into and deletes.
//!
//! # A replica's namespace
//!
//! ```text
//!  /run/netns/<name>  (bind mount of the namespace, as `ip netns add` makes it)
//! ┌──────────────────────────────────────────────────────────────────────────────┐
//! │ task process                                                                 │
//! │   │ connect(10.88.0.9:8080)          sendto(10.88.0.9:53) / ping             │
//! │   ▼                                  ▼                                       │
//! │ nft table inet rlark (kernel mode):  routes: default dev rlark0 (v4 and v6)  │
//! │   own IPs → return                   │                                       │
//! │   tcp to non-loopback → REDIRECT     ▼                                       │
//! │   127.0.0.1:<passthrough> → REDIRECT rlark0  TUN, 10.88.0.2/16, fd00:88::2/64│
//! │   │                                  │   (IFF_TUN|IFF_NO_PI, persistent)     │
//! │   ▼                                  │                                       │
//! │ lo: 127.0.0.1:15001 / [::1]:15001    │                                       │
//! │   listener socket owned by the agent │ fd owned by the agent ([`Tun`])       │
//! └───┼──────────────────────────────────┼───────────────────────────────────────┘
//!     ▼ accept + SO_ORIGINAL_DST         ▼ recv/send IP packets
//!   agent: router (local / direct / relay)   agent: datagram plane (UDP, ICMP)
//! ```
//!
//! In tun mode there is no nft table: TCP reaches `rlark0` too and a userspace stack in the
//! agent terminates it.
//!
//! # Why TUN
//!
//! The namespace needs an interface to hold its addresses and a default route that ends at
//! the agent. This kernel has no `dummy` link type, and a veth pair would put the replica on
//! an L2 segment shared with the host; a TUN device gives exactly an interface whose "wire"
//! is a file descriptor the agent reads, which is also what UDP and ICMP need.
//!
//! # Why a thread per namespace
//!
//! A socket (TCP, netlink) belongs to the network namespace of the thread that created it,
//! for its whole life, and `setns` changes only the calling thread. Each [`ReplicaNetns`]
//! therefore keeps one plain `std::thread` that entered the namespace once (or created it
//! with `unshare`) and makes sockets, the rtnetlink connection and the TUN descriptor on
//! request; tokio's workers never switch namespaces. Once made, those descriptors are used
//! from any task. `nft` is spawned from that thread too: a child inherits its namespace.
//!
//! # What survives an agent restart
//!
//! The namespace (bind-mounted at `/run/netns/<name>`), the persistent `rlark0` device with
//! its addresses and routes, the nft table, and the replica processes in it. The agent's
//! sockets (the redirect listener) and the TUN descriptor die with the agent; a new agent
//! calls [`ReplicaNetns::create`] with the same spec, which adopts the namespace, re-opens
//! `rlark0` by name and re-applies addresses, routes and rules (so a changed spec wins).
//!
//! Links, addresses and routes are set over rtnetlink (no `ip` binary at run time); the nft
//! table is applied with `nft -f -` ([`super::nft`]).

use std::fs::{File, OpenOptions};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use futures::TryStreamExt as _;
use ipnet::IpNet;
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use super::nft;
pub use super::tun::{TUN_MTU, TUN_NAME, Tun};

/// Where named network namespaces are bind-mounted (the `ip netns` convention, so `ip netns
/// exec <name>` works on them too).
pub const NETNS_DIR: &str = "/run/netns";

/// The agent's redirect listener port inside every namespace (kernel mode).
pub const DEFAULT_REDIRECT_PORT: u16 = 15001;

/// Longest a namespace name may be (a file name under [`NETNS_DIR`]).
pub const MAX_NAME_LEN: usize = 128;

/// How TCP leaving a replica's namespace is terminated by the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// nftables REDIRECTs each TCP connection to the agent's listener in the namespace;
    /// kernel TCP end to end.
    Kernel,
    /// No netfilter: every packet reaches the TUN device and a userspace stack in the
    /// agent terminates TCP.
    Tun,
}

impl Mode {
    /// `kernel` or `tun`, as in `Node.status.network.mode` and `--net-mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Tun => "tun",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    /// `kernel` or `tun` (`--net-mode`).
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "kernel" => Ok(Mode::Kernel),
            "tun" => Ok(Mode::Tun),
            other => Err(format!(
                "network mode {other:?}: expected \"kernel\" or \"tun\""
            )),
        }
    }
}

/// What a replica's namespace must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetnsSpec {
    /// The namespace's name: `/run/netns/<name>`. Derived by the caller; letters, digits,
    /// `.`, `_`, `-`, at most [`MAX_NAME_LEN`], not starting with `.`.
    pub name: String,
    /// The replica's virtual IPs with the domain's prefix length (IPv4 and/or IPv6); at
    /// least one.
    pub addresses: Vec<IpNet>,
    pub mode: Mode,
    /// Where nftables sends TCP (kernel mode): `127.0.0.1:<port>` / `[::1]:<port>`.
    pub redirect_port: u16,
    /// Host-loopback TCP ports a task may reach as `127.0.0.1:<port>` (the control plane's
    /// port): redirected to the agent too (kernel mode), which connects to the host's
    /// loopback on the task's behalf.
    pub loopback_passthrough: Vec<u16>,
}

impl NetnsSpec {
    /// Check the spec; the error names the field and the problem.
    pub fn validate(&self) -> Result<(), NetError> {
        let invalid = |message: String| Err(NetError::InvalidSpec(message));
        let name = &self.name;
        if name.is_empty() {
            return invalid("name: must not be empty".into());
        }
        if name.len() > MAX_NAME_LEN {
            return invalid(format!(
                "name {name:?}: {} characters, at most {MAX_NAME_LEN}",
                name.len()
            ));
        }
        if name.starts_with('.') {
            return invalid(format!("name {name:?}: must not start with '.'"));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return invalid(format!(
                "name {name:?}: character {c:?} (letters, digits, '.', '_', '-' only)"
            ));
        }
        if self.addresses.is_empty() {
            return invalid(format!(
                "addresses of {name:?}: at least one virtual IP is needed"
            ));
        }
        for (i, address) in self.addresses.iter().enumerate() {
            let ip = address.addr();
            if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
                return invalid(format!(
                    "addresses[{i}] of {name:?}: {address} is not a unicast host address"
                ));
            }
            if self.addresses[..i].iter().any(|a| a.addr() == ip) {
                return invalid(format!("addresses[{i}] of {name:?}: {ip} is listed twice"));
            }
        }
        if self.mode == Mode::Kernel && self.redirect_port == 0 {
            return invalid(format!("redirect_port of {name:?}: must not be 0"));
        }
        for (i, &port) in self.loopback_passthrough.iter().enumerate() {
            if port == 0 || port == self.redirect_port {
                return invalid(format!(
                    "loopback_passthrough[{i}] of {name:?}: port {port} (must be neither 0 \
                     nor the redirect port)"
                ));
            }
        }
        Ok(())
    }
}

/// What setting up, reaching or deleting a namespace failed with; each names the namespace,
/// the step and the kernel's (or nft's) message.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("invalid network namespace spec: {0}")]
    InvalidSpec(String),
    #[error("network namespace {name}: {step}: {source}")]
    Namespace {
        name: String,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("network namespace {name}: {step}: {message}")]
    Netlink {
        name: String,
        step: String,
        message: String,
    },
    #[error("network namespace {name}: TUN device {device}: {source}")]
    Tun {
        name: String,
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("network namespace {name}: nftables: {message}")]
    Nft { name: String, message: String },
}

fn netlink_message(error: &rtnetlink::Error) -> (Option<i32>, String) {
    match error {
        rtnetlink::Error::NetlinkError(message) => {
            let io = message.to_io();
            (io.raw_os_error(), io.to_string())
        }
        other => (None, other.to_string()),
    }
}

/// A replica's network namespace, set up as its [`NetnsSpec`] says. Dropping it leaves the
/// namespace in place (an agent that exits keeps its replicas running); [`delete`](Self::delete)
/// removes it.
pub struct ReplicaNetns {
    name: String,
    path: PathBuf,
    thread: NsThread,
    tun: Arc<Tun>,
}

impl std::fmt::Debug for ReplicaNetns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaNetns")
            .field("name", &self.name)
            .field("path", &self.path)
            .finish()
    }
}

impl ReplicaNetns {
    /// Create the namespace `spec.name`, or adopt an existing one of that name (an agent
    /// restart), and make it match `spec`: `lo` up; TUN `rlark0` up with exactly
    /// `spec.addresses`; default routes (IPv4 and IPv6) through `rlark0`; in kernel mode the
    /// nft table ([`nft::ruleset`]), in tun mode none. A namespace this call created is
    /// removed again if a later step fails.
    pub async fn create(spec: &NetnsSpec) -> Result<Self, NetError> {
        spec.validate()?;
        let name = spec.name.clone();
        let path = Path::new(NETNS_DIR).join(&name);
        let (thread, created) = open_or_create(&name, &path).await?;
        let runtime = tokio::runtime::Handle::current();
        let tun = thread
            .run(move || {
                let _context = runtime.enter();
                Tun::open_in_current_namespace(TUN_NAME, TUN_MTU)
            })
            .await
            .and_then(|opened| opened)
            .map_err(|source| NetError::Tun {
                name: name.clone(),
                device: TUN_NAME.into(),
                source,
            });
        let tun = match tun {
            Ok(tun) => Arc::new(tun),
            Err(e) => {
                if created {
                    drop(thread);
                    let _ = unmount_and_remove(&name, &path).await;
                }
                return Err(e);
            }
        };
        let netns = ReplicaNetns {
            name,
            path,
            thread,
            tun,
        };
        match netns.configure(spec).await {
            Ok(()) => {
                tracing::info!(
                    netns = %netns.name,
                    adopted = !created,
                    mode = spec.mode.as_str(),
                    addresses = ?spec.addresses,
                    "replica network namespace ready"
                );
                Ok(netns)
            }
            Err(e) => {
                if created {
                    let _ = netns.delete().await;
                }
                Err(e)
            }
        }
    }

    /// Make the namespace match `spec` again (addresses, routes, nft table), keeping its
    /// TUN descriptor: for a changed spec (e.g. new `loopback_passthrough` ports) while this
    /// handle lives. [`create`](Self::create) does the same on adopt, but re-opens the TUN
    /// device, which fails (`EBUSY`) while another handle in this process still holds it:
    /// keep one `ReplicaNetns` per namespace. `spec.name` must be this namespace's.
    pub async fn apply(&self, spec: &NetnsSpec) -> Result<(), NetError> {
        spec.validate()?;
        if spec.name != self.name {
            return Err(NetError::InvalidSpec(format!(
                "name {:?}: this handle is namespace {:?}",
                spec.name, self.name
            )));
        }
        self.configure(spec).await
    }

    async fn configure(&self, spec: &NetnsSpec) -> Result<(), NetError> {
        let netlink = self.netlink().await?;
        let step_error = |step: &str, error: rtnetlink::Error| {
            let (_, message) = netlink_message(&error);
            NetError::Netlink {
                name: self.name.clone(),
                step: step.to_string(),
                message,
            }
        };
        // Loopback up: the redirect listener and the task's own 127.0.0.1 live on it.
        let lo = netlink
            .link_index("lo")
            .await
            .map_err(|e| step_error("find lo", e))?
            .ok_or_else(|| NetError::Netlink {
                name: self.name.clone(),
                step: "find lo".into(),
                message: "no loopback device".into(),
            })?;
        netlink
            .handle
            .link()
            .set(LinkUnspec::new_with_index(lo).up().build())
            .execute()
            .await
            .map_err(|e| step_error("set lo up", e))?;
        let tun = netlink
            .link_index(TUN_NAME)
            .await
            .map_err(|e| step_error("find rlark0", e))?
            .ok_or_else(|| NetError::Netlink {
                name: self.name.clone(),
                step: format!("find {TUN_NAME}"),
                message: "the TUN device is not there after opening it".into(),
            })?;
        netlink
            .handle
            .link()
            .set(LinkUnspec::new_with_index(tun).up().build())
            .execute()
            .await
            .map_err(|e| step_error("set rlark0 up", e))?;

        // Addresses: exactly the spec's (link-local IPv6 addresses are the kernel's).
        let present: Vec<AddressMessage> = netlink
            .handle
            .address()
            .get()
            .set_link_index_filter(tun)
            .execute()
            .try_collect()
            .await
            .map_err(|e| step_error("list rlark0 addresses", e))?;
        let mut kept = Vec::new();
        for message in present {
            let Some(net) = address_of(&message) else {
                continue;
            };
            if let IpAddr::V6(v6) = net.addr()
                && v6.is_unicast_link_local()
            {
                continue;
            }
            if spec.addresses.contains(&net) {
                kept.push(net);
            } else {
                netlink
                    .handle
                    .address()
                    .del(message)
                    .execute()
                    .await
                    .map_err(|e| step_error(&format!("remove stale address {net}"), e))?;
            }
        }
        for address in &spec.addresses {
            if kept.contains(address) {
                continue;
            }
            let mut request =
                netlink
                    .handle
                    .address()
                    .add(tun, address.addr(), address.prefix_len());
            // No duplicate address detection: nothing else is on this "link", and a
            // tentative IPv6 address could not be bound for a second or more.
            request
                .message_mut()
                .attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
            request
                .execute()
                .await
                .map_err(|e| step_error(&format!("add address {address}"), e))?;
        }

        // Default routes through the TUN device, both families: UDP and ICMP to any
        // non-loopback address reach the agent. Replace: idempotent on adopt.
        let v4 = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(tun)
            .scope(RouteScope::Link)
            .build();
        netlink
            .handle
            .route()
            .add(v4)
            .replace()
            .execute()
            .await
            .map_err(|e| step_error("add the IPv4 default route", e))?;
        let v6 = RouteMessageBuilder::<Ipv6Addr>::new()
            .output_interface(tun)
            .build();
        netlink
            .handle
            .route()
            .add(v6)
            .replace()
            .execute()
            .await
            .map_err(|e| step_error("add the IPv6 default route", e))?;

        self.apply_nft(spec).await
    }

    async fn apply_nft(&self, spec: &NetnsSpec) -> Result<(), NetError> {
        let nft_error = |message: String| NetError::Nft {
            name: self.name.clone(),
            message,
        };
        match spec.mode {
            Mode::Kernel => {
                let binary = nft::binary().ok_or_else(|| {
                    nft_error(
                        "`nft` (package nftables) is not installed; kernel mode needs it".into(),
                    )
                })?;
                let own: Vec<IpAddr> = spec.addresses.iter().map(IpNet::addr).collect();
                let script = nft::ruleset(&own, spec.redirect_port, &spec.loopback_passthrough);
                self.thread
                    .run(move || nft::apply(&binary, &script))
                    .await
                    .map_err(|e| nft_error(e.to_string()))?
                    .map_err(nft_error)
            }
            Mode::Tun => {
                // A namespace adopted from a kernel-mode agent may still hold the table; a
                // host without nft never had one.
                if let Some(binary) = nft::binary() {
                    let result = self
                        .thread
                        .run(move || nft::apply(&binary, &nft::remove_script()))
                        .await;
                    if let Ok(Err(message)) | Err(message) = result.map_err(|e| e.to_string()) {
                        tracing::debug!(netns = %self.name, %message, "no nft table removed");
                    }
                }
                Ok(())
            }
        }
    }

    /// An rtnetlink connection inside the namespace.
    async fn netlink(&self) -> Result<Netlink, NetError> {
        Self::netlink_of(&self.name, &self.thread).await
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what `setns` (the supervisor's `--netns`) opens.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A TCP listener on `addr` whose socket was made inside the namespace (e.g. the
    /// redirect listener on `127.0.0.1:15001`). `SO_REUSEADDR` is set, so a restarted agent
    /// binds again at once.
    pub async fn listen(&self, addr: SocketAddr) -> io::Result<TcpListener> {
        let socket = self
            .thread
            .run(move || -> io::Result<TcpSocket> {
                let socket = if addr.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                socket.set_reuseaddr(true)?;
                socket.bind(addr)?;
                Ok(socket)
            })
            .await??;
        socket.listen(1024)
    }

    /// A TCP connection to `addr` from a socket made inside the namespace (e.g. the local
    /// path to the replica's own virtual IP). `TimedOut` after `timeout`.
    pub async fn connect(&self, addr: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let socket = self
            .thread
            .run(move || -> io::Result<TcpSocket> {
                if addr.is_ipv4() {
                    TcpSocket::new_v4()
                } else {
                    TcpSocket::new_v6()
                }
            })
            .await??;
        match tokio::time::timeout(timeout, socket.connect(addr)).await {
            Ok(connected) => connected,
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {addr} in {} took over {timeout:?}", self.name),
            )),
        }
    }

    /// The namespace's TUN device (`rlark0`); clone the `Arc` to read and write it from
    /// several tasks.
    pub fn tun(&self) -> &Arc<Tun> {
        &self.tun
    }

    /// Remove the namespace: delete `rlark0` (a persistent device would otherwise stay
    /// until the namespace itself is freed, which waits for the last socket in it), then
    /// unmount and remove `/run/netns/<name>`. Processes still in the namespace keep it
    /// alive until they end, without an address. Other holders of [`tun`](Self::tun) see
    /// errors from then on.
    pub async fn delete(self) -> Result<(), NetError> {
        let ReplicaNetns {
            name,
            path,
            thread,
            tun,
        } = self;
        drop(tun);
        {
            let netlink = ReplicaNetns::netlink_of(&name, &thread).await?;
            match netlink.link_index(TUN_NAME).await {
                Ok(Some(index)) => {
                    if let Err(e) = netlink.handle.link().del(index).execute().await {
                        let (_, message) = netlink_message(&e);
                        return Err(NetError::Netlink {
                            name,
                            step: format!("delete {TUN_NAME}"),
                            message,
                        });
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let (_, message) = netlink_message(&e);
                    return Err(NetError::Netlink {
                        name,
                        step: format!("find {TUN_NAME}"),
                        message,
                    });
                }
            }
        }
        drop(thread);
        unmount_and_remove(&name, &path).await?;
        tracing::info!(netns = %name, "replica network namespace deleted");
        Ok(())
    }

    async fn netlink_of(name: &str, thread: &NsThread) -> Result<Netlink, NetError> {
        let runtime = tokio::runtime::Handle::current();
        let (connection, handle, _) = thread
            .run(move || {
                let _context = runtime.enter();
                rtnetlink::new_connection()
            })
            .await
            .and_then(|made| made)
            .map_err(|source| NetError::Namespace {
                name: name.to_string(),
                step: "open an rtnetlink socket inside",
                source,
            })?;
        Ok(Netlink {
            handle,
            task: tokio::spawn(connection),
        })
    }
}

/// Remove the namespace `name` without adopting it (a replica that is gone while the agent
/// was down): unmount and remove `/run/netns/<name>`; its devices go with it. Not an error
/// when there is no such namespace.
pub async fn remove(name: &str) -> Result<(), NetError> {
    let path = Path::new(NETNS_DIR).join(name);
    unmount_and_remove(name, &path).await
}

/// The names of the namespaces under `/run/netns` that start with `prefix` (for an agent
/// that looks for namespaces of replicas that no longer exist).
pub fn existing(prefix: &str) -> io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(name) = name.to_str()
            && name.starts_with(prefix)
        {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Replace the contents of `path` keeping its inode (truncate, then write; created when
/// missing): a file bind-mounted elsewhere — a replica's `/etc/hosts` — shows the new
/// contents, where a rename would leave the mount on the old inode. A reader can see the
/// file empty or half-written for the moment the write takes.
pub fn rewrite_in_place(path: &Path, contents: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)?;
    file.write_all(contents)?;
    file.flush()
}

/// The original destination of a connection that nftables REDIRECTed to a listener
/// (`SO_ORIGINAL_DST` / `IP6T_SO_ORIGINAL_DST`, by the family of the accepted socket). An
/// unredirected connection gives its own local address (conntrack's original tuple), or
/// `ENOENT` where conntrack does not track it.
pub fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    match stream.local_addr()? {
        SocketAddr::V4(_) => rustix::net::sockopt::ip_original_dst(stream)
            .map(SocketAddr::V4)
            .map_err(io::Error::from),
        SocketAddr::V6(_) => rustix::net::sockopt::ipv6_original_dst(stream)
            .map(SocketAddr::V6)
            .map_err(io::Error::from),
    }
}

/// Can this host run kernel mode? Creates a throwaway kernel-mode namespace, listens on its
/// redirect port, connects from inside it to an address of its own subnet and checks that
/// the connection arrived redirected with the right original destination; then deletes the
/// namespace. The error says which step failed (no `nft`, no nf_tables/nat support, no TUN,
/// not permitted, ...).
pub async fn probe_netfilter() -> Result<(), String> {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "rlarkprobe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let spec = NetnsSpec {
        name,
        // 198.18.0.0/15 is for benchmarks; nothing leaves this namespace anyway.
        addresses: vec![
            "198.18.0.2/15"
                .parse()
                .map_err(|e| format!("198.18.0.2/15: {e}"))?,
        ],
        mode: Mode::Kernel,
        redirect_port: DEFAULT_REDIRECT_PORT,
        loopback_passthrough: Vec::new(),
    };
    let netns = ReplicaNetns::create(&spec)
        .await
        .map_err(|e| e.to_string())?;
    let target = SocketAddr::from((Ipv4Addr::new(198, 18, 0, 9), 9));
    let checked = tokio::time::timeout(Duration::from_secs(5), async {
        let listener = netns
            .listen(SocketAddr::from((Ipv4Addr::LOCALHOST, spec.redirect_port)))
            .await
            .map_err(|e| format!("listen on the redirect port: {e}"))?;
        let (connected, accepted) = tokio::join!(
            netns.connect(target, Duration::from_secs(2)),
            listener.accept()
        );
        connected.map_err(|e| format!("connect to {target} (not redirected?): {e}"))?;
        let (stream, _) = accepted.map_err(|e| format!("accept: {e}"))?;
        let original =
            original_destination(&stream).map_err(|e| format!("SO_ORIGINAL_DST: {e}"))?;
        if original == target {
            Ok(())
        } else {
            Err(format!(
                "SO_ORIGINAL_DST gave {original}, the connection went to {target}"
            ))
        }
    })
    .await
    .unwrap_or_else(|_| Err("the redirect check took over 5 s".into()));
    let deleted = netns.delete().await.map_err(|e| e.to_string());
    checked.map_err(|e| format!("netfilter REDIRECT check: {e}"))?;
    deleted
}

/// Can this host run tun mode? Creates a throwaway tun-mode namespace (its TUN device
/// `rlark0` with an address and the default routes, no nft table), then deletes it. The
/// error says which step failed (no `/dev/net/tun`, not permitted, ...).
pub async fn probe_tun() -> Result<(), String> {
    static PROBES: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "rlarkprobetun-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    let spec = NetnsSpec {
        name,
        addresses: vec![
            "198.18.0.2/15"
                .parse()
                .map_err(|e| format!("198.18.0.2/15: {e}"))?,
        ],
        mode: Mode::Tun,
        redirect_port: DEFAULT_REDIRECT_PORT,
        loopback_passthrough: Vec::new(),
    };
    let netns = ReplicaNetns::create(&spec)
        .await
        .map_err(|e| format!("TUN check: {e}"))?;
    netns.delete().await.map_err(|e| e.to_string())
}

/// An rtnetlink connection bound to one namespace; its task ends when it is dropped.
struct Netlink {
    handle: Handle,
    task: JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const ENODEV: i32 = Errno::ENODEV as i32;

impl Netlink {
    async fn link_index(&self, name: &str) -> Result<Option<u32>, rtnetlink::Error> {
        let mut links = self.handle.link().get().match_name(name).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(e) => {
                let (errno, _) = netlink_message(&e);
                if errno == Some(ENODEV) {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }
}

/// The address (with prefix) an rtnetlink address message describes: `IFA_LOCAL` when
/// present (`IFA_ADDRESS` is the peer on point-to-point links).
fn address_of(message: &AddressMessage) -> Option<IpNet> {
    let mut found = None;
    for attribute in &message.attributes {
        match attribute {
            AddressAttribute::Local(ip) => found = Some(*ip),
            AddressAttribute::Address(ip) if found.is_none() => found = Some(*ip),
            _ => {}
        }
    }
    found.and_then(|ip| IpNet::new(ip, message.header.prefix_len).ok())
}

// ---- namespace files and the namespace thread ----

type Job = Box<dyn FnOnce() + Send>;

/// A `std::thread` living inside one network namespace, running closures on request. It
/// ends when the `NsThread` is dropped.
struct NsThread {
    jobs: Mutex<mpsc::Sender<Job>>,
}

enum Enter {
    /// `setns` into this namespace file.
    Existing(File),
    /// `unshare` a new namespace and bind-mount it on this (existing, empty) file.
    Create(PathBuf),
}

impl NsThread {
    async fn start(label: &str, enter: Enter) -> io::Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<io::Result<()>>();
        std::thread::Builder::new()
            .name(format!("netns {label}"))
            .spawn(move || {
                // Both change only this thread's network namespace.
                let entered = match enter {
                    Enter::Existing(file) => nix::sched::setns(&file, CloneFlags::CLONE_NEWNET)
                        .map_err(|e| io::Error::other(format!("setns: {e}"))),
                    Enter::Create(path) => nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                        .map_err(|e| io::Error::other(format!("unshare: {e}")))
                        .and_then(|()| {
                            nix::mount::mount(
                                Some("/proc/thread-self/ns/net"),
                                &path,
                                None::<&str>,
                                MsFlags::MS_BIND,
                                None::<&str>,
                            )
                            .map_err(|e| {
                                io::Error::other(format!("bind-mount on {}: {e}", path.display()))
                            })
                        }),
                };
                let ok = entered.is_ok();
                let _ = ready_tx.send(entered);
                if ok {
                    while let Ok(job) = queue.recv() {
                        job();
                    }
                }
            })?;
        ready_rx
            .await
            .map_err(|_| io::Error::other("the namespace thread ended without an answer"))??;
        Ok(Self {
            jobs: Mutex::new(jobs),
        })
    }

    /// Run `f` on the namespace thread and return what it returned.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs
            .lock()
            .map_err(|_| io::Error::other("the namespace thread's queue is poisoned"))?
            .send(job)
            .map_err(|_| io::Error::other("the namespace thread has ended"))?;
        rx.await
            .map_err(|_| io::Error::other("the namespace thread ended without an answer"))
    }
}

/// Serializes making `/run/netns` a shared mount point within this process.
static NETNS_DIR_LOCK: Mutex<()> = Mutex::new(());

/// `/run/netns` exists and is a shared mount point, as `ip netns add` leaves it: namespace
/// mounts made later propagate into mount namespaces copied from this one (the supervisor's)
/// and so do their unmounts.
fn prepare_netns_dir() -> io::Result<()> {
    let _guard = NETNS_DIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = Path::new(NETNS_DIR);
    std::fs::create_dir_all(dir)?;
    let share = || {
        nix::mount::mount(
            None::<&str>,
            dir,
            Some("none"),
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match share() {
        Ok(()) => Ok(()),
        // Not a mount point yet: bind it on itself, then share it.
        Err(Errno::EINVAL) => {
            nix::mount::mount(
                Some(dir),
                dir,
                Some("none"),
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(io::Error::from)?;
            share().map_err(io::Error::from)
        }
        Err(e) => Err(e.into()),
    }
}

/// Enter the namespace at `path`, or create it there. Returns the thread and whether the
/// namespace was created by this call.
async fn open_or_create(name: &str, path: &Path) -> Result<(NsThread, bool), NetError> {
    let error = |step: &'static str| {
        let name = name.to_string();
        move |source: io::Error| NetError::Namespace { name, step, source }
    };
    tokio::task::spawn_blocking(prepare_netns_dir)
        .await
        .map_err(io::Error::other)
        .and_then(|r| r)
        .map_err(error("prepare /run/netns"))?;
    match File::open(path) {
        Ok(file) => match NsThread::start(name, Enter::Existing(file)).await {
            Ok(thread) => return Ok((thread, false)),
            // A file that is not a namespace (an interrupted create): start over.
            Err(e) => {
                tracing::warn!(netns = %name, error = %e, "not a network namespace; recreating it");
                let _ = nix::mount::umount2(path, MntFlags::MNT_DETACH);
                std::fs::remove_file(path).map_err(error("remove a stale namespace file"))?;
            }
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(error("open the namespace file")(e)),
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)
        .map_err(error("create the namespace file"))?;
    match NsThread::start(name, Enter::Create(path.to_path_buf())).await {
        Ok(thread) => Ok((thread, true)),
        Err(e) => {
            let _ = std::fs::remove_file(path);
            Err(error("create the namespace")(e))
        }
    }
}

/// Unmount (lazily: replicas may still be in it) and remove `/run/netns/<name>`; nothing
/// there is not an error.
async fn unmount_and_remove(name: &str, path: &Path) -> Result<(), NetError> {
    let path = path.to_path_buf();
    let result = tokio::task::spawn_blocking(move || -> io::Result<()> {
        match nix::mount::umount2(&path, MntFlags::MNT_DETACH) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io::Error::other(format!("unmount: {e}"))),
        }
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    })
    .await
    .map_err(io::Error::other)
    .and_then(|r| r);
    result.map_err(|source| NetError::Namespace {
        name: name.to_string(),
        step: "remove the namespace",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_shareable_between_tasks() {
        fn shareable<T: Send + Sync + 'static>() {}
        shareable::<ReplicaNetns>();
        shareable::<Tun>();
        shareable::<NetError>();
    }

    #[test]
    fn modes_parse_and_print() {
        for mode in [Mode::Kernel, Mode::Tun] {
            assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        }
        let error = "iptables".parse::<Mode>().expect_err("unknown mode");
        assert!(
            error.contains("\"iptables\"") && error.contains("kernel"),
            "{error}"
        );
    }

    fn spec() -> NetnsSpec {
        NetnsSpec {
            name: "h16netns-unit".into(),
            addresses: vec!["10.88.0.2/16".parse().unwrap()],
            mode: Mode::Kernel,
            redirect_port: DEFAULT_REDIRECT_PORT,
            loopback_passthrough: vec![6443],
        }
    }

    #[test]
    fn spec_validation_names_the_field() {
        assert!(spec().validate().is_ok());
        type Change = Box<dyn Fn(&mut NetnsSpec)>;
        let cases: Vec<(Change, &str)> = vec![
            (Box::new(|s| s.name.clear()), "name: must not be empty"),
            (Box::new(|s| s.name = "a/b".into()), "character '/'"),
            (
                Box::new(|s| s.name = ".x".into()),
                "must not start with '.'",
            ),
            (Box::new(|s| s.name = "x".repeat(129)), "at most 128"),
            (Box::new(|s| s.addresses.clear()), "at least one virtual IP"),
            (
                Box::new(|s| s.addresses.push("10.88.0.2/24".parse().unwrap())),
                "addresses[1]",
            ),
            (
                Box::new(|s| s.addresses = vec!["127.0.0.2/8".parse().unwrap()]),
                "not a unicast host address",
            ),
            (Box::new(|s| s.redirect_port = 0), "redirect_port"),
            (
                Box::new(|s| s.loopback_passthrough = vec![15001]),
                "loopback_passthrough[0]",
            ),
        ];
        for (change, expected) in cases {
            let mut s = spec();
            change(&mut s);
            let error = s.validate().expect_err(expected).to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
        let mut tun_mode = spec();
        tun_mode.mode = Mode::Tun;
        tun_mode.redirect_port = 0;
        tun_mode.loopback_passthrough.clear();
        assert!(
            tun_mode.validate().is_ok(),
            "tun mode needs no redirect port"
        );
    }
}
