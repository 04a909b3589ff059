//! The configuration: APISIX 3.x's `openid-connect` fields with their defaults (so APISIX's
//! documented configurations load unchanged), and the checks made at load. Fields Weir accepts
//! but does not implement are listed in [`UNIMPLEMENTED`] and logged when set.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

/// What an unauthenticated request (no bearer token, no session) gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UnauthAction {
    /// Redirect to the provider's authorization endpoint.
    #[default]
    Auth,
    /// Answer 401.
    Deny,
    /// Let the request through, without identity headers.
    Pass,
}

/// `SameSite` of the cookies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
pub enum SameSite {
    /// `SameSite=Strict`.
    Strict,
    /// `SameSite=Lax`.
    Lax,
    /// `SameSite=None` (sent with `Secure`).
    None,
    /// No attribute.
    Default,
}

/// `session.cookie`: lua-resty-session 3.x's form, kept by APISIX.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct LegacyCookie {
    /// Deprecated alias of `absolute_timeout` (seconds).
    #[serde(default)]
    pub lifetime: Option<u64>,
}

/// `session`: where the authorization-code flow keeps its state (encrypted cookies).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionConf {
    /// The key material for cookie encryption and authentication (16 characters or more).
    #[schemars(length(min = 16))]
    pub secret: String,
    /// Cookie name (default `session`).
    #[serde(default)]
    pub cookie_name: Option<String>,
    /// Cookie `Path` (default `/`).
    #[serde(default)]
    pub cookie_path: Option<String>,
    /// Cookie `Domain`.
    #[serde(default)]
    pub cookie_domain: Option<String>,
    /// `Secure` (default: when the request came over https).
    #[serde(default)]
    pub cookie_secure: Option<bool>,
    /// `HttpOnly` (default true).
    #[serde(default)]
    pub cookie_http_only: Option<bool>,
    /// `SameSite` (default `Lax`).
    #[serde(default)]
    pub cookie_same_site: Option<SameSite>,
    /// Accepted, not implemented (logged).
    #[serde(default)]
    pub idling_timeout: Option<i64>,
    /// Accepted, not implemented (logged).
    #[serde(default)]
    pub rolling_timeout: Option<i64>,
    /// Absolute session lifetime in seconds (default 86400).
    #[serde(default)]
    pub absolute_timeout: Option<u64>,
    /// Deprecated: `cookie.lifetime` is `absolute_timeout` when that is unset.
    #[serde(default)]
    pub cookie: Option<LegacyCookie>,
    /// `cookie` only: `redis` is accepted and logged, the session stays in cookies.
    #[serde(default)]
    #[schemars(regex(pattern = "^(cookie|redis)$"))]
    pub storage: Option<String>,
    /// Accepted for `storage: redis`, not used.
    #[serde(default)]
    pub redis: Option<Value>,
}

/// `claim_validator.issuer`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct IssuerValidator {
    /// Issuers accepted instead of the discovery document's.
    #[serde(default)]
    pub valid_issuers: Option<Vec<String>>,
}

/// `claim_validator.audience`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct AudienceValidator {
    /// The claim holding the audience.
    #[serde(default = "aud")]
    pub claim: String,
    /// A token without the claim is refused.
    #[serde(default)]
    pub required: bool,
    /// The audience must be (or contain) `client_id`.
    #[serde(default)]
    pub match_with_client_id: bool,
}

/// `claim_validator`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct ClaimValidator {
    /// Issuer checks.
    #[serde(default)]
    pub issuer: Option<IssuerValidator>,
    /// Audience checks.
    #[serde(default)]
    pub audience: Option<AudienceValidator>,
}

