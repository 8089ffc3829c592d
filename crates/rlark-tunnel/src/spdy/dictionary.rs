//! The SPDY/3 header-compression dictionary (SPDY/3 draft, section 2.6.10.1): the zlib
//! dictionary both directions of every connection prime their header-block compression
//! with. A protocol constant: kubectl's spdystream uses the same 1423 bytes, and a block
//! compressed with any other dictionary does not decompress.

/// The dictionary, byte for byte as the specification lists it.
pub const DICTIONARY: &[u8] =
    b"\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\x00\
      \x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-chars\
      et\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ra\
      nges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0d\
      cache-control\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10conten\
      t-encoding\x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10c\
      ontent-location\x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0cco\
      ntent-type\x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07e\
      xpires\x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-\
      modified-since\x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unm\
      odified-since\x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-for\
      wards\x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-author\
      ization\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\
      \x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\
      \x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\
      \x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\
      \x03get\x00\x00\x00\x06status\x00\x00\x00\x06200\x20OK\x00\x00\x00\x07version\x00\x00\x00\
      \x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\x0aset-cookie\x00\x00\
      \x00\x0akeep-alive\x00\x00\x00\x06origin1001012012022052063003023033043053063074024054064\
      07408409410411412413414415416417502504505203\x20Non-Authoritative\x20Information204\x20No\
      \x20Content301\x20Moved\x20Permanently400\x20Bad\x20Request401\x20Unauthorized403\x20Forb\
      idden404\x20Not\x20Found500\x20Internal\x20Server\x20Error501\x20Not\x20Implemented503\
      \x20Service\x20UnavailableJan\x20Feb\x20Mar\x20Apr\x20May\x20Jun\x20Jul\x20Aug\x20Sept\
      \x20Oct\x20Nov\x20Dec\x2000:00:00\x20Mon,\x20Tue,\x20Wed,\x20Thu,\x20Fri,\x20Sat,\x20Sun,\
      \x20GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+\
      xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset\
      =iso-8859-1,utf-,*,enq=0.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dictionary_is_the_specification_one() {
        assert_eq!(DICTIONARY.len(), 1423);
        assert!(DICTIONARY.starts_with(b"\x00\x00\x00\x07options\x00\x00\x00\x04head"));
        assert!(DICTIONARY.ends_with(b"charset=iso-8859-1,utf-,*,enq=0."));
        // 40 spaces, which the literal spells `\x20` so no line continuation eats one.
        assert_eq!(DICTIONARY.iter().filter(|&&b| b == b' ').count(), 40);
    }
}
