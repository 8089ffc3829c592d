//! The installation's PKI: one CA, serving certificates, role client certificates, kubeconfigs.
//!
//! Certificates follow Kubernetes conventions: the subject CN is the user name and each `O`
//! attribute is a group. Keys are ECDSA P-256. Every file this crate writes is mode 0600 and
//! is written atomically (temporary file + rename), so a reader never sees half a file.
// The zero-unwrap discipline as a rule: product code turns a failure into an error that
// names what failed, never a panic (tests, built with cfg(test), may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod certinfo;
mod csr;
mod der;
mod files;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod kubeconfig;
pub mod ssh;
mod token;
mod verify;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};

pub use certinfo::{CertInfo, normalize_serial, serial_hex};
pub use csr::{
    CsrError, KeyAndCsr, KeyType, MAX_CSR_BYTES, ParsedCsr, csr_for_key, generate_key_and_csr,
    parse_csr,
};
pub use files::{create_private_dir, write_private_file, write_public_file};
pub use kubeconfig::kubeconfig_yaml;
pub use token::{BEARER_PREFIX, MAX_TOKEN_LEN, Token, TokenError, TokenKind, constant_time_eq};
pub use verify::{BadPin, IdentityCheck, ServerVerifier};

/// Subject CN of the installation CA.
pub const CA_COMMON_NAME: &str = "rlark-ca";
/// Lifetime of a newly created CA.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// File name of the CA certificate inside the PKI directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the PKI directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// How far `notBefore` is back-dated at most, to tolerate clock skew between hosts. Short
/// certificates are back-dated by a tenth of their validity instead, so that "renew at 2/3
/// of the lifetime" stays in the future for them.
const MAX_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Directory (inside the PKI directory) of CA certificates that are still trusted but no
/// longer sign: the previous CA during a rotation.
pub const TRUSTED_DIR: &str = "trusted";
/// File name of the active CA's certificate cross-signed by the previous CA (present during
/// a rotation; sent in the serving chain so clients that trust only the old CA still
/// verify the server).
pub const CA_CROSS_FILE: &str = "ca-cross.crt";
/// Subject CN of serving certificates.
const SERVING_COMMON_NAME: &str = "rlark-server";

/// Errors of PKI operations, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "CA in {dir} is incomplete: {present} exists but {missing} does not \
         (restore it, or remove both files to create a new CA)"
    )]
    IncompleteCa {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    #[error("parse certificate {what}: {reason}")]
    ParseCertificate { what: String, reason: String },
    #[error("parse private key {what}: {reason}")]
    ParseKey { what: String, reason: String },
    #[error("private key {key} does not belong to certificate {cert}")]
    KeyMismatch { cert: PathBuf, key: PathBuf },
    #[error("invalid subject alternative name {name:?}: {reason}")]
    InvalidSan { name: String, reason: String },
    #[error("invalid certificate subject: {0}")]
    InvalidSubject(String),
    #[error("generate key: {0}")]
    GenerateKey(rcgen::Error),
    #[error("sign certificate: {0}")]
    Sign(String),
    #[error("certificate has no subject common name")]
    MissingCommonName,
    #[error("certificate not accepted: {0}")]
    Verify(String),
    #[error("CA rotation: {0}")]
    Rotation(String),
}

/// Result alias of this crate.
pub type Result<T, E = PkiError> = std::result::Result<T, E>;

