//! `conf/config.yaml`: the process configuration (listeners, control server, enabled plugins,
//! plugin attributes, where resources come from). Parsed, validated against the schema derived
//! from these types, then checked for the rules a schema cannot express (loopback-only control
//! listener, port conflicts, plugin names).
//!
//! The sections of the file live next to each other here: `gateway` (listeners, control server,
//! logs, workers), `deployment` (resource provider, Admin API, etcd); `load` reads and validates
//! the file, `rules` holds the checks a schema cannot express.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::plugins::Catalog;

mod deployment;
mod gateway;
mod load;
mod rules;

pub use deployment::{
    AdminKey, AdminListen, AdminRole, AdminSection, ConfigProvider, Deployment, EtcdSection, EtcdTls, EXAMPLE_ADMIN_KEY,
};
pub use gateway::{
    AccessLogSection, AcmeChallenge, AcmeEab, AutoWord, Control, ControlRouter, ErrorLogSection, EscapedSlashes,
    GatewaySection, Listen, ListenAddr, ProxyProtocolSection, RealIpHeader, RealIpSection, SslAcme, SslSection,
    StreamListen, StreamListenAddr, StreamProxy, WorkerProcesses,
};
pub use load::{parse_yaml, read_yaml, Prefix};
pub use rules::unknown_plugin;

/// The whole of config.yaml.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listeners and process settings.
    #[serde(default)]
    pub gateway: GatewaySection,
    /// Enabled HTTP plugins; absent means every plugin compiled into this binary.
    #[serde(default)]
    pub plugins: Option<Vec<String>>,
    /// Enabled stream plugins; absent means every stream plugin compiled into this binary.
    #[serde(default)]
    pub stream_plugins: Option<Vec<String>>,
    /// Process-level settings of plugins, keyed by plugin name.
    #[serde(default)]
    pub plugin_attr: BTreeMap<String, Value>,
    /// Where resources come from.
    #[serde(default)]
    pub deployment: Deployment,
}

impl Config {
    /// Names of the enabled HTTP plugins: the `plugins:` list, or every compiled-in plugin.
    pub fn enabled_plugin_names(&self, catalog: &Catalog) -> Vec<String> {
        match &self.plugins {
            Some(list) => list.clone(),
            None => catalog.names(),
        }
    }

    /// Names of the enabled stream plugins: the `stream_plugins:` list, or every compiled-in one.
    pub fn enabled_stream_names(&self, catalog: &Catalog) -> Vec<String> {
        match &self.stream_plugins {
            Some(list) => list.clone(),
            None => catalog.stream_names(),
        }
    }
}

fn yes() -> bool {
    true
}
fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}