/// Route configuration (APISIX 3.x field names and defaults).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The client id registered at the provider.
    #[schemars(length(min = 1))]
    pub client_id: String,
    /// The client secret.
    #[serde(default)]
    pub client_secret: Option<String>,
    /// The provider's discovery document (`.../.well-known/openid-configuration`).
    #[serde(default)]
    pub discovery: Option<String>,
    /// Scopes asked for in the authorization request.
    #[serde(default = "default_scope")]
    pub scope: String,
    /// Verify the provider's certificate.
    #[serde(default = "yes")]
    pub ssl_verify: bool,
    /// Seconds for each request to the provider (a value of 1000 or more that is a multiple
    /// of 1000 is milliseconds, as APISIX stored it once).
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1))]
    pub timeout: u64,
    /// RFC 7662 token introspection endpoint.
    #[serde(default)]
    pub introspection_endpoint: Option<String>,
    /// `client_secret_basic` or `client_secret_post`.
    #[serde(default = "default_auth_method")]
    pub introspection_endpoint_auth_method: String,
    /// `client_secret_basic` or `client_secret_post`.
    #[serde(default = "default_auth_method")]
    pub token_endpoint_auth_method: String,
    /// Only bearer tokens authenticate: no session, no redirect.
    #[serde(default)]
    pub bearer_only: bool,
    /// The encrypted cookie session of the authorization-code flow.
    #[serde(default)]
    pub session: Option<SessionConf>,
    /// The realm of `WWW-Authenticate`.
    #[serde(default = "default_realm")]
    pub realm: String,
    /// Issuer and audience checks.
    #[serde(default)]
    pub claim_validator: Option<ClaimValidator>,
    /// The path that ends the session.
    #[serde(default = "default_logout_path")]
    pub logout_path: String,
    /// Where the provider sends the browser back (default: the request path + `/.apisix/redirect`).
    #[serde(default)]
    pub redirect_uri: Option<String>,
    /// Where the browser goes after logout.
    #[serde(default)]
    pub post_logout_redirect_uri: Option<String>,
    /// `auth` (redirect), `deny` (401) or `pass`.
    #[serde(default)]
    pub unauth_action: UnauthAction,
    /// A PEM public key that verifies bearer tokens instead of the JWKS.
    #[serde(default)]
    pub public_key: Option<String>,
    /// Verify bearer tokens against the provider's JWKS (rather than by introspection).
    #[serde(default)]
    pub use_jwks: bool,
    /// The one signature algorithm accepted (default: any asymmetric one the key allows).
    #[serde(default)]
    pub token_signing_alg_values_expected: Option<String>,
    /// PKCE (`S256`) in the authorization-code flow.
    #[serde(default)]
    pub use_pkce: bool,
    /// Set `X-Access-Token` (or `Authorization`) upstream.
    #[serde(default = "yes")]
    pub set_access_token_header: bool,
    /// The access token goes upstream as `Authorization: Bearer`.
    #[serde(default)]
    pub access_token_in_authorization_header: bool,
    /// Set `X-ID-Token` (base64 of the ID token's claims) upstream.
    #[serde(default = "yes")]
    pub set_id_token_header: bool,
    /// Set `X-Raw-ID-Token` (the signed ID token) upstream.
    #[serde(default)]
    pub set_raw_id_token_header: bool,
    /// Set `X-Userinfo` (base64 of the userinfo JSON) upstream.
    #[serde(default = "yes")]
    pub set_userinfo_header: bool,
    /// Set `X-Refresh-Token` upstream.
    #[serde(default)]
    pub set_refresh_token_header: bool,
    /// Extra arguments of the authorization request.
    #[serde(default)]
    pub authorization_params: Option<BTreeMap<String, Value>>,
    /// Renew expired tokens with the refresh token.
    #[serde(default = "yes")]
    pub renew_access_token_on_expiry: bool,
    /// Access token lifetime when the token response has no `expires_in`.
    #[serde(default)]
    pub access_token_expires_in: Option<u64>,
    /// Seconds of `iat` in the future tolerated.
    #[serde(default = "default_iat_slack")]
    pub iat_slack: i64,
    /// Never honoured: unsigned tokens are always refused.
    #[serde(default)]
    pub accept_none_alg: bool,
    /// Never honoured: a token whose algorithm cannot be checked is refused.
    #[serde(default)]
    pub accept_unsupported_alg: Option<bool>,
    /// Renew this many seconds before the access token expires.
    #[serde(default)]
    pub access_token_expires_leeway: i64,
    /// Always sent and checked; accepted for compatibility.
    #[serde(default)]
    pub use_nonce: bool,
    /// Seconds the JWKS and the discovery document are kept.
    #[serde(default = "default_jwk_expires_in")]
    pub jwk_expires_in: u64,
    /// Seconds an introspection result is kept (0: ask every time).
    #[serde(default)]
    pub introspection_interval: u64,
    /// Client headers sent on to the introspection endpoint.
    #[serde(default)]
    pub introspection_addon_headers: Option<Vec<String>>,
    /// Scopes the token must carry (`scope` claim).
    #[serde(default)]
    pub required_scopes: Option<Vec<String>>,
    // Accepted, not implemented (a warning names each one set).
    #[serde(default)]
    #[allow(missing_docs)]
    pub par: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub dpop: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub proxy_opts: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub client_rsa_private_key: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub client_rsa_private_key_id: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub client_jwt_assertion_expires_in: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub client_jwt_assertion_alg: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub client_jwt_assertion_audience: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub refresh_session_interval: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub force_reauthorize: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub revoke_tokens_on_logout: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub jwt_verification_cache_ignore: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub cache_segment: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub introspection_expiry_claim: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub claim_schema: Option<Value>,
    #[serde(default)]
    #[allow(missing_docs)]
    pub session_contents: Option<Value>,
}

