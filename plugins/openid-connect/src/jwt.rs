//! JWT verification for openid-connect, built on the SDK's strict [`weir_plugin::jwt`] (the
//! one jwt-auth uses): tokens are parsed by [`jwt::parse`] (compact form only, at most
//! [`jwt::MAX_TOKEN`] bytes, a header and payload that are JSON objects without duplicate keys,
//! no `crit`: a payload with two `iss` (or two `scope`, or two `nonce`) or a header with two
//! `alg` is malformed, never read either way), and signatures are checked by a [`Verifier`] fixed to one algorithm and one key.
//!
//! What is this plugin's is the provider policy: the algorithm comes from the key (a JWK's
//! `alg`, or its type) and the allowed list, never from the token alone; `none` and the HMAC
//! algorithms are always refused (an HS token "signed" with a public key is the classic
//! confusion attack). Then `exp`/`nbf` (no leeway), issuer, `iat`, audience and (for ID tokens)
//! nonce.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};
use weir_plugin::jwt::{self, Key, Verifier};

use crate::conf::AudienceValidator;

/// Why a token was refused; the message is safe to show (never the token, never a key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// Not a compact token of three base64url parts whose header and payload are JSON objects
    /// without duplicate keys (and without `crit`), with a base64url signature, at most
    /// [`jwt::MAX_TOKEN`] bytes.
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
    let (_, alg) =
        jwt::algorithm(name).ok_or_else(|| format!("token_signing_alg_values_expected: unknown `{name}`"))?;
    if family(alg).is_none() {
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

/// The algorithm `jwk` verifies a token claiming `alg` with: the JWK's own `alg` when it names
/// one (then it must be `alg`), else `alg` when the key's type is of its family. `None`: the key
/// cannot have signed it (an encryption key, another family or algorithm, a symmetric key).
fn jwk_algorithm(jwk: &Jwk, alg: Algorithm) -> Option<Algorithm> {
    if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption))
        || !jwk_family(jwk).is_some_and(|f| family(alg) == Some(f))
    {
        return None;
    }
    match jwk.common.key_algorithm {
        None => Some(alg),
        Some(own) => jwt::algorithm(&own.to_string()).map(|(_, a)| a).filter(|a| *a == alg),
    }
}

/// A configured PEM public key (`public_key`): a verifier for each algorithm of its type, so
/// that a token is checked with the one its `alg` names, if the key has it.
pub struct PemKey {
    verifiers: Vec<Verifier>,
}

impl PemKey {
    /// An RSA (RS*, PS*), EC (ES256, ES384) or Ed25519 (EdDSA) public key in PEM.
    pub fn parse(pem: &str) -> Result<PemKey, String> {
        // Each family's PEM reader refuses another family's key, so only the key's own
        // algorithms remain (both ES256 and ES384 for an EC key: the curve shows in the
        // signature check).
        let verifiers: Vec<Verifier> = jwt::ALGORITHMS
            .iter()
            .filter_map(|name| jwt::algorithm(name))
            .filter(|(_, alg)| family(*alg).is_some())
            .filter_map(|(name, _)| Verifier::new(name, Key::Pem(pem)).ok())
            .collect();
        if verifiers.is_empty() {
            return Err("public_key: not a PEM RSA, EC or Ed25519 public key".into());
        }
        Ok(PemKey { verifiers })
    }
}

/// A parsed token whose algorithm passed the policy (not yet verified).
pub struct Parsed<'a> {
    /// The token as [`jwt::parse`] read it: header fields, claims, signed part and signature.
    pub token: jwt::Token<'a>,
    /// Its `alg`: known, asymmetric, and the allowed one when one is configured.
    pub alg: Algorithm,
}

