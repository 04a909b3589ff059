//! `openid-connect`: an OpenID Connect relying party, with APISIX 3.x's fields and defaults.
//!
//! - Bearer tokens (`bearer_only`, or whenever `public_key`, `use_jwks` or
//!   `introspection_endpoint` is set): verified locally against `public_key` or the provider's
//!   JWKS ([`jwt`]), or at the introspection endpoint ([`introspect`]); verified tokens are kept
//!   in the SDK's bounded `VerifiedCache` with the upstream headers made from them, so a token
//!   seen again is answered without waiting, parsing or serializing anything.
//! - Otherwise the authorization-code flow ([`flow`]): a redirect to the provider with state,
//!   nonce and PKCE, the callback, and an encrypted cookie session ([`session`]) renewed with
//!   the refresh token.
//! - The provider's discovery document and JWKS are fetched lazily and cached ([`provider`]):
//!   the gateway starts and serves other routes while the provider is down.
//! - Upstream headers ([`upstream`]) come only from verified data; clients' copies are removed.
//!
//! The configuration and its load-time checks are in [`conf`]; requests to the provider go
//! through the host's HTTP client ([`client`]).

pub mod client;
pub mod conf;
pub mod flow;
pub mod introspect;
pub mod jwt;
pub mod provider;
pub mod session;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use jsonwebtoken::Algorithm;
use serde_json::{Map, Value};
use weir_plugin::http::{header, HeaderName, HeaderValue, StatusCode};
use weir_plugin::jwt::VerifiedCache;
use weir_plugin::{register_plugin, BuildContext, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx};

use crate::client::Provider;
use crate::conf::{BearerMode, ClientAuth, Conf};
use crate::jwt::{Expect, Invalid, PemKey};
use crate::provider::{MetaError, Metadata};

/// The plugin.
pub struct OpenIdConnect;

/// The session settings of the authorization-code flow.
pub struct SessionSettings {
    /// Encrypts the cookies.
    pub sealer: session::Sealer,
    /// The session cookie's name.
    pub name: String,
    /// The login cookie's name.
    pub login_name: String,
    /// Cookie attributes.
    pub attrs: session::Attributes,
    /// `absolute_timeout` (seconds).
    pub lifetime: i64,
}

/// One configuration at run time.
pub struct Instance {
    conf: Conf,
    mode: BearerMode,
    token_auth: ClientAuth,
    introspection_auth: ClientAuth,
    provider: Provider,
    meta: Metadata,
    pem: Option<PemKey>,
    allowed_alg: Option<Algorithm>,
    cache: VerifiedCache<Arc<Verified>>,
    session: Option<SessionSettings>,
    addon_headers: Vec<HeaderName>,
}

/// A refusal: status and the reason shown to the client (never a token or a secret).
#[derive(Debug)]
pub struct Failure {
    status: StatusCode,
    message: String,
    challenge: bool,
}

impl Failure {
    /// 401 with `WWW-Authenticate: Bearer ... error="invalid_token"`.
    pub fn invalid_token(message: impl Into<String>) -> Failure {
        Failure { status: StatusCode::UNAUTHORIZED, message: message.into(), challenge: true }
    }
    /// A plain `{"message"}` answer.
    pub fn status(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure { status, message: message.into(), challenge: false }
    }
    /// The provider is down (or answered nonsense): 503, the reason logged.
    pub fn unavailable(e: &MetaError) -> Failure {
        match e {
            MetaError::Unavailable(why) | MetaError::Invalid(why) => {
                log::error!("openid-connect: the identity provider is unavailable: {why}");
            }
        }
        Failure::status(StatusCode::SERVICE_UNAVAILABLE, "the identity provider is unavailable")
    }
    fn response(self, realm: &str) -> PluginResponse {
        let mut r = PluginResponse::message(self.status, &self.message);
        if self.challenge {
            let clean = |s: &str| s.chars().filter(|c| *c != '"' && *c != '\\' && !c.is_control()).collect::<String>();
            let v = format!(
                "Bearer realm=\"{}\", error=\"invalid_token\", error_description=\"{}\"",
                clean(realm),
                clean(&self.message)
            );
            if let Ok(v) = HeaderValue::from_str(&v) {
                r.headers.insert(header::WWW_AUTHENTICATE, v);
            }
        }
        r
    }
}

