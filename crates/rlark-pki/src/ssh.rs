//! OpenSSH user certificates signed by the installation's SSH CA.
//!
//! The installation signs certificates for two roles (see [`SshCertRole`]):
//!
//! - `domain` — a member of a cross-cluster pod network ("domain"). Agents use it to open
//!   forwarded connections through the server's SSH endpoint. Principal
//!   `domain:<domain>@<cluster_id>`, extension `permit-port-forwarding` only (no pty).
//! - `ssh-guest` — a user's SSH access to running tasks. Principal `<user>`, extensions
//!   `permit-pty` and `permit-port-forwarding`.
//!
//! Unlike RLark (principal `client` for everything, metadata in one JSON extension) the role
//! and its names are explicit: in the principal, the key id (`rlark:<role>:<name>`) and in
//! `*@rlark.io` extensions, which [`verify_ssh_cert`] parses back and cross-checks.
//!
//! Keys and certificates use `russh::keys::ssh_key` (russh pins a prerelease of `ssh-key`; the
//! re-export keeps the versions in step with the SSH server).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use russh::keys::ssh_key::certificate::{Builder, CertType};
use russh::keys::ssh_key::public::KeyData;
use russh::keys::ssh_key::rand_core::Rng;
use russh::keys::ssh_key::{
    Algorithm, Certificate, Fingerprint, HashAlg, LineEnding, PrivateKey, PublicKey,
};

use crate::{PkiError, create_private_dir, write_private_file};

/// File name of the SSH CA private key (OpenSSH private key format, unencrypted, mode 0600).
pub const SSH_CA_KEY_FILE: &str = "ssh_ca";
/// File name of the SSH CA public key (one OpenSSH public key line).
pub const SSH_CA_PUB_FILE: &str = "ssh_ca.pub";
/// Comment of the SSH CA key.
pub const SSH_CA_COMMENT: &str = "rlark-ssh-ca";
/// Largest public key or certificate text accepted, in bytes.
pub const MAX_SSH_INPUT: usize = 16 * 1024;
/// Smallest RSA modulus accepted for a subject key, in bits.
pub const MIN_RSA_BITS: u32 = 2048;

/// Extension naming the role: `domain` or `ssh-guest`.
pub const EXT_ROLE: &str = "role@rlark.io";
/// Extension carrying the domain name (role `domain`).
pub const EXT_DOMAIN: &str = "domain@rlark.io";
/// Extension carrying the cluster id (role `domain`).
pub const EXT_CLUSTER: &str = "cluster@rlark.io";
/// Extension carrying the user name (role `ssh-guest`).
pub const EXT_USER: &str = "user@rlark.io";
/// OpenSSH extension allowing port forwarding.
pub const EXT_PERMIT_PORT_FORWARDING: &str = "permit-port-forwarding";
/// OpenSSH extension allowing a pty.
pub const EXT_PERMIT_PTY: &str = "permit-pty";

/// Role name of [`SshCertRole::Domain`].
pub const ROLE_DOMAIN: &str = "domain";
/// Role name of [`SshCertRole::Guest`].
pub const ROLE_GUEST: &str = "ssh-guest";

/// How far `valid_after` is back-dated at most, to tolerate clock skew between hosts.
const MAX_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Subject key types accepted by [`SshCa::sign`], as they appear in the OpenSSH line.
const ACCEPTED_KEY_TYPES: [&str; 3] = ["ssh-ed25519", "ecdsa-sha2-nistp256", "ssh-rsa"];

/// Errors of SSH CA operations, named by the failed step.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// Reading or parsing a stored CA file failed.
    #[error("load SSH CA {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    /// Only one of `ssh_ca` / `ssh_ca.pub` exists.
    #[error(
        "SSH CA in {dir} is incomplete: {present} exists but {missing} does not \
         (restore it, or remove both files to create a new SSH CA)"
    )]
    IncompleteCa {
        dir: PathBuf,
        present: &'static str,
        missing: &'static str,
    },
    /// The stored private key does not belong to the stored public key.
    #[error("SSH CA private key {key} does not match public key {public}")]
    KeyMismatch { key: PathBuf, public: PathBuf },
    /// Creating the directory or writing a CA file failed.
    #[error("store SSH CA: {0}")]
    Store(#[source] PkiError),
    /// Generating the CA key failed.
    #[error("generate SSH CA key: {0}")]
    Generate(String),
    /// The subject's public key was rejected.
    #[error("parse SSH public key: {0}")]
    ParsePublicKey(String),
    /// The certificate text could not be parsed.
    #[error("parse SSH certificate: {0}")]
    ParseCertificate(String),
    /// Building or signing the certificate failed.
    #[error("sign SSH certificate: {0}")]
    Sign(String),
    /// A name, validity or fingerprint given by the caller is invalid.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The certificate parsed but is not acceptable (CA, time, type, contents).
    #[error("SSH certificate not accepted: {0}")]
    Verify(String),
}

/// What an SSH certificate lets its holder do, and as whom.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SshCertRole {
    /// A member of domain `domain` in cluster `cluster_id` (both DNS-1123 labels).
    Domain { domain: String, cluster_id: String },
    /// A user's SSH access to running tasks (`user`: 1..=253 chars, no whitespace, `:` or
    /// control characters).
    Guest { user: String },
}

