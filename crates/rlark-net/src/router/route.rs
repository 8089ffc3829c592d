//! The route decision, pure: a destination's member and the memory of failed direct dials
//! give local, direct, relay or egress, or the refusal.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use rlark_tunnel::header::Status;
use tokio::time::Instant;

use super::{DIRECT_BACKOFF_INITIAL, DIRECT_BACKOFF_MAX};
use crate::membership::{Member, MembershipView};
use crate::metrics::PathKind;

/// Which peer agents are relay-only for now, after direct failures. Pure: the caller passes
/// the time.
#[derive(Debug, Default)]
pub struct DirectMemory {
    peers: HashMap<String, Backoff>,
}

#[derive(Debug, Clone, Copy)]
struct Backoff {
    until: Instant,
    period: Duration,
}

impl DirectMemory {
    /// Whether a direct attempt to `address` may be made at `now`.
    pub fn allows(&self, address: &str, now: Instant) -> bool {
        self.peers.get(address).is_none_or(|b| now >= b.until)
    }

    /// A direct attempt to `address` failed at `now`; returns the relay-only period now in
    /// force. A failure during a relay-only period (a connection that started before it)
    /// does not lengthen it; a failed retry after it doubles it.
    pub fn failed(&mut self, address: &str, now: Instant) -> Duration {
        let period = match self.peers.get(address) {
            None => DIRECT_BACKOFF_INITIAL,
            Some(b) if now < b.until => return b.period,
            Some(b) => (b.period * 2).min(DIRECT_BACKOFF_MAX),
        };
        self.peers.insert(
            address.to_string(),
            Backoff {
                until: now + period,
                period,
            },
        );
        period
    }

    /// A direct connection to `address` worked: forget its failures.
    pub fn succeeded(&mut self, address: &str) {
        self.peers.remove(address);
    }
}

/// Where a destination goes (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// A member on this agent: pod name.
    Local { pod: String },
    /// A member of another agent with a usable direct address.
    Direct { address: String, cluster: String },
    /// A member of another agent, through the hub.
    Relay { cluster: String },
    /// Not a domain address: dial from the agent's namespace.
    Egress,
    /// An address of the domain's range that no member holds.
    NoMember,
}

/// The route of a connection from a replica of `domain` to `destination`.
pub fn route(
    view: &MembershipView,
    domain: &str,
    destination: IpAddr,
    memory: &DirectMemory,
    now: Instant,
) -> Route {
    if destination.is_loopback() {
        return Route::Egress;
    }
    let Some(view) = view.domain(domain) else {
        return Route::Egress;
    };
    if !view.cidr.contains(&destination) {
        return Route::Egress;
    }
    match view.members.get(&destination) {
        None => Route::NoMember,
        Some(member) => member_route(member, memory, now),
    }
}

fn member_route(member: &Member, memory: &DirectMemory, now: Instant) -> Route {
    if member.local {
        return Route::Local {
            pod: member.pod.clone(),
        };
    }
    match &member.agent_address {
        Some(address) if memory.allows(address, now) => Route::Direct {
            address: address.clone(),
            cluster: member.cluster.clone(),
        },
        _ => Route::Relay {
            cluster: member.cluster.clone(),
        },
    }
}

/// What `net check` measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    pub path: PathKind,
    /// From the start of the attempt to the destination's `Ok` (TCP connected, or the probe
    /// authorized), including a failed direct attempt before a relay.
    pub setup: Duration,
}

/// Why a check, or a datagram flow, could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("pod {pod} is not attached to the pod network on this agent")]
    UnknownPod { pod: String },
    #[error("{to} is not in domain {domain}'s range {cidr}")]
    NotInDomain {
        to: IpAddr,
        domain: String,
        cidr: String,
    },
    #[error("no member of domain {domain} has the address {to}")]
    NoMember { to: IpAddr, domain: String },
    #[error("pod {pod} has no {family} address in domain {domain}{why}")]
    NoAddress {
        pod: String,
        domain: String,
        family: &'static str,
        why: String,
    },
    #[error("{path} path: {status}: {message}")]
    Failed {
        path: PathKind,
        status: Status,
        message: String,
    },
    #[error("{reason}")]
    Unavailable { reason: String },
    #[error("pod {pod} does not hold {address} in domain {domain}: flow dropped")]
    Spoofed {
        pod: String,
        address: IpAddr,
        domain: String,
    },
}
