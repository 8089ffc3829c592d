//! The TLS configuration of the listener.

use std::sync::Arc;

use rlark_pki::{Ca, IssuedCert};
use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

use crate::ServerError;
use crate::security::Security;

/// ALPN protocols offered, preferred first.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Server TLS config: the serving certificate followed by the CA chain (so joining agents
/// can check the CA against their pinned hash, and, during a CA rotation, clients that trust
/// only the previous CA verify through the cross-signed certificate); client certificates
/// verified against every trusted CA and refused when revoked, but optional (anonymous
/// clients reach HTTP and get 401 where it matters); ALPN h2 + http/1.1; ring crypto
/// (independent of the process-default provider).
pub(crate) fn server_config(
    ca: &Ca,
    serving: &IssuedCert,
    security: Arc<Security>,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let tls_err = |what: &str, e: &dyn std::fmt::Display| ServerError::Tls(format!("{what}: {e}"));
    let provider = Arc::new(rlark_pki::tls_provider());
    let mut roots = rustls::RootCertStore::empty();
    for anchor in ca.trust_anchors() {
        roots
            .add(anchor)
            .map_err(|e| tls_err("add CA to client roots", &e))?;
    }
    let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| tls_err("client certificate verifier", &e))?;
    let verifier = Arc::new(RevocationCheckingVerifier {
        inner: webpki,
        security,
    });
    let cert = CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())
        .map_err(|e| tls_err("serving certificate", &e))?;
    let mut chain = vec![cert];
    chain.extend(ca.serving_chain_tail());
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| tls_err("serving key", &e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("protocol versions", &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| tls_err("serving certificate", &e))?;
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // Our preference (AES-128-GCM first, see `rlark_pki::tls_provider`) over the client's:
    // Go clients (kubectl) list AES-128 first anyway; the tunnel carries bulk data.
    config.ignore_client_order = true;
    Ok(Arc::new(config))
}

/// WebPKI verification, then a revocation check of the leaf's serial: a revoked
/// certificate fails the handshake itself.
#[derive(Debug)]
struct RevocationCheckingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    security: Arc<Security>,
}

impl ClientCertVerifier for RevocationCheckingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let (_, cert) = x509_parser::parse_x509_certificate(end_entity.as_ref()).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        let serial = rlark_pki::serial_hex(cert.raw_serial());
        if self.security.is_revoked(&serial) {
            tracing::info!(%serial, "refused revoked client certificate");
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
