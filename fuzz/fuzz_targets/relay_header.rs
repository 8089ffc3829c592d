//! Relay headers: the body of a pod-network relay stream, sent by agents to the hub and by
//! the hub or a peer agent to the destination agent, decoded before anything else.
#![no_main]

use rlark_tunnel::relay::RelayHeader;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match RelayHeader::decode(data) {
        Ok(header) => {
            // decode -> encode is the identity on the accepted bytes (canonical encoding).
            let bytes = header.encode().expect("a decoded relay header encodes");
            assert_eq!(&bytes[..], data);
            assert_eq!(RelayHeader::decode(&bytes), Ok(header));
        }
        Err(error) => assert!(error.to_string().contains(error.field())),
    }
});
