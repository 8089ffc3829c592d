//! SPDY/3 name/value header blocks (SYN_STREAM, SYN_REPLY, HEADERS): the plain encoding
//! (a 32-bit pair count, then per pair a 32-bit length and the name, a 32-bit length and
//! the value; several values of one name separated by NUL) and its zlib compression.
//!
//! Compression is stateful per direction of a connection: every block a peer sends
//! continues the same zlib stream (primed with [`super::dictionary::DICTIONARY`] and ended
//! with a sync flush per block), so a connection keeps one [`Deflater`] for what it sends
//! and one [`Inflater`] for what it receives, and feeds them blocks strictly in wire order.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::SpdyError;
use super::dictionary::DICTIONARY;

/// Most bytes a header block may decompress to. kubectl's blocks are under 100 bytes;
/// this bounds what a peer can make the server allocate (a zlib bomb).
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// Most name/value pairs in one block.
pub const MAX_HEADER_PAIRS: usize = 256;

/// A decoded header block: lowercase names with their values, in wire order. A value
/// with NULs (several values of one header) is kept whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The value of `name` (lowercase), the first if the name repeats.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The plain (uncompressed) encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        push_len(&mut out, self.0.len());
        for (name, value) in &self.0 {
            push_len(&mut out, name.len());
            out.extend_from_slice(name.as_bytes());
            push_len(&mut out, value.len());
            out.extend_from_slice(value.as_bytes());
        }
        out
    }

    /// Parse a plain block. Names must be non-empty lowercase-safe UTF-8 (SPDY/3 requires
    /// lowercase; uppercase is refused as the spec says a receiver must), values UTF-8.
    pub fn decode(block: &[u8]) -> Result<Headers, SpdyError> {
        let mut rest = block;
        let count = take_u32(&mut rest, "header pair count")? as usize;
        if count > MAX_HEADER_PAIRS {
            return Err(SpdyError::HeaderBlock(format!(
                "{count} header pairs; at most {MAX_HEADER_PAIRS} are allowed"
            )));
        }
        let mut pairs = Vec::with_capacity(count);
        for _ in 0..count {
            let name = take_string(&mut rest, "header name")?;
            if name.is_empty() {
                return Err(SpdyError::HeaderBlock("empty header name".into()));
            }
            if name.bytes().any(|b| b.is_ascii_uppercase()) {
                return Err(SpdyError::HeaderBlock(format!(
                    "header name {name:?} is not lowercase"
                )));
            }
            let value = take_string(&mut rest, "header value")?;
            pairs.push((name, value));
        }
        if !rest.is_empty() {
            return Err(SpdyError::HeaderBlock(format!(
                "{} bytes follow the last header pair",
                rest.len()
            )));
        }
        Ok(Headers(pairs))
    }
}

fn push_len(out: &mut Vec<u8>, len: usize) {
    // Header names and values are short strings the server itself chose; a length over
    // u32 cannot occur, and saturating keeps the function total.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn take_u32(rest: &mut &[u8], what: &str) -> Result<u32, SpdyError> {
    let Some((head, tail)) = rest.split_first_chunk::<4>() else {
        return Err(SpdyError::HeaderBlock(format!(
            "header block ends inside a {what}"
        )));
    };
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_string(rest: &mut &[u8], what: &str) -> Result<String, SpdyError> {
    let len = take_u32(rest, what)? as usize;
    if len > rest.len() {
        return Err(SpdyError::HeaderBlock(format!(
            "{what} of {len} bytes exceeds the block"
        )));
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| SpdyError::HeaderBlock(format!("{what} is not UTF-8")))
}

/// The compressing side of one direction of a connection.
pub struct Deflater {
    zlib: Compress,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater")
            .field("total_in", &self.zlib.total_in())
            .finish()
    }
}

impl Deflater {
    /// A compressor primed with the SPDY/3 dictionary, for the first block of a direction.
    /// Fails with [`SpdyError::Compression`] if zlib refuses the dictionary.
    pub fn new() -> Result<Deflater, SpdyError> {
        let mut zlib = Compress::new(Compression::default(), true);
        zlib.set_dictionary(DICTIONARY)
            .map_err(|e| SpdyError::Compression(format!("set dictionary: {e}")))?;
        Ok(Deflater { zlib })
    }

