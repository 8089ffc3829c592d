//! The hub's pod-network relay: streams that agents open towards the hub
//! (`docs/tunnel.md`, "Relay header"; issue 16).
//!
//! An agent whose replica connects to a Domain member on another agent, with no direct path,
//! opens a mux stream on its own tunnel session carrying a `relay` request whose body is a
//! [`RelayHeader`]. The hub:
//!
//! 1. reads the request header within [`HEADER_TIMEOUT`] (nothing in time: the stream is
//!    reset); anything but `relay` is answered `forbidden`; a body that does not decode, or
//!    one that carries `source_cluster` (only the hub sets it), `bad-request`;
//! 2. authorizes it ([`decide`], pure) against an in-memory index of every Domain's
//!    `status.ipAllocations` ([`DomainIndex`], kept current from the store's watch): the
//!    caller's cluster is the session's certificate identity, never the body; the `source`
//!    IP must be allocated, not released, to a replica in `rlark-<caller>`; the
//!    `destination` must be allocated in the same Domain. Refusals are `forbidden` naming what
//!    failed; a destination that is not a member (or not placed yet) is `unreachable`;
//! 3. opens a relay stream to the destination's agent — the session of the node its Pod runs
//!    on when the Pod names one, else the cluster's newest — with `source_cluster` set to the
//!    caller's cluster (no session: `no-such-agent`), passes that agent's answer back, and on
//!    `ok` splices the two streams both ways with half-close.
//!
//! Metrics (in the hub's collector): `rlark_tunnel_relay_streams_total{domain,outcome}`,
//! `rlark_tunnel_relay_bytes_total{domain,direction}` (counted as bytes move, by
//! [`Counting`] around the onward stream: a long-lived relay shows progress and one that is
//! reset keeps what it moved), //! `rlark_tunnel_relay_active{domain}`. The `domain` label is the Domain's name only when
//! that Domain exists (else `(unknown)`), so a caller cannot grow the label set.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use futures::StreamExt as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rlark_store::{EventType, ListOptions, ObjectKey, Store};
use rlark_tunnel::header::{self, ReadHeaderError, Status, StreamRequest, StreamResponse};
use rlark_tunnel::mux::MuxStream;
use rlark_tunnel::relay::{Protocol, RelayHeader};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::Hub;

/// Store resource of Domains (cluster-scoped).
pub(crate) const DOMAINS: &str = "domains.rlinf.io";
/// Store resource of replica Pods.
const PODS: &str = "pods.rlinf.io";
/// Prefix of agent namespaces.
const AGENT_NAMESPACE_PREFIX: &str = "rlark-";
/// How long the hub waits for an agent-opened stream's request header.
pub(crate) const HEADER_TIMEOUT: Duration = rlark_tunnel::agent::HEADER_TIMEOUT;
/// How long writing an answer (and its FIN) may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Copy buffer of each direction of a spliced relay (also the SSH endpoint's `domain`
/// forwards').
pub(crate) const SPLICE_BUFFER: usize = 64 * 1024;
/// Pause before the index lists again after its watch ended.
const RELIST_DELAY: Duration = Duration::from_secs(1);
/// The `domain` label of streams naming no existing Domain.
const UNKNOWN_DOMAIN: &str = "(unknown)";

/// One member of a Domain as the index holds it: the replica holding an address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    /// The cluster the holder runs on: the `rlark-<cluster>` of its `pod`, which must agree
    /// with the allocation's `cluster` when that is set. `None`: the holder is not placed
    /// (no pod, or the two disagree) — such an address is nobody's to use.
    pub cluster: Option<String>,
    /// Holder `namespace/name`, as the allocation names it.
    pub pod: Option<(String, String)>,
    /// The allocation was released (`releasedAt` set).
    pub released: bool,
}

/// The allocations of one Domain, by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct DomainMembers {
    pub by_ip: HashMap<IpAddr, Member>,
}

/// Every Domain's allocations, by Domain name.
pub(crate) type Domains = HashMap<String, Arc<DomainMembers>>;

