//! WebSocket frames of the tunnel's transport: every byte the hub or an agent receives
//! after the upgrade is parsed here first (header codec, then the transport's reader with
//! its masking, fragmentation, control-frame and size rules).
#![no_main]

use futures::StreamExt;
use rlark_tunnel::transport::{MAX_MESSAGE_SIZE, WsTransport};
use rlark_tunnel::ws::{FrameHeader, MAX_HEADER_LEN, Role};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // The header codec never panics, is canonical, and every proper prefix of an accepted
    // header asks for more bytes.
    if let Ok(Some((header, len))) = FrameHeader::parse(data) {
        let mut out = [0u8; MAX_HEADER_LEN];
        assert_eq!(header.encode(&mut out), len);
        assert_eq!(&out[..len], &data[..len]);
        for cut in 0..len {
            assert_eq!(FrameHeader::parse(&data[..cut]), Ok(None));
        }
    }
    // The transport reads the bytes as a peer's stream in either role: it never panics,
    // never yields a message over the limit, and ends (each item consumes input).
    for role in [Role::Client, Role::Server] {
        let io = tokio::io::join(data, tokio::io::sink());
        let mut transport = WsTransport::from_raw_socket(io, role);
        futures::executor::block_on(async {
            // At most one message per two bytes, then an error or the end.
            for _ in 0..data.len() + 2 {
                match transport.next().await {
                    Some(Ok(message)) => assert!(message.len() <= MAX_MESSAGE_SIZE),
                    Some(Err(_)) => {}
                    None => return,
                }
            }
            panic!("the stream did not end");
        });
    }
});
