//! `rlark port-forward`: listen on loopback and carry every accepted connection through the
//! server's HTTP `CONNECT` (see `docs/tunnel.md`):
//!
//! - `pod/NAME` or `task/NAME` (replica 0 of the Task) and `[LOCAL_PORT:]REMOTE_PORT...`,
//!   as kubectl's: to a replica's port, as `kubectl port-forward` reaches it (CONNECT
//!   `<pod>.<namespace>.pod:<port>`: the same authorization, destination and audit);
//! - `CLUSTER LOCAL_PORT:REMOTE_HOST:REMOTE_PORT`: to `REMOTE_HOST:REMOTE_PORT` as the agent
//!   of `CLUSTER` reaches it (CONNECT `<host>.<clusterID>.agent:<port>`, admins).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use base64::Engine as _;
use clap::Args;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::Deserialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::ClientArgs;
use super::client::DEFAULT_KUBECONFIG;

#[derive(Debug, Args)]
pub(crate) struct PortForwardArgs {
    /// `pod/NAME` or `task/NAME` (its replica 0), as kubectl's; or the cluster ID of the
    /// agent that makes the connections.
    target: String,
    /// For a pod or task: `[LOCAL_PORT:]REMOTE_PORT`, one or more (LOCAL_PORT 0 picks a
    /// free port; without it the same port). For a cluster: one
    /// LOCAL_PORT:REMOTE_HOST:REMOTE_PORT (REMOTE_HOST as the agent resolves it; 127.0.0.1
    /// is the agent's own host).
    #[arg(required = true, value_name = "PORTS")]
    ports: Vec<String>,
    /// Local address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    address: IpAddr,
    #[arg(skip)]
    pub(crate) client: ClientArgs,
}

/// A parsed `LOCAL:HOST:PORT`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Mapping {
    pub local: u16,
    pub host: String,
    pub port: u16,
}

pub(crate) fn parse_mapping(text: &str) -> anyhow::Result<Mapping> {
    let bad = || {
        anyhow::anyhow!(
            "port mapping {text:?} must be LOCAL_PORT:REMOTE_HOST:REMOTE_PORT, e.g. 8080:127.0.0.1:80"
        )
    };
    let (local, rest) = text.split_once(':').ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let local: u16 = local.parse().map_err(|_| bad())?;
    let port: u16 = port.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    if host.is_empty() || host.contains(char::is_whitespace) {
        return Err(bad());
    }
    Ok(Mapping {
        local,
        host: host.to_string(),
        port,
    })
}

/// What a kubeconfig says about reaching and authenticating to its current cluster.
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: Arc<rustls::ClientConfig>,
    pub bearer: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeconfigFile {
    #[serde(default)]
    current_context: Option<String>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "context", alias = "cluster", alias = "user")]
    value: T,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    user: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(default)]
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