impl SshCertRole {
    /// The role name: `domain` or `ssh-guest` (the value of the `role@rlark.io` extension).
    pub fn role_name(&self) -> &'static str {
        match self {
            SshCertRole::Domain { .. } => ROLE_DOMAIN,
            SshCertRole::Guest { .. } => ROLE_GUEST,
        }
    }

    /// The one principal of a certificate of this role: `domain:<domain>@<cluster_id>` or
    /// the user name.
    pub fn principal(&self) -> String {
        match self {
            SshCertRole::Domain { domain, cluster_id } => format!("domain:{domain}@{cluster_id}"),
            SshCertRole::Guest { user } => user.clone(),
        }
    }

    /// The key id of a certificate of this role: `rlark:<role>:<name>`, where name is
    /// `<domain>@<cluster_id>` or the user.
    pub fn key_id(&self) -> String {
        match self {
            SshCertRole::Domain { domain, cluster_id } => {
                format!("rlark:{ROLE_DOMAIN}:{domain}@{cluster_id}")
            }
            SshCertRole::Guest { user } => format!("rlark:{ROLE_GUEST}:{user}"),
        }
    }

    /// Check the names; the error says which one is wrong and why.
    pub fn validate(&self) -> Result<(), SshError> {
        match self {
            SshCertRole::Domain { domain, cluster_id } => {
                check_dns_label("domain", domain)?;
                check_dns_label("cluster id", cluster_id)
            }
            SshCertRole::Guest { user } => check_user(user),
        }
    }

    /// The extensions of a certificate of this role (name → value; flags have `""`).
    fn extensions(&self) -> Vec<(&'static str, String)> {
        match self {
            SshCertRole::Domain { domain, cluster_id } => vec![
                (EXT_PERMIT_PORT_FORWARDING, String::new()),
                (EXT_DOMAIN, domain.clone()),
                (EXT_CLUSTER, cluster_id.clone()),
                (EXT_ROLE, ROLE_DOMAIN.to_string()),
            ],
            SshCertRole::Guest { user } => vec![
                (EXT_PERMIT_PTY, String::new()),
                (EXT_PERMIT_PORT_FORWARDING, String::new()),
                (EXT_USER, user.clone()),
                (EXT_ROLE, ROLE_GUEST.to_string()),
            ],
        }
    }
}

/// A certificate issued by [`SshCa::sign`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedSshCert {
    /// One OpenSSH line without newline, e.g. `ssh-ed25519-cert-v01@openssh.com AAAA...`
    /// (the type follows the subject key), ready for `id_xxx-cert.pub`.
    pub certificate_openssh: String,
    /// Random serial number.
    pub serial: u64,
    /// `rlark:<role>:<name>`.
    pub key_id: String,
    /// The principals (exactly one).
    pub principals: Vec<String>,
    /// End of validity, unix seconds (exclusive, as in OpenSSH).
    pub valid_before: u64,
}

/// A certificate accepted by [`verify_ssh_cert`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSshCert {
    /// The role, parsed back from the extensions and cross-checked with the principal.
    pub role: SshCertRole,
    /// The principals (exactly one, equal to `role.principal()`).
    pub principals: Vec<String>,
    /// All extensions (name → value; flags have `""`).
    pub extensions: std::collections::BTreeMap<String, String>,
    /// The key id.
    pub key_id: String,
    /// The serial number.
    pub serial: u64,
    /// Start of validity, unix seconds (inclusive).
    pub valid_after: u64,
    /// End of validity, unix seconds (exclusive).
    pub valid_before: u64,
    /// The certified (subject) public key, one OpenSSH line without comment.
    pub subject_key_openssh: String,
    /// `SHA256:...` fingerprint of the CA that signed it.
    pub ca_fingerprint: String,
}

/// The installation's SSH user CA: an Ed25519 key.
///
/// Stored in a directory as [`SSH_CA_KEY_FILE`] (OpenSSH private key format, unencrypted,
/// mode 0600) and [`SSH_CA_PUB_FILE`] (`ssh-ed25519 AAAA... rlark-ssh-ca`). Reloading the
/// same directory gives the same key (and so the same [`SshCa::fingerprint`]).
pub struct SshCa {
    key: PrivateKey,
}

