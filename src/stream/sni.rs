//! The server name of a TLS ClientHello, read without terminating TLS: how TLS stream listeners
//! route (and pass through) connections by SNI. Sans-IO: the caller peeks at the socket and
//! calls [`client_hello_sni`] until it stops asking for more.

/// Largest ClientHello record considered (a TLS record's plaintext limit, plus its header).
pub const MAX_HELLO: usize = 5 + (1 << 14);

/// What the bytes seen so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello, with the server name it asks for (lower-case), if any.
    Sni(Option<String>),
    /// The first record is not complete yet.
    NeedMore,
    /// Not a TLS ClientHello.
    NotTls,
}

/// A big-endian cursor over a byte slice; every read is bounds-checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(b[0]) << 8 | usize::from(b[1]))
    }
    /// A vector with a `len_bytes`-byte length prefix.
    fn vec(&mut self, len_bytes: usize) -> Option<&'a [u8]> {
        let len = if len_bytes == 1 { self.u8()? } else { self.u16()? };
        self.take(len)
    }
}

/// Reads the SNI of the ClientHello at the start of `buf` (the first TLS record only: a
/// ClientHello larger than one record has no SNI as far as routing is concerned).
pub fn client_hello_sni(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::NeedMore;
    }
    // Record: content type 22 (handshake), version 3.x, length.
    if buf[0] != 22 || (buf.len() > 1 && buf[1] != 3) {
        return Hello::NotTls;
    }
    if buf.len() < 5 {
        return Hello::NeedMore;
    }
    let len = usize::from(buf[3]) << 8 | usize::from(buf[4]);
    if len == 0 || len > 1 << 14 {
        return Hello::NotTls;
    }
    if buf.len() < 5 + len {
        return Hello::NeedMore;
    }
    let mut r = Reader(&buf[5..5 + len]);
    // Handshake header: type 1 (ClientHello), 24-bit length (may exceed this record).
    match r.u8() {
        Some(1) => {}
        _ => return Hello::NotTls,
    }
    if r.take(3).is_none() {
        return Hello::NotTls;
    }
    Hello::Sni(server_name(&mut r))
}

/// Walks the ClientHello body to the server_name extension.
fn server_name(r: &mut Reader<'_>) -> Option<String> {
    r.take(2 + 32)?; // legacy_version, random
    r.vec(1)?; // legacy_session_id
    r.vec(2)?; // cipher_suites
    r.vec(1)?; // legacy_compression_methods
    let mut exts = Reader(r.vec(2)?);
    while let Some(kind) = exts.u16() {
        let body = exts.vec(2)?;
        if kind != 0 {
            continue;
        }
        let mut list = Reader(Reader(body).vec(2)?);
        while let Some(name_type) = list.u8() {
            let name = list.vec(2)?;
            if name_type == 0 {
                let name = std::str::from_utf8(name).ok()?;
                let name = name.strip_suffix('.').unwrap_or(name);
                let valid = !name.is_empty()
                    && name.len() <= 253
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
                return valid.then(|| name.to_ascii_lowercase());
            }
        }
        return None;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello as rustls writes it for `name`.
    fn hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth());
        let config = match config {
            Ok(c) => std::sync::Arc::new(c),
            Err(e) => panic!("{e}"),
        };
        let server = match rustls::pki_types::ServerName::try_from(name.to_owned()) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        let mut conn = match rustls::ClientConnection::new(config, server) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let mut out = Vec::new();
        while conn.wants_write() {
            if conn.write_tls(&mut out).is_err() {
                break;
            }
        }
        out
    }

    #[test]
    fn reads_the_sni_of_a_real_client_hello() {
        let h = hello("DB.Example.com");
        assert_eq!(client_hello_sni(&h), Hello::Sni(Some("db.example.com".into())));
        // Every prefix asks for more; nothing panics.
        for cut in 0..h.len() {
            assert_eq!(client_hello_sni(&h[..cut]), Hello::NeedMore, "cut at {cut}");
        }
    }

    #[test]
    fn no_sni_and_not_tls() {
        let h = hello("127.0.0.1");
        assert_eq!(client_hello_sni(&h), Hello::Sni(None));
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(client_hello_sni(&[22, 3, 1, 0, 0]), Hello::NotTls);
        assert_eq!(client_hello_sni(&[22, 3, 1, 0, 4, 2, 0, 0, 0]), Hello::NotTls);
    }
}