/// A certificate and its private key, both PEM.
#[derive(Clone)]
pub struct IssuedCert {
    /// The certificate (one PEM block).
    pub cert_pem: String,
    /// The PKCS#8 private key (one PEM block). Secret.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The installation certificate authority.
///
/// Created once per installation by [`Ca::load_or_create`]; reloading the same directory
/// gives the same certificate (and so the same [`Ca::cert_hash`]).
pub struct Ca {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// Previous CAs still trusted for client certificates (rotation in progress).
    previous: Vec<CertificateDer<'static>>,
    /// The active CA cross-signed by the previous one, if a rotation is in progress.
    cross: Option<CertificateDer<'static>>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Load the CA from `dir/ca.crt` + `dir/ca.key`, or create both (ECDSA P-256, CN
    /// `rlark-ca`, valid 10 years) when neither exists. `dir` is created with mode 0700 when
    /// missing; the files are written with mode 0600.
    ///
    /// Fails with [`PkiError::IncompleteCa`] when only one of the two files exists (a new CA
    /// would silently invalidate every certificate issued so far), and with
    /// [`PkiError::KeyMismatch`] when the key does not belong to the certificate.
    pub fn load_or_create(dir: &Path) -> Result<Ca> {
        create_private_dir(dir)?;
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let mut ca = match (cert_path.exists(), key_path.exists()) {
            (true, true) => Self::load(&cert_path, &key_path)?,
            (false, false) => Self::create(&cert_path, &key_path, CA_COMMON_NAME)?,
            (true, false) => {
                return Err(PkiError::IncompleteCa {
                    dir: dir.to_path_buf(),
                    present: CA_CERT_FILE,
                    missing: CA_KEY_FILE,
                });
            }
            (false, true) => {
                return Err(PkiError::IncompleteCa {
                    dir: dir.to_path_buf(),
                    present: CA_KEY_FILE,
                    missing: CA_CERT_FILE,
                });
            }
        };
        ca.previous = load_previous(dir)?;
        let cross_path = dir.join(CA_CROSS_FILE);
        if cross_path.exists() {
            let pem = files::read_to_string(&cross_path)?;
            ca.cross = Some(parse_pem_cert(&pem, &cross_path.display().to_string())?);
        }
        Ok(ca)
    }

