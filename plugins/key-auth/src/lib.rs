//! `key-auth`: authenticates requests by an API key carried in a header or query argument, and
//! sets the consumer that owns the key.
//!
//! Built on the SDK's credential kit (`weir_plugin::auth`): keys are indexed per snapshot
//! (unique across consumers, checked at load) and compared in constant time; the consumer is
//! attached with `X-Consumer-Username` upstream; `anonymous_consumer` stands in for a missing
//! or invalid key.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::auth::{self, CredentialIndex, Rejection};
use weir_plugin::http::HeaderName;
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Consumer, ConsumerRef, Flow, Late, Plugin, PluginInstance, RequestCtx,
    SharedState, Value,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Header carrying the key.
    #[serde(default = "default_name")]
    #[schemars(length(min = 1))]
    pub header: String,
    /// Query argument carrying the key (looked at when the header is absent).
    #[serde(default = "default_name")]
    #[schemars(length(min = 1))]
    pub query: String,
    /// Remove the key from the request before it is proxied.
    #[serde(default)]
    pub hide_credentials: bool,
    /// The consumer a request without a valid key is treated as (instead of a 401).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub anonymous_consumer: Option<String>,
}

fn default_name() -> String {
    "apikey".into()
}

/// Consumer configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConf {
    /// The consumer's API key; unique across consumers.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// The plugin.
pub struct KeyAuth;

struct Instance {
    conf: Conf,
    /// `conf.header`, parsed once.
    header: HeaderName,
    index: Option<Arc<CredentialIndex<()>>>,
    anonymous: Option<Arc<Consumer>>,
}

impl Instance {
    fn authenticate(&self, ctx: &RequestCtx) -> Result<Arc<Consumer>, Rejection> {
        // The key is looked up where it lies in the request: no copy of it.
        let key = match ctx.headers.get(&self.header) {
            Some(k) => k.as_bytes(),
            None => match ctx.arg(&self.conf.query) {
                Some(k) if !k.is_empty() => k.as_bytes(),
                _ => return Err(Rejection::Missing("Missing API key in request")),
            },
        };
        match self.index.as_ref().and_then(|i| i.find(key)) {
            Some((consumer, ())) => Ok(consumer.clone()),
            None => Err(Rejection::Invalid("Invalid API key in request")),
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    /// Authentication runs in the rewrite phase, as in APISIX, so that the consumer is known to
    /// every plugin after it (its priority, 2500, puts it before proxy-rewrite and limit-count).
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let found = self.authenticate(ctx);
        auth::finish(ctx, found, self.anonymous.as_ref(), |ctx| {
            if self.conf.hide_credentials {
                ctx.headers.remove(&self.header);
                auth::remove_query_arg(&mut ctx.query, &self.conf.query);
            }
        })
    }
}

impl Plugin for KeyAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "key-auth"
    }
    fn priority(&self) -> i32 {
        2500
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn consumer_schema(&self) -> Option<Value> {
        Some(schema_of::<ConsumerConf>())
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        auth::index_consumers("key", consumers, |c: ConsumerConf| (c.key.into_bytes(), ()))
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let index = ctx.shared_as::<CredentialIndex<()>>()?;
        let header = HeaderName::from_bytes(conf.header.as_bytes())
            .map_err(|_| format!("header: {:?} is not a valid header name", conf.header))?;
        let anonymous = auth::anonymous(conf.anonymous_consumer.as_deref(), ctx.consumers)?;
        Ok(Arc::new(Instance { conf, header, index, anonymous }))
    }
}

register_plugin!(KeyAuth);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::{instance_with_consumers, run, TestRequest};

    fn status(conf: Value, req: TestRequest) -> (Option<u16>, Option<String>) {
        let consumers = [("jack", json!({"key": "k1"})), ("rose", json!({"key": "k2"}))];
        let p = instance_with_consumers(&KeyAuth, conf, &consumers).unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = req.build();
        let answer = run(&[p], &mut ctx).map(|r| r.status.as_u16());
        (answer, ctx.header("x-consumer-username").map(str::to_owned))
    }

    #[test]
    fn keys_identify_consumers_and_nothing_else() {
        assert_eq!(status(json!({}), TestRequest::get("/").header("apikey", "k2")), (None, Some("rose".into())));
        assert_eq!(status(json!({}), TestRequest::get("/?apikey=k1")), (None, Some("jack".into())));
        assert_eq!(status(json!({}), TestRequest::get("/").header("apikey", "k3")).0, Some(401));
        assert_eq!(status(json!({}), TestRequest::get("/")).0, Some(401));
        // A client cannot claim an identity by sending the header itself.
        let forged = TestRequest::get("/").header("apikey", "k1").header("x-consumer-username", "rose");
        assert_eq!(status(json!({}), forged), (None, Some("jack".into())));
    }

    #[test]
    fn duplicate_keys_and_bad_configurations_are_refused() {
        let dup = [("jack", json!({"key": "k"})), ("rose", json!({"key": "k"}))];
        let e = instance_with_consumers(&KeyAuth, json!({}), &dup).err().unwrap_or_default();
        assert_eq!(e, "consumers `jack` and `rose` have the same key; it must be unique");
        assert!(instance_with_consumers(&KeyAuth, json!({"header": ""}), &[]).is_err());
        assert!(instance_with_consumers(&KeyAuth, json!({"hide": true}), &[]).is_err());
        let e = instance_with_consumers(&KeyAuth, json!({"anonymous_consumer": "nobody"}), &[]).err();
        assert_eq!(e.as_deref(), Some("anonymous_consumer: consumer `nobody` does not exist"));
    }

    #[test]
    fn anonymous_consumer_stands_in_for_a_missing_key() {
        let consumers = [("jack", json!({"key": "k1"})), ("guest", json!({"key": "unused-guest-key"}))];
        let p = instance_with_consumers(&KeyAuth, json!({"anonymous_consumer": "guest"}), &consumers)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/").build();
        assert!(run(&[p], &mut ctx).is_none());
        assert_eq!(ctx.consumer.map(|c| c.username.to_string()).as_deref(), Some("guest"));
    }
}
