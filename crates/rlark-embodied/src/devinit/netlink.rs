//! rtnetlink connections in the host's and in a caller's network namespace, and the few
//! link, address and neighbour operations devinit needs.
//!
//! A netlink socket belongs to the network namespace of the thread that created it, for
//! its whole life. [`Netlink::in_namespace`] creates one on a short-lived `std::thread`
//! that first enters the target namespace with `setns` (which changes only that thread;
//! tokio's workers never switch namespaces); the thread ends right away and the socket keeps
//! talking to the target namespace from the runtime's tasks.

use std::fs::File;
use std::io;
use std::net::{IpAddr, Ipv4Addr};

use futures::TryStreamExt as _;
use ipnet::Ipv4Net;
use nix::sched::CloneFlags;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkInfo, LinkMessage, MacVlanMode};
use rtnetlink::packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState};
use rtnetlink::{Handle, LinkMacVlan, LinkUnspec};
use tokio::task::JoinHandle;

/// What a netlink request failed with: the kernel's errno when it sent one.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NetlinkError {
    /// The errno of the kernel's answer (`EPERM`, `ENODEV`, ...), if it was one.
    pub errno: Option<i32>,
    pub message: String,
}

impl From<rtnetlink::Error> for NetlinkError {
    fn from(error: rtnetlink::Error) -> Self {
        match &error {
            rtnetlink::Error::NetlinkError(message) => {
                let io = message.to_io();
                Self {
                    errno: io.raw_os_error(),
                    message: io.to_string(),
                }
            }
            other => Self {
                errno: None,
                message: other.to_string(),
            },
        }
    }
}

impl From<io::Error> for NetlinkError {
    fn from(error: io::Error) -> Self {
        Self {
            errno: error.raw_os_error(),
            message: error.to_string(),
        }
    }
}

/// A link as devinit looks at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND` (e.g. `macvlan`, `veth`), if the link has one.
    pub kind: Option<String>,
    pub mac: Option<String>,
    pub mtu: Option<u32>,
    pub up: bool,
}

impl Link {
    fn from_message(message: &LinkMessage) -> Self {
        let mut link = Link {
            index: message.header.index,
            name: String::new(),
            kind: None,
            mac: None,
            mtu: None,
            up: message.header.flags.contains(LinkFlags::Up),
        };
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::IfName(name) => link.name = name.clone(),
                LinkAttribute::Mtu(mtu) => link.mtu = Some(*mtu),
                LinkAttribute::Address(bytes) => {
                    link.mac = Some(
                        bytes
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<Vec<_>>()
                            .join(":"),
                    );
                }
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = Some(kind.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }

    pub fn is_macvlan(&self) -> bool {
        self.kind.as_deref() == Some("macvlan")
    }
}

/// An rtnetlink connection bound to one network namespace; its connection task ends when
/// it is dropped.
pub struct Netlink {
    handle: Handle,
    task: JoinHandle<()>,
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const ENODEV: i32 = nix::errno::Errno::ENODEV as i32;

impl Netlink {
    /// A connection in this process's network namespace (the host's, for devinit).
    pub fn here() -> Result<Self, NetlinkError> {
        let (connection, handle, _) = rtnetlink::new_connection()?;
        Ok(Self {
            handle,
            task: tokio::spawn(connection),
        })
    }

    /// A connection in the network namespace `namespace` (an open `/proc/PID/ns/net`).
    pub async fn in_namespace(namespace: &File) -> Result<Self, NetlinkError> {
        let namespace = namespace.try_clone()?;
        let runtime = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // setns changes the calling thread only: a thread of its own, never a tokio worker.
        std::thread::Builder::new()
            .name("devinit-netns".into())
            .spawn(move || {
                let result = nix::sched::setns(&namespace, CloneFlags::CLONE_NEWNET)
                    .map_err(|e| NetlinkError {
                        errno: Some(e as i32),
                        message: format!("enter the network namespace: {e}"),
                    })
                    .and_then(|()| {
                        // The socket is made here, in the target namespace; registering it
                        // with the runtime's reactor needs the runtime's context.
                        let _context = runtime.enter();
                        rtnetlink::new_connection().map_err(NetlinkError::from)
                    });
                let _ = tx.send(result);
            })?;
        let (connection, handle, _) = rx.await.map_err(|_| NetlinkError {
            errno: None,
            message: "the namespace thread ended without an answer".into(),
        })??;
        Ok(Self {
            handle,
            task: tokio::spawn(connection),
        })
    }

