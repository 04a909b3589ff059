//! Plugin configuration that is not bound to a route: global rules (plugins for every request)
//! and plugin metadata (a plugin's own process-wide fields).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Id, PluginConfs};

/// A global rule: plugins that run for every request.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobalRule {
    /// Identity.
    pub id: Id,
    /// Plugins.
    #[schemars(length(min = 1))]
    pub plugins: PluginConfs,
}

/// Plugin metadata: `id` is the plugin name; the other fields are the plugin's own.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PluginMetadata {
    /// The plugin name.
    #[schemars(length(min = 1))]
    pub id: String,
    /// The plugin's fields (validated against its metadata_schema).
    #[serde(flatten)]
    pub fields: serde_json::Map<String, Value>,
}