impl fmt::Debug for SshCa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshCa")
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl SshCa {
    /// Load the SSH CA from `dir/ssh_ca` + `dir/ssh_ca.pub`, or create both (a new Ed25519
    /// key, comment `rlark-ssh-ca`) when neither exists. `dir` is created with mode 0700 when
    /// missing; the files are written atomically with mode 0600, private key first.
    ///
    /// Fails with [`SshError::IncompleteCa`] when only one of the two files exists (a new CA
    /// would silently invalidate every certificate issued so far), with
    /// [`SshError::KeyMismatch`] when the private key does not belong to the `.pub` key, and
    /// with [`SshError::Load`] when a file cannot be read or parsed, or the key is encrypted
    /// or not Ed25519.
    pub fn load_or_create(dir: &Path) -> Result<SshCa, SshError> {
        create_private_dir(dir).map_err(SshError::Store)?;
        let key_path = dir.join(SSH_CA_KEY_FILE);
        let pub_path = dir.join(SSH_CA_PUB_FILE);
        match (key_path.exists(), pub_path.exists()) {
            (true, true) => Self::load(&key_path, &pub_path),
            (false, false) => Self::create(&key_path, &pub_path),
            (true, false) => Err(SshError::IncompleteCa {
                dir: dir.to_path_buf(),
                present: SSH_CA_KEY_FILE,
                missing: SSH_CA_PUB_FILE,
            }),
            (false, true) => Err(SshError::IncompleteCa {
                dir: dir.to_path_buf(),
                present: SSH_CA_PUB_FILE,
                missing: SSH_CA_KEY_FILE,
            }),
        }
    }

    fn load(key_path: &Path, pub_path: &Path) -> Result<SshCa, SshError> {
        let load_err = |path: &Path, reason: String| SshError::Load {
            path: path.to_path_buf(),
            reason,
        };
        let key_text =
            std::fs::read_to_string(key_path).map_err(|e| load_err(key_path, e.to_string()))?;
        let pub_text =
            std::fs::read_to_string(pub_path).map_err(|e| load_err(pub_path, e.to_string()))?;
        let key = PrivateKey::from_openssh(key_text.as_bytes())
            .map_err(|e| load_err(key_path, format!("not an OpenSSH private key: {e}")))?;
        if key.is_encrypted() {
            return Err(load_err(
                key_path,
                "the key is encrypted (a passphrase is not supported)".into(),
            ));
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(load_err(
                key_path,
                format!("expected an ssh-ed25519 key, found {}", key.algorithm()),
            ));
        }
        let public = PublicKey::from_openssh(pub_text.trim())
            .map_err(|e| load_err(pub_path, format!("not an OpenSSH public key line: {e}")))?;
        if public.key_data() != key.public_key().key_data() {
            return Err(SshError::KeyMismatch {
                key: key_path.to_path_buf(),
                public: pub_path.to_path_buf(),
            });
        }
        let ca = SshCa { key };
        tracing::debug!(path = %key_path.display(), fingerprint = %ca.fingerprint(), "loaded SSH CA");
        Ok(ca)
    }

    fn create(key_path: &Path, pub_path: &Path) -> Result<SshCa, SshError> {
        let mut key = PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)
            .map_err(|e| SshError::Generate(e.to_string()))?;
        key.set_comment(SSH_CA_COMMENT);
        let key_text = key
            .to_openssh(LineEnding::LF)
            .map_err(|e| SshError::Generate(format!("encode private key: {e}")))?;
        let ca = SshCa { key };
        let pub_line = format!("{}\n", ca.public_key_openssh());
        // Key first: a crash between the two writes leaves an incomplete CA that is
        // reported, never a public key whose private key is lost.
        write_private_file(key_path, key_text.as_bytes()).map_err(SshError::Store)?;
        write_private_file(pub_path, pub_line.as_bytes()).map_err(SshError::Store)?;
        tracing::info!(path = %key_path.display(), fingerprint = %ca.fingerprint(), "created SSH CA");
        Ok(ca)
    }

    /// The CA public key as one OpenSSH line without newline:
    /// `ssh-ed25519 AAAA... rlark-ssh-ca` (the `TrustedUserCAKeys` / `cert-authority` form).
    #[allow(
        clippy::expect_used,
        reason = "encoding an in-memory Ed25519 key cannot fail"
    )]
    pub fn public_key_openssh(&self) -> String {
        let public = PublicKey::new(self.key.public_key().key_data().clone(), SSH_CA_COMMENT);
        // Encoding an in-memory Ed25519 key cannot fail.
        public
            .to_openssh()
            .expect("encode Ed25519 public key as OpenSSH")
    }

    /// The CA key's fingerprint, `SHA256:<base64 without padding>` (as `ssh-keygen -l`
    /// prints it). Pass it to [`verify_ssh_cert`].
    pub fn fingerprint(&self) -> String {
        self.key
            .public_key()
            .fingerprint(HashAlg::Sha256)
            .to_string()
    }

    /// Sign a USER certificate for `public_key_openssh` (one OpenSSH public key line:
    /// `ssh-ed25519`, `ecdsa-sha2-nistp256`, or `ssh-rsa` with at least 2048 bits; at most
    /// [`MAX_SSH_INPUT`] bytes; surrounding whitespace is ignored) with `role`.
    ///
    /// The certificate has a random nonce, a random serial, key id `rlark:<role>:<name>`,
    /// exactly one principal ([`SshCertRole::principal`]), no critical options, the role's
    /// extensions (see the module docs), and is valid from now − min(5 min, validity/10) to
    /// now + `validity` (at least one second).
    ///
    /// Fails with [`SshError::ParsePublicKey`] for a malformed or unsupported key and with
    /// [`SshError::InvalidInput`] for invalid role names or validity.
    pub fn sign(
        &self,
        public_key_openssh: &str,
        role: &SshCertRole,
        validity: Duration,
    ) -> Result<SignedSshCert, SshError> {
        role.validate()?;
        let subject = parse_subject_key(public_key_openssh)?;
        if validity.as_secs() == 0 {
            return Err(SshError::InvalidInput(format!(
                "certificate validity {validity:?} is shorter than one second"
            )));
        }
        let now = unix_now()?;
        let backdate = MAX_BACKDATE.min(validity / 10).as_secs();
        let valid_after = now.saturating_sub(backdate);
        let valid_before = now.checked_add(validity.as_secs()).ok_or_else(|| {
            SshError::InvalidInput(format!("certificate validity {validity:?} is too long"))
        })?;

        let mut rng = russh::keys::key::safe_rng();
        let serial = rng.next_u64();
        let key_id = role.key_id();
        let principal = role.principal();
        let sign_err = |e: russh::keys::ssh_key::Error| SshError::Sign(e.to_string());
        let mut builder = Builder::new_with_random_nonce(
            &mut rng,
            subject.key_data().clone(),
            valid_after,
            valid_before,
        )
        .map_err(sign_err)?;
        builder
            .serial(serial)
            .and_then(|b| b.cert_type(CertType::User))
            .and_then(|b| b.key_id(key_id.clone()))
            .and_then(|b| b.valid_principal(principal.clone()))
            .map_err(sign_err)?;
        for (name, value) in role.extensions() {
            builder.extension(name, value).map_err(sign_err)?;
        }
        let cert = builder.sign(&self.key).map_err(sign_err)?;
        let certificate_openssh = cert
            .to_openssh()
            .map_err(|e| SshError::Sign(format!("encode certificate: {e}")))?
            .trim_end()
            .to_string();
        tracing::debug!(%key_id, serial, valid_before, "signed SSH certificate");
        Ok(SignedSshCert {
            certificate_openssh,
            serial,
            key_id,
            principals: vec![principal],
            valid_before,
        })
    }
}

