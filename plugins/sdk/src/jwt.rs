//! JSON Web Tokens for auth plugins (jwt-auth, openid-connect): a strict parser, a verifier
//! whose algorithm is fixed by configuration, APISIX's claim checks, and a bounded cache of
//! verified tokens for the costly public-key algorithms.
//!
//! What makes it hard to fool:
//! - [`parse`] takes compact tokens only: three base64url segments (no padding, no stray bytes),
//!   at most [`MAX_TOKEN`] bytes, a header and payload that are JSON objects without duplicate
//!   keys (so `{"alg":"HS256","alg":"none"}` is refused, not read either way).
//! - A [`Verifier`] is built from a credential: its algorithm and its key. A token whose `alg`
//!   differs, `none` included, is refused before any cryptography; an RSA public key can never
//!   be used as an HMAC secret, because the key material is typed by the configured algorithm.
//! - [`check_times`] is APISIX's: `exp`/`nbf` checked when present (or required when listed in
//!   `claims_to_verify`), with a leeway.
//!
//! ```
//! use weir_plugin::jwt::{self, Verifier};
//! // header {"alg":"HS256","typ":"JWT"}, payload {"key":"user-key","exp":4102444800}, secret "my-secret-key"
//! let token = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJrZXkiOiJ1c2VyLWtleSIsImV4cCI6NDEwMjQ0NDgwMH0.\
//!              Vvic3mhd6gbgARxkxqhMpPP3ztQv08bELL9zrsGED8o";
//! let t = jwt::parse(token).expect("well-formed");
//! assert_eq!(t.claims["key"], "user-key");
//! let v = Verifier::new("HS256", jwt::Key::Secret(b"my-secret-key")).expect("valid");
//! assert!(v.verify(&t).is_ok());
//! assert!(Verifier::new("HS256", jwt::Key::Secret(b"other")).expect("valid").verify(&t).is_err());
//! ```

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::auth::ct_eq;
use crate::Consumer;

/// The longest token taken (bytes); longer ones are refused unread.
pub const MAX_TOKEN: usize = 16 * 1024;

/// The algorithms a credential may name (APISIX's list but ES512, which the verifier lacks).
pub const ALGORITHMS: &[&str] =
    &["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "PS384", "PS512", "EdDSA"];

/// Why a token was refused. The text names the reason only, never the token or a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn refused(why: impl Into<String>) -> Refused {
    Refused(why.into())
}

/// A parsed (not yet verified) token.
pub struct Token<'a> {
    /// `header.payload`: what the signature covers.
    pub signed: &'a str,
    /// The signature segment (base64url).
    pub signature: &'a str,
    /// The header's `alg`.
    pub alg: String,
    /// The header's `kid`, if any.
    pub kid: Option<String>,
    /// The payload's claims.
    pub claims: Map<String, Value>,
}

/// A JSON object whose keys are unique (serde_json keeps the last of duplicates silently).
struct StrictObject(Map<String, Value>);

