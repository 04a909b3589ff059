//! Resource types: routes, services, upstreams, consumers, global rules, plugin metadata.
//!
//! Shapes follow Apache APISIX's so that people coming from there feel at home. The JSON Schemas
//! reported under `main` of `/v1/schema` are derived from these types and validate resources.
//!
//! One file per kind: `route` (routes and services), `upstream`, `consumer`, `global` (global
//! rules and plugin metadata), `ssl`, `stream` (stream routes); shared here are ids, plugin
//! configuration maps and small helpers.

use std::collections::BTreeMap;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

mod consumer;
mod global;
mod route;
mod ssl;
mod stream;
mod upstream;

pub use consumer::{Consumer, ConsumerGroup, Credential};
pub use global::{GlobalRule, PluginConfig, PluginMetadata};
pub use route::{HttpMethod, Route, RouteMore, Service};
pub use ssl::{AcmeChallenge, AcmeEab, Ssl, SslAcme, SslClient, SslType};
pub use stream::StreamRoute;
pub use upstream::{
    parse_node_key, valid_host, DiscoveryType, HashOn, KeepalivePool, LbType, Node, Nodes, PassHost, Scheme, Timeout,
    Upstream, UpstreamTls,
};

/// A resource id: an integer or a string in the file, always reported as a string.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(pub String);

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Id(s)),
            Value::Number(n) => Ok(Id(n.to_string())),
            other => Err(serde::de::Error::custom(format!("id must be an integer or a string, got {other}"))),
        }
    }
}

impl JsonSchema for Id {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Id".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "integer, or string of 1-64 characters [a-zA-Z0-9-_.]",
            "anyOf": [
                {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9-_.]+$"},
                {"type": "integer", "minimum": 1}
            ]
        })
    }
}

/// Plugin configurations keyed by plugin name (each validated against that plugin's schema).
pub type PluginConfs = BTreeMap<String, Value>;

/// Seconds of a (schema-checked) configuration value as a `Duration`; never panics, whatever
/// the float.
pub fn secs(s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(s.max(0.001)).unwrap_or(std::time::Duration::from_secs(31_536_000))
}

fn one() -> u8 {
    1
}
