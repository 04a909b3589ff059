//! Consumers: identities that authentication plugins map credentials to.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::PluginConfs;

/// A consumer: an identity that authentication plugins map credentials to.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Consumer {
    /// Identity.
    #[schemars(length(min = 1, max = 100), regex(pattern = "^[a-zA-Z0-9_-]+$"))]
    pub username: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins: credentials (validated against each plugin's consumer_schema).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
