//! `hmac-auth`: authenticates requests signed with a consumer's secret, as APISIX 3.x does
//! (`Authorization: Signature keyId="...",algorithm="hmac-sha256",headers="@request-target date",signature="..."`),
//! on the SDK's credential kit.
//!
//! The signing string is the `keyId`, then one line per name of `headers`, in the client's
//! order: `name: value` for a request header, `METHOD request-uri` for `@request-target`; each
//! line ends with `\n`. The `keyId` finds the credential; the signature is checked in constant
//! time with the algorithm the client named, if the route allows it. The `Date` header must be
//! within `clock_skew` seconds of now and, by default (`signed_headers: ["date"]`), signed, so
//! a captured request cannot be replayed later with a fresh date. With `validate_request_body`
//! the body's SHA-256 must match `Digest: SHA-256=<base64>` (sign `digest` too, through
//! `signed_headers`, to bind the body to the signature).

use std::sync::Arc;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ring::{digest, hmac};
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::auth::{self, CredentialIndex, Rejection};
use weir_plugin::http::header::AUTHORIZATION;
use weir_plugin::http::{HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Consumer, ConsumerRef, Flow, Late, Plugin, PluginInstance,
    PluginResponse, RequestCtx, SharedState, Value,
};

mod signature;
pub use signature::{fuzz_authorization, parse_authorization, Params};

/// The algorithms a client may name.
pub const ALGORITHMS: [&str; 3] = ["hmac-sha1", "hmac-sha256", "hmac-sha512"];

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The algorithms clients may sign with.
    #[serde(default = "default_algorithms")]
    #[schemars(length(min = 1), inner(regex(pattern = "^hmac-sha(1|256|512)$")))]
    pub allowed_algorithms: Vec<String>,
    /// Largest difference (seconds) between the `Date` header and now.
    #[serde(default = "default_skew")]
    #[schemars(range(min = 1))]
    pub clock_skew: u64,
    /// Headers every signature must cover (an empty list: none required).
    #[serde(default = "default_signed")]
    #[schemars(inner(length(min = 1, max = 50)))]
    pub signed_headers: Vec<String>,
    /// Check the body against the `Digest` header (the body is read before the upstream sees it).
    #[serde(default)]
    pub validate_request_body: bool,
    /// The largest body read for `validate_request_body` (bytes); longer: 413.
    #[serde(default = "default_max_body")]
    #[schemars(range(min = 1))]
    pub max_req_body_size: u64,
    /// Remove `Authorization` before proxying.
    #[serde(default)]
    pub hide_credentials: bool,
    /// The realm named in `WWW-Authenticate`.
    #[serde(default = "default_realm")]
    #[schemars(length(min = 1))]
    pub realm: String,
    /// The consumer an unauthenticated request is treated as (instead of a 401).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub anonymous_consumer: Option<String>,
}

fn default_algorithms() -> Vec<String> {
    ALGORITHMS.iter().map(|a| (*a).to_owned()).collect()
}
fn default_skew() -> u64 {
    300
}
fn default_signed() -> Vec<String> {
    vec!["date".into()]
}
fn default_max_body() -> u64 {
    64 * 1024 * 1024
}
fn default_realm() -> String {
    "hmac".into()
}

/// Consumer (credential) configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConf {
    /// The key id clients name in `keyId`; unique across consumers.
    #[schemars(length(min = 1, max = 256))]
    pub key_id: String,
    /// The shared secret.
    #[schemars(length(min = 1, max = 256))]
    pub secret_key: String,
}

/// The plugin.
pub struct HmacAuth;

struct Instance {
    conf: Conf,
    challenge: HeaderValue,
    index: Option<Arc<CredentialIndex<Keys>>>,
    anonymous: Option<Arc<Consumer>>,
}

/// A credential's secret as HMAC keys, scheduled once per snapshot (not per request), in the
/// order of [`ALGORITHMS`].
pub struct Keys([hmac::Key; 3]);

impl Keys {
    fn new(secret: &[u8]) -> Self {
        Keys([
            hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret),
            hmac::Key::new(hmac::HMAC_SHA256, secret),
            hmac::Key::new(hmac::HMAC_SHA512, secret),
        ])
    }
}

