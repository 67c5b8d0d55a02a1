//! The zlib dictionary every SPDY/3 header block is compressed against (SPDY/3 draft, section
//! 2.6.10.1). It is protocol data, not code: 65 header names and tokens, each prefixed with its
//! length as a big-endian u32, followed by a run of common values. Both peers must use exactly
//! these 1,423 bytes, or the first header block of a connection fails with a dictionary mismatch.

/// Length-prefixed entries, in the order the specification lists them.
const ENTRIES: [&str; 65] = [
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The unprefixed tail: status codes, reason phrases, dates and common header values.
const TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// Size fixed by the specification; a wrong entry above fails to compile.
pub(crate) const LEN: usize = 1423;

/// The dictionary bytes, assembled at compile time.
pub(crate) static DICTIONARY: [u8; LEN] = build();

const fn build() -> [u8; LEN] {
    let mut out = [0u8; LEN];
    let mut at = 0;
    let mut e = 0;
    while e < ENTRIES.len() {
        let name = ENTRIES[e].as_bytes();
        let len = (name.len() as u32).to_be_bytes();
        let mut i = 0;
        while i < 4 {
            out[at] = len[i];
            at += 1;
            i += 1;
        }
        let mut j = 0;
        while j < name.len() {
            out[at] = name[j];
            at += 1;
            j += 1;
        }
        e += 1;
    }
    let tail = TAIL.as_bytes();
    let mut k = 0;
    while k < tail.len() {
        out[at] = tail[k];
        at += 1;
        k += 1;
    }
    // Any mismatch between the entries and LEN stops the build here.
    assert!(at == LEN, "SPDY dictionary length mismatch");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Adler-32 as zlib computes it; a zlib stream names its dictionary by this checksum.
    fn adler32(data: &[u8]) -> u32 {
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in data {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        (b << 16) | a
    }

    #[test]
    fn dictionary_matches_the_specification() {
        assert_eq!(DICTIONARY.len(), 1423);
        // The DICTID every SPDY/3 peer (Go's spdystream included) puts in its zlib header.
        assert_eq!(adler32(&DICTIONARY), 0xe3c6_a7c2);
        assert_eq!(&DICTIONARY[..11], b"\0\0\0\x07options");
        assert!(DICTIONARY.ends_with(b"enq=0."));
    }
}