/// Reads a Domain object's `status.ipAllocations`. Entries whose `ip` does not parse are
/// skipped (logged): they can name no flow. When one address appears twice, a live
/// allocation wins over a released one.
pub(crate) fn parse_domain(object: &Value) -> DomainMembers {
    let mut members = DomainMembers::default();
    let allocations = object
        .pointer("/status/ipAllocations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for allocation in allocations {
        let Some(ip) = allocation
            .get("ip")
            .and_then(Value::as_str)
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            tracing::debug!(%allocation, "domain allocation without a usable ip: ignored");
            continue;
        };
        let pod = allocation
            .get("pod")
            .and_then(Value::as_str)
            .and_then(|pod| pod.split_once('/'))
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()));
        let from_pod = pod.as_ref().and_then(|(ns, _)| {
            ns.strip_prefix(AGENT_NAMESPACE_PREFIX)
                .filter(|c| crate::security::validate_cluster_id(c).is_ok())
                .map(str::to_owned)
        });
        let declared = allocation.get("cluster").and_then(Value::as_str);
        let cluster = match (from_pod, declared) {
            (Some(from_pod), Some(declared)) if from_pod != declared => None,
            (from_pod, _) => from_pod,
        };
        let released = allocation
            .get("releasedAt")
            .is_some_and(|released| !released.is_null());
        let member = Member {
            cluster,
            pod,
            released,
        };
        match members.by_ip.get(&ip) {
            Some(existing) if !existing.released && member.released => {}
            _ => {
                members.by_ip.insert(ip, member);
            }
        }
    }
    members
}

/// Where an authorized relay goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Destination {
    pub cluster: String,
    /// The destination replica's Pod (`namespace`, `name`), to find its node.
    pub pod: Option<(String, String)>,
}

/// Why a relay is not forwarded: the answer to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: Status,
    pub message: String,
}

impl Refusal {
    fn new(status: Status, message: String) -> Self {
        Refusal { status, message }
    }
}

/// The hub's authorization of one relay from an agent of cluster `caller` (the session's
/// certificate identity). Pure: the decision over the Domains' allocations as indexed.
pub(crate) fn decide(
    domains: &Domains,
    caller: &str,
    header: &RelayHeader,
) -> Result<Destination, Refusal> {
    let name = &header.domain;
    if let Some(claimed) = &header.source_cluster {
        return Err(Refusal::new(
            Status::BadRequest,
            format!(
                "relay header field source_cluster ({claimed:?}) is set by the hub only; an \
                 agent must not send it"
            ),
        ));
    }
    let Some(domain) = domains.get(name) else {
        return Err(Refusal::new(
            Status::Forbidden,
            format!("domain {name:?} does not exist"),
        ));
    };
    let source = header.source;
    match domain.by_ip.get(&source) {
        None => {
            return Err(Refusal::new(
                Status::Forbidden,
                format!("source {source} is not allocated in domain {name:?}"),
            ));
        }
        Some(member) if member.released => {
            return Err(Refusal::new(
                Status::Forbidden,
                format!("source {source} in domain {name:?} was released"),
            ));
        }
        Some(member) if member.cluster.as_deref() != Some(caller) => {
            let holder = match &member.cluster {
                Some(cluster) => format!("a replica of cluster {cluster:?}"),
                None => "no placed replica".to_owned(),
            };
            return Err(Refusal::new(
                Status::Forbidden,
                format!(
                    "source {source} in domain {name:?} is held by {holder}, not by a replica \
                     of the calling agent's cluster {caller:?}"
                ),
            ));
        }
        Some(_) => {}
    }
    let destination = header.destination;
    match domain.by_ip.get(&destination) {
        Some(Member {
            cluster: Some(cluster),
            pod,
            released: false,
        }) => Ok(Destination {
            cluster: cluster.clone(),
            pod: pod.clone(),
        }),
        Some(member) if member.released => Err(Refusal::new(
            Status::Unreachable,
            format!("destination {destination} in domain {name:?} was released"),
        )),
        Some(_) => Err(Refusal::new(
            Status::Unreachable,
            format!("destination {destination} in domain {name:?} has no placed replica"),
        )),
        None => {
            // An address live in another Domain is an attempt to cross Domains: forbidden
            // (and counted so); any other address is simply not there.
            let elsewhere = domains.iter().any(|(other, members)| {
                other != name && members.by_ip.get(&destination).is_some_and(|m| !m.released)
            });
            if elsewhere {
                Err(Refusal::new(
                    Status::Forbidden,
                    format!("destination {destination} is not a member of domain {name:?}"),
                ))
            } else {
                Err(Refusal::new(
                    Status::Unreachable,
                    format!("destination {destination} is not allocated in domain {name:?}"),
                ))
            }
        }
    }
}

/// Every Domain's allocations, kept current from the store ([`DomainIndex::follow`]).
#[derive(Debug, Default)]
pub(crate) struct DomainIndex {
    domains: RwLock<Domains>,
    /// Set once the first full list has been loaded.
    loaded: std::sync::atomic::AtomicBool,
}

