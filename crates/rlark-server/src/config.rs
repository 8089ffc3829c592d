//! Server configuration: built-in defaults, an optional YAML file, command-line overrides.
//!
//! Precedence, lowest first: defaults < config file < flags. Everything is validated by
//! [`ServerConfig::validate`] before any port is bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlark_apiserver::ApiServerOptions;
use serde::Deserialize;

/// Default listen address: loopback only.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 8443);

/// Errors of loading or validating configuration. Messages name the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {field}: {message}")]
    Invalid { field: String, message: String },
    #[error("no data directory: pass --data-dir or set dataDir in the config file")]
    MissingDataDir,
}

/// A secret's text; `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretText(pub String);

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretText(..)")
    }
}

/// Everything the server process needs to start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Holds `pki/`, `rlark.db` and `admin.kubeconfig`. Created with mode 0700 when missing.
    pub data_dir: PathBuf,
    /// Address of the HTTPS listener. Port 0 picks a free port (see `RunningServer::local_addr`).
    pub listen: SocketAddr,
    /// Extra subject alternative names (DNS names or IP addresses) of the serving
    /// certificate, besides `localhost`, `127.0.0.1`, `::1` and a specific listen IP.
    pub tls_sans: Vec<String>,
    /// API server tunables.
    pub api: ApiServerOptions,
    /// On shutdown, how long in-flight requests may run before connections are closed.
    pub shutdown_grace: Duration,
    /// A client that has not finished the TLS handshake after this long is disconnected.
    pub tls_handshake_timeout: Duration,
    /// Lifetime of the serving certificate (re-issued at every start).
    pub serving_cert_validity: Duration,
    /// Lifetime of the admin client certificate (re-issued when it expires within a day).
    pub admin_cert_validity: Duration,
    /// Change-log events the store keeps for watches; older ones are compacted (a watch from
    /// there gets 410 Gone). See `rlark_store::SqliteStoreConfig::log_capacity`.
    pub store_log_capacity: usize,
    /// Bytes (estimated) of objects the store's change log keeps for watches; the oldest
    /// events are compacted when either this or [`Self::store_log_capacity`] is exceeded.
    /// See `rlark_store::SqliteStoreConfig::log_capacity_bytes`.
    pub store_log_capacity_bytes: usize,
    /// Bytes of events (their JSON) one watch may have waiting, not yet taken by its client,
    /// before it is cut (it ends with a 410 and the client relists): a client that stops
    /// reading holds at most this much of the server's memory (config file
    /// `store.watchBufferBytes`, default 8 MiB). See
    /// `rlark_store::EngineConfig::watch_buffer_bytes`.
    pub store_watch_buffer_bytes: usize,
    /// Where the store is: `None` for SQLite in the data directory (`DATA_DIR/rlark.db`, the
    /// default), or a `postgres://user:password@host:port/database` URL (`--store`,
    /// `RLARK_STORE`, config file `store.url`). Several replicas may share one PostgreSQL database.
    pub store_url: Option<String>,
    /// A file holding the secret that seals the CA keys in the store (`--ca-secret-file`,
    /// `RLARK_CA_SECRET_FILE`, config file `store.caSecretFile`): with it, the installation's
    /// CAs are kept in the store (keys sealed) and replicas sharing the store take them from
    /// there; see `security::ca_store`. `None`: the CAs live in `pki/` only.
    pub ca_secret_file: Option<PathBuf>,
    /// The same secret given directly (`RLARK_CA_SECRET`, for platforms that inject secrets
    /// as environment variables); at most one of the two.
    pub ca_secret: Option<SecretText>,
    /// The controllers run in-process (see [`ControllersConfig`]).
    pub controllers: ControllersConfig,
    /// Lifetimes of agent and user certificates and bootstrap tokens.
    pub security: crate::security::SecurityConfig,
    /// Agent tunnels: multiplexer windows and limits, dial deadline.
    pub tunnel: crate::tunnel::TunnelConfig,
    /// Start although the data directory's CA shows an earlier start and `rlark.db` is
    /// missing or empty (`--reinitialize-store`, default false): the store begins empty and
    /// revocations are restored from `pki/revocations.json`. Without it such a start is
    /// refused. No effect on a store that holds data.
    pub reinitialize_store: bool,
    /// Rotation of `DATA_DIR/audit.log`.
    pub audit_log: crate::AuditLogConfig,
    /// Listener timeouts and connection caps (header-read and idle timeouts, per-IP and
    /// global caps with a reserve for admin clients and health probes, HTTP/2 limits).
    pub connections: crate::limits::ConnectionLimits,
    /// Address of the SSH endpoint (`--ssh-listen`; docs/ssh.md); `None` (the default):
    /// no SSH endpoint.
    pub ssh_listen: Option<SocketAddr>,
    /// The SSH endpoint's limits: connections per source and the reserve, the login
    /// deadline, sessions and channels per connection and per user (the `ssh` section).
    pub ssh: crate::ssh::limits::SshLimits,
    /// Address of the task proxy's own origin (`--proxy-listen`; docs/ssh.md, "The task
    /// proxy's origin"); `None` (the default): no proxy origin, and browsers cannot open
    /// task apps (bearer tokens and certificates still reach the proxy routes on `listen`).
    pub proxy_listen: Option<SocketAddr>,
    /// The `https://` URL browsers reach [`Self::proxy_listen`] at (`--proxy-url`,
    /// `proxyURL`), scheme, host and port, no path. `None`: derived from the bound address
    /// (a loopback or wildcard address becomes `localhost` when the console is reached as
    /// `127.0.0.1` and `127.0.0.1` otherwise, so the two are different sites). Its host is
    /// added to the serving certificate's names.
    pub proxy_url: Option<String>,
}

/// The controllers the server runs in its own process.
///
/// [`ServerConfig::new`] leaves them **off** (embedders and tests start
/// `rlark_controllers::manager` themselves, with their own tunables);
/// [`ServerConfig::resolve`] — what `rlark server` uses — turns them **on** unless the
/// config file says `controllers: {enabled: false}` or the flag `--controllers=false`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllersConfig {
    /// Run the Job, Workflow, Task and Node controllers in this process.
    pub enabled: bool,
    /// Run them only while holding the `default/rlark-controller-manager` Lease (default
    /// true), so this server and an `rlark controller-manager` (or another replica) never
    /// both act. It costs one Lease update every 2 s. The server's identity is stable
    /// across restarts (host name + data directory), so a restarted server takes its Lease
    /// back at once instead of waiting for it to expire.
    pub leader_election: bool,
    /// A Node whose heartbeat is older than this becomes `Offline` (default 40 s).
    pub node_grace_period: Duration,
}

impl Default for ControllersConfig {
    /// Off; leader election on; 40 s grace period.
    fn default() -> Self {
        Self {
            enabled: false,
            leader_election: true,
            node_grace_period: Duration::from_secs(40),
        }
    }
}

/// Longest duration any setting may have (ten years): every duration is added to a clock
/// reading somewhere, and a sum past what the clock can represent panics.
pub const MAX_CONFIG_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

