//! Consumers: identities that authentication plugins map credentials to.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Id, PluginConfs};

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
    /// Plugins: credentials of auth plugins (validated against each plugin's consumer_schema),
    /// and any other plugin (validated against its schema), which runs on the consumer's
    /// requests once an auth plugin identified it, overriding the route's of the same name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// The consumer group whose plugins the consumer takes (its own win on a name clash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_id: Option<Id>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// More credentials of the consumer, each with its own id (APISIX 3.x credentials): the
    /// upstream learns which one identified the request from `X-Credential-Identifier`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<Credential>,
}

/// One credential of a consumer: auth plugins' configurations (a `key-auth` key, a `jwt-auth`
/// secret...) under an id. Nested in a consumer's `credentials`, or a top-level entry naming
/// its `consumer` (how the etcd provider and the Admin API keep them:
/// `/consumers/<username>/credentials/<id>`).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Credential {
    /// Identity, unique within its consumer.
    pub id: Id,
    /// The consumer it belongs to (top-level entries only; implied when nested).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100), regex(pattern = "^[a-zA-Z0-9_-]+$"))]
    pub consumer: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Auth plugins' credentials only (each validated against the plugin's consumer schema).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A consumer group: plugins shared by the consumers that name it in `group_id`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsumerGroup {
    /// Identity.
    pub id: Id,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins of every consumer of the group (not credentials).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
