//! `domain` certificates: RLark's pod-network transport over SSH, served by the hub's relay.
//!
//! A certificate of role `domain` (principal `domain:<domain>@<cluster>`) speaks for the
//! members that cluster `<cluster>` runs in Domain `<domain>`, as RLark's node agents do
//! when they carry a replica's connection to another cluster over the server's SSH port. It
//! opens no sessions; each `direct-tcpip` channel is one TCP flow of one member:
//!
//! - **destination** (the channel's host): a member's address (`10.88.0.3`, `fd00::3`,
//!   `[fd00::3]`), RLark's spellings `<ip>.<cluster>.agent` and
//!   `<ip>.<node>.<cluster>.agent-node` (the cluster must be the member's; the node is not
//!   read: the hub routes to the node the member's Pod runs on), or a member's name as
//!   replicas' `/etc/hosts` spell it, `<pod>.<domain>` or `<pod>.rlark-domain`;
//! - **source** (the channel's originator address): the address of a member that the
//!   certificate's cluster runs. `ssh -L ADDR:PORT:DEST:DPORT` run inside a member's network
//!   namespace, with the member connecting to its own address, gives exactly that.
//!
//! Both are authorized as an agent's relay is ([`crate::tunnel::relay::connect`]: the
//! cluster comes from the certificate, never from the channel), then again by the
//! destination's agent; the flow then counts in the relay's metrics. Every channel is
//! audited (`ssh-forward` on `domains.rlinf.io/ssh`), refused or not, with bytes each way;
//! revoking the certificate (`rlark cert revoke SERIAL`, or `--cluster-id` for all of a
//! cluster's) closes its connection ([`super::handler`]).

use std::net::IpAddr;
use std::sync::Arc;

use rlark_apiserver::audit::AuditEntry;
use rlark_tunnel::header::Status;
use rlark_tunnel::relay::{Protocol, RelayHeader};
use russh::ChannelOpenFailure;
use russh::server::{ChannelOpenHandle, Msg};

use super::SshState;
use super::auth::{Login, Target};
use super::session::Closing;
use crate::tunnel::relay::{self, Counting, Onward, SPLICE_BUFFER};

/// RLark's Domain suffix in replicas' `/etc/hosts` (the agent's
/// `rlark_net::hosts::RLARK_SUFFIX`, which the server does not depend on).
const RLARK_DOMAIN_SUFFIX: &str = "rlark-domain";

/// One `direct-tcpip` channel as the client asked for it.
#[derive(Debug, Clone)]
pub(crate) struct Flow {
    pub host: String,
    pub port: u32,
    pub originator: String,
    pub originator_port: u32,
}

/// A destination as the channel spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Spelled {
    /// An address, with the cluster RLark's `.agent`/`.agent-node` spellings name.
    Address { ip: IpAddr, cluster: Option<String> },
    /// A member's Pod name (`<pod>.<domain>` or `<pod>.rlark-domain`).
    Name(String),
}

/// Read the channel's host; the error lists what is understood.
pub(crate) fn parse_host(host: &str, domain: &str) -> Result<Spelled, String> {
    let bad = || {
        format!(
            "host {host:?} names no member of domain {domain}: use its address, \
             <ip>.<cluster>.agent, <ip>.<node>.<cluster>.agent-node, <pod>.{domain} or \
             <pod>.{RLARK_DOMAIN_SUFFIX}"
        )
    };
    let address = |text: &str| -> Option<IpAddr> {
        let text = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or(text);
        text.parse().ok()
    };
    if let Some(ip) = address(host) {
        return Ok(Spelled::Address { ip, cluster: None });
    }
    let cluster_id = |s: &str| crate::security::validate_cluster_id(s).is_ok();
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    if let Some(rest) = host.strip_suffix(".agent-node") {
        let (rest, cluster) = rest.rsplit_once('.').ok_or_else(bad)?;
        let (ip, node) = rest.rsplit_once('.').ok_or_else(bad)?;
        let ip = address(ip).ok_or_else(bad)?;
        if !cluster_id(cluster) || node.is_empty() {
            return Err(bad());
        }
        return Ok(Spelled::Address {
            ip,
            cluster: Some(cluster.to_string()),
        });
    }
    if let Some(rest) = host.strip_suffix(".agent") {
        let (ip, cluster) = rest.rsplit_once('.').ok_or_else(bad)?;
        let ip = address(ip).ok_or_else(bad)?;
        if !cluster_id(cluster) {
            return Err(bad());
        }
        return Ok(Spelled::Address {
            ip,
            cluster: Some(cluster.to_string()),
        });
    }
    for suffix in [domain, RLARK_DOMAIN_SUFFIX] {
        if let Some(pod) = host
            .strip_suffix(suffix)
            .and_then(|rest| rest.strip_suffix('.'))
            && label(pod)
        {
            return Ok(Spelled::Name(pod.to_string()));
        }
    }
    Err(bad())
}

