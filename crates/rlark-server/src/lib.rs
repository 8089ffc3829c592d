//! The rlark control-plane process.
//!
//! [`start`] prepares the data directory (CA, serving and admin certificates, SQLite store),
//! binds the HTTPS listener, writes `admin.kubeconfig` with the bound address and serves the
//! Kubernetes-compatible API plus `/healthz`, `/livez`, `/readyz` and `/metrics` until shut
//! down. [`run`] does the same until a [`CancellationToken`] fires.
//!
//! With [`ServerConfig::controllers`] enabled (what `rlark server` does unless
//! `--controllers=false`), the Job, Workflow, Task and Node controllers run in the same
//! process, as a client of the server's own listener with the admin certificate, under
//! leader election on the `default/rlark-controller-manager` Lease. On shutdown they stop
//! (and release the Lease) before the listener closes.
//!
//! Data directory layout:
//!
//! | path | what |
//! |---|---|
//! | `pki/ca.crt`, `pki/ca.key` | installation CA (created once; with `--ca-secret-file` also kept in the store, key sealed, and taken from there by a new replica: `security::ca_store`) |
//! | `pki/admin.crt`, `pki/admin.key` | admin client certificate (`CN=admin, O=system:masters`) |
//! | `pki/trusted/*.crt`, `pki/ca-cross.crt` | previous CA and cross-signed active CA, during a CA rotation |
//! | `pki/ssh_ca`, `pki/ssh_ca.pub` | the installation's OpenSSH user CA (Ed25519) |
//! | `pki/ssh_host_ed25519_key` | the SSH endpoint's host key, when `ssh_listen` is set |
//! | `pki/revocations.json` | every certificate revocation, also kept here so it survives the store |
//! | `rlark.db` | the SQLite store (also issued certificates, revocations, tokens) |
//! | `admin.kubeconfig` | kubeconfig for the admin, rewritten at every start |
//! | `audit.log`, `audit.log.1`.. | audit records, one JSON object per line, rotated by size |
//!
//! A data directory with a CA but a missing or empty `rlark.db` is refused at start (see
//! `store_guard`) unless [`ServerConfig::reinitialize_store`] is set.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod auth;
mod backup;
mod changes;
mod config;
mod console;
mod controllers;
pub mod data_lock;
mod gateway;
mod http;
pub mod limits;
mod metrics;
pub(crate) mod reports;
mod reward;
pub mod security;
mod serve;
mod server_store;
mod setup;
pub mod ssh;
mod store_guard;
pub(crate) mod task_access;
mod tls;
pub mod tunnel;

use serve::Serve;
pub use setup::redact_url;
use setup::{open_store, peer_tls, prepare_listener, prepare_security};

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use rlark_apiserver::ApiServer;
use rlark_pki::Ca;
use rlark_store::{
    EngineConfig, PostgresStore, PostgresStoreConfig, SqliteStore, SqliteStoreConfig, StoreError,
};

pub use server_store::ServerStore;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

pub use config::{
    ApiConfigFile, AuditLogConfigFile, ConfigError, ConnectionsConfigFile, ControllersConfig,
    ControllersConfigFile, DEFAULT_LISTEN, SecretText, SecurityConfigFile, ServerConfig,
    ServerConfigFile, ServerOverrides, SshConfigFile, TunnelConfigFile,
};
pub use limits::ConnectionLimits;
pub use rlark_apiserver::discovery::{BuildInfo, set_build_info};
pub use security::audit_file::{AUDIT_LOG_FILE, AuditLogConfig};
pub use security::join_limit::JoinLimitConfig;
pub use security::revocation_file::REVOCATIONS_FILE;
pub use security::{CertRole, SecurityConfig};
pub use ssh::limits::SshLimits;
pub use tunnel::{TunnelConfig, TunnelInfo};

/// User name of the admin client certificate.
pub const ADMIN_USER: &str = "admin";
/// File name of the admin kubeconfig inside the data directory.
pub const ADMIN_KUBECONFIG: &str = "admin.kubeconfig";
/// Sub-directory of the data directory that holds certificates and keys.
pub const PKI_DIR: &str = "pki";
/// File name of the SQLite database inside the data directory.
pub const DATABASE_FILE: &str = "rlark.db";

