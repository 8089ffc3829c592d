//! The agent's view of the Domains its namespace belongs to: the `DomainPeer`s of
//! `rlark-<cluster>` (one per domain that has a member here), written by the Domain
//! controller and read here with the agent's own client.
//!
//! [`MembershipView`] is the pure part: built from a list of DomainPeers, answering who
//! owns a virtual IP ([`MembershipView::member`]), which domain a destination falls in
//! ([`MembershipView::domain_of`]), a replica's own addresses
//! ([`MembershipView::addresses_of`]) and why a replica has none
//! ([`MembershipView::pending`]). [`Membership`] holds the current view behind a
//! `watch` channel (readers never wait for the watch; subscribers are told of every
//! change, e.g. the `/etc/hosts` writer) and [`Membership::run`] keeps it current from a
//! kube watch of `domainpeers.rlinf.io`.
//!
//! A DomainPeer lists only members of its own domain that this namespace may reach, so
//! everything here is, by construction, what the control plane allowed: a destination that
//! is not in the view is not reachable, and an inbound source that is not in it is refused.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt as _;
use ipnet::IpNet;
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use rlark_api::types::{DomainPeer, DomainPendingPod};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Longest cluster ID: `rlark-<id>` must stay a DNS-1123 label (63 characters).
pub const MAX_CLUSTER_ID_LEN: usize = 57;

/// Why `id` cannot be a cluster ID, if it cannot.
pub fn cluster_id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty".into());
    }
    let mut reasons = Vec::new();
    if id.len() > MAX_CLUSTER_ID_LEN {
        reasons.push(format!(
            "must be no more than {MAX_CLUSTER_ID_LEN} characters (the namespace is rlark-<ID>)"
        ));
    }
    reasons.extend(rlark_api::names::dns1123_label_errors(id));
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// One member of a domain (a replica with a virtual IP), as this agent sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The domain's name.
    pub domain: String,
    /// The member's virtual IP.
    pub ip: IpAddr,
    /// Cluster ID of the agent running it.
    pub cluster: String,
    /// Its agent namespace (`rlark-<cluster>`).
    pub namespace: String,
    /// Its Pod name (`<task>-<i>`).
    pub pod: String,
    /// Its Task, when known.
    pub task: Option<String>,
    /// The Node it runs on, when known.
    pub node: Option<String>,
    /// `host:port` of its agent's direct (mTLS) listener; `None`: relay only.
    pub agent_address: Option<String>,
    /// Whether it runs on this agent (same namespace, and this node when a node is named).
    pub local: bool,
}

/// One domain: its address range and members by IP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainView {
    pub name: String,
    pub cidr: IpNet,
    pub members: BTreeMap<IpAddr, Member>,
    /// This namespace's replicas waiting for an address.
    pub pending: Vec<DomainPendingPod>,
}

/// The domains of one agent namespace at one moment. Cheap to share (`Arc`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipView {
    domains: BTreeMap<String, DomainView>,
}

/// Who this agent is: members are `local` when they run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalIdentity {
    /// This agent's cluster ID.
    pub cluster: String,
    /// This agent's Node name.
    pub node: String,
}

impl LocalIdentity {
    /// The agent namespace `rlark-<cluster>`.
    pub fn namespace(&self) -> String {
        rlark_api::names::agent_namespace(&self.cluster)
    }
}

