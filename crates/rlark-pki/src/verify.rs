//! The one rustls server-certificate verifier of rlark ([`ServerVerifier`]), for the three
//! checks rustls' own `WebPkiServerVerifier` does not make:
//!
//! - **pinned CA** ([`ServerVerifier::pinned_ca`]), for the first contact of a joining agent
//!   (kubeadm's `--discovery-token-ca-cert-hash`). The joining host has no CA certificate
//!   yet, only `sha256:<hex>` of the CA's SubjectPublicKeyInfo, received out of band with the
//!   bootstrap token. The rlark server sends its CA certificate in the TLS chain; the
//!   verifier looks for a certificate in the presented chain whose key hashes to the pin,
//!   and then verifies the server certificate (chain, validity, host name) against that
//!   certificate as the only trust anchor. A man-in-the-middle with another CA cannot
//!   produce a chain that passes: its chain holds no certificate with the pinned key, or one
//!   it cannot have signed with.
//! - **a peer's client certificate** ([`ServerVerifier::client_auth_chain`]): the server
//!   presents a certificate made for client authentication (an agent's, on the agents'
//!   direct path), verified as a client certificate to the CA bundle, and then the caller's
//!   check of whom it names against the server name it dialed.
//! - **any certificate** ([`ServerVerifier::any_certificate`]): `https+insecure` proxy
//!   targets, spelled out in the URL so nobody gets it by accident.
//!
//! In every case the handshake signatures are verified with the crypto provider, so the key
//! exchange is with whoever holds the presented certificate's key.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;

/// What the caller of [`ServerVerifier::client_auth_chain`] checks of the server's
/// certificate (already verified to chain to the CA) against the server name it dialed;
/// `Err` names what is wrong.
pub type IdentityCheck =
    dyn Fn(&CertificateDer<'_>, &ServerName<'_>) -> Result<(), String> + Send + Sync;

/// A rustls server-certificate verifier: one of the checks of the module docs, and the
/// handshake signatures checked with the crypto provider.
pub struct ServerVerifier {
    check: Check,
    provider: Arc<CryptoProvider>,
}

enum Check {
    PinnedCa(String),
    ClientAuthChain {
        chain: Arc<dyn ClientCertVerifier>,
        identity: Box<IdentityCheck>,
    },
    Any,
}

impl std::fmt::Debug for ServerVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let check = match &self.check {
            Check::PinnedCa(pin) => format!("PinnedCa({pin})"),
            Check::ClientAuthChain { .. } => "ClientAuthChain".to_string(),
            Check::Any => "Any".to_string(),
        };
        f.debug_struct("ServerVerifier")
            .field("check", &check)
            .finish_non_exhaustive()
    }
}

/// Why a `--ca-hash` value is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CA hash {0:?} must be sha256:<64 hex digits> (as printed by `rlark token create`)")]
pub struct BadPin(pub String);

