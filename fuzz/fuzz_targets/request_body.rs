//! Request bodies as the API server decodes them (JSON with duplicate-key tracking, YAML,
//! Kubernetes protobuf; the first byte picks the media type). The body is
//! `rlark_apiserver::fuzzing::request_body`, which `cargo test -p rlark-apiserver` also runs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_apiserver::fuzzing::request_body(data);
});