fn yes() -> bool {
    true
}
fn aud() -> String {
    "aud".into()
}
fn default_scope() -> String {
    "openid".into()
}
fn default_timeout() -> u64 {
    3
}
fn default_auth_method() -> String {
    "client_secret_basic".into()
}
fn default_realm() -> String {
    "apisix".into()
}
fn default_logout_path() -> String {
    "/logout".into()
}
fn default_iat_slack() -> i64 {
    120
}
fn default_jwk_expires_in() -> u64 {
    86_400
}

/// How the client authenticates to the token and introspection endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// HTTP Basic with the client id and secret.
    Basic,
    /// `client_id` and `client_secret` in the form body.
    Post,
}

fn client_auth(field: &str, value: &str) -> Result<ClientAuth, String> {
    match value {
        "client_secret_basic" => Ok(ClientAuth::Basic),
        "client_secret_post" => Ok(ClientAuth::Post),
        "private_key_jwt" | "client_secret_jwt" => {
            Err(format!("{field}: `{value}` is not supported by Weir (use client_secret_basic or client_secret_post)"))
        }
        other => Err(format!("{field}: unknown method `{other}`")),
    }
}

/// The fields accepted for APISIX compatibility that change nothing in Weir.
pub const UNIMPLEMENTED: &[&str] = &[
    "par",
    "dpop",
    "proxy_opts",
    "client_rsa_private_key",
    "client_rsa_private_key_id",
    "client_jwt_assertion_expires_in",
    "client_jwt_assertion_alg",
    "client_jwt_assertion_audience",
    "refresh_session_interval",
    "force_reauthorize",
    "revoke_tokens_on_logout",
    "jwt_verification_cache_ignore",
    "cache_segment",
    "introspection_expiry_claim",
    "claim_schema",
    "session_contents",
    "session.idling_timeout",
    "session.rolling_timeout",
    "session.storage",
    "session.redis",
];

/// The timeout of each request to the provider.
pub fn timeout(conf: &Conf) -> std::time::Duration {
    if conf.timeout >= 1000 && conf.timeout.is_multiple_of(1000) {
        std::time::Duration::from_millis(conf.timeout)
    } else {
        std::time::Duration::from_secs(conf.timeout)
    }
}