impl ServerVerifier {
    /// Trust only a server whose chain holds the CA of `pin` (`sha256:<64 hex>`,
    /// case-insensitive), with [`crate::tls_provider`].
    pub fn pinned_ca(pin: &str) -> Result<Self, BadPin> {
        let hex = pin
            .strip_prefix("sha256:")
            .ok_or_else(|| BadPin(pin.to_string()))?;
        if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(BadPin(pin.to_string()));
        }
        Ok(Self {
            check: Check::PinnedCa(format!("sha256:{}", hex.to_ascii_lowercase())),
            provider: Arc::new(crate::tls_provider()),
        })
    }

    /// Trust a server whose certificate `chain` accepts as a client certificate (for
    /// client-auth usage: what agent certificates carry) and that `identity` accepts for the
    /// server name dialed.
    pub fn client_auth_chain(
        chain: Arc<dyn ClientCertVerifier>,
        provider: Arc<CryptoProvider>,
        identity: impl Fn(&CertificateDer<'_>, &ServerName<'_>) -> Result<(), String>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            check: Check::ClientAuthChain {
                chain,
                identity: Box::new(identity),
            },
            provider,
        }
    }

    /// Accept any server certificate (only the handshake signatures are checked).
    pub fn any_certificate(provider: Arc<CryptoProvider>) -> Self {
        Self {
            check: Check::Any,
            provider,
        }
    }

    /// The normalized pin of a [`ServerVerifier::pinned_ca`] verifier.
    pub fn pin(&self) -> Option<&str> {
        match &self.check {
            Check::PinnedCa(pin) => Some(pin),
            _ => None,
        }
    }

    fn verify_pinned(
        &self,
        pin: &str,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut presented = Vec::new();
        let anchor = intermediates.iter().find(|cert| {
            let hash = crate::ca_cert_hash(cert.as_ref()).unwrap_or_default();
            let found = hash == pin;
            presented.push(hash);
            found
        });
        let Some(anchor) = anchor else {
            return Err(rustls::Error::General(format!(
                "the server's CA does not match the pinned CA hash {pin} (the server presented {}); \
                 check --ca-hash, or someone is intercepting the connection",
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
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.check {
            Check::PinnedCa(pin) => self.verify_pinned(
                pin,
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ),
            Check::ClientAuthChain { chain, identity } => {
                chain.verify_client_cert(end_entity, intermediates, now)?;
                identity(end_entity, server_name).map_err(rustls::Error::General)?;
                Ok(ServerCertVerified::assertion())
            }
            Check::Any => Ok(ServerCertVerified::assertion()),
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use rustls::pki_types::PrivateKeyDer;
    use rustls::pki_types::pem::PemObject as _;

    use super::*;
    use crate::{Ca, IssuedCert};

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
    }

    fn name(text: &str) -> ServerName<'static> {
        ServerName::try_from(text.to_string()).expect("name")
    }

    /// A client-auth chain verifier trusting `ca`, and the provider.
    fn client_chain(ca: &Ca) -> (Arc<dyn ClientCertVerifier>, Arc<CryptoProvider>) {
        let provider = Arc::new(crate::tls_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(ca.cert_der().to_vec()))
            .expect("root");
        let chain = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .expect("client verifier");
        (chain, provider)
    }

    /// Accepts the certificate whose user is `peer:<server name>`.
    fn peer_named(cert: &CertificateDer<'_>, server_name: &ServerName<'_>) -> Result<(), String> {
        let (user, _) = crate::identity_from_cert_der(cert.as_ref()).map_err(|e| e.to_string())?;
        let ServerName::DnsName(expected) = server_name else {
            return Err("not a name".into());
        };
        if user != format!("peer:{}", expected.as_ref()) {
            return Err(format!(
                "the server is {user}, not peer:{}",
                expected.as_ref()
            ));
        }
        Ok(())
    }

    /// A full TLS handshake in memory: the server presents `issued` (and `tail`), the client
    /// verifies with `verifier` and expects `server_name`. The client's error, if any.
    fn handshake(
        verifier: ServerVerifier,
        issued: &IssuedCert,
        tail: Vec<CertificateDer<'static>>,
        server_name: &str,
    ) -> Result<(), rustls::Error> {
        let provider = Arc::new(crate::tls_provider());
        let mut chain = vec![der(&issued.cert_pem)];
        chain.extend(tail);
        let key = PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).expect("key");
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        let mut client =
            rustls::ClientConnection::new(Arc::new(client), name(server_name)).expect("client");
        let mut server = rustls::ServerConnection::new(Arc::new(server)).expect("server");
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).expect("client write");
            let mut read = &buf[..];
            while !read.is_empty() {
                server.read_tls(&mut read).expect("server read");
                // The server's errors (an alert from the client) follow the client's.
                let _ = server.process_new_packets();
            }
            let mut buf = Vec::new();
            server.write_tls(&mut buf).expect("server write");
            let mut read = &buf[..];
            while !read.is_empty() {
                client.read_tls(&mut read).expect("client read");
                client.process_new_packets()?;
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        panic!("the handshake did not finish");
    }

    #[test]
    fn pinned_ca_normalizes_the_pin() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::load_or_create(dir.path()).expect("ca");
        let pin = ca.cert_hash().expect("hash");
        let upper = pin.to_uppercase().replace("SHA256", "sha256");
        let verifier = ServerVerifier::pinned_ca(&upper).expect("pin");
        assert_eq!(verifier.pin(), Some(pin.as_str()));
        assert!(format!("{verifier:?}").contains(&pin));
        let provider = Arc::new(crate::tls_provider());
        assert_eq!(ServerVerifier::any_certificate(provider).pin(), None);
    }

    #[test]
    fn pinned_ca_completes_a_handshake_with_its_ca_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        let ca = Ca::load_or_create(dir.path()).expect("ca");
        let mitm = Ca::load_or_create(other.path()).expect("mitm");
        let pin = ca.cert_hash().expect("hash");
        let serving = |ca: &Ca| {
            ca.issue_serving(&["localhost".to_string()], DAY)
                .expect("serving")
        };
        let verifier = || ServerVerifier::pinned_ca(&pin).expect("pin");
        handshake(
            verifier(),
            &serving(&ca),
            ca.serving_chain_tail(),
            "localhost",
        )
        .expect("the pinned CA's server");
        let error = handshake(
            verifier(),
            &serving(&mitm),
            mitm.serving_chain_tail(),
            "localhost",
        )
        .expect_err("another CA's server");
        assert!(error.to_string().contains("does not match"), "{error}");
        assert!(
            handshake(verifier(), &serving(&ca), ca.serving_chain_tail(), "other").is_err(),
            "the host name is checked"
        );
    }

    #[test]
    fn client_auth_chain_checks_the_chain_then_the_identity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        let ca = Ca::load_or_create(dir.path()).expect("ca");
        let stranger = Ca::load_or_create(other.path()).expect("stranger");
        let peer = ca.issue_client("peer:a", &[], DAY).expect("client");
        let (chain, provider) = client_chain(&ca);
        let verifier =
            || ServerVerifier::client_auth_chain(chain.clone(), provider.clone(), peer_named);

        handshake(verifier(), &peer, Vec::new(), "a").expect("peer a, dialed as a");
        let error = handshake(verifier(), &peer, Vec::new(), "b").expect_err("dialed as b");
        assert!(
            error
                .to_string()
                .contains("the server is peer:a, not peer:b"),
            "{error}"
        );

        // Another CA's certificate fails at the chain, before the identity is looked at.
        let checked = Arc::new(AtomicBool::new(false));
        let seen = checked.clone();
        let verifier = ServerVerifier::client_auth_chain(chain.clone(), provider.clone(), {
            move |cert: &CertificateDer<'_>, name: &ServerName<'_>| {
                seen.store(true, Ordering::SeqCst);
                peer_named(cert, name)
            }
        });
        let forged = stranger.issue_client("peer:a", &[], DAY).expect("client");
        let error = verifier
            .verify_server_cert(
                &der(&forged.cert_pem),
                &[],
                &name("a"),
                &[],
                UnixTime::now(),
            )
            .expect_err("another CA");
        assert!(
            matches!(error, rustls::Error::InvalidCertificate(_)),
            "{error}"
        );
        assert!(
            !checked.load(Ordering::SeqCst),
            "identity checked after a chain failure"
        );
    }

    #[test]
    fn any_certificate_accepts_every_server() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = Ca::load_or_create(dir.path()).expect("ca");
        let serving = ca
            .issue_serving(&["localhost".to_string()], DAY)
            .expect("serving");
        let provider = Arc::new(crate::tls_provider());
        // Another name, no chain, a client certificate: all accepted (the handshake, which
        // verifies the server's signature with the provider, completes).
        handshake(
            ServerVerifier::any_certificate(provider.clone()),
            &serving,
            Vec::new(),
            "elsewhere",
        )
        .expect("any name");
        let client = ca.issue_client("someone", &[], DAY).expect("client");
        handshake(
            ServerVerifier::any_certificate(provider),
            &client,
            Vec::new(),
            "localhost",
        )
        .expect("any usage");
    }
}
