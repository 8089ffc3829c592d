//! Certificate signing requests: the requester side (make a key and a CSR locally, so the
//! private key never leaves the host) and the signer side (parse untrusted CSR bytes,
//! check the proof of possession and the key type).
//!
//! The signer uses only the CSR's public key. The subject and extensions a requester asks
//! for are ignored: who the certificate names is decided by the signer from the caller's
//! authorization (a bootstrap token's cluster ID, an admin's explicit request), never by the
//! CSR.

use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

/// Largest CSR accepted (PEM or DER). Real CSRs with EC keys are well under 1 KiB.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// Why a CSR was refused. Every variant is the requester's fault (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("CSR is empty")]
    Empty,
    #[error("CSR is {size} bytes; at most {max} are accepted")]
    TooLarge { size: usize, max: usize },
    #[error("CSR is not a PEM `CERTIFICATE REQUEST` block or DER: {0}")]
    Encoding(String),
    #[error("CSR does not parse: {0}")]
    Parse(String),
    #[error("CSR has trailing bytes after the request")]
    TrailingBytes,
    #[error("CSR signature does not verify (no proof of possession of the key): {0}")]
    Signature(String),
    #[error("CSR key type {0} is not accepted; use ECDSA P-256, ECDSA P-384 or Ed25519")]
    KeyType(String),
}

/// The key algorithm of an accepted CSR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    EcdsaP256,
    EcdsaP384,
    Ed25519,
}

impl KeyType {
    /// A short name for listings and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyType::EcdsaP256 => "ecdsa-p256",
            KeyType::EcdsaP384 => "ecdsa-p384",
            KeyType::Ed25519 => "ed25519",
        }
    }
}

/// A verified CSR: its public key (DER SubjectPublicKeyInfo) and key type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCsr {
    /// DER `SubjectPublicKeyInfo` of the requester's key.
    pub spki_der: Vec<u8>,
    pub key_type: KeyType,
    /// The CN the requester asked for (informational only; never used as the identity).
    pub requested_common_name: Option<String>,
}

const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const OID_ED25519: &str = "1.3.101.112";
const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";

/// Parse and verify an untrusted CSR given as PEM (`-----BEGIN CERTIFICATE REQUEST-----`)
/// or raw DER. Checks size, encoding, that the whole input is one request, the signature
/// (proof that the requester holds the private key) and the key type.
pub fn parse_csr(input: &[u8]) -> Result<ParsedCsr, CsrError> {
    if input.is_empty() || input.iter().all(u8::is_ascii_whitespace) {
        return Err(CsrError::Empty);
    }
    if input.len() > MAX_CSR_BYTES {
        return Err(CsrError::TooLarge {
            size: input.len(),
            max: MAX_CSR_BYTES,
        });
    }
    let der = if input.first() == Some(&0x30) {
        input.to_vec()
    } else {
        pem_to_der(input)?
    };
    let (rest, csr) =
        X509CertificationRequest::from_der(&der).map_err(|e| CsrError::Parse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::TrailingBytes);
    }
    let info = &csr.certification_request_info;
    let spki = &info.subject_pki;
    let alg = spki.algorithm.algorithm.to_id_string();
    let key_type = match alg.as_str() {
        OID_ED25519 => KeyType::Ed25519,
        OID_EC_PUBLIC_KEY => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .unwrap_or_default();
            match curve.as_str() {
                OID_P256 => KeyType::EcdsaP256,
                OID_P384 => KeyType::EcdsaP384,
                other => return Err(CsrError::KeyType(format!("ECDSA on curve {other:?}"))),
            }
        }
        OID_RSA => return Err(CsrError::KeyType("RSA".to_string())),
        other => return Err(CsrError::KeyType(format!("with OID {other}"))),
    };
    csr.verify_signature()
        .map_err(|e| CsrError::Signature(e.to_string()))?;
    let requested_common_name = info
        .subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string);
    Ok(ParsedCsr {
        spki_der: spki.raw.to_vec(),
        key_type,
        requested_common_name,
    })
}

fn pem_to_der(input: &[u8]) -> Result<Vec<u8>, CsrError> {
    use rustls::pki_types::CertificateSigningRequestDer;
    use rustls::pki_types::pem::PemObject;
    let text = std::str::from_utf8(input)
        .map_err(|_| CsrError::Encoding("neither DER nor UTF-8 PEM text".to_string()))?;
    let der = CertificateSigningRequestDer::from_pem_slice(text.as_bytes())
        .map_err(|e| CsrError::Encoding(e.to_string()))?;
    Ok(der.as_ref().to_vec())
}