/// Read the server, CA and credentials (embedded `*-data` and `token` fields, as rlark
/// writes them) of `--context`, else the current context, of the kubeconfig the client
/// commands use (see [`super::client::kubeconfig_sources`]).
pub(crate) fn endpoint(args: &ClientArgs) -> anyhow::Result<Endpoint> {
    let merged = super::client::load_kubeconfig(args, Path::new(DEFAULT_KUBECONFIG))?;
    let value = serde_json::to_value(&merged).context("re-encode the kubeconfig")?;
    let mut file: KubeconfigFile = serde_json::from_value(value).context("parse the kubeconfig")?;
    if let Some(context) = &args.context {
        file.current_context = Some(context.clone());
    }
    let context_name = file
        .current_context
        .clone()
        .or_else(|| file.contexts.first().map(|c| c.name.clone()))
        .context("kubeconfig has no context")?;
    let context = &file
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .with_context(|| format!("kubeconfig has no context {context_name:?}"))?
        .value;
    let cluster = &file
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .with_context(|| format!("kubeconfig has no cluster {:?}", context.cluster))?
        .value;
    let user = &file
        .users
        .iter()
        .find(|u| u.name == context.user)
        .with_context(|| format!("kubeconfig has no user {:?}", context.user))?
        .value;
    let uri: http::Uri = cluster
        .server
        .parse()
        .with_context(|| format!("server {:?}", cluster.server))?;
    if uri.scheme_str() != Some("https") {
        bail!("server {:?} must be https://", cluster.server);
    }
    let host = uri
        .host()
        .context("server URL has no host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let decode = |what: &str, data: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .with_context(|| format!("kubeconfig {what} is not base64"))
    };
    let mut roots = rustls::RootCertStore::empty();
    let ca = cluster
        .certificate_authority_data
        .as_deref()
        .context("kubeconfig cluster has no certificate-authority-data")?;
    for cert in CertificateDer::pem_slice_iter(&decode("certificate-authority-data", ca)?) {
        roots
            .add(cert.context("CA certificate")?)
            .context("CA certificate")?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rlark_pki::tls_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let tls = match (&user.client_certificate_data, &user.client_key_data) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_slice_iter(&decode("client-certificate-data", cert)?)
                .collect::<Result<Vec<_>, _>>()
                .context("client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&decode("client-key-data", key)?)
                .context("client key")?;
            builder
                .with_client_auth_cert(certs, key)
                .context("client certificate")?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Endpoint {
        host,
        port,
        tls: Arc::new(tls),
        bearer: user.token.clone(),
    })
}

/// A TLS connection to the server.
pub(crate) type ServerStream = tokio_rustls::client::TlsStream<TcpStream>;

/// Bytes per copy between the local socket and the server connection: a TLS record holds
/// up to 16 KiB, so tokio's default 8 KiB copies would split every record into two writes.
const COPY_BUFFER: usize = 64 * 1024;
/// A spare connection older than this is replaced rather than used: the server closes a
/// connection that sends no request within its header-read timeout (30 s by default).
const SPARE_MAX_AGE: Duration = Duration::from_secs(10);
/// Waits between failed attempts to open a spare connection (doubling up to the maximum).
const SPARE_RETRY_MIN: Duration = Duration::from_millis(500);
const SPARE_RETRY_MAX: Duration = Duration::from_secs(30);
/// Most bytes a local client may send ahead of the server's answer to its CONNECT.
const EARLY_DATA_MAX: usize = 64 * 1024;
/// Longest wait for the spare being opened before a connection dials one of its own.
const SPARE_WAIT: Duration = Duration::from_millis(500);

/// Open a TCP connection to the server and complete the TLS handshake (client certificate
/// or bearer token as the kubeconfig says).
pub(crate) async fn open_server_connection(endpoint: &Endpoint) -> anyhow::Result<ServerStream> {
    let tcp = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .with_context(|| format!("connect to {}:{}", endpoint.host, endpoint.port))?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(endpoint.host.clone()).context("server name")?;
    tokio_rustls::TlsConnector::from(Arc::clone(&endpoint.tls))
        .connect(name, tcp)
        .await
        .context("TLS handshake with the server")
}

/// Send `CONNECT authority` on `tls` and read the answer; on 200 the stream carries the
/// tunnelled bytes from here on, otherwise the error names the server's message.
///
/// The bytes the local client `local` sends meanwhile go to the server right behind the
/// request instead of waiting for its answer, saving a round trip through the server and
/// the agent: the server hands what follows the request head to the tunnel once it answers
/// 200. `early.sent` keeps them (at most [`EARLY_DATA_MAX`];
/// reading stops there until the answer) so that a retry on a fresh connection sends them
/// again; `early.eof` says the client has half-closed.
async fn request_connect(
    tls: ServerStream,
    endpoint: &Endpoint,
    authority: &str,
    local: &mut TcpStream,
    early: &mut EarlyData,
) -> anyhow::Result<ServerStream> {
    let mut request = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(token) = &endpoint.bearer {
        request.push_str(&format!("Proxy-Authorization: Bearer {token}\r\n"));
    }
    request.push_str("\r\n");
    let mut out = request.into_bytes();
    out.extend_from_slice(&early.sent);
    let (mut read, mut write) = tokio::io::split(tls);
    write.write_all(&out).await?;
    // Read the response head byte by byte: nothing after it may be consumed here.
    let mut head = Vec::new();
    let mut buffer = vec![0u8; 16 * 1024];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            bail!("the server's CONNECT response head is over 16 KiB");
        }
        let room = EARLY_DATA_MAX - early.sent.len();
        let limit = room.min(buffer.len());
        tokio::select! {
            byte = read.read_u8() => head.push(byte.context("read CONNECT response")?),
            n = local.read(&mut buffer[..limit]), if !early.eof && limit > 0 => {
                // The local client's own error ends its connection: said as text, not as
                // an io::Error, so that the caller does not retry it.
                let n = n.map_err(|e| anyhow::anyhow!("read from the local client: {e}"))?;
                if n == 0 {
                    early.eof = true;
                } else {
                    early.sent.extend_from_slice(&buffer[..n]);
                    write.write_all(&buffer[..n]).await?;
                }
            }
        }
    }
    let mut tls = read.unsplit(write);
    let head = String::from_utf8_lossy(&head);
    let status_line = head.lines().next().unwrap_or_default().to_string();
    let code = status_line.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        // The body is a Status; read what is there (bounded) to show its message.
        let mut body = vec![0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(2), tls.read(&mut body))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&body[..n]);
        let message = serde_json::from_str::<serde_json::Value>(text.trim())
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| text.trim().to_string());
        // Not an io::Error: an answer is final, never retried.
        bail!("CONNECT {authority}: {status_line}: {message}");
    }
    if early.eof {
        // The client half-closed before the answer: pass that on now.
        tls.shutdown().await?;
    }
    Ok(tls)
}

