//! `short-url`: the batch short-URL service (`POST /short/v1/urls`) and its redirect side.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::{register_plugin, schema_of, BuildContext, Plugin, PluginInstance, Value};

/// What a route with this plugin does.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Serve `POST /short/v1/urls` (batch creation).
    #[default]
    Create,
    /// Serve redirects under the short base path.
    Resolve,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// `create` (default) or `resolve`.
    #[serde(default)]
    pub action: Action,
}

/// Plugin metadata.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Base URL short links are built on, e.g. `https://s.example.com/`.
    #[serde(default)]
    pub short_base: Option<String>,
    /// Status of redirects: 301, 302, 307 or 308.
    #[serde(default)]
    #[schemars(range(min = 301, max = 308))]
    pub redirect_status: Option<u16>,
    /// Largest accepted `valid_day`.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_valid_day: Option<u32>,
    /// `valid_day` used when an entry has none.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub default_valid_day: Option<u32>,
}

/// The plugin.
pub struct ShortUrl;

struct Instance;
impl PluginInstance for Instance {}

impl Plugin for ShortUrl {
    fn name(&self) -> &'static str {
        "short-url"
    }
    fn priority(&self) -> i32 {
        1000
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<Metadata>())
    }
    fn build(&self, conf: &Value, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let _conf: Conf = serde_json::from_value(conf.clone()).map_err(|e| e.to_string())?;
        Ok(Arc::new(Instance))
    }
}

register_plugin!(ShortUrl);