/// A private key made on this host and a CSR for it.
#[derive(Clone)]
pub struct KeyAndCsr {
    /// PKCS#8 PEM private key. Secret: write it with mode 0600 and never send it.
    pub key_pem: String,
    /// PEM `CERTIFICATE REQUEST`.
    pub csr_pem: String,
}

impl std::fmt::Debug for KeyAndCsr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyAndCsr")
            .field("key_pem", &"<redacted>")
            .field("csr_pem", &self.csr_pem)
            .finish()
    }
}

/// Make an ECDSA P-256 key and a CSR whose subject CN is `common_name` (the signer decides
/// the real subject; the CN only helps a human reading the request).
pub fn generate_key_and_csr(common_name: &str) -> crate::Result<KeyAndCsr> {
    let key = KeyPair::generate().map_err(crate::PkiError::GenerateKey)?;
    csr_for_key(&key, common_name)
}

/// A CSR for an existing key (renewal may keep the key; rlark's agents make a new one).
pub fn csr_for_key(key: &KeyPair, common_name: &str) -> crate::Result<KeyAndCsr> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let csr = params
        .serialize_request(key)
        .map_err(|e| crate::PkiError::Sign(e.to_string()))?;
    Ok(KeyAndCsr {
        key_pem: key.serialize_pem(),
        csr_pem: csr
            .pem()
            .map_err(|e| crate::PkiError::Sign(e.to_string()))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_csr_parses_and_verifies() {
        let made = generate_key_and_csr("system:rlark:agent:a").unwrap();
        let parsed = parse_csr(made.csr_pem.as_bytes()).unwrap();
        assert_eq!(parsed.key_type, KeyType::EcdsaP256);
        assert_eq!(
            parsed.requested_common_name.as_deref(),
            Some("system:rlark:agent:a")
        );
        let key = KeyPair::from_pem(&made.key_pem).unwrap();
        assert_eq!(
            parsed.spki_der,
            rcgen::PublicKeyData::subject_public_key_info(&key)
        );
        // DER input is accepted too.
        let der = pem_to_der(made.csr_pem.as_bytes()).unwrap();
        assert_eq!(parse_csr(&der).unwrap(), parsed);
    }

    #[test]
    fn ed25519_and_p384_are_accepted() {
        for (alg, want) in [
            (&rcgen::PKCS_ED25519, KeyType::Ed25519),
            (&rcgen::PKCS_ECDSA_P384_SHA384, KeyType::EcdsaP384),
        ] {
            let key = KeyPair::generate_for(alg).unwrap();
            let made = csr_for_key(&key, "x").unwrap();
            assert_eq!(parse_csr(made.csr_pem.as_bytes()).unwrap().key_type, want);
        }
    }

    #[test]
    fn bad_csrs_are_refused_with_a_reason() {
        assert_eq!(parse_csr(b""), Err(CsrError::Empty));
        assert_eq!(parse_csr(b"  \n"), Err(CsrError::Empty));
        assert!(matches!(
            parse_csr(&vec![b'A'; MAX_CSR_BYTES + 1]),
            Err(CsrError::TooLarge { .. })
        ));
        assert!(matches!(parse_csr(b"hello"), Err(CsrError::Encoding(_))));
        assert!(matches!(
            parse_csr(&[0x30, 0x03, 0x02, 0x01, 0x00]),
            Err(CsrError::Parse(_))
        ));
        assert!(matches!(
            parse_csr(&[0xff, 0xfe, 0x00]),
            Err(CsrError::Encoding(_))
        ));
        // A certificate is not a CSR.
        let cert_pem = "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            parse_csr(cert_pem.as_bytes()),
            Err(CsrError::Encoding(_))
        ));
        // Tampered: flip a byte inside the subject so the signature no longer matches.
        let made = generate_key_and_csr("tamper-me").unwrap();
        let mut der = pem_to_der(made.csr_pem.as_bytes()).unwrap();
        let at = der
            .windows(9)
            .position(|w| w == b"tamper-me")
            .expect("CN in DER");
        der[at] = b'T';
        assert!(matches!(parse_csr(&der), Err(CsrError::Signature(_))));
        // Trailing garbage after the request.
        let mut der = pem_to_der(made.csr_pem.as_bytes()).unwrap();
        der.extend_from_slice(&[0, 0]);
        assert_eq!(parse_csr(&der), Err(CsrError::TrailingBytes));
    }

    #[test]
    fn rsa_keys_are_refused() {
        // A 2048-bit RSA CSR made by `openssl req -newkey rsa:2048 -nodes -subj /CN=rsa`.
        let pem = include_str!("testdata/rsa.csr");
        assert_eq!(
            parse_csr(pem.as_bytes()),
            Err(CsrError::KeyType("RSA".to_string()))
        );
    }
}
