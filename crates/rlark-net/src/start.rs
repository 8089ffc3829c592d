//! Starting the agent's pod network: which mode it can run, the router with its relay and
//! direct paths, the direct listener, the membership watch and the path-status writer.
//!
//! The pod network needs root (network namespaces, TUN devices) and, for the kernel mode,
//! working netfilter in a fresh namespace ([`super::netns::probe_netfilter`]); the tun
//! mode needs only a TUN device in a fresh namespace ([`super::netns::probe_tun`]).
//! `--net-mode auto` ([`NetMode::Auto`]) takes kernel mode where netfilter works, else tun
//! mode; when neither works the agent still runs: it reports why in its Node's
//! `status.network.message`, and replicas of domain tasks fail with reason
//! `DomainNetworkUnavailable` and that message instead of running outside their domain. A
//! mode forced with `--net-mode kernel|tun` that this host cannot run stops the agent at
//! start ([`StartError::NetMode`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use rlark_api::types::NodeNetwork;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::datagram::DatagramMetrics;
use super::direct::{DirectEndpoint, DirectTls, DirectTlsError};
use super::membership::{LocalIdentity, Membership};
use super::metrics::{DomainMetrics, write_path_status};
use super::netns::{self, Mode};
use super::replica::{DomainNet, NetConfig, PodNetwork};
use super::revocations::Revocations;
use super::router::{DirectDialer, REDIRECT_PORT, Router, RouterConfig};

/// `--net-mode`: which termination mode the pod network runs (docs/network.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NetMode {
    /// Kernel mode where netfilter works (the start-up probe), else tun mode where a TUN
    /// device can be made, else no pod network (the Node's `status.network.message` says
    /// why).
    #[default]
    Auto,
    /// Kernel mode (nftables REDIRECT) or the agent does not start.
    Kernel,
    /// Tun mode (a userspace TCP stack behind the replica's TUN device) or the agent does
    /// not start.
    Tun,
}

impl NetMode {
    /// `auto`, `kernel` or `tun`, as on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            NetMode::Auto => "auto",
            NetMode::Kernel => "kernel",
            NetMode::Tun => "tun",
        }
    }
}

impl fmt::Display for NetMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for NetMode {
    type Err = String;

    /// `auto`, `kernel` or `tun`; anything else is an error naming the choices.
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(NetMode::Auto),
            "kernel" => Ok(NetMode::Kernel),
            "tun" => Ok(NetMode::Tun),
            other => Err(format!(
                "net mode {other:?}: expected \"auto\", \"kernel\" or \"tun\""
            )),
        }
    }
}

/// What the agent's configuration and credentials give the pod network (the agent fills
/// it from its own configuration).
pub struct PodNetConfig<'a> {
    /// This agent's cluster ID.
    pub cluster_id: &'a str,
    /// `--net-mode`.
    pub net_mode: NetMode,
    /// `--domain-listen`: the direct listener's address, if any.
    pub domain_listen: Option<SocketAddr>,
    /// `--domain-advertise`: the address announced for it, if not the listener's own.
    pub domain_advertise: Option<&'a str>,
    /// The server URLs (those on loopback are passed through into the namespaces).
    pub servers: &'a [String],
    /// Where the pod network keeps its state (`DATA_DIR/net`).
    pub state_dir: PathBuf,
    /// The agent certificate (PEM), for the direct path.
    pub cert_pem: &'a str,
    /// Its private key (PEM).
    pub key_pem: &'a str,
    /// The installation CA bundle (PEM).
    pub ca_pem: &'a str,
}

/// Failures that stop the agent: a direct listener that was asked for and cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("direct listener TLS: {0}")]
    Tls(#[from] DirectTlsError),
    #[error("direct listener on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("--net-mode {requested}: {reason}")]
    NetMode { requested: NetMode, reason: String },
}

/// The agent's pod network, started (see the module documentation).
pub struct PodNet {
    /// Routes the connections of this agent's replicas; its `inbound()` serves relay streams.
    pub router: Router,
    /// The tunnel's relay path: the tunnel client's live sessions (give it to the client
    /// as `ClientConfig::hub`).
    pub hub: rlark_tunnel::client::HubStreams,
    /// What the Task worker uses.
    pub network: PodNetwork,
    membership: Membership,
    metrics: DomainMetrics,
    direct: Option<(DirectEndpoint, tokio::net::TcpListener)>,
    direct_address: Option<String>,
    namespace: String,
    /// Why the mode runs (the Node's `status.network.message`).
    mode_reason: String,
}

