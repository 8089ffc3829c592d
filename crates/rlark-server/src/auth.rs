//! Authentication: the one place that turns a request's credentials into an [`Identity`].
//!
//! Two credentials are accepted, both resolving to the same `Identity { user, groups }`:
//! - the client certificate verified during the TLS handshake (Kubernetes convention:
//!   CN = user, O = groups), unless its serial has been revoked since;
//! - `Authorization: Bearer <token>` with a user or task token minted by the server (see
//!   `security`), checked against the store on every request (expiry, revocation, and for
//!   task tokens that the task still runs).
//!
//! A request that presents a bearer token is authenticated by the token alone; a bad token
//! is a 401, never a fallback to the certificate or to anonymous.

use std::collections::HashSet;
use std::sync::Mutex;

use http::HeaderMap;
use rlark_apiserver::auth::Identity;
use rustls::pki_types::CertificateDer;

use crate::security::{AuthMethod, Security, SecurityError};

/// What a connection proved about its peer during the TLS handshake, plus the bearer tokens
/// its requests used (so the connection can close itself when one is revoked).
#[derive(Debug, Default)]
pub(crate) struct PeerCredentials {
    /// Identity of the verified client certificate, if the client sent one.
    pub cert_identity: Option<Identity>,
    /// Serial of that certificate.
    pub cert_serial: Option<String>,
    /// Expiry of that certificate: checked per request, like Kubernetes' x509
    /// authenticator, so a long-lived connection does not outlive its certificate.
    pub cert_not_after: Option<std::time::SystemTime>,
    /// Ids of bearer tokens accepted on this connection.
    pub used_tokens: Mutex<HashSet<String>>,
}

impl PeerCredentials {
    /// From the peer certificate chain rustls verified (leaf first). A verified certificate
    /// without a usable subject CN authenticates nobody.
    pub(crate) fn from_verified_chain(chain: Option<&[CertificateDer<'_>]>) -> Self {
        let Some(leaf) = chain.and_then(|c| c.first()) else {
            return Self::default();
        };
        match rlark_pki::CertInfo::from_der(leaf.as_ref()) {
            Ok(info) => Self {
                cert_identity: Some(Identity {
                    user: info.common_name,
                    groups: info.groups,
                }),
                cert_serial: Some(info.serial),
                cert_not_after: Some(info.not_after),
                used_tokens: Mutex::default(),
            },
            Err(error) => {
                tracing::warn!(%error, "client certificate carries no usable identity");
                Self::default()
            }
        }
    }

    /// Whether this connection's certificate or any token it used has been revoked.
    pub(crate) async fn revoked(&self, security: &Security) -> bool {
        if let Some(serial) = &self.cert_serial
            && security.is_revoked(serial)
        {
            return true;
        }
        let tokens: Vec<String> = self
            .used_tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        for id in tokens {
            if security.bearer_token_revoked(&id).await {
                return true;
            }
        }
        false
    }
}

/// The bearer token of `Authorization: Bearer <token>`, if the header is present. A
/// malformed header is an error (401).
fn bearer(headers: &HeaderMap) -> Result<Option<&str>, SecurityError> {
    // `Proxy-Authorization` is what HTTP clients send to a proxy (CONNECT): accepted too.
    let Some(value) = headers
        .get(http::header::AUTHORIZATION)
        .or_else(|| headers.get(http::header::PROXY_AUTHORIZATION))
    else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| SecurityError::unauthorized("Authorization header is not ASCII"))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => Ok(Some(token.trim())),
        _ => Err(SecurityError::unauthorized(
            "Authorization header must be `Bearer <token>`",
        )),
    }
}

/// The identity of one request: `Ok(None)` for an anonymous request (routes that need an
/// identity answer 401 themselves), `Err` (401) for credentials that were presented but are
/// not valid.
pub(crate) async fn authenticate(
    peer: &PeerCredentials,
    headers: &HeaderMap,
    security: &Security,
) -> Result<Option<(Identity, AuthMethod)>, SecurityError> {
    if let Some(token) = bearer(headers)? {
        let (identity, id) = security.authenticate_bearer(token).await?;
        peer.used_tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id.clone());
        return Ok(Some((identity, AuthMethod::Bearer { id })));
    }
    match (&peer.cert_identity, &peer.cert_serial) {
        (Some(identity), Some(serial)) => {
            // Revoked after this connection's handshake: refuse its further requests too.
            if security.is_revoked(serial) {
                return Err(SecurityError::unauthorized(format!(
                    "client certificate {serial} has been revoked"
                )));
            }
            if peer
                .cert_not_after
                .is_some_and(|t| t <= std::time::SystemTime::now())
            {
                return Err(SecurityError::unauthorized(format!(
                    "client certificate {serial} has expired"
                )));
            }
            Ok(Some((
                identity.clone(),
                AuthMethod::Certificate {
                    serial: serial.clone(),
                },
            )))
        }
        _ => Ok(None),
    }
}
