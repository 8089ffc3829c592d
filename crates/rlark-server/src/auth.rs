//! Authentication: the one place that turns a request's credentials into an [`Identity`].
//!
//! Today the only credential is the client certificate verified during the TLS handshake
//! (Kubernetes convention: CN = user, O = groups). Bearer tokens and revocation checks belong
//! here too, so that every route sees the same answer.

use http::HeaderMap;
use rlark_apiserver::auth::Identity;
use rustls::pki_types::CertificateDer;

/// What a connection proved about its peer during the TLS handshake. Resolved once per
/// connection; [`authenticate`] combines it with each request's headers.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerCredentials {
    /// Identity of the verified client certificate, if the client sent one.
    pub cert_identity: Option<Identity>,
}

impl PeerCredentials {
    /// From the peer certificate chain rustls verified (leaf first). A verified certificate
    /// without a usable subject CN authenticates nobody.
    pub(crate) fn from_verified_chain(chain: Option<&[CertificateDer<'_>]>) -> Self {
        let cert_identity =
            chain
                .and_then(|c| c.first())
                .and_then(
                    |leaf| match rlark_pki::identity_from_cert_der(leaf.as_ref()) {
                        Ok((user, groups)) => Some(Identity { user, groups }),
                        Err(error) => {
                            tracing::warn!(%error, "client certificate carries no usable identity");
                            None
                        }
                    },
                );
        Self { cert_identity }
    }
}

/// The identity of one request, or `None` for an anonymous request (routes that need an
/// identity answer 401 themselves).
pub(crate) fn authenticate(peer: &PeerCredentials, _headers: &HeaderMap) -> Option<Identity> {
    peer.cert_identity.clone()
}
