//! Admission of a new object of every served kind: the first byte picks the kind, the
//! second the fieldValidation directive, the rest is a JSON body taken through decoding,
//! the schema walk, metadata checks and the kind's validator. The body is
//! `rlark_apiserver::fuzzing::admission`, which `cargo test -p rlark-apiserver` also runs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_apiserver::fuzzing::admission(data);
});
