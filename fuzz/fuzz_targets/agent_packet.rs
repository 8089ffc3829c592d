//! IP packets from a replica's TUN device and ICMP messages from relay-stream frames (the
//! agent's datagram plane). The body is `rlark_net::fuzzing::packet`, which
//! `cargo test -p rlark-net` also runs over deterministic mutations.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    rlark_net::fuzzing::packet(data);
});