impl MembershipView {
    /// The view of `peers` (the DomainPeers of this agent's namespace) for agent `me`.
    /// Entries that cannot be used are left out and described in the returned problems
    /// (a bad CIDR drops its domain; a bad or out-of-range IP drops its member; a second
    /// member claiming an IP keeps the first): the rest stays usable.
    pub fn build(peers: &[DomainPeer], me: &LocalIdentity) -> (MembershipView, Vec<String>) {
        let own_namespace = me.namespace();
        let mut problems = Vec::new();
        let mut domains = BTreeMap::new();
        for peer in peers {
            let spec = &peer.spec;
            let name = spec.domain.clone();
            let cidr = match spec.cidr.parse::<IpNet>() {
                Ok(cidr) => cidr.trunc(),
                Err(e) => {
                    problems.push(format!(
                        "domain {name:?}: cidr {:?} is not an address range ({e}); its members \
                         are unreachable",
                        spec.cidr
                    ));
                    continue;
                }
            };
            let mut members = BTreeMap::new();
            for pod in &spec.pods {
                let ip = match parse_ip(&pod.ip) {
                    Some(ip) if cidr.contains(&ip) => ip,
                    Some(ip) => {
                        problems.push(format!(
                            "domain {name:?}: member {}/{} has ip {ip}, outside {cidr}",
                            pod.global_namespace, pod.name
                        ));
                        continue;
                    }
                    None => {
                        problems.push(format!(
                            "domain {name:?}: member {}/{} has ip {:?}, not an IP address",
                            pod.global_namespace, pod.name, pod.ip
                        ));
                        continue;
                    }
                };
                let cluster = if pod.cluster.is_empty() {
                    pod.global_namespace
                        .strip_prefix("rlark-")
                        .unwrap_or_default()
                        .to_string()
                } else {
                    pod.cluster.clone()
                };
                if cluster.is_empty() {
                    problems.push(format!(
                        "domain {name:?}: member {}/{} names no cluster",
                        pod.global_namespace, pod.name
                    ));
                    continue;
                }
                let namespace = rlark_api::names::agent_namespace(&cluster);
                let local = namespace == own_namespace
                    && pod.node.as_deref().is_none_or(|node| node == me.node);
                let member = Member {
                    domain: name.clone(),
                    ip,
                    cluster,
                    namespace,
                    pod: pod.name.clone(),
                    task: pod.task.clone(),
                    node: pod.node.clone(),
                    agent_address: pod.agent_address.clone().filter(|a| !a.is_empty()),
                    local,
                };
                if let Some(first) = members.get(&ip) {
                    let first: &Member = first;
                    problems.push(format!(
                        "domain {name:?}: ip {ip} is claimed by {}/{} and {}/{}; the first is kept",
                        first.namespace, first.pod, member.namespace, member.pod
                    ));
                    continue;
                }
                members.insert(ip, member);
            }
            domains.insert(
                name.clone(),
                DomainView {
                    name,
                    cidr,
                    members,
                    pending: spec.pending.clone(),
                },
            );
        }
        (MembershipView { domains }, problems)
    }

    /// Every domain, by name.
    pub fn domains(&self) -> &BTreeMap<String, DomainView> {
        &self.domains
    }

    /// One domain.
    pub fn domain(&self, name: &str) -> Option<&DomainView> {
        self.domains.get(name)
    }

    /// The member of `domain` holding `ip`.
    pub fn member(&self, domain: &str, ip: IpAddr) -> Option<&Member> {
        self.domains.get(domain)?.members.get(&ip)
    }

    /// The domain whose CIDR contains `ip` (the first by name if CIDRs overlap, which the
    /// Domain controller refuses).
    pub fn domain_of(&self, ip: IpAddr) -> Option<&DomainView> {
        self.domains.values().find(|d| d.cidr.contains(&ip))
    }

    /// Why this namespace's replica `pod` has no address in some domain, if it waits for one:
    /// the domain and the `NoDomainIP` entry.
    pub fn pending(&self, pod: &str) -> Option<(&str, &DomainPendingPod)> {
        self.domains.values().find_map(|d| {
            d.pending
                .iter()
                .find(|p| p.name == pod)
                .map(|p| (d.name.as_str(), p))
        })
    }

    /// The addresses of this agent's replica `pod` in `domain` (one per family at most, in
    /// practice one: a domain has one CIDR).
    pub fn addresses_of(&self, domain: &str, pod: &str) -> Vec<IpAddr> {
        self.domains
            .get(domain)
            .map(|d| {
                d.members
                    .values()
                    .filter(|m| m.local && m.pod == pod)
                    .map(|m| m.ip)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The address of this agent's replica `pod` in `domain` of the same family as `like`.
    pub fn source_address(&self, domain: &str, pod: &str, like: IpAddr) -> Option<IpAddr> {
        self.addresses_of(domain, pod)
            .into_iter()
            .find(|ip| ip.is_ipv4() == like.is_ipv4())
    }
}

/// `10.0.0.1` or `10.0.0.1/16` (the address part).
fn parse_ip(text: &str) -> Option<IpAddr> {
    text.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<IpNet>().ok().map(|net| net.addr()))
}

/// The current [`MembershipView`] of this agent's namespace, shared by the router, the
/// inbound side and the `/etc/hosts` writer. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Membership {
    me: Arc<LocalIdentity>,
    view: watch::Sender<Arc<MembershipView>>,
}

impl Membership {
    /// An empty view for agent `me` (nothing reachable until [`Membership::run`] or
    /// [`Membership::replace`] fills it).
    pub fn new(me: LocalIdentity) -> Self {
        Membership {
            me: Arc::new(me),
            view: watch::Sender::new(Arc::new(MembershipView::default())),
        }
    }

