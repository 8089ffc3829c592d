//! Minimal DER helpers.
//!
//! rcgen keeps a certificate subject in a map keyed by attribute type, so it cannot write the
//! Kubernetes convention of one `O` attribute per group. We let rcgen build and sign the
//! certificate, then put our own subject `Name` into its `TBSCertificate` and sign that again
//! with the CA key. Everything else (serial, validity, extensions, signature algorithm) stays
//! exactly as rcgen wrote it.

use rcgen::{KeyPair, SigningKey};

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_UTF8_STRING: u8 = 0x0c;
const TAG_BIT_STRING: u8 = 0x03;
/// 2.5.4.3 (commonName), encoded.
const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
/// 2.5.4.10 (organizationName), encoded.
const OID_ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];

use crate::PkiError;

fn layout_error() -> PkiError {
    PkiError::Sign("generated certificate has an unexpected layout".to_string())
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        // Short form: `len` fits in 7 bits (checked just above).
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let first = bytes
            .iter()
            .position(|b| *b != 0)
            .unwrap_or(bytes.len() - 1);
        let significant = &bytes[first..];
        // At most size_of::<usize>() = 8 bytes, so the count fits in the 7-bit field.
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
}

fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    push_len(&mut out, content.len());
    out.extend_from_slice(content);
    out
}

fn rdn(oid: &[u8], value: &str) -> Vec<u8> {
    let mut atv = tlv(TAG_OID, oid);
    atv.extend(tlv(TAG_UTF8_STRING, value.as_bytes()));
    tlv(TAG_SET, &tlv(TAG_SEQUENCE, &atv))
}

/// DER `Name` with one `O` RDN per organization (in order) followed by the `CN`, all UTF8String.
pub(crate) fn encode_name(common_name: &str, organizations: &[String]) -> Vec<u8> {
    let mut rdns = Vec::new();
    for org in organizations {
        rdns.extend(rdn(&OID_ORGANIZATION, org));
    }
    rdns.extend(rdn(&OID_COMMON_NAME, common_name));
    tlv(TAG_SEQUENCE, &rdns)
}

/// Length of the header and of the content of the DER TLV at the start of `input`.
/// Only the definite, at most 4-byte long form is accepted (all DER we handle is that).
fn header(input: &[u8]) -> Option<(usize, usize)> {
    let first = *input.get(1)?;
    if first < 0x80 {
        return Some((2, usize::from(first)));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let bytes = input.get(2..2 + count)?;
    let len = bytes
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
    Some((2 + count, len))
}

/// Offset of `inner` inside `outer` when `inner` is a sub-slice of it.
fn offset_in(outer: &[u8], inner: &[u8]) -> Option<usize> {
    let outer_start = outer.as_ptr() as usize;
    let inner_start = inner.as_ptr() as usize;
    (inner_start >= outer_start && inner_start + inner.len() <= outer_start + outer.len())
        .then(|| inner_start - outer_start)
}

/// Replace the subject of `cert_der` by `subject` (a DER `Name`) and re-sign with `issuer_key`.
pub(crate) fn replace_subject(
    cert_der: &[u8],
    subject: &[u8],
    issuer_key: &KeyPair,
) -> Result<Vec<u8>, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| PkiError::Sign(format!("parse generated certificate: {e}")))?;
    let tbs: &[u8] = cert.tbs_certificate.as_ref();
    let old_subject = cert.tbs_certificate.subject.as_raw();
    let tbs_offset = offset_in(cert_der, tbs).ok_or_else(layout_error)?;
    let subject_offset = offset_in(tbs, old_subject).ok_or_else(layout_error)?;
    let (tbs_header, tbs_len) = header(tbs).ok_or_else(layout_error)?;
    if tbs_header + tbs_len != tbs.len() || subject_offset < tbs_header {
        return Err(layout_error());
    }

    let mut content = Vec::with_capacity(tbs_len + subject.len());
    content.extend_from_slice(&tbs[tbs_header..subject_offset]);
    content.extend_from_slice(subject);
    content.extend_from_slice(&tbs[subject_offset + old_subject.len()..]);
    let new_tbs = tlv(TAG_SEQUENCE, &content);

    // After the TBSCertificate: signatureAlgorithm (kept), signatureValue (replaced).
    let rest = &cert_der[tbs_offset + tbs.len()..];
    let (alg_header, alg_len) = header(rest).ok_or_else(layout_error)?;
    let algorithm = rest.get(..alg_header + alg_len).ok_or_else(layout_error)?;

    let signature = issuer_key
        .sign(&new_tbs)
        .map_err(|e| PkiError::Sign(e.to_string()))?;
    let mut bits = Vec::with_capacity(signature.len() + 1);
    bits.push(0); // no unused bits
    bits.extend(signature);

    let mut body = new_tbs;
    body.extend_from_slice(algorithm);
    body.extend(tlv(TAG_BIT_STRING, &bits));
    Ok(tlv(TAG_SEQUENCE, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_use_short_and_long_forms() {
        let mut out = Vec::new();
        push_len(&mut out, 5);
        assert_eq!(out, [5]);
        out.clear();
        push_len(&mut out, 200);
        assert_eq!(out, [0x81, 200]);
        out.clear();
        push_len(&mut out, 0x1234);
        assert_eq!(out, [0x82, 0x12, 0x34]);
        let encoded = tlv(TAG_SEQUENCE, &vec![7u8; 300]);
        assert_eq!(header(&encoded), Some((4, 300)));
    }

    #[test]
    fn name_parses_back_with_every_organization() {
        let der = encode_name("alice", &["dev".to_string(), "ops".to_string()]);
        let (rest, name) = x509_parser::x509::X509Name::from_der(&der).expect("parse name");
        assert!(rest.is_empty());
        let orgs: Vec<_> = name
            .iter_organization()
            .map(|a| a.as_str().expect("utf8"))
            .collect();
        assert_eq!(orgs, ["dev", "ops"]);
        let cn = name
            .iter_common_name()
            .next()
            .expect("cn")
            .as_str()
            .expect("utf8");
        assert_eq!(cn, "alice");
    }

    use x509_parser::prelude::FromDer;
}