/// Why a channel was not opened: audited, then answered.
struct Refused {
    /// `denied` (not allowed) or `allowed` (allowed, but it did not connect).
    decision: &'static str,
    reason: String,
}

impl Refused {
    fn denied(reason: String) -> Self {
        Refused {
            decision: "denied",
            reason,
        }
    }
}

/// The flow's source: the channel's originator address. A dual-stack listener reports an
/// IPv4 client as `::ffff:a.b.c.d`: the member's address is the IPv4 one.
pub(crate) fn source_of(originator: &str, domain: &str) -> Result<IpAddr, String> {
    originator
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .map(|ip| ip.to_canonical())
        .map_err(|_| {
            format!(
                "the channel's originator {originator:?} is not an address: it must be the \
                 address of the member of domain {domain} the flow comes from"
            )
        })
}

/// The relay header of `flow` for Domain `domain`, or why there is none.
fn header(state: &SshState, domain: &str, flow: &Flow) -> Result<RelayHeader, Refused> {
    let port = match u16::try_from(flow.port) {
        Ok(port) if port > 0 => port,
        _ => {
            return Err(Refused::denied(format!(
                "port {} is out of range",
                flow.port
            )));
        }
    };
    let (destination, named_cluster) =
        match parse_host(&flow.host, domain).map_err(Refused::denied)? {
            Spelled::Address { ip, cluster } => (ip, cluster),
            Spelled::Name(pod) => (
                state
                    .hub
                    .relay()
                    .index
                    .member_named(domain, &pod)
                    .map_err(Refused::denied)?,
                None,
            ),
        };
    let source = source_of(&flow.originator, domain).map_err(Refused::denied)?;
    let header = RelayHeader {
        domain: domain.to_string(),
        protocol: Protocol::Tcp,
        source,
        destination,
        port,
        source_port: u16::try_from(flow.originator_port).unwrap_or(0),
        source_cluster: None,
    };
    header
        .validate()
        .map_err(|e| Refused::denied(format!("flow {source} -> {destination}: {e}")))?;
    if let Some(named) = named_cluster {
        // RLark's spellings name the destination's cluster: a different one is a stale or
        // wrong route, refused before anything is opened.
        let holder = state.hub.relay().index.cluster_of(domain, destination);
        if let Some(actual) = holder
            && actual != named
        {
            return Err(Refused::denied(format!(
                "{} is held by a replica of cluster {actual:?}, not {named:?} as {:?} says",
                destination, flow.host
            )));
        }
    }
    Ok(header)
}

