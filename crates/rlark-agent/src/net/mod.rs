//! The pod network on the agent's side (docs/network.md): each replica of a domain task runs
//! in a network namespace of its own holding its virtual IP ([`netns`]), TCP flows out of it
//! are redirected by nftables to the agent ([`nft`], kernel mode) or terminated by a
//! userspace TCP stack behind the namespace's TUN device ([`stack`], tun mode), and UDP/ICMP
//! reach the agent through that TUN device ([`tun`]), where the [`datagram`] plane reads
//! them (checked packet views in [`packet`]). The agent's view of the domains ([`membership`]) drives the
//! [`router`] (local, direct or relayed), the [`direct`] mTLS path between agents and the
//! destination side ([`inbound`]); [`splice`] moves kernel mode's local and egress bytes
//! without copying them; [`metrics`] counts it all. [`replica`] ties one replica's
//! pieces together for the Task worker, and [`hosts`] renders its `/etc/hosts`.

pub mod datagram;
pub mod direct;
pub mod hosts;
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