impl ServerConfig {
    /// Defaults for everything but the data directory.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            listen: DEFAULT_LISTEN,
            tls_sans: Vec::new(),
            api: ApiServerOptions::default(),
            shutdown_grace: Duration::from_secs(10),
            tls_handshake_timeout: Duration::from_secs(10),
            serving_cert_validity: Duration::from_secs(365 * 24 * 3600),
            admin_cert_validity: Duration::from_secs(365 * 24 * 3600),
            store_log_capacity: rlark_store::SqliteStoreConfig::new("").log_capacity,
            store_log_capacity_bytes: rlark_store::SqliteStoreConfig::new("").log_capacity_bytes,
            store_watch_buffer_bytes: rlark_store::DEFAULT_WATCH_BUFFER_BYTES,
            store_url: None,
            ca_secret_file: None,
            ca_secret: None,
            controllers: ControllersConfig::default(),
            security: crate::security::SecurityConfig::default(),
            tunnel: crate::tunnel::TunnelConfig::default(),
            reinitialize_store: false,
            audit_log: crate::AuditLogConfig::default(),
            connections: crate::limits::ConnectionLimits::default(),
            ssh_listen: None,
            ssh: crate::ssh::limits::SshLimits::default(),
            proxy_listen: None,
            proxy_url: None,
        }
    }

    /// Defaults, then `file` (when given), then `overrides`; validated.
    pub fn resolve(
        file: Option<ServerConfigFile>,
        overrides: ServerOverrides,
    ) -> Result<ServerConfig, ConfigError> {
        let file = file.unwrap_or_default();
        let data_dir = overrides
            .data_dir
            .or(file.data_dir)
            .ok_or(ConfigError::MissingDataDir)?;
        let mut config = ServerConfig::new(data_dir);
        if let Some(listen) = &file.listen {
            config.listen = listen.parse().map_err(|e| ConfigError::Invalid {
                field: "listen".to_string(),
                message: format!("{listen:?} is not an address like 127.0.0.1:8443 ({e})"),
            })?;
        }
        if let Some(listen) = &file.ssh_listen {
            config.ssh_listen = Some(listen.parse().map_err(|e| ConfigError::Invalid {
                field: "sshListen".to_string(),
                message: format!("{listen:?} is not an address like 127.0.0.1:2222 ({e})"),
            })?);
        }
        if let Some(listen) = &file.proxy_listen {
            config.proxy_listen = Some(listen.parse().map_err(|e| ConfigError::Invalid {
                field: "proxyListen".to_string(),
                message: format!("{listen:?} is not an address like 127.0.0.1:8444 ({e})"),
            })?);
        }
        if let Some(url) = file.proxy_url {
            config.proxy_url = Some(url);
        }
        if let Some(sans) = file.tls_sans {
            config.tls_sans = sans;
        }
        if let Some(secs) = file.shutdown_grace_seconds {
            config.shutdown_grace = Duration::from_secs(secs);
        }
        if let Some(api) = file.api {
            if let Some(v) = api.max_request_bytes {
                config.api.max_request_bytes = v;
            }
            if let Some(v) = api.bookmark_interval_seconds {
                config.api.bookmark_interval = Duration::from_secs(v);
            }
            if let Some(v) = api.default_watch_timeout_seconds {
                config.api.default_watch_timeout = Duration::from_secs(v);
            }
            if let Some(v) = api.max_nodes_per_agent {
                config.api.max_nodes_per_agent = v;
            }
            if let Some(limits) = api.limits {
                limits.apply(&mut config.api.limits);
            }
        }
        if let Some(store) = file.store {
            if let Some(v) = store.log_capacity {
                config.store_log_capacity = v;
            }
            if let Some(v) = store.log_capacity_bytes {
                config.store_log_capacity_bytes = v;
            }
            if let Some(v) = store.watch_buffer_bytes {
                config.store_watch_buffer_bytes = v;
            }
            if let Some(url) = store.url {
                config.store_url = Some(url);
            }
            if let Some(path) = store.ca_secret_file {
                config.ca_secret_file = Some(path);
            }
        }
        config.controllers.enabled = true;
        if let Some(controllers) = file.controllers {
            if let Some(v) = controllers.enabled {
                config.controllers.enabled = v;
            }
            if let Some(v) = controllers.leader_election {
                config.controllers.leader_election = v;
            }
            if let Some(v) = controllers.node_grace_period_seconds {
                config.controllers.node_grace_period = Duration::from_secs(v);
            }
        }
        if let Some(security) = file.security {
            if let Some(v) = security.agent_cert_validity_seconds {
                config.security.agent_cert_validity = Duration::from_secs(v);
            }
            if let Some(v) = security.user_cert_validity_seconds {
                config.security.user_cert_validity = Duration::from_secs(v);
            }
            if let Some(v) = security.max_bootstrap_token_ttl_seconds {
                config.security.max_bootstrap_token_ttl = Duration::from_secs(v);
            }
            if let Some(v) = security.join_failure_burst {
                config.security.join_limit.burst = v;
            }
            if let Some(v) = security.join_failure_refill_seconds {
                config.security.join_limit.refill = Duration::from_secs(v);
            }
            if let Some(v) = security.join_max_backoff_seconds {
                config.security.join_limit.max_backoff = Duration::from_secs(v);
            }
        }
        if let Some(v) = file.reinitialize_store {
            config.reinitialize_store = v;
        }
        if let Some(audit_log) = file.audit_log {
            if let Some(v) = audit_log.max_file_bytes {
                config.audit_log.max_file_bytes = v;
            }
            if let Some(v) = audit_log.max_files {
                config.audit_log.max_files = v;
            }
        }
        if let Some(tunnel) = file.tunnel {
            if let Some(v) = tunnel.window_bytes {
                config.tunnel.mux.window = v;
            }
            match tunnel.start_window_bytes {
                Some(v) => config.tunnel.mux.start_window = v,
                // A window set below the default start window caps it (validated below
                // only when given explicitly).
                None => {
                    config.tunnel.mux.start_window =
                        config.tunnel.mux.start_window.min(config.tunnel.mux.window);
                }
            }
            if let Some(v) = tunnel.max_streams {
                config.tunnel.mux.max_streams = v;
            }
            if let Some(v) = tunnel.idle_stream_timeout_seconds {
                config.tunnel.mux.idle_stream_timeout = (v > 0).then(|| Duration::from_secs(v));
            }
            if let Some(v) = tunnel.keepalive_timeout_seconds {
                config.tunnel.mux.keepalive_timeout = Duration::from_secs(v);
            }
            if let Some(v) = tunnel.dial_timeout_seconds {
                config.tunnel.dial_timeout = Duration::from_secs(v);
            }
            if let Some(v) = tunnel.advertise_url {
                config.tunnel.advertise_url = Some(v);
            }
            if let Some(v) = tunnel.peer_url {
                config.tunnel.peer_url = Some(v);
            }
            if let Some(v) = tunnel.peers {
                config.tunnel.peers = v;
            }
            if let Some(v) = tunnel.max_streams_per_user {
                config.tunnel.max_streams_per_user = Some(v);
            }
        }
        if let Some(ssh) = file.ssh {
            let limits = &mut config.ssh;
            if let Some(v) = ssh.max_connections {
                limits.max_connections = v;
            }
            if let Some(v) = ssh.max_connections_per_ip {
                limits.max_connections_per_ip = v;
            }
            if let Some(v) = ssh.reserved_connections {
                limits.reserved_connections = v;
            }
            if let Some(v) = ssh.reserved_connections_per_ip {
                limits.reserved_connections_per_ip = v;
            }
            if let Some(v) = ssh.login_deadline_seconds {
                limits.login_deadline = Duration::from_secs(v);
            }
            if let Some(v) = ssh.max_sessions_per_connection {
                limits.max_sessions_per_connection = v;
            }
            if let Some(v) = ssh.max_channels_per_connection {
                limits.max_channels_per_connection = v;
            }
            if let Some(v) = ssh.max_sessions_per_user {
                limits.max_sessions_per_user = v;
            }
            if let Some(v) = ssh.max_channels_per_user {
                limits.max_channels_per_user = v;
            }
        }
        if let Some(c) = file.connections {
            let secs = Duration::from_secs;
            let limits = &mut config.connections;
            if let Some(v) = c.max_connections {
                limits.max_connections = Some(v);
            }
            if let Some(v) = c.max_connections_per_ip {
                limits.max_connections_per_ip = v;
            }
            if let Some(v) = c.reserved_connections {
                limits.reserved_connections = v;
            }
            if let Some(v) = c.reserved_connections_per_ip {
                limits.reserved_connections_per_ip = v;
            }
            if let Some(v) = c.reserve_deadline_seconds {
                limits.reserve_deadline = secs(v);
            }
            if let Some(v) = c.header_read_timeout_seconds {
                limits.header_read_timeout = secs(v);
            }
            if let Some(v) = c.idle_timeout_seconds {
                limits.idle_timeout = secs(v);
            }
            if let Some(v) = c.http2_keepalive_interval_seconds {
                limits.http2_keepalive_interval = (v > 0).then(|| secs(v));
            }
            if let Some(v) = c.http2_keepalive_timeout_seconds {
                limits.http2_keepalive_timeout = secs(v);
            }
            if let Some(v) = c.http2_max_concurrent_streams {
                limits.http2_max_concurrent_streams = v;
            }
            if let Some(v) = c.http2_max_header_list_bytes {
                limits.http2_max_header_list_size = v;
            }
            if let Some(v) = c.http2_max_pending_accept_reset_streams {
                limits.http2_max_pending_accept_reset_streams = v;
            }
            if let Some(v) = c.http2_max_local_error_reset_streams {
                limits.http2_max_local_error_reset_streams = v;
            }
        }
        if let Some(v) = overrides.max_connections {
            config.connections.max_connections = Some(v);
        }
        if let Some(v) = overrides.max_connections_per_ip {
            config.connections.max_connections_per_ip = v;
        }
        if let Some(v) = overrides.reserved_connections {
            config.connections.reserved_connections = v;
        }
        if let Some(v) = overrides.header_read_timeout {
            config.connections.header_read_timeout = v;
        }
        if let Some(v) = overrides.idle_timeout {
            config.connections.idle_timeout = v;
        }
        if let Some(url) = overrides.peer_url {
            config.tunnel.peer_url = Some(url);
        }
        if let Some(enabled) = overrides.controllers {
            config.controllers.enabled = enabled;
        }
        if let Some(listen) = overrides.ssh_listen {
            config.ssh_listen = Some(listen);
        }
        if let Some(listen) = overrides.proxy_listen {
            config.proxy_listen = Some(listen);
        }
        if let Some(url) = overrides.proxy_url {
            config.proxy_url = Some(url);
        }
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if let Some(ttl) = overrides.event_ttl {
            config.api.limits.event_ttl = ttl;
        }
        if !overrides.tls_sans.is_empty() {
            config.tls_sans = overrides.tls_sans;
        }
        if overrides.reinitialize_store {
            config.reinitialize_store = true;
        }
        if let Some(url) = overrides.store_url {
            config.store_url = Some(url);
        }
        if let Some(path) = overrides.ca_secret_file {
            config.ca_secret_file = Some(path);
        }
        if let Some(secret) = overrides.ca_secret {
            config.ca_secret = Some(SecretText(secret));
        }
        if let Some(v) = overrides.max_nodes_per_agent {
            config.api.max_nodes_per_agent = v;
        }
        config.validate()?;
        Ok(config)
    }

    /// Check every field; the error names the offending one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            field: field.to_string(),
            message,
        };
        if self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::MissingDataDir);
        }
        for (i, san) in self.tls_sans.iter().enumerate() {
            rlark_pki::validate_san(san)
                .map_err(|e| invalid(&format!("tlsSans[{i}]"), e.to_string()))?;
        }
        if self.api.max_request_bytes == 0 {
            return Err(invalid("api.maxRequestBytes", "must be positive".into()));
        }
        if self.api.bookmark_interval.is_zero() {
            return Err(invalid(
                "api.bookmarkIntervalSeconds",
                "must be positive".into(),
            ));
        }
        if self.api.default_watch_timeout.is_zero() {
            return Err(invalid(
                "api.defaultWatchTimeoutSeconds",
                "must be positive".into(),
            ));
        }
        if self.api.max_nodes_per_agent == 0 {
            return Err(invalid(
                "api.maxNodesPerAgent",
                "must be at least 1 (every agent registers its Node)".into(),
            ));
        }
        if self.api.default_watch_timeout > rlark_apiserver::MAX_WATCH_TIMEOUT {
            return Err(invalid(
                "api.defaultWatchTimeoutSeconds",
                format!(
                    "must be at most {} (a watch's longest life)",
                    rlark_apiserver::MAX_WATCH_TIMEOUT.as_secs()
                ),
            ));
        }
        // Each duration is added to a clock reading somewhere (deadlines, certificate and
        // token expiry): beyond ten years a value is a typo and its sum could overflow.
        for (field, value) in [
            ("shutdownGraceSeconds", Some(self.shutdown_grace)),
            ("tlsHandshakeTimeout", Some(self.tls_handshake_timeout)),
            (
                "api.bookmarkIntervalSeconds",
                Some(self.api.bookmark_interval),
            ),
            (
                "controllers.nodeGracePeriodSeconds",
                Some(self.controllers.node_grace_period),
            ),
            (
                "security.agentCertValiditySeconds",
                Some(self.security.agent_cert_validity),
            ),
            (
                "security.userCertValiditySeconds",
                Some(self.security.user_cert_validity),
            ),
            (
                "security.maxBootstrapTokenTtlSeconds",
                Some(self.security.max_bootstrap_token_ttl),
            ),
            (
                "tunnel.idleStreamTimeoutSeconds",
                self.tunnel.mux.idle_stream_timeout,
            ),
            (
                "tunnel.keepaliveTimeoutSeconds",
                Some(self.tunnel.mux.keepalive_timeout),
            ),
            ("servingCertValidity", Some(self.serving_cert_validity)),
            ("adminCertValidity", Some(self.admin_cert_validity)),
        ] {
            if value.is_some_and(|v| v > MAX_CONFIG_DURATION) {
                return Err(invalid(
                    field,
                    format!(
                        "must be at most {} seconds (10 years)",
                        MAX_CONFIG_DURATION.as_secs()
                    ),
                ));
            }
        }
        for (field, value) in [
            (
                "security.agentCertValiditySeconds",
                self.security.agent_cert_validity,
            ),
            (
                "security.userCertValiditySeconds",
                self.security.user_cert_validity,
            ),
            (
                "security.maxBootstrapTokenTtlSeconds",
                self.security.max_bootstrap_token_ttl,
            ),
        ] {
            if value < Duration::from_secs(1) {
                return Err(invalid(field, "must be at least 1".into()));
            }
        }
        let join = &self.security.join_limit;
        if !(1..=10_000).contains(&join.burst) {
            return Err(invalid(
                "security.joinFailureBurst",
                format!("must be between 1 and 10000, got {}", join.burst),
            ));
        }
        for (field, value) in [
            ("security.joinFailureRefillSeconds", join.refill),
            ("security.joinMaxBackoffSeconds", join.max_backoff),
        ] {
            if value < Duration::from_secs(1) || value > Duration::from_secs(24 * 3600) {
                return Err(invalid(
                    field,
                    format!("must be between 1 and 86400, got {}", value.as_secs()),
                ));
            }
        }
        let audit = &self.audit_log;
        if audit.max_file_bytes < crate::AuditLogConfig::MIN_FILE_BYTES {
            return Err(invalid(
                "auditLog.maxFileBytes",
                format!(
                    "must be at least {}, got {}",
                    crate::AuditLogConfig::MIN_FILE_BYTES,
                    audit.max_file_bytes
                ),
            ));
        }
        if !(1..=crate::AuditLogConfig::MAX_FILES).contains(&audit.max_files) {
            return Err(invalid(
                "auditLog.maxFiles",
                format!(
                    "must be between 1 and {}, got {}",
                    crate::AuditLogConfig::MAX_FILES,
                    audit.max_files
                ),
            ));
        }
        if self.tunnel.mux.window < rlark_tunnel::mux::INITIAL_WINDOW {
            return Err(invalid(
                "tunnel.windowBytes",
                format!("must be at least {}", rlark_tunnel::mux::INITIAL_WINDOW),
            ));
        }
        if self.tunnel.mux.start_window < rlark_tunnel::mux::INITIAL_WINDOW
            || self.tunnel.mux.start_window > self.tunnel.mux.window
        {
            return Err(invalid(
                "tunnel.startWindowBytes",
                format!(
                    "must be between {} and tunnel.windowBytes ({}), got {}",
                    rlark_tunnel::mux::INITIAL_WINDOW,
                    self.tunnel.mux.window,
                    self.tunnel.mux.start_window
                ),
            ));
        }
        if self.tunnel.mux.max_streams == 0 {
            return Err(invalid("tunnel.maxStreams", "must be positive".into()));
        }
        if let Some(share) = self.tunnel.max_streams_per_user
            && (share == 0 || share > self.tunnel.mux.max_streams)
        {
            return Err(invalid(
                "tunnel.maxStreamsPerUser",
                format!(
                    "must be between 1 and tunnel.maxStreams ({}), got {share}",
                    self.tunnel.mux.max_streams
                ),
            ));
        }
        self.ssh
            .validate()
            .map_err(|(field, message)| invalid(field, message))?;
        if self.tunnel.mux.keepalive_timeout <= self.tunnel.mux.keepalive_interval {
            return Err(invalid(
                "tunnel.keepaliveTimeoutSeconds",
                format!(
                    "must be longer than the keep-alive interval ({}s)",
                    self.tunnel.mux.keepalive_interval.as_secs()
                ),
            ));
        }
        if let Some(url) = &self.tunnel.advertise_url {
            crate::tunnel::replicas::check_url(url)
                .map_err(|reason| invalid("tunnel.advertiseURL", reason))?;
        }
        if let Some(url) = &self.tunnel.peer_url {
            crate::tunnel::replicas::check_url(url)
                .map_err(|reason| invalid("tunnel.peerURL", reason))?;
        }
        for (i, url) in self.tunnel.peers.iter().enumerate() {
            crate::tunnel::replicas::check_url(url)
                .map_err(|reason| invalid(&format!("tunnel.peers[{i}]"), reason))?;
        }
        if self.tunnel.dial_timeout.is_zero()
            || self.tunnel.dial_timeout > rlark_tunnel::header::MAX_DIAL_TIMEOUT
        {
            return Err(invalid(
                "tunnel.dialTimeoutSeconds",
                format!(
                    "must be between 1 and {}",
                    rlark_tunnel::header::MAX_DIAL_TIMEOUT.as_secs()
                ),
            ));
        }
        if self.controllers.node_grace_period.is_zero() {
            return Err(invalid(
                "controllers.nodeGracePeriodSeconds",
                "must be positive".into(),
            ));
        }
        if self.ca_secret_file.is_some() && self.ca_secret.is_some() {
            return Err(ConfigError::Invalid {
                field: "store.caSecretFile".to_string(),
                message: "give the CA secret once: --ca-secret-file (or store.caSecretFile) or \
                          RLARK_CA_SECRET, not both"
                    .to_string(),
            });
        }
        if let Some(url) = &self.store_url
            && !(url.starts_with("postgres://") || url.starts_with("postgresql://"))
        {
            // Not echoed: a mistyped URL may still carry a password.
            return Err(invalid(
                "store.url",
                "must start with postgres:// or postgresql:// (SQLite, the default, needs no URL)"
                    .into(),
            ));
        }
        if self.store_log_capacity == 0 {
            return Err(invalid("store.logCapacity", "must be positive".into()));
        }
        self.connections
            .validate()
            .map_err(|(field, message)| invalid(field, message))?;
        // Below one large object the log would hold nothing at all.
        if self.store_log_capacity_bytes < 1024 * 1024 {
            return Err(invalid(
                "store.logCapacityBytes",
                format!(
                    "must be at least 1048576 (1 MiB), got {}",
                    self.store_log_capacity_bytes
                ),
            ));
        }
        // Below one ordinary object every watch would be cut at once.
        if self.store_watch_buffer_bytes < 64 * 1024 {
            return Err(invalid(
                "store.watchBufferBytes",
                format!(
                    "must be at least 65536 (64 KiB), got {}",
                    self.store_watch_buffer_bytes
                ),
            ));
        }
        self.api
            .limits
            .check()
            .map_err(|(field, message)| invalid(&format!("api.limits.{field}"), message))?;
        self.validate_proxy_origin()?;
        if self.tls_handshake_timeout.is_zero() {
            return Err(invalid("tlsHandshakeTimeout", "must be positive".into()));
        }
        if self.serving_cert_validity < Duration::from_secs(3600)
            || self.admin_cert_validity < Duration::from_secs(3600)
        {
            return Err(invalid(
                "certificate validity",
                "must be at least one hour".into(),
            ));
        }
        Ok(())
    }
}

