//! `jwt-auth`: authenticates requests by a JSON Web Token, as APISIX 3.x's plugin does, on the
//! SDK's credential kit and its strict JWT module (`weir_plugin::jwt`).
//!
//! The token comes from the `header` (`Authorization: Bearer <token>` or bare), else the
//! `query` argument, else the `cookie`. Its `key` claim (`key_claim_name`) names the consumer
//! credential; the token is then verified with *that credential's* algorithm and key only: a
//! token's own `alg` is never a choice (`none`, another algorithm, or an RSA public key used as
//! an HMAC secret are refused), `exp`/`nbf` are checked with the credential's
//! `lifetime_grace_period`. Public-key signatures are verified once per token and remembered
//! (a bounded cache expiring with the token). Every 401 is APISIX's answer with
//! `WWW-Authenticate: Bearer realm="<realm>"`; no answer or log line holds the token or a key.

use std::sync::Arc;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::auth::{self, CredentialIndex, Rejection};
use weir_plugin::http::{HeaderName, HeaderValue};
use weir_plugin::jwt::{self, Key, VerifiedCache, Verifier};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Consumer, ConsumerRef, Flow, Late, Plugin, PluginInstance, RequestCtx,
    SharedState, Value,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Header carrying the token (`Bearer <token>`, or the bare token).
    #[serde(default = "default_header")]
    #[schemars(length(min = 1))]
    pub header: String,
    /// Query argument carrying the token (when the header is absent).
    #[serde(default = "default_jwt")]
    #[schemars(length(min = 1))]
    pub query: String,
    /// Cookie carrying the token (when the header and argument are absent).
    #[serde(default = "default_jwt")]
    #[schemars(length(min = 1))]
    pub cookie: String,
    /// Remove the token from the request before it is proxied.
    #[serde(default)]
    pub hide_credentials: bool,
    /// The claim naming the consumer's credential `key`.
    #[serde(default = "default_key_claim")]
    #[schemars(length(min = 1))]
    pub key_claim_name: String,
    /// Keep the verified payload for later plugins (a [`Payload`] slot).
    #[serde(default)]
    pub store_in_ctx: bool,
    /// The realm named in `WWW-Authenticate`.
    #[serde(default = "default_realm")]
    #[schemars(length(min = 1))]
    pub realm: String,
    /// The consumer a request without a valid token is treated as (instead of a 401).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub anonymous_consumer: Option<String>,
    /// Claims that must be present and valid (`exp`, `nbf`); without it, each is checked when
    /// present.
    #[serde(default)]
    #[schemars(inner(regex(pattern = "^(exp|nbf)$")), extend("uniqueItems" = true))]
    pub claims_to_verify: Vec<String>,
}

fn default_header() -> String {
    "authorization".into()
}
fn default_jwt() -> String {
    "jwt".into()
}
fn default_key_claim() -> String {
    "key".into()
}
fn default_realm() -> String {
    "jwt".into()
}

/// Consumer (credential) configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConf {
    /// The credential's key, which tokens name in their `key` claim; unique across consumers.
    #[schemars(length(min = 1))]
    pub key: String,
    /// The HMAC secret (HS256, HS384, HS512).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub secret: Option<String>,
    /// The PEM public key (RS*, PS*, ES256, ES384, EdDSA).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub public_key: Option<String>,
    /// The algorithm every token of this credential must be signed with.
    #[serde(default = "default_algorithm")]
    #[schemars(extend("enum" = jwt::ALGORITHMS))]
    pub algorithm: String,
    /// Lifetime of tokens APISIX's signing API issued (accepted for compatibility; Weir does
    /// not issue tokens).
    #[serde(default = "default_exp")]
    #[schemars(range(min = 1))]
    pub exp: u64,
    /// `secret` is standard base64.
    #[serde(default)]
    pub base64_secret: bool,
    /// Seconds of leeway on `exp` and `nbf`.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub lifetime_grace_period: u64,
}

fn default_algorithm() -> String {
    "HS256".into()
}
fn default_exp() -> u64 {
    86400
}

/// The verified token's claims, kept for later plugins with `store_in_ctx`.
pub struct Payload(pub serde_json::Map<String, Value>);

/// A credential ready to verify: its verifier and grace period.
struct Credential {
    verifier: Verifier,
    leeway: i64,
}

impl ConsumerConf {
    /// The verifier this credential describes, or why it cannot work.
    fn credential(&self, consumer: &str) -> Result<Credential, String> {
        let secret;
        let key = if self.algorithm.starts_with("HS") {
            let Some(given) = self.secret.as_deref() else {
                return Err("property \"secret\" is required when using HS based algorithms".into());
            };
            secret = if self.base64_secret {
                base64::engine::general_purpose::STANDARD
                    .decode(given)
                    .map_err(|_| "base64_secret required but the secret is not in base64 format".to_owned())?
            } else {
                given.as_bytes().to_vec()
            };
            if secret.len() < 32 {
                log::warn!(
                    "jwt-auth: consumer `{consumer}`'s {} secret is {} bytes; 32 or more resist guessing",
                    self.algorithm,
                    secret.len()
                );
            }
            Key::Secret(&secret)
        } else {
            match self.public_key.as_deref() {
                Some(pem) => Key::Pem(pem),
                None => return Err(format!("missing valid public key: {} needs `public_key`", self.algorithm)),
            }
        };
        Verifier::new(&self.algorithm, key).map(|verifier| Credential { verifier, leeway: self.leeway() })
    }

