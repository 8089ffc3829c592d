//! The TLS configuration of the listener.

use std::sync::Arc;

use rlark_pki::{Ca, IssuedCert};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::ServerError;

/// ALPN protocols offered, preferred first.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Server TLS config: the serving certificate, client certificates verified against the
/// installation CA but optional (anonymous clients reach HTTP and get 401 where it matters),
/// ALPN h2 + http/1.1, ring crypto (independent of the process-default provider).
pub(crate) fn server_config(
    ca: &Ca,
    serving: &IssuedCert,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let tls_err = |what: &str, e: &dyn std::fmt::Display| ServerError::Tls(format!("{what}: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca.cert_der().to_vec()))
        .map_err(|e| tls_err("add CA to client roots", &e))?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| tls_err("client certificate verifier", &e))?;
    let cert = CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())
        .map_err(|e| tls_err("serving certificate", &e))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| tls_err("serving key", &e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("protocol versions", &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![cert], key)
        .map_err(|e| tls_err("serving certificate", &e))?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}
