//! The pod network on the agent's side (docs/network.md). This crate owns the whole of it:
//! the pure core (checked packet views, membership, routes and the relay decision) and the
//! IO around it (network namespaces, nftables, TUN devices, the userspace TCP stack, the
//! direct mTLS path, the membership watch). It must not depend on the agent (rlark-agent),
//! the server or any runtime: the agent fills [`start::PodNetConfig`] and gets back what its
//! Task worker uses ([`replica::PodNetwork`], [`replica::ReplicaNetwork`]).
//!
//! Each replica of a domain task runs in a network namespace of its own holding its virtual
//! IP ([`netns`]), TCP flows out of it are redirected by nftables to the agent ([`nft`],
//! kernel mode) or terminated by a userspace TCP stack behind the namespace's TUN device
//! ([`stack`], tun mode), and UDP/ICMP reach the agent through that TUN device ([`tun`]),
//! where the [`datagram`] plane reads them (checked packet views in [`packet`]). The
//! agent's view of the domains ([`membership`]) drives the [`router`] (local, direct or
//! relayed), the [`direct`] mTLS path between agents and the destination side
//! ([`inbound`]); [`splice`] moves kernel mode's local and egress bytes without copying
//! them; [`metrics`] counts it all. [`replica`] ties one replica's pieces together for the
//! agent's Task worker, [`hosts`] renders its `/etc/hosts`, [`hosts_files`] keeps every
//! replica's file current, and [`start`] starts it all.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod datagram;
pub mod direct;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod hosts;
pub mod hosts_files;
pub mod inbound;
pub mod membership;
pub mod metrics;
pub mod netns;
pub mod nft;
pub mod packet;
pub mod pods;
pub mod replica;
pub mod revocations;
pub mod router;
pub mod splice;
pub mod stack;
pub mod start;
pub mod tun;
