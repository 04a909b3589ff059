//! JWT verification: the algorithm comes from the key (a JWK's `alg`, or its type) and the
//! allowed list, never from the token alone: `none` and the HMAC algorithms are always refused
//! (an HS token "signed" with a public key is the classic confusion attack). Then signature,
//! `exp`/`nbf`, issuer, audience and (for ID tokens) nonce.

use std::str::FromStr;

use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{errors::ErrorKind, Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use crate::conf::AudienceValidator;

/// Why a token was refused; the message is safe to show (never the token, never a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Not three base64url parts with a JSON header.
    Malformed,
    /// `alg: none`.
    Unsigned,
    /// An algorithm Weir does not accept (HMAC, unknown, not the configured one).
    Algorithm,
    /// The token names a `kid` the JWKS does not have.
    UnknownKey,
    /// No key could check the signature.
    Signature,
    /// `exp` passed.
    Expired,
    /// `nbf` (or `iat`) in the future.
    NotYetValid,
    /// `iss` is not the provider's.
    Issuer,
    /// `aud` does not match.
    Audience,
    /// `nonce` does not match the login's.
    Nonce,
    /// A required claim is missing.
    MissingClaim(&'static str),
}

impl Invalid {
    /// The reason, for the client.
    pub fn message(&self) -> String {
        match self {
            Invalid::Malformed => "malformed token".into(),
            Invalid::Unsigned => "unsigned tokens (alg none) are not accepted".into(),
            Invalid::Algorithm => "token signature algorithm not accepted".into(),
            Invalid::UnknownKey => "token signed with an unknown key".into(),
            Invalid::Signature => "invalid token signature".into(),
            Invalid::Expired => "token expired".into(),
            Invalid::NotYetValid => "token not yet valid".into(),
            Invalid::Issuer => "token issuer not accepted".into(),
            Invalid::Audience => "token audience not accepted".into(),
            Invalid::Nonce => "ID token nonce does not match".into(),
            Invalid::MissingClaim(c) => format!("token has no `{c}` claim"),
        }
    }
}

/// An algorithm accepted in configuration (`token_signing_alg_values_expected`): asymmetric only.
pub fn allowed_algorithm(name: &str) -> Result<Algorithm, String> {
    let alg = Algorithm::from_str(name).map_err(|_| format!("token_signing_alg_values_expected: unknown `{name}`"))?;
    if matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
        return Err(format!("token_signing_alg_values_expected: `{name}` is symmetric; only asymmetric algorithms verify provider tokens"));
    }
    Ok(alg)
}

/// The key family of a signing algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// RS*, PS*.
    Rsa,
    /// ES256 (P-256).
    P256,
    /// ES384 (P-384).
    P384,
    /// EdDSA.
    Ed,
}

fn family(alg: Algorithm) -> Option<Family> {
    use Algorithm::*;
    match alg {
        RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => Some(Family::Rsa),
        ES256 => Some(Family::P256),
        ES384 => Some(Family::P384),
        EdDSA => Some(Family::Ed),
        HS256 | HS384 | HS512 => None,
    }
}

fn jwk_family(jwk: &Jwk) -> Option<Family> {
    match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Family::Rsa),
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => Some(Family::P256),
            EllipticCurve::P384 => Some(Family::P384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Family::Ed),
        AlgorithmParameters::OctetKey(_) => None,
    }
}

/// A configured PEM public key (`public_key`).
pub struct PemKey {
    key: DecodingKey,
    family: Family,
}

impl PemKey {
    /// An RSA, EC or Ed25519 public key in PEM.
    pub fn parse(pem: &str) -> Result<PemKey, String> {
        let b = pem.as_bytes();
        if let Ok(key) = DecodingKey::from_rsa_pem(b) {
            return Ok(PemKey { key, family: Family::Rsa });
        }
        if let Ok(key) = DecodingKey::from_ec_pem(b) {
            // The curve shows in the signature check; ES256 is by far the usual one.
            return Ok(PemKey { key, family: Family::P256 });
        }
        if let Ok(key) = DecodingKey::from_ed_pem(b) {
            return Ok(PemKey { key, family: Family::Ed });
        }
        Err("public_key: not a PEM RSA, EC or Ed25519 public key".into())
    }
}

/// The parts of a token's header Weir reads.
#[derive(Debug)]
pub struct Head {
    /// The algorithm (already refused when none or HMAC).
    pub alg: Algorithm,
    /// The key id.
    pub kid: Option<String>,
}

/// Reads and screens a token's header: `none`, HMAC and unknown algorithms are refused here,
/// before any key is looked at.
pub fn head(token: &str, allowed: Option<Algorithm>) -> Result<Head, Invalid> {
    let mut parts = token.split('.');
    let (Some(h), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(Invalid::Malformed);
    };
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(h.trim_end_matches('='))
        .map_err(|_| Invalid::Malformed)?;
    let header: Map<String, Value> = serde_json::from_slice(&raw).map_err(|_| Invalid::Malformed)?;
    let alg = header.get("alg").and_then(Value::as_str).ok_or(Invalid::Malformed)?;
    if alg.eq_ignore_ascii_case("none") {
        return Err(Invalid::Unsigned);
    }
    let alg = Algorithm::from_str(alg).map_err(|_| Invalid::Algorithm)?;
    if family(alg).is_none() || allowed.is_some_and(|a| a != alg) {
        return Err(Invalid::Algorithm);
    }
    let kid = header.get("kid").and_then(Value::as_str).map(str::to_owned);
    Ok(Head { alg, kid })
}

