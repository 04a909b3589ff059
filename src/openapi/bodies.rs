//! The JSON bodies of the control server and the Admin API, as types. Handlers serialize these
//! and the OpenAPI document derives its response schemas from them, so the two cannot drift.

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::memory::MemoryStats;

/// Every error of the control server and the Admin API.
#[derive(Serialize, JsonSchema)]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error_msg: String,
}

/// The Admin API's answer for a key that does not exist (APISIX's shape).
#[derive(Serialize, JsonSchema)]
pub struct KeyNotFound {
    /// Always `Key not found`.
    pub message: String,
}

/// `GET /v1/schema`.
#[derive(Serialize, JsonSchema)]
pub struct SchemaDoc {
    /// The JSON Schema of each resource kind (`route`, `service`, `upstream`...).
    pub main: Map<String, Value>,
    /// Each enabled HTTP plugin: `schema`, `priority`, `version`, and `consumer_schema`,
    /// `metadata_schema`, `type` where it has them.
    pub plugins: Map<String, Value>,
    /// Each enabled stream plugin: `schema`, `priority`, `version`.
    #[serde(rename = "stream-plugins")]
    pub stream_plugins: Map<String, Value>,
}

/// `POST /v1/gc`.
#[derive(Serialize, JsonSchema)]
pub struct GcReport {
    /// Figures before the purge.
    pub before: MemoryStats,
    /// Figures after the purge.
    pub after: MemoryStats,
    /// Resident bytes returned to the operating system.
    pub freed_rss: u64,
    /// What was done.
    pub actions: Vec<String>,
    /// How the purge covers each subsystem.
    pub subsystems: GcSubsystems,
}

/// The subsystems one purge covers.
#[derive(Serialize, JsonSchema)]
pub struct GcSubsystems {
    /// The HTTP data plane.
    pub http: String,
    /// The stream proxy.
    pub stream: StreamGc,
}

/// The stream proxy's part of `POST /v1/gc`.
#[derive(Serialize, JsonSchema)]
pub struct StreamGc {
    /// How the purge covers it.
    pub covered: String,
    /// Open TCP connections.
    pub tcp_connections: usize,
    /// Live UDP sessions.
    pub udp_sessions: usize,
}

/// `PUT /v1/plugins/reload`.
#[derive(Serialize, JsonSchema)]
pub struct Reloaded {
    /// `plugins reloaded`.
    pub message: String,
    /// The enabled plugins, in priority order.
    pub plugins: Vec<String>,
}

/// One stored Admin API entry (APISIX's shape).
#[derive(Serialize, JsonSchema)]
pub struct Node {
    /// The etcd key, `<prefix>/<kind>/<id>`.
    pub key: String,
    /// The stored value as it was sent, with `id`, `create_time` and `update_time` (null when
    /// what is stored is not JSON).
    pub value: Value,
    /// The etcd revision that created the key.
    #[serde(rename = "createdIndex")]
    pub created_index: i64,
    /// The etcd revision of the last change (the `If-Match` of a compare-and-swap PUT).
    #[serde(rename = "modifiedIndex")]
    pub modified_index: i64,
}

/// `GET /weir/admin/<kind>`.
#[derive(Serialize, JsonSchema)]
pub struct NodeList {
    /// Entries of the kind (before paging).
    pub total: usize,
    /// This page of them.
    pub list: Vec<Node>,
}

/// The answer to an Admin API PUT, POST or PATCH.
#[derive(Serialize, JsonSchema)]
pub struct Stored {
    /// The etcd key written.
    pub key: String,
    /// The stored value, with `id`, `create_time` and `update_time`.
    pub value: Value,
}

/// The answer to an Admin API DELETE.
#[derive(Serialize, JsonSchema)]
pub struct Deleted {
    /// The etcd key deleted.
    pub key: String,
    /// Always `"1"` (APISIX's shape).
    pub deleted: String,
}

/// `GET /v1/certificates`: every `ssls` entry and what it serves.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Certificates {
    /// By id.
    pub list: Vec<Certificate>,
}

/// One `ssls` entry's certificate.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Certificate {
    /// The entry's id.
    pub id: String,
    /// `static` (cert/key or files) or `acme`.
    pub source: &'static str,
    /// The server names it is served for (none: not served, e.g. an ACME entry not issued yet).
    pub snis: Vec<String>,
    /// When the served certificate expires (Unix seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after: Option<i64>,
    /// The ACME side (ACME entries).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acme: Option<crate::acme::Status>,
}

/// `POST /v1/certificates/{id}/renew`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct RenewRequested {
    /// The entry.
    pub id: String,
    /// What happens now.
    pub message: String,
}
