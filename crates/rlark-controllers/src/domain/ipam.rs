//! Address management of a Domain, sans IO: from the Domain's CIDR, its current
//! `status.ipAllocations`, the replicas that should hold an address and the time, compute
//! the new allocation list and the replicas left without an address ([`allocate`]).
//!
//! # Rules
//!
//! - Usable addresses: IPv4 skips the network and broadcast addresses (a /31 or /32 has
//!   none to skip, RFC 3021); IPv6 skips the subnet-router anycast address (the all-zero
//!   host; a /127 or /128 has none to skip), as
//!   [`rlark_api::validation::usable_addresses`] counts them.
//! - An allocation is keyed by (job, task, replica index): a replica that restarts or is
//!   placed on another cluster keeps its address (its `cluster` and `pod` are updated).
//! - A replica no longer wanted (its Task deleted, or its index ≥ the Task's replicas) is
//!   *released*: its entry stays, with `releasedAt`, so the replica gets the same address
//!   if it comes back. A released entry is dropped after [`RELEASE_TTL`], and at most
//!   [`MAX_RELEASED`] are kept (the most recently released ones).
//! - A new replica gets the lowest address never handed out (not in the list); only when
//!   none is left does it take over a released reservation, the longest-released first.
//! - Entries that are not addresses of the CIDR (unparseable, outside it, or a skipped
//!   address) and later duplicates of an address or a key are dropped.
//!
//! The pool is never enumerated: finding the lowest free address walks the sorted set of
//! addresses in use, so an IPv6 /64 costs what its allocations cost.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rlark_api::types::DomainIpAllocation;

/// How long a released address stays reserved for the replica that held it.
pub const RELEASE_TTL: Duration = Duration::from_secs(3600);
/// Most released reservations a Domain keeps.
pub const MAX_RELEASED: usize = 256;

/// The key of an allocation: job, Task name (`<job>-<template>`), replica index.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaKey {
    /// Job of the Task (empty for a Task no Job owns).
    pub job: String,
    /// Task name.
    pub task: String,
    /// Replica index.
    pub index: i32,
}

/// A replica that should hold an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub key: ReplicaKey,
    /// Cluster ID it is placed on.
    pub cluster: String,
    /// `<agentNamespace>/<task>-<i>`.
    pub pod: String,
}

/// What [`allocate`] decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// The new `status.ipAllocations`, ordered by address.
    pub allocations: Vec<DomainIpAllocation>,
    /// Replicas that got no address (the pool is full), in key order.
    pub unallocated: Vec<Replica>,
}

impl Allocation {
    /// Addresses held by live (not released) replicas.
    pub fn live(&self) -> usize {
        self.allocations
            .iter()
            .filter(|a| a.released_at.is_none())
            .count()
    }
}

/// The usable address range of `net` as integers (first, last), both inclusive.
pub fn usable_range(net: &IpNet) -> (u128, u128) {
    let (network, last, host_bits, v4) = match net {
        IpNet::V4(n) => (
            u128::from(u32::from(n.network())),
            u128::from(u32::from(n.broadcast())),
            32 - u32::from(n.prefix_len()),
            true,
        ),
        IpNet::V6(n) => (
            u128::from(n.network()),
            u128::from(n.broadcast()),
            128 - u32::from(n.prefix_len()),
            false,
        ),
    };
    if host_bits <= 1 {
        (network, last)
    } else if v4 {
        (network + 1, last - 1)
    } else {
        (network + 1, last)
    }
}