impl<'de> Deserialize<'de> for StrictObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrictObject;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<StrictObject, A::Error> {
                let mut out = Map::new();
                while let Some((k, v)) = m.next_entry::<String, Value>()? {
                    if out.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!("duplicate key `{k}`")));
                    }
                    out.insert(k, v);
                }
                Ok(StrictObject(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn segment(name: &str, b64: &str) -> Result<Map<String, Value>, Refused> {
    let bytes = URL_SAFE_NO_PAD.decode(b64).map_err(|_| refused(format!("the {name} is not base64url")))?;
    serde_json::from_slice::<StrictObject>(&bytes)
        .map(|o| o.0)
        .map_err(|e| refused(format!("the {name} is not a JSON object: {e}")))
}

/// Parses a compact JWS token (see the module documentation for what is refused).
pub fn parse(token: &str) -> Result<Token<'_>, Refused> {
    if token.len() > MAX_TOKEN {
        return Err(refused("the token is too long"));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(refused("a token has three dot-separated parts"));
    };
    if h.is_empty() || p.is_empty() {
        return Err(refused("a token has three dot-separated parts"));
    }
    let mut header = segment("header", h)?;
    let claims = segment("payload", p)?;
    let alg = match header.remove("alg") {
        Some(Value::String(a)) => a,
        _ => return Err(refused("the header has no `alg`")),
    };
    if header.contains_key("crit") {
        return Err(refused("the header has critical extensions"));
    }
    let kid = match header.remove("kid") {
        Some(Value::String(k)) => Some(k),
        None => None,
        Some(_) => return Err(refused("the header's `kid` is not a string")),
    };
    let signed = &token[..h.len() + 1 + p.len()];
    Ok(Token { signed, signature: s, alg, kid, claims })
}

/// Key material for a [`Verifier`], typed by what the configuration gave.
pub enum Key<'a> {
    /// An HMAC secret (HS*).
    Secret(&'a [u8]),
    /// A PEM public key (RS*, PS*: RSA; ES*: EC; EdDSA: Ed25519).
    Pem(&'a str),
    /// A ready key (for example from a JWK, by openid-connect).
    Decoding(DecodingKey),
}

/// A signature check with one algorithm and one key (a credential's).
#[derive(Clone)]
pub struct Verifier {
    name: &'static str,
    alg: Algorithm,
    key: Arc<DecodingKey>,
    /// HS*: the HMAC key, scheduled once (not once per token).
    hmac: Option<Arc<ring::hmac::Key>>,
}

impl Verifier {
    /// The verifier of algorithm `name` (one of [`ALGORITHMS`]) with `key`. An error says why
    /// the pair cannot work (unknown algorithm, a secret for a public-key algorithm, a PEM that
    /// does not parse), never quoting the key.
    pub fn new(name: &str, key: Key<'_>) -> Result<Self, String> {
        let (name, alg) = algorithm(name)
            .ok_or_else(|| format!("algorithm `{name}` is not supported (supported: {})", ALGORITHMS.join(", ")))?;
        let family = &name[..2];
        let mut hmac = None;
        let key = match (family, key) {
            ("HS", Key::Secret(s)) => {
                let h = match alg {
                    Algorithm::HS384 => ring::hmac::HMAC_SHA384,
                    Algorithm::HS512 => ring::hmac::HMAC_SHA512,
                    _ => ring::hmac::HMAC_SHA256,
                };
                hmac = Some(Arc::new(ring::hmac::Key::new(h, s)));
                DecodingKey::from_secret(s)
            }
            ("HS", _) => return Err(format!("{name} verifies with a secret, not a public key")),
            (_, Key::Secret(_)) => return Err(format!("{name} verifies with a public key, not a secret")),
            ("RS" | "PS", Key::Pem(p)) => DecodingKey::from_rsa_pem(p.as_bytes())
                .map_err(|e| format!("public_key: not an RSA PEM public key ({e})"))?,
            ("ES", Key::Pem(p)) => DecodingKey::from_ec_pem(p.as_bytes())
                .map_err(|e| format!("public_key: not an EC PEM public key ({e})"))?,
            (_, Key::Pem(p)) => DecodingKey::from_ed_pem(p.as_bytes())
                .map_err(|e| format!("public_key: not an Ed25519 PEM public key ({e})"))?,
            (_, Key::Decoding(k)) => k,
        };
        Ok(Verifier { name, alg, key: Arc::new(key), hmac })
    }

    /// The verifier of `alg` (one of [`ALGORITHMS`]) with `key`, for callers that chose the
    /// algorithm as a [`jsonwebtoken::Algorithm`] (openid-connect, from a JWK or its allowed
    /// list) rather than by name: the same checks and errors as [`Verifier::new`].
    ///
    /// ```
    /// use jsonwebtoken::Algorithm;
    /// use weir_plugin::jwt::{Key, Verifier};
    /// let v = Verifier::with_algorithm(Algorithm::HS384, Key::Secret(b"s")).expect("valid");
    /// assert_eq!(v.algorithm(), "HS384");
    /// ```
    pub fn with_algorithm(alg: Algorithm, key: Key<'_>) -> Result<Self, String> {
        let name = algorithm_name(alg)
            .ok_or_else(|| format!("algorithm `{alg:?}` is not supported (supported: {})", ALGORITHMS.join(", ")))?;
        Verifier::new(name, key)
    }

    /// The configured algorithm's name.
    pub fn algorithm(&self) -> &'static str {
        self.name
    }

    /// Whether this algorithm is a public-key one.
    pub fn is_public_key(&self) -> bool {
        !self.name.starts_with("HS")
    }

    /// Checks the token's `alg` is exactly the configured one, then its signature.
    pub fn verify(&self, token: &Token<'_>) -> Result<(), Refused> {
        if token.alg != self.name {
            return Err(refused(format!("algorithm mismatch, expected {}", self.name)));
        }
        if let Some(key) = &self.hmac {
            let Ok(mac) = URL_SAFE_NO_PAD.decode(token.signature) else { return Err(refused("signature mismatch")) };
            // Constant-time comparison inside ring.
            return ring::hmac::verify(key, token.signed.as_bytes(), &mac).map_err(|_| refused("signature mismatch"));
        }
        match jsonwebtoken::crypto::verify(token.signature, token.signed.as_bytes(), &self.key, self.alg) {
            Ok(true) => Ok(()),
            _ => Err(refused("signature mismatch")),
        }
    }
}

/// `(canonical name, algorithm)` of a configured algorithm name; `none` and unknown names are
/// `None`.
pub fn algorithm(name: &str) -> Option<(&'static str, Algorithm)> {
    let found = ALGORITHMS.iter().copied().find(|a| *a == name)?;
    let alg = match found {
        "HS256" => Algorithm::HS256,
        "HS384" => Algorithm::HS384,
        "HS512" => Algorithm::HS512,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "PS256" => Algorithm::PS256,
        "PS384" => Algorithm::PS384,
        "PS512" => Algorithm::PS512,
        _ => Algorithm::EdDSA,
    };
    Some((found, alg))
}

/// The name of `alg` in [`ALGORITHMS`] (`None`: one the verifier lacks); the inverse of
/// [`algorithm`].
pub fn algorithm_name(alg: Algorithm) -> Option<&'static str> {
    ALGORITHMS.iter().copied().find(|n| algorithm(n).is_some_and(|(_, a)| a == alg))
}

