//! CSR parsing of untrusted bytes (what `POST /rlark/v1/join` and `/renew` receive).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(csr) = rlark_pki::parse_csr(data) {
        // An accepted CSR always carries a public key the signer can use.
        assert!(!csr.spki_der.is_empty());
    }
});
