//! Serving: the accept loop and each connection (TLS, the HTTP/1.1 or HTTP/2 service, its
//! graceful close).

use super::*;

/// The accept loop and the connections it spawned.
pub(crate) struct Serve {
    pub(crate) listener: TcpListener,
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) router: axum::Router,
    pub(crate) security: Arc<security::Security>,
    /// What HTTP `CONNECT` reaches through (the hub, the store, the audit log).
    pub(crate) tunnel: tunnel::exec::ExecState,
    pub(crate) handshake_timeout: Duration,
    pub(crate) grace: Duration,
    pub(crate) ready: Arc<AtomicBool>,
    /// Admission of accepted connections (caps and reserve).
    pub(crate) gate: Arc<limits::Gate>,
    pub(crate) limits: Arc<limits::ConnectionLimits>,
}

impl Serve {
    /// Accept until `shutdown`; then cancel `background`, drain connections (bounded by the
    /// grace period) and return.
    pub(crate) async fn run(self, shutdown: CancellationToken, background: &CancellationToken) {
        // Cancelled when shutdown begins: connections finish their in-flight requests and
        // close (HTTP/2 with a GOAWAY).
        let draining = CancellationToken::new();
        let builder = Arc::new(self.limits.http_builder());
        let connections = TaskTracker::new();
        // Cancelled when the grace period is over: in-flight connections are dropped.
        let hard_stop = CancellationToken::new();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            match accepted {
                Ok((tcp, remote)) => {
                    // Counted from here until the socket is closed; over the caps and the
                    // reserve, the connection is closed at once.
                    let Some(permit) = self.gate.admit(remote.ip()) else {
                        drop(tcp);
                        continue;
                    };
                    // Watch events and small responses are written as separate small
                    // chunks; with Nagle's algorithm each one after the first waits for the
                    // client's delayed ACK (~40 ms). API servers always disable it.
                    if let Err(error) = tcp.set_nodelay(true) {
                        tracing::debug!(%error, %remote, "setting TCP_NODELAY failed");
                    }
                    let conn = Connection {
                        acceptor: self.acceptor.clone(),
                        router: self.router.clone(),
                        security: Arc::clone(&self.security),
                        tunnel: self.tunnel.clone(),
                        handshake_timeout: self.handshake_timeout,
                        limits: Arc::clone(&self.limits),
                        builder: Arc::clone(&builder),
                        draining: draining.clone(),
                        hard_stop: hard_stop.clone(),
                    };
                    let span = tracing::info_span!(
                        "conn",
                        peer = %remote,
                        user = tracing::field::Empty,
                        alpn = tracing::field::Empty,
                        reserve = matches!(permit.admission(), limits::Admission::Reserve),
                    );
                    connections.spawn(conn.serve(tcp, permit, remote).instrument(span));
                }
                Err(error) => {
                    // E.g. EMFILE: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        drop(self.listener);
        self.ready.store(false, Ordering::Release);
        background.cancel();
        connections.close();
        tracing::info!(
            connections = connections.len(),
            grace_secs = self.grace.as_secs_f64(),
            "shutting down: no longer accepting connections"
        );
        draining.cancel();
        let drained = tokio::time::timeout(self.grace, connections.wait()).await;
        if drained.is_err() {
            tracing::warn!(
                connections = connections.len(),
                "grace period over; closing remaining connections"
            );
            hard_stop.cancel();
            connections.wait().await;
        }
    }
}

/// One accepted TCP connection.
pub(crate) struct Connection {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    pub(crate) router: axum::Router,
    pub(crate) security: Arc<security::Security>,
    /// What HTTP `CONNECT` reaches through (the hub, the store, the audit log).
    pub(crate) tunnel: tunnel::exec::ExecState,
    pub(crate) handshake_timeout: Duration,
    pub(crate) limits: Arc<limits::ConnectionLimits>,
    pub(crate) builder: Arc<auto::Builder<hyper_util::rt::TokioExecutor>>,
    /// Shutdown began: finish in-flight requests and close.
    pub(crate) draining: CancellationToken,
    pub(crate) hard_stop: CancellationToken,
}

/// After the connection was closed for idleness or at its reserve deadline, how long a
/// graceful close (HTTP/2 GOAWAY) may take before the socket is dropped.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Connection {
    async fn serve(self, tcp: TcpStream, permit: limits::Permit, remote: SocketAddr) {
        let accepted = tokio::time::Instant::now();
        let reserve = permit.admission() == limits::Admission::Reserve;
        // A reserve connection has a short deadline for its handshake (and, unless it is an
        // admin's, for its whole life).
        let reserve_deadline = reserve.then(|| accepted + self.limits.reserve_deadline);
        let handshake_deadline = match reserve_deadline {
            Some(deadline) => deadline.min(accepted + self.handshake_timeout),
            None => accepted + self.handshake_timeout,
        };
        // The permit travels with the socket, into a tunnel after an upgrade too.
        let tcp = limits::Counted::new(tcp, permit);
        // Reads the socket 64 KiB at a time under rustls (which reads 4 KiB at a time) and
        // lets rustls buffer a whole tunnel frame: fewer system calls per byte on bulk
        // transfers, the agent tunnel's in particular (docs/benchmarks.md).
        let tcp = rlark_tunnel::transport::ReadAhead::new(tcp);
        let handshake = tokio::time::timeout_at(handshake_deadline, self.acceptor.accept(tcp));
        let mut tls = tokio::select! {
            _ = self.hard_stop.cancelled() => return,
            result = handshake => match result {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!("TLS handshake timed out");
                    return;
                }
            },
        };
        tls.get_mut()
            .1
            .set_buffer_limit(Some(rlark_tunnel::transport::TLS_BUFFER_LIMIT));
        let (_, session) = tls.get_ref();
        let peer = Arc::new(auth::PeerCredentials::from_verified_chain(
            session.peer_certificates(),
        ));
        let span = tracing::Span::current();
        if let Some(identity) = &peer.cert_identity {
            span.record("user", identity.user.as_str());
        }
        if let Some(alpn) = session.alpn_protocol() {
            span.record("alpn", String::from_utf8_lossy(alpn).as_ref());
        }
        // On a reserve connection only a valid admin certificate earns full service.
        let admin = peer.cert_identity.as_ref().is_some_and(|identity| {
            identity
                .groups
                .iter()
                .any(|g| g == rlark_apiserver::auth::ADMIN_GROUP)
        }) && peer
            .cert_serial
            .as_ref()
            .is_some_and(|serial| !self.security.is_revoked(serial));
        let probe_only = reserve && !admin;
        let close_at = if probe_only { reserve_deadline } else { None };
        tracing::debug!(probe_only, "connection established");

        // Subscribe before serving, so a revocation between now and the first request is
        // not missed.
        let mut revocations = self.security.subscribe();
        let service = http::connection_service(
            self.router,
            Arc::clone(&peer),
            Arc::clone(&self.security),
            self.tunnel,
            remote,
        );
        let activity = limits::Activity::new();
        let service = limits::track(service, Arc::clone(&activity), probe_only);
        // Every answer of every HTTPS listener: nosniff and HSTS, here and nowhere else.
        let service = http::secure_responses(service);
        let conn = self
            .builder
            .serve_connection_with_upgrades(TokioIo::new(tls), service);
        tokio::pin!(conn);
        // A revocation of this connection's certificate or of a token it used closes the
        // connection at once, ending its watches (and, later, tunnels).
        let revoked = async {
            loop {
                if revocations.changed().await.is_err() {
                    return std::future::pending().await;
                }
                if peer.revoked(&self.security).await {
                    return;
                }
            }
        };
        tokio::pin!(revoked);
        let idle = activity.idle_expired(self.limits.header_read_timeout, self.limits.idle_timeout);
        tokio::pin!(idle);
        let reserve_over = async {
            match close_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(reserve_over);
        // Set once a graceful close began: then the socket is dropped at this instant.
        let mut closing: Option<tokio::time::Instant> = None;
        let mut draining = false;
        loop {
            let forced_close = async {
                match closing {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.hard_stop.cancelled() => {
                    tracing::debug!("connection closed at end of grace period");
                    return;
                }
                () = &mut revoked => {
                    tracing::info!("connection closed: its credentials were revoked");
                    return;
                }
                () = forced_close => {
                    tracing::debug!("connection dropped: graceful close took too long");
                    return;
                }
                result = conn.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with error");
                    }
                    return;
                }
                _ = self.draining.cancelled(), if !draining => {
                    // Server shutdown: in-flight requests finish (bounded by the grace
                    // period through `hard_stop`).
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                () = &mut idle, if closing.is_none() => {
                    tracing::debug!("closing idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
                () = &mut reserve_over, if closing.is_none() => {
                    tracing::debug!("closing probe-only reserve connection at its deadline");
                    conn.as_mut().graceful_shutdown();
                    closing = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                }
            }
        }
    }
}
