//! TLS towards the targets of `/api/proxy/{cluster}/https/...` and `.../https+insecure/...`.
//!
//! The hub terminates the caller's request and speaks TLS itself to the target, end to end
//! through the tunnel stream (the agent only relays bytes). Two client configurations:
//!
//! - **verified** (`https`): the target's certificate must chain to the public web roots
//!   (Mozilla's, via `webpki-roots`) or to the installation's CA bundle (so services with
//!   rlark-issued certificates verify), and name the host of the URL (DNS name or IP);
//! - **insecure** (`https+insecure`): any certificate is accepted (the handshake signature
//!   is still checked, so the key exchange is with whoever holds the presented key). This
//!   is what kube-apiserver's service proxy does for `https:` targets; it is spelled out
//!   in the URL so nobody gets it by accident.

use std::sync::{Arc, RwLock};

use rlark_pki::ServerVerifier;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::{ClientConfig, RootCertStore};

/// The two client configurations (see the module documentation). Cheap to read.
#[derive(Debug)]
pub struct ProxyTls {
    verified: RwLock<Arc<ClientConfig>>,
    insecure: Arc<ClientConfig>,
}

impl Default for ProxyTls {
    fn default() -> Self {
        Self::new()
    }
}

impl ProxyTls {
    /// Web roots only, until [`ProxyTls::trust_pem`] adds the installation's CA.
    pub fn new() -> ProxyTls {
        let provider = Arc::new(rlark_pki::tls_provider());
        let insecure = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map(|builder| {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ServerVerifier::any_certificate(
                        provider,
                    )))
                    .with_no_client_auth()
            })
            .unwrap_or_else(|_| Self::verified_config(web_roots()));
        ProxyTls {
            verified: RwLock::new(Arc::new(Self::verified_config(web_roots()))),
            insecure: Arc::new(insecure),
        }
    }

    /// Trust, besides the web roots, every certificate in `pem` (the installation's CA
    /// bundle). Returns how many were added; unparsable entries are skipped.
    pub fn trust_pem(&self, pem: &str) -> usize {
        let mut roots = web_roots();
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()).flatten() {
            if roots.add(cert).is_ok() {
                added += 1;
            }
        }
        let config = Arc::new(Self::verified_config(roots));
        *self
            .verified
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config;
        added
    }

    /// The configuration of `https` targets.
    pub fn verified(&self) -> Arc<ClientConfig> {
        Arc::clone(
            &self
                .verified
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// The configuration of `https+insecure` targets.
    pub fn insecure(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.insecure)
    }

    fn verified_config(roots: RootCertStore) -> ClientConfig {
        let provider = Arc::new(rlark_pki::tls_provider());
        match ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions() {
            Ok(builder) => builder.with_root_certificates(roots).with_no_client_auth(),
            // The ring provider supports the default versions; keep rustls' own default.
            Err(_) => ClientConfig::builder()
                .with_root_certificates(web_roots())
                .with_no_client_auth(),
        }
    }
}

fn web_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}
