//! Mux frame decoding of untrusted transport messages (every WebSocket message from a peer).
#![no_main]

use rlark_tunnel::frame::Frame;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // Never panics; whatever decodes re-encodes to exactly the same bytes (canonical encoding).
    if let Ok(frame) = Frame::decode(data) {
        assert_eq!(&frame.encode()[..], data);
        assert_eq!(frame.encoded_len(), data.len());
    }
});
