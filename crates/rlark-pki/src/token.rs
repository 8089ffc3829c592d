//! Bearer and bootstrap tokens: generation, parsing of untrusted input, hashing.
//!
//! A token is `<id>.<secret>`. The id is public (it names the stored record and shows in
//! listings and audit logs); only `SHA-256(secret)` is stored, so a leaked database does not
//! leak usable tokens. Comparison of the hashes is constant-time.
//!
//! | kind | format | example |
//! |---|---|---|
//! | bootstrap (agent join) | kubeadm's `[a-z0-9]{6}.[a-z0-9]{16}` | `abcdef.0123456789abcdef` |
//! | bearer (users, tasks) | `rlk-[a-z0-9]{12}.[a-z0-9]{32}` | `rlk-0a1b2c3d4e5f.…` |

use sha2::{Digest, Sha256};

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
/// Prefix of bearer-token ids, so a bearer token is never mistaken for a bootstrap token.
pub const BEARER_PREFIX: &str = "rlk-";
/// Longest token string accepted by the parsers (longer input is refused before any work).
pub const MAX_TOKEN_LEN: usize = 128;

/// Which token format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Bootstrap,
    Bearer,
}

impl TokenKind {
    fn lengths(self) -> (usize, usize) {
        match self {
            TokenKind::Bootstrap => (6, 16),
            TokenKind::Bearer => (12, 32),
        }
    }
}

/// Why a token string was refused. The messages never echo the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is empty")]
    Empty,
    #[error("token is {0} characters; tokens are at most {MAX_TOKEN_LEN}")]
    TooLong(usize),
    #[error("token must look like {expected}")]
    Format { expected: &'static str },
}

/// A parsed token. `Debug` redacts the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub kind: TokenKind,
    /// Public id (for bearer tokens including the `rlk-` prefix).
    pub id: String,
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("kind", &self.kind)
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

fn random_chars(n: usize) -> String {
    // uuid v4 draws from the OS CSPRNG (getrandom); 122 random bits per UUID.
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for byte in uuid::Uuid::new_v4().into_bytes() {
            // 252 = 7 * 36: reject the top of the range so every character is equally likely.
            if byte < 252 && out.len() < n {
                out.push(char::from(ALPHABET[usize::from(byte) % ALPHABET.len()]));
            }
        }
    }
    out
}

impl Token {
    /// A new random token of `kind`.
    pub fn generate(kind: TokenKind) -> Token {
        let (id_len, secret_len) = kind.lengths();
        let mut id = random_chars(id_len);
        if kind == TokenKind::Bearer {
            id.insert_str(0, BEARER_PREFIX);
        }
        Token {
            kind,
            id,
            secret: random_chars(secret_len),
        }
    }

    /// Parse untrusted input as a token of `kind`. Surrounding whitespace is an error here;
    /// the CLI trims pasted input before calling this.
    pub fn parse(kind: TokenKind, input: &str) -> Result<Token, TokenError> {
        if input.is_empty() {
            return Err(TokenError::Empty);
        }
        if input.len() > MAX_TOKEN_LEN {
            return Err(TokenError::TooLong(input.len()));
        }
        let expected = match kind {
            TokenKind::Bootstrap => "[a-z0-9]{6}.[a-z0-9]{16}",
            TokenKind::Bearer => "rlk-[a-z0-9]{12}.[a-z0-9]{32}",
        };
        let format = || TokenError::Format { expected };
        let (id, secret) = input.split_once('.').ok_or_else(format)?;
        let (id_len, secret_len) = kind.lengths();
        let bare_id = match kind {
            TokenKind::Bootstrap => id,
            TokenKind::Bearer => id.strip_prefix(BEARER_PREFIX).ok_or_else(format)?,
        };
        let valid =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| ALPHABET.contains(&b));
        if !valid(bare_id, id_len) || !valid(secret, secret_len) {
            return Err(format());
        }
        Ok(Token {
            kind,
            id: id.to_string(),
            secret: secret.to_string(),
        })
    }

    /// Parse a bearer credential of either kind (bearer tokens start with `rlk-`).
    pub fn parse_any(input: &str) -> Result<Token, TokenError> {
        if input.starts_with(BEARER_PREFIX) {
            Token::parse(TokenKind::Bearer, input)
        } else {
            Token::parse(TokenKind::Bootstrap, input)
        }
    }

    /// The whole token, `<id>.<secret>`. Secret: show it once, never log it.
    pub fn expose(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// Hex SHA-256 of the secret: what is stored.
    pub fn secret_hash(&self) -> String {
        hash_secret(&self.secret)
    }

    /// Whether this token's secret hashes to `stored_hash` (constant-time comparison).
    pub fn matches(&self, stored_hash: &str) -> bool {
        constant_time_eq(self.secret_hash().as_bytes(), stored_hash.as_bytes())
    }
}

fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compare without an early exit, so the time taken does not reveal the matching prefix.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_parse_back_and_match_their_hash() {
        for kind in [TokenKind::Bootstrap, TokenKind::Bearer] {
            let token = Token::generate(kind);
            let text = token.expose();
            let parsed = Token::parse(kind, &text).unwrap();
            assert_eq!(parsed, token);
            assert_eq!(Token::parse_any(&text).unwrap(), token);
            assert!(parsed.matches(&token.secret_hash()));
            assert!(!Token::generate(kind).matches(&token.secret_hash()));
            assert!(!format!("{token:?}").contains(&token.secret));
        }
        let bootstrap = Token::generate(TokenKind::Bootstrap).expose();
        assert_eq!(bootstrap.len(), 23);
        assert!(Token::generate(TokenKind::Bearer).id.starts_with("rlk-"));
        assert_ne!(
            Token::generate(TokenKind::Bearer),
            Token::generate(TokenKind::Bearer)
        );
    }

    #[test]
    fn malformed_tokens_are_refused() {
        use TokenKind::*;
        assert_eq!(Token::parse(Bootstrap, ""), Err(TokenError::Empty));
        assert_eq!(
            Token::parse(Bootstrap, &"a".repeat(200)),
            Err(TokenError::TooLong(200))
        );
        for bad in [
            "abcdef",
            "abcdef.",
            ".0123456789abcdef",
            "ABCDEF.0123456789abcdef",
            "abcde.0123456789abcdef",
            "abcdef.0123456789abcdeg0",
            "abcdef.0123456789abcde!",
            "abcdef 0123456789abcdef",
            " abcdef.0123456789abcdef",
            "abcdef.0123456789abcdef\n",
            "abcdef.0123.456789abcdef",
            "ab\u{e9}def.0123456789abcdef",
        ] {
            assert!(
                matches!(Token::parse(Bootstrap, bad), Err(TokenError::Format { .. })),
                "{bad:?}"
            );
        }
        assert!(Token::parse(Bearer, "abcdef.0123456789abcdef").is_err());
        assert!(Token::parse(Bearer, "rlk-abc.def").is_err());
        assert_eq!(hash_secret("x").len(), 64);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
