//! Certificates: issuing for CSRs (admin signing, renewal), recording what was issued (X.509
//! and SSH), and listing the security records.

use std::time::{Duration, SystemTime};

use super::records::{
    BEARER_TOKENS, BOOTSTRAP_TOKENS, BearerTokenRecord, BootstrapTokenRecord, CERTIFICATES,
    CertificateRecord, REVOCATIONS, RevocationRecord,
};
use super::{CertRole, Issued, SecResult, Security, SecurityError, key, records, rfc3339};
use rlark_apiserver::audit::AuditEntry;
use rlark_apiserver::auth::Identity;
use rlark_pki::{CertInfo, ParsedCsr};
use rlark_store::StoreError;

impl Security {
    /// Record an issued certificate (idempotent by serial).
    pub(crate) async fn record_certificate(
        &self,
        info: &CertInfo,
        role: &str,
        cluster_id: Option<String>,
        issued_by: &str,
        renewed_from: Option<&str>,
    ) -> SecResult<()> {
        let record = CertificateRecord {
            serial: info.serial.clone(),
            user: info.common_name.clone(),
            groups: info.groups.clone(),
            role: role.to_string(),
            cluster_id,
            issuer: info.issuer.clone(),
            not_before: rfc3339(info.not_before),
            not_after: rfc3339(info.not_after),
            key_hash: info.key_hash.clone(),
            issued_by: issued_by.to_string(),
            renewed_from: renewed_from.map(str::to_string),
            revoked_at: None,
        };
        match self
            .store
            .create(
                &key(CERTIFICATES, &info.serial),
                records::to_object(&info.serial, &record),
            )
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(SecurityError::store(e)),
        }
    }

    /// Record an OpenSSH certificate the SSH CA signed, as a certificate record whose serial
    /// is the SSH serial in hex: `rlark cert list` shows it, `rlark cert revoke SERIAL` and
    /// `--user USER` revoke it, and the SSH endpoint checks it at every login.
    pub(crate) async fn record_ssh_certificate(
        &self,
        signed: &rlark_pki::ssh::SignedSshCert,
        role: &rlark_pki::ssh::SshCertRole,
        issued_by: &str,
    ) -> SecResult<()> {
        let serial = format!("{:x}", signed.serial);
        let (user, cluster_id) = match role {
            rlark_pki::ssh::SshCertRole::Guest { user } => (user.clone(), None),
            rlark_pki::ssh::SshCertRole::Domain { cluster_id, .. } => {
                (role.principal(), Some(cluster_id.clone()))
            }
        };
        let now = SystemTime::now();
        let record = CertificateRecord {
            serial: serial.clone(),
            user,
            groups: Vec::new(),
            role: format!("ssh-{}", role.role_name().trim_start_matches("ssh-")),
            cluster_id,
            issuer: rlark_pki::ssh::SSH_CA_COMMENT.to_string(),
            not_before: rfc3339(now),
            not_after: rfc3339(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(signed.valid_before),
            ),
            key_hash: signed.key_id.clone(),
            issued_by: issued_by.to_string(),
            renewed_from: None,
            revoked_at: None,
        };
        match self
            .store
            .create(
                &key(CERTIFICATES, &serial),
                records::to_object(&serial, &record),
            )
            .await
        {
            Ok(_) | Err(StoreError::AlreadyExists(_)) => Ok(()),
            Err(e) => Err(SecurityError::store(e)),
        }
    }

    /// Sign `csr` for `role`, record the certificate and audit it. `by` is the acting
    /// identity (`None` for a bootstrap-token join); `renewed_from` the serial of the
    /// certificate a renewal was authenticated with.
    pub(crate) async fn issue(
        &self,
        csr: &ParsedCsr,
        role: &CertRole,
        validity: Option<Duration>,
        action: &str,
        by: Option<&Identity>,
        renewed_from: Option<&str>,
    ) -> SecResult<Issued> {
        role.validate()?;
        let validity = validity.unwrap_or(match role {
            CertRole::Agent { .. } => self.config.agent_cert_validity,
            _ => self.config.user_cert_validity,
        });
        let subject = role.subject();
        let (pem, info) = self
            .ca
            .sign_client_csr(csr, &subject.user, &subject.groups, validity)
            .map_err(|e| SecurityError::internal(format!("sign certificate: {e}")))?;
        let issued_by = by
            .map(|i| i.user.clone())
            .unwrap_or_else(|| action.to_string());
        self.record_certificate(
            &info,
            role.name(),
            role.cluster_id(),
            &issued_by,
            renewed_from,
        )
        .await?;
        let mut entry = AuditEntry::now(action, "allowed").by(by);
        entry.verb = action.to_string();
        entry.resource = "certificates".to_string();
        entry.name = info.serial.clone();
        entry.reason = format!(
            "issued {} certificate for {} (groups {:?}) until {}",
            role.name(),
            info.common_name,
            info.groups,
            rfc3339(info.not_after)
        );
        if let Some(from) = renewed_from {
            entry.reason.push_str(&format!("; renews {from}"));
        }
        self.audit.record(entry);
        Ok(Issued {
            certificate_pem: pem,
            info,
            ca_bundle_pem: self.ca.bundle_pem(),
        })
    }

    /// Renew: sign `csr` for the same `role` as the certificate `serial` the request was
    /// authenticated with, recording that serial as the new certificate's `renewedFrom`.
    /// Revoking `serial` later revokes the new certificate too ([`Security::revoke_serial`]);
    /// a revocation of `serial` that lands while this runs revokes the new certificate here
    /// (the record is written before the check, and a revocation marks the serial before it
    /// looks for renewals, so one of the two sees the other).
    pub(crate) async fn renew(
        &self,
        csr: &ParsedCsr,
        role: &CertRole,
        by: &Identity,
        serial: &str,
    ) -> SecResult<Issued> {
        let issued = self
            .issue(csr, role, None, "renew", Some(by), Some(serial))
            .await?;
        if self.is_revoked(serial) {
            self.revoke_one(
                &issued.info.serial,
                &format!("renewed from {serial}, which was revoked during the renewal"),
                by,
            )
            .await?;
            return Err(SecurityError::unauthorized(format!(
                "client certificate {serial} has been revoked"
            )));
        }
        Ok(issued)
    }

    /// All issued certificates, by serial.
    pub(crate) async fn certificates(&self) -> SecResult<Vec<CertificateRecord>> {
        let mut records = self.list::<CertificateRecord>(CERTIFICATES).await?;
        let revoked = self
            .revoked
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for record in &mut records {
            if record.revoked_at.is_none() && revoked.contains(&record.serial) {
                record.revoked_at = Some(String::from("(revoked)"));
            }
        }
        Ok(records)
    }

    /// All bearer tokens (users' and tasks'), revoked ones included.
    pub(crate) async fn bearer_tokens(&self) -> SecResult<Vec<BearerTokenRecord>> {
        self.list(BEARER_TOKENS).await
    }

    /// All bootstrap (join) tokens, expired and used ones included.
    pub(crate) async fn bootstrap_tokens(&self) -> SecResult<Vec<BootstrapTokenRecord>> {
        self.list(BOOTSTRAP_TOKENS).await
    }

    /// All revocations.
    pub(crate) async fn revocations(&self) -> SecResult<Vec<RevocationRecord>> {
        self.list(REVOCATIONS).await
    }
}
