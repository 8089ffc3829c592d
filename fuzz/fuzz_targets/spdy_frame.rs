//! SPDY/3.1 frames as `kubectl port-forward` sends them to the server: every byte after the
//! upgrade (or inside the WebSocket messages) is decoded here first, header blocks
//! decompressed included.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // Never panics, always ends; what decodes re-encodes and decodes to itself.
    rlark_tunnel::spdy::fuzz_decode(data);
});
