//! Server configuration: built-in defaults, an optional YAML file, command-line overrides.
//!
//! Precedence, lowest first: defaults < config file < flags. Everything is validated by
//! [`ServerConfig::validate`] before any port is bound.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rlark_apiserver::ApiServerOptions;
use serde::Deserialize;

mod file;
mod resolve;
mod validate;

pub use file::*;

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