    fn load(cert_path: &Path, key_path: &Path) -> Result<Ca> {
        let cert_pem = files::read_to_string(cert_path)?;
        let key_pem = files::read_to_string(key_path)?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
            PkiError::ParseCertificate {
                what: cert_path.display().to_string(),
                reason: e.to_string(),
            }
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::ParseKey {
            what: key_path.display().to_string(),
            reason: e.to_string(),
        })?;
        if spki_of(&cert_der, &cert_path.display().to_string())?
            != rcgen::PublicKeyData::subject_public_key_info(&key)
        {
            return Err(PkiError::KeyMismatch {
                cert: cert_path.to_path_buf(),
                key: key_path.to_path_buf(),
            });
        }
        let issuer =
            Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| PkiError::ParseCertificate {
                what: cert_path.display().to_string(),
                reason: e.to_string(),
            })?;
        tracing::debug!(path = %cert_path.display(), "loaded CA");
        Ok(Ca {
            cert_pem,
            cert_der,
            issuer,
            previous: Vec::new(),
            cross: None,
        })
    }

    fn ca_params(common_name: &str) -> CertificateParams {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, CA_VALIDITY);
        params.serial_number = Some(random_serial());
        params
    }

    fn create(cert_path: &Path, key_path: &Path, common_name: &str) -> Result<Ca> {
        let key = KeyPair::generate().map_err(PkiError::GenerateKey)?;
        let params = Self::ca_params(common_name);
        let cert = params
            .self_signed(&key)
            .map_err(|e| PkiError::Sign(e.to_string()))?;
        let cert_pem = cert.pem();
        // Key first: a crash between the two writes leaves an incomplete CA that is
        // reported, never a certificate whose key is lost.
        write_private_file(key_path, key.serialize_pem().as_bytes())?;
        write_private_file(cert_path, cert_pem.as_bytes())?;
        tracing::info!(path = %cert_path.display(), "created installation CA");
        Ok(Ca {
            cert_pem,
            cert_der: cert.der().clone(),
            issuer: Issuer::new(params, key),
            previous: Vec::new(),
            cross: None,
        })
    }

    /// Every CA certificate clients should trust, active first: the active CA and, during a
    /// rotation, the previous one. Client certificates issued by any of them are accepted.
    pub fn trust_anchors(&self) -> Vec<CertificateDer<'static>> {
        let mut anchors = vec![self.cert_der.clone()];
        anchors.extend(self.previous.iter().cloned());
        anchors
    }

    /// [`Ca::trust_anchors`] as one PEM bundle: what kubeconfigs and joined agents get as
    /// `certificate-authority-data`.
    pub fn bundle_pem(&self) -> String {
        self.trust_anchors()
            .iter()
            .map(|der| pem_encode("CERTIFICATE", der.as_ref()))
            .collect()
    }

    /// Certificates to send after the serving certificate: the active CA itself (so a
    /// joining agent can check it against its pinned hash) and, during a rotation, the
    /// cross-signed active CA (so clients that trust only the previous CA still verify).
    pub fn serving_chain_tail(&self) -> Vec<CertificateDer<'static>> {
        let mut chain = vec![self.cert_der.clone()];
        chain.extend(self.cross.iter().cloned());
        chain
    }

    /// Whether a rotation is in progress (a previous CA is still trusted).
    pub fn rotation_in_progress(&self) -> bool {
        !self.previous.is_empty()
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        self.cert_der.as_ref()
    }

    /// `sha256:<hex>` of the CA's SubjectPublicKeyInfo (see [`ca_cert_hash`]).
    pub fn cert_hash(&self) -> Result<String> {
        ca_cert_hash(self.cert_der())
    }

    /// Issue a TLS serving certificate (EKU serverAuth) for `sans`: each entry that parses
    /// as an IP address becomes an IP SAN, every other entry a DNS SAN. Duplicates are
    /// dropped. Fails with [`PkiError::InvalidSan`] on an entry that is neither.
    pub fn issue_serving(&self, sans: &[String], validity: Duration) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        for san in sans {
            let san = parse_san(san)?;
            if !params.subject_alt_names.contains(&san) {
                params.subject_alt_names.push(san);
            }
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue_leaf(params, SERVING_COMMON_NAME, &[], validity)
    }

    /// Issue a client certificate (EKU clientAuth) with subject CN = `common_name` (the user)
    /// and one `O` attribute per entry of `groups`, in order.
    pub fn issue_client(
        &self,
        common_name: &str,
        groups: &[String],
        validity: Duration,
    ) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue_leaf(params, common_name, groups, validity)
    }

    /// Reuse the client certificate at `cert_path`/`key_path` when it was issued by this CA,
    /// names exactly `common_name` and `groups`, and stays valid for at least another day;
    /// otherwise issue a new one (as [`Ca::issue_client`]) and write both files (mode 0600).
    pub fn load_or_issue_client(
        &self,
        cert_path: &Path,
        key_path: &Path,
        common_name: &str,
        groups: &[String],
        validity: Duration,
    ) -> Result<IssuedCert> {
        if cert_path.exists() && key_path.exists() {
            match self.check_existing_client(cert_path, key_path, common_name, groups) {
                Ok(issued) => return Ok(issued),
                Err(reason) => tracing::warn!(
                    path = %cert_path.display(),
                    %reason,
                    "existing client certificate not reusable; issuing a new one"
                ),
            }
        }
        let issued = self.issue_client(common_name, groups, validity)?;
        write_private_file(key_path, issued.key_pem.as_bytes())?;
        write_private_file(cert_path, issued.cert_pem.as_bytes())?;
        tracing::info!(path = %cert_path.display(), user = common_name, "issued client certificate");
        Ok(issued)
    }

    fn check_existing_client(
        &self,
        cert_path: &Path,
        key_path: &Path,
        common_name: &str,
        groups: &[String],
    ) -> Result<IssuedCert> {
        let cert_pem = files::read_to_string(cert_path)?;
        let key_pem = files::read_to_string(key_path)?;
        let what = cert_path.display().to_string();
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|e| {
            PkiError::ParseCertificate {
                what: what.clone(),
                reason: e.to_string(),
            }
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| PkiError::ParseKey {
            what: key_path.display().to_string(),
            reason: e.to_string(),
        })?;
        if spki_of(&der, &what)? != rcgen::PublicKeyData::subject_public_key_info(&key) {
            return Err(PkiError::KeyMismatch {
                cert: cert_path.to_path_buf(),
                key: key_path.to_path_buf(),
            });
        }
        let (user, cert_groups) = identity_from_cert_der(&der)?;
        if user != common_name || cert_groups != groups {
            return Err(PkiError::Verify(format!(
                "names {user:?} {cert_groups:?}, wanted {common_name:?} {groups:?}"
            )));
        }
        let a_day_later = SystemTime::now() + Duration::from_secs(24 * 3600);
        self.verify_client_cert_at(&der, a_day_later)?;
        Ok(IssuedCert { cert_pem, key_pem })
    }

    /// Check that `cert_der` is a client certificate issued by this CA and valid now.
    pub fn verify_client_cert(&self, cert_der: &[u8]) -> Result<()> {
        self.verify_client_cert_at(cert_der, SystemTime::now())
    }

    fn verify_client_cert_at(&self, cert_der: &[u8], at: SystemTime) -> Result<()> {
        let mut roots = rustls::RootCertStore::empty();
        for anchor in self.trust_anchors() {
            roots
                .add(anchor)
                .map_err(|e| PkiError::Verify(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| PkiError::Verify(e.to_string()))?;
        let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
        verifier
            .verify_client_cert(
                &CertificateDer::from(cert_der),
                &[],
                UnixTime::since_unix_epoch(since_epoch),
            )
            .map_err(|e| PkiError::Verify(e.to_string()))?;
        Ok(())
    }

    fn issue_leaf(
        &self,
        mut params: CertificateParams,
        common_name: &str,
        organizations: &[String],
        validity: Duration,
    ) -> Result<IssuedCert> {
        if common_name.is_empty() {
            return Err(PkiError::InvalidSubject("empty common name".to_string()));
        }
        if organizations.iter().any(String::is_empty) {
            return Err(PkiError::InvalidSubject("empty group name".to_string()));
        }
        let key = KeyPair::generate().map_err(PkiError::GenerateKey)?;
        let cert_der = self.sign_leaf(&mut params, &key, common_name, organizations, validity)?;
        Ok(IssuedCert {
            cert_pem: pem_encode("CERTIFICATE", &cert_der),
            key_pem: key.serialize_pem(),
        })
    }

    /// Sign a leaf for `public_key` with subject CN = `common_name`, one O per entry of
    /// `organizations`; returns the DER certificate.
    fn sign_leaf(
        &self,
        params: &mut CertificateParams,
        public_key: &impl rcgen::PublicKeyData,
        common_name: &str,
        organizations: &[String],
        validity: Duration,
    ) -> Result<Vec<u8>> {
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(random_serial());
        set_validity(params, validity);
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(|e| PkiError::Sign(e.to_string()))?;
        let subject = der::encode_name(common_name, organizations);
        der::replace_subject(cert.der(), &subject, self.issuer.key())
    }

    /// Issue a client certificate (EKU clientAuth) for the key of a verified CSR (see
    /// [`parse_csr`]), with subject CN = `common_name` and one O per group. The CSR's own
    /// subject is ignored. Returns the certificate PEM and what it says.
    pub fn sign_client_csr(
        &self,
        csr: &ParsedCsr,
        common_name: &str,
        groups: &[String],
        validity: Duration,
    ) -> Result<(String, CertInfo)> {
        if common_name.is_empty() {
            return Err(PkiError::InvalidSubject("empty common name".to_string()));
        }
        if groups.iter().any(String::is_empty) {
            return Err(PkiError::InvalidSubject("empty group name".to_string()));
        }
        let public_key = rcgen::SubjectPublicKeyInfo::from_der(&csr.spki_der)
            .map_err(|e| PkiError::Sign(format!("CSR public key: {e}")))?;
        let mut params = CertificateParams::default();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let der = self.sign_leaf(&mut params, &public_key, common_name, groups, validity)?;
        let info = CertInfo::from_der(&der)?;
        Ok((pem_encode("CERTIFICATE", &der), info))
    }
}

/// The crypto provider of every rlark TLS endpoint: ring, with TLS 1.3 AES-128-GCM
/// preferred. AES-128-GCM is as strong as the rest of the installation's ECDSA P-256 keys
/// and about a third cheaper per byte than AES-256-GCM, which matters for the agent tunnel
/// (`rlark bench tunnel`). The other suites stay available for clients that want them.
pub fn tls_provider() -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    let preferred = rustls::CipherSuite::TLS13_AES_128_GCM_SHA256;
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != preferred);
    provider
}