/// APISIX's claim checks at `now` (Unix seconds) with `leeway` seconds: without `required`,
/// `exp` and `nbf` are checked when present; with it, each listed claim must be present and
/// valid. Returns the time (Unix seconds) the token stops being valid, if it has `exp`.
pub fn check_times(
    claims: &Map<String, Value>,
    required: &[String],
    now: i64,
    leeway: i64,
) -> Result<Option<i64>, Refused> {
    let check = |name: &str, must: bool| -> Result<Option<i64>, Refused> {
        let Some(v) = claims.get(name) else {
            return if must { Err(refused(format!("claim {name} is missing"))) } else { Ok(None) };
        };
        let Some(t) = v.as_f64() else { return Err(refused(format!("claim {name} is not a number"))) };
        // Saturating: a hostile 1e300 is just "far away".
        let t = t as i64;
        match name {
            "exp" if t <= now.saturating_sub(leeway) => Err(refused("the token has expired ('exp')")),
            "nbf" if t >= now.saturating_add(leeway) => Err(refused("the token is not valid yet ('nbf')")),
            _ => Ok(Some(t)),
        }
    };
    let (exp, nbf) = if required.is_empty() {
        (true, true)
    } else {
        (required.iter().any(|c| c == "exp"), required.iter().any(|c| c == "nbf"))
    };
    let must = !required.is_empty();
    let until = if exp { check("exp", must)? } else { None };
    if nbf {
        check("nbf", must)?;
    }
    Ok(until.map(|e| e.saturating_add(leeway)))
}

/// Verified tokens of one configuration, so that a public-key signature is checked once per
/// token, not once per request: keyed by the whole token (compared in constant time, not by a
/// hash alone), each entry expiring with its token, at most [`VerifiedCache::CAPACITY`]
/// entries (emptied when full: bounded, and an attacker's junk never survives long).
///
/// `V` is what a hit gives back: the consumer (jwt-auth), or verified claims with the headers
/// made from them (openid-connect).
pub struct VerifiedCache<V = Arc<Consumer>> {
    hasher: RandomState,
    entries: parking_lot::Mutex<HashMap<u64, Cached<V>>>,
}