impl DomainIndex {
    /// Runs [`decide`] on the current index; a refusal while the index is not loaded yet.
    pub(crate) fn decide(
        &self,
        caller: &str,
        header: &RelayHeader,
    ) -> Result<Destination, Refusal> {
        if !self.loaded.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Refusal::new(
                Status::Unreachable,
                "the hub has not loaded the Domains yet; retry".to_owned(),
            ));
        }
        let domains = self.domains.read().unwrap_or_else(|e| e.into_inner());
        decide(&domains, caller, header)
    }

    /// The address of replica `to` (`namespace`, `pod name`) in a Domain that replica `from`
    /// is a member of too (live allocations only); the error says what is missing.
    pub(crate) fn address_of(
        &self,
        from: (&str, &str),
        to: (&str, &str),
    ) -> Result<IpAddr, String> {
        let holds = |members: &DomainMembers, (ns, name): (&str, &str)| {
            members.by_ip.iter().find_map(|(ip, member)| {
                let held = !member.released
                    && member
                        .pod
                        .as_ref()
                        .is_some_and(|(n, p)| n == ns && p == name);
                held.then_some(*ip)
            })
        };
        let domains = self.domains.read().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = domains.keys().collect();
        names.sort();
        let mut elsewhere = false;
        for name in names {
            let members = &domains[name];
            if let Some(ip) = holds(members, to) {
                if holds(members, from).is_some() {
                    return Ok(ip);
                }
                elsewhere = true;
            }
        }
        let (to_ns, to_pod) = to;
        let (from_ns, from_pod) = from;
        Err(if elsewhere {
            format!("{to_ns}/{to_pod} is in no Domain that {from_ns}/{from_pod} is a member of")
        } else {
            format!("{to_ns}/{to_pod} holds no Domain address")
        })
    }

    /// The cluster of the live, placed member of Domain `domain` at `ip`, if there is one.
    pub(crate) fn cluster_of(&self, domain: &str, ip: IpAddr) -> Option<String> {
        let domains = self.domains.read().unwrap_or_else(|e| e.into_inner());
        let member = domains.get(domain)?.by_ip.get(&ip)?;
        (!member.released).then(|| member.cluster.clone()).flatten()
    }

    /// The address of the live member of Domain `domain` whose Pod is named `pod` (the
    /// `<pod>` of the `<pod>.<domain>` names in replicas' `/etc/hosts`); the error says
    /// what is missing or ambiguous.
    pub(crate) fn member_named(&self, domain: &str, pod: &str) -> Result<IpAddr, String> {
        let domains = self.domains.read().unwrap_or_else(|e| e.into_inner());
        let Some(members) = domains.get(domain) else {
            return Err(format!("domain {domain:?} does not exist"));
        };
        let mut found: Vec<(IpAddr, &str)> = members
            .by_ip
            .iter()
            .filter(|(_, m)| !m.released)
            .filter_map(|(ip, m)| {
                m.pod
                    .as_ref()
                    .filter(|(_, name)| name == pod)
                    .map(|(ns, _)| (*ip, ns.as_str()))
            })
            .collect();
        found.sort();
        match found.as_slice() {
            [] => Err(format!("domain {domain:?} has no member named {pod:?}")),
            [(ip, _)] => Ok(*ip),
            several => Err(format!(
                "{pod:?} names several members of domain {domain:?} (in {}): use an address",
                several
                    .iter()
                    .map(|(ip, ns)| format!("{ns} at {ip}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Whether `name` is an existing Domain (for metric labels).
    fn contains(&self, name: &str) -> bool {
        self.domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(name)
    }

    fn replace_all(&self, domains: Domains) {
        *self.domains.write().unwrap_or_else(|e| e.into_inner()) = domains;
        self.loaded
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn apply(&self, event_type: EventType, name: String, object: &Value) {
        let mut domains = self.domains.write().unwrap_or_else(|e| e.into_inner());
        match event_type {
            EventType::Deleted => {
                domains.remove(&name);
            }
            EventType::Added | EventType::Modified => {
                domains.insert(name, Arc::new(parse_domain(object)));
            }
        }
    }

    /// Lists every Domain, then follows the store's watch from the list's revision; a
    /// watch that ends (expired, store error) is followed by a new list. Runs until
    /// `shutdown`.
    pub(crate) async fn follow(&self, store: Arc<dyn Store>, shutdown: CancellationToken) {
        loop {
            match store.list(DOMAINS, &ListOptions::default()).await {
                Ok(list) => {
                    let domains: Domains = list
                        .items
                        .iter()
                        .filter_map(|object| {
                            let name = object.pointer("/metadata/name")?.as_str()?;
                            Some((name.to_owned(), Arc::new(parse_domain(object))))
                        })
                        .collect();
                    tracing::debug!(domains = domains.len(), "relay: domain index loaded");
                    self.replace_all(domains);
                    match store.watch(DOMAINS, None, list.revision).await {
                        Ok(mut events) => loop {
                            let event = tokio::select! {
                                () = shutdown.cancelled() => return,
                                event = events.next() => event,
                            };
                            match event {
                                Some(Ok(event)) => {
                                    self.apply(event.event_type, event.key.name, &event.object)
                                }
                                Some(Err(error)) => {
                                    tracing::info!(%error, "relay: domain watch ended; listing again");
                                    break;
                                }
                                None => break,
                            }
                        },
                        Err(error) => {
                            tracing::warn!(%error, "relay: cannot watch domains");
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "relay: cannot list domains"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(RELIST_DELAY) => {}
            }
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RelayLabels {
    pub domain: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RelayBytesLabels {
    pub domain: String,
    /// `to_destination` or `to_source`.
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DomainLabel {
    pub domain: String,
}

/// The hub's relay: the Domain index, the store (for Pods' nodes) and the metrics.
#[derive(Default)]
pub(crate) struct Relay {
    pub(crate) index: DomainIndex,
    store: OnceLock<Arc<dyn Store>>,
    pub(crate) streams: Family<RelayLabels, Counter>,
    pub(crate) bytes: Family<RelayBytesLabels, Counter>,
    pub(crate) active: Family<DomainLabel, Gauge>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("index", &self.index)
            .field("store", &self.store.get().is_some())
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// Keeps the index current from `store` until `shutdown` (and uses the store to find
    /// destination Pods' nodes).
    pub(crate) async fn run(&self, store: Arc<dyn Store>, shutdown: CancellationToken) {
        let _ = self.store.set(Arc::clone(&store));
        self.index.follow(store, shutdown).await;
    }

    /// The `domain` metric label of a flow naming `domain`: the name when that Domain
    /// exists, else `(unknown)` (a caller cannot grow the label set).
    pub(crate) fn label(&self, domain: Option<&str>) -> String {
        match domain {
            Some(name) if self.index.contains(name) => name.to_owned(),
            _ => UNKNOWN_DOMAIN.to_owned(),
        }
    }

    /// The `rlark_tunnel_relay_bytes_total` counter of `domain` (a label from
    /// [`Relay::label`]) and `direction`.
    fn bytes_counter(&self, domain: &str, direction: &str) -> Counter {
        self.bytes
            .get_or_create(&RelayBytesLabels {
                domain: domain.to_owned(),
                direction: direction.to_owned(),
            })
            .clone()
    }

    /// Counts one flow of `domain` (a [`Relay::label`]) with `outcome`.
    pub(crate) fn count(&self, domain: &str, outcome: &str) {
        self.streams
            .get_or_create(&RelayLabels {
                domain: domain.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The meter of one established relay of `domain` (a [`Relay::label`]).
    pub(crate) fn meter(&self, domain: &str) -> Meter {
        Meter {
            _active: Active::new(
                self.active
                    .get_or_create(&DomainLabel {
                        domain: domain.to_owned(),
                    })
                    .clone(),
            ),
            to_destination: self.bytes_counter(domain, "to_destination"),
            to_source: self.bytes_counter(domain, "to_source"),
        }
    }

    /// The node the Pod runs on (`status.node`), when the store says.
    pub(crate) async fn node_of(&self, pod: &(String, String)) -> Option<String> {
        let store = self.store.get()?;
        let key = ObjectKey::new(PODS, pod.0.as_str(), pod.1.as_str());
        match store.get(&key).await {
            Ok(Some(object)) => object
                .pointer("/status/node")
                .and_then(Value::as_str)
                .map(str::to_owned),
            Ok(None) => None,
            Err(error) => {
                tracing::debug!(%error, pod = %format_args!("{}/{}", pod.0, pod.1), "relay: reading the destination pod failed");
                None
            }
        }
    }
}

/// Serves the streams an agent of `caller` opens on its session, each in its own task, until
/// the session ends.
pub(crate) async fn serve_incoming(
    hub: Arc<Hub>,
    caller: String,
    mut incoming: rlark_tunnel::mux::Incoming,
) {
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            stream = incoming.next() => match stream {
                Some(stream) => {
                    let span = tracing::info_span!(
                        "relay",
                        caller = %caller,
                        stream = stream.id(),
                        flow = tracing::field::Empty,
                        outcome = tracing::field::Empty,
                    );
                    tasks.spawn(serve_stream(Arc::clone(&hub), caller.clone(), stream).instrument(span));
                }
                None => break,
            },
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // The session is gone: the relays it carried are dead on this side.
    tasks.shutdown().await;
}

/// Writes an answer and FIN (bounded in time).
async fn answer(stream: &mut MuxStream, status: Status, message: impl Into<String>) {
    let response = StreamResponse::error(status, message).encode();
    let write = async {
        stream.write_all(&response).await?;
        stream.shutdown().await
    };
    match tokio::time::timeout(ANSWER_TIMEOUT, write).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, "relay: could not write the answer"),
        Err(_) => tracing::debug!("relay: answer not sent in time"),
    }
}

/// One agent-opened stream; runs in its `relay` span.
async fn serve_stream(hub: Arc<Hub>, caller: String, mut stream: MuxStream) {
    let span = tracing::Span::current();
    let relay = hub.relay();
    let request =
        match tokio::time::timeout(HEADER_TIMEOUT, header::read_request(&mut stream)).await {
            Err(_) => {
                span.record("outcome", "header-timeout");
                relay.count(UNKNOWN_DOMAIN, "header-timeout");
                tracing::info!("relay: no stream header in time: stream reset");
                return;
            }
            Ok(Err(ReadHeaderError::Io(error))) => {
                span.record("outcome", "closed");
                tracing::debug!(%error, "relay: stream ended before its header");
                return;
            }
            Ok(Err(ReadHeaderError::Header(error))) => {
                let message = error.to_string();
                refuse(relay, &span, &mut stream, None, Status::BadRequest, message).await;
                return;
            }
            Ok(Ok(request)) => request,
        };
    let body = match request {
        StreamRequest::Relay(body) => body,
        other => {
            let message = format!(
                "the hub serves only relay streams from agents, not {}",
                other.kind()
            );
            refuse(relay, &span, &mut stream, None, Status::Forbidden, message).await;
            return;
        }
    };
    let header = match RelayHeader::decode(&body) {
        Ok(header) => header,
        Err(error) => {
            let message = error.to_string();
            refuse(relay, &span, &mut stream, None, Status::BadRequest, message).await;
            return;
        }
    };
    span.record("flow", tracing::field::display(&header));
    let Onward {
        stream: mut onward,
        label: domain,
        cluster,
        node,
    } = match connect(&hub, &caller, &header).await {
        Ok(onward) => onward,
        Err(refusal) => {
            let domain = Some(header.domain.as_str());
            refuse(
                relay,
                &span,
                &mut stream,
                domain,
                refusal.status,
                refusal.message,
            )
            .await;
            return;
        }
    };
    if let Err(error) = stream.write_all(&StreamResponse::ok().encode()).await {
        span.record("outcome", "closed");
        relay.count(&domain, "closed");
        tracing::debug!(%error, "relay: the caller's stream failed before the answer");
        return;
    }
    span.record("outcome", Status::Ok.as_str());
    relay.count(&domain, Status::Ok.as_str());
    if header.protocol == Protocol::Tcp {
        // Both receive directions of the hub: see RELAY_WINDOW.
        stream.raise_window(rlark_tunnel::relay::RELAY_WINDOW);
        onward.raise_window(rlark_tunnel::relay::RELAY_WINDOW);
    }
    tracing::debug!(%cluster, node = ?node, "relay established");
    let meter = relay.meter(&domain);
    let mut onward = Counting::new(
        &mut onward,
        meter.to_destination.clone(),
        meter.to_source.clone(),
    );
    let spliced = rlark_tunnel::agent::splice(&mut stream, &mut onward, SPLICE_BUFFER).await;
    drop(meter);
    match spliced {
        Ok((to_destination, to_source)) => {
            tracing::debug!(to_destination, to_source, "relay done");
        }
        Err(error) => {
            // A reset by either end lands here; what moved until then is counted already.
            tracing::debug!(%error, "relay ended with an error");
        }
    }
}

/// A flow the hub authorized and the destination's agent accepted.
pub(crate) struct Onward {
    /// The stream to the destination's agent, after its `ok`.
    pub(crate) stream: MuxStream,
    /// The flow's `domain` metric label ([`Relay::label`]).
    pub(crate) label: String,
    /// The destination's cluster.
    pub(crate) cluster: String,
    /// The destination Pod's node, when the store names it.
    pub(crate) node: Option<String>,
}

/// Authorizes `header` as a flow from a member of cluster `caller` ([`decide`]: `caller` is
/// a certified identity — the agent's tunnel certificate, or an SSH `domain` certificate —
/// never a field of the request), and opens it at the destination's agent, which
/// authorizes it again. A refusal is the answer to give; the caller counts it.
pub(crate) async fn connect(
    hub: &Hub,
    caller: &str,
    header: &RelayHeader,
) -> Result<Onward, Refusal> {
    let relay = hub.relay();
    let destination = relay.index.decide(caller, header)?;
    let node = match &destination.pod {
        Some(pod) => relay.node_of(pod).await,
        None => None,
    };
    let forwarded = header.with_source_cluster(caller);
    let Some(control) = hub.pick(&destination.cluster, node.as_deref()) else {
        return Err(Refusal::new(
            Status::NoSuchAgent,
            format!(
                "no agent of cluster {:?} (destination {}) is connected to this server",
                destination.cluster, header.destination
            ),
        ));
    };
    let deadline = hub.config().dial_timeout;
    let stream = rlark_tunnel::relay::open(&control, &forwarded, deadline)
        .await
        .map_err(|error| {
            Refusal::new(
                error.status,
                format!(
                    "agent of cluster {:?}: {}",
                    destination.cluster, error.message
                ),
            )
        })?;
    Ok(Onward {
        stream,
        label: relay.label(Some(&header.domain)),
        cluster: destination.cluster,
        node,
    })
}

/// What one established relay is metered by: the `active` gauge (counted while this is
/// held) and its Domain's byte counters.
pub(crate) struct Meter {
    _active: Active,
    pub(crate) to_destination: Counter,
    pub(crate) to_source: Counter,
}

/// Counts one relay in the `active` gauge while alive (also when its task is aborted
/// because the caller's session ended).
struct Active(Gauge);

impl Active {
    fn new(gauge: Gauge) -> Self {
        gauge.inc();
        Active(gauge)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// An onward stream that counts, as they move, the bytes written to it (`written`: towards
/// the destination) and read from it (`read`: towards the source) — per successful I/O call,
/// so the counters show progress while a relay lives and keep what moved when it is reset.
pub(crate) struct Counting<T> {
    inner: T,
    written: Counter,
    read: Counter,
}

impl<T> Counting<T> {
    pub(crate) fn new(inner: T, written: Counter, read: Counter) -> Self {
        Counting {
            inner,
            written,
            read,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counting<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = polled {
            let n = buf.filled().len().saturating_sub(before);
            self.read.inc_by(n as u64);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counting<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if let std::task::Poll::Ready(Ok(n)) = polled {
            self.written.inc_by(n as u64);
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Counts and logs a refusal, then answers it.
async fn refuse(
    relay: &Relay,
    span: &tracing::Span,
    stream: &mut MuxStream,
    domain: Option<&str>,
    status: Status,
    message: String,
) {
    let domain = relay.label(domain);
    span.record("outcome", status.as_str());
    relay.count(&domain, status.as_str());
    tracing::info!(status = %status, %message, domain = %domain, "relay refused");
    answer(stream, status, message).await;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use rlark_tunnel::relay::Protocol;

    fn domain(allocations: Value) -> Arc<DomainMembers> {
        Arc::new(parse_domain(
            &json!({"status": {"ipAllocations": allocations}}),
        ))
    }

    fn domains() -> Domains {
        let mut domains = Domains::new();
        domains.insert(
            "ray".into(),
            domain(json!([
                {"ip": "10.8.0.2", "job": "j", "task": "j-w", "index": 0, "cluster": "a", "pod": "rlark-a/j-w-0"},
                {"ip": "10.8.0.3", "job": "j", "task": "j-h", "index": 0, "cluster": "b", "pod": "rlark-b/j-h-0"},
                {"ip": "10.8.0.4", "job": "j", "task": "j-w", "index": 1, "cluster": "a", "pod": "rlark-a/j-w-1",
                 "releasedAt": "2026-12-01T00:00:00Z"},
                {"ip": "10.8.0.5", "job": "j", "task": "j-p", "index": 0},
                {"ip": "10.8.0.6", "cluster": "c", "pod": "rlark-a/j-x-0"},
                {"ip": "not an ip", "cluster": "a", "pod": "rlark-a/bad-0"},
                {"ip": "fd00::2", "cluster": "a", "pod": "rlark-a/v6-0"},
                {"ip": "fd00::3", "cluster": "b", "pod": "rlark-b/v6-0"},
            ])),
        );
        domains.insert(
            "other".into(),
            domain(json!([
                {"ip": "10.9.0.2", "cluster": "b", "pod": "rlark-b/o-0"},
                {"ip": "10.9.0.3", "cluster": "a", "pod": "rlark-a/o-0"},
            ])),
        );
        domains
    }

    fn tcp(domain: &str, source: &str, destination: &str) -> RelayHeader {
        RelayHeader {
            domain: domain.into(),
            protocol: Protocol::Tcp,
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
            port: 80,
            source_port: 40000,
            source_cluster: None,
        }
    }

    #[test]
    fn parse_reads_allocations() {
        let domains = domains();
        let ray = &domains["ray"];
        assert_eq!(ray.by_ip.len(), 7, "the unparsable ip is skipped");
        assert_eq!(
            ray.by_ip[&"10.8.0.2".parse::<IpAddr>().unwrap()],
            Member {
                cluster: Some("a".into()),
                pod: Some(("rlark-a".into(), "j-w-0".into())),
                released: false
            }
        );
        assert!(ray.by_ip[&"10.8.0.4".parse::<IpAddr>().unwrap()].released);
        assert_eq!(
            ray.by_ip[&"10.8.0.5".parse::<IpAddr>().unwrap()].cluster,
            None
        );
        // The declared cluster disagrees with the holder's namespace: nobody's.
        assert_eq!(
            ray.by_ip[&"10.8.0.6".parse::<IpAddr>().unwrap()].cluster,
            None
        );
        // No status at all: an empty Domain.
        assert!(
            parse_domain(&json!({"metadata": {"name": "x"}}))
                .by_ip
                .is_empty()
        );
        // A live allocation wins over a released duplicate, in either order.
        for order in [[true, false], [false, true]] {
            let list: Vec<Value> = order
                .iter()
                .map(|released| {
                    let mut a = json!({"ip": "10.1.0.2", "cluster": "a", "pod": "rlark-a/p-0"});
                    if *released {
                        a["releasedAt"] = json!("2026-12-01T00:00:00Z");
                    }
                    a
                })
                .collect();
            let members = domain(Value::Array(list));
            assert!(!members.by_ip[&"10.1.0.2".parse::<IpAddr>().unwrap()].released);
        }
    }

    /// (name, caller, header, expected decision).
    type Case = (
        &'static str,
        &'static str,
        RelayHeader,
        Result<Destination, (Status, String)>,
    );

    #[test]
    fn decisions() {
        let domains = domains();
        let ok = |cluster: &str, pod: &str| {
            let (ns, name) = pod.split_once('/').unwrap();
            Ok(Destination {
                cluster: cluster.into(),
                pod: Some((ns.into(), name.into())),
            })
        };
        let refused = |status: Status, message: &str| Err((status, message.to_owned()));
        let cases: Vec<Case> = vec![
            (
                "a to b",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.3"),
                ok("b", "rlark-b/j-h-0"),
            ),
            (
                "b back to a",
                "b",
                tcp("ray", "10.8.0.3", "10.8.0.2"),
                ok("a", "rlark-a/j-w-0"),
            ),
            (
                "same cluster",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.2"),
                ok("a", "rlark-a/j-w-0"),
            ),
            (
                "ipv6",
                "a",
                tcp("ray", "fd00::2", "fd00::3"),
                ok("b", "rlark-b/v6-0"),
            ),
            (
                "forged source: c names a's member",
                "c",
                tcp("ray", "10.8.0.2", "10.8.0.3"),
                refused(
                    Status::Forbidden,
                    "source 10.8.0.2 in domain \"ray\" is held by a replica of cluster \"a\", not by a replica of the calling agent's cluster \"c\"",
                ),
            ),
            (
                "source_cluster sent by an agent",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.3").with_source_cluster("b"),
                refused(
                    Status::BadRequest,
                    "relay header field source_cluster (\"b\") is set by the hub only; an agent must not send it",
                ),
            ),
            (
                "released source",
                "a",
                tcp("ray", "10.8.0.4", "10.8.0.3"),
                refused(
                    Status::Forbidden,
                    "source 10.8.0.4 in domain \"ray\" was released",
                ),
            ),
            (
                "unallocated source",
                "a",
                tcp("ray", "10.8.0.99", "10.8.0.3"),
                refused(
                    Status::Forbidden,
                    "source 10.8.0.99 is not allocated in domain \"ray\"",
                ),
            ),
            (
                "unplaced source",
                "a",
                tcp("ray", "10.8.0.5", "10.8.0.3"),
                refused(
                    Status::Forbidden,
                    "source 10.8.0.5 in domain \"ray\" is held by no placed replica, not by a replica of the calling agent's cluster \"a\"",
                ),
            ),
            (
                "source in another domain",
                "a",
                tcp("ray", "10.9.0.3", "10.8.0.3"),
                refused(
                    Status::Forbidden,
                    "source 10.9.0.3 is not allocated in domain \"ray\"",
                ),
            ),
            (
                "unknown domain",
                "a",
                tcp("nope", "10.8.0.2", "10.8.0.3"),
                refused(Status::Forbidden, "domain \"nope\" does not exist"),
            ),
            (
                "destination of another domain",
                "a",
                tcp("ray", "10.8.0.2", "10.9.0.2"),
                refused(
                    Status::Forbidden,
                    "destination 10.9.0.2 is not a member of domain \"ray\"",
                ),
            ),
            (
                "unknown destination",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.77"),
                refused(
                    Status::Unreachable,
                    "destination 10.8.0.77 is not allocated in domain \"ray\"",
                ),
            ),
            (
                "released destination",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.4"),
                refused(
                    Status::Unreachable,
                    "destination 10.8.0.4 in domain \"ray\" was released",
                ),
            ),
            (
                "unplaced destination",
                "a",
                tcp("ray", "10.8.0.2", "10.8.0.5"),
                refused(
                    Status::Unreachable,
                    "destination 10.8.0.5 in domain \"ray\" has no placed replica",
                ),
            ),
        ];
        for (name, caller, header, expected) in cases {
            let got = decide(&domains, caller, &header).map_err(|r| (r.status, r.message));
            assert_eq!(got, expected, "{name}");
        }
    }

    #[test]
    fn an_index_not_loaded_refuses() {
        let index = DomainIndex::default();
        let refusal = index
            .decide("a", &tcp("ray", "10.8.0.2", "10.8.0.3"))
            .unwrap_err();
        assert_eq!(refusal.status, Status::Unreachable);
        index.replace_all(domains());
        assert!(
            index
                .decide("a", &tcp("ray", "10.8.0.2", "10.8.0.3"))
                .is_ok()
        );
        // A watch event replaces one Domain; a deletion removes it.
        index.apply(
            EventType::Modified,
            "ray".into(),
            &json!({"status": {"ipAllocations": [
                {"ip": "10.8.0.2", "cluster": "a", "pod": "rlark-a/j-w-0", "releasedAt": "2026-12-01T00:00:00Z"},
                {"ip": "10.8.0.3", "cluster": "b", "pod": "rlark-b/j-h-0"}
            ]}}),
        );
        let refusal = index
            .decide("a", &tcp("ray", "10.8.0.2", "10.8.0.3"))
            .unwrap_err();
        assert_eq!(
            refusal.message,
            "source 10.8.0.2 in domain \"ray\" was released"
        );
        index.apply(EventType::Deleted, "ray".into(), &Value::Null);
        let refusal = index
            .decide("a", &tcp("ray", "10.8.0.2", "10.8.0.3"))
            .unwrap_err();
        assert_eq!(refusal.message, "domain \"ray\" does not exist");
        assert!(!index.contains("ray") && index.contains("other"));
    }

    #[test]
    fn members_by_pod_name() {
        let index = DomainIndex::default();
        index.replace_all(domains());
        assert_eq!(
            index.member_named("ray", "j-h-0"),
            Ok("10.8.0.3".parse().unwrap())
        );
        // Released: no longer a member.
        assert_eq!(
            index.member_named("ray", "j-w-1"),
            Err("domain \"ray\" has no member named \"j-w-1\"".into())
        );
        // One name in two agent namespaces: ambiguous, both named.
        assert_eq!(
            index.member_named("ray", "v6-0"),
            Err(
                "\"v6-0\" names several members of domain \"ray\" (in rlark-a at fd00::2, \
                 rlark-b at fd00::3): use an address"
                    .into()
            )
        );
        assert_eq!(
            index.member_named("nope", "j-h-0"),
            Err("domain \"nope\" does not exist".into())
        );
    }

    #[test]
    fn addresses_of_replicas() {
        let index = DomainIndex::default();
        index.replace_all(domains());
        assert_eq!(
            index.address_of(("rlark-a", "j-w-0"), ("rlark-b", "j-h-0")),
            Ok("10.8.0.3".parse().unwrap())
        );
        assert_eq!(
            index.address_of(("rlark-b", "o-0"), ("rlark-a", "o-0")),
            Ok("10.9.0.3".parse().unwrap())
        );
        assert_eq!(
            index.address_of(("rlark-a", "j-w-0"), ("rlark-b", "o-0")),
            Err("rlark-b/o-0 is in no Domain that rlark-a/j-w-0 is a member of".into())
        );
        // Released holders have no address.
        assert_eq!(
            index.address_of(("rlark-b", "j-h-0"), ("rlark-a", "j-w-1")),
            Err("rlark-a/j-w-1 holds no Domain address".into())
        );
    }

    #[tokio::test]
    async fn relay_bytes_are_counted_as_they_move_and_kept_on_reset() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let relay = Relay::default();
        let (onward, mut destination) = tokio::io::duplex(64);
        let mut counted = Counting::new(
            onward,
            relay.bytes_counter("ray", "to_destination"),
            relay.bytes_counter("ray", "to_source"),
        );
        let value = |direction: &str| {
            relay
                .bytes
                .get_or_create(&RelayBytesLabels {
                    domain: "ray".into(),
                    direction: direction.into(),
                })
                .get()
        };
        // Mid-stream: both directions show what moved, with the stream still open.
        counted.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        destination.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
        destination.write_all(b"back!!!").await.unwrap();
        let mut back = [0u8; 7];
        counted.read_exact(&mut back).await.unwrap();
        assert_eq!((value("to_destination"), value("to_source")), (5, 7));
        // The destination goes away (a reset): the next write fails, the counts stay.
        drop(destination);
        let error = counted.write_all(b"lost").await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe);
        drop(counted);
        assert_eq!((value("to_destination"), value("to_source")), (5, 7));
        // The encoded metric carries them too.
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("rlark_tunnel_relay_bytes", "", relay.bytes.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "rlark_tunnel_relay_bytes_total{domain=\"ray\",direction=\"to_destination\"} 5"
            ),
            "{text}"
        );
    }
}