/// Authorize `flow`, open it through the relay, and carry it until either end closes or
/// the certificate is revoked.
pub(crate) async fn open(
    state: Arc<SshState>,
    login: Arc<Login>,
    channel: russh::Channel<Msg>,
    flow: Flow,
    reply: ChannelOpenHandle,
    closing: Closing,
) {
    let Target::Domain { domain, cluster } = &login.target else {
        return;
    };
    let relay = state.hub.relay();
    let connected = match header(&state, domain, &flow) {
        Ok(header) => relay::connect(&state.hub, cluster, &header)
            .await
            .map(|onward| (header, onward))
            .map_err(|refusal| {
                relay.count(&relay.label(Some(domain)), refusal.status.as_str());
                Refused {
                    decision: if matches!(refusal.status, Status::Forbidden | Status::BadRequest) {
                        "denied"
                    } else {
                        "allowed"
                    },
                    reason: refusal.message,
                }
            }),
        Err(refused) => Err(refused),
    };
    let (header, onward) = match connected {
        Ok(connected) => connected,
        Err(refused) => {
            let detail = format!(
                "from {}:{} to {}:{}: {}",
                flow.originator, flow.originator_port, flow.host, flow.port, refused.reason
            );
            audit(&state, &login, domain, &detail, refused.decision);
            let failure = if refused.decision == "denied" {
                ChannelOpenFailure::Other {
                    code: 1,
                    reason: format!("rlark: {}", refused.reason),
                }
            } else {
                ChannelOpenFailure::ConnectFailed
            };
            reply.reject(failure).await;
            return;
        }
    };
    let Onward {
        stream: mut onward,
        label,
        ..
    } = onward;
    reply.accept().await;
    relay.count(&label, Status::Ok.as_str());
    onward.raise_window(rlark_tunnel::relay::RELAY_WINDOW);
    let meter = relay.meter(&label);
    // The client's side is metered: what it writes goes to the destination.
    let mut client = Counting::new(
        channel.into_stream(),
        meter.to_source.clone(),
        meter.to_destination.clone(),
    );
    let copied = tokio::select! {
        copied = rlark_tunnel::agent::splice(&mut onward, &mut client, SPLICE_BUFFER) => copied.ok(),
        () = closing.token.cancelled() => None,
    };
    drop(meter);
    let flow_name = format!(
        "from {}:{} to {}:{} ({})",
        header.source, header.source_port, header.destination, header.port, flow.host
    );
    let detail = match copied {
        // splice counts (towards the client, towards the mux stream).
        Some((to_source, to_destination)) => {
            format!("{flow_name}: bytes in {to_destination} out {to_source}")
        }
        None => format!(
            "{flow_name}: ended ({})",
            closing.reason.get().map_or("error", String::as_str)
        ),
    };
    audit(&state, &login, domain, &detail, "allowed");
}

fn audit(state: &SshState, login: &Login, domain: &str, detail: &str, decision: &str) {
    state.audit.record(AuditEntry {
        verb: "ssh-forward".into(),
        resource: "domains.rlinf.io/ssh".into(),
        name: domain.to_string(),
        reason: format!("{detail} via {}", login.credential.describe()),
        ..AuditEntry::now("ssh-forward", decision).by(Some(&login.identity))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(ip: &str, cluster: Option<&str>) -> Spelled {
        Spelled::Address {
            ip: ip.parse().unwrap(),
            cluster: cluster.map(str::to_string),
        }
    }

    #[test]
    fn hosts_in_every_spelling() {
        let cases = [
            ("10.88.0.3", address("10.88.0.3", None)),
            ("fd00::3", address("fd00::3", None)),
            ("[fd00::3]", address("fd00::3", None)),
            ("10.88.0.3.b.agent", address("10.88.0.3", Some("b"))),
            ("fd00::3.b.agent", address("fd00::3", Some("b"))),
            (
                "10.244.1.7.worker-1.mycluster.agent-node",
                address("10.244.1.7", Some("mycluster")),
            ),
            ("web-server-0.net1", Spelled::Name("web-server-0".into())),
            (
                "web-server-0.rlark-domain",
                Spelled::Name("web-server-0".into()),
            ),
        ];
        for (host, want) in cases {
            assert_eq!(parse_host(host, "net1"), Ok(want), "{host}");
        }
    }

    #[test]
    fn originators_are_addresses_and_v4_mapped_ones_are_v4() {
        assert_eq!(
            source_of("10.88.0.2", "net1"),
            Ok("10.88.0.2".parse().unwrap())
        );
        assert_eq!(
            source_of("::ffff:10.88.0.2", "net1"),
            Ok("10.88.0.2".parse().unwrap())
        );
        assert_eq!(
            source_of("[fd00::2]", "net1"),
            Ok("fd00::2".parse().unwrap())
        );
        let error = source_of("stdio-forward", "net1").unwrap_err();
        assert!(
            error.contains("\"stdio-forward\" is not an address"),
            "{error}"
        );
    }

    #[test]
    fn hosts_that_name_no_member_are_refused_with_the_spellings() {
        for host in [
            "",
            "example.com",
            "web-server-0.net2",
            "net1",
            ".net1",
            "10.88.0.3.agent",
            "host.b.agent",
            "10.88.0.3.b.agent-node",
            "10.88.0.3..b.agent-node",
            "10.88.0.3.B.agent",
            "Web.net1",
        ] {
            let error = parse_host(host, "net1").unwrap_err();
            assert!(
                error.contains(&format!("host {host:?} names no member of domain net1"))
                    && error.contains("<ip>.<node>.<cluster>.agent-node"),
                "{host}: {error}"
            );
        }
    }
}
