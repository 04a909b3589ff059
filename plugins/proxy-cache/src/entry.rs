//! A stored response (status, headers, body, when it was stored and until when it is fresh, the
//! request header values its `Vary` names) and its file format on disk.
//!
//! A file is one entry, written whole to a temporary file and renamed into place, so a reader
//! only ever opens a complete file or none. What it holds, little-endian:
//!
//! ```text
//! magic "WPCACHE1" | stored_at_ms u64 | expires_at_ms u64 | meta_len u32 | body_len u64
//! meta (status u16, key, headers, vary values) | body | xxh3-64 of everything before
//! ```
//!
//! The head alone says how long the file must be, which is how the index rebuilt at start tells
//! a file cut short (a crash of the machine between write and flush) without reading its body;
//! the checksum, verified on every read, catches any other damage. Decoding trusts no length.

use std::io::Write;

use weir_plugin::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use weir_plugin::Bytes;
use xxhash_rust::xxh3::Xxh3;

/// File magic and format version.
pub const MAGIC: &[u8; 8] = b"WPCACHE1";
/// Bytes of the fixed head.
pub const HEAD_LEN: usize = 36;
/// Bytes of the trailing checksum.
const SUM_LEN: usize = 8;
/// Most headers (and `Vary` names) an entry may carry.
const MAX_FIELDS: usize = 1024;

/// A stored response.
#[derive(Debug)]
pub struct Entry {
    /// The whole cache key (compared on every hit: a digest match alone never serves).
    pub key: Box<[u8]>,
    /// Status.
    pub status: StatusCode,
    /// Headers as stored (no framing, no per-request headers).
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// When it was stored (Unix milliseconds).
    pub stored_at_ms: u64,
    /// Until when it is fresh (Unix milliseconds).
    pub expires_at_ms: u64,
    /// The request's values of the headers the response's `Vary` names (`None`: absent).
    pub vary: Vec<(HeaderName, Option<HeaderValue>)>,
}

/// Why a file was not an entry.
#[derive(Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter or longer than its head says, or its head is cut: written partly.
    Torn,
    /// Anything else: a wrong magic or checksum, a length or field that does not parse.
    Corrupt(&'static str),
}

/// What the fixed head of a file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHead {
    /// When the entry was stored.
    pub stored_at_ms: u64,
    /// Until when it is fresh.
    pub expires_at_ms: u64,
    /// The length the file must have.
    pub total_len: u64,
}