/// Why a request failed, for the log (the client gets APISIX's fixed answer).
enum Failure {
    /// Before the signature was looked at: APISIX names the reason in the answer.
    Unreadable(&'static str),
    /// The signature, its date, its headers or the body did not check out.
    Invalid(String),
    /// The body is over `max_req_body_size`.
    TooLarge,
}

impl Instance {
    fn authenticate(&self, ctx: &RequestCtx) -> Result<Arc<Consumer>, Failure> {
        let Some(header) = ctx.headers.get(AUTHORIZATION) else {
            return Err(Failure::Unreadable("client request can't be validated: missing Authorization header"));
        };
        let params = parse_authorization(header.to_str().unwrap_or("")).map_err(Failure::Unreadable)?;
        let Some((consumer, keys)) = self.index.as_ref().and_then(|i| i.find(params.key_id.as_bytes())) else {
            return Err(Failure::Invalid("Invalid key_id".into()));
        };
        if !self.conf.allowed_algorithms.iter().any(|a| *a == params.algorithm) {
            return Err(Failure::Invalid("Invalid algorithm".into()));
        }
        // Allowed algorithms are among ALGORITHMS (the schema says so).
        let Some(key) = ALGORITHMS.iter().position(|a| *a == params.algorithm).map(|i| &keys.0[i]) else {
            return Err(Failure::Invalid("Invalid algorithm".into()));
        };
        let date = ctx.header("date").ok_or_else(|| Failure::Invalid("Date header missing".into()))?;
        let Ok(when) = chrono::DateTime::parse_from_rfc2822(date) else {
            return Err(Failure::Invalid("Invalid GMT format time".into()));
        };
        let skew = chrono::Utc::now().timestamp().abs_diff(when.timestamp());
        if skew > self.conf.clock_skew {
            return Err(Failure::Invalid(format!("Clock skew exceeded ({skew} s)")));
        }
        for required in &self.conf.signed_headers {
            if !params.headers.iter().any(|h| h.eq_ignore_ascii_case(required)) {
                return Err(Failure::Invalid(format!("expected header \"{required}\" missing in signing")));
            }
        }
        let Ok(signature) = STANDARD.decode(params.signature) else {
            return Err(Failure::Invalid("the signature is not base64".into()));
        };
        let signing = signing_string(ctx, &params);
        if hmac::verify(key, signing.as_bytes(), &signature).is_err() {
            return Err(Failure::Invalid("Invalid signature".into()));
        }
        if self.conf.validate_request_body {
            let body = ctx.body.as_deref().unwrap_or(b"");
            if body.len() as u64 > self.conf.max_req_body_size {
                return Err(Failure::TooLarge);
            }
            let want = format!("SHA-256={}", STANDARD.encode(digest::digest(&digest::SHA256, body)));
            if !ctx.header("digest").is_some_and(|d| auth::ct_eq(d.as_bytes(), want.as_bytes())) {
                return Err(Failure::Invalid("Invalid digest".into()));
            }
        }
        Ok(consumer.clone())
    }
}

/// The string the client signed (see the module documentation).
pub fn signing_string(ctx: &RequestCtx, params: &Params<'_>) -> String {
    let mut s = String::with_capacity(128);
    s.push_str(params.key_id);
    s.push('\n');
    for name in &params.headers {
        if let Some(v) = ctx.headers.get(*name) {
            s.push_str(name);
            s.push_str(": ");
            s.push_str(&String::from_utf8_lossy(v.as_bytes()));
            s.push('\n');
        } else if *name == "@request-target" {
            // The target exactly as the client sent (and signed) it, as APISIX's `request_uri`;
            // the gateway's normalization of it is deterministic, so the signature binds what
            // the upstream receives too.
            s.push_str(ctx.method.as_str());
            s.push(' ');
            match &ctx.request_target {
                Some(t) => s.push_str(t.as_str()),
                None => {
                    s.push_str(&ctx.path);
                    if !ctx.query.is_empty() {
                        s.push('?');
                        s.push_str(&ctx.query);
                    }
                }
            }
            s.push('\n');
        }
    }
    s
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn wants_request_body(&self) -> bool {
        self.conf.validate_request_body
    }
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let found = match self.authenticate(ctx) {
            Ok(c) => Ok(c),
            Err(Failure::TooLarge) => {
                let m = "request body is larger than max_req_body_size";
                return Flow::Respond(PluginResponse::message(StatusCode::PAYLOAD_TOO_LARGE, m));
            }
            Err(Failure::Unreadable(m)) => Err(Rejection::Challenge(m, self.challenge.clone())),
            Err(Failure::Invalid(why)) => {
                log::info!("hmac-auth: client request can't be validated: {why}");
                Err(Rejection::Challenge("client request can't be validated", self.challenge.clone()))
            }
        };
        auth::finish(ctx, found, self.anonymous.as_ref(), |ctx| {
            if self.conf.hide_credentials {
                ctx.headers.remove(AUTHORIZATION);
            }
        })
    }
}

impl Plugin for HmacAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "hmac-auth"
    }
    fn priority(&self) -> i32 {
        2530
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn consumer_schema(&self) -> Option<Value> {
        Some(schema_of::<ConsumerConf>())
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        auth::index_consumers("key_id", consumers, |c: ConsumerConf| {
            (c.key_id.into_bytes(), Keys::new(c.secret_key.as_bytes()))
        })
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let index = ctx.shared_as::<CredentialIndex<Keys>>()?;
        if let Some(a) = conf.allowed_algorithms.iter().find(|a| !ALGORITHMS.contains(&a.as_str())) {
            return Err(format!("allowed_algorithms: unknown algorithm `{a}`"));
        }
        let challenge = auth::challenge("hmac", &conf.realm)?;
        let anonymous = auth::anonymous(conf.anonymous_consumer.as_deref(), ctx.consumers)?;
        Ok(Arc::new(Instance { conf, challenge, index, anonymous }))
    }
}

register_plugin!(HmacAuth);

#[cfg(test)]
mod tests;