    /// `headers` compressed as the next block of this direction (sync-flushed, so the
    /// peer can decompress it without the blocks that follow).
    pub fn compress(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let plain = headers.encode();
        let mut out = Vec::with_capacity(plain.len() / 2 + 64);
        let mut input = plain.as_slice();
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(256);
            }
            let before = self.zlib.total_in();
            self.zlib
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            let consumed = usize::try_from(self.zlib.total_in() - before).unwrap_or(usize::MAX);
            input = input.get(consumed..).unwrap_or_default();
            // Done when all input is in and the flush did not fill the buffer (a full
            // buffer may hold back more of the flush).
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// The decompressing side of one direction of a connection.
pub struct Inflater {
    zlib: Decompress,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("total_in", &self.zlib.total_in())
            .finish()
    }
}

impl Default for Inflater {
    fn default() -> Self {
        Self::new()
    }
}

impl Inflater {
    /// A decompressor for the first block of a direction; the SPDY/3 dictionary is supplied
    /// when the zlib stream asks for it.
    pub fn new() -> Inflater {
        Inflater {
            zlib: Decompress::new(true),
        }
    }

    /// Decompress the next block of this direction and parse it. An error leaves the
    /// stream unusable: the connection must end (the peer's compressor state is lost).
    pub fn decompress(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let mut out: Vec<u8> = Vec::with_capacity(256);
        let mut input = block;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(SpdyError::HeaderBlock(format!(
                        "header block decompresses to more than {MAX_HEADER_BLOCK} bytes"
                    )));
                }
                out.reserve((out.len()).min(MAX_HEADER_BLOCK - out.len()).max(256));
            }
            let before_in = self.zlib.total_in();
            let before_out = out.len();
            let result = self
                .zlib
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = usize::try_from(self.zlib.total_in() - before_in).unwrap_or(0);
            input = input.get(consumed..).unwrap_or_default();
            match result {
                Ok(Status::StreamEnd) => {
                    // SPDY never ends the zlib stream; a peer that did cannot send more.
                    return Err(SpdyError::Compression(
                        "the header compression stream ended".into(),
                    ));
                }
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.zlib
                        .set_dictionary(DICTIONARY)
                        .map_err(|e| SpdyError::Compression(format!("set dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(SpdyError::Compression(e.to_string())),
            }
            let progressed = consumed > 0 || out.len() > before_out;
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            if !progressed {
                return Err(SpdyError::Compression(
                    "the header block is a truncated zlib block".into(),
                ));
            }
        }
        if out.len() > MAX_HEADER_BLOCK {
            return Err(SpdyError::HeaderBlock(format!(
                "header block decompresses to more than {MAX_HEADER_BLOCK} bytes"
            )));
        }
        Headers::decode(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        Headers(
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn blocks_round_trip_through_one_context_per_direction() {
        let mut deflater = Deflater::new().unwrap();
        let mut inflater = Inflater::new();
        let blocks = [
            headers(&[
                ("streamtype", "error"),
                ("port", "8080"),
                ("requestid", "0"),
            ]),
            headers(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]),
            headers(&[]),
            headers(&[("x", "a\0b")]),
        ];
        for block in &blocks {
            let wire = deflater.compress(block).unwrap();
            assert_eq!(&inflater.decompress(&wire).unwrap(), block);
        }
        // A fresh inflater cannot read the second block alone: the contexts are stateful.
        let second = deflater.compress(&blocks[0]).unwrap();
        assert!(Inflater::new().decompress(&second).is_err());
    }

    #[test]
    fn plain_blocks_are_checked() {
        assert!(Headers::decode(b"").is_err());
        assert!(Headers::decode(&[0, 0, 0, 1]).is_err());
        assert!(Headers::decode(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        assert!(Headers::decode(&[0, 0, 0, 1, 0, 0, 0, 1, b'A', 0, 0, 0, 0]).is_err());
        assert!(Headers::decode(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Headers::decode(&[0, 0, 0, 0, 7]).is_err());
        assert!(Headers::decode(&[0xff, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(
            Headers::decode(&[0, 0, 0, 1, 0, 0, 0, 1, b'a', 0, 0, 0, 1, b'b']).unwrap(),
            headers(&[("a", "b")])
        );
    }

    #[test]
    fn bombs_and_garbage_are_refused() {
        // A block whose plain form is larger than the limit.
        let big = headers(&[("a", &"x".repeat(MAX_HEADER_BLOCK))]);
        let wire = Deflater::new().unwrap().compress(&big).unwrap();
        assert!(wire.len() < 2048, "compresses well: {}", wire.len());
        let error = Inflater::new().decompress(&wire).unwrap_err();
        assert!(error.to_string().contains("more than"), "{error}");
        assert!(Inflater::new().decompress(b"not zlib at all").is_err());
        assert!(Inflater::new().decompress(b"").is_err());
    }
}