impl ServerConfig {
    /// `proxyListen` and `proxyURL`: a URL only with a listener; an `https://` URL of scheme,
    /// host and port only, whose origin is not the console's; a listener that is not the
    /// console's (nor the SSH endpoint's) address.
    fn validate_proxy_origin(&self) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            field: field.to_string(),
            message,
        };
        let Some(listen) = self.proxy_listen else {
            if self.proxy_url.is_some() {
                return Err(invalid(
                    "proxyURL",
                    "needs proxyListen (--proxy-listen): the URL names where that listener is \
                     reached"
                        .into(),
                ));
            }
            return Ok(());
        };
        let clash = |other: SocketAddr| {
            other.port() != 0
                && other.port() == listen.port()
                && (other.ip() == listen.ip()
                    || other.ip().is_unspecified()
                    || listen.ip().is_unspecified())
        };
        if clash(self.listen) {
            return Err(invalid(
                "proxyListen",
                format!(
                    "{listen} is the console's address (listen {}): the task proxy needs a \
                     listener of its own",
                    self.listen
                ),
            ));
        }
        if self.ssh_listen.is_some_and(clash) {
            return Err(invalid(
                "proxyListen",
                format!("{listen} is the SSH endpoint's address (sshListen)"),
            ));
        }
        if let Some(url) = &self.proxy_url {
            let origin = origin_of(url).map_err(|reason| invalid("proxyURL", reason))?;
            rlark_pki::validate_san(&origin.host).map_err(|e| {
                invalid(
                    "proxyURL",
                    format!("{url:?}: its host is not a DNS name or IP address ({e})"),
                )
            })?;
            let mut console = vec![crate::server_url(self.listen)];
            console.extend(self.tunnel.advertise_url.iter().cloned());
            for console in console {
                if origin_of(&console).is_ok_and(|c| c == origin) {
                    return Err(invalid(
                        "proxyURL",
                        format!(
                            "{url:?} is the console's origin ({console}): task apps would run \
                             script on the console's origin; give the proxy another host \
                             (ideally its own DNS name), at least another port"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Scheme, host and port of an `https://` URL (the default port 443 made explicit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// Lower case, IPv6 without brackets.
    pub host: String,
    pub port: u16,
}

/// The origin of `url`, an `https://HOST[:PORT][/]` URL; anything else is refused with the
/// reason.
pub(crate) fn origin_of(url: &str) -> Result<Origin, String> {
    let rest = url.strip_prefix("https://").ok_or_else(|| {
        format!("{url:?} must start with https:// (browsers reach the proxy over TLS)")
    })?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!(
            "{url:?} must be https://HOST[:PORT] with nothing after the host and port"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{url:?}: unclosed [ in the host"))?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 443,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{url:?}: {port:?} is not a port"))?,
    };
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    Ok(Origin {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// Command-line values that override the config file. `None`/empty = not given.
#[derive(Clone, Debug, Default)]
pub struct ServerOverrides {
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--listen`.
    pub listen: Option<SocketAddr>,
    /// `--tls-san` (repeatable); when non-empty it replaces the file's `tlsSans`.
    pub tls_sans: Vec<String>,
    /// `--controllers=BOOL`: run the controllers in-process.
    pub controllers: Option<bool>,
    /// `--reinitialize-store`: see [`ServerConfig::reinitialize_store`]. `false` = not given
    /// (the config file decides).
    pub reinitialize_store: bool,
    /// `--store`: see [`ServerConfig::store_url`].
    pub store_url: Option<String>,
    /// `--ca-secret-file`: see [`ServerConfig::ca_secret_file`].
    pub ca_secret_file: Option<PathBuf>,
    /// `RLARK_CA_SECRET`: see [`ServerConfig::ca_secret`].
    pub ca_secret: Option<String>,
    /// `--max-connections`: see `ConnectionLimits::max_connections`.
    pub max_connections: Option<usize>,
    /// `--max-connections-per-ip`: see `ConnectionLimits::max_connections_per_ip`.
    pub max_connections_per_ip: Option<usize>,
    /// `--reserved-connections`: see `ConnectionLimits::reserved_connections`.
    pub reserved_connections: Option<usize>,
    /// `--header-read-timeout`: see `ConnectionLimits::header_read_timeout`.
    pub header_read_timeout: Option<Duration>,
    /// `--idle-timeout`: see `ConnectionLimits::idle_timeout`.
    pub idle_timeout: Option<Duration>,
    /// `--peer-url`: see `tunnel.peerURL`.
    pub peer_url: Option<String>,
    /// `--max-nodes-per-agent`: see `ApiServerOptions::max_nodes_per_agent`.
    pub max_nodes_per_agent: Option<usize>,
    /// `--event-ttl`: see `api.limits.eventTTLSeconds`.
    pub event_ttl: Option<Duration>,
    /// `--ssh-listen`: see [`ServerConfig::ssh_listen`].
    pub ssh_listen: Option<SocketAddr>,
    /// `--proxy-listen`: see [`ServerConfig::proxy_listen`].
    pub proxy_listen: Option<SocketAddr>,
    /// `--proxy-url`: see [`ServerConfig::proxy_url`].
    pub proxy_url: Option<String>,
}

/// The YAML config file. Every field is optional; unknown fields are an error.
///
/// ```yaml
/// dataDir: /var/lib/rlark
/// listen: 0.0.0.0:8443
/// proxyListen: 0.0.0.0:8444
/// proxyURL: https://apps.rlark.example.com:8444
/// tlsSans: [rlark.example.com, 10.0.0.5]
/// shutdownGraceSeconds: 10
/// api:
///   maxRequestBytes: 3145728
///   bookmarkIntervalSeconds: 60
///   defaultWatchTimeoutSeconds: 1800
///   maxNodesPerAgent: 64
///   limits:
///     maxEventMessageBytes: 1024
///     maxEventBytes: 16384
///     eventTTLSeconds: 3600
///     agentWritesPerSecond: 500
///     agentWriteBurst: 5000
///     taskWritesPerSecond: 10
///     taskWriteBurst: 100
///     maxEventsPerNamespace: 5000
///     maxEventsPerTask: 100
///     maxObjectsPerAgentNamespace: 10000
///     maxObjectBytes: 1572864
///     maxSpecBytes: 1048576
///     maxEnvBytes: 262144
///     maxStatusBytes: 524288
///     maxBytesPerAgentNamespace: 134217728
///     maxEventBytesPerTask: 524288
///     maxReportBytesPerTask: 4194304
///     maxReportBytesPerNamespace: 67108864
///     maxWatchesPerIdentity: 100
/// store:
///   logCapacity: 50000
///   logCapacityBytes: 67108864
///   watchBufferBytes: 8388608
/// controllers:
///   enabled: true
///   leaderElection: true
///   nodeGracePeriodSeconds: 40
/// security:
///   joinFailureBurst: 5
///   joinFailureRefillSeconds: 60
///   joinMaxBackoffSeconds: 300
/// auditLog:
///   maxFileBytes: 104857600
///   maxFiles: 5
/// reinitializeStore: false
/// connections:
///   maxConnectionsPerIP: 512
///   headerReadTimeoutSeconds: 30
///   idleTimeoutSeconds: 90
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerConfigFile {
    /// `dataDir`: see [`ServerConfig::data_dir`].
    pub data_dir: Option<PathBuf>,
    /// `listen`: see [`ServerConfig::listen`]. Kept as text here; parsed (and reported
    /// naming the field) by [`ServerConfig::resolve`].
    pub listen: Option<String>,
    /// `sshListen`: see [`ServerConfig::ssh_listen`] (absent: no SSH endpoint, unless
    /// `--ssh-listen` is given). Parsed like `listen`.
    pub ssh_listen: Option<String>,
    /// `proxyListen`: see [`ServerConfig::proxy_listen`] (absent: no proxy origin, unless
    /// `--proxy-listen` is given). Parsed like `listen`.
    pub proxy_listen: Option<String>,
    /// `proxyURL`: see [`ServerConfig::proxy_url`].
    #[serde(rename = "proxyURL")]
    pub proxy_url: Option<String>,
    /// `tlsSans`: see [`ServerConfig::tls_sans`].
    pub tls_sans: Option<Vec<String>>,
    /// `shutdownGraceSeconds`: see [`ServerConfig::shutdown_grace`].
    pub shutdown_grace_seconds: Option<u64>,
    /// `api`: API server tunables.
    pub api: Option<ApiConfigFile>,
    /// `controllers`: the in-process controllers.
    pub controllers: Option<ControllersConfigFile>,
    /// `security`: certificate and token lifetimes.
    pub security: Option<SecurityConfigFile>,
    /// `tunnel`: agent tunnel windows, limits and deadlines.
    pub tunnel: Option<TunnelConfigFile>,
    /// `reinitializeStore`: see [`ServerConfig::reinitialize_store`].
    pub reinitialize_store: Option<bool>,
    /// `auditLog`: rotation of the audit log.
    pub audit_log: Option<AuditLogConfigFile>,
    /// `connections`: listener timeouts and connection caps.
    pub connections: Option<ConnectionsConfigFile>,
    /// `ssh`: the SSH endpoint's limits.
    pub ssh: Option<SshConfigFile>,
    /// `store`: the store's in-memory change log.
    pub store: Option<StoreConfigFile>,
}

/// The `auditLog` section of [`ServerConfigFile`]; see `AuditLogConfig`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuditLogConfigFile {
    /// `maxFileBytes`: `audit.log` is rotated before it would grow past this (default
    /// 104857600 = 100 MiB, at least 65536).
    pub max_file_bytes: Option<u64>,
    /// `maxFiles`: rotated files kept, `audit.log.1`..`audit.log.N` (default 5, 1 to 1000).
    pub max_files: Option<u32>,
}

/// The `connections` section of [`ServerConfigFile`]; see `ConnectionLimits` for the
/// meaning and default of each field.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionsConfigFile {
    /// `maxConnections`: global cap of the general budget (default: from `RLIMIT_NOFILE`).
    pub max_connections: Option<usize>,
    /// `maxConnectionsPerIP` (default 512).
    #[serde(rename = "maxConnectionsPerIP")]
    pub max_connections_per_ip: Option<usize>,
    /// `reservedConnections` (default 32).
    pub reserved_connections: Option<usize>,
    /// `reservedConnectionsPerIP` (default 2).
    #[serde(rename = "reservedConnectionsPerIP")]
    pub reserved_connections_per_ip: Option<usize>,
    /// `reserveDeadlineSeconds` (default 5).
    pub reserve_deadline_seconds: Option<u64>,
    /// `headerReadTimeoutSeconds` (default 30).
    pub header_read_timeout_seconds: Option<u64>,
    /// `idleTimeoutSeconds` (default 90).
    pub idle_timeout_seconds: Option<u64>,
    /// `http2KeepaliveIntervalSeconds` (default 30; 0 = no pings).
    pub http2_keepalive_interval_seconds: Option<u64>,
    /// `http2KeepaliveTimeoutSeconds` (default 20).
    pub http2_keepalive_timeout_seconds: Option<u64>,
    /// `http2MaxConcurrentStreams` (default 250).
    pub http2_max_concurrent_streams: Option<u32>,
    /// `http2MaxHeaderListBytes` (default 262144).
    pub http2_max_header_list_bytes: Option<u32>,
    /// `http2MaxPendingAcceptResetStreams` (default 20).
    pub http2_max_pending_accept_reset_streams: Option<usize>,
    /// `http2MaxLocalErrorResetStreams` (default 1024).
    pub http2_max_local_error_reset_streams: Option<usize>,
}

/// The `ssh` section of [`ServerConfigFile`]; see `SshLimits` for the meaning and default
/// of each field.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SshConfigFile {
    /// `maxConnections` (default 1024).
    pub max_connections: Option<usize>,
    /// `maxConnectionsPerIP` (default 64).
    #[serde(rename = "maxConnectionsPerIP")]
    pub max_connections_per_ip: Option<usize>,
    /// `reservedConnections` (default 32).
    pub reserved_connections: Option<usize>,
    /// `reservedConnectionsPerIP` (default 2).
    #[serde(rename = "reservedConnectionsPerIP")]
    pub reserved_connections_per_ip: Option<usize>,
    /// `loginDeadlineSeconds` (default 10).
    pub login_deadline_seconds: Option<u64>,
    /// `maxSessionsPerConnection` (default 10).
    pub max_sessions_per_connection: Option<usize>,
    /// `maxChannelsPerConnection` (default 256).
    pub max_channels_per_connection: Option<usize>,
    /// `maxSessionsPerUser` (default 64).
    pub max_sessions_per_user: Option<usize>,
    /// `maxChannelsPerUser` (default 512).
    pub max_channels_per_user: Option<usize>,
}

/// The `store` section of [`ServerConfigFile`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StoreConfigFile {
    /// `logCapacity`: change-log events kept for watches (default 50 000).
    pub log_capacity: Option<usize>,
    /// `logCapacityBytes`: estimated bytes of objects the change log keeps (default 64 MiB,
    /// at least 1 MiB).
    pub log_capacity_bytes: Option<usize>,
    /// `watchBufferBytes`: bytes of events one watch may have waiting for its client before
    /// it is cut (default 8 MiB, at least 64 KiB).
    pub watch_buffer_bytes: Option<usize>,
    /// `url`: see [`ServerConfig::store_url`] (absent = SQLite in the data directory).
    pub url: Option<String>,
    /// `caSecretFile`: see [`ServerConfig::ca_secret_file`].
    pub ca_secret_file: Option<PathBuf>,
}

/// The `api.limits` section of [`ServerConfigFile`]; see `rlark_apiserver::limits::Limits`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LimitsConfigFile {
    /// `maxEventMessageBytes` (default 1024).
    pub max_event_message_bytes: Option<usize>,
    /// `maxEventBytes` (default 16384).
    pub max_event_bytes: Option<usize>,
    /// `eventTTLSeconds` (default 3600; flag `--event-ttl`).
    #[serde(rename = "eventTTLSeconds")]
    pub event_ttl_seconds: Option<u64>,
    /// `agentWritesPerSecond` (default 500).
    pub agent_writes_per_second: Option<f64>,
    /// `agentWriteBurst` (default 5000).
    pub agent_write_burst: Option<u32>,
    /// `taskWritesPerSecond` (default 10).
    pub task_writes_per_second: Option<f64>,
    /// `taskWriteBurst` (default 100).
    pub task_write_burst: Option<u32>,
    /// `maxEventsPerNamespace` (default 5000).
    pub max_events_per_namespace: Option<usize>,
    /// `maxEventsPerTask` (default 100).
    pub max_events_per_task: Option<usize>,
    /// `maxObjectsPerAgentNamespace` (default 10000).
    pub max_objects_per_agent_namespace: Option<usize>,
    /// `maxObjectBytes` (default 1572864 = 1.5 MiB, at least 65536).
    pub max_object_bytes: Option<usize>,
    /// `maxSpecBytes` (default 1048576 = 1 MiB, at least 65536).
    pub max_spec_bytes: Option<usize>,
    /// `maxEnvBytes` (default 262144 = 256 KiB).
    pub max_env_bytes: Option<usize>,
    /// `maxStatusBytes` (default 524288 = 512 KiB, at least 65536).
    pub max_status_bytes: Option<usize>,
    /// `maxBytesPerAgentNamespace` (default 134217728 = 128 MiB).
    pub max_bytes_per_agent_namespace: Option<u64>,
    /// `maxEventBytesPerTask` (default 524288 = 512 KiB).
    pub max_event_bytes_per_task: Option<u64>,
    /// `maxReportBytesPerTask` (default 4194304 = 4 MiB).
    pub max_report_bytes_per_task: Option<u64>,
    /// `maxReportBytesPerNamespace` (default 67108864 = 64 MiB).
    pub max_report_bytes_per_namespace: Option<u64>,
    /// `maxWatchesPerIdentity` (default 100).
    pub max_watches_per_identity: Option<usize>,
}

impl LimitsConfigFile {
    fn apply(self, limits: &mut rlark_apiserver::limits::Limits) {
        let Self {
            max_event_message_bytes,
            max_event_bytes,
            event_ttl_seconds,
            agent_writes_per_second,
            agent_write_burst,
            task_writes_per_second,
            task_write_burst,
            max_events_per_namespace,
            max_events_per_task,
            max_objects_per_agent_namespace,
            max_object_bytes,
            max_spec_bytes,
            max_env_bytes,
            max_status_bytes,
            max_bytes_per_agent_namespace,
            max_event_bytes_per_task,
            max_report_bytes_per_task,
            max_report_bytes_per_namespace,
            max_watches_per_identity,
        } = self;
        if let Some(v) = max_event_message_bytes {
            limits.max_event_message_bytes = v;
        }
        if let Some(v) = max_event_bytes {
            limits.max_event_bytes = v;
        }
        if let Some(v) = event_ttl_seconds {
            limits.event_ttl = Duration::from_secs(v);
        }
        if let Some(v) = agent_writes_per_second {
            limits.agent_writes_per_second = v;
        }
        if let Some(v) = agent_write_burst {
            limits.agent_write_burst = v;
        }
        if let Some(v) = task_writes_per_second {
            limits.task_writes_per_second = v;
        }
        if let Some(v) = task_write_burst {
            limits.task_write_burst = v;
        }
        if let Some(v) = max_events_per_namespace {
            limits.max_events_per_namespace = v;
        }
        if let Some(v) = max_events_per_task {
            limits.max_events_per_task = v;
        }
        if let Some(v) = max_objects_per_agent_namespace {
            limits.max_objects_per_agent_namespace = v;
        }
        if let Some(v) = max_object_bytes {
            limits.max_object_bytes = v;
        }
        if let Some(v) = max_spec_bytes {
            limits.max_spec_bytes = v;
        }
        if let Some(v) = max_env_bytes {
            limits.max_env_bytes = v;
        }
        if let Some(v) = max_status_bytes {
            limits.max_status_bytes = v;
        }
        if let Some(v) = max_bytes_per_agent_namespace {
            limits.max_bytes_per_agent_namespace = v;
        }
        if let Some(v) = max_event_bytes_per_task {
            limits.max_event_bytes_per_task = v;
        }
        if let Some(v) = max_report_bytes_per_task {
            limits.max_report_bytes_per_task = v;
        }
        if let Some(v) = max_report_bytes_per_namespace {
            limits.max_report_bytes_per_namespace = v;
        }
        if let Some(v) = max_watches_per_identity {
            limits.max_watches_per_identity = v;
        }
    }
}

/// The `tunnel` section of [`ServerConfigFile`]; see `TunnelConfig` and `docs/tunnel.md`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TunnelConfigFile {
    /// `windowBytes`: largest per-stream receive window, the bound of its auto-tuning
    /// (default 8 MiB, at least 64 KiB).
    pub window_bytes: Option<u32>,
    /// `startWindowBytes`: receive window every stream starts with (default 512 KiB, at
    /// least 64 KiB, at most `windowBytes`).
    pub start_window_bytes: Option<u32>,
    /// `maxStreams`: concurrent streams per agent session (default 4096).
    pub max_streams: Option<usize>,
    /// `idleStreamTimeoutSeconds`: a stream without data either way is reset (default 600;
    /// 0 = never).
    pub idle_stream_timeout_seconds: Option<u64>,
    /// `keepaliveTimeoutSeconds`: a session with no frame for this long is dead (default 15).
    pub keepalive_timeout_seconds: Option<u64>,
    /// `dialTimeoutSeconds`: deadline of a dial through an agent (default 10).
    pub dial_timeout_seconds: Option<u64>,
    /// `advertiseURL`: the `https://` URL agents reach this replica at (default: derived
    /// from `listen`, see `TunnelConfig::advertise_url`).
    #[serde(rename = "advertiseURL")]
    pub advertise_url: Option<String>,
    /// `peerURL`: the `https://` URL the other replicas reach this replica at (default: the
    /// advertise URL; see `TunnelConfig::peer_url`). `--peer-url` overrides it.
    #[serde(rename = "peerURL")]
    pub peer_url: Option<String>,
    /// `peers`: other replicas' `https://` URLs, offered to agents.
    pub peers: Option<Vec<String>>,
    /// `maxStreamsPerUser`: streams one user may hold open to one agent (default: a
    /// quarter of `maxStreams`).
    pub max_streams_per_user: Option<usize>,
}

/// The `security` section of [`ServerConfigFile`]; see `SecurityConfig`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SecurityConfigFile {
    /// `agentCertValiditySeconds` (default 30 days). Agents renew at 2/3 of it.
    pub agent_cert_validity_seconds: Option<u64>,
    /// `userCertValiditySeconds` (default 1 year).
    pub user_cert_validity_seconds: Option<u64>,
    /// `maxBootstrapTokenTtlSeconds` (default 7 days).
    pub max_bootstrap_token_ttl_seconds: Option<u64>,
    /// `joinFailureBurst`: failed joins one source address (IPv6: its /64) may make before
    /// its joins are refused with 429 (default 5, 1 to 10000).
    pub join_failure_burst: Option<u32>,
    /// `joinFailureRefillSeconds`: one failed join is forgiven per this interval (default
    /// 60, 1 to 86400).
    pub join_failure_refill_seconds: Option<u64>,
    /// `joinMaxBackoffSeconds`: longest refusal; refusals start at 1 s and double (default
    /// 300, 1 to 86400).
    pub join_max_backoff_seconds: Option<u64>,
}

/// The `controllers` section of [`ServerConfigFile`]; see [`ControllersConfig`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ControllersConfigFile {
    /// `enabled` (default true for `rlark server`).
    pub enabled: Option<bool>,
    /// `leaderElection` (default true).
    pub leader_election: Option<bool>,
    /// `nodeGracePeriodSeconds` (default 40).
    pub node_grace_period_seconds: Option<u64>,
}

/// The `api` section of [`ServerConfigFile`].
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiConfigFile {
    /// `maxRequestBytes`: larger request bodies get 413.
    pub max_request_bytes: Option<usize>,
    /// `bookmarkIntervalSeconds`: how often idle watches get a BOOKMARK.
    pub bookmark_interval_seconds: Option<u64>,
    /// `defaultWatchTimeoutSeconds`: watch duration when the client gives none.
    pub default_watch_timeout_seconds: Option<u64>,
    /// `maxNodesPerAgent`: most Nodes an agent may create in its namespace (default 64).
    pub max_nodes_per_agent: Option<usize>,
    /// `limits`: Event sizes and expiry, write rates and quotas of agents and task tokens.
    pub limits: Option<LimitsConfigFile>,
}

impl ServerConfigFile {
    /// Read and parse `path`. An empty file is an empty config.
    pub fn load(path: &Path) -> Result<ServerConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse YAML `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<ServerConfigFile, ConfigError> {
        if text.trim().is_empty() {
            return Ok(ServerConfigFile::default());
        }
        serde_saphyr::from_str(text).map_err(|e| {
            let message = e.to_string();
            ConfigError::Parse {
                path: origin.to_path_buf(),
                message: message
                    .strip_prefix("error: ")
                    .unwrap_or(&message)
                    .to_string(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServerConfigFile, ConfigError> {
        ServerConfigFile::parse(text, Path::new("test.yaml"))
    }

    #[test]
    fn file_values_apply_and_flags_override_them() {
        let file = parse(
            "dataDir: /from/file\nlisten: 0.0.0.0:9443\ntlsSans: [a.example, 10.1.2.3]\n\
             shutdownGraceSeconds: 3\napi:\n  maxRequestBytes: 1024\n",
        )
        .expect("parse");
        let config =
            ServerConfig::resolve(Some(file.clone()), ServerOverrides::default()).expect("resolve");
        assert_eq!(config.data_dir, PathBuf::from("/from/file"));
        assert_eq!(config.listen, "0.0.0.0:9443".parse().expect("addr"));
        assert_eq!(config.tls_sans, ["a.example", "10.1.2.3"]);
        assert_eq!(config.shutdown_grace, Duration::from_secs(3));
        assert_eq!(config.api.max_request_bytes, 1024);

        let config = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                data_dir: Some("/from/flag".into()),
                listen: Some("127.0.0.1:0".parse().expect("addr")),
                tls_sans: vec!["b.example".into()],
                ..Default::default()
            },
        )
        .expect("resolve");
        assert_eq!(config.data_dir, PathBuf::from("/from/flag"));
        assert_eq!(config.listen.port(), 0);
        assert_eq!(config.tls_sans, ["b.example"]);
    }

    #[test]
    fn controllers_default_on_for_the_server_and_can_be_turned_off() {
        let dir = ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        assert!(!ServerConfig::new("/d").controllers.enabled);
        let config = ServerConfig::resolve(None, dir.clone()).expect("resolve");
        assert!(config.controllers.enabled);
        assert!(config.controllers.leader_election);

        let file = parse(
            "controllers:\n  enabled: false\n  leaderElection: false\n  nodeGracePeriodSeconds: 5\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file.clone()), dir.clone()).expect("resolve");
        assert!(!config.controllers.enabled);
        assert!(!config.controllers.leader_election);
        assert_eq!(config.controllers.node_grace_period, Duration::from_secs(5));

        let config = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                controllers: Some(true),
                ..dir.clone()
            },
        )
        .expect("resolve");
        assert!(config.controllers.enabled);
        let config = ServerConfig::resolve(
            None,
            ServerOverrides {
                controllers: Some(false),
                ..dir
            },
        )
        .expect("resolve");
        assert!(!config.controllers.enabled);

        let err = parse("controllers:\n  enable: false\n").expect_err("unknown field");
        assert!(err.to_string().contains("enable"), "{err}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let err = parse("dataDir: /x\nlistne: 1.2.3.4:5\n").expect_err("unknown field");
        assert!(err.to_string().contains("listne"), "{err}");
        let err = parse("api:\n  maxRequestByte: 1\n").expect_err("unknown nested field");
        assert!(err.to_string().contains("maxRequestByte"), "{err}");
    }

    #[test]
    fn the_ca_secret_is_given_once_and_never_printed() {
        let overrides = || ServerOverrides {
            data_dir: Some("/d".into()),
            ca_secret: Some("s3cret-s3cret-s3cret-s3cret-s3cret".into()),
            ..Default::default()
        };
        let config = ServerConfig::resolve(None, overrides()).expect("resolve");
        assert!(!format!("{config:?}").contains("s3cret"), "{config:?}");
        let err = ServerConfig::resolve(
            None,
            ServerOverrides {
                ca_secret_file: Some("/etc/rlark/ca-secret".into()),
                ..overrides()
            },
        )
        .expect_err("both");
        assert!(err.to_string().contains("not both"), "{err}");
    }

    #[test]
    fn ssh_listen_comes_from_the_file_and_the_flag_wins() {
        let file = || parse("sshListen: 127.0.0.1:2222\n").expect("parse");
        let dir = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let config = ServerConfig::resolve(Some(file()), dir()).expect("resolve");
        assert_eq!(
            config.ssh_listen,
            Some("127.0.0.1:2222".parse().expect("addr"))
        );
        let config = ServerConfig::resolve(
            Some(file()),
            ServerOverrides {
                ssh_listen: Some("127.0.0.1:2200".parse().expect("addr")),
                ..dir()
            },
        )
        .expect("resolve");
        assert_eq!(
            config.ssh_listen,
            Some("127.0.0.1:2200".parse().expect("addr"))
        );
        let bad = parse("sshListen: port-22\n").expect("parse");
        let err = ServerConfig::resolve(Some(bad), dir()).expect_err("bad sshListen");
        assert!(err.to_string().contains("sshListen"), "{err}");
    }

    #[test]
    fn the_proxy_origin_comes_from_the_file_and_the_flags_win() {
        let dir = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let config = ServerConfig::resolve(None, dir()).expect("resolve");
        assert_eq!(config.proxy_listen, None, "off by default");
        assert_eq!(config.proxy_url, None);
        let file = || {
            parse("proxyListen: 0.0.0.0:8444\nproxyURL: https://apps.example.com:8444\n")
                .expect("parse")
        };
        let config = ServerConfig::resolve(Some(file()), dir()).expect("resolve");
        assert_eq!(
            config.proxy_listen,
            Some("0.0.0.0:8444".parse().expect("addr"))
        );
        assert_eq!(
            config.proxy_url.as_deref(),
            Some("https://apps.example.com:8444")
        );
        let config = ServerConfig::resolve(
            Some(file()),
            ServerOverrides {
                proxy_listen: Some("127.0.0.1:9444".parse().expect("addr")),
                proxy_url: Some("https://apps.example.org".into()),
                ..dir()
            },
        )
        .expect("resolve");
        assert_eq!(
            config.proxy_listen,
            Some("127.0.0.1:9444".parse().expect("addr"))
        );
        assert_eq!(
            config.proxy_url.as_deref(),
            Some("https://apps.example.org")
        );
    }

    #[test]
    fn a_bad_proxy_origin_is_refused_naming_the_field() {
        for (yaml, field, words) in [
            ("proxyListen: port-8444\n", "proxyListen", "not an address"),
            (
                "listen: 127.0.0.1:8443\nproxyListen: 127.0.0.1:8443\n",
                "proxyListen",
                "console",
            ),
            (
                "listen: 0.0.0.0:8443\nproxyListen: 127.0.0.1:8443\n",
                "proxyListen",
                "console",
            ),
            (
                "proxyListen: 127.0.0.1:8444\nproxyURL: http://apps.example.com\n",
                "proxyURL",
                "https://",
            ),
            (
                "proxyListen: 127.0.0.1:8444\nproxyURL: https://apps.example.com/x\n",
                "proxyURL",
                "nothing after",
            ),
            (
                "listen: 127.0.0.1:8443\nproxyListen: 127.0.0.1:8444\n\
                 proxyURL: https://127.0.0.1:8443\n",
                "proxyURL",
                "console's origin",
            ),
            (
                "proxyListen: 127.0.0.1:8444\nproxyURL: https://rlark.example.com\n\
                 tunnel: {advertiseURL: 'https://RLARK.example.com:443'}\n",
                "proxyURL",
                "console's origin",
            ),
            (
                "proxyURL: https://apps.example.com\n",
                "proxyURL",
                "needs proxyListen",
            ),
        ] {
            let err = ServerConfig::resolve(
                Some(parse(&format!("dataDir: /d\n{yaml}")).expect("parse")),
                ServerOverrides::default(),
            )
            .expect_err(yaml);
            let text = err.to_string();
            assert!(text.contains(field), "{yaml}: {text}");
            assert!(text.contains(words), "{yaml}: {text}");
        }
        // Another port of the same host is allowed (weaker; docs/ssh.md says why).
        let ok = parse(
            "dataDir: /d\nlisten: 127.0.0.1:8443\nproxyListen: 127.0.0.1:8444\n\
             proxyURL: https://[::1]:8444/\n",
        )
        .expect("parse");
        ServerConfig::resolve(Some(ok), ServerOverrides::default()).expect("valid");
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        assert_eq!(
            origin_of("https://Apps.Example.com").expect("origin"),
            Origin {
                host: "apps.example.com".into(),
                port: 443
            }
        );
        assert_eq!(
            origin_of("https://[::1]:8444/").expect("origin"),
            Origin {
                host: "::1".into(),
                port: 8444
            }
        );
        for bad in [
            "https://",
            "https://h:0",
            "https://h:x",
            "https://u@h",
            "wss://h",
        ] {
            assert!(origin_of(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_values_name_the_field() {
        let file = parse("listen: not-an-address\n").expect("parse");
        let err = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                data_dir: Some("/d".into()),
                ..Default::default()
            },
        )
        .expect_err("bad listen");
        assert!(err.to_string().contains("listen"), "{err}");

        let err = ServerConfig::resolve(
            None,
            ServerOverrides {
                data_dir: Some("/d".into()),
                tls_sans: vec!["ok.example".into(), "not valid".into()],
                ..Default::default()
            },
        )
        .expect_err("bad san");
        assert!(err.to_string().contains("tlsSans[1]"), "{err}");

        for (yaml, field) in [
            (
                "shutdownGraceSeconds: 18446744073709551615\n",
                "shutdownGraceSeconds",
            ),
            (
                "security: {maxBootstrapTokenTtlSeconds: 9223372036854775807}\n",
                "security.maxBootstrapTokenTtlSeconds",
            ),
            (
                "api: {defaultWatchTimeoutSeconds: 86401}\n",
                "api.defaultWatchTimeoutSeconds",
            ),
            (
                "tunnel: {keepaliveTimeoutSeconds: 18446744073709551615}\n",
                "tunnel.keepaliveTimeoutSeconds",
            ),
        ] {
            let err = ServerConfig::resolve(
                Some(parse(&format!("dataDir: /d\n{yaml}")).expect("parse")),
                ServerOverrides::default(),
            )
            .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
            assert!(err.to_string().contains("at most"), "{yaml}: {err}");
        }

        let err = parse("shutdownGraceSeconds: soon\n").expect_err("type error");
        assert!(
            err.to_string().contains("shutdownGraceSeconds") || err.to_string().contains("soon"),
            "{err}"
        );
    }

    #[test]
    fn security_and_tunnel_sections_apply_and_are_validated() {
        let overrides = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let file = parse(
            "security: {agentCertValiditySeconds: 60}\ntunnel: {windowBytes: 1048576, maxStreams: 10, idleStreamTimeoutSeconds: 0, dialTimeoutSeconds: 3, advertiseURL: 'https://cp-1:8443', peerURL: 'https://cp-1.peers:8443', peers: ['https://cp-2:8443']}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file.clone()), overrides()).expect("valid");
        assert_eq!(config.security.agent_cert_validity, Duration::from_secs(60));
        assert_eq!(config.tunnel.mux.window, 1_048_576);
        assert_eq!(config.tunnel.mux.start_window, 512 * 1024);
        assert_eq!(config.tunnel.mux.max_streams, 10);
        assert_eq!(config.tunnel.mux.idle_stream_timeout, None);
        assert_eq!(config.tunnel.dial_timeout, Duration::from_secs(3));
        assert_eq!(
            config.tunnel.advertise_url.as_deref(),
            Some("https://cp-1:8443")
        );
        assert_eq!(config.tunnel.peers, ["https://cp-2:8443"]);
        assert_eq!(
            config.tunnel.peer_url.as_deref(),
            Some("https://cp-1.peers:8443")
        );
        // --peer-url wins over the file.
        let flagged = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                peer_url: Some("https://rlark-1.rlark-peers.ns.svc:8443".into()),
                ..overrides()
            },
        )
        .expect("valid");
        assert_eq!(
            flagged.tunnel.peer_url.as_deref(),
            Some("https://rlark-1.rlark-peers.ns.svc:8443")
        );
        // A window below the default start window caps the start window.
        let small = ServerConfig::resolve(
            Some(parse("tunnel: {windowBytes: 262144}\n").expect("parse")),
            overrides(),
        )
        .expect("valid");
        assert_eq!(small.tunnel.mux.start_window, 262_144);
        for (yaml, field) in [
            (
                "tunnel: {advertiseURL: 'http://cp-1'}\n",
                "tunnel.advertiseURL",
            ),
            ("tunnel: {peers: ['https://a', 'b:1']}\n", "tunnel.peers[1]"),
            ("tunnel: {peerURL: 'cp-1:8443'}\n", "tunnel.peerURL"),
            ("tunnel: {windowBytes: 100}\n", "tunnel.windowBytes"),
            (
                "tunnel: {windowBytes: 1048576, startWindowBytes: 2097152}\n",
                "tunnel.startWindowBytes",
            ),
            (
                "tunnel: {startWindowBytes: 1024}\n",
                "tunnel.startWindowBytes",
            ),
            ("tunnel: {maxStreams: 0}\n", "tunnel.maxStreams"),
            (
                "tunnel: {keepaliveTimeoutSeconds: 1}\n",
                "tunnel.keepaliveTimeoutSeconds",
            ),
            (
                "tunnel: {dialTimeoutSeconds: 0}\n",
                "tunnel.dialTimeoutSeconds",
            ),
            (
                "security: {agentCertValiditySeconds: 0}\n",
                "security.agentCertValiditySeconds",
            ),
            (
                "security: {joinFailureBurst: 0}\n",
                "security.joinFailureBurst",
            ),
            (
                "security: {joinFailureRefillSeconds: 0}\n",
                "security.joinFailureRefillSeconds",
            ),
            (
                "security: {joinMaxBackoffSeconds: 100000}\n",
                "security.joinMaxBackoffSeconds",
            ),
            ("auditLog: {maxFileBytes: 1000}\n", "auditLog.maxFileBytes"),
            ("auditLog: {maxFiles: 0}\n", "auditLog.maxFiles"),
        ] {
            let err = ServerConfig::resolve(Some(parse(yaml).expect("parse")), overrides())
                .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
    }

    #[test]
    fn join_limit_audit_log_and_reinitialize_apply() {
        let overrides = ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let config = ServerConfig::resolve(None, overrides.clone()).expect("defaults");
        assert!(!config.reinitialize_store);
        assert_eq!(config.audit_log, crate::AuditLogConfig::default());
        assert_eq!(
            config.security.join_limit,
            crate::JoinLimitConfig::default()
        );
        let file = parse(
            "reinitializeStore: true\nauditLog: {maxFileBytes: 65536, maxFiles: 2}\n\
             security: {joinFailureBurst: 3, joinFailureRefillSeconds: 10, joinMaxBackoffSeconds: 20}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file), overrides.clone()).expect("valid");
        assert!(config.reinitialize_store);
        assert_eq!(config.audit_log.max_file_bytes, 65536);
        assert_eq!(config.audit_log.max_files, 2);
        assert_eq!(config.security.join_limit.burst, 3);
        assert_eq!(config.security.join_limit.refill, Duration::from_secs(10));
        assert_eq!(
            config.security.join_limit.max_backoff,
            Duration::from_secs(20)
        );
        let config = ServerConfig::resolve(
            None,
            ServerOverrides {
                reinitialize_store: true,
                ..overrides
            },
        )
        .expect("valid");
        assert!(config.reinitialize_store, "--reinitialize-store");
    }

    #[test]
    fn ssh_section_and_the_stream_share_apply_and_are_validated() {
        let overrides = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let defaults = ServerConfig::resolve(None, overrides()).expect("defaults");
        assert_eq!(defaults.ssh, crate::ssh::limits::SshLimits::default());
        assert_eq!(defaults.tunnel.streams_per_user(), 1024);
        let file = parse(
            "ssh: {maxConnections: 100, maxConnectionsPerIP: 10, reservedConnections: 4, \
             reservedConnectionsPerIP: 1, loginDeadlineSeconds: 3, maxSessionsPerConnection: 2, \
             maxChannelsPerConnection: 5, maxSessionsPerUser: 6, maxChannelsPerUser: 7}\n\
             tunnel: {maxStreams: 100, maxStreamsPerUser: 30}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file), overrides()).expect("valid");
        let s = &config.ssh;
        assert_eq!(
            (s.max_connections, s.max_connections_per_ip),
            (100, 10),
            "{s:?}"
        );
        assert_eq!(
            (s.reserved_connections, s.reserved_connections_per_ip),
            (4, 1)
        );
        assert_eq!(s.login_deadline, Duration::from_secs(3));
        assert_eq!(
            (
                s.max_sessions_per_connection,
                s.max_channels_per_connection,
                s.max_sessions_per_user,
                s.max_channels_per_user
            ),
            (2, 5, 6, 7)
        );
        assert_eq!(config.tunnel.streams_per_user(), 30);
        for (yaml, field) in [
            ("ssh: {maxConnectionsPerIP: 0}\n", "ssh.maxConnectionsPerIP"),
            (
                "ssh: {loginDeadlineSeconds: 0}\n",
                "ssh.loginDeadlineSeconds",
            ),
            (
                "ssh: {reservedConnections: 2, reservedConnectionsPerIP: 3}\n",
                "ssh.reservedConnectionsPerIP",
            ),
            ("ssh: {maxSessionsPerUser: 0}\n", "ssh.maxSessionsPerUser"),
            (
                "tunnel: {maxStreams: 10, maxStreamsPerUser: 11}\n",
                "tunnel.maxStreamsPerUser",
            ),
            (
                "tunnel: {maxStreamsPerUser: 0}\n",
                "tunnel.maxStreamsPerUser",
            ),
        ] {
            let err = ServerConfig::resolve(Some(parse(yaml).expect("parse")), overrides())
                .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
    }

    #[test]
    fn connections_section_and_flags_apply_and_are_validated() {
        let overrides = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let defaults = ServerConfig::resolve(None, overrides()).expect("defaults");
        assert_eq!(
            defaults.connections,
            crate::limits::ConnectionLimits::default()
        );
        let file = parse(
            "connections: {maxConnections: 100, maxConnectionsPerIP: 10, reservedConnections: 4, \
             reservedConnectionsPerIP: 1, reserveDeadlineSeconds: 2, headerReadTimeoutSeconds: 3, \
             idleTimeoutSeconds: 4, http2KeepaliveIntervalSeconds: 0, http2KeepaliveTimeoutSeconds: 5, \
             http2MaxConcurrentStreams: 6, http2MaxHeaderListBytes: 65536, \
             http2MaxPendingAcceptResetStreams: 7, http2MaxLocalErrorResetStreams: 8}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file.clone()), overrides()).expect("valid");
        let c = &config.connections;
        assert_eq!(c.max_connections, Some(100));
        assert_eq!(c.max_connections_per_ip, 10);
        assert_eq!(c.reserved_connections, 4);
        assert_eq!(c.reserved_connections_per_ip, 1);
        assert_eq!(c.reserve_deadline, Duration::from_secs(2));
        assert_eq!(c.header_read_timeout, Duration::from_secs(3));
        assert_eq!(c.idle_timeout, Duration::from_secs(4));
        assert_eq!(c.http2_keepalive_interval, None);
        assert_eq!(c.http2_keepalive_timeout, Duration::from_secs(5));
        assert_eq!(c.http2_max_concurrent_streams, 6);
        assert_eq!(c.http2_max_header_list_size, 65536);
        assert_eq!(c.http2_max_pending_accept_reset_streams, 7);
        assert_eq!(c.http2_max_local_error_reset_streams, 8);
        let config = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                max_connections: Some(50),
                max_connections_per_ip: Some(5),
                reserved_connections: Some(3),
                header_read_timeout: Some(Duration::from_secs(9)),
                idle_timeout: Some(Duration::from_secs(8)),
                ..overrides()
            },
        )
        .expect("valid");
        let c = &config.connections;
        assert_eq!(c.max_connections, Some(50));
        assert_eq!(c.max_connections_per_ip, 5);
        assert_eq!(c.reserved_connections, 3);
        assert_eq!(c.header_read_timeout, Duration::from_secs(9));
        assert_eq!(c.idle_timeout, Duration::from_secs(8));
        for (yaml, field) in [
            (
                "connections: {maxConnections: 0}\n",
                "connections.maxConnections",
            ),
            (
                "connections: {maxConnectionsPerIP: 0}\n",
                "connections.maxConnectionsPerIP",
            ),
            (
                "connections: {reservedConnections: 2, reservedConnectionsPerIP: 3}\n",
                "connections.reservedConnectionsPerIP",
            ),
            (
                "connections: {headerReadTimeoutSeconds: 0}\n",
                "connections.headerReadTimeoutSeconds",
            ),
            (
                "connections: {idleTimeoutSeconds: 18446744073709551615}\n",
                "connections.idleTimeoutSeconds",
            ),
            (
                "connections: {http2MaxHeaderListBytes: 100}\n",
                "connections.http2MaxHeaderListBytes",
            ),
        ] {
            let err = ServerConfig::resolve(Some(parse(yaml).expect("parse")), overrides())
                .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
        let err = parse("connections: {maxConnectionsPerIp: 1}\n").expect_err("unknown field");
        assert!(err.to_string().contains("maxConnectionsPerIp"), "{err}");
    }

    #[test]
    fn max_nodes_per_agent_from_file_and_flag() {
        let overrides = |flag: Option<usize>| ServerOverrides {
            data_dir: Some("/d".into()),
            max_nodes_per_agent: flag,
            ..Default::default()
        };
        let config = ServerConfig::resolve(None, overrides(None)).expect("defaults");
        assert_eq!(
            config.api.max_nodes_per_agent,
            rlark_apiserver::DEFAULT_MAX_NODES_PER_AGENT
        );
        let file = || Some(parse("api: {maxNodesPerAgent: 3}\n").expect("parse"));
        let config = ServerConfig::resolve(file(), overrides(None)).expect("file");
        assert_eq!(config.api.max_nodes_per_agent, 3);
        let config = ServerConfig::resolve(file(), overrides(Some(5))).expect("flag");
        assert_eq!(config.api.max_nodes_per_agent, 5);
        let err = ServerConfig::resolve(file(), overrides(Some(0))).expect_err("zero");
        assert!(err.to_string().contains("api.maxNodesPerAgent"), "{err}");
    }

    #[test]
    fn data_dir_is_required_and_empty_file_is_fine() {
        let err =
            ServerConfig::resolve(Some(parse("").expect("empty")), ServerOverrides::default())
                .expect_err("no data dir");
        assert!(matches!(err, ConfigError::MissingDataDir));
    }

    #[test]
    fn limits_and_store_sections_apply_and_are_validated() {
        let overrides = || ServerOverrides {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let file = parse(
            "api:\n  limits: {maxEventMessageBytes: 512, eventTTLSeconds: 60, taskWritesPerSecond: 0.5, taskWriteBurst: 3, maxEventsPerTask: 7}\nstore: {logCapacity: 100, logCapacityBytes: 2097152}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file.clone()), overrides()).expect("valid");
        let limits = &config.api.limits;
        assert_eq!(limits.max_event_message_bytes, 512);
        assert_eq!(limits.event_ttl, Duration::from_secs(60));
        assert_eq!(limits.task_writes_per_second, 0.5);
        assert_eq!(limits.task_write_burst, 3);
        assert_eq!(limits.max_events_per_task, 7);
        assert_eq!(limits.max_event_bytes, 16 * 1024, "default kept");
        assert_eq!(config.store_log_capacity, 100);
        assert_eq!(config.store_log_capacity_bytes, 2 * 1024 * 1024);
        let config = ServerConfig::resolve(
            Some(file),
            ServerOverrides {
                event_ttl: Some(Duration::from_secs(5)),
                ..overrides()
            },
        )
        .expect("valid");
        assert_eq!(config.api.limits.event_ttl, Duration::from_secs(5));
        for (yaml, field) in [
            (
                "api: {limits: {maxEventBytes: 0}}\n",
                "api.limits.maxEventBytes",
            ),
            (
                "api: {limits: {eventTTLSeconds: 0}}\n",
                "api.limits.eventTTLSeconds",
            ),
            (
                "api: {limits: {agentWritesPerSecond: -1}}\n",
                "api.limits.agentWritesPerSecond",
            ),
            (
                "api: {limits: {taskWriteBurst: 0}}\n",
                "api.limits.taskWriteBurst",
            ),
            (
                "api: {limits: {maxEventsPerNamespace: 0}}\n",
                "api.limits.maxEventsPerNamespace",
            ),
            ("store: {logCapacity: 0}\n", "store.logCapacity"),
            (
                "store: {logCapacityBytes: 1000}\n",
                "store.logCapacityBytes",
            ),
        ] {
            let err = ServerConfig::resolve(Some(parse(yaml).expect("parse")), overrides())
                .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
        let err = parse("api: {limits: {eventTtlSeconds: 1}}\n").expect_err("unknown field");
        assert!(err.to_string().contains("eventTtlSeconds"), "{err}");
    }
}
