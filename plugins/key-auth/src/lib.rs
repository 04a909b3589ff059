//! `key-auth`: authenticates requests by an API key carried in a header or query argument, and
//! sets the consumer that owns the key.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::{register_plugin, schema_of, BuildContext, Plugin, PluginInstance, Value};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Header carrying the key.
    #[serde(default = "default_header")]
    #[schemars(length(min = 1))]
    pub header: String,
    /// Query argument carrying the key (looked at when the header is absent).
    #[serde(default = "default_query")]
    #[schemars(length(min = 1))]
    pub query: String,
    /// Remove the key from the request before it is proxied.
    #[serde(default)]
    pub hide_credentials: bool,
}

fn default_header() -> String {
    "apikey".into()
}
fn default_query() -> String {
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

struct Instance;
impl PluginInstance for Instance {}

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
    fn build(&self, conf: &Value, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let _conf: Conf = serde_json::from_value(conf.clone()).map_err(|e| e.to_string())?;
        Ok(Arc::new(Instance))
    }
}

register_plugin!(KeyAuth);
