//! The nftables table of a replica's network namespace in kernel mode: every TCP connection
//! a task opens towards a non-loopback address (and towards the host-loopback ports it may
//! reach, `loopback_passthrough`) is REDIRECTed to the agent's listener inside that
//! namespace (`127.0.0.1:<redirect_port>` / `[::1]:<redirect_port>`), which reads the
//! original destination with `SO_ORIGINAL_DST` ([`super::netns::original_destination`]).
//!
//! The rules are text for `nft -f -` (the `nft` binary of the `nftables` package): building
//! the netlink messages of nf_tables by hand would be a large, fragile encoder for one
//! static table, and `nft` applies the file as one transaction. [`ruleset`] is a pure
//! function (tested below); [`apply`] runs `nft` and must be called on a thread that is in
//! the target namespace (a child process inherits the network namespace of the thread that
//! spawns it).

use std::fmt::Write as _;
use std::io::{self, Read as _, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The table every rule of a replica's namespace lives in (family `inet`: IPv4 and IPv6).
pub const TABLE: &str = "rlark";

/// Longest one `nft -f -` run may take before it is killed.
pub const NFT_TIMEOUT: Duration = Duration::from_secs(10);

/// The nft script that (re)creates table `inet rlark` for a namespace whose own addresses
/// are `own`: TCP to any address but loopback and `own` is redirected to `redirect_port`,
/// and so is TCP to `127.0.0.1`/`::1` on the `loopback_passthrough` ports. A task talking
/// to its own address stays inside its namespace.
///
/// The script first declares and deletes the table, so applying it again replaces
/// whatever an earlier agent left (one transaction: there is no moment without rules).
pub fn ruleset(own: &[IpAddr], redirect_port: u16, loopback_passthrough: &[u16]) -> String {
    let mut s = String::new();
    // `table` then `delete table`: the delete never fails for a missing table.
    let _ = writeln!(s, "table inet {TABLE}");
    let _ = writeln!(s, "delete table inet {TABLE}");
    let _ = writeln!(s, "table inet {TABLE} {{");
    let _ = writeln!(s, "\tchain out {{");
    let _ = writeln!(s, "\t\ttype nat hook output priority -100; policy accept;");
    for ip in own {
        match ip {
            IpAddr::V4(ip) => {
                let _ = writeln!(s, "\t\tip daddr {ip} return");
            }
            IpAddr::V6(ip) => {
                let _ = writeln!(s, "\t\tip6 daddr {ip} return");
            }
        }
    }
    if !loopback_passthrough.is_empty() {
        let ports = loopback_passthrough
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "\t\tip daddr 127.0.0.1 tcp dport {{ {ports} }} redirect to :{redirect_port}"
        );
        let _ = writeln!(
            s,
            "\t\tip6 daddr ::1 tcp dport {{ {ports} }} redirect to :{redirect_port}"
        );
    }
    let _ = writeln!(
        s,
        "\t\tmeta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :{redirect_port}"
    );
    let _ = writeln!(
        s,
        "\t\tmeta l4proto tcp ip6 daddr != ::1 redirect to :{redirect_port}"
    );
    let _ = writeln!(s, "\t}}");
    let _ = writeln!(s, "}}");
    s
}

/// The script that removes table `inet rlark` if it exists.
pub fn remove_script() -> String {
    format!("table inet {TABLE}\ndelete table inet {TABLE}\n")
}

/// The `nft` binary: the first `nft` on `PATH`, else `/usr/sbin/nft` or `/sbin/nft`.
pub fn binary() -> Option<PathBuf> {
    let from_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("nft"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    from_path
        .into_iter()
        .chain([PathBuf::from("/usr/sbin/nft"), PathBuf::from("/sbin/nft")])
        .find(|candidate| candidate.is_file())
}

/// Run `nft -f -` with `script` on stdin, on the calling thread's network namespace.
/// Blocking (call it on a namespace thread, not a tokio worker); killed after
/// [`NFT_TIMEOUT`]. The error holds nft's own message.
pub fn apply(nft: &Path, script: &str) -> Result<(), String> {
    let mut child = Command::new(nft)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("start {}: {e}", nft.display()))?;
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(script.as_bytes()))
        .unwrap_or_else(|| Err(io::Error::other("no stdin pipe")));
    let deadline = Instant::now() + NFT_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} -f - did not finish within {NFT_TIMEOUT:?}",
                    nft.display()
                ));
            }
            Err(e) => return Err(format!("wait for {}: {e}", nft.display())),
        }
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    if status.success() {
        if let Err(e) = written {
            return Err(format!("write the rules to nft: {e}"));
        }
        Ok(())
    } else {
        Err(format!(
            "{} -f - failed ({status}): {}",
            nft.display(),
            stderr.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_excludes_own_addresses_and_redirects_the_rest() {
        let own: Vec<IpAddr> = vec!["10.88.0.2".parse().unwrap(), "fd00:88::2".parse().unwrap()];
        let script = ruleset(&own, 15001, &[]);
        let expected = "table inet rlark\n\
                        delete table inet rlark\n\
                        table inet rlark {\n\
                        \tchain out {\n\
                        \t\ttype nat hook output priority -100; policy accept;\n\
                        \t\tip daddr 10.88.0.2 return\n\
                        \t\tip6 daddr fd00:88::2 return\n\
                        \t\tmeta l4proto tcp ip daddr != 127.0.0.0/8 redirect to :15001\n\
                        \t\tmeta l4proto tcp ip6 daddr != ::1 redirect to :15001\n\
                        \t}\n\
                        }\n";
        assert_eq!(script, expected);
    }

    #[test]
    fn ruleset_redirects_loopback_passthrough_ports_before_the_catch_all() {
        let own: Vec<IpAddr> = vec!["10.1.0.5".parse().unwrap()];
        let script = ruleset(&own, 16000, &[6443, 8080]);
        let lines: Vec<&str> = script.lines().map(str::trim).collect();
        let v4 = lines
            .iter()
            .position(|l| *l == "ip daddr 127.0.0.1 tcp dport { 6443, 8080 } redirect to :16000")
            .expect("v4 passthrough rule");
        let v6 = lines
            .iter()
            .position(|l| *l == "ip6 daddr ::1 tcp dport { 6443, 8080 } redirect to :16000")
            .expect("v6 passthrough rule");
        let own_rule = lines
            .iter()
            .position(|l| *l == "ip daddr 10.1.0.5 return")
            .expect("own-address rule");
        let catch_all = lines
            .iter()
            .position(|l| l.starts_with("meta l4proto tcp ip daddr != 127.0.0.0/8"))
            .expect("catch-all rule");
        assert!(own_rule < v4 && v4 < v6 && v6 < catch_all, "{script}");
    }

    #[test]
    fn remove_script_never_fails_on_a_missing_table() {
        assert_eq!(
            remove_script(),
            "table inet rlark\ndelete table inet rlark\n"
        );
    }
}