/// A cached token: the token itself, what it gave, and until when (Unix seconds).
type Cached<V> = (Box<str>, V, i64);

impl<V> Default for VerifiedCache<V> {
    fn default() -> Self {
        VerifiedCache { hasher: RandomState::new(), entries: parking_lot::Mutex::new(HashMap::new()) }
    }
}

impl<V: Clone> VerifiedCache<V> {
    /// Entries kept at most.
    pub const CAPACITY: usize = 4096;
    /// How long a token stays cached at most (seconds), `exp` or not: a key rotated or a
    /// credential removed is noticed within this time even for a long-lived token.
    pub const MAX_TTL: i64 = 300;

    /// What a still-valid cached `token` gave.
    pub fn get(&self, token: &str, now: i64) -> Option<V> {
        let key = self.hasher.hash_one(token);
        let entries = self.entries.lock();
        let (t, value, until) = entries.get(&key)?;
        (now < *until && ct_eq(t.as_bytes(), token.as_bytes())).then(|| value.clone())
    }

    /// Remembers a verified `token` until `until` (its `exp` with leeway), [`Self::MAX_TTL`] at
    /// most.
    pub fn put(&self, token: &str, value: V, now: i64, until: Option<i64>) {
        if token.len() > 4096 {
            return;
        }
        let until = until.unwrap_or(i64::MAX).min(now.saturating_add(Self::MAX_TTL));
        if until <= now {
            return;
        }
        let key = self.hasher.hash_one(token);
        let mut entries = self.entries.lock();
        if entries.len() >= Self::CAPACITY {
            entries.retain(|_, (_, _, u)| now < *u);
            if entries.len() >= Self::CAPACITY {
                entries.clear();
            }
        }
        entries.insert(key, (token.into(), value, until));
    }

