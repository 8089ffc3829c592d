//! The TUN device of a replica's network namespace (`rlark0`): the namespace's default
//! routes point at it, so every IP packet a task sends to a non-local address that nftables
//! did not redirect (UDP, ICMP; all of it in tun mode) is read here by the agent, and every
//! packet the agent writes here is delivered into the namespace as if it had arrived on a
//! wire.
//!
//! The device is opened through tun-rs (its ioctls behind a safe API; this workspace denies
//! unsafe code) with `IFF_TUN | IFF_NO_PI` (bare IP packets, no packet-information prefix)
//! and made persistent (`TUNSETPERSIST`), so it outlives the agent process: a restarted
//! agent re-opens it by name ([`Tun::open_in_current_namespace`] on a thread inside the
//! namespace) and the namespace's addresses and routes, which belong to the device, are
//! still there.

use std::fmt;
use std::io;

/// The name of the TUN device inside every replica namespace.
pub const TUN_NAME: &str = "rlark0";

/// The device's MTU: large, so datagrams up to 64 KiB cross it whole (nothing here is a
/// real wire).
pub const TUN_MTU: u16 = 65000;

/// An open TUN device: one IP packet per [`recv`](Self::recv) and [`send`](Self::send).
/// Usable from several tasks at once (share it as `Arc<Tun>`): reads and writes are
/// nonblocking on tokio's reactor.
pub struct Tun {
    device: tun_rs::AsyncDevice,
    name: String,
    mtu: u16,
}

impl fmt::Debug for Tun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tun")
            .field("name", &self.name)
            .field("mtu", &self.mtu)
            .finish()
    }
}

impl Tun {
    /// Create (or, if a persistent device of that name exists, re-open) TUN device `name` in
    /// the network namespace of the CALLING THREAD, set it persistent, its MTU to `mtu` and
    /// up. Must run inside a tokio runtime context (the descriptor is registered with the
    /// reactor).
    pub fn open_in_current_namespace(name: &str, mtu: u16) -> io::Result<Self> {
        let device = tun_rs::DeviceBuilder::new()
            .name(name)
            .mtu(mtu)
            .enable(true)
            .build_async()?;
        // Persistent: the device (and the addresses and routes on it) survives the agent.
        device.persist()?;
        Ok(Self {
            device,
            name: name.to_string(),
            mtu,
        })
    }

    /// The device's name (`rlark0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's MTU: the largest packet [`send`](Self::send) accepts and
    /// [`recv`](Self::recv) returns; size receive buffers to it.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// Wait for the next IP packet the namespace sent through the device and copy it into
    /// `buf` (one whole packet; a packet longer than `buf` is cut to `buf.len()`). Returns
    /// its length.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.device.recv(buf).await
    }

    /// Deliver one IP packet (IPv4 or IPv6, no prefix) into the namespace. An error when the
    /// kernel refuses it (e.g. `EINVAL` for bytes that are not an IP packet) or takes less
    /// than the whole packet.
    pub async fn send(&self, packet: &[u8]) -> io::Result<()> {
        let written = self.device.send(packet).await?;
        if written != packet.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "{} took {written} of a {}-byte packet",
                    self.name,
                    packet.len()
                ),
            ));
        }
        Ok(())
    }
}
