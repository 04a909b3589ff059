//! `key-auth`: authenticates requests by an API key carried in a header or query argument, and
//! sets the consumer that owns the key.
//!
//! Keys are indexed per snapshot (unique across consumers, checked at load). A lookup never
//! compares secrets in variable time: keys are bucketed by a randomly keyed hash, and candidates
//! in the bucket are compared in constant time.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, StatusCode};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Consumer, ConsumerRef, Flow, Plugin, PluginInstance, PluginResponse,
    RequestCtx, SharedState, Value,
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

/// Constant-time equality of two byte strings (time depends only on the lengths).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// Keys (and their owners) sharing one keyed-hash bucket.
type Bucket = Vec<(Vec<u8>, Arc<str>)>;

/// Key → consumer index of one snapshot.
pub struct KeyIndex {
    hasher: RandomState,
    buckets: HashMap<u64, Bucket>,
}

impl KeyIndex {
    fn build(consumers: &[ConsumerRef<'_>]) -> Result<KeyIndex, String> {
        let hasher = RandomState::new();
        let mut buckets: HashMap<u64, Bucket> = HashMap::new();
        let mut owners: HashMap<String, &str> = HashMap::new();
        for c in consumers {
            let conf: ConsumerConf = weir_plugin::parse_conf(c.conf)?;
            if let Some(first) = owners.insert(conf.key.clone(), c.username) {
                return Err(format!("consumers `{first}` and `{}` have the same key; keys must be unique", c.username));
            }
            let h = hasher.hash_one(conf.key.as_bytes());
            buckets.entry(h).or_default().push((conf.key.into_bytes(), Arc::from(c.username)));
        }
        Ok(KeyIndex { hasher, buckets })
    }

    /// The consumer owning `key`.
    pub fn find(&self, key: &[u8]) -> Option<Arc<str>> {
        let bucket = self.buckets.get(&self.hasher.hash_one(key))?;
        let mut found = None;
        for (k, user) in bucket {
            if ct_eq(k, key) {
                found = Some(user.clone());
            }
        }
        found
    }
}

/// The plugin.
pub struct KeyAuth;

struct Instance {
    conf: Conf,
    /// `conf.header`, parsed once.
    header: HeaderName,
    index: Option<Arc<KeyIndex>>,
}

fn reject(msg: &str) -> Flow {
    Flow::Respond(PluginResponse::message(StatusCode::UNAUTHORIZED, msg))
}

impl PluginInstance for Instance {
    fn reads_request_headers_late(&self) -> bool {
        false
    }
    /// Authentication runs in the rewrite phase, as in APISIX, so that the consumer is known to
    /// every plugin after it (its priority, 2500, puts it before proxy-rewrite and limit-count).
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow {
        // The key is looked up where it lies in the request: no copy of it.
        let key = match ctx.headers.get(&self.header).and_then(|v| v.to_str().ok()) {
            Some(k) => k,
            None => match ctx.arg(&self.conf.query) {
                Some(k) if !k.is_empty() => k,
                _ => return reject("Missing API key in request"),
            },
        };
        let Some(user) = self.index.as_ref().and_then(|i| i.find(key.as_bytes())) else {
            return reject("Invalid API key in request");
        };
        ctx.consumer = Some(Consumer { username: user });
        if self.conf.hide_credentials {
            ctx.headers.remove(&self.header);
            let name = &self.conf.query;
            let kept: Vec<&str> =
                ctx.query.split('&').filter(|kv| kv.split('=').next() != Some(name.as_str())).collect();
            ctx.query = kept.join("&");
        }
        Flow::Continue
    }
}

impl Plugin for KeyAuth {
    fn name(&self) -> &'static str {
        "key-auth"
    }
    fn priority(&self) -> i32 {
        2500
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn consumer_schema(&self) -> Option<Value> {
        Some(schema_of::<ConsumerConf>())
    }
    fn prepare_consumers(&self, consumers: &[ConsumerRef<'_>]) -> Result<Option<SharedState>, String> {
        Ok(Some(Arc::new(KeyIndex::build(consumers)?)))
    }
    fn build(&self, conf: &Value, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let conf: Conf = weir_plugin::parse_conf(conf)?;
        let index = ctx.shared.and_then(|s| s.clone().downcast::<KeyIndex>().ok());
        let header = HeaderName::from_bytes(conf.header.as_bytes())
            .map_err(|_| format!("header: {:?} is not a valid header name", conf.header))?;
        Ok(Arc::new(Instance { conf, header, index }))
    }
}

register_plugin!(KeyAuth);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
    }

    #[test]
    fn index_finds_and_rejects_duplicates() {
        let (a, b) = (serde_json::json!({"key": "k1"}), serde_json::json!({"key": "k2"}));
        let idx =
            KeyIndex::build(&[ConsumerRef { username: "jack", conf: &a }, ConsumerRef { username: "rose", conf: &b }])
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(idx.find(b"k2").as_deref(), Some("rose"));
        assert!(idx.find(b"k3").is_none());
        let dup =
            KeyIndex::build(&[ConsumerRef { username: "jack", conf: &a }, ConsumerRef { username: "rose", conf: &a }]);
        assert_eq!(dup.err().as_deref(), Some("consumers `jack` and `rose` have the same key; keys must be unique"));
    }
}
