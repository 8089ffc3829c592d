//! Bootstrap and bearer token parsing of untrusted text (join bodies, Authorization headers).
//! The body is `rlark_pki::fuzzing::token`, which `cargo test -p rlark-pki` also runs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_pki::fuzzing::token(data);
});