    /// Who this agent is.
    pub fn identity(&self) -> &LocalIdentity {
        &self.me
    }

    /// The current view.
    pub fn view(&self) -> Arc<MembershipView> {
        self.view.borrow().clone()
    }

    /// A receiver told of every change of the view (e.g. to rewrite `/etc/hosts` files).
    pub fn subscribe(&self) -> watch::Receiver<Arc<MembershipView>> {
        self.view.subscribe()
    }

    /// Replace the view by the one built from `peers`; logs the problems found. Subscribers
    /// are only woken when the view changed.
    pub fn replace(&self, peers: &[DomainPeer]) {
        let (view, problems) = MembershipView::build(peers, &self.me);
        for problem in problems {
            tracing::warn!(%problem, "domain membership entry ignored");
        }
        self.view.send_if_modified(|current| {
            if **current == view {
                return false;
            }
            *current = Arc::new(view);
            true
        });
    }

    /// Keep the view current from a watch of the DomainPeers of `namespace` until
    /// `shutdown`. Watch errors are retried with kube's default backoff; the last good view
    /// stays in use meanwhile.
    pub async fn run(self, client: kube::Client, namespace: String, shutdown: CancellationToken) {
        let api: Api<DomainPeer> = Api::namespaced(client, &namespace);
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        let mut peers: BTreeMap<String, DomainPeer> = BTreeMap::new();
        let mut listing: Option<BTreeMap<String, DomainPeer>> = None;
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => {
                    tracing::warn!("domain peer watch ended");
                    return;
                }
                Some(Ok(watcher::Event::Apply(peer))) => {
                    peers.insert(peer_key(&peer), peer);
                }
                Some(Ok(watcher::Event::Delete(peer))) => {
                    peers.remove(&peer_key(&peer));
                }
                Some(Ok(watcher::Event::Init)) => {
                    listing = Some(BTreeMap::new());
                    continue;
                }
                Some(Ok(watcher::Event::InitApply(peer))) => {
                    if let Some(listing) = listing.as_mut() {
                        listing.insert(peer_key(&peer), peer);
                    }
                    continue;
                }
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(listing) = listing.take() {
                        peers = listing;
                    }
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, %namespace, "domain peer watch failed (retrying)");
                    continue;
                }
            }
            let list: Vec<DomainPeer> = peers.values().cloned().collect();
            self.replace(&list);
        }
    }
}

