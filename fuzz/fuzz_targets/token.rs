//! Bootstrap and bearer token parsing of untrusted text (join bodies, Authorization headers).
#![no_main]

use rlark_pki::{Token, TokenKind};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for kind in [TokenKind::Bootstrap, TokenKind::Bearer] {
        if let Ok(token) = Token::parse(kind, text) {
            // Whatever parses round-trips exactly.
            assert_eq!(token.expose(), text);
        }
    }
    let _ = Token::parse_any(text);
});