/// What a local client sent ahead of the server's answer to its CONNECT.
#[derive(Default)]
struct EarlyData {
    sent: Vec<u8>,
    eof: bool,
}

/// Dials through the server for a port-forward, keeping one connection with its TCP and
/// TLS handshakes done ready for the next local connection, so that a forwarded
/// connection's setup is one `CONNECT` round trip instead of three (kubectl's
/// port-forward gets the same effect from one long-lived multiplexed connection).
///
/// A spare is used at most [`SPARE_MAX_AGE`] after it was opened; one the server closed
/// anyway is noticed when its `CONNECT` fails before any byte was forwarded, and the
/// connection is retried once on a fresh dial, so a stale spare never fails a client.
struct Dialer {
    endpoint: Arc<Endpoint>,
    authority: String,
    spares: tokio::sync::Mutex<tokio::sync::mpsc::Receiver<(Instant, ServerStream)>>,
    /// The keeper is opening the next spare now.
    opening: Arc<AtomicBool>,
}

impl Dialer {
    /// Start keeping a spare (until `shutdown`).
    fn start(
        endpoint: Arc<Endpoint>,
        authority: String,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Arc<Dialer> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let opening = Arc::new(AtomicBool::new(false));
        tokio::spawn(keep_spare(
            Arc::clone(&endpoint),
            tx,
            Arc::clone(&opening),
            shutdown,
        ));
        Arc::new(Dialer {
            endpoint,
            authority,
            spares: tokio::sync::Mutex::new(rx),
            opening,
        })
    }

    /// A fresh spare: one that is ready, or the one being opened when nobody else waits
    /// for it (its handshake is under way, so it comes sooner than a new one would, and
    /// connections arriving back to back then cost one handshake each, not two). `None`
    /// when another connection already waits for the spare, or none is coming.
    async fn take_spare(&self) -> Option<ServerStream> {
        let mut spares = self.spares.try_lock().ok()?;
        loop {
            let next = match spares.try_recv() {
                Ok(next) => next,
                Err(_) if self.opening.load(Ordering::Acquire) => {
                    tokio::time::timeout(SPARE_WAIT, spares.recv())
                        .await
                        .ok()
                        .flatten()?
                }
                Err(_) => return None,
            };
            if next.0.elapsed() < SPARE_MAX_AGE {
                return Some(next.1);
            }
        }
    }

