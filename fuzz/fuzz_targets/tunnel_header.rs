//! Tunnel stream headers: the first bytes of every mux stream, written by the peer
//! (request by the hub, response by the agent) and decoded before anything else.
#![no_main]

use rlark_tunnel::header::{StreamRequest, StreamResponse};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(Some((request, consumed))) = StreamRequest::decode(data) {
        assert!(consumed <= data.len());
        // Every proper prefix of a complete header asks for more bytes.
        assert_eq!(StreamRequest::decode(&data[..consumed - 1]), Ok(None));
        // decode -> encode -> decode is stable, and encoding is canonical.
        let bytes = request.encode().expect("a decoded request encodes");
        assert_eq!(&bytes[..], &data[..consumed]);
        assert_eq!(StreamRequest::decode(&bytes), Ok(Some((request, consumed))));
    }
    if let Ok(Some((response, consumed))) = StreamResponse::decode(data) {
        assert!(consumed <= data.len());
        assert_eq!(StreamResponse::decode(&data[..consumed - 1]), Ok(None));
        let bytes = response.encode();
        assert_eq!(&bytes[..], &data[..consumed]);
        assert_eq!(
            StreamResponse::decode(&bytes),
            Ok(Some((response, consumed)))
        );
    }
});