/// Errors of starting or running the server, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("PKI: {0}")]
    Pki(#[from] rlark_pki::PkiError),
    #[error("open store {path}: {source}")]
    OpenStore { path: PathBuf, source: StoreError },
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("initialize API: {0}")]
    InitApi(String),
    #[error("server task failed: {0}")]
    Task(String),
    #[error("start controllers: {0}")]
    Controllers(String),
    #[error("security: {0}")]
    Security(String),
    #[error("SSH CA: {0}")]
    SshCa(#[from] rlark_pki::ssh::SshError),
    #[error("SSH: {0}")]
    Ssh(#[from] ssh::SshServerError),
    /// The CA shows an installation that ran before, but its store is missing or empty.
    #[error("{0}")]
    StoreLost(String),
    /// The store was set up by another installation (its marker names another CA).
    #[error("{0}")]
    ForeignStore(String),
    /// Another server uses the data directory, or its lock file cannot be made.
    #[error(transparent)]
    DataDir(#[from] data_lock::LockError),
}

/// Path of the admin kubeconfig for a data directory.
pub fn admin_kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_KUBECONFIG)
}

/// A started server. Dropping it does not stop the server; call [`RunningServer::shutdown`]
/// (or cancel [`RunningServer::shutdown_token`] and then [`RunningServer::wait`]).
#[derive(Debug)]
pub struct RunningServer {
    /// The bound listener address (the real port when the config asked for port 0).
    pub local_addr: SocketAddr,
    /// `DATA_DIR/admin.kubeconfig`, already written with [`RunningServer::url`].
    pub kubeconfig_path: PathBuf,
    /// The data directory.
    pub data_dir: PathBuf,
    /// `sha256:<hex>` of the CA public key (for `--discovery-token-ca-cert-hash`-style pinning).
    pub ca_cert_hash: String,
    /// The SSH endpoint, when `ssh_listen` was set.
    pub ssh: Option<ssh::SshEndpoint>,
    /// The bound address of the task proxy's origin, when `proxy_listen` was set.
    pub proxy_addr: Option<SocketAddr>,
    proxy_url: Option<console::proxy_origin::ProxyUrl>,
    console: console::Console,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// `https://HOST:PORT` clients should use (loopback when listening on a wildcard address).
    pub fn url(&self) -> String {
        server_url(self.local_addr)
    }

    /// The task proxy's origin as a browser that opened the console at [`Self::url`] is sent
    /// to (`https://HOST:PORT`), when `proxy_listen` was set.
    pub fn proxy_url(&self) -> Option<String> {
        let console = self.url();
        let host = console.strip_prefix("https://");
        self.proxy_url.as_ref().map(|url| url.for_console(host))
    }

    /// A one-time login link to the web console for the admin user: `URL/#login=CODE`,
    /// usable once within 15 minutes. The code is in the URL fragment, which browsers do
    /// not send to the server.
    pub async fn console_login_link(&self) -> Result<String, ServerError> {
        let admin = rlark_apiserver::auth::Identity {
            user: ADMIN_USER.to_string(),
            groups: vec![rlark_apiserver::auth::ADMIN_GROUP.to_string()],
        };
        let code = self
            .console
            .sessions
            .create_link(admin)
            .await
            .map_err(|e| ServerError::Security(format!("console login link: {e}")))?;
        Ok(format!("{}{}", self.url(), console::login_path(&code)))
    }

    /// Cancelling this token starts a graceful shutdown.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Graceful shutdown: stop accepting, let in-flight requests finish (bounded by
    /// `shutdown_grace`), stop background work, close the store.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Wait until the server has stopped (after the token was cancelled, or on a fatal error).
    pub async fn wait(self) -> Result<(), ServerError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(ServerError::Task(e.to_string())),
        }
    }
}

/// Start the server and return once it accepts connections and the kubeconfig is written.
///
/// The configuration is validated before anything touches the disk or the network.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    start_with_token(config, CancellationToken::new()).await
}

