//! Plugin configuration that is not bound to a route: global rules (plugins for every request),
//! plugin configs (a plugin set routes share by `plugin_config_id`) and plugin metadata (a
//! plugin's own process-wide fields).

use std::collections::BTreeMap;

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

/// A plugin config: a set of plugins routes share by naming it in `plugin_config_id` (a route's
/// own configuration of the same plugin wins).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// Identity.
    pub id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins.
    pub plugins: PluginConfs,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
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