/// Parses a token and screens its algorithm: malformed tokens (see the module documentation),
/// `none`, HMAC, unknown and not-allowed algorithms are refused here, before any key is looked
/// at or fetched.
pub fn parse(token: &str, allowed: Option<Algorithm>) -> Result<Parsed<'_>, Invalid> {
    let token = jwt::parse(token).map_err(|_| Invalid::Malformed)?;
    if token.alg.eq_ignore_ascii_case("none") {
        return Err(Invalid::Unsigned);
    }
    let Some((_, alg)) = jwt::algorithm(&token.alg) else { return Err(Invalid::Algorithm) };
    if family(alg).is_none() || allowed.is_some_and(|a| a != alg) {
        return Err(Invalid::Algorithm);
    }
    // The verifier reports any failure as a mismatch; a signature that is not even base64url
    // is a malformed token.
    if URL_SAFE_NO_PAD.decode(token.signature).is_err() {
        return Err(Invalid::Malformed);
    }
    Ok(Parsed { token, alg })
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

/// The keys of a JWKS that may have signed `token`: `Err(UnknownKey)` when the token names a
/// `kid` absent from the set.
pub fn candidates<'k>(keys: &'k [Jwk], token: &Parsed<'_>) -> Result<Vec<&'k Jwk>, Invalid> {
    let kid = token.token.kid.as_deref();
    let named: Vec<&Jwk> = match kid {
        Some(kid) => keys.iter().filter(|k| k.common.key_id.as_deref() == Some(kid)).collect(),
        None => keys.iter().collect(),
    };
    if named.is_empty() {
        return Err(if kid.is_some() { Invalid::UnknownKey } else { Invalid::Signature });
    }
    let usable: Vec<&Jwk> = named.into_iter().filter(|k| jwk_algorithm(k, token.alg).is_some()).collect();
    if usable.is_empty() {
        return Err(Invalid::Algorithm);
    }
    Ok(usable)
}

/// Verifies `token` with one of the JWKS `keys` (from [`candidates`]); its claims.
pub fn verify_jwks(token: Parsed<'_>, keys: &[&Jwk], expect: &Expect<'_>) -> Result<Map<String, Value>, Invalid> {
    let signed = keys.iter().any(|jwk| {
        let (Some(alg), Ok(key)) = (jwk_algorithm(jwk, token.alg), DecodingKey::from_jwk(jwk)) else {
            return false;
        };
        Verifier::with_algorithm(alg, Key::Decoding(key)).is_ok_and(|v| v.verify(&token.token).is_ok())
    });
    if !signed {
        return Err(Invalid::Signature);
    }
    accept(token, expect)
}

/// Verifies `token` with the configured PEM key; its claims.
pub fn verify_pem(token: Parsed<'_>, key: &PemKey, expect: &Expect<'_>) -> Result<Map<String, Value>, Invalid> {
    let verifier = key.verifiers.iter().find(|v| v.algorithm() == token.token.alg).ok_or(Invalid::Algorithm)?;
    verifier.verify(&token.token).map_err(|_| Invalid::Signature)?;
    accept(token, expect)
}

/// The checks after a good signature; the claims.
fn accept(token: Parsed<'_>, expect: &Expect<'_>) -> Result<Map<String, Value>, Invalid> {
    let claims = token.token.claims;
    check_times(&claims, expect.now)?;
    check_claims(&claims, expect)?;
    Ok(claims)
}

/// `exp` (required) and `nbf` (when present) at `now`, without leeway: expired once `exp` is
/// before now, not yet valid while `nbf` is after now (a provider's token is valid from its
/// `nbf` second on). Not the SDK's [`jwt::check_times`]: that one is APISIX jwt-auth's, which
/// with no leeway refuses a token in its `nbf` second, that is a freshly issued one.
///
/// A time is a non-negative number (a fraction rounded); an `exp` that is not one counts as
/// missing, an `nbf` that is not one is ignored.
pub fn check_times(claims: &Map<String, Value>, now: i64) -> Result<(), Invalid> {
    let time = |name: &str| {
        let v = claims.get(name)?;
        v.as_u64().or_else(|| {
            v.as_f64().filter(|f| f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64).map(|f| f.round() as u64)
        })
    };
    let now = u64::try_from(now).unwrap_or(0);
    if time("exp").ok_or(Invalid::MissingClaim("exp"))? < now {
        return Err(Invalid::Expired);
    }
    if time("nbf").is_some_and(|nbf| nbf > now) {
        return Err(Invalid::NotYetValid);
    }
    Ok(())
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