impl PodNet {
    /// Decide the mode, build the router (and bind the direct listener when configured),
    /// register the metrics. Nothing runs in the background until [`PodNet::spawn_parts`].
    pub async fn start(
        config: PodNetConfig<'_>,
        node: &str,
        registry: &mut Registry,
        shutdown: CancellationToken,
    ) -> Result<PodNet, StartError> {
        let identity = LocalIdentity {
            cluster: config.cluster_id.to_string(),
            node: node.to_string(),
        };
        let namespace = identity.namespace();
        let membership = Membership::new(identity);
        let metrics = DomainMetrics::new();
        metrics.register(registry);
        let datagrams = DatagramMetrics::default();
        datagrams.register(registry);
        let hub = rlark_tunnel::client::HubStreams::new();
        let direct = match config.domain_listen {
            Some(addr) => {
                let revocations = Revocations::unknown();
                revocations.register(registry);
                let endpoint = DirectEndpoint::new(
                    DirectTls::new(config.cert_pem, config.key_pem, config.ca_pem)?,
                    revocations.clone(),
                );
                let listener = tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(|source| StartError::Listen { addr, source })?;
                Some((endpoint, listener))
            }
            None => None,
        };
        let direct_address = direct
            .as_ref()
            .and_then(|(_, listener)| listener.local_addr().ok())
            .and_then(|bound| super::direct::advertised_address(bound, config.domain_advertise));
        let router = Router::new(
            membership.clone(),
            metrics.clone(),
            Some(Arc::new(hub.clone())),
            direct
                .as_ref()
                .map(|(endpoint, _)| Arc::new(endpoint.clone()) as Arc<dyn DirectDialer>),
            RouterConfig::new(Arc::new(netns::original_destination)),
            shutdown.clone(),
        );
        let chosen = match availability(config.net_mode).await {
            Ok(chosen) => Ok(chosen),
            Err(reason) if config.net_mode != NetMode::Auto => {
                return Err(StartError::NetMode {
                    requested: config.net_mode,
                    reason,
                });
            }
            Err(reason) => Err(reason),
        };
        let mut mode_reason = String::new();
        let network = match chosen {
            Ok((mode, reason)) => {
                mode_reason = reason;
                PodNetwork::Ready(DomainNet::new(
                    router.clone(),
                    datagrams,
                    NetConfig {
                        mode,
                        redirect_port: REDIRECT_PORT,
                        loopback_passthrough: loopback_ports(config.servers),
                        state_dir: config.state_dir,
                    },
                    shutdown,
                ))
            }
            Err(why) => {
                tracing::warn!(reason = %why, "no pod network on this agent: replicas of domain tasks will fail");
                PodNetwork::Unavailable(why)
            }
        };
        if let PodNetwork::Ready(net) = &network {
            tracing::info!(mode = net.mode().as_str(), requested = config.net_mode.as_str(), why = %mode_reason, direct = ?direct_address, "pod network ready");
        }
        Ok(PodNet {
            router,
            hub,
            network,
            membership,
            metrics,
            direct,
            direct_address,
            namespace,
            mode_reason,
        })
    }

    /// The direct path's endpoint, when `--domain-listen` is on (renewed certificates go
    /// to it with `DirectEndpoint::update`).
    pub fn direct_endpoint(&self) -> Option<DirectEndpoint> {
        self.direct.as_ref().map(|(endpoint, _)| endpoint.clone())
    }

    /// What the Node reports in `status.network`.
    pub fn node_network(&self) -> NodeNetwork {
        match &self.network {
            PodNetwork::Ready(net) => NodeNetwork {
                mode: net.mode().as_str().to_string(),
                direct_address: self.direct_address.clone(),
                message: Some(self.mode_reason.clone()),
            },
            PodNetwork::Unavailable(why) => NodeNetwork {
                mode: "none".into(),
                direct_address: None,
                message: Some(why.clone()),
            },
        }
    }

    /// The background parts: the DomainPeer watch, the path-status writer, the direct
    /// listener and the revoked agent certificates it checks peers against.
    pub fn spawn_parts(
        self,
        client: kube::Client,
        shutdown: CancellationToken,
    ) -> Vec<(&'static str, JoinHandle<()>)> {
        let mut parts = vec![
            (
                "domain membership",
                tokio::spawn(self.membership.clone().run(
                    client.clone(),
                    self.namespace.clone(),
                    shutdown.clone(),
                )),
            ),
            (
                "domain path status",
                tokio::spawn(write_path_status(
                    self.metrics.clone(),
                    client.clone(),
                    self.namespace.clone(),
                    shutdown.clone(),
                )),
            ),
        ];
        if let Some((endpoint, listener)) = self.direct {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, advertised = ?self.direct_address, "direct pod-network listener");
            }
            parts.push((
                "domain revocations",
                tokio::spawn(
                    endpoint
                        .revocations()
                        .follow(client.clone(), shutdown.clone()),
                ),
            ));
            parts.push((
                "domain direct listener",
                tokio::spawn(endpoint.serve(listener, self.router.inbound(), shutdown)),
            ));
        }
        parts
    }
}

/// The mode to run for `requested` and why (the Node's `status.network.message`), or why
/// none can run. Probes only what the choice needs (auto: TUN only when netfilter fails).
async fn availability(requested: NetMode) -> Result<(Mode, String), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err(
            "the pod network needs root (network namespaces, TUN devices, nftables)".into(),
        );
    }
    let netfilter = match requested {
        NetMode::Kernel | NetMode::Auto => Some(netns::probe_netfilter().await),
        NetMode::Tun => None,
    };
    let tun = match (requested, &netfilter) {
        (NetMode::Tun, _) | (NetMode::Auto, Some(Err(_))) => {
            Some(netns::probe_tun().await.and_then(|()| multi_threaded()))
        }
        _ => None,
    };
    decide(requested, netfilter, tun)
}