/// The names of the fields of [`UNIMPLEMENTED`] this configuration sets (and the ignored
/// `accept_*` switches set to `true`).
pub fn ignored_fields(conf: &Conf) -> Vec<&'static str> {
    let top = [
        conf.par.is_some(),
        conf.dpop.is_some(),
        conf.proxy_opts.is_some(),
        conf.client_rsa_private_key.is_some(),
        conf.client_rsa_private_key_id.is_some(),
        conf.client_jwt_assertion_expires_in.is_some(),
        conf.client_jwt_assertion_alg.is_some(),
        conf.client_jwt_assertion_audience.is_some(),
        conf.refresh_session_interval.is_some(),
        conf.force_reauthorize.is_some(),
        conf.revoke_tokens_on_logout.is_some(),
        conf.jwt_verification_cache_ignore.is_some(),
        conf.cache_segment.is_some(),
        conf.introspection_expiry_claim.is_some(),
        conf.claim_schema.is_some(),
        conf.session_contents.is_some(),
    ];
    let s = conf.session.as_ref();
    let session = [
        s.is_some_and(|s| s.idling_timeout.is_some()),
        s.is_some_and(|s| s.rolling_timeout.is_some()),
        s.is_some_and(|s| s.storage.as_deref() == Some("redis")),
        s.is_some_and(|s| s.redis.is_some()),
    ];
    let mut out: Vec<&'static str> =
        top.iter().chain(session.iter()).zip(UNIMPLEMENTED).filter(|(set, _)| **set).map(|(_, n)| *n).collect();
    if conf.accept_none_alg {
        out.push("accept_none_alg (unsigned tokens are always refused)");
    }
    if conf.accept_unsupported_alg == Some(true) {
        out.push("accept_unsupported_alg (a signature that cannot be checked is always refused)");
    }
    out
}

/// Which way bearer tokens are verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerMode {
    /// Locally, with `public_key`.
    PublicKey,
    /// Locally, with the provider's JWKS.
    Jwks,
    /// At the introspection endpoint.
    Introspection,
}

/// Load-time checks beyond the schema; the verification mode of bearer tokens.
pub fn check(conf: &Conf) -> Result<(BearerMode, ClientAuth, ClientAuth), String> {
    let token_auth = client_auth("token_endpoint_auth_method", &conf.token_endpoint_auth_method)?;
    let introspection_auth =
        client_auth("introspection_endpoint_auth_method", &conf.introspection_endpoint_auth_method)?;
    for (field, value) in [
        ("discovery", &conf.discovery),
        ("introspection_endpoint", &conf.introspection_endpoint),
        ("post_logout_redirect_uri", &conf.post_logout_redirect_uri),
    ] {
        if let Some(v) = value {
            if !(v.starts_with("http://") || v.starts_with("https://")) {
                return Err(format!("{field}: must be an http:// or https:// URL"));
            }
            url::Url::parse(v).map_err(|e| format!("{field}: {e}"))?;
        }
    }
    if let Some(r) = &conf.redirect_uri {
        if !(r.starts_with('/') || r.starts_with("http://") || r.starts_with("https://")) {
            return Err("redirect_uri: must be a path or an http:// or https:// URL".into());
        }
    }
    if !conf.logout_path.starts_with('/') {
        return Err("logout_path: must start with /".into());
    }
    if let Some(alg) = &conf.token_signing_alg_values_expected {
        crate::jwt::allowed_algorithm(alg)?;
    }
    let mode = if conf.public_key.is_some() {
        BearerMode::PublicKey
    } else if conf.use_jwks {
        BearerMode::Jwks
    } else if conf.introspection_endpoint.is_some() {
        BearerMode::Introspection
    } else {
        BearerMode::Jwks
    };
    if conf.discovery.is_none() {
        let without = conf.bearer_only && mode != BearerMode::Jwks;
        if !without {
            return Err(if conf.bearer_only {
                "discovery: required unless bearer tokens are verified with public_key or introspection_endpoint".into()
            } else {
                "discovery: required for the authorization-code flow (bearer_only is false)".into()
            });
        }
    }
    if !conf.bearer_only {
        match &conf.session {
            None => return Err("session.secret: required when bearer_only is false".into()),
            Some(s) if s.secret.chars().count() < 16 => {
                return Err("session.secret: must be at least 16 characters".into())
            }
            Some(_) => {}
        }
        if conf.client_secret.is_none() && !conf.use_pkce {
            return Err("client_secret: required for the authorization-code flow (unless use_pkce is true)".into());
        }
    }
    if mode == BearerMode::Introspection && conf.client_secret.is_none() {
        return Err("client_secret: required to authenticate to the introspection endpoint".into());
    }
    if let Some(names) = &conf.introspection_addon_headers {
        for n in names {
            weir_plugin::http::HeaderName::from_bytes(n.as_bytes())
                .map_err(|_| format!("introspection_addon_headers: `{n}` is not a header name"))?;
        }
    }
    Ok((mode, token_auth, introspection_auth))
}
