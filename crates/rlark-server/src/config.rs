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
    /// The controllers run in-process (see [`ControllersConfig`]).
    pub controllers: ControllersConfig,
    /// Lifetimes of agent and user certificates and bootstrap tokens.
    pub security: crate::security::SecurityConfig,
    /// Agent tunnels: multiplexer windows and limits, dial deadline.
    pub tunnel: crate::tunnel::TunnelConfig,
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
            controllers: ControllersConfig::default(),
            security: crate::security::SecurityConfig::default(),
            tunnel: crate::tunnel::TunnelConfig::default(),
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
            if let Some(v) = tunnel.peers {
                config.tunnel.peers = v;
            }
        }
        if let Some(enabled) = overrides.controllers {
            config.controllers.enabled = enabled;
        }
        if let Some(listen) = overrides.listen {
            config.listen = listen;
        }
        if !overrides.tls_sans.is_empty() {
            config.tls_sans = overrides.tls_sans;
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
        if self.store_log_capacity == 0 {
            return Err(invalid("storeLogCapacity", "must be positive".into()));
        }
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
}

/// The YAML config file. Every field is optional; unknown fields are an error.
///
/// ```yaml
/// dataDir: /var/lib/rlark
/// listen: 0.0.0.0:8443
/// tlsSans: [rlark.example.com, 10.0.0.5]
/// shutdownGraceSeconds: 10
/// api:
///   maxRequestBytes: 3145728
///   bookmarkIntervalSeconds: 60
///   defaultWatchTimeoutSeconds: 1800
/// controllers:
///   enabled: true
///   leaderElection: true
///   nodeGracePeriodSeconds: 40
/// ```
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerConfigFile {
    /// `dataDir`: see [`ServerConfig::data_dir`].
    pub data_dir: Option<PathBuf>,
    /// `listen`: see [`ServerConfig::listen`]. Kept as text here; parsed (and reported
    /// naming the field) by [`ServerConfig::resolve`].
    pub listen: Option<String>,
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
    /// `peers`: other replicas' `https://` URLs, offered to agents.
    pub peers: Option<Vec<String>>,
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
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiConfigFile {
    /// `maxRequestBytes`: larger request bodies get 413.
    pub max_request_bytes: Option<usize>,
    /// `bookmarkIntervalSeconds`: how often idle watches get a BOOKMARK.
    pub bookmark_interval_seconds: Option<u64>,
    /// `defaultWatchTimeoutSeconds`: watch duration when the client gives none.
    pub default_watch_timeout_seconds: Option<u64>,
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
                controllers: None,
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
            "security: {agentCertValiditySeconds: 60}\ntunnel: {windowBytes: 1048576, maxStreams: 10, idleStreamTimeoutSeconds: 0, dialTimeoutSeconds: 3, advertiseURL: 'https://cp-1:8443', peers: ['https://cp-2:8443']}\n",
        )
        .expect("parse");
        let config = ServerConfig::resolve(Some(file), overrides()).expect("valid");
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
        ] {
            let err = ServerConfig::resolve(Some(parse(yaml).expect("parse")), overrides())
                .expect_err(yaml);
            assert!(err.to_string().contains(field), "{yaml}: {err}");
        }
    }

    #[test]
    fn data_dir_is_required_and_empty_file_is_fine() {
        let err =
            ServerConfig::resolve(Some(parse("").expect("empty")), ServerOverrides::default())
                .expect_err("no data dir");
        assert!(matches!(err, ConfigError::MissingDataDir));
    }
}