impl Entry {
    /// Bytes the entry holds in memory (an estimate: key, headers, body and bookkeeping).
    pub fn weight(&self) -> u64 {
        let fields: usize = self.headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 48).sum();
        let vary: usize =
            self.vary.iter().map(|(k, v)| k.as_str().len() + v.as_ref().map_or(0, |v| v.len()) + 48).sum();
        (self.key.len() + fields + vary + self.body.len() + 160) as u64
    }

    /// Whether it is still fresh at `now_ms`.
    pub fn is_fresh(&self, now_ms: u64) -> bool {
        now_ms < self.expires_at_ms
    }

    /// Whole seconds since it was stored (`Age`).
    pub fn age_secs(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.stored_at_ms) / 1000
    }

    /// Whether a request with `headers` may be served this entry: every header its `Vary`
    /// named has the value it had in the request that stored it.
    pub fn vary_matches(&self, headers: &HeaderMap) -> bool {
        self.vary.iter().all(|(name, stored)| combined(headers, name).as_ref() == stored.as_ref())
    }

    /// Bytes of the file this entry is written as.
    pub fn file_len(&self) -> u64 {
        (HEAD_LEN + self.meta().len() + self.body.len() + SUM_LEN) as u64
    }

    /// Writes the entry in the file format to `out` (no copy of the body is made).
    pub fn write_to(&self, out: &mut impl Write) -> std::io::Result<()> {
        let meta = self.meta();
        let mut head = Vec::with_capacity(HEAD_LEN + meta.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&self.stored_at_ms.to_le_bytes());
        head.extend_from_slice(&self.expires_at_ms.to_le_bytes());
        head.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        head.extend_from_slice(&(self.body.len() as u64).to_le_bytes());
        head.extend_from_slice(&meta);
        let mut sum = Xxh3::new();
        sum.update(&head);
        sum.update(&self.body);
        out.write_all(&head)?;
        out.write_all(&self.body)?;
        out.write_all(&sum.digest().to_le_bytes())
    }

    /// The entry in the file format, as one buffer (tests; files are written with `write_to`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.file_len() as usize);
        let _ = self.write_to(&mut out);
        out
    }

    fn meta(&self) -> Vec<u8> {
        let mut m = Vec::with_capacity(64 + self.key.len());
        m.extend_from_slice(&self.status.as_u16().to_le_bytes());
        m.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        m.extend_from_slice(&self.key);
        let fields: Vec<(&HeaderName, &HeaderValue)> = self.headers.iter().take(MAX_FIELDS).collect();
        m.extend_from_slice(&(fields.len() as u16).to_le_bytes());
        for (k, v) in fields {
            put_name(&mut m, k);
            m.extend_from_slice(&(v.len() as u32).to_le_bytes());
            m.extend_from_slice(v.as_bytes());
        }
        m.extend_from_slice(&(self.vary.len().min(MAX_FIELDS) as u16).to_le_bytes());
        for (k, v) in self.vary.iter().take(MAX_FIELDS) {
            put_name(&mut m, k);
            match v {
                None => m.push(0),
                Some(v) => {
                    m.push(1);
                    m.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    m.extend_from_slice(v.as_bytes());
                }
            }
        }
        m
    }

    /// Reads a whole file. The body is a slice of `file` (no copy).
    pub fn decode(file: Bytes) -> Result<Entry, DecodeError> {
        let head = read_head(&file)?;
        if head.total_len != file.len() as u64 {
            return Err(DecodeError::Torn);
        }
        let (data, sum) = file.split_at(file.len() - SUM_LEN);
        let stored = u64::from_le_bytes(sum.try_into().map_err(|_| DecodeError::Torn)?);
        if xxhash_rust::xxh3::xxh3_64(data) != stored {
            return Err(DecodeError::Corrupt("checksum mismatch"));
        }
        let meta_len = u32::from_le_bytes(fixed(&file[24..28])?) as usize;
        let mut r = Reader { buf: &file[HEAD_LEN..HEAD_LEN + meta_len] };
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError::Corrupt("status"))?;
        let key_len = r.u32()? as usize;
        let key: Box<[u8]> = r.take(key_len)?.into();
        let n = r.u16()? as usize;
        if n > MAX_FIELDS {
            return Err(DecodeError::Corrupt("too many headers"));
        }
        let mut headers = HeaderMap::with_capacity(n);
        for _ in 0..n {
            let name = r.name()?;
            let len = r.u32()? as usize;
            let value = HeaderValue::from_bytes(r.take(len)?).map_err(|_| DecodeError::Corrupt("header value"))?;
            headers.append(name, value);
        }
        let n = r.u16()? as usize;
        if n > MAX_FIELDS {
            return Err(DecodeError::Corrupt("too many vary names"));
        }
        let mut vary = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.name()?;
            let value = match r.take(1)? {
                [0] => None,
                [1] => {
                    let len = r.u32()? as usize;
                    Some(HeaderValue::from_bytes(r.take(len)?).map_err(|_| DecodeError::Corrupt("vary value"))?)
                }
                _ => return Err(DecodeError::Corrupt("vary flag")),
            };
            vary.push((name, value));
        }
        if !r.buf.is_empty() {
            return Err(DecodeError::Corrupt("meta longer than its fields"));
        }
        let body_start = HEAD_LEN + meta_len;
        let body = file.slice(body_start..file.len() - SUM_LEN);
        Ok(Entry {
            key,
            status,
            headers,
            body,
            stored_at_ms: head.stored_at_ms,
            expires_at_ms: head.expires_at_ms,
            vary,
        })
    }
}