/// Run the server until `shutdown` is cancelled, then shut down gracefully.
pub async fn run(config: ServerConfig, shutdown: CancellationToken) -> Result<(), ServerError> {
    let server = start_with_token(config, shutdown.child_token()).await?;
    server.wait().await
}

/// This replica's name in tunnel listings: host name and listen port.
fn replica_name(addr: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", addr.port())
}

pub(crate) fn server_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("https://{}", SocketAddr::new(ip, addr.port()))
}

fn serving_sans(config: &ServerConfig) -> Vec<String> {
    let mut sans = vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ];
    let ip = config.listen.ip();
    if !ip.is_unspecified() && !ip.is_loopback() {
        sans.push(ip.to_string());
    }
    sans.extend(config.tls_sans.iter().cloned());
    // Browsers reach the task proxy's origin by this name (validated with the config).
    if let Some(origin) = config
        .proxy_url
        .as_deref()
        .and_then(|url| config::origin_of(url).ok())
        && !sans.contains(&origin.host)
    {
        sans.push(origin.host);
    }
    if let Some(listen) = config.proxy_listen {
        let ip = listen.ip().to_string();
        if !listen.ip().is_unspecified() && !sans.contains(&ip) {
            sans.push(ip);
        }
    }
    sans
}

async fn start_with_token(
    config: ServerConfig,
    shutdown: CancellationToken,
) -> Result<RunningServer, ServerError> {
    config.validate()?;
    let data_dir = config.data_dir.clone();
    rlark_pki::create_private_dir(&data_dir)?;
    // Before anything in it is read or written; held until the server has stopped.
    let data_lock = data_lock::acquire(&data_dir)?;

    // PKI: CA (once), serving certificate (every start), admin certificate (reused).
    let pki_dir = data_dir.join(PKI_DIR);
    let db_path = data_dir.join(DATABASE_FILE);
    // A CA from an earlier start means this installation has a store to lose.
    let ca_existed = pki_dir.join(rlark_pki::CA_CERT_FILE).exists();
    if config.store_url.is_none() {
        store_guard::check_before_open(ca_existed, config.reinitialize_store, &data_dir, &db_path)?;
    }
    let revocation_file =
        security::revocation_file::RevocationFile::load(&pki_dir.join(REVOCATIONS_FILE))
            .map_err(|e| ServerError::Security(e.to_string()))?;
    let ca_secret = match (&config.ca_secret_file, &config.ca_secret) {
        (Some(path), _) => Some(security::ca_store::CaSecret::from_file(path)),
        (None, Some(text)) => Some(
            security::ca_store::CaSecret::new(text.0.as_bytes())
                .map_err(|e| format!("RLARK_CA_SECRET: {e}")),
        ),
        (None, None) => None,
    }
    .transpose()
    .map_err(ServerError::Security)?;

    // The store first: with a shared store, the CAs may come from it.
    let store = open_store(&config, &db_path).await?;
    let pki = async {
        security::ca_store::sync(&store, &pki_dir, ca_secret.as_ref()).await?;
        let ca = Arc::new(Ca::load_or_create(&pki_dir)?);
        let ssh_ca = Arc::new(rlark_pki::ssh::SshCa::load_or_create(&pki_dir)?);
        let ca_cert_hash = ca.cert_hash()?;
        let serving = ca.issue_serving(&serving_sans(&config), config.serving_cert_validity)?;
        let admin = ca.load_or_issue_client(
            &pki_dir.join("admin.crt"),
            &pki_dir.join("admin.key"),
            ADMIN_USER,
            &[rlark_apiserver::auth::ADMIN_GROUP.to_string()],
            config.admin_cert_validity,
        )?;
        Ok::<_, ServerError>((ca, ssh_ca, ca_cert_hash, serving, admin))
    };
    let (ca, ssh_ca, ca_cert_hash, serving, admin) = match pki.await {
        Ok(pki) => pki,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    // Right after opening, before anything else can fail: a first start that fails later
    // (say, the port is taken) has marked its store, so the next start is not refused.
    // The CAs a rotation still trusts: the store's marker may name one of them.
    let previous_ca_hashes: Vec<String> = ca
        .trust_anchors()
        .iter()
        .skip(1)
        .filter_map(|der| rlark_pki::ca_cert_hash(der.as_ref()).ok())
        .collect();
    if let Err(e) = store_guard::check_after_open(
        &store,
        ca_existed,
        config.reinitialize_store,
        &ca_cert_hash,
        &previous_ca_hashes,
        &data_dir,
    )
    .await
    {
        store.close().await;
        return Err(e);
    }
    let audit_path = data_dir.join(AUDIT_LOG_FILE);
    let audit: Arc<dyn rlark_apiserver::audit::AuditSink> =
        match security::audit_file::FileAudit::open(&audit_path, config.audit_log.clone()) {
            Ok(audit) => Arc::new(audit),
            Err(e) => {
                store.close().await;
                return Err(ServerError::Security(format!(
                    "open audit log {}: {e}",
                    audit_path.display()
                )));
            }
        };
    let security = match prepare_security(
        &config,
        Arc::clone(&ca),
        Arc::new(store.clone()),
        Arc::clone(&audit),
        &admin,
        revocation_file,
    )
    .await
    {
        Ok(security) => security,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    let tls_config = match tls::server_config(&ca, &serving, Arc::clone(&security)) {
        Ok(tls_config) => tls_config,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(metrics::StoreCollector {
        store: store.clone(),
    }));
    // Before any connection: raise RLIMIT_NOFILE and size the connection caps from it.
    let gate = limits::Gate::new(&config.connections, limits::raise_nofile_limit().soft);
    registry.register_collector(Box::new(metrics::ConnectionsCollector {
        gate: Arc::clone(&gate),
    }));
    registry.register_collector(Box::new(metrics::CertificatesCollector::from_pems(&[
        ("ca", ca.cert_pem()),
        ("serving", &serving.cert_pem),
    ])));
    let cluster_gauges = metrics::ClusterGauges::default();
    cluster_gauges.register(&mut registry);
    let api = ApiServer::new(Arc::new(store.clone()), config.api.clone(), &mut registry)
        .with_audit(Arc::clone(&audit));
    let prepared = prepare_listener(&config, &api, &data_dir, &ca, &admin).await;
    let (listener, local_addr, url, kubeconfig_path) = match prepared {
        Ok(prepared) => prepared,
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    };
    let proxy_listener = match config.proxy_listen {
        None => None,
        Some(addr) => {
            let bind_err = |source| ServerError::Bind { addr, source };
            let bound = match TcpListener::bind(addr).await {
                Ok(listener) => listener.local_addr().map(|a| (listener, a)),
                Err(e) => Err(e),
            };
            match bound {
                Ok(bound) => Some(bound),
                Err(e) => {
                    store.close().await;
                    return Err(bind_err(e));
                }
            }
        }
    };
    let proxy_url = proxy_listener
        .as_ref()
        .map(|(_, addr)| console::proxy_origin::ProxyUrl::new(config.proxy_url.as_deref(), *addr));
    let controllers = if config.controllers.enabled {
        let kubeconfig = rlark_pki::kubeconfig_yaml(
            &url,
            &ca.bundle_pem(),
            &admin.cert_pem,
            &admin.key_pem,
            ADMIN_USER,
        );
        let prepared =
            controllers::prepare(&config.controllers, &data_dir, &kubeconfig, &mut registry).await;
        match prepared {
            Ok(prepared) => Some(prepared),
            Err(e) => {
                store.close().await;
                return Err(e);
            }
        }
    } else {
        None
    };
    let ready = Arc::new(AtomicBool::new(false));
    let hub = tunnel::Hub::new(replica_name(local_addr), config.tunnel.clone());
    hub.proxy_tls().trust_pem(&ca.bundle_pem());
    let advertise_url = config
        .tunnel
        .advertise_url
        .clone()
        .or_else(|| tunnel::replicas::default_advertise_url(local_addr, &config.tls_sans));
    let replicas = tunnel::replicas::Replicas::new(
        Arc::new(store.clone()),
        replica_name(local_addr),
        advertise_url,
        config.tunnel.peer_url.clone(),
        config.tunnel.peers.clone(),
    );
    match peer_tls(&config, &ca, &security, local_addr).await {
        Ok(tls) => hub.set_peer_link(tunnel::peer::PeerLink::new(
            Arc::clone(&replicas),
            replicas.my_peer_address(),
            tls,
        )),
        Err(e) => {
            store.close().await;
            return Err(e);
        }
    }
    registry.register_collector(Box::new(tunnel::HubCollector {
        hub: Arc::clone(&hub),
    }));
    let background = CancellationToken::new();
    let reports_routes = reports::router(reports::ReportsState::new(
        Arc::new(store.clone()),
        Arc::clone(&security),
        background.clone(),
        api.rate_limiter(),
    ));
    let ssh_ca_fingerprint = ssh_ca.fingerprint();
    let ssh_ca_public_key = ssh_ca.public_key_openssh();
    let security_routes = security::routes::router(security::routes::RoutesState {
        security: Arc::clone(&security),
        ssh_ca,
        api: api.clone(),
        shutdown: background.clone(),
    });
    let ssh_keys = ssh::keys::SshKeys::new(Arc::new(store.clone()));
    let ssh_metrics = ssh::limits::SshMetrics::default();
    if config.ssh_listen.is_some() {
        ssh_metrics.register(&mut registry);
    }
    let ssh = match config.ssh_listen {
        None => None,
        Some(listen) => {
            let state = Arc::new(ssh::SshState {
                store: Arc::new(store.clone()),
                hub: Arc::clone(&hub),
                security: Arc::clone(&security),
                audit: Arc::clone(&audit),
                keys: Arc::clone(&ssh_keys),
                ssh_ca_fingerprint: ssh_ca_fingerprint.clone(),
                shutdown: background.clone(),
                limits: config.ssh.clone(),
                metrics: ssh_metrics.clone(),
                user_channels: Arc::default(),
            });
            match ssh::start(listen, &pki_dir, state).await {
                Ok((endpoint, _task)) => Some(endpoint),
                Err(e) => {
                    store.close().await;
                    return Err(ServerError::Ssh(e));
                }
            }
        }
    };
    let ssh_routes = ssh::key_routes::router(ssh::key_routes::KeyRoutes {
        keys: ssh_keys,
        audit: Arc::clone(&audit),
        endpoint: ssh.clone(),
        ca_public_key: ssh_ca_public_key,
    });
    let exec_state = tunnel::exec::ExecState::new(
        Arc::clone(&hub),
        Arc::new(store.clone()),
        Arc::clone(&audit),
    );
    let task_proxy_routes = tunnel::task_proxy::router(tunnel::task_proxy::TaskProxyState {
        hub: Arc::clone(&hub),
        store: Arc::new(store.clone()),
        audit: Arc::clone(&audit),
        proxy_url: proxy_url.clone(),
    });
    let router = http::router(
        http::ProcessState {
            ready: ready.clone(),
            store: store.clone(),
            metrics: Arc::new(registry),
        },
        api.router(),
    )
    .merge(security_routes)
    .merge(backup::router(store.clone()))
    .merge(ssh_routes)
    .merge(reports_routes)
    .merge(tunnel::routes::router(Arc::clone(&hub)))
    .merge(tunnel::netcheck::router(
        tunnel::netcheck::NetCheckState::new(Arc::clone(&hub), Arc::new(store.clone())),
    ))
    .merge(tunnel::exec::router(exec_state.clone()))
    .merge(task_proxy_routes.clone())
    .merge(tunnel::devices::router(tunnel::devices::DevicesState {
        hub: Arc::clone(&hub),
        audit: Arc::clone(&audit),
    }))
    .merge(
        axum::Router::new()
            .route(
                tunnel::replicas::ROUTE,
                axum::routing::get(tunnel::replicas::list),
            )
            .with_state(Arc::clone(&replicas)),
    );
    // Core Pods' log and exec reach the replicas' agents, unless core Pods are an extra
    // kind's stored objects (a simulated member cluster's own).
    let router = if config.api.core_pods_are_replicas() {
        router.merge(tunnel::core_pods::router(
            Arc::clone(&hub),
            exec_state.clone(),
        ))
    } else {
        router
    };
    // Handlers whose state has no store find it here (task access of replica logs).
    let router = router.layer(axum::Extension(task_access::AccessStore(Arc::new(
        store.clone(),
    ))));
    // The web console: its app and routes, and its session cookie for every route.
    let console = console::Console::new(Arc::clone(&security), Arc::new(store.clone()));
    let proxy_origin = console::proxy_origin::ProxyOrigin {
        console: console.clone(),
        url: proxy_url.clone(),
    };
    // RLark's gateway REST for RLark's console (docs/rlark-gateway.md): it calls the routes
    // above as its caller, and its own session cookie works on its paths only (outermost).
    let gateway = gateway::Gateway::new(
        router.clone(),
        Arc::clone(&console.sessions),
        Arc::clone(&security),
    );
    let gateway_auth = gateway.auth();
    let router = router
        .merge(console::router(console.clone()))
        .merge(console::proxy_origin::tickets_router(proxy_origin.clone()))
        .merge(changes::router(Arc::new(store.clone())))
        .merge(gateway::router(gateway))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            console::session_layer,
        ))
        .layer(axum::middleware::from_fn_with_state(
            gateway_auth,
            gateway::auth::layer,
        ));
    // The routes merged after `http::router` get the same panic handler.
    let router = http::catch_panics(router);
    // The task proxy's origin: the proxy routes, its login and /healthz only.
    let proxy_router = http::catch_panics(
        console::proxy_origin::router(proxy_origin, task_proxy_routes).layer(axum::Extension(
            task_access::AccessStore(Arc::new(store.clone())),
        )),
    );

    let background_task = {
        let api = api.clone();
        let token = background.clone();
        let security = Arc::clone(&security);
        let hub = Arc::clone(&hub);
        let reports_store: Arc<dyn rlark_store::Store> = Arc::new(store.clone());
        let reports_store_for_relay = Arc::clone(&reports_store);
        let gauges_store = store.clone();
        tokio::spawn(async move {
            tokio::join!(
                cluster_gauges.run(gauges_store, token.clone()),
                api.run_background(token.clone()),
                reports::collect_deleted_task_reports(reports_store, token.clone()),
                Arc::clone(&security).follow_revocations(token.clone()),
                Arc::clone(&hub).enforce_revocations(security, token.clone()),
                hub.relay().run(reports_store_for_relay, token.clone()),
                Arc::clone(&replicas).run(token)
            );
        })
    };
    ready.store(true, Ordering::Release);
    tracing::info!(
        addr = %local_addr,
        %url,
        kubeconfig = %kubeconfig_path.display(),
        ca_cert_hash = %ca_cert_hash,
        "listening"
    );

    let proxy_addr = proxy_listener.as_ref().map(|(_, addr)| *addr);
    let proxy_serve = proxy_listener.map(|(listener, addr)| {
        tracing::info!(%addr, url = ?proxy_url.as_ref().map(|u| u.for_console(None)), "task proxy origin listening");
        Serve {
            listener,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::clone(&tls_config)),
            router: proxy_router,
            security: Arc::clone(&security),
            tunnel: exec_state.clone(),
            handshake_timeout: config.tls_handshake_timeout,
            grace: config.shutdown_grace,
            ready: Arc::new(AtomicBool::new(true)),
            gate: Arc::clone(&gate),
            limits: Arc::new(config.connections.clone()),
        }
    });
    let serve = Serve {
        listener,
        acceptor: tokio_rustls::TlsAcceptor::from(tls_config),
        router,
        security,
        tunnel: exec_state,
        handshake_timeout: config.tls_handshake_timeout,
        grace: config.shutdown_grace,
        ready,
        gate,
        limits: Arc::new(config.connections.clone()),
    };
    let controllers = controllers.map(|c| {
        tracing::info!(
            leader_election = config.controllers.leader_election,
            "starting in-process controllers"
        );
        c.start()
    });
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        // The controllers stop first (releasing their Lease through the still-open
        // listener); then the listener closes.
        let serve_token = CancellationToken::new();
        let stopper = {
            let serve_token = serve_token.clone();
            async move {
                token.cancelled().await;
                if let Some(controllers) = controllers {
                    controllers.stop().await;
                }
                // Upgraded tunnel connections are not HTTP connections any more: the
                // graceful drain does not see them, so close them here.
                hub.close_all();
                serve_token.cancel();
            }
        };
        // Background work stops (and open watches end) as soon as shutdown begins, so
        // long-running watches do not hold the graceful shutdown for the whole grace period.
        let proxy_serve = async {
            if let Some(proxy_serve) = proxy_serve {
                // Its own background token: the main listener's run cancels the shared one.
                proxy_serve
                    .run(serve_token.clone(), &CancellationToken::new())
                    .await;
            }
        };
        tokio::join!(
            serve.run(serve_token.clone(), &background),
            proxy_serve,
            stopper
        );
        if let Err(e) = background_task.await {
            tracing::error!(error = %e, "API background task failed");
        }
        store.close().await;
        drop(data_lock);
        tracing::info!("server stopped");
        Ok(())
    });

    Ok(RunningServer {
        local_addr,
        kubeconfig_path,
        data_dir,
        ca_cert_hash,
        ssh,
        proxy_addr,
        proxy_url,
        console,
        shutdown,
        task,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn store_urls_lose_their_password_in_messages() {
        assert_eq!(
            redact_url("postgres://rlark:s3cret@db.example:5432/rlark?sslmode=require"),
            "postgres://rlark@db.example:5432/rlark?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://rlark@127.0.0.1/rlark"),
            "postgres://rlark@127.0.0.1/rlark"
        );
        assert_eq!(redact_url("postgres://db/rlark"), "postgres://db/rlark");
    }

    #[test]
    fn a_store_url_must_be_postgres() {
        let mut config = ServerConfig::new("/d");
        config.store_url = Some("sqlite://user:secret@x/y".into());
        let message = config.validate().expect_err("refused").to_string();
        assert!(message.contains("store.url"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        config.store_url = Some("postgres://rlark@db/rlark".into());
        config.validate().expect("a postgres URL is accepted");
    }
    use super::*;

    #[test]
    fn url_uses_loopback_for_wildcard_listeners() {
        assert_eq!(
            server_url("0.0.0.0:8443".parse().expect("addr")),
            "https://127.0.0.1:8443"
        );
        assert_eq!(
            server_url("[::]:8443".parse().expect("addr")),
            "https://[::1]:8443"
        );
        assert_eq!(
            server_url("10.1.2.3:1".parse().expect("addr")),
            "https://10.1.2.3:1"
        );
    }

    #[test]
    fn serving_sans_include_defaults_listen_ip_and_extras() {
        let mut config = ServerConfig::new("/d");
        config.listen = "10.1.2.3:8443".parse().expect("addr");
        config.tls_sans = vec!["rlark.example.com".into()];
        assert_eq!(
            serving_sans(&config),
            [
                "localhost",
                "127.0.0.1",
                "::1",
                "10.1.2.3",
                "rlark.example.com"
            ]
        );
        // The task proxy's origin is reached by its own name, and at its listen address.
        config.proxy_listen = Some("10.1.2.4:8444".parse().expect("addr"));
        config.proxy_url = Some("https://Apps.Example.org:8444".into());
        let sans = serving_sans(&config);
        assert!(sans.contains(&"apps.example.org".to_string()), "{sans:?}");
        assert!(sans.contains(&"10.1.2.4".to_string()), "{sans:?}");
        // rlark up's proxy URLs (localhost for a console at 127.0.0.1, and the reverse).
        assert!(sans.contains(&"localhost".to_string()) && sans.contains(&"127.0.0.1".to_string()));
    }
}
