//! [`ServerConfig::resolve`]: defaults, then the config file, then the flags.

use super::*;

impl ServerConfig {
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
}