/// The fixed head of a file (its first [`HEAD_LEN`] bytes, or more).
pub fn read_head(bytes: &[u8]) -> Result<FileHead, DecodeError> {
    let head = bytes.get(..HEAD_LEN).ok_or(DecodeError::Torn)?;
    if &head[..8] != MAGIC {
        return Err(DecodeError::Corrupt("not an entry file"));
    }
    let stored_at_ms = u64::from_le_bytes(fixed(&head[8..16])?);
    let expires_at_ms = u64::from_le_bytes(fixed(&head[16..24])?);
    let meta_len = u64::from(u32::from_le_bytes(fixed(&head[24..28])?));
    let body_len = u64::from_le_bytes(fixed(&head[28..36])?);
    let total_len = (HEAD_LEN as u64 + SUM_LEN as u64)
        .checked_add(meta_len)
        .and_then(|n| n.checked_add(body_len))
        .ok_or(DecodeError::Corrupt("lengths overflow"))?;
    Ok(FileHead { stored_at_ms, expires_at_ms, total_len })
}

/// The values of `name` in `headers`, joined with `, ` (`None` when absent).
pub fn combined(headers: &HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let mut rest = values.peekable();
    if rest.peek().is_none() {
        return Some(first.clone());
    }
    let mut joined = first.as_bytes().to_vec();
    for v in rest {
        joined.extend_from_slice(b", ");
        joined.extend_from_slice(v.as_bytes());
    }
    HeaderValue::from_bytes(&joined).ok()
}

fn put_name(m: &mut Vec<u8>, name: &HeaderName) {
    m.extend_from_slice(&(name.as_str().len() as u16).to_le_bytes());
    m.extend_from_slice(name.as_str().as_bytes());
}

fn fixed<const N: usize>(b: &[u8]) -> Result<[u8; N], DecodeError> {
    b.try_into().map_err(|_| DecodeError::Torn)
}

/// Reads fields off a byte slice, refusing any length that runs past its end.
struct Reader<'b> {
    buf: &'b [u8],
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], DecodeError> {
        if n > self.buf.len() {
            return Err(DecodeError::Corrupt("a length runs past the meta"));
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(fixed(self.take(2)?)?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(fixed(self.take(4)?)?))
    }
    fn name(&mut self) -> Result<HeaderName, DecodeError> {
        let len = self.u16()? as usize;
        HeaderName::from_bytes(self.take(len)?).map_err(|_| DecodeError::Corrupt("header name"))
    }
}

