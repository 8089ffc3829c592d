//! The `/etc/hosts` a replica of a domain task sees: the host's own file with a managed
//! block naming every member of the domain, bind-mounted over `/etc/hosts` in the
//! replica's mount namespace (the supervisor does that, `--hosts FILE`).
//!
//! Each member gets one line, `<ip> <pod>.<domain> <pod>.rlark-domain`, where `<pod>` is
//! `<task>-<i>`: the first is rlark's name (what `RLARK_HEAD_ADDRESS` holds), the second
//! RLark's spelling, so RLark's Ray scripts (`$(hostname).rlark-domain`, `<head>-0.rlark-domain`)
//! resolve unchanged. The block is rewritten in place whenever the membership changes
//! ([`super::netns::rewrite_in_place`]), so the bind mount shows it.

use std::fmt::Write as _;
use std::net::IpAddr;

/// First line of the managed block.
pub const BEGIN: &str = "# BEGIN rlark domain";
/// Last line of the managed block.
pub const END: &str = "# END rlark domain";
/// RLark's domain suffix, resolved beside rlark's `<domain>`.
pub const RLARK_SUFFIX: &str = "rlark-domain";

/// One member of the domain as the hosts file names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostEntry {
    /// `<task>-<i>`.
    pub pod: String,
    /// Its virtual IP.
    pub ip: IpAddr,
}

/// The hosts file of a replica of `domain`: `base` (the host's `/etc/hosts`) without any
/// managed block it may hold, then the block listing `members` sorted by name (then IP).
pub fn render(base: &str, domain: &str, members: &[HostEntry]) -> String {
    let mut out = strip_block(base);
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    let mut sorted: Vec<&HostEntry> = members.iter().collect();
    sorted.sort();
    let _ = writeln!(out, "{BEGIN} {domain}");
    for m in sorted {
        let _ = writeln!(out, "{} {}.{domain} {}.{RLARK_SUFFIX}", m.ip, m.pod, m.pod);
    }
    let _ = writeln!(out, "{END}");
    out
}

/// `text` without the lines of a managed block (from a [`BEGIN`] line to the next
/// [`END`] line, both included; an unterminated block runs to the end).
fn strip_block(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for line in text.lines() {
        if !inside && line.starts_with(BEGIN) {
            inside = true;
            continue;
        }
        if inside {
            if line.starts_with(END) {
                inside = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pod: &str, ip: &str) -> HostEntry {
        HostEntry {
            pod: pod.into(),
            ip: ip.parse().unwrap(),
        }
    }

    #[test]
    fn block_lists_members_sorted_with_both_spellings() {
        let base = "127.0.0.1 localhost\n::1 localhost\n";
        let text = render(
            base,
            "net1",
            &[
                entry("rl-worker-0", "10.88.0.2"),
                entry("rl-head-0", "10.88.0.1"),
            ],
        );
        assert_eq!(
            text,
            "127.0.0.1 localhost\n::1 localhost\n\
             # BEGIN rlark domain net1\n\
             10.88.0.1 rl-head-0.net1 rl-head-0.rlark-domain\n\
             10.88.0.2 rl-worker-0.net1 rl-worker-0.rlark-domain\n\
             # END rlark domain\n"
        );
    }

    #[test]
    fn rendering_again_replaces_the_block_and_keeps_the_rest() {
        let first = render("127.0.0.1 localhost", "d", &[entry("a-0", "fd00::1")]);
        let mut edited = first.clone();
        edited.push_str("192.0.2.7 printer\n");
        let second = render(&edited, "d", &[entry("b-0", "fd00::2")]);
        assert_eq!(
            second,
            "127.0.0.1 localhost\n192.0.2.7 printer\n\
             # BEGIN rlark domain d\nfd00::2 b-0.d b-0.rlark-domain\n# END rlark domain\n"
        );
        // An unterminated block (a crash mid-write) is dropped whole.
        let broken = "127.0.0.1 localhost\n# BEGIN rlark domain d\n10.0.0.1 x.d\n";
        assert_eq!(
            render(broken, "d", &[]),
            "127.0.0.1 localhost\n# BEGIN rlark domain d\n# END rlark domain\n"
        );
    }
}