    /// The link named `name`, if there is one.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut links = self.handle.link().get().match_name(name).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.as_ref().map(Link::from_message)),
            Err(e) => {
                let e = NetlinkError::from(e);
                if e.errno == Some(ENODEV) {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// The link with index `index`, if there is one.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut links = self.handle.link().get().match_index(index).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.as_ref().map(Link::from_message)),
            Err(e) => {
                let e = NetlinkError::from(e);
                if e.errno == Some(ENODEV) {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Every IPv4 address of the namespace: (link index, address with prefix).
    pub async fn ipv4_addresses(&self) -> Result<Vec<(u32, Ipv4Net)>, NetlinkError> {
        let messages: Vec<_> = self.handle.address().get().execute().try_collect().await?;
        let mut addresses = Vec::new();
        for message in messages {
            // IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on
            // point-to-point links, so LOCAL wins when both are there.
            let mut found = None;
            for attribute in &message.attributes {
                match attribute {
                    AddressAttribute::Local(IpAddr::V4(ip)) => found = Some(*ip),
                    AddressAttribute::Address(IpAddr::V4(ip)) if found.is_none() => {
                        found = Some(*ip)
                    }
                    _ => {}
                }
            }
            if let Some(ip) = found
                && let Ok(net) = Ipv4Net::new(ip, message.header.prefix_len)
            {
                addresses.push((message.header.index, net));
            }
        }
        Ok(addresses)
    }

    /// IPv4 neighbours of link `index` the kernel has seen answer (ARP): every entry except
    /// those still resolving or failed.
    pub async fn live_ipv4_neighbours(&self, index: u32) -> Result<Vec<Ipv4Addr>, NetlinkError> {
        let messages: Vec<_> = self
            .handle
            .neighbours()
            .get()
            .set_address_family(AddressFamily::Inet)
            .execute()
            .try_collect()
            .await?;
        Ok(messages
            .iter()
            .filter(|m| m.header.ifindex == index)
            .filter(|m| {
                !matches!(
                    m.header.state,
                    NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None
                )
            })
            .flat_map(|m| m.attributes.iter())
            .filter_map(|a| match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
                _ => None,
            })
            .collect())
    }

    /// Create a bridge-mode macvlan `name` on link `parent` (down; `mtu` if set).
    pub async fn add_macvlan(
        &self,
        name: &str,
        parent: u32,
        mtu: Option<u32>,
    ) -> Result<(), NetlinkError> {
        let mut builder = LinkMacVlan::new(name, parent, MacVlanMode::Bridge);
        if let Some(mtu) = mtu {
            builder = builder.mtu(mtu);
        }
        self.handle.link().add(builder.build()).execute().await?;
        Ok(())
    }

    /// Move link `index` into the network namespace `namespace` (an open namespace file).
    pub async fn move_to(&self, index: u32, namespace: &File) -> Result<(), NetlinkError> {
        use std::os::fd::AsRawFd as _;
        let message = LinkUnspec::new_with_index(index)
            .setns_by_fd(namespace.as_raw_fd())
            .build();
        self.handle.link().set(message).execute().await?;
        Ok(())
    }

    /// Rename link `index`.
    pub async fn rename(&self, index: u32, name: &str) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).name(name).build();
        self.handle.link().set(message).execute().await?;
        Ok(())
    }

    /// Add an IPv4 address to link `index`.
    pub async fn add_address(&self, index: u32, address: Ipv4Net) -> Result<(), NetlinkError> {
        self.handle
            .address()
            .add(index, IpAddr::V4(address.addr()), address.prefix_len())
            .execute()
            .await?;
        Ok(())
    }

    /// Bring link `index` up.
    pub async fn set_up(&self, index: u32) -> Result<(), NetlinkError> {
        let message = LinkUnspec::new_with_index(index).up().build();
        self.handle.link().set(message).execute().await?;
        Ok(())
    }

    /// Delete link `index`.
    pub async fn delete(&self, index: u32) -> Result<(), NetlinkError> {
        self.handle.link().del(index).execute().await?;
        Ok(())
    }
}