/// What a token is checked against besides its signature.
pub struct Expect<'a> {
    /// Accepted issuers (`None`: not checked).
    pub issuers: Option<&'a [String]>,
    /// `claim_validator.audience`.
    pub audience: Option<&'a AudienceValidator>,
    /// The client id (audience checks, ID tokens).
    pub client_id: &'a str,
    /// An ID token: `aud` must contain the client id, `nonce` must match when given.
    pub id_token: bool,
    /// The nonce of the login (ID tokens of the authorization-code flow).
    pub nonce: Option<&'a str>,
    /// Seconds of `iat` in the future tolerated.
    pub iat_slack: i64,
    /// Now (Unix seconds).
    pub now: i64,
}

/// The keys of a JWKS that may have signed a token with this header: `Err(UnknownKey)` when the
/// token names a `kid` absent from the set.
pub fn candidates<'k>(keys: &'k [Jwk], head: &Head) -> Result<Vec<&'k Jwk>, Invalid> {
    let Some(fam) = family(head.alg) else { return Err(Invalid::Algorithm) };
    let named: Vec<&Jwk> = match &head.kid {
        Some(kid) => keys.iter().filter(|k| k.common.key_id.as_deref() == Some(kid.as_str())).collect(),
        None => keys.iter().collect(),
    };
    if named.is_empty() {
        return Err(if head.kid.is_some() { Invalid::UnknownKey } else { Invalid::Signature });
    }
    let usable: Vec<&Jwk> = named
        .into_iter()
        .filter(|k| !matches!(k.common.public_key_use, Some(PublicKeyUse::Encryption)))
        .filter(|k| jwk_family(k) == Some(fam))
        .filter(|k| k.common.key_algorithm.is_none_or(|ka| ka.to_string() == format!("{:?}", head.alg)))
        .collect();
    if usable.is_empty() {
        return Err(Invalid::Algorithm);
    }
    Ok(usable)
}

/// Verifies `token` with one of the JWKS `keys`; its claims.
pub fn verify_jwks(
    token: &str,
    head: &Head,
    keys: &[&Jwk],
    expect: &Expect<'_>,
) -> Result<Map<String, Value>, Invalid> {
    let mut last = Invalid::Signature;
    for jwk in keys {
        let Ok(key) = DecodingKey::from_jwk(jwk) else { continue };
        match decode(token, head.alg, &key, expect) {
            Ok(c) => return Ok(c),
            Err(Invalid::Signature) => continue,
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Verifies `token` with the configured PEM key; its claims.
pub fn verify_pem(token: &str, head: &Head, key: &PemKey, expect: &Expect<'_>) -> Result<Map<String, Value>, Invalid> {
    if family(head.alg) != Some(key.family) && !(key.family == Family::P256 && family(head.alg) == Some(Family::P384)) {
        return Err(Invalid::Algorithm);
    }
    decode(token, head.alg, &key.key, expect)
}

fn decode(token: &str, alg: Algorithm, key: &DecodingKey, expect: &Expect<'_>) -> Result<Map<String, Value>, Invalid> {
    let mut v = Validation::new(alg);
    v.leeway = 0;
    v.validate_nbf = true;
    v.validate_aud = false;
    v.set_required_spec_claims(&["exp"]);
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &v).map_err(|e| match e.kind() {
        ErrorKind::ExpiredSignature => Invalid::Expired,
        ErrorKind::ImmatureSignature => Invalid::NotYetValid,
        ErrorKind::InvalidSignature => Invalid::Signature,
        ErrorKind::MissingRequiredClaim(_) => Invalid::MissingClaim("exp"),
        ErrorKind::InvalidAlgorithm => Invalid::Algorithm,
        _ => Invalid::Malformed,
    })?;
    let claims = data.claims;
    check_claims(&claims, expect)?;
    Ok(claims)
}

/// The claim checks after the signature: issuer, audience, `iat`, nonce.
pub fn check_claims(claims: &Map<String, Value>, expect: &Expect<'_>) -> Result<(), Invalid> {
    if let Some(issuers) = expect.issuers {
        let iss = claims.get("iss").and_then(Value::as_str).ok_or(Invalid::MissingClaim("iss"))?;
        if !issuers.iter().any(|i| i == iss) {
            return Err(Invalid::Issuer);
        }
    }
    if let Some(iat) = claims.get("iat").and_then(Value::as_i64) {
        if iat > expect.now + expect.iat_slack {
            return Err(Invalid::NotYetValid);
        }
    }
    let contains = |v: Option<&Value>, id: &str| match v {
        Some(Value::String(s)) => s == id,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(id)),
        _ => false,
    };
    if expect.id_token {
        if !contains(claims.get("aud"), expect.client_id) {
            return Err(Invalid::Audience);
        }
        if let Some(nonce) = expect.nonce {
            let got = claims.get("nonce").and_then(Value::as_str).unwrap_or("");
            if !weir_plugin::auth::ct_eq(got.as_bytes(), nonce.as_bytes()) {
                return Err(Invalid::Nonce);
            }
        }
    }
    if let Some(a) = expect.audience {
        let value = claims.get(a.claim.as_str()).filter(|v| !v.is_null());
        if (a.required || a.match_with_client_id) && value.is_none() {
            return Err(Invalid::MissingClaim("aud"));
        }
        if a.match_with_client_id && !contains(value, expect.client_id) {
            return Err(Invalid::Audience);
        }
    }
    Ok(())
}

/// Whether the space-separated `scope` claim holds every scope of `required`.
pub fn has_scopes(claims: &Map<String, Value>, required: &[String]) -> bool {
    let granted: Vec<&str> =
        claims.get("scope").and_then(Value::as_str).map(|s| s.split_whitespace().collect()).unwrap_or_default();
    required.iter().all(|r| granted.contains(&r.as_str()))
}
