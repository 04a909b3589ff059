//! `basic-auth`: authenticates requests by `Authorization: Basic <base64(username:password)>`
//! against the consumers' `username`/`password`, as APISIX 3.x does, on the SDK's credential kit.
//!
//! The username finds the consumer (an index built once per snapshot; two consumers with one
//! username refuse the load), and the password is compared in constant time. A request
//! without the header answers 401 `Missing authorization in request`; a header that is not
//! `Basic`, not base64, not UTF-8 or has no `:` answers 401 `Invalid authorization in request`;
//! an unknown user or a wrong password answers 401 `Invalid user authorization`. Every 401
//! carries `WWW-Authenticate: Basic realm="<realm>"`. No answer echoes what the client sent.

use std::sync::Arc;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::auth::{self, CredentialIndex, Rejection};
use weir_plugin::http::header::AUTHORIZATION;
use weir_plugin::http::HeaderValue;
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Consumer, ConsumerRef, Flow, Late, Plugin, PluginInstance, RequestCtx,
    SharedState, Value,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Remove `Authorization` from the request before it is proxied.
    #[serde(default)]
    pub hide_credentials: bool,
    /// The realm named in `WWW-Authenticate`.
    #[serde(default = "default_realm")]
    #[schemars(length(min = 1))]
    pub realm: String,
    /// The consumer a request without valid credentials is treated as (instead of a 401).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub anonymous_consumer: Option<String>,
}

fn default_realm() -> String {
    "basic".into()
}

/// Consumer configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConf {
    /// The user name; unique across consumers.
    #[schemars(length(min = 1))]
    pub username: String,
    /// The password.
    #[schemars(length(min = 1))]
    pub password: String,
}

/// The plugin.
pub struct BasicAuth;

/// Username → (consumer, password).
type Index = CredentialIndex<Box<[u8]>>;

struct Instance {
    hide_credentials: bool,
    challenge: HeaderValue,
    index: Option<Arc<Index>>,
    anonymous: Option<Arc<Consumer>>,
}

/// `(username, password)` of an `Authorization` value, or why it is not one.
pub fn credentials(value: &[u8]) -> Option<(String, String)> {
    let rest = value.strip_prefix(b"Basic ").or_else(|| value.strip_prefix(b"basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(rest.trim_ascii()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

impl Instance {
    fn authenticate(&self, ctx: &RequestCtx) -> Result<Arc<Consumer>, Rejection> {
        let challenge = |m| Rejection::Challenge(m, self.challenge.clone());
        let Some(value) = ctx.headers.get(AUTHORIZATION) else {
            return Err(challenge("Missing authorization in request"));
        };
        let Some((user, password)) = credentials(value.as_bytes()) else {
            return Err(challenge("Invalid authorization in request"));
        };
        match self.index.as_ref().and_then(|i| i.find(user.as_bytes())) {
            Some((consumer, expected)) if auth::ct_eq(expected, password.as_bytes()) => Ok(consumer.clone()),
            _ => Err(challenge("Invalid user authorization")),
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let found = self.authenticate(ctx);
        auth::finish(ctx, found, self.anonymous.as_ref(), |ctx| {
            if self.hide_credentials {
                ctx.headers.remove(AUTHORIZATION);
            }
        })
    }
}

impl Plugin for BasicAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "basic-auth"
    }
    fn priority(&self) -> i32 {
        2520
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn consumer_schema(&self) -> Option<Value> {
        Some(schema_of::<ConsumerConf>())
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        auth::index_consumers("username", consumers, |c: ConsumerConf| {
            (c.username.into_bytes(), c.password.into_bytes().into_boxed_slice())
        })
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let challenge = auth::challenge("Basic", &conf.realm)?;
        Ok(Arc::new(Instance {
            hide_credentials: conf.hide_credentials,
            challenge,
            index: ctx.shared_as::<Index>()?,
            anonymous: auth::anonymous(conf.anonymous_consumer.as_deref(), ctx.consumers)?,
        }))
    }
}

register_plugin!(BasicAuth);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::{instance_with_consumers, run, TestRequest};

    fn basic(text: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(text))
    }

    fn outcome(conf: Value, authorization: Option<&str>) -> (Option<(u16, String)>, RequestCtx) {
        let consumers = [
            ("jack", json!({"username": "jack", "password": "123456"})),
            ("rose", json!({"username": "rose", "password": "pass:word"})),
            ("guest", json!({"username": "guest-user", "password": "guest-password"})),
        ];
        let p = instance_with_consumers(&BasicAuth, conf, &consumers).unwrap_or_else(|e| panic!("{e}"));
        let mut req = TestRequest::get("/");
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let mut ctx = req.build();
        let answer = run(&[p], &mut ctx).map(|r| {
            let challenge = r.headers.get("www-authenticate").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            assert_eq!(challenge, "Basic realm=\"basic\"");
            (r.status.as_u16(), String::from_utf8_lossy(&r.body).into_owned())
        });
        (answer, ctx)
    }

    #[test]
    fn the_right_password_identifies_the_consumer() {
        let (answer, ctx) = outcome(json!({}), Some(&basic("jack:123456")));
        assert!(answer.is_none());
        assert_eq!(ctx.header("x-consumer-username"), Some("jack"));
        assert!(ctx.header("authorization").is_some(), "kept without hide_credentials");
        // The password may contain a colon: only the first separates.
        assert!(outcome(json!({}), Some(&basic("rose:pass:word"))).0.is_none());
        let (_, ctx) = outcome(json!({"hide_credentials": true}), Some(&basic("jack:123456")));
        assert!(ctx.header("authorization").is_none());
    }

    #[test]
    fn everything_else_is_a_401_that_echoes_nothing() {
        let msg = |a: Option<&str>| outcome(json!({}), a).0;
        let missing = msg(None);
        assert_eq!(missing, Some((401, r#"{"message":"Missing authorization in request"}"#.into())));
        for bad in ["Basic !!!", "Bearer abc", &basic("no-colon"), "Basic /w==", "Basic"] {
            assert_eq!(
                msg(Some(bad)).map(|m| m.1),
                Some(r#"{"message":"Invalid authorization in request"}"#.into()),
                "{bad}"
            );
        }
        for wrong in [basic("jack:12345"), basic("jack:1234567"), basic("nobody:123456"), basic(":")] {
            let answer = msg(Some(&wrong));
            assert_eq!(answer, Some((401, r#"{"message":"Invalid user authorization"}"#.into())), "{wrong}");
        }
    }

    #[test]
    fn anonymous_consumer_and_duplicate_usernames() {
        let (answer, ctx) = outcome(json!({"anonymous_consumer": "guest"}), None);
        assert!(answer.is_none());
        assert_eq!(ctx.consumer.map(|c| c.username.to_string()).as_deref(), Some("guest"));
        let dup = [("a", json!({"username": "u", "password": "1"})), ("b", json!({"username": "u", "password": "2"}))];
        let e = instance_with_consumers(&BasicAuth, json!({}), &dup).err().unwrap_or_default();
        assert_eq!(e, "consumers `a` and `b` have the same username; it must be unique");
    }

    #[test]
    fn decoding_is_strict() {
        assert_eq!(credentials(basic("a:b").as_bytes()), Some(("a".into(), "b".into())));
        assert_eq!(credentials(b"Basic \xff\xfe"), None);
        let non_utf8 = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode([0xff, b':', 0xfe]));
        assert_eq!(credentials(non_utf8.as_bytes()), None);
    }
}
