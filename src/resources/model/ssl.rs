//! Server certificates of the TLS listener (APISIX `ssls`), chosen by the client's SNI.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{one, Id};

/// A server certificate for the TLS listener (APISIX `ssls`), chosen by the client's SNI.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ssl {
    /// Identity.
    pub id: Id,
    /// Server names this certificate answers for: exact names, or `*.example.com` for any name
    /// ending in `.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub snis: Option<Vec<String>>,
    /// One server name (APISIX's older form of `snis`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Certificate chain, PEM (the end-entity certificate first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<String>,
    /// Private key of `cert`, PEM (PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `cert` from a file, relative to the prefix directory (watched for changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// `key` from a file, relative to the prefix directory (watched for changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
    /// More certificates for the same names (for example ECDSA next to RSA); the handshake picks
    /// the first one the client can verify.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certs: Vec<String>,
    /// Keys of `certs`, in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// `server` (the only kind: client certificates for upstream mTLS are not supported).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<SslType>,
    /// 1 enabled, 0 disabled.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1))]
    pub status: u8,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// `ssls[].type`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SslType {
    // A server certificate.
    Server,
}
