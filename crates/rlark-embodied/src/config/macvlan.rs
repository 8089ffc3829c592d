//! The `macvlans` section of the configuration: interfaces DeviceService.Setup creates in a
//! caller's network namespace.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::Deserialize;

use super::FieldError;

/// Longest interface name Linux accepts (IFNAMSIZ - 1).
pub const MAX_IFNAME_LEN: usize = 15;

/// One macvlan interface (bridge mode) to create in a caller's network namespace
/// (`macvlans[]`, RLark's `host_macvlans`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Macvlan {
    /// Host interface the macvlan sits on. Empty: the one host interface with an IPv4
    /// address in the entry's network (found at Setup).
    #[serde(default, alias = "host_nic")]
    pub parent: String,
    /// Name of the interface inside the caller's namespace.
    pub name: String,
    /// Static IPv4 address with prefix length (`172.16.0.10/24`; a bare address is /24,
    /// as in RLark).
    #[serde(default)]
    pub address: Option<String>,
    /// IPv4 network to pick a free address from (`172.16.0.0/24`), instead of `address`.
    #[serde(default)]
    pub network: Option<String>,
    /// MTU of the interface (68-65535; default: the parent's).
    #[serde(default)]
    pub mtu: Option<u32>,
}

/// How a macvlan gets its address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing {
    /// This address (and prefix).
    Static(Ipv4Net),
    /// The first free host address of this network.
    Auto(Ipv4Net),
}

impl Addressing {
    /// The network the address is in.
    pub fn network(&self) -> Ipv4Net {
        match self {
            Addressing::Static(net) | Addressing::Auto(net) => net.trunc(),
        }
    }
}

impl Macvlan {
    /// The entry's addressing; `Err` names the problem (and the field) for validation.
    pub fn addressing(&self) -> Result<Addressing, (&'static str, String)> {
        match (&self.address, &self.network) {
            (Some(_), Some(_)) => Err((
                "address",
                "set either address (static) or network (auto-pick), not both".into(),
            )),
            (None, None) => Err((
                "address",
                "needs an address (e.g. 172.16.0.10/24) or a network to pick one from (e.g. 172.16.0.0/24)"
                    .into(),
            )),
            (Some(text), None) => {
                let net = parse_ipv4_net(text).map_err(|m| ("address", m))?;
                if net.prefix_len() < 31
                    && (net.addr() == net.network() || net.addr() == net.broadcast())
                {
                    return Err((
                        "address",
                        format!(
                            "{text} is the network or broadcast address of {}; to pick a free address, write it as network: {}",
                            net.trunc(),
                            net.trunc()
                        ),
                    ));
                }
                Ok(Addressing::Static(net))
            }
            (None, Some(text)) => {
                let net = parse_ipv4_net(text).map_err(|m| ("network", m))?;
                if net.addr() != net.network() {
                    return Err((
                        "network",
                        format!(
                            "{text} has host bits set: the network is {} (or use address: {text} for a static address)",
                            net.trunc()
                        ),
                    ));
                }
                if net.prefix_len() > 30 {
                    return Err((
                        "network",
                        format!("{text} has no host addresses to pick from (at most /30)"),
                    ));
                }
                Ok(Addressing::Auto(net))
            }
        }
    }
}

/// `a.b.c.d/len`, or a bare `a.b.c.d` taken as /24 (RLark's default).
fn parse_ipv4_net(text: &str) -> Result<Ipv4Net, String> {
    let text = text.trim();
    match text.split_once('/') {
        Some((addr, len)) => {
            let addr: Ipv4Addr = addr
                .parse()
                .map_err(|_| format!("{text:?} is not an IPv4 address with prefix length"))?;
            let len: u8 = len
                .parse()
                .map_err(|_| format!("{text:?}: bad prefix length {len:?}"))?;
            Ipv4Net::new(addr, len).map_err(|_| format!("{text:?}: prefix length above 32"))
        }
        None => {
            let addr: Ipv4Addr = text
                .parse()
                .map_err(|_| format!("{text:?} is not an IPv4 address (only IPv4 is supported)"))?;
            Ipv4Net::new(addr, 24).map_err(|e| format!("{text:?}/24: {e}"))
        }
    }
}

/// Interface names: 1-15 characters of letters, digits, `-`, `_` and `.`, not `.`/`..`.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_IFNAME_LEN
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name != "."
        && name != ".."
}