/// Fuzzing entry point: any bytes as an entry file, and the same bytes with a valid checksum
/// appended (so that the fuzzer reaches the meta parser behind it). Decoding never panics, and
/// an entry that decodes is written back as a file that decodes to the same entry.
#[doc(hidden)]
pub fn fuzz_file(data: &[u8]) {
    let _ = Entry::decode(Bytes::copy_from_slice(data));
    let mut summed = data.to_vec();
    summed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(data).to_le_bytes());
    let Ok(e) = Entry::decode(Bytes::from(summed)) else { return };
    let again = match Entry::decode(Bytes::from(e.encode())) {
        Ok(a) => a,
        Err(why) => panic!("a decoded entry does not decode once written back: {why:?}"),
    };
    assert_eq!((again.status, &again.key, &again.body), (e.status, &e.key, &e.body));
    assert_eq!((again.stored_at_ms, again.expires_at_ms), (e.stored_at_ms, e.expires_at_ms));
    assert_eq!(again.headers, e.headers);
    assert_eq!(again.vary, e.vary);
    assert_eq!(again.file_len(), e.file_len());
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample(body: &'static [u8]) -> Entry {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.append("x-multi", HeaderValue::from_static("a"));
        headers.append("x-multi", HeaderValue::from_bytes(b"b\xff").unwrap_or(HeaderValue::from_static("b")));
        Entry {
            key: b"key".to_vec().into(),
            status: StatusCode::NOT_FOUND,
            headers,
            body: Bytes::from_static(body),
            stored_at_ms: 1_000,
            expires_at_ms: 61_000,
            vary: vec![
                (HeaderName::from_static("accept-encoding"), Some(HeaderValue::from_static("gzip"))),
                (HeaderName::from_static("x-none"), None),
            ],
        }
    }

    #[test]
    fn the_fuzz_entry_point_reaches_the_meta_parser() {
        // The harness appends the checksum: a real file without its own decodes there.
        let file = sample(b"fuzz").encode();
        let data = &file[..file.len() - SUM_LEN];
        let mut summed = data.to_vec();
        summed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(data).to_le_bytes());
        assert!(Entry::decode(Bytes::from(summed)).is_ok());
        fuzz_file(data);
        fuzz_file(&file);
        // The seed corpus holds such files too (tests/fuzz_corpus.rs runs them).
        let seed = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/cache_entry/plain");
        if let Ok(seed) = std::fs::read(seed) {
            let mut summed = seed.clone();
            summed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&seed).to_le_bytes());
            assert!(Entry::decode(Bytes::from(summed)).is_ok(), "the `plain` seed is a valid file");
        }
    }

    #[test]
    fn an_entry_survives_its_file_format() {
        let e = sample(b"hello body");
        let file = e.encode();
        assert_eq!(file.len() as u64, e.file_len());
        let d = Entry::decode(Bytes::from(file)).unwrap_or_else(|err| panic!("{err:?}"));
        assert_eq!((d.status, &*d.key, &d.body[..]), (StatusCode::NOT_FOUND, &b"key"[..], &b"hello body"[..]));
        assert_eq!(d.headers, e.headers);
        assert_eq!(d.vary, e.vary);
        assert_eq!((d.stored_at_ms, d.expires_at_ms), (1_000, 61_000));
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let file = sample(b"0123456789abcdef").encode();
        for cut in 0..file.len() {
            let r = Entry::decode(Bytes::copy_from_slice(&file[..cut]));
            assert!(r.is_err(), "cut at {cut} decoded");
            if cut >= HEAD_LEN {
                assert_eq!(r.err(), Some(DecodeError::Torn), "cut at {cut}");
            }
        }
        for at in 0..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 0x40;
            assert!(Entry::decode(Bytes::from(bad)).is_err(), "flip at {at} decoded");
        }
        let mut longer = file.clone();
        longer.push(0);
        assert_eq!(Entry::decode(Bytes::from(longer)).err(), Some(DecodeError::Torn));
    }

    #[test]
    fn hostile_lengths_with_a_valid_checksum_are_refused() {
        // A file whose checksum matches but whose meta claims a key longer than the meta.
        let e = sample(b"x");
        let mut file = e.encode();
        file.truncate(file.len() - SUM_LEN);
        let key_len_at = HEAD_LEN + 2;
        file[key_len_at..key_len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let sum = xxhash_rust::xxh3::xxh3_64(&file);
        file.extend_from_slice(&sum.to_le_bytes());
        assert!(matches!(Entry::decode(Bytes::from(file)), Err(DecodeError::Corrupt(_))));
        let head = read_head(&[b'W'; 40]);
        assert!(head.is_err());
    }

    #[test]
    fn vary_compares_the_request_values() {
        let e = sample(b"");
        let mut h = HeaderMap::new();
        assert!(!e.vary_matches(&h), "accept-encoding absent");
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        assert!(e.vary_matches(&h));
        h.insert("x-none", HeaderValue::from_static("1"));
        assert!(!e.vary_matches(&h), "a header absent at store time is present now");
        let mut two = HeaderMap::new();
        two.append("a", HeaderValue::from_static("1"));
        two.append("a", HeaderValue::from_static("2"));
        assert_eq!(combined(&two, &HeaderName::from_static("a")), Some(HeaderValue::from_static("1, 2")));
    }
}
