//! What agents are told about revocations: `GET /rlark/v1/agentrevocations`.
//!
//! Agents check each other's certificates on the direct pod-network path (agent to agent,
//! without the hub), so they need the revoked serials the server keeps. They get:
//!
//! - every revoked serial of a certificate issued to an agent (`CN=system:rlark:agent:*`),
//!   and every revoked serial whose subject the server does not know (a revocation by
//!   serial of a certificate it has no record of: it may be an agent's). Not the serials of
//!   users', peers' or tasks' certificates: the direct path refuses those by their subject
//!   already, and the list would tell every agent when users lose their access;
//! - minus those whose certificate has expired (the record's `notAfter` is past): an
//!   expired certificate is refused anyway, so the list is bounded by the agent
//!   certificates revoked within one certificate lifetime (30 days by default), not by all
//!   revocations ever made.
//!
//! The answer is `{"kind": "AgentRevocationList", "serials": [...]}` (sorted, lowercase hex as
//! in [`rlark_pki::CertInfo::serial`]) with an `ETag` that is a digest of the list, so it is
//! the same on every replica. With `If-None-Match: <etag>` the answer is `304 Not Modified`
//! while the list is unchanged; adding `?waitSeconds=N` (at most [`MAX_WAIT`]) holds the
//! request until the list changes or N seconds pass, so an agent learns of a revocation
//! at once without polling often.
//!
//! The list is recomputed from the store only after a revocation (the server's change
//! counter moved), never per request. At 100,000 unexpired revoked agent certificates the
//! answer is about 3.5 MB (35 bytes a serial), read by each agent once at start and once
//! per change; unchanged polls cost a digest comparison.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rlark_apiserver::auth::AGENT_USER_PREFIX;
use sha2::{Digest as _, Sha256};

use super::parse_rfc3339;
use super::records::{CertificateRecord, RevocationRecord};

/// The route.
pub(crate) const ROUTE: &str = "/rlark/v1/agentrevocations";
/// The longest `waitSeconds` a request may ask for.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(60);

/// The published list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AgentRevocations {
    /// Sorted, no duplicates.
    pub serials: Vec<String>,
    /// Quoted, as sent in `ETag`: a digest of `serials`.
    pub etag: String,
}

/// The list to publish from all `revocations`, given the certificate records by serial,
/// at `now` (see the module documentation for what is in it).
pub(crate) fn published(
    revocations: &[RevocationRecord],
    certificates: &HashMap<String, CertificateRecord>,
    now: SystemTime,
) -> AgentRevocations {
    let mut serials: Vec<String> = revocations
        .iter()
        .filter(|r| {
            let cert = certificates.get(&r.serial);
            let user = match cert {
                Some(cert) => cert.user.as_str(),
                None => r.user.as_str(),
            };
            let agent_or_unknown = user.is_empty() || user.starts_with(AGENT_USER_PREFIX);
            let expired = cert
                .and_then(|c| parse_rfc3339(&c.not_after))
                .is_some_and(|not_after| not_after < now);
            agent_or_unknown && !expired
        })
        .map(|r| r.serial.clone())
        .collect();
    serials.sort_unstable();
    serials.dedup();
    let mut digest = Sha256::new();
    for serial in &serials {
        digest.update(serial.as_bytes());
        digest.update(b"\n");
    }
    let etag = format!("\"{}\"", &hex::encode(digest.finalize())[..32]);
    AgentRevocations { serials, etag }
}

/// The last computed list and the change counter it was computed at.
pub(crate) type Cached = Option<(u64, Arc<AgentRevocations>)>;

#[cfg(test)]
mod tests {
    use super::*;

    fn revocation(serial: &str, user: &str) -> RevocationRecord {
        RevocationRecord {
            serial: serial.into(),
            user: user.into(),
            reason: "test".into(),
            revoked_by: "admin".into(),
            revoked_at: "2026-12-01T00:00:00Z".into(),
        }
    }

    fn certificate(serial: &str, user: &str, not_after: &str) -> (String, CertificateRecord) {
        (
            serial.to_string(),
            CertificateRecord {
                serial: serial.into(),
                user: user.into(),
                groups: vec![],
                role: "agent".into(),
                cluster_id: None,
                issuer: "ca".into(),
                not_before: "2026-11-01T00:00:00Z".into(),
                not_after: not_after.into(),
                key_hash: "sha256:x".into(),
                issued_by: "join".into(),
                renewed_from: None,
                revoked_at: None,
            },
        )
    }

    #[test]
    fn agents_get_revoked_agent_serials_that_have_not_expired() {
        let now = parse_rfc3339("2026-12-02T00:00:00Z").unwrap();
        let revocations = [
            revocation("0a", "system:rlark:agent:a"),
            revocation("0b", "alice"),
            revocation("0c", ""),
            revocation("0d", "system:rlark:agent:old"),
            revocation("0e", "system:rlark:peer:p"),
            // Recorded twice (a revocation file merged back): listed once.
            revocation("0a", "system:rlark:agent:a"),
            // The record knows the subject the revocation did not.
            revocation("0f", ""),
        ];
        let certificates: HashMap<_, _> = [
            certificate("0a", "system:rlark:agent:a", "2026-12-31T00:00:00Z"),
            certificate("0b", "alice", "2027-01-01T00:00:00Z"),
            certificate("0d", "system:rlark:agent:old", "2026-12-01T00:00:00Z"),
            certificate("0f", "bob", "2027-01-01T00:00:00Z"),
        ]
        .into_iter()
        .collect();
        let list = published(&revocations, &certificates, now);
        assert_eq!(list.serials, ["0a", "0c"]);
        assert!(list.etag.starts_with('"') && list.etag.ends_with('"'));

        // The ETag is a function of the list only: the same on every replica, another after
        // a change.
        let again = published(&revocations[..3], &certificates, now);
        assert_eq!(again, list);
        let more = published(
            &[
                revocations[0].clone(),
                revocation("1", "system:rlark:agent:b"),
            ],
            &certificates,
            now,
        );
        assert_ne!(more.etag, list.etag);
        assert_ne!(published(&[], &certificates, now).etag, list.etag);
    }
}
