//! The config file's YAML form (`ServerConfigFile` and its sections) and the command-line
//! overrides, as read before they are resolved into a [`ServerConfig`].

use super::*;

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
    pub(super) fn apply(self, limits: &mut rlark_apiserver::limits::Limits) {
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