/// Unix seconds now.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl Instance {
    /// The issuers a token may name: `claim_validator.issuer.valid_issuers`, else the discovery
    /// document's (`None`: not checked, only with `public_key` and no discovery).
    async fn issuers(&self) -> Result<Option<Vec<String>>, Failure> {
        if let Some(v) =
            self.conf.claim_validator.as_ref().and_then(|c| c.issuer.as_ref()).and_then(|i| i.valid_issuers.clone())
        {
            return Ok(Some(v));
        }
        if self.conf.discovery.is_none() {
            return Ok(None);
        }
        let d = self.meta.discovery(&self.provider).await.map_err(|e| Failure::unavailable(&e))?;
        match &d.issuer {
            Some(i) => Ok(Some(vec![i.clone()])),
            None => Err(Failure::unavailable(&MetaError::Invalid("the discovery document has no issuer".into()))),
        }
    }

    /// Verifies a parsed JWT with the JWKS (refreshed once for an unknown `kid`) or `public_key`.
    pub async fn verify_jwt(&self, token: jwt::Parsed<'_>, expect: &Expect<'_>) -> Result<Map<String, Value>, Failure> {
        if let Some(pem) = &self.pem {
            return jwt::verify_pem(token, pem, expect).map_err(|e| Failure::invalid_token(e.message()));
        }
        let mut refresh = false;
        loop {
            let keys = match self.meta.jwks(&self.provider, refresh).await {
                Ok(Some(k)) => k,
                Ok(None) => return Err(Failure::invalid_token(Invalid::UnknownKey.message())),
                Err(e) => return Err(Failure::unavailable(&e)),
            };
            match jwt::candidates(&keys.keys, &token) {
                Ok(c) => return jwt::verify_jwks(token, &c, expect).map_err(|e| Failure::invalid_token(e.message())),
                Err(Invalid::UnknownKey) if !refresh => refresh = true,
                Err(e) => return Err(Failure::invalid_token(e.message())),
            }
        }
    }

    /// Parses a JWT and screens its algorithm ([`jwt::parse`]).
    pub fn parse_jwt<'t>(&self, token: &'t str) -> Result<jwt::Parsed<'t>, Failure> {
        jwt::parse(token, self.allowed_alg).map_err(|e| Failure::invalid_token(e.message()))
    }

    /// The bearer path for a token not in the cache: verify it, remember it with the headers
    /// it gives, then [`Instance::admit`].
    async fn bearer(&self, ctx: &mut RequestCtx, token: String) -> Result<(), Failure> {
        let now = now();
        let (claims, until) = match self.mode {
            BearerMode::Introspection => {
                let c = introspect::introspect(self, ctx, &token).await?;
                let exp = c.get("exp").and_then(Value::as_i64).unwrap_or(i64::MAX);
                let interval = self.conf.introspection_interval as i64;
                // Without an interval, every request is introspected (nothing is kept).
                (c, if interval > 0 { exp.min(now + interval) } else { now })
            }
            BearerMode::Jwks | BearerMode::PublicKey => {
                // Screened before the provider is asked: garbage never costs a fetch.
                let parsed = self.parse_jwt(&token)?;
                let issuers = self.issuers().await?;
                let expect = Expect {
                    issuers: issuers.as_deref(),
                    audience: self.conf.claim_validator.as_ref().and_then(|c| c.audience.as_ref()),
                    client_id: &self.conf.client_id,
                    id_token: false,
                    nonce: None,
                    iat_slack: self.conf.iat_slack,
                    now,
                };
                let c = self.verify_jwt(parsed, &expect).await?;
                let exp = c.get("exp").and_then(Value::as_i64).unwrap_or(now);
                (c, exp)
            }
        };
        let verified = Arc::new(Verified::new(&self.conf, &token, claims));
        self.cache.put(&token, verified.clone(), now, Some(until));
        self.admit(ctx, &verified)
    }

    /// A verified token's request: its scopes checked, its headers set upstream.
    fn admit(&self, ctx: &mut RequestCtx, v: &Verified) -> Result<(), Failure> {
        if let Some(required) = &self.conf.required_scopes {
            if !jwt::has_scopes(&v.claims, required) {
                return Err(Failure::status(
                    StatusCode::FORBIDDEN,
                    format!("required scopes {} not present", required.join(", ")),
                ));
            }
        }
        if let Some((name, value)) = &v.access {
            ctx.headers.insert(name.clone(), value.clone());
        }
        if let Some(u) = &v.userinfo {
            ctx.headers.insert(upstream::X_USERINFO, u.clone());
        }
        Ok(())
    }
}

/// A verified bearer token as cached: its claims and the upstream headers made from them once.
pub struct Verified {
    claims: Map<String, Value>,
    /// `X-Access-Token` (or `Authorization`) with the token, when configured.
    access: Option<(HeaderName, HeaderValue)>,
    /// `X-Userinfo`: base64 of the claims' JSON, when configured.
    userinfo: Option<HeaderValue>,
}

impl Verified {
    fn new(conf: &Conf, token: &str, claims: Map<String, Value>) -> Self {
        let access = upstream::access_token_header(conf, token);
        let userinfo = conf.set_userinfo_header.then(|| upstream::json_value(&Value::Object(claims.clone()))).flatten();
        Verified { claims, access, userinfo }
    }
}