fn to_int(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn to_ip(net: &IpNet, value: u128) -> IpAddr {
    match net {
        // In range: a value from a v4 range fits 32 bits.
        IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(value as u32)),
        IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

/// The integer of `ip` when it is a usable address of `net`.
fn usable(net: &IpNet, ip: &str) -> Option<u128> {
    let ip: IpAddr = ip.parse().ok()?;
    if !net.contains(&ip) {
        return None;
    }
    let (first, last) = usable_range(net);
    let value = to_int(ip);
    (first..=last).contains(&value).then_some(value)
}

fn key_of(entry: &DomainIpAllocation) -> Option<ReplicaKey> {
    Some(ReplicaKey {
        job: entry.job.clone().unwrap_or_default(),
        task: entry.task.clone().filter(|t| !t.is_empty())?,
        index: entry.index?,
    })
}

/// The lowest value in `from..=last` not in `used`, walking `used` from `from` (pure).
pub fn lowest_free(used: &BTreeSet<u128>, from: u128, last: u128) -> Option<u128> {
    let mut candidate = from;
    for &taken in used.range(from..) {
        if taken > candidate {
            break;
        }
        // taken == candidate (the range starts at `from`, candidates only grow).
        candidate = candidate.checked_add(1)?;
    }
    (candidate <= last).then_some(candidate)
}

/// Compute the allocations of a Domain over `net` (see the module documentation).
/// `desired` may come in any order and with duplicates (the first of a key counts).
pub fn allocate(
    net: &IpNet,
    current: &[DomainIpAllocation],
    desired: &[Replica],
    now: Timestamp,
) -> Allocation {
    let mut wanted: BTreeMap<ReplicaKey, &Replica> = BTreeMap::new();
    for replica in desired {
        wanted.entry(replica.key.clone()).or_insert(replica);
    }
    // Valid current entries, by address; keys seen once.
    let mut entries: BTreeMap<u128, DomainIpAllocation> = BTreeMap::new();
    let mut keys_seen: HashSet<ReplicaKey> = HashSet::new();
    for entry in current {
        let Some(value) = usable(net, &entry.ip) else {
            continue;
        };
        if entries.contains_key(&value) {
            continue;
        }
        let key = key_of(entry);
        if let Some(key) = &key
            && !keys_seen.insert(key.clone())
        {
            continue;
        }
        let mut entry = entry.clone();
        entry.ip = to_ip(net, value).to_string();
        match key.as_ref().and_then(|k| wanted.get(k)) {
            Some(replica) => {
                entry.cluster = Some(replica.cluster.clone());
                entry.pod = Some(replica.pod.clone());
                entry.released_at = None;
            }
            None => {
                if entry.released_at.is_none() {
                    entry.released_at = Some(Time(now));
                }
            }
        }
        entries.insert(value, entry);
    }
    // Expired and over-bound releases go.
    let ttl = i64::try_from(RELEASE_TTL.as_secs()).unwrap_or(i64::MAX);
    entries.retain(|_, e| {
        e.released_at
            .as_ref()
            .is_none_or(|t| now.as_second().saturating_sub(t.0.as_second()) < ttl)
    });
    let mut released: Vec<(Timestamp, u128)> = entries
        .iter()
        .filter_map(|(v, e)| Some((e.released_at.as_ref()?.0, *v)))
        .collect();
    // Oldest release first; ties by address.
    released.sort();
    if released.len() > MAX_RELEASED {
        for (_, value) in released.drain(..released.len() - MAX_RELEASED) {
            entries.remove(&value);
        }
    }
    let held: HashSet<ReplicaKey> = entries
        .values()
        .filter(|e| e.released_at.is_none())
        .filter_map(key_of)
        .collect();
    let (first, last) = usable_range(net);
    let mut used: BTreeSet<u128> = entries.keys().copied().collect();
    let mut cursor = Some(first);
    let mut reusable = released.into_iter().map(|(_, v)| v);
    let mut unallocated = Vec::new();
    for (key, replica) in wanted.iter().filter(|(k, _)| !held.contains(k)) {
        let fresh = cursor.and_then(|from| lowest_free(&used, from, last));
        let value = match fresh {
            Some(value) => {
                cursor = value.checked_add(1);
                Some(value)
            }
            None => {
                cursor = None;
                reusable.next()
            }
        };
        let Some(value) = value else {
            unallocated.push((*replica).clone());
            continue;
        };
        used.insert(value);
        entries.insert(
            value,
            DomainIpAllocation {
                ip: to_ip(net, value).to_string(),
                job: Some(key.job.clone()).filter(|j| !j.is_empty()),
                task: Some(key.task.clone()),
                index: Some(key.index),
                cluster: Some(replica.cluster.clone()),
                pod: Some(replica.pod.clone()),
                released_at: None,
            },
        );
    }
    Allocation {
        allocations: entries.into_values().collect(),
        unallocated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn net(cidr: &str) -> IpNet {
        cidr.parse().unwrap()
    }

    fn replica(task: &str, index: i32, cluster: &str) -> Replica {
        Replica {
            key: ReplicaKey {
                job: "j".into(),
                task: task.into(),
                index,
            },
            cluster: cluster.into(),
            pod: format!("rlark-{cluster}/{task}-{index}"),
        }
    }

    fn ips(a: &Allocation) -> Vec<(&str, &str, Option<i32>, bool)> {
        a.allocations
            .iter()
            .map(|e| {
                (
                    e.ip.as_str(),
                    e.task.as_deref().unwrap_or(""),
                    e.index,
                    e.released_at.is_some(),
                )
            })
            .collect()
    }

    #[test]
    fn usable_ranges_skip_what_they_must() {
        // (cidr, first, last, count)
        let cases: &[(&str, &str, &str, u128)] = &[
            ("10.0.0.0/30", "10.0.0.1", "10.0.0.2", 2),
            ("10.0.0.0/31", "10.0.0.0", "10.0.0.1", 2),
            ("10.0.0.7/32", "10.0.0.7", "10.0.0.7", 1),
            ("10.0.0.0/24", "10.0.0.1", "10.0.0.254", 254),
            ("fd00::/120", "fd00::1", "fd00::ff", 255),
            ("fd00::/127", "fd00::", "fd00::1", 2),
            ("fd00::5/128", "fd00::5", "fd00::5", 1),
            (
                "fd00::/64",
                "fd00::1",
                "fd00::ffff:ffff:ffff:ffff",
                (1u128 << 64) - 1,
            ),
        ];
        for (cidr, first, last, count) in cases {
            let n = net(cidr);
            let (f, l) = usable_range(&n);
            assert_eq!(to_ip(&n, f).to_string(), *first, "{cidr}");
            assert_eq!(to_ip(&n, l).to_string(), *last, "{cidr}");
            assert_eq!(l - f + 1, *count, "{cidr}");
            assert_eq!(
                rlark_api::validation::usable_addresses(&n),
                *count,
                "{cidr}"
            );
        }
    }

    #[test]
    fn lowest_free_walks_the_used_set() {
        let used: BTreeSet<u128> = [1, 2, 3, 5, 9].into();
        // (from, last, expected)
        let cases = [
            (1, 10, Some(4)),
            (0, 10, Some(0)),
            (4, 10, Some(4)),
            (5, 10, Some(6)),
            (9, 10, Some(10)),
            (9, 9, None),
            (1, 3, None),
        ];
        for (from, last, expected) in cases {
            assert_eq!(lowest_free(&used, from, last), expected, "{from}..={last}");
        }
        let full: BTreeSet<u128> = [u128::MAX].into();
        assert_eq!(lowest_free(&full, u128::MAX, u128::MAX), None);
    }

    #[test]
    fn a_slash_30_holds_two_and_then_is_full() {
        let n = net("10.0.0.0/30");
        let desired = [
            replica("t", 0, "a"),
            replica("t", 1, "a"),
            replica("t", 2, "b"),
        ];
        let out = allocate(&n, &[], &desired, ts(0));
        assert_eq!(
            ips(&out),
            [
                ("10.0.0.1", "t", Some(0), false),
                ("10.0.0.2", "t", Some(1), false)
            ]
        );
        assert_eq!(out.unallocated, [replica("t", 2, "b")]);
        assert_eq!(out.live(), 2);
        let e = &out.allocations[0];
        assert_eq!(e.job.as_deref(), Some("j"));
        assert_eq!(e.cluster.as_deref(), Some("a"));
        assert_eq!(e.pod.as_deref(), Some("rlark-a/t-0"));
    }

    #[test]
    fn a_slash_31_uses_both_addresses() {
        let out = allocate(
            &net("10.0.0.0/31"),
            &[],
            &[replica("t", 0, "a"), replica("t", 1, "a")],
            ts(0),
        );
        assert_eq!(
            ips(&out),
            [
                ("10.0.0.0", "t", Some(0), false),
                ("10.0.0.1", "t", Some(1), false)
            ]
        );
        assert!(out.unallocated.is_empty());
    }

    #[test]
    fn an_ipv6_slash_120_skips_the_anycast_address_and_fills_up() {
        let n = net("fd00:88::/120");
        let desired: Vec<Replica> = (0..256).map(|i| replica("w", i, "a")).collect();
        let out = allocate(&n, &[], &desired, ts(0));
        assert_eq!(out.live(), 255);
        assert_eq!(out.allocations[0].ip, "fd00:88::1");
        assert_eq!(out.allocations[254].ip, "fd00:88::ff");
        // Replicas get addresses in key order: index 255 is the one left over.
        assert_eq!(out.unallocated.len(), 1);
        assert_eq!(out.unallocated[0].key.index, 255);
    }

    #[test]
    fn a_huge_ipv6_pool_is_not_enumerated() {
        let n = net("fd00::/8");
        let out = allocate(&n, &[], &[replica("t", 0, "a")], ts(0));
        assert_eq!(out.allocations[0].ip, "fd00::1");
    }

    #[test]
    fn replicas_keep_their_address_when_restarted_or_replaced() {
        let n = net("10.0.0.0/24");
        let first = allocate(
            &n,
            &[],
            &[replica("t", 0, "a"), replica("t", 1, "a")],
            ts(0),
        );
        // Re-placed on cluster b, order of the desired list changed, a new replica added.
        let second = allocate(
            &n,
            &first.allocations,
            &[
                replica("u", 0, "b"),
                replica("t", 1, "b"),
                replica("t", 0, "a"),
            ],
            ts(10),
        );
        assert_eq!(
            ips(&second),
            [
                ("10.0.0.1", "t", Some(0), false),
                ("10.0.0.2", "t", Some(1), false),
                ("10.0.0.3", "u", Some(0), false)
            ]
        );
        assert_eq!(second.allocations[1].cluster.as_deref(), Some("b"));
        assert_eq!(second.allocations[1].pod.as_deref(), Some("rlark-b/t-1"));
        // Idempotent.
        let third = allocate(
            &n,
            &second.allocations,
            &[
                replica("t", 0, "a"),
                replica("t", 1, "b"),
                replica("u", 0, "b"),
            ],
            ts(20),
        );
        assert_eq!(third, second);
    }

    #[test]
    fn released_addresses_are_kept_then_reused_last_then_expire() {
        let n = net("10.0.0.0/29"); // 6 usable: .1 .. .6
        let start = allocate(
            &n,
            &[],
            &[
                replica("t", 0, "a"),
                replica("t", 1, "a"),
                replica("t", 2, "a"),
            ],
            ts(0),
        );
        // t-1 goes away (scaled down): released, not reused by a newcomer while fresh
        // addresses remain.
        let shrunk = allocate(
            &n,
            &start.allocations,
            &[
                replica("t", 0, "a"),
                replica("t", 2, "a"),
                replica("u", 0, "a"),
            ],
            ts(10),
        );
        assert_eq!(
            ips(&shrunk),
            [
                ("10.0.0.1", "t", Some(0), false),
                ("10.0.0.2", "t", Some(1), true),
                ("10.0.0.3", "t", Some(2), false),
                ("10.0.0.4", "u", Some(0), false)
            ]
        );
        assert_eq!(shrunk.allocations[1].released_at, Some(Time(ts(10))));
        // It comes back: same address, released mark cleared.
        let back = allocate(
            &n,
            &shrunk.allocations,
            &[
                replica("t", 0, "a"),
                replica("t", 1, "c"),
                replica("t", 2, "a"),
                replica("u", 0, "a"),
            ],
            ts(20),
        );
        assert_eq!(back.allocations[1].ip, "10.0.0.2");
        assert_eq!(back.allocations[1].released_at, None);
        assert_eq!(back.allocations[1].cluster.as_deref(), Some("c"));
        // Release again; the pool fills: .5 and .6 first, then the released .2.
        let released = allocate(
            &n,
            &back.allocations,
            &[
                replica("t", 0, "a"),
                replica("t", 2, "a"),
                replica("u", 0, "a"),
            ],
            ts(30),
        );
        let full = allocate(
            &n,
            &released.allocations,
            &[
                replica("t", 0, "a"),
                replica("t", 2, "a"),
                replica("u", 0, "a"),
                replica("v", 0, "a"),
                replica("v", 1, "a"),
                replica("v", 2, "a"),
                replica("v", 3, "a"),
            ],
            ts(40),
        );
        assert_eq!(
            ips(&full),
            [
                ("10.0.0.1", "t", Some(0), false),
                ("10.0.0.2", "v", Some(2), false),
                ("10.0.0.3", "t", Some(2), false),
                ("10.0.0.4", "u", Some(0), false),
                ("10.0.0.5", "v", Some(0), false),
                ("10.0.0.6", "v", Some(1), false)
            ]
        );
        assert_eq!(full.unallocated, [replica("v", 3, "a")]);
        // A released reservation expires after the TTL: then it is never-used again.
        let alone = allocate(
            &n,
            &released.allocations,
            &[replica("t", 0, "a")],
            ts(30 + RELEASE_TTL.as_secs() as i64 - 1),
        );
        assert_eq!(alone.allocations.len(), 4, "{:?}", ips(&alone));
        let expired = allocate(
            &n,
            &alone.allocations,
            &[replica("t", 0, "a")],
            ts(30 + RELEASE_TTL.as_secs() as i64),
        );
        // t-1 (released at 30) expired; t-2 and u-0 were released at the previous call.
        assert_eq!(
            ips(&expired),
            [
                ("10.0.0.1", "t", Some(0), false),
                ("10.0.0.3", "t", Some(2), true),
                ("10.0.0.4", "u", Some(0), true)
            ]
        );
    }

    #[test]
    fn released_reservations_are_bounded_keeping_the_newest() {
        let n = net("10.0.0.0/16");
        let many: Vec<Replica> = (0..(MAX_RELEASED as i32 + 10))
            .map(|i| replica("t", i, "a"))
            .collect();
        let mut current = allocate(&n, &[], &many, ts(0)).allocations;
        // Release them one second apart, oldest index first.
        for (i, entry) in current.iter_mut().enumerate() {
            entry.released_at = Some(Time(ts(i as i64)));
        }
        let out = allocate(&n, &current, &[], ts(1000));
        assert_eq!(out.allocations.len(), MAX_RELEASED);
        assert_eq!(out.allocations[0].index, Some(10));
    }

    #[test]
    fn bad_and_duplicate_entries_are_dropped() {
        let n = net("10.0.0.0/29");
        let entry = |ip: &str, task: &str, index: i32| DomainIpAllocation {
            ip: ip.into(),
            job: Some("j".into()),
            task: Some(task.into()),
            index: Some(index),
            ..Default::default()
        };
        let current = [
            entry("not an ip", "a", 0),
            entry("10.0.1.1", "b", 0), // outside
            entry("10.0.0.0", "c", 0), // network address
            entry("10.0.0.7", "d", 0), // broadcast
            entry("10.0.0.3", "t", 0),
            entry("10.0.0.3", "t", 1), // duplicate address
            entry("10.0.0.4", "t", 0), // duplicate key
        ];
        let out = allocate(
            &n,
            &current,
            &[replica("t", 0, "a"), replica("t", 1, "a")],
            ts(0),
        );
        assert_eq!(
            ips(&out),
            [
                ("10.0.0.1", "t", Some(1), false),
                ("10.0.0.3", "t", Some(0), false)
            ]
        );
    }

    #[test]
    fn an_exhausted_pool_reports_every_replica_left_over() {
        let n = net("10.0.0.0/32");
        let out = allocate(
            &n,
            &[],
            &[
                replica("b", 0, "x"),
                replica("a", 1, "x"),
                replica("a", 0, "x"),
            ],
            ts(0),
        );
        assert_eq!(ips(&out), [("10.0.0.0", "a", Some(0), false)]);
        assert_eq!(
            out.unallocated,
            [replica("a", 1, "x"), replica("b", 0, "x")]
        );
    }
}
