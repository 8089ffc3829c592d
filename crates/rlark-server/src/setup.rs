//! What the server prepares before it serves: its store, its listener, its security state
//! (CA, keys, revocations) and the TLS it speaks to peer replicas.

use super::*;

/// Open the store `config` names: PostgreSQL at `store_url`, else SQLite at `db_path`.
pub(crate) async fn open_store(
    config: &ServerConfig,
    db_path: &Path,
) -> Result<ServerStore, ServerError> {
    let engine = EngineConfig {
        log_capacity: config.store_log_capacity,
        log_capacity_bytes: config.store_log_capacity_bytes,
        watch_buffer_bytes: config.store_watch_buffer_bytes,
        ..EngineConfig::default()
    };
    match &config.store_url {
        Some(url) => {
            let opened = match PostgresStoreConfig::from_url(url) {
                Ok(mut store_config) => {
                    store_config.engine = engine;
                    PostgresStore::open(store_config).await
                }
                Err(e) => Err(e),
            };
            opened
                .map(ServerStore::Postgres)
                .map_err(|source| ServerError::OpenStore {
                    path: PathBuf::from(redact_url(url)),
                    source,
                })
        }
        None => {
            let mut store_config = SqliteStoreConfig::new(db_path);
            store_config.log_capacity = engine.log_capacity;
            store_config.log_capacity_bytes = engine.log_capacity_bytes;
            store_config.watch_buffer_bytes = engine.watch_buffer_bytes;
            SqliteStore::open(store_config)
                .await
                .map(ServerStore::Sqlite)
                .map_err(|source| ServerError::OpenStore {
                    path: db_path.to_path_buf(),
                    source,
                })
        }
    }
}

/// `url` without the password, for messages (also the CLI's store commands).
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{}{user}{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// The steps of [`start`] between opening the store and serving: create the `default`
/// namespace, bind, write the kubeconfig with the bound URL. On error the caller closes the
/// store.
pub(crate) async fn prepare_listener(
    config: &ServerConfig,
    api: &ApiServer,
    data_dir: &Path,
    ca: &Ca,
    admin: &rlark_pki::IssuedCert,
) -> Result<(TcpListener, SocketAddr, String, PathBuf), ServerError> {
    // Before reporting ready, so clients can use the `default` namespace at once.
    api.ensure_default_namespace()
        .await
        .map_err(|e| ServerError::InitApi(e.to_string()))?;
    let bind_err = |source| ServerError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_err)?;
    let local_addr = listener.local_addr().map_err(bind_err)?;
    let url = server_url(local_addr);
    let kubeconfig_path = admin_kubeconfig_path(data_dir);
    let kubeconfig = rlark_pki::kubeconfig_yaml(
        &url,
        &ca.bundle_pem(),
        &admin.cert_pem,
        &admin.key_pem,
        ADMIN_USER,
    );
    rlark_pki::write_private_file(&kubeconfig_path, kubeconfig.as_bytes())?;
    Ok((listener, local_addr, url, kubeconfig_path))
}

/// Load the security state and register the admin certificate in it (so that it is listed
/// and can be revoked like any other).
pub(crate) async fn prepare_security(
    config: &ServerConfig,
    ca: Arc<Ca>,
    store: Arc<dyn rlark_store::Store>,
    audit: Arc<dyn rlark_apiserver::audit::AuditSink>,
    admin: &rlark_pki::IssuedCert,
    revocation_file: security::revocation_file::RevocationFile,
) -> Result<Arc<security::Security>, ServerError> {
    let security =
        security::Security::load(ca, store, audit, config.security.clone(), revocation_file)
            .await
            .map_err(|e| ServerError::Security(e.to_string()))?;
    let info = rlark_pki::CertInfo::from_pem(&admin.cert_pem)?;
    security
        .record_certificate(&info, "admin", None, "startup", None)
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?;
    if security.is_revoked(&info.serial) {
        tracing::warn!(
            serial = %info.serial,
            "the admin certificate in the data directory is revoked; delete pki/admin.crt and pki/admin.key and restart to issue a new one"
        );
    }
    Ok(security)
}

/// This replica's peer identity towards the others (`tunnel/peer.rs`): a client certificate
/// `system:rlark:peer:replica-<port>-<random>` issued now (recorded like any other, so it is
/// listed and revocable), and the installation's CA as the only root.
pub(crate) async fn peer_tls(
    config: &ServerConfig,
    ca: &Ca,
    security: &security::Security,
    local_addr: SocketAddr,
) -> Result<Arc<rustls::ClientConfig>, ServerError> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let name = format!(
        "replica-{}-{}",
        local_addr.port(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let identity = rlark_apiserver::auth::Identity::peer(&name);
    let issued = ca.issue_client(
        &identity.user,
        &identity.groups,
        config.serving_cert_validity,
    )?;
    let info = rlark_pki::CertInfo::from_pem(&issued.cert_pem)?;
    security
        .record_certificate(&info, "peer", None, "startup", None)
        .await
        .map_err(|e| ServerError::Security(e.to_string()))?;
    let tls_error = |what: &str, e: &dyn std::fmt::Display| {
        ServerError::Security(format!("peer TLS client ({what}): {e}"))
    };
    let mut roots = rustls::RootCertStore::empty();
    for anchor in ca.trust_anchors() {
        roots
            .add(anchor)
            .map_err(|e| tls_error("CA certificate", &e))?;
    }
    let chain = CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error("certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes())
        .map_err(|e| tls_error("key", &e))?;
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(rlark_pki::tls_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("protocol versions", &e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| tls_error("client certificate", &e))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}
