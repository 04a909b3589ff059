//! Server certificates of the TLS listener (APISIX `ssls`), chosen by the client's SNI.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{one, Id};
pub use crate::config::{AcmeChallenge, AcmeEab, SslAcme};

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
    /// `server` (default: served on the TLS listener for `snis`) or `client` (a certificate
    /// Weir presents to upstreams that name it with `tls.client_cert_id`; no `snis`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<SslType>,
    /// Mutual TLS on this entry's server names: clients must present a certificate that chains
    /// to `client.ca`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<SslClient>,
    /// A certificate ordered from an ACME CA (Let's Encrypt...) instead of `cert`/`key`; its
    /// unset keys come from `gateway.acme` in config.yaml.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acme: Option<SslAcme>,
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
    // A client certificate for upstream mutual TLS.
    Client,
}

/// `ssls[].client`: how clients of this entry's server names authenticate (APISIX's shape).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SslClient {
    /// CA certificates (PEM) a client certificate must chain to.
    #[schemars(length(min = 1))]
    pub ca: String,
    /// The longest chain accepted, in CA certificates above the client's (default 1: signed by
    /// a CA of `ca` directly; nginx's `ssl_verify_depth`).
    #[serde(default = "depth_one")]
    #[schemars(range(min = 1, max = 10))]
    pub depth: u8,
    /// Request paths (regular expressions, matched on the normalized path) that are served
    /// without a client certificate; a certificate that is presented is still verified.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skip_mtls_uri_regex: Vec<String>,
}

fn depth_one() -> u8 {
    1
}