    /// A stream to the target through the server for the local client `local`, whose
    /// first bytes may already be on their way (see [`request_connect`]).
    async fn dial(&self, local: &mut TcpStream) -> anyhow::Result<ServerStream> {
        let mut early = EarlyData::default();
        if let Some(spare) = self.take_spare().await {
            let attempt =
                request_connect(spare, &self.endpoint, &self.authority, local, &mut early).await;
            match attempt {
                Ok(stream) => return Ok(stream),
                // An answer from the server (403, 502...) is the answer, and the local
                // client's own failure ends it; only a server connection that broke
                // before answering (a spare the server closed) is worth a fresh try,
                // which sends the early bytes again.
                Err(error) if error.chain().any(|e| e.is::<std::io::Error>()) => {
                    tracing::debug!(error = %format!("{error:#}"), "spare server connection failed; dialing anew");
                }
                Err(error) => return Err(error),
            }
        }
        let tls = open_server_connection(&self.endpoint).await?;
        request_connect(tls, &self.endpoint, &self.authority, local, &mut early).await
    }
}

/// Keeps one TLS connection to the server ready in `spares` (plus the one being opened),
/// replacing it when it gets older than [`SPARE_MAX_AGE`]; backs off while the server
/// cannot be reached.
async fn keep_spare(
    endpoint: Arc<Endpoint>,
    spares: tokio::sync::mpsc::Sender<(Instant, ServerStream)>,
    opening: Arc<AtomicBool>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut retry = SPARE_RETRY_MIN;
    loop {
        opening.store(true, Ordering::Release);
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = open_server_connection(&endpoint) => opened,
        };
        opening.store(false, Ordering::Release);
        let tls = match opened {
            Ok(tls) => tls,
            Err(error) => {
                tracing::debug!(error = %format!("{error:#}"), ?retry, "cannot open a spare server connection");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(retry) => {}
                }
                retry = (retry * 2).min(SPARE_RETRY_MAX);
                continue;
            }
        };
        retry = SPARE_RETRY_MIN;
        let born = Instant::now();
        tokio::select! {
            () = shutdown.cancelled() => return,
            permit = spares.reserve() => match permit {
                Ok(permit) => permit.send((born, tls)),
                Err(_) => return,
            },
            // Nobody took it in time: drop it and open a new one.
            () = tokio::time::sleep(SPARE_MAX_AGE) => {}
        }
    }
}

/// `[LOCAL_PORT:]REMOTE_PORT` of a pod forward: (local, remote).
pub(crate) fn parse_pod_ports(text: &str) -> anyhow::Result<(u16, u16)> {
    let bad = || {
        anyhow::anyhow!(
            "port {text:?} must be [LOCAL_PORT:]REMOTE_PORT, e.g. 8080 or 18080:8080 (0 as \
             LOCAL_PORT picks a free port)"
        )
    };
    let (local, remote) = match text.split_once(':') {
        Some((local, remote)) => (local.parse().map_err(|_| bad())?, remote),
        None => (0, text),
    };
    let remote: u16 = remote.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    Ok((if text.contains(':') { local } else { remote }, remote))
}

pub(crate) async fn port_forward(args: PortForwardArgs) -> anyhow::Result<()> {
    let shutdown = tokio_util::sync::CancellationToken::new();
    super::server::watch_signals(shutdown.clone())?;
    let endpoint = Arc::new(endpoint(&args.client)?);
    let mut forwards = Vec::new();
    if let Some((kind, name)) = args.target.split_once('/') {
        let (namespace, pod) = replica(&args.client, kind, name).await?;
        for spec in &args.ports {
            let (local, remote) = parse_pod_ports(spec)?;
            let listener = TcpListener::bind(SocketAddr::new(args.address, local))
                .await
                .with_context(|| format!("listen on {}:{local}", args.address))?;
            // kubectl's words, so what parses kubectl's output parses this.
            println!("Forwarding from {} -> {remote}", listener.local_addr()?);
            let authority = format!("{pod}.{namespace}.pod:{remote}");
            forwards.push((listener, authority));
        }
    } else {
        let [mapping] = args.ports.as_slice() else {
            bail!(
                "a cluster forward takes one LOCAL_PORT:REMOTE_HOST:REMOTE_PORT (got {}); \
                 to reach a replica's ports name it as pod/NAME or task/NAME",
                args.ports.len()
            );
        };
        let mapping = parse_mapping(mapping).map_err(|e| {
            anyhow::anyhow!("{e} (for a replica's port, name it: pod/NAME or task/NAME)")
        })?;
        let listener = TcpListener::bind(SocketAddr::new(args.address, mapping.local))
            .await
            .with_context(|| format!("listen on {}:{}", args.address, mapping.local))?;
        println!(
            "Forwarding from {} -> {}:{} on cluster {}",
            listener.local_addr()?,
            mapping.host,
            mapping.port,
            args.target
        );
        let authority = format!("{}.{}.agent:{}", mapping.host, args.target, mapping.port);
        forwards.push((listener, authority));
    }
    let mut running = tokio::task::JoinSet::new();
    for (listener, authority) in forwards {
        let dialer = Dialer::start(Arc::clone(&endpoint), authority, shutdown.clone());
        running.spawn(serve(listener, dialer, shutdown.clone()));
    }
    while let Some(done) = running.join_next().await {
        done.context("a forward's task")??;
    }
    Ok(())
}

