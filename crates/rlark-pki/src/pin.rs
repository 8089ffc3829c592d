//! Server verification pinned to a CA public-key hash, for the first contact of a joining
//! agent (kubeadm's `--discovery-token-ca-cert-hash`).
//!
//! The joining host has no CA certificate yet, only `sha256:<hex>` of the CA's
//! SubjectPublicKeyInfo, received out of band with the bootstrap token. The rlark server
//! sends its CA certificate in the TLS chain; this verifier looks for a certificate in the
//! presented chain whose key hashes to the pin, and then verifies the server certificate
//! (chain, validity, host name) against that certificate as the only trust anchor. A
//! man-in-the-middle with another CA cannot produce a chain that passes: its chain holds no
//! certificate with the pinned key, or one it cannot have signed with.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Verifies a server against a CA public-key pin. See the module docs.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

/// Why a `--ca-hash` value is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CA hash {0:?} must be sha256:<64 hex digits> (as printed by `rlark token create`)")]
pub struct BadPin(pub String);

impl PinnedCaVerifier {
    /// A verifier for `pin` (`sha256:<64 hex>`, case-insensitive), using ring.
    pub fn new(pin: &str) -> Result<Self, BadPin> {
        let hex = pin
            .strip_prefix("sha256:")
            .ok_or_else(|| BadPin(pin.to_string()))?;
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(BadPin(pin.to_string()));
        }
        Ok(Self {
            pin: format!("sha256:{}", hex.to_ascii_lowercase()),
            provider: Arc::new(rustls::crypto::ring::default_provider()),
        })
    }

    /// The normalized pin.
    pub fn pin(&self) -> &str {
        &self.pin
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut presented = Vec::new();
        let anchor = intermediates.iter().find(|cert| {
            let hash = crate::ca_cert_hash(cert.as_ref()).unwrap_or_default();
            let found = hash == self.pin;
            presented.push(hash);
            found
        });
        let Some(anchor) = anchor else {
            return Err(rustls::Error::General(format!(
                "the server's CA does not match the pinned CA hash {} (the server presented {}); \
                 check --ca-hash, or someone is intercepting the connection",
                self.pin,
                if presented.is_empty() {
                    "no CA certificate".to_string()
                } else {
                    presented.join(", ")
                }
            )));
        };
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(anchor.clone().into_owned())
            .map_err(|e| rustls::Error::General(format!("pinned CA certificate: {e}")))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|e| rustls::Error::General(format!("verifier: {e}")))?;
        verifier.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
