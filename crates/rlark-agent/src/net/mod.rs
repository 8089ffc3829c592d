//! The pod network on the agent's side (issue 16): each replica of a domain task runs in a
//! network namespace of its own holding its virtual IP ([`netns`]), TCP flows out of it are
//! redirected by nftables to the agent ([`nft`]), and UDP/ICMP reach the agent through the
//! namespace's TUN device ([`tun`]), where the datagram plane ([`datagram`], over the
//! checked packet views of [`packet`]) carries them.

pub mod datagram;
pub mod netns;
pub mod nft;
pub mod packet;
pub mod tun;