/// Check that `name` can be a subject alternative name: an IP address, or a DNS name made
/// of letters, digits, `-` and `.` (a leading `*.` wildcard label is allowed).
pub fn validate_san(name: &str) -> Result<()> {
    parse_san(name).map(|_| ())
}

fn parse_san(name: &str) -> Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let invalid = |reason: &str| PkiError::InvalidSan {
        name: name.to_string(),
        reason: reason.to_string(),
    };
    if name.is_empty() || name.len() > 253 {
        return Err(invalid("must be 1 to 253 characters"));
    }
    let host = name.strip_prefix("*.").unwrap_or(name);
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(invalid("each DNS label must be 1 to 63 characters"));
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(invalid(
                "not an IP address, and a DNS name may only hold letters, digits, '-' and '.'",
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(invalid("a DNS label may not start or end with '-'"));
        }
    }
    let dns = name
        .to_string()
        .try_into()
        .map_err(|e: rcgen::Error| invalid(&e.to_string()))?;
    Ok(SanType::DnsName(dns))
}

/// The identity a client certificate carries: `(CN, [O...])`, i.e. (user, groups).
///
/// Fails when `cert_der` is not a certificate or has no CN. Does not verify the chain; only
/// call it on certificates the TLS layer has already verified.
pub fn identity_from_cert_der(cert_der: &[u8]) -> Result<(String, Vec<String>)> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::ParseCertificate {
            what: "client certificate".to_string(),
            reason: e.to_string(),
        })?;
    let subject = cert.subject();
    let attr_str = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str()
            .map(str::to_string)
            .map_err(|e| PkiError::ParseCertificate {
                what: "client certificate subject".to_string(),
                reason: e.to_string(),
            })
    };
    let user = match subject.iter_common_name().next() {
        Some(cn) => attr_str(cn)?,
        None => return Err(PkiError::MissingCommonName),
    };
    let groups = subject
        .iter_organization()
        .map(attr_str)
        .collect::<Result<Vec<_>>>()?;
    Ok((user, groups))
}