/// Tun mode's stack (ipstack) blocks a runtime worker briefly when a connection is dropped
/// (`block_in_place`), which a current-thread runtime does not allow.
fn multi_threaded() -> Result<(), String> {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => {
            Err("tun mode needs the multi-threaded tokio runtime".into())
        }
        _ => Ok(()),
    }
}

/// The choice itself (sans IO): the mode for `requested` given the outcomes of the
/// netfilter and TUN probes that ran (`None`: not run), with the reason shown on the Node;
/// or why no mode runs.
fn decide(
    requested: NetMode,
    netfilter: Option<Result<(), String>>,
    tun: Option<Result<(), String>>,
) -> Result<(Mode, String), String> {
    let not_run = |probe: &str| format!("the {probe} probe did not run");
    match requested {
        NetMode::Kernel => match netfilter {
            Some(Ok(())) => Ok((
                Mode::Kernel,
                "kernel mode (nftables REDIRECT), as --net-mode kernel asks".into(),
            )),
            Some(Err(why)) => Err(format!("netfilter does not work here: {why}")),
            None => Err(not_run("netfilter")),
        },
        NetMode::Tun => match tun {
            Some(Ok(())) => Ok((
                Mode::Tun,
                "tun mode (userspace TCP stack), as --net-mode tun asks".into(),
            )),
            Some(Err(why)) => Err(format!("no TUN device can be made here: {why}")),
            None => Err(not_run("TUN")),
        },
        NetMode::Auto => match (netfilter, tun) {
            (Some(Ok(())), _) => Ok((
                Mode::Kernel,
                "netfilter works here: kernel mode (nftables REDIRECT)".into(),
            )),
            (Some(Err(netfilter)), Some(Ok(()))) => Ok((
                Mode::Tun,
                format!(
                    "netfilter does not work here ({netfilter}): tun mode (userspace TCP \
                     stack)"
                ),
            )),
            (Some(Err(netfilter)), Some(Err(tun))) => Err(format!(
                "netfilter does not work here ({netfilter}) and no TUN device can be made \
                 ({tun})"
            )),
            (None, _) => Err(not_run("netfilter")),
            (Some(Err(_)), None) => Err(not_run("TUN")),
        },
    }
}

/// The ports of the servers the agent reaches on loopback: a task in a namespace reaches
/// them as `127.0.0.1:<port>` too (passed through to the host's loopback), so
/// `RLARK_SERVER` and `RLARK_REPORT_URL` work from inside.
fn loopback_ports(servers: &[String]) -> Vec<u16> {
    let mut ports = Vec::new();
    for server in servers {
        let Ok(url) = server.parse::<http::Uri>() else {
            continue;
        };
        let host = url.host().unwrap_or_default().trim_matches(['[', ']']);
        let loopback =
            host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if loopback {
            let port = url.port_u16().unwrap_or(443);
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
    }
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_the_request_and_the_probes() {
        let ok = || Some(Ok(()));
        let failed = |why: &str| Some(Err(why.to_string()));
        let mode = |r: Result<(Mode, String), String>| r.map(|(mode, _)| mode);
        // auto: kernel where netfilter works, else tun, else none with both reasons.
        assert_eq!(mode(decide(NetMode::Auto, ok(), None)), Ok(Mode::Kernel));
        let (chosen, why) =
            decide(NetMode::Auto, failed("no nft"), ok()).expect("tun as the fallback");
        assert_eq!(chosen, Mode::Tun);
        assert!(why.contains("no nft") && why.contains("tun mode"), "{why}");
        let none = decide(NetMode::Auto, failed("no nft"), failed("no /dev/net/tun"))
            .expect_err("neither works");
        assert!(
            none.contains("no nft") && none.contains("no /dev/net/tun"),
            "{none}"
        );
        // Forced modes: only their own probe counts.
        assert_eq!(mode(decide(NetMode::Kernel, ok(), None)), Ok(Mode::Kernel));
        let kernel = decide(NetMode::Kernel, failed("nat table missing"), ok())
            .expect_err("kernel is not available");
        assert!(
            kernel.contains("netfilter does not work here: nat table missing"),
            "{kernel}"
        );
        let (chosen, why) = decide(NetMode::Tun, None, ok()).expect("tun");
        assert_eq!(chosen, Mode::Tun);
        assert!(why.contains("--net-mode tun"), "{why}");
        let tun = decide(NetMode::Tun, ok(), failed("EPERM")).expect_err("no TUN");
        assert!(
            tun.contains("no TUN device can be made here: EPERM"),
            "{tun}"
        );
    }

    #[test]
    fn loopback_servers_are_passed_through() {
        let servers = [
            "https://127.0.0.1:6443".to_string(),
            "https://[::1]:7443/prefix".to_string(),
            "https://localhost".to_string(),
            "https://rlark.example.com:6443".to_string(),
            "https://127.0.0.1:6443".to_string(),
        ];
        assert_eq!(loopback_ports(&servers), [6443, 7443, 443]);
    }
}
