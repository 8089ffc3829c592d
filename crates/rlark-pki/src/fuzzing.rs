//! Fuzz target bodies over the parsers of untrusted input, as plain functions: the
//! cargo-fuzz targets in `fuzz/` (nightly, libFuzzer) call them, and so does the stable
//! mutation loop of this crate's tests (`parsers_survive_mutated_input`). Not an API:
//! compiled for tests and with the `fuzzing` feature only.
//!
//! Each returns whether the input was accepted.
// A fuzz target states its invariants as panics: that is how the fuzzer reports them.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use crate::ssh::{SshCa, SshCertRole, verify_ssh_cert};
use crate::{Token, TokenKind, parse_csr};

/// CSR parsing (what `POST /rlark/v1/join` and `/renew` receive): an accepted CSR always
/// carries a public key the signer can use; a refusal has a reason.
pub fn csr(data: &[u8]) -> bool {
    match parse_csr(data) {
        Ok(csr) => {
            assert!(!csr.spki_der.is_empty());
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    }
}

/// Bootstrap and bearer token parsing (join bodies, `Authorization` headers): whatever
/// parses round-trips exactly.
pub fn token(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let mut accepted = false;
    for kind in [TokenKind::Bootstrap, TokenKind::Bearer] {
        if let Ok(token) = Token::parse(kind, text) {
            assert_eq!(token.expose(), text);
            accepted = true;
        }
    }
    if let Ok(token) = Token::parse_any(text) {
        assert_eq!(token.expose(), text);
    }
    accepted
}

/// OpenSSH public keys (SSH signing requests) and certificates (SSH logins) signed or
/// verified by `ca`: a key that signs gives a certificate that verifies.
pub fn ssh_public_key(ca: &SshCa, data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else {
        return false;
    };
    let role = SshCertRole::Guest {
        user: "fuzz".to_string(),
    };
    let fingerprints = [ca.fingerprint()];
    let _ = verify_ssh_cert(text, &fingerprints, 0);
    match ca.sign(text, &role, Duration::from_secs(60)) {
        Ok(signed) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            verify_ssh_cert(&signed.certificate_openssh, &fingerprints, now)
                .expect("a certificate just signed verifies");
            true
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            false
        }
    }
}
