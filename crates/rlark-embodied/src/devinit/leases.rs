//! Auto-picked macvlan addresses: which addresses devinit handed out, to which network
//! namespace, kept in a small JSON state file in the socket directory
//! (`devinit-leases.json`).
//!
//! A macvlan lives in its pod's namespace, where the host cannot list it, so the host side
//! remembers what it handed out. A lease is released when its namespace no longer exists:
//! no process is in it (`/proc/*/ns/net`) and no bind mount keeps it (`/run/netns/*`,
//! `/var/run/netns/*`). Namespaces are told apart by the device and inode of their nsfs file;
//! the kernel may reuse an inode once a namespace is gone, which at worst keeps an address
//! reserved for longer, never hands one out twice. The file is written whole to a temporary
//! file and renamed over the old one, so a crash leaves the old or the new version.

use std::collections::{BTreeSet, HashSet};
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

/// File name of the lease file in the socket directory.
pub const LEASE_FILE: &str = "devinit-leases.json";

/// A network namespace: device and inode of its nsfs file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NetnsId {
    pub dev: u64,
    pub ino: u64,
}

impl NetnsId {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// One address handed out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
    /// Host interface of the macvlan.
    pub parent: String,
    /// Interface name in the namespace.
    pub name: String,
    pub netns: NetnsId,
    /// The process that called Setup (for people reading the file).
    pub pid: i32,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct LeaseFile {
    leases: Vec<Lease>,
}

/// The leases, loaded from and saved to one file.
#[derive(Debug)]
pub struct Leases {
    path: PathBuf,
    leases: Vec<Lease>,
}

impl Leases {
    /// Load `path`; a missing file is no leases.
    pub fn load(path: &Path) -> Result<Self, String> {
        let leases = match std::fs::read(path) {
            Ok(bytes) => {
                serde_json::from_slice::<LeaseFile>(&bytes)
                    .map_err(|e| {
                        format!(
                            "lease file {} is not valid ({e}); remove it to start over (addresses in use may then be handed out again)",
                            path.display()
                        )
                    })?
                    .leases
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("read lease file {}: {e}", path.display())),
        };
        Ok(Self {
            path: path.to_path_buf(),
            leases,
        })
    }

    /// Write the leases (temporary file, then rename).
    pub fn save(&self) -> Result<(), String> {
        let text = serde_json::to_vec_pretty(&LeaseFile {
            leases: self.leases.clone(),
        })
        .map_err(|e| format!("encode leases: {e}"))?;
        let temp = self.path.with_extension("json.tmp");
        std::fs::write(&temp, text)
            .and_then(|()| std::fs::rename(&temp, &self.path))
            .map_err(|e| format!("write lease file {}: {e}", self.path.display()))
    }

    /// Drop the leases whose namespace is not in `live`; returns how many.
    pub fn prune(&mut self, live: &HashSet<NetnsId>) -> usize {
        let before = self.leases.len();
        self.leases.retain(|lease| live.contains(&lease.netns));
        before - self.leases.len()
    }

    /// The address leased to interface `name` of namespace `netns`.
    pub fn lease_of(&self, netns: NetnsId, name: &str) -> Option<&Lease> {
        self.leases
            .iter()
            .find(|l| l.netns == netns && l.name == name)
    }

    /// Addresses leased to anything but interface `name` of namespace `netns`.
    pub fn taken_by_others(&self, netns: NetnsId, name: &str) -> BTreeSet<Ipv4Addr> {
        self.leases
            .iter()
            .filter(|l| !(l.netns == netns && l.name == name))
            .map(|l| l.address)
            .collect()
    }

    /// Record (or replace) the lease of interface `lease.name` in `lease.netns`.
    pub fn record(&mut self, lease: Lease) {
        self.leases
            .retain(|l| !(l.netns == lease.netns && l.name == lease.name));
        self.leases.push(lease);
    }

    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }
}

/// The first host address of `network` not in `taken` (lowest first).
pub fn first_free(network: Ipv4Net, taken: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    network.hosts().find(|ip| !taken.contains(ip))
}

/// Every network namespace that exists now, as far as this process can see: those of the
/// processes in `/proc` and those bind-mounted in the usual `ip netns` directories.
pub fn live_namespaces() -> HashSet<NetnsId> {
    let mut live = HashSet::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                && let Ok(meta) = std::fs::metadata(entry.path().join("ns/net"))
            {
                live.insert(NetnsId::of(&meta));
            }
        }
    }
    for dir in ["/run/netns", "/var/run/netns"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if let Ok(meta) = std::fs::metadata(entry.path()) {
                    live.insert(NetnsId::of(&meta));
                }
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(address: &str, name: &str, ino: u64) -> Lease {
        Lease {
            address: address.parse().unwrap(),
            prefix_len: 24,
            parent: "eth1".into(),
            name: name.into(),
            netns: NetnsId { dev: 4, ino },
            pid: 1,
        }
    }

    #[test]
    fn first_free_skips_taken_and_reserved_addresses() {
        let net: Ipv4Net = "192.0.2.0/29".parse().unwrap();
        let mut taken = BTreeSet::new();
        assert_eq!(first_free(net, &taken), Some("192.0.2.1".parse().unwrap()));
        taken.extend(
            ["192.0.2.1", "192.0.2.2", "192.0.2.4"].map(|a| a.parse::<Ipv4Addr>().unwrap()),
        );
        assert_eq!(first_free(net, &taken), Some("192.0.2.3".parse().unwrap()));
        taken.extend(
            ["192.0.2.3", "192.0.2.5", "192.0.2.6"].map(|a| a.parse::<Ipv4Addr>().unwrap()),
        );
        // .0 is the network and .7 the broadcast address: nothing is left.
        assert_eq!(first_free(net, &taken), None);
    }

    #[test]
    fn leases_round_trip_prune_and_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LEASE_FILE);
        let mut leases = Leases::load(&path).unwrap();
        assert!(leases.leases().is_empty());
        leases.record(lease("192.0.2.2", "robot0", 10));
        leases.record(lease("192.0.2.3", "robot0", 11));
        leases.record(lease("192.0.2.4", "robot0", 10));
        leases.save().unwrap();

        let mut leases = Leases::load(&path).unwrap();
        assert_eq!(leases.leases().len(), 2, "{leases:?}");
        let ns10 = NetnsId { dev: 4, ino: 10 };
        assert_eq!(
            leases.lease_of(ns10, "robot0").map(|l| l.address),
            Some("192.0.2.4".parse().unwrap())
        );
        assert_eq!(
            leases.taken_by_others(ns10, "robot0"),
            BTreeSet::from(["192.0.2.3".parse().unwrap()])
        );
        assert_eq!(leases.prune(&HashSet::from([ns10])), 1);
        assert_eq!(leases.leases().len(), 1);

        std::fs::write(&path, "{not json").unwrap();
        let error = Leases::load(&path).unwrap_err();
        assert!(error.contains("is not valid"), "{error}");
    }

    #[test]
    fn this_process_namespace_is_live() {
        let own = NetnsId::of(&std::fs::metadata("/proc/self/ns/net").unwrap());
        assert!(live_namespaces().contains(&own));
    }
}