/// The token of `Authorization: Bearer`, else of the client's `X-Access-Token`.
fn bearer_token(ctx: &RequestCtx, x_access_token: Option<HeaderValue>) -> Result<Option<String>, Failure> {
    if let Some(auth) = ctx.headers.get(header::AUTHORIZATION) {
        let auth = auth.to_str().map_err(|_| Failure::invalid_token("Invalid Authorization header format"))?;
        let (scheme, rest) = auth.trim().split_once(' ').unwrap_or((auth.trim(), ""));
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Ok(None);
        }
        let token = rest.trim();
        if token.is_empty() {
            return Err(Failure::invalid_token("Invalid Authorization header format"));
        }
        return Ok(Some(token.to_owned()));
    }
    Ok(x_access_token.and_then(|v| v.to_str().ok().map(|s| s.trim().to_owned())).filter(|s| !s.is_empty()))
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let client_token = ctx.headers.remove(upstream::X_ACCESS_TOKEN);
        upstream::clear(ctx);
        let uses_bearer = self.conf.bearer_only
            || self.conf.introspection_endpoint.is_some()
            || self.conf.public_key.is_some()
            || self.conf.use_jwks;
        if uses_bearer {
            match bearer_token(ctx, client_token) {
                Err(f) => return Flow::Respond(f.response(&self.conf.realm)),
                Ok(Some(token)) => {
                    if let Some(hit) = self.cache.get(&token, now()) {
                        return match self.admit(ctx, &hit) {
                            Ok(()) => Flow::Continue,
                            Err(f) => Flow::Respond(f.response(&self.conf.realm)),
                        };
                    }
                    return Flow::wait(async move {
                        match self.bearer(ctx, token).await {
                            Ok(()) => Flow::Continue,
                            Err(f) => Flow::Respond(f.response(&self.conf.realm)),
                        }
                    });
                }
                Ok(None) if self.conf.bearer_only => {
                    return Flow::Respond(
                        Failure::invalid_token("No bearer token found in request").response(&self.conf.realm),
                    )
                }
                Ok(None) => {}
            }
        }
        let Some(settings) = &self.session else {
            return Flow::Respond(
                Failure::invalid_token("No bearer token found in request").response(&self.conf.realm),
            );
        };
        Flow::wait(async move {
            match flow::run(self, settings, ctx).await {
                Ok(flow) => flow,
                Err(f) => Flow::Respond(f.response(&self.conf.realm)),
            }
        })
    }
}

fn session_settings(conf: &Conf) -> Option<SessionSettings> {
    let s = conf.session.as_ref()?;
    let name = s.cookie_name.clone().unwrap_or_else(|| "session".into());
    let same_site = match s.cookie_same_site {
        None | Some(conf::SameSite::Lax) => Some("Lax"),
        Some(conf::SameSite::Strict) => Some("Strict"),
        Some(conf::SameSite::None) => Some("None"),
        Some(conf::SameSite::Default) => None,
    };
    let lifetime = s.absolute_timeout.or(s.cookie.as_ref().and_then(|c| c.lifetime)).unwrap_or(86_400);
    Some(SessionSettings {
        sealer: session::Sealer::new(&s.secret),
        login_name: format!("{name}_login"),
        name,
        attrs: session::Attributes {
            path: s.cookie_path.clone().unwrap_or_else(|| "/".into()),
            domain: s.cookie_domain.clone(),
            secure: s.cookie_secure,
            http_only: s.cookie_http_only.unwrap_or(true),
            same_site,
        },
        lifetime: lifetime.min(i64::MAX as u64) as i64,
    })
}

impl Plugin for OpenIdConnect {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "openid-connect"
    }
    fn priority(&self) -> i32 {
        2599
    }
    fn version(&self) -> f64 {
        0.2
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let (mode, token_auth, introspection_auth) = conf::check(&conf)?;
        let pem = conf.public_key.as_deref().map(PemKey::parse).transpose()?;
        let allowed_alg = conf.token_signing_alg_values_expected.as_deref().map(jwt::allowed_algorithm).transpose()?;
        if session_settings(&conf).is_some_and(|s| s.name.is_empty() || s.name.contains(['=', ';', ' ', ','])) {
            return Err("session.cookie_name: not a cookie name".into());
        }
        let addon_headers = conf
            .introspection_addon_headers
            .iter()
            .flatten()
            .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
            .collect();
        if !ctx.check_only {
            for field in conf::ignored_fields(&conf) {
                log::warn!(
                    "openid-connect ({}): `{field}` is accepted but not implemented by Weir; it has no effect",
                    ctx.owner
                );
            }
        }
        let provider =
            Provider { http: ctx.services.http_client(), timeout: conf::timeout(&conf), verify_tls: conf.ssl_verify };
        let meta = Metadata::new(conf.discovery.clone(), Duration::from_secs(conf.jwk_expires_in.max(1)));
        Ok(Arc::new(Instance {
            session: if conf.bearer_only { None } else { session_settings(&conf) },
            conf,
            mode,
            token_auth,
            introspection_auth,
            provider,
            meta,
            pem,
            allowed_alg,
            cache: VerifiedCache::default(),
            addon_headers,
        }))
    }
}

register_plugin!(OpenIdConnect);

#[cfg(test)]
mod tests;
