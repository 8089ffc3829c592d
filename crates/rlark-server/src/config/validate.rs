//! [`ServerConfig::validate`]: every field checked before any port is bound; the error
//! names the field.

use super::*;

impl ServerConfig {
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
