//! What a certificate says about itself, for listings, audit records and renewal timing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{PkiError, Result};

/// Facts read from a certificate (not verified: call on certificates from a trusted source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Serial number, lowercase hex without leading zeros (`openssl x509 -serial` prints the
    /// same digits in upper case, zero-padded).
    pub serial: String,
    /// Subject CN (the user).
    pub common_name: String,
    /// Subject O attributes (the groups), in order.
    pub groups: Vec<String>,
    /// Issuer CN (which CA).
    pub issuer: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// `sha256:<hex>` of the SubjectPublicKeyInfo.
    pub key_hash: String,
}

impl CertInfo {
    /// Read a DER certificate.
    pub fn from_der(der: &[u8]) -> Result<CertInfo> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::ParseCertificate {
                what: "certificate".to_string(),
                reason: e.to_string(),
            })?;
        let (common_name, groups) = crate::identity_from_cert_der(der)?;
        let issuer = cert
            .issuer()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .unwrap_or_default()
            .to_string();
        let time = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs < 0 {
                UNIX_EPOCH
            } else {
                UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
            }
        };
        use sha2::Digest as _;
        Ok(CertInfo {
            serial: serial_hex(cert.raw_serial()),
            common_name,
            groups,
            issuer,
            not_before: time(cert.validity().not_before),
            not_after: time(cert.validity().not_after),
            key_hash: format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(cert.tbs_certificate.subject_pki.raw))
            ),
        })
    }

    /// Read the first certificate of a PEM string.
    pub fn from_pem(pem: &str) -> Result<CertInfo> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| {
            PkiError::ParseCertificate {
                what: "certificate PEM".to_string(),
                reason: e.to_string(),
            }
        })?;
        Self::from_der(der.as_ref())
    }

    /// When a holder should renew: at 2/3 of the lifetime (`not_before` + 2/3 ×
    /// (`not_after` − `not_before`)).
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + lifetime * 2 / 3
    }
}

/// Lowercase hex of a DER INTEGER's bytes without leading zeros (at least one digit).
pub fn serial_hex(raw: &[u8]) -> String {
    let hex = hex::encode(raw);
    let trimmed = hex.trim_start_matches('0');
    if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed.to_string()
    }
}

/// Normalize a serial typed by a human (`0A:1B`, `0x0a1b`, `A1B`) to [`CertInfo::serial`]'s
/// form. `None` when it is not hex.
pub fn normalize_serial(input: &str) -> Option<String> {
    let s = input.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    let digits: String = s.chars().filter(|c| *c != ':').collect();
    if digits.is_empty() || digits.len() > 64 || !digits.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = digits.trim_start_matches('0').to_ascii_lowercase();
    Some(if trimmed.is_empty() {
        "0".to_string()
    } else {
        trimmed
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_normalize() {
        assert_eq!(serial_hex(&[0, 0x0a, 0x1b]), "a1b");
        assert_eq!(serial_hex(&[0]), "0");
        assert_eq!(normalize_serial("0A:1B").as_deref(), Some("a1b"));
        assert_eq!(normalize_serial("0x0a1b").as_deref(), Some("a1b"));
        assert_eq!(normalize_serial("zz"), None);
        assert_eq!(normalize_serial(""), None);
    }
}
