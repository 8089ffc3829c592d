//! CSR parsing of untrusted bytes (what `POST /rlark/v1/join` and `/renew` receive).
//! The body is `rlark_pki::fuzzing::csr`, which `cargo test -p rlark-pki` also runs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_pki::fuzzing::csr(data);
});