    fn leeway(&self) -> i64 {
        i64::try_from(self.lifetime_grace_period).unwrap_or(i64::MAX)
    }
}

/// The plugin.
pub struct JwtAuth;

struct Instance {
    conf: Conf,
    header: HeaderName,
    challenge: HeaderValue,
    index: Option<Arc<CredentialIndex<Credential>>>,
    anonymous: Option<Arc<Consumer>>,
    cache: VerifiedCache,
}

/// Where the token was found (to hide it there).
enum Source {
    Header,
    Query,
    Cookie,
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl Instance {
    fn reject(&self, message: &'static str) -> Rejection {
        Rejection::Challenge(message, self.challenge.clone())
    }

    fn token<'r>(&self, ctx: &'r RequestCtx) -> Option<(&'r str, Source)> {
        if let Some(v) = ctx.headers.get(&self.header) {
            let v = v.to_str().unwrap_or("");
            let token = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")).unwrap_or(v);
            return Some((token, Source::Header));
        }
        if let Some(t) = ctx.arg(&self.conf.query) {
            return Some((t, Source::Query));
        }
        ctx.cookie(&self.conf.cookie).map(|t| (t, Source::Cookie))
    }

    fn authenticate(&self, ctx: &mut RequestCtx) -> Result<(Arc<Consumer>, Source), Rejection> {
        let Some((token, source)) = self.token(ctx) else { return Err(self.reject("Missing JWT token in request")) };
        let now = now();
        if let Some(consumer) = self.cache.get(token, now) {
            return Ok((consumer, source));
        }
        let parsed = match jwt::parse(token) {
            Ok(t) => t,
            Err(why) => {
                log::info!("jwt-auth: JWT token invalid: {why}");
                return Err(self.reject("JWT token invalid"));
            }
        };
        let Some(key) = parsed.claims.get(&self.conf.key_claim_name).and_then(Value::as_str) else {
            return Err(self.reject("missing user key in JWT token"));
        };
        let Some((consumer, credential)) = self.index.as_ref().and_then(|i| i.find(key.as_bytes())) else {
            return Err(self.reject("Invalid user key in JWT token"));
        };
        if let Err(why) = credential.verifier.verify(&parsed) {
            log::info!("jwt-auth: consumer `{}`: failed to verify jwt: {why}", consumer.username);
            return Err(self.reject("failed to verify jwt"));
        }
        let until = match jwt::check_times(&parsed.claims, &self.conf.claims_to_verify, now, credential.leeway) {
            Ok(until) => until,
            Err(why) => {
                log::info!("jwt-auth: consumer `{}`: failed to verify jwt: {why}", consumer.username);
                return Err(self.reject("failed to verify jwt"));
            }
        };
        let consumer = consumer.clone();
        // A verified token is remembered (a hit costs a keyed hash and one comparison, less
        // than parsing it again, let alone an RSA check); with store_in_ctx every request
        // needs its payload, so it is parsed every time.
        if !self.conf.store_in_ctx {
            self.cache.put(token, consumer.clone(), now, until);
        }
        if self.conf.store_in_ctx {
            ctx.slots.insert(Payload(parsed.claims));
        }
        Ok((consumer, source))
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    /// Rewrite phase, as in APISIX: the consumer is known to every plugin after this one.
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let (found, source) = match self.authenticate(ctx) {
            Ok((c, s)) => (Ok(c), Some(s)),
            Err(r) => (Err(r), None),
        };
        auth::finish(ctx, found, self.anonymous.as_ref(), |ctx| {
            if !self.conf.hide_credentials {
                return;
            }
            match source {
                Some(Source::Header) => {
                    ctx.headers.remove(&self.header);
                }
                Some(Source::Query) => auth::remove_query_arg(&mut ctx.query, &self.conf.query),
                Some(Source::Cookie) => auth::remove_cookie(&mut ctx.headers, &self.conf.cookie),
                None => {}
            }
        })
    }
}

impl Plugin for JwtAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "jwt-auth"
    }
    fn priority(&self) -> i32 {
        2510
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn consumer_schema(&self) -> Option<Value> {
        Some(schema_of::<ConsumerConf>())
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        let mut items = Vec::with_capacity(consumers.len());
        for c in consumers {
            let conf: ConsumerConf = weir_plugin::parse_conf(c.conf)?;
            let credential = conf.credential(c.username).map_err(|e| match &c.consumer.credential_id {
                Some(id) => format!("consumer `{}`, credential `{id}`: {e}", c.username),
                None => format!("consumer `{}`: {e}", c.username),
            })?;
            items.push((conf.key.into_bytes(), c.consumer, credential));
        }
        Ok(Some(Arc::new(CredentialIndex::build("key", items)?)))
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let index = ctx.shared_as::<CredentialIndex<Credential>>()?;
        let header = HeaderName::from_bytes(conf.header.as_bytes())
            .map_err(|_| format!("header: {:?} is not a valid header name", conf.header))?;
        let challenge = auth::challenge("Bearer", &conf.realm)?;
        let anonymous = auth::anonymous(conf.anonymous_consumer.as_deref(), ctx.consumers)?;
        Ok(Arc::new(Instance { conf, header, challenge, index, anonymous, cache: VerifiedCache::default() }))
    }
}

register_plugin!(JwtAuth);

#[cfg(test)]
mod tests;