/// Every problem of the `macvlans` section, with field paths.
pub(crate) fn check(macvlans: &[Macvlan], problems: &mut Vec<FieldError>) {
    let problem = |path: String, message: String| FieldError { path, message };
    let mut names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut statics: BTreeMap<Ipv4Addr, usize> = BTreeMap::new();
    for (i, macvlan) in macvlans.iter().enumerate() {
        let path = format!("macvlans[{i}]");
        if !valid_ifname(&macvlan.name) {
            problems.push(problem(
                format!("{path}.name"),
                format!(
                    "{:?} is not an interface name: 1-{MAX_IFNAME_LEN} letters, digits, '-', '_' and '.'",
                    macvlan.name
                ),
            ));
        } else if let Some(first) = names.insert(&macvlan.name, i) {
            problems.push(problem(
                format!("{path}.name"),
                format!(
                    "interface {:?} is also the name of macvlans[{first}]",
                    macvlan.name
                ),
            ));
        }
        if !macvlan.parent.is_empty() && !valid_ifname(&macvlan.parent) {
            problems.push(problem(
                format!("{path}.parent"),
                format!(
                    "{:?} is not an interface name: 1-{MAX_IFNAME_LEN} letters, digits, '-', '_' and '.'",
                    macvlan.parent
                ),
            ));
        }
        match macvlan.addressing() {
            Err((field, message)) => problems.push(problem(format!("{path}.{field}"), message)),
            Ok(Addressing::Static(net)) => {
                if let Some(first) = statics.insert(net.addr(), i) {
                    problems.push(problem(
                        format!("{path}.address"),
                        format!("{} is also the address of macvlans[{first}]", net.addr()),
                    ));
                }
            }
            Ok(Addressing::Auto(_)) => {}
        }
        if let Some(mtu) = macvlan.mtu
            && !(68..=65535).contains(&mtu)
        {
            problems.push(problem(
                format!("{path}.mtu"),
                format!("{mtu} is not an IPv4 MTU (68-65535)"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macvlan(address: Option<&str>, network: Option<&str>) -> Macvlan {
        Macvlan {
            parent: "eth1".into(),
            name: "robot0".into(),
            address: address.map(Into::into),
            network: network.map(Into::into),
            mtu: None,
        }
    }

    #[test]
    fn addressing_is_static_or_auto() {
        assert_eq!(
            macvlan(Some("172.16.0.10/24"), None).addressing(),
            Ok(Addressing::Static("172.16.0.10/24".parse().unwrap()))
        );
        assert_eq!(
            macvlan(Some("172.16.0.10"), None).addressing(),
            Ok(Addressing::Static("172.16.0.10/24".parse().unwrap()))
        );
        assert_eq!(
            macvlan(None, Some("172.16.0.0/24")).addressing(),
            Ok(Addressing::Auto("172.16.0.0/24".parse().unwrap()))
        );
        let bad = [
            (macvlan(None, None), "address", "needs an address"),
            (
                macvlan(Some("172.16.0.10/24"), Some("172.16.0.0/24")),
                "address",
                "not both",
            ),
            (
                macvlan(Some("172.16.0.0/24"), None),
                "address",
                "network: 172.16.0.0/24",
            ),
            (macvlan(None, Some("172.16.0.7/24")), "network", "host bits"),
            (
                macvlan(None, Some("172.16.0.0/31")),
                "network",
                "at most /30",
            ),
            (
                macvlan(Some("fe80::1/64"), None),
                "address",
                "not an IPv4 address",
            ),
            (macvlan(Some("10.0.0.1/33"), None), "address", "above 32"),
        ];
        for (entry, field, needle) in bad {
            let (got_field, message) = entry.addressing().expect_err("invalid");
            assert_eq!(got_field, field, "{entry:?}");
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
    }

    #[test]
    fn check_reports_every_problem_with_its_path() {
        let mut entries = vec![
            macvlan(Some("172.16.0.10/24"), None),
            macvlan(Some("172.16.0.10/24"), None),
            Macvlan {
                parent: "a-very-long-interface".into(),
                name: "bad name".into(),
                address: None,
                network: Some("10.1.0.0/16".into()),
                mtu: Some(20),
            },
        ];
        entries[1].name = "robot0".into();
        let mut problems = Vec::new();
        check(&entries, &mut problems);
        let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "macvlans[1].name",
                "macvlans[1].address",
                "macvlans[2].name",
                "macvlans[2].parent",
                "macvlans[2].mtu",
            ],
            "{problems:?}"
        );
    }
}