    /// Entries now.
    pub fn len(&self) -> usize {
        self.entries.lock().len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Fuzzing entry point: any bytes, as a token, are parsed, and a parsed token is verified (with
/// a fixed HS256 key) and its times checked; nothing may panic, and a parsed token's signed
/// part is the token's own prefix.
pub fn fuzz_token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(token) = parse(text) else { return };
    assert!(text.starts_with(token.signed), "the signed part is the token's prefix");
    if let Ok(v) = Verifier::new("HS256", Key::Secret(b"fuzz-secret")) {
        let _ = v.verify(&token);
    }
    let _ = check_times(&token.claims, &[], 1_700_000_000, 30);
    let _ = check_times(&token.claims, &["exp".to_owned(), "nbf".to_owned()], i64::MAX, i64::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn hs256(header: &Value, claims: &Value, secret: &[u8]) -> String {
        let signed = format!("{}.{}", b64(header), b64(claims));
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        let sig = jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).unwrap_or_default();
        format!("{signed}.{sig}")
    }

    #[test]
    fn tokens_verify_with_the_configured_algorithm_only() {
        let t = hs256(&json!({"alg": "HS256"}), &json!({"key": "k"}), b"secret");
        let v = Verifier::new("HS256", Key::Secret(b"secret")).unwrap_or_else(|e| panic!("{e}"));
        assert!(v.verify(&parse(&t).unwrap_or_else(|e| panic!("{e}"))).is_ok());
        // The same MAC claimed as HS512, or as none: refused before any cryptography.
        let signed = format!("{}.{}", b64(&json!({"alg": "none"})), b64(&json!({"key": "k"})));
        for forged in
            [format!("{signed}."), t.replacen(&b64(&json!({"alg": "HS256"})), &b64(&json!({"alg": "HS512"})), 1)]
        {
            let parsed = parse(&forged).unwrap_or_else(|e| panic!("{e}"));
            assert!(v.verify(&parsed).is_err(), "{forged}");
        }
        assert!(Verifier::new("none", Key::Secret(b"x")).is_err());
        assert!(Verifier::new("RS256", Key::Secret(b"x")).is_err(), "a public-key algorithm never takes a secret");
        assert!(Verifier::new("HS256", Key::Pem("-----BEGIN PUBLIC KEY-----")).is_err());
        assert!(Verifier::new("RS256", Key::Pem("not a pem")).is_err());
    }

    #[test]
    fn verifiers_are_built_from_an_algorithm_as_from_its_name() {
        for name in ALGORITHMS {
            let (canonical, alg) = algorithm(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(algorithm_name(alg), Some(canonical));
        }
        let t = hs256(&json!({"alg": "HS256"}), &json!({"key": "k"}), b"secret");
        let t = parse(&t).unwrap_or_else(|e| panic!("{e}"));
        let v = Verifier::with_algorithm(Algorithm::HS256, Key::Secret(b"secret")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v.algorithm(), "HS256");
        assert!(v.verify(&t).is_ok());
        let other =
            Verifier::with_algorithm(Algorithm::HS512, Key::Secret(b"secret")).unwrap_or_else(|e| panic!("{e}"));
        assert!(other.verify(&t).is_err(), "the token's alg must be exactly the verifier's");
        assert!(Verifier::with_algorithm(Algorithm::RS256, Key::Secret(b"x")).is_err());
        assert!(Verifier::with_algorithm(Algorithm::ES256, Key::Pem("not a pem")).is_err());
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let good = hs256(&json!({"alg": "HS256"}), &json!({"key": "k"}), b"s");
        let dup_header = format!("{}.{}.x", URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","alg":"none"}"#), b64(&json!({})));
        let dup_claim =
            format!("{}.{}.x", b64(&json!({"alg": "HS256"})), URL_SAFE_NO_PAD.encode(r#"{"key":"a","key":"b"}"#));
        let long = format!("{}.{}.x", b64(&json!({"alg": "HS256"})), "A".repeat(MAX_TOKEN));
        for bad in [
            "",
            "a.b",
            "a.b.c.d",
            "!!!.e30.x",
            &format!("{}.W10.x", b64(&json!({"alg": "HS256"}))),
            &format!("{}.e30.x", b64(&json!({"typ": "JWT"}))),
            &format!("{}.e30.x", b64(&json!({"alg": "HS256", "crit": ["b64"]}))),
            &dup_header,
            &dup_claim,
            &long,
            &good.replace('.', "=."),
        ] {
            assert!(parse(bad).is_err(), "{bad:.80}");
        }
    }

    #[test]
    fn times_follow_apisix() {
        let c = |v: Value| v.as_object().cloned().unwrap_or_default();
        assert_eq!(check_times(&c(json!({})), &[], 100, 0), Ok(None));
        assert_eq!(check_times(&c(json!({"exp": 150})), &[], 100, 0), Ok(Some(150)));
        assert!(check_times(&c(json!({"exp": 100})), &[], 100, 0).is_err());
        assert!(check_times(&c(json!({"exp": 95})), &[], 100, 10).is_ok(), "the grace period");
        assert!(check_times(&c(json!({"nbf": 101})), &[], 100, 0).is_err());
        assert!(check_times(&c(json!({"exp": "soon"})), &[], 100, 0).is_err());
        assert!(check_times(&c(json!({"exp": 1e300})), &[], 100, 0).is_ok());
        let required = ["exp".to_owned()];
        assert!(check_times(&c(json!({"nbf": 1})), &required, 100, 0).is_err(), "a listed claim is required");
    }

    #[test]
    fn the_cache_remembers_until_expiry_and_compares_whole_tokens() {
        let cache: VerifiedCache = VerifiedCache::default();
        let jack = Arc::new(Consumer::named("jack"));
        cache.put("token-a", jack.clone(), 100, Some(200));
        assert!(cache.get("token-a", 150).is_some());
        assert!(cache.get("token-a", 200).is_none(), "expired with the token");
        assert!(cache.get("token-b", 150).is_none());
        cache.put("token-c", jack, 100, None);
        assert!(cache.get("token-c", 100 + VerifiedCache::<Arc<Consumer>>::MAX_TTL).is_none());
    }
}