/// `"sha256:" + hex(SHA-256(SubjectPublicKeyInfo DER))` of a CA certificate: exactly the
/// value kubeadm takes as `--discovery-token-ca-cert-hash`.
pub fn ca_cert_hash(ca_cert_der: &[u8]) -> Result<String> {
    let spki = spki_of(ca_cert_der, "CA certificate")?;
    Ok(format!("sha256:{}", hex::encode(Sha256::digest(&spki))))
}

fn spki_of(cert_der: &[u8], what: &str) -> Result<Vec<u8>> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::ParseCertificate {
            what: what.to_string(),
            reason: e.to_string(),
        })?;
    Ok(cert.tbs_certificate.subject_pki.raw.to_vec())
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    // A clock before 1970 is treated as 1970; certificates are then merely back-dated.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
    params.not_before = now - MAX_BACKDATE.min(validity / 10);
    params.not_after = now + validity;
}

fn parse_pem_cert(pem: &str, what: &str) -> Result<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::ParseCertificate {
        what: what.to_string(),
        reason: e.to_string(),
    })
}

/// The previous CA certificates in `dir/trusted/*.crt`, in file-name order.
fn load_previous(dir: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let trusted = dir.join(TRUSTED_DIR);
    if !trusted.exists() {
        return Ok(Vec::new());
    }
    let read_err = |source| PkiError::Read {
        path: trusted.clone(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&trusted)
        .map_err(read_err)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|ext| ext == "crt"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| parse_pem_cert(&files::read_to_string(path)?, &path.display().to_string()))
        .collect()
}

