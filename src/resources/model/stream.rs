//! Stream routes (APISIX `stream_routes`): the TCP connections and UDP sessions of the stream
//! proxy and where they go.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Id, PluginConfs, Upstream};

/// A stream route (APISIX `stream_routes`): which TCP connections or UDP sessions it takes, and
/// where they go.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamRoute {
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
    /// The listener address the connection arrived on (an IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_addr: Option<String>,
    /// The listener port the connection arrived on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub server_port: Option<u16>,
    /// The client: an IP or a CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_addr: Option<String>,
    /// The TLS server name (TLS listeners only): exact, or `*.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// On a TLS listener: route on the SNI without terminating TLS (the upstream does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tls_passthrough: bool,
    /// Stream plugins of this route.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Inline upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    /// Reference to a service (its upstream is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<Id>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}
