//! The session and login cookies: AES-256-GCM (`ring::aead`) under a key derived with HKDF from
//! `session.secret`, so a cookie is both secret and tamper-evident; nothing is stored on the
//! server. Each cookie's purpose is bound as associated data (a login cookie never opens as a
//! session). A value longer than [`CHUNK`] is split over `name`, `name_2`, ... `name_8`.

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use weir_plugin::http::{header, HeaderMap, HeaderValue};

/// The largest cookie value written; longer sessions are split.
pub const CHUNK: usize = 3500;
/// The most cookies one session is split over.
pub const MAX_CHUNKS: usize = 8;

/// Associated data of session cookies.
pub const SESSION: &[u8] = b"weir-oidc-session-v1";
/// Associated data of login (state) cookies.
pub const LOGIN: &[u8] = b"weir-oidc-login-v1";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Encrypts and authenticates cookie values with one configuration's key.
pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

impl Sealer {
    /// The sealer of `secret` (HKDF-SHA256, a fixed salt, info naming the use).
    pub fn new(secret: &str) -> Sealer {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, b"weir openid-connect").extract(secret.as_bytes());
        let mut raw = [0u8; 32];
        // Expanding 32 bytes from SHA-256 cannot fail (the limit is 255 * 32).
        if let Ok(okm) = prk.expand(&[b"cookie aes-256-gcm"], Len32) {
            let _ = okm.fill(&mut raw);
        }
        let key = UnboundKey::new(&AES_256_GCM, &raw).map(LessSafeKey::new);
        Sealer {
            key: key.unwrap_or_else(|_| unreachable!("a 32-byte key is valid for AES-256-GCM")),
            rng: SystemRandom::new(),
        }
    }

    /// `base64url(nonce | ciphertext | tag)` of `plain`, bound to `purpose`.
    pub fn seal(&self, purpose: &[u8], plain: &[u8]) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut buf = plain.to_vec();
        self.key.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(purpose), &mut buf).ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Some(B64.encode(out))
    }

    /// The plaintext of a value made by [`Sealer::seal`] for `purpose`; `None` when it was
    /// altered, made with another key or for another purpose.
    pub fn open(&self, purpose: &[u8], text: &str) -> Option<Vec<u8>> {
        let mut raw = B64.decode(text).ok()?;
        if raw.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return None;
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&raw[..NONCE_LEN]);
        let plain = self
            .key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(purpose), &mut raw[NONCE_LEN..])
            .ok()?;
        Some(plain.to_vec())
    }

    /// A random URL-safe string of `n` bytes of entropy (state, nonce, PKCE verifier).
    pub fn random(&self, n: usize) -> Option<String> {
        let mut b = vec![0u8; n];
        self.rng.fill(&mut b).ok()?;
        Some(B64.encode(b))
    }
}

/// A logged-in session, as kept (encrypted) in the session cookie.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Session {
    /// The ID token's verified claims.
    pub claims: Map<String, Value>,
    /// The ID token as issued (`id_token_hint`, `X-Raw-ID-Token`).
    pub id_token: String,
    /// The access token.
    #[serde(default)]
    pub access_token: Option<String>,
    /// The refresh token.
    #[serde(default)]
    pub refresh_token: Option<String>,
    /// When the tokens expire (Unix seconds): renewal, or a new login, after that.
    pub expires_at: i64,
    /// The userinfo endpoint's answer.
    #[serde(default)]
    pub userinfo: Option<Value>,
    /// The session ends at this time whatever the tokens say (`absolute_timeout`).
    pub until: i64,
}

/// A login in progress, kept in a short-lived cookie between the redirect to the provider and
/// the callback.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Login {
    /// `state`.
    pub state: String,
    /// `nonce`.
    pub nonce: String,
    /// The PKCE verifier.
    #[serde(default)]
    pub verifier: Option<String>,
    /// Where to go back to.
    pub original_url: String,
    /// The `redirect_uri` sent (the token request repeats it).
    pub redirect_uri: String,
    /// The login cookie is refused after this time.
    pub until: i64,
}

/// The value of cookie `name` in the request's `Cookie` headers (the first one of that name).
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|line| {
        line.split(';').find_map(|kv| kv.trim().split_once('=').filter(|(k, _)| *k == name).map(|(_, v)| v.trim()))
    })
}