/// The replica `kind/name` names (`pod/NAME`, or `task/NAME`: its replica 0): (namespace,
/// pod). Without `-n` it is looked up across namespaces, as `rlark logs` does.
async fn replica(
    client_args: &ClientArgs,
    kind: &str,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let session = super::client::Session::connect(client_args).await?;
    let namespace = session
        .namespace_explicit
        .then(|| session.namespace.clone());
    let target = format!("{kind}/{name}");
    match super::logs::parse_target(&target)? {
        (super::logs::Kind::Pod, name) => {
            let pod = super::logs::find_pod(&session.client, &name, namespace.as_deref()).await?;
            Ok((pod.namespace, pod.name))
        }
        (super::logs::Kind::Task, name) => {
            let task = super::logs::find_task(&session.client, &name, namespace.as_deref()).await?;
            let mut pods = super::logs::pods_of_task(&session.client, &task).await?;
            pods.sort();
            let first = pods.into_iter().next().with_context(|| {
                format!("task {name} has no replicas yet (it is not running anywhere)")
            })?;
            Ok((first.namespace, first.name))
        }
        (super::logs::Kind::Job, _) => {
            bail!("cannot port-forward to {target}: name one replica, pod/NAME or task/NAME")
        }
    }
}

/// Accept on `listener` until `shutdown`, each connection carried by `dialer`.
async fn serve(
    listener: TcpListener,
    dialer: Arc<Dialer>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    loop {
        let (socket, peer) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => accepted.context("accept")?,
        };
        let dialer = Arc::clone(&dialer);
        tokio::spawn(async move {
            let mut socket = socket;
            let _ = socket.set_nodelay(true);
            match dialer.dial(&mut socket).await {
                Ok(mut remote) => {
                    if let Err(error) = tokio::io::copy_bidirectional_with_sizes(
                        &mut socket,
                        &mut remote,
                        COPY_BUFFER,
                        COPY_BUFFER,
                    )
                    .await
                    {
                        tracing::debug!(%error, %peer, "forwarded connection ended");
                    }
                }
                Err(error) => eprintln!(
                    "error forwarding connection from {peer}: {}",
                    super::client::error_chain(&error)
                ),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_parse() {
        assert_eq!(
            parse_mapping("8080:127.0.0.1:80").unwrap(),
            Mapping {
                local: 8080,
                host: "127.0.0.1".into(),
                port: 80
            }
        );
        assert_eq!(parse_mapping("0:db.internal:5432").unwrap().local, 0);
        assert_eq!(parse_mapping("1:[::1]:22").unwrap().host, "::1");
        for bad in ["8080", "8080:80", "x:h:80", "1:h:0", "1::80", "1:h:x"] {
            assert!(parse_mapping(bad).is_err(), "{bad}");
        }
        // A pod's ports, as kubectl's: REMOTE (the same local port) or LOCAL:REMOTE.
        assert_eq!(parse_pod_ports("8080").unwrap(), (8080, 8080));
        assert_eq!(parse_pod_ports("0:8080").unwrap(), (0, 8080));
        assert_eq!(parse_pod_ports("18080:8080").unwrap(), (18080, 8080));
        for bad in ["", "x", "1:0", "a:80", "80:", "1:2:3"] {
            assert!(parse_pod_ports(bad).is_err(), "{bad}");
        }
    }
}