/// Verify an OpenSSH certificate line issued by [`SshCa::sign`] and parse its role back.
///
/// Accepts only when all hold: the text parses (at most [`MAX_SSH_INPUT`] bytes), the CA key's
/// SHA-256 fingerprint is one of `ca_fingerprints` (`SHA256:...` strings as from
/// [`SshCa::fingerprint`]), the CA signature is valid, `valid_after <= now_unix <
/// valid_before`, it is a USER certificate, it has no critical options, and its
/// `role@rlark.io` extension names a known role whose names are valid and whose principal is
/// the certificate's only principal.
///
/// This does not prove possession of the subject key; the SSH handshake does that.
/// Fails with [`SshError::InvalidInput`] for a malformed fingerprint,
/// [`SshError::ParseCertificate`] for unparsable text and [`SshError::Verify`] otherwise.
pub fn verify_ssh_cert(
    certificate_openssh: &str,
    ca_fingerprints: &[String],
    now_unix: u64,
) -> Result<VerifiedSshCert, SshError> {
    let trusted = ca_fingerprints
        .iter()
        .map(|s| {
            let fp = Fingerprint::from_str(s.trim()).map_err(|e| {
                SshError::InvalidInput(format!("CA fingerprint {s:?} is malformed: {e}"))
            })?;
            if fp.is_sha256() {
                Ok(fp)
            } else {
                Err(SshError::InvalidInput(format!(
                    "CA fingerprint {s:?} is not SHA256"
                )))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;

    let text = certificate_openssh.trim();
    if text.len() > MAX_SSH_INPUT {
        return Err(SshError::ParseCertificate(format!(
            "certificate is {} bytes, more than the limit of {MAX_SSH_INPUT}",
            text.len()
        )));
    }
    if text.is_empty() {
        return Err(SshError::ParseCertificate("certificate is empty".into()));
    }
    let cert = Certificate::from_openssh(text)
        .map_err(|e| SshError::ParseCertificate(format!("not an OpenSSH certificate line: {e}")))?;

    let ca_fp = cert.signature_key().fingerprint(HashAlg::Sha256);
    if !trusted.contains(&ca_fp) {
        return Err(SshError::Verify(format!("signed by untrusted CA {ca_fp}")));
    }
    if now_unix < cert.valid_after() {
        return Err(SshError::Verify(format!(
            "not valid before {} (now {now_unix})",
            cert.valid_after()
        )));
    }
    if now_unix >= cert.valid_before() {
        return Err(SshError::Verify(format!(
            "expired at {} (now {now_unix})",
            cert.valid_before()
        )));
    }
    // The authoritative check (signature, CA, time); the ones above only name the problem.
    cert.validate_at(now_unix, &trusted)
        .map_err(|_| SshError::Verify("the CA signature is invalid".into()))?;
    if !cert.cert_type().is_user() {
        return Err(SshError::Verify("not a user certificate".into()));
    }
    if let Some(name) = cert.critical_options().keys().next() {
        return Err(SshError::Verify(format!(
            "unrecognized critical option {name:?}"
        )));
    }

    let extensions: std::collections::BTreeMap<String, String> = cert.extensions().0.clone();
    let ext = |name: &str| {
        extensions
            .get(name)
            .cloned()
            .ok_or_else(|| SshError::Verify(format!("extension {name} is missing")))
    };
    let role = match ext(EXT_ROLE)?.as_str() {
        ROLE_DOMAIN => SshCertRole::Domain {
            domain: ext(EXT_DOMAIN)?,
            cluster_id: ext(EXT_CLUSTER)?,
        },
        ROLE_GUEST => SshCertRole::Guest {
            user: ext(EXT_USER)?,
        },
        other => {
            return Err(SshError::Verify(format!(
                "extension {EXT_ROLE} names unknown role {other:?}"
            )));
        }
    };
    role.validate()
        .map_err(|e| SshError::Verify(format!("certificate names: {e}")))?;
    let principals = cert.valid_principals().to_vec();
    if principals != [role.principal()] {
        return Err(SshError::Verify(format!(
            "principals {principals:?} do not match role {} (expected [{:?}])",
            role.role_name(),
            role.principal()
        )));
    }
    let subject_key_openssh = PublicKey::new(cert.public_key().clone(), "")
        .to_openssh()
        .map_err(|e| SshError::ParseCertificate(format!("encode subject key: {e}")))?
        .trim_end()
        .to_string();
    Ok(VerifiedSshCert {
        role,
        principals,
        extensions,
        key_id: cert.key_id().to_string(),
        serial: cert.serial(),
        valid_after: cert.valid_after(),
        valid_before: cert.valid_before(),
        subject_key_openssh,
        ca_fingerprint: ca_fp.to_string(),
    })
}

/// Parse and check a subject public key line (see [`SshCa::sign`]).
fn parse_subject_key(text: &str) -> Result<PublicKey, SshError> {
    let err = |m: String| SshError::ParsePublicKey(m);
    if text.len() > MAX_SSH_INPUT {
        return Err(err(format!(
            "public key is {} bytes, more than the limit of {MAX_SSH_INPUT}",
            text.len()
        )));
    }
    let text = text.trim();
    if text.is_empty() {
        return Err(err("public key is empty".into()));
    }
    if text.contains(['\n', '\r']) {
        return Err(err(
            "expected one OpenSSH public key line, found several lines".into(),
        ));
    }
    let key_type = text.split_ascii_whitespace().next().unwrap_or_default();
    if !ACCEPTED_KEY_TYPES.contains(&key_type) {
        let shown: String = key_type.chars().take(64).collect();
        return Err(err(format!(
            "unsupported key type {shown:?} (accepted: {})",
            ACCEPTED_KEY_TYPES.join(", ")
        )));
    }
    if text.split_ascii_whitespace().nth(1).is_none() {
        return Err(err(format!("{key_type} key has no base64 key data")));
    }
    let key = PublicKey::from_openssh(text).map_err(|e| match e {
        russh::keys::ssh_key::Error::AlgorithmUnknown => err(format!(
            "malformed {key_type} key: the key data is not a {key_type} key"
        )),
        e => err(format!("malformed {key_type} key: {e}")),
    })?;
    match key.key_data() {
        KeyData::Ed25519(_) => {}
        KeyData::Ecdsa(_) if key_type == "ecdsa-sha2-nistp256" => {}
        KeyData::Rsa(rsa) => {
            let bits = rsa_modulus_bits(rsa.n().as_positive_bytes().unwrap_or_default());
            if bits < MIN_RSA_BITS {
                return Err(err(format!(
                    "ssh-rsa key has {bits} bits, fewer than the minimum of {MIN_RSA_BITS}"
                )));
            }
        }
        _ => {
            return Err(err(format!(
                "unsupported key type {} (accepted: {})",
                key.algorithm(),
                ACCEPTED_KEY_TYPES.join(", ")
            )));
        }
    }
    Ok(key)
}

/// Exact bit length of a big-endian unsigned integer.
fn rsa_modulus_bits(bytes: &[u8]) -> u32 {
    let bytes = match bytes.iter().position(|b| *b != 0) {
        Some(i) => &bytes[i..],
        None => return 0,
    };
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX / 8);
    len * 8 - bytes[0].leading_zeros()
}

/// `name` must be a DNS-1123 label.
fn check_dns_label(what: &str, name: &str) -> Result<(), SshError> {
    let bad = |reason: &str| SshError::InvalidInput(format!("{what} {name:?} {reason}"));
    if name.is_empty() || name.len() > 63 {
        return Err(bad("must be 1 to 63 characters (a DNS-1123 label)"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(bad(
            "may contain only lowercase letters, digits and '-' (a DNS-1123 label)",
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(bad("must not start or end with '-' (a DNS-1123 label)"));
    }
    Ok(())
}

/// `user` must be 1..=253 characters without whitespace, ':' or control characters.
fn check_user(user: &str) -> Result<(), SshError> {
    let bad = |reason: &str| SshError::InvalidInput(format!("user {user:?} {reason}"));
    let len = user.chars().count();
    if len == 0 || len > 253 {
        return Err(bad("must be 1 to 253 characters"));
    }
    if let Some(c) = user
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == ':')
    {
        return Err(bad(&format!("must not contain {c:?}")));
    }
    Ok(())
}

fn unix_now() -> Result<u64, SshError> {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .map_err(|e| SshError::Sign(format!("system clock is before 1970: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const DAY: Duration = Duration::from_secs(24 * 3600);
    const RSA_2048: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC2s0wtgBSnphpPz8TCg5yxyp2KJ9oUtbgoU7lEUONzOpvSs60y9ceHdIXIXBblRYnt/ypWEm6Dg58+9jQtlO2h/rwSzfNumRIX50Xgw+DQLSjLZQ50f/yf2I5mcqscqXdk995M05gXzUlKs2fVpefUKQD8VJTB2Sr1rqlSBaBebl8uBHo/rh68MIw62krttS335LkT9oMw/pj1Tae1qPwEhW1OT0Xempn3YjB2dAbcYVXOzQbseZii8nIQU434fwv4I++sqCejES59hprRYcp0Ko6zbGKl1DW5GWHZeGZN+Kpf7m5wAvu06HNuoht0Tt5CLPGsp48kozoNp7LOaXvN rsa2048";
    const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQDgxfEnu25U6Wt5Ix3mgVJWTCl/RbNX3YFwy/Pz+80CAprrEcGSkmO9PaaGXdnKwtpjSnQEtpv731rpvjRad2aw7Sh6nxLNb7CpLAYe22qNJNEnhz3v7bOgJrQatk47pXY2haOh0SIBreEUUoNF3dr4uL9JnurPlbyVluSqVTbeCQ== rsa1024";
    const P384: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBLTaIA5XSJ0C+b1TCZ4RTiiFExqFUg1bfa6pIybXDn9bVckJp/QBbEbwjX8I5bWWDkbh57CzfOP4xC7Tlu6s4/W4tNNsPHcEr42l0g6XTU2MA6RfoqZIFjd2XXi2Ki5OBg== p384";

    fn subject_key(alg: Algorithm) -> String {
        PrivateKey::random(&mut russh::keys::key::safe_rng(), alg)
            .unwrap()
            .public_key()
            .to_openssh()
            .unwrap()
    }

    fn domain_role() -> SshCertRole {
        SshCertRole::Domain {
            domain: "pod-net-1".into(),
            cluster_id: "edge-7".into(),
        }
    }

    fn guest_role() -> SshCertRole {
        SshCertRole::Guest {
            user: "alice@example.com".into(),
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn now() -> u64 {
        unix_now().unwrap()
    }

    #[test]
    fn create_then_load_gives_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("pki");
        let created = SshCa::load_or_create(&ca_dir).unwrap();
        assert_eq!(mode(&ca_dir.join(SSH_CA_KEY_FILE)), 0o600);
        assert_eq!(mode(&ca_dir.join(SSH_CA_PUB_FILE)), 0o600);
        assert_eq!(mode(&ca_dir), 0o700);
        let pub_line = std::fs::read_to_string(ca_dir.join(SSH_CA_PUB_FILE)).unwrap();
        assert_eq!(pub_line, format!("{}\n", created.public_key_openssh()));
        assert!(pub_line.starts_with("ssh-ed25519 AAAA"), "{pub_line}");
        assert!(pub_line.trim_end().ends_with(" rlark-ssh-ca"), "{pub_line}");
        let key_text = std::fs::read_to_string(ca_dir.join(SSH_CA_KEY_FILE)).unwrap();
        assert!(key_text.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
        assert!(created.fingerprint().starts_with("SHA256:"));
        assert!(!format!("{created:?}").contains("PRIVATE"));

        let loaded = SshCa::load_or_create(&ca_dir).unwrap();
        assert_eq!(loaded.fingerprint(), created.fingerprint());
        assert_eq!(loaded.public_key_openssh(), created.public_key_openssh());
    }

    #[test]
    fn load_refuses_incomplete_or_mismatched_pair() {
        let dir = tempfile::tempdir().unwrap();
        SshCa::load_or_create(dir.path()).unwrap();
        let key = dir.path().join(SSH_CA_KEY_FILE);
        let public = dir.path().join(SSH_CA_PUB_FILE);
        let saved_pub = std::fs::read(&public).unwrap();

        std::fs::remove_file(&public).unwrap();
        let err = SshCa::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, SshError::IncompleteCa { .. }), "{err}");
        assert!(err.to_string().contains("ssh_ca.pub does not"), "{err}");
        assert!(!public.exists(), "must not recreate the missing half");

        std::fs::write(&public, &saved_pub).unwrap();
        std::fs::remove_file(&key).unwrap();
        let err = SshCa::load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("ssh_ca does not"), "{err}");

        // A key that does not belong to the .pub.
        let other = tempfile::tempdir().unwrap();
        SshCa::load_or_create(other.path()).unwrap();
        std::fs::copy(other.path().join(SSH_CA_KEY_FILE), &key).unwrap();
        let err = SshCa::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, SshError::KeyMismatch { .. }), "{err}");

        // Garbage in the key file names the file.
        std::fs::write(&key, "not a key").unwrap();
        let err = SshCa::load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, SshError::Load { .. }), "{err}");
        assert!(err.to_string().contains("ssh_ca"), "{err}");
    }

    #[test]
    fn sign_and_verify_domain() {
        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let role = domain_role();
        let signed = ca
            .sign(&subject_key(Algorithm::Ed25519), &role, DAY)
            .unwrap();
        assert!(
            signed
                .certificate_openssh
                .starts_with("ssh-ed25519-cert-v01@openssh.com AAAA"),
            "{}",
            signed.certificate_openssh
        );
        assert!(!signed.certificate_openssh.contains('\n'));
        assert_eq!(signed.key_id, "rlark:domain:pod-net-1@edge-7");
        assert_eq!(signed.principals, ["domain:pod-net-1@edge-7"]);
        let t = now();
        assert!(signed.valid_before >= t + DAY.as_secs() - 5);

        let v = verify_ssh_cert(&signed.certificate_openssh, &[ca.fingerprint()], t).unwrap();
        assert_eq!(v.role, role);
        assert_eq!(v.principals, signed.principals);
        assert_eq!(v.serial, signed.serial);
        assert_eq!(v.key_id, signed.key_id);
        assert_eq!(v.valid_before, signed.valid_before);
        assert_eq!(v.valid_before - v.valid_after, DAY.as_secs() + 300);
        assert_eq!(v.ca_fingerprint, ca.fingerprint());
        let ext: Vec<(&str, &str)> = v
            .extensions
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            ext,
            [
                ("cluster@rlark.io", "edge-7"),
                ("domain@rlark.io", "pod-net-1"),
                ("permit-port-forwarding", ""),
                ("role@rlark.io", "domain"),
            ]
        );
    }

    #[test]
    fn sign_and_verify_guest_with_each_key_type() {
        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let role = guest_role();
        let p256 = subject_key(Algorithm::Ecdsa {
            curve: russh::keys::ssh_key::EcdsaCurve::NistP256,
        });
        for (key, prefix) in [
            (
                subject_key(Algorithm::Ed25519),
                "ssh-ed25519-cert-v01@openssh.com ",
            ),
            (p256, "ecdsa-sha2-nistp256-cert-v01@openssh.com "),
            (RSA_2048.to_string(), "ssh-rsa-cert-v01@openssh.com "),
        ] {
            // Short validity: back-dated by a tenth of it.
            let signed = ca.sign(&key, &role, Duration::from_secs(600)).unwrap();
            assert!(signed.certificate_openssh.starts_with(prefix));
            let v =
                verify_ssh_cert(&signed.certificate_openssh, &[ca.fingerprint()], now()).unwrap();
            assert_eq!(v.role, role);
            assert_eq!(v.principals, ["alice@example.com"]);
            assert_eq!(v.key_id, "rlark:ssh-guest:alice@example.com");
            assert_eq!(v.serial, signed.serial);
            assert_eq!(v.valid_before - v.valid_after, 660);
            let key_body = key.split_whitespace().nth(1).unwrap();
            assert!(v.subject_key_openssh.contains(key_body));
            let ext: Vec<(&str, &str)> = v
                .extensions
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            assert_eq!(
                ext,
                [
                    ("permit-port-forwarding", ""),
                    ("permit-pty", ""),
                    ("role@rlark.io", "ssh-guest"),
                    ("user@rlark.io", "alice@example.com"),
                ]
            );
        }
        // Serials and nonces are random.
        let key = subject_key(Algorithm::Ed25519);
        let a = ca.sign(&key, &role, DAY).unwrap();
        let b = ca.sign(&key, &role, DAY).unwrap();
        assert_ne!(a.serial, b.serial);
        assert_ne!(a.certificate_openssh, b.certificate_openssh);
    }

    #[test]
    fn verify_rejects_other_ca_expired_and_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        let other = SshCa::load_or_create(other_dir.path()).unwrap();
        let signed = other
            .sign(&subject_key(Algorithm::Ed25519), &domain_role(), DAY)
            .unwrap();
        let err =
            verify_ssh_cert(&signed.certificate_openssh, &[ca.fingerprint()], now()).unwrap_err();
        assert!(err.to_string().contains("untrusted CA"), "{err}");
        // Trusting both CAs accepts it.
        verify_ssh_cert(
            &signed.certificate_openssh,
            &[ca.fingerprint(), other.fingerprint()],
            now(),
        )
        .unwrap();
        let err = verify_ssh_cert(&signed.certificate_openssh, &[], now()).unwrap_err();
        assert!(matches!(err, SshError::Verify(_)), "{err}");

        let signed = ca
            .sign(&subject_key(Algorithm::Ed25519), &guest_role(), DAY)
            .unwrap();
        let far_future = now() + 365 * DAY.as_secs();
        let err = verify_ssh_cert(&signed.certificate_openssh, &[ca.fingerprint()], far_future)
            .unwrap_err();
        assert!(err.to_string().contains("expired"), "{err}");
        let err =
            verify_ssh_cert(&signed.certificate_openssh, &[ca.fingerprint()], 1000).unwrap_err();
        assert!(err.to_string().contains("not valid before"), "{err}");

        // Tampering (a flipped byte in the base64 body) breaks parsing or the signature.
        let mut tampered = signed.certificate_openssh.clone().into_bytes();
        let i = tampered.len() - 40;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert!(verify_ssh_cert(&tampered, &[ca.fingerprint()], now()).is_err());

        let err = verify_ssh_cert("garbage", &[ca.fingerprint()], now()).unwrap_err();
        assert!(matches!(err, SshError::ParseCertificate(_)), "{err}");
        let err = verify_ssh_cert(RSA_2048, &[ca.fingerprint()], now()).unwrap_err();
        assert!(matches!(err, SshError::ParseCertificate(_)), "{err}");
        let err =
            verify_ssh_cert(&signed.certificate_openssh, &["md5:xx".into()], now()).unwrap_err();
        assert!(matches!(err, SshError::InvalidInput(_)), "{err}");
    }

    #[test]
    fn bad_public_keys_are_rejected_with_reason() {
        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let role = guest_role();
        let sign_err = |key: &str| ca.sign(key, &role, DAY).unwrap_err().to_string();

        assert!(sign_err("").contains("empty"));
        assert!(sign_err("   \n").contains("empty"));
        let e = sign_err("garbage");
        assert!(e.contains("unsupported key type \"garbage\""), "{e}");
        let e = sign_err("ssh-dss AAAA");
        assert!(e.contains("unsupported key type \"ssh-dss\""), "{e}");
        let e = sign_err(P384);
        assert!(e.contains("ecdsa-sha2-nistp384"), "{e}");
        let e = sign_err("ssh-ed25519");
        assert!(e.contains("no base64 key data"), "{e}");
        let good = subject_key(Algorithm::Ed25519);
        let truncated = &good[..good.len() - 10];
        let e = sign_err(truncated);
        assert!(e.contains("malformed ssh-ed25519 key"), "{e}");
        // Type on the line differs from the type in the blob.
        let e = sign_err(&good.replacen("ssh-ed25519", "ssh-rsa", 1));
        assert!(e.contains("not a ssh-rsa key"), "{e}");
        let e = sign_err(RSA_1024);
        assert!(e.contains("1024 bits"), "{e}");
        let e = sign_err(&format!("{good}\n{good}"));
        assert!(e.contains("several lines"), "{e}");
        let big = format!("ssh-ed25519 {}", "A".repeat(MAX_SSH_INPUT));
        let e = sign_err(&big);
        assert!(e.contains("limit"), "{e}");
        // A certificate is not a public key.
        let cert = ca.sign(&good, &role, DAY).unwrap().certificate_openssh;
        let e = sign_err(&cert);
        assert!(e.contains("unsupported key type"), "{e}");
        // Whitespace around a good key is fine.
        ca.sign(&format!("  {good}\n"), &role, DAY).unwrap();
        // Zero validity.
        let e = ca.sign(&good, &role, Duration::ZERO).unwrap_err();
        assert!(matches!(e, SshError::InvalidInput(_)), "{e}");
    }

    #[test]
    fn invalid_names_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let key = subject_key(Algorithm::Ed25519);
        let domain = |d: &str, c: &str| SshCertRole::Domain {
            domain: d.into(),
            cluster_id: c.into(),
        };
        let long = "a".repeat(64);
        for (role, needle) in [
            (domain("", "c1"), "domain \"\""),
            (domain("Pod", "c1"), "lowercase"),
            (domain("-pod", "c1"), "start or end"),
            (domain("pod-", "c1"), "start or end"),
            (domain("pod.net", "c1"), "lowercase"),
            (domain(&long, "c1"), "1 to 63"),
            (domain("pod", "c_1"), "cluster id"),
            (domain("pod", ""), "cluster id"),
            (SshCertRole::Guest { user: "".into() }, "1 to 253"),
            (SshCertRole::Guest { user: "a b".into() }, "' '"),
            (SshCertRole::Guest { user: "a:b".into() }, "':'"),
            (
                SshCertRole::Guest {
                    user: "a\u{7}".into(),
                },
                "\\u{7}",
            ),
            (
                SshCertRole::Guest {
                    user: "u".repeat(254),
                },
                "1 to 253",
            ),
        ] {
            let err = ca.sign(&key, &role, DAY).unwrap_err();
            assert!(matches!(err, SshError::InvalidInput(_)), "{role:?}: {err}");
            assert!(err.to_string().contains(needle), "{role:?}: {err}");
        }
        // Limits themselves are fine.
        ca.sign(&key, &domain(&"a".repeat(63), "0"), DAY).unwrap();
        let user = "u".repeat(253);
        ca.sign(&key, &SshCertRole::Guest { user }, DAY).unwrap();
    }

    /// Checks our certificates with the real OpenSSH tool. The test environment installs
    /// `openssh-client`; without `ssh-keygen` on PATH this test fails.
    #[test]
    fn openssh_ssh_keygen_reads_certificates() {
        use std::process::Command;
        let ssh_keygen =
            |args: &[&std::ffi::OsStr]| {
                let out = Command::new("ssh-keygen").args(args).output().unwrap_or_else(|e| {
                panic!(
                    "cannot run ssh-keygen ({e}); this test needs OpenSSH's ssh-keygen on PATH \
                     (Debian package openssh-client)"
                )
            });
                assert!(
                    out.status.success(),
                    "ssh-keygen {args:?} failed: {}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8(out.stdout).unwrap()
            };

        let dir = tempfile::tempdir().unwrap();
        let ca = SshCa::load_or_create(dir.path()).unwrap();
        let pub_path = dir.path().join(SSH_CA_PUB_FILE);
        let out = ssh_keygen(&["-l".as_ref(), "-f".as_ref(), pub_path.as_os_str()]);
        assert!(out.contains(&ca.fingerprint()), "{out}");
        assert!(out.contains("rlark-ssh-ca"), "{out}");
        // ssh-keygen also reads our private key file (prints its public key).
        let key_path = dir.path().join(SSH_CA_KEY_FILE);
        let out = ssh_keygen(&["-y".as_ref(), "-f".as_ref(), key_path.as_os_str()]);
        assert!(
            out.contains(ca.public_key_openssh().split(' ').nth(1).unwrap()),
            "{out}"
        );

        for (role, key) in [
            (domain_role(), subject_key(Algorithm::Ed25519)),
            (guest_role(), RSA_2048.to_string()),
        ] {
            let signed = ca.sign(&key, &role, DAY).unwrap();
            let cert_path = dir.path().join("id-cert.pub");
            std::fs::write(&cert_path, format!("{}\n", signed.certificate_openssh)).unwrap();
            // Parsing a certificate makes OpenSSH check the CA signature too.
            let out = ssh_keygen(&["-L".as_ref(), "-f".as_ref(), cert_path.as_os_str()]);
            assert!(out.contains("user certificate"), "{out}");
            assert!(out.contains(&role.principal()), "{out}");
            assert!(out.contains(&format!("\"{}\"", signed.key_id)), "{out}");
            assert!(out.contains(&format!("Serial: {}", signed.serial)), "{out}");
            assert!(out.contains("permit-port-forwarding"), "{out}");
            assert!(out.contains(&ca.fingerprint()), "{out}");
            assert_eq!(
                out.contains("permit-pty"),
                role.role_name() == ROLE_GUEST,
                "{out}"
            );
            assert!(out.contains("Critical Options: (none)"), "{out}");

            // OpenSSH checks the CA signature when it parses a certificate: a flipped byte in
            // the signature makes it refuse the file.
            let mut tampered = signed.certificate_openssh.clone().into_bytes();
            let i = tampered.len() - 40;
            tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
            std::fs::write(&cert_path, [tampered.as_slice(), b"\n"].concat()).unwrap();
            let status = Command::new("ssh-keygen")
                .args(["-L".as_ref(), "-f".as_ref(), cert_path.as_os_str()])
                .output()
                .unwrap()
                .status;
            assert!(
                !status.success(),
                "ssh-keygen accepted a tampered certificate"
            );
        }
    }
}