/// The name of chunk `i` (0-based) of cookie `name`.
pub fn chunk_name(name: &str, i: usize) -> String {
    if i == 0 {
        name.to_owned()
    } else {
        format!("{name}_{}", i + 1)
    }
}

/// A (possibly split) cookie value put back together, and how many cookies it took.
pub fn read_split(headers: &HeaderMap, name: &str) -> Option<(String, usize)> {
    let first = cookie(headers, name)?;
    let Some((n, rest)) = first.split_once('.') else { return Some((first.to_owned(), 1)) };
    let n: usize = n.parse().ok().filter(|n| (2..=MAX_CHUNKS).contains(n))?;
    let mut value = rest.to_owned();
    for i in 1..n {
        value.push_str(cookie(headers, &chunk_name(name, i))?);
    }
    Some((value, n))
}

/// The cookie values of `value` split for `name`: `[(cookie name, cookie value)]`; `None`
/// when it needs more than [`MAX_CHUNKS`] cookies.
pub fn split(name: &str, value: &str) -> Option<Vec<(String, String)>> {
    if value.len() <= CHUNK {
        return Some(vec![(name.to_owned(), value.to_owned())]);
    }
    // `value` is base64url (ASCII): any byte offset is a character boundary.
    let parts: Vec<&str> = value.as_bytes().chunks(CHUNK).filter_map(|c| std::str::from_utf8(c).ok()).collect();
    if parts.len() > MAX_CHUNKS {
        return None;
    }
    Some(
        parts
            .iter()
            .enumerate()
            .map(|(i, p)| (chunk_name(name, i), if i == 0 { format!("{}.{p}", parts.len()) } else { (*p).to_owned() }))
            .collect(),
    )
}

/// A session opened from the request's cookies (`None`: none, altered, or past its `until`),
/// and how many cookies it took.
pub fn read_session(sealer: &Sealer, headers: &HeaderMap, name: &str, now: i64) -> (Option<Session>, usize) {
    let Some((value, n)) = read_split(headers, name) else { return (None, 0) };
    let session = sealer
        .open(SESSION, &value)
        .and_then(|plain| serde_json::from_slice::<Session>(&plain).ok())
        .filter(|s| s.until > now);
    (session, n)
}

/// The `Set-Cookie` attributes of one configuration.
#[derive(Debug, Clone)]
pub struct Attributes {
    /// `Path`.
    pub path: String,
    /// `Domain`.
    pub domain: Option<String>,
    /// `Secure` (None: when the request is https).
    pub secure: Option<bool>,
    /// `HttpOnly`.
    pub http_only: bool,
    /// `SameSite` value, if any.
    pub same_site: Option<&'static str>,
}

impl Attributes {
    /// `Set-Cookie: name=value` with these attributes (`max_age` 0 deletes it).
    pub fn set_cookie(&self, name: &str, value: &str, max_age: i64, https: bool) -> Option<HeaderValue> {
        let mut s = format!("{name}={value}; Path={}", self.path);
        if let Some(d) = &self.domain {
            s.push_str("; Domain=");
            s.push_str(d);
        }
        s.push_str(&format!("; Max-Age={}", max_age.max(0)));
        if self.secure.unwrap_or(https) || self.same_site == Some("None") {
            s.push_str("; Secure");
        }
        if self.http_only {
            s.push_str("; HttpOnly");
        }
        if let Some(ss) = self.same_site {
            s.push_str("; SameSite=");
            s.push_str(ss);
        }
        HeaderValue::from_str(&s).ok()
    }
}