fn peer_key(peer: &DomainPeer) -> String {
    peer.metadata.name.clone().unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rlark_api::types::{DomainPeerSpec, DomainPodInfo};

    pub(crate) fn pod(ns_cluster: &str, name: &str, ip: &str, node: &str) -> DomainPodInfo {
        DomainPodInfo {
            global_namespace: format!("rlark-{ns_cluster}"),
            namespace: format!("rlark-{ns_cluster}"),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: Some(node.into()),
            ip: ip.into(),
            cluster: ns_cluster.into(),
            task: name.rsplit_once('-').map(|(t, _)| t.to_string()),
            ..Default::default()
        }
    }

    pub(crate) fn peer(domain: &str, cidr: &str, pods: Vec<DomainPodInfo>) -> DomainPeer {
        DomainPeer::new(
            domain,
            DomainPeerSpec {
                domain: domain.into(),
                cidr: cidr.into(),
                prefix_len: cidr
                    .split_once('/')
                    .and_then(|(_, p)| p.parse().ok())
                    .unwrap_or(0),
                pods,
                pending: vec![],
            },
        )
    }

    pub(crate) fn me() -> LocalIdentity {
        LocalIdentity {
            cluster: "a".into(),
            node: "n1".into(),
        }
    }

    #[test]
    fn members_by_ip_and_locality() {
        let mut remote = pod("b", "w-0", "10.88.0.3", "nb");
        remote.agent_address = Some("192.0.2.2:15002".into());
        let peers = [peer(
            "d1",
            "10.88.0.0/16",
            vec![
                pod("a", "head-0", "10.88.0.2", "n1"),
                pod("a", "other-0", "10.88.0.4", "n2"),
                remote,
            ],
        )];
        let (view, problems) = MembershipView::build(&peers, &me());
        assert!(problems.is_empty(), "{problems:?}");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let head = view.member("d1", ip("10.88.0.2")).unwrap();
        assert!(head.local);
        assert_eq!(head.task.as_deref(), Some("head"));
        // Same cluster, another node: not local (another agent of the cluster runs it).
        assert!(!view.member("d1", ip("10.88.0.4")).unwrap().local);
        let w = view.member("d1", ip("10.88.0.3")).unwrap();
        assert!(!w.local);
        assert_eq!(w.cluster, "b");
        assert_eq!(w.agent_address.as_deref(), Some("192.0.2.2:15002"));
        assert!(view.member("d1", ip("10.88.0.9")).is_none());
        assert!(view.member("d2", ip("10.88.0.2")).is_none());
        assert_eq!(view.domain_of(ip("10.88.7.7")).unwrap().name, "d1");
        assert!(view.domain_of(ip("10.89.0.1")).is_none());
        assert_eq!(view.addresses_of("d1", "head-0"), vec![ip("10.88.0.2")]);
        assert!(view.addresses_of("d1", "w-0").is_empty(), "not ours");
        assert_eq!(
            view.source_address("d1", "head-0", ip("10.88.0.3")),
            Some(ip("10.88.0.2"))
        );
        assert_eq!(view.source_address("d1", "head-0", ip("fd00::1")), None);
    }

    #[test]
    fn bad_entries_are_dropped_and_named() {
        let mut dup = pod("b", "x-0", "10.88.0.2", "nb");
        dup.uid = "other".into();
        let mut no_cluster = pod("b", "y-0", "10.88.0.7", "nb");
        no_cluster.cluster.clear();
        no_cluster.global_namespace = "elsewhere".into();
        let peers = [
            peer(
                "d1",
                "10.88.0.0/16",
                vec![
                    pod("a", "head-0", "10.88.0.2", "n1"),
                    dup,
                    pod("b", "z-0", "10.99.0.1", "nb"),
                    pod("b", "q-0", "nonsense", "nb"),
                    no_cluster,
                    pod("b", "v6-0", "10.88.0.5/16", "nb"),
                ],
            ),
            peer("bad", "10.0.0.0/33", vec![]),
        ];
        let (view, problems) = MembershipView::build(&peers, &me());
        assert_eq!(problems.len(), 5, "{problems:#?}");
        for needle in [
            "claimed by rlark-a/head-0 and rlark-b/x-0",
            "outside 10.88.0.0/16",
            "\"nonsense\", not an IP address",
            "names no cluster",
            "domain \"bad\": cidr",
        ] {
            assert!(
                problems.iter().any(|p| p.contains(needle)),
                "{needle}: {problems:#?}"
            );
        }
        assert_eq!(view.domains().len(), 1);
        assert_eq!(view.domain("d1").unwrap().members.len(), 2);
        assert_eq!(
            view.member("d1", "10.88.0.2".parse().unwrap()).unwrap().pod,
            "head-0"
        );
    }

    #[test]
    fn pending_replicas_and_change_notification() {
        let membership = Membership::new(me());
        let mut changes = membership.subscribe();
        let mut p = peer(
            "d1",
            "fd00:88::/64",
            vec![pod("a", "h-0", "fd00:88::2", "n1")],
        );
        p.spec.pending.push(DomainPendingPod {
            name: "h-1".into(),
            reason: "NoDomainIP".into(),
            message: "pool full".into(),
        });
        membership.replace(std::slice::from_ref(&p));
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let view = membership.view();
        let (domain, entry) = view.pending("h-1").unwrap();
        assert_eq!((domain, entry.reason.as_str()), ("d1", "NoDomainIP"));
        assert!(view.pending("h-0").is_none());
        // The same peers again: no notification.
        membership.replace(std::slice::from_ref(&p));
        assert!(!changes.has_changed().unwrap());
        membership.replace(&[]);
        assert!(changes.has_changed().unwrap());
        assert!(membership.view().domains().is_empty());
    }
}
