//! What the pod network's namespace tests (`netns`, `net_router`, `net_tun`, `datagram`,
//! and rlark-agent's `netns`) share: the check that this machine can run them, and a guard
//! that deletes a test's namespace whatever the test did. The including test file declares `mod missing_tool;` first.

use std::path::Path;
use std::process::{Command, Stdio};

/// True when this machine can create replica namespaces (root, `/dev/net/tun`, and `nft`
/// when `nft` is set); else reports why (skip, or fail under `scripts/test.sh`/CI).
pub fn supported(nft: bool) -> bool {
    if !nix::unistd::geteuid().is_root() {
        super::missing_tool::skip_or_fail("not root: network namespaces need CAP_SYS_ADMIN");
        return false;
    }
    if !Path::new("/dev/net/tun").exists() {
        super::missing_tool::skip_or_fail("/dev/net/tun is missing");
        return false;
    }
    if nft && rlark_net::nft::binary().is_none() {
        super::missing_tool::skip_or_fail("nft (package nftables) is not installed");
        return false;
    }
    true
}

/// Deletes namespace `<prefix>-<suffix>-<pid>` when dropped, whatever the test did (and
/// before use: a leftover of an earlier run with the same pid would be adopted, not
/// created).
pub struct Guard(pub String);

impl Guard {
    pub fn new(prefix: &str, suffix: &str) -> Self {
        let name = format!("{prefix}-{suffix}-{}", std::process::id());
        delete(&name);
        Guard(name)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        delete(&self.0);
    }
}

fn delete(name: &str) {
    let _ = Command::new("ip")
        .args(["netns", "delete", name])
        .stderr(Stdio::null())
        .status();
}