/// Fuzzing entry point: any bytes as a `Cookie` header, read and opened as a session and as a
/// login; and any bytes sealed and opened again. Panics when an invariant breaks.
#[doc(hidden)]
pub fn fuzz_cookie(data: &[u8]) {
    let sealer = Sealer::new("fuzzing-secret-0123456789");
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(data) {
        headers.append(header::COOKIE, v);
    }
    let (session, n) = read_session(&sealer, &headers, "session", 0);
    assert!(n <= MAX_CHUNKS);
    assert!(session.is_none(), "a cookie no one sealed opened");
    if let Some(v) = cookie(&headers, "login") {
        assert!(sealer.open(LOGIN, v).is_none());
    }
    let Some(sealed) = sealer.seal(SESSION, data) else { return };
    assert_eq!(sealer.open(SESSION, &sealed).as_deref(), Some(data), "round trip");
    assert!(sealer.open(LOGIN, &sealed).is_none(), "purpose is bound");
    if let Some(parts) = split("session", &sealed) {
        let line = parts.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&line) {
            h.append(header::COOKIE, v);
        }
        assert_eq!(read_split(&h, "session").map(|(v, _)| v).as_deref(), Some(sealed.as_str()), "split round trip");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(big: usize) -> Session {
        let mut claims = Map::new();
        claims.insert("sub".into(), Value::String("alice".into()));
        claims.insert("pad".into(), Value::String("x".repeat(big)));
        Session {
            claims,
            id_token: "h.p.s".into(),
            access_token: Some("at".into()),
            refresh_token: Some("rt".into()),
            expires_at: 100,
            userinfo: None,
            until: 1000,
        }
    }

    fn cookie_header(parts: &[(String, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        let line = parts.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
        h.append(header::COOKIE, HeaderValue::from_str(&format!("other=1; {line}")).unwrap_or_else(|e| panic!("{e}")));
        h
    }

    fn sealed(s: &Sealer, session: &Session) -> String {
        let plain = serde_json::to_vec(session).unwrap_or_else(|e| panic!("{e}"));
        s.seal(SESSION, &plain).unwrap_or_else(|| panic!("seal"))
    }

    #[test]
    fn sessions_round_trip_small_and_split() {
        let s = Sealer::new("0123456789abcdef");
        for big in [10, 9000] {
            let want = session(big);
            let parts = split("session", &sealed(&s, &want)).unwrap_or_else(|| panic!("split"));
            assert_eq!(parts.len() > 1, big > CHUNK, "split only when needed");
            let (got, n) = read_session(&s, &cookie_header(&parts), "session", 10);
            assert_eq!(got.as_ref(), Some(&want));
            assert_eq!(n, parts.len());
            // Past `until`, the session is over.
            assert!(read_session(&s, &cookie_header(&parts), "session", 1000).0.is_none());
        }
    }

    #[test]
    fn altered_foreign_or_missing_chunks_are_refused() {
        let s = Sealer::new("0123456789abcdef");
        let value = sealed(&s, &session(10));
        // Every single-character change is detected.
        let bytes = value.as_bytes();
        for i in [0, bytes.len() / 2, bytes.len() - 1] {
            let mut t = bytes.to_vec();
            t[i] = if t[i] == b'A' { b'B' } else { b'A' };
            let t = String::from_utf8(t).unwrap_or_default();
            assert!(s.open(SESSION, &t).is_none(), "tampered at {i}");
        }
        assert!(Sealer::new("another-secret-0000").open(SESSION, &value).is_none(), "another key");
        assert!(s.open(LOGIN, &value).is_none(), "another purpose");
        assert!(s.open(SESSION, "").is_none() && s.open(SESSION, "!!").is_none());
        let mut parts = split("session", &sealed(&s, &session(9000))).unwrap_or_default();
        parts.pop();
        assert!(read_session(&s, &cookie_header(&parts), "session", 0).0.is_none(), "a chunk missing");
    }

    #[test]
    fn cookie_attributes() {
        let a = Attributes { path: "/".into(), domain: None, secure: None, http_only: true, same_site: Some("Lax") };
        let v = a.set_cookie("session", "v", 60, false).unwrap_or_else(|| panic!("value"));
        assert_eq!(v.to_str().ok(), Some("session=v; Path=/; Max-Age=60; HttpOnly; SameSite=Lax"));
        let v = a.set_cookie("session", "", 0, true).unwrap_or_else(|| panic!("value"));
        assert_eq!(v.to_str().ok(), Some("session=; Path=/; Max-Age=0; Secure; HttpOnly; SameSite=Lax"));
    }

    #[test]
    fn fuzz_entry_holds_on_samples() {
        for d in [&b""[..], b"session=abc", b"session=3.aaa; session_2=bbb", b"session=9.x", b"\xff\x00", b"login=AAAA"]
        {
            fuzz_cookie(d);
        }
    }
}