/// What [`rotate_ca`] did.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// `sha256:` pin of the CA that signed until now (still trusted).
    pub previous_hash: String,
    /// `sha256:` pin of the new active CA.
    pub active_hash: String,
}

/// Start a CA rotation in the PKI directory `dir` (the server must be restarted to use it):
/// a new CA becomes the signer; the current one moves to `trusted/` and stays trusted for
/// client certificates; the new CA is cross-signed by the old one (`ca-cross.crt`) so that
/// clients that only know the old CA still verify the server. Fails when a rotation is
/// already in progress (retire the previous CA first).
pub fn rotate_ca(dir: &Path) -> Result<Rotation> {
    let old = Ca::load_or_create(dir)?;
    if old.rotation_in_progress() {
        return Err(PkiError::Rotation(
            "a rotation is already in progress; run `rlark ca retire` first".to_string(),
        ));
    }
    let old_info = CertInfo::from_der(old.cert_der())?;
    let trusted = dir.join(TRUSTED_DIR);
    create_private_dir(&trusted)?;
    write_private_file(
        &trusted.join(format!("ca-{}.crt", old_info.serial)),
        old.cert_pem.as_bytes(),
    )?;
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    // A distinct name per CA keeps certificate path building unambiguous.
    let common_name = format!("{CA_COMMON_NAME}-{since_epoch}");
    let key = KeyPair::generate().map_err(PkiError::GenerateKey)?;
    let params = Ca::ca_params(&common_name);
    let cert = params
        .self_signed(&key)
        .map_err(|e| PkiError::Sign(e.to_string()))?;
    let cross = params
        .signed_by(&key, &old.issuer)
        .map_err(|e| PkiError::Sign(e.to_string()))?;
    write_private_file(&dir.join(CA_CROSS_FILE), cross.pem().as_bytes())?;
    // The key and the certificate are each replaced atomically; a crash between the two is
    // reported at the next start as a key mismatch (restore from `trusted/`).
    write_private_file(&dir.join(CA_KEY_FILE), key.serialize_pem().as_bytes())?;
    write_private_file(&dir.join(CA_CERT_FILE), cert.pem().as_bytes())?;
    tracing::info!(dir = %dir.display(), ca = %common_name, "CA rotated; previous CA still trusted");
    Ok(Rotation {
        previous_hash: old.cert_hash()?,
        active_hash: ca_cert_hash(cert.der())?,
    })
}

/// Finish a CA rotation: stop trusting the previous CA(s). Certificates they issued stop
/// working at the next server start. Returns the pins of the retired CAs (empty when no
/// rotation was in progress).
pub fn retire_previous_cas(dir: &Path) -> Result<Vec<String>> {
    let previous = load_previous(dir)?;
    let mut retired = Vec::new();
    for der in &previous {
        retired.push(ca_cert_hash(der.as_ref())?);
    }
    let remove = |path: PathBuf| -> Result<()> {
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(PkiError::Write { path, source }),
        }
    };
    remove(dir.join(CA_CROSS_FILE))?;
    let trusted = dir.join(TRUSTED_DIR);
    if trusted.exists() {
        for entry in std::fs::read_dir(&trusted).map_err(|source| PkiError::Read {
            path: trusted.clone(),
            source,
        })? {
            let path = entry
                .map_err(|source| PkiError::Read {
                    path: trusted.clone(),
                    source,
                })?
                .path();
            if path.extension().is_some_and(|ext| ext == "crt") {
                remove(path)?;
            }
        }
    }
    Ok(retired)
}

fn random_serial() -> SerialNumber {
    let mut bytes = uuid::Uuid::new_v4().into_bytes().to_vec();
    // Positive and without a leading zero byte: keeps the DER INTEGER at 16 bytes.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    SerialNumber::from_slice(&bytes)
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests;
