//! `upstream.checks`: active and passive health-check configuration, with the defaults of the
//! health-check reference (those of lua-resty-healthcheck, which APISIX operators know).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Health checks of an upstream.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Checks {
    /// Active probes (required when `checks` is present).
    pub active: Active,
    /// Judgement of real traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passive: Option<Passive>,
}

/// Probe types.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProbeType {
    #[default]
    Http,
    Https,
    Tcp,
}

/// Active probing.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Active {
    /// `http`, `https` or `tcp`.
    #[serde(default, rename = "type")]
    pub probe_type: ProbeType,
    /// Probe timeout in seconds.
    #[serde(default = "one_f")]
    #[schemars(range(min = 0.001, max = 3600.0))]
    pub timeout: f64,
    /// Probes in flight at once for this checker.
    #[serde(default = "ten")]
    #[schemars(range(min = 1))]
    pub concurrency: u32,
    /// Host header (and SNI) of probes; default: the node's ip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Port probed instead of the node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub port: Option<u16>,
    /// Path of HTTP probes.
    #[serde(default = "slash")]
    pub http_path: String,
    /// Verify the certificate of https probes.
    #[serde(default = "yes")]
    pub https_verify_certificate: bool,
    /// Extra headers of HTTP probes, as `"Name: value"`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub req_headers: Vec<String>,
    /// Healthy side.
    #[serde(default)]
    pub healthy: ActiveHealthy,
    /// Unhealthy side.
    #[serde(default)]
    pub unhealthy: ActiveUnhealthy,
}

/// Active healthy side.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ActiveHealthy {
    /// Seconds between probes of healthy targets.
    #[serde(default = "one_u")]
    #[schemars(range(min = 1))]
    pub interval: u32,
    /// Statuses counted as success.
    #[serde(default = "active_ok_statuses")]
    #[schemars(length(min = 1), inner(range(min = 200, max = 599)))]
    pub http_statuses: Vec<u16>,
    /// Successes that make a target healthy.
    #[serde(default = "two")]
    #[schemars(range(min = 1, max = 254))]
    pub successes: u8,
}

impl Default for ActiveHealthy {
    fn default() -> Self {
        ActiveHealthy { interval: 1, http_statuses: active_ok_statuses(), successes: 2 }
    }
}

/// Active unhealthy side.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ActiveUnhealthy {
    /// Seconds between probes of unhealthy targets.
    #[serde(default = "one_u")]
    #[schemars(range(min = 1))]
    pub interval: u32,
    /// Statuses counted as HTTP failure.
    #[serde(default = "active_bad_statuses")]
    #[schemars(length(min = 1), inner(range(min = 200, max = 599)))]
    pub http_statuses: Vec<u16>,
    /// HTTP failures that make a target unhealthy.
    #[serde(default = "five")]
    #[schemars(range(min = 1, max = 254))]
    pub http_failures: u8,
    /// TCP failures that make a target unhealthy.
    #[serde(default = "two")]
    #[schemars(range(min = 1, max = 254))]
    pub tcp_failures: u8,
    /// Timeouts that make a target unhealthy.
    #[serde(default = "three")]
    #[schemars(range(min = 1, max = 254))]
    pub timeouts: u8,
}

impl Default for ActiveUnhealthy {
    fn default() -> Self {
        ActiveUnhealthy {
            interval: 1,
            http_statuses: active_bad_statuses(),
            http_failures: 5,
            tcp_failures: 2,
            timeouts: 3,
        }
    }
}

/// Passive checking.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Passive {
    /// Always `http`.
    #[serde(default, rename = "type")]
    pub check_type: ProbeType,
    /// Healthy side.
    #[serde(default)]
    pub healthy: PassiveHealthy,
    /// Unhealthy side.
    #[serde(default)]
    pub unhealthy: PassiveUnhealthy,
}

/// Passive healthy side.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PassiveHealthy {
    /// Statuses counted as success.
    #[serde(default = "passive_ok_statuses")]
    #[schemars(length(min = 1), inner(range(min = 200, max = 599)))]
    pub http_statuses: Vec<u16>,
    /// Successes that make a target healthy (0 disables).
    #[serde(default = "five")]
    #[schemars(range(max = 254))]
    pub successes: u8,
}

impl Default for PassiveHealthy {
    fn default() -> Self {
        PassiveHealthy { http_statuses: passive_ok_statuses(), successes: 5 }
    }
}

/// Passive unhealthy side.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PassiveUnhealthy {
    /// Statuses counted as HTTP failure.
    #[serde(default = "passive_bad_statuses")]
    #[schemars(length(min = 1), inner(range(min = 200, max = 599)))]
    pub http_statuses: Vec<u16>,
    /// HTTP failures that make a target unhealthy (0 disables).
    #[serde(default = "five")]
    #[schemars(range(max = 254))]
    pub http_failures: u8,
    /// TCP failures that make a target unhealthy (0 disables).
    #[serde(default = "two")]
    #[schemars(range(max = 254))]
    pub tcp_failures: u8,
    /// Timeouts that make a target unhealthy (0 disables).
    #[serde(default = "seven")]
    #[schemars(range(max = 254))]
    pub timeouts: u8,
}

impl Default for PassiveUnhealthy {
    fn default() -> Self {
        PassiveUnhealthy { http_statuses: passive_bad_statuses(), http_failures: 5, tcp_failures: 2, timeouts: 7 }
    }
}

fn one_f() -> f64 {
    1.0
}
fn one_u() -> u32 {
    1
}
fn two() -> u8 {
    2
}
fn three() -> u8 {
    3
}
fn five() -> u8 {
    5
}
fn seven() -> u8 {
    7
}
fn ten() -> u32 {
    10
}
fn yes() -> bool {
    true
}
fn slash() -> String {
    "/".into()
}
fn active_ok_statuses() -> Vec<u16> {
    vec![200, 302]
}
fn active_bad_statuses() -> Vec<u16> {
    vec![429, 404, 500, 501, 502, 503, 504, 505]
}
fn passive_ok_statuses() -> Vec<u16> {
    let mut v: Vec<u16> = (200..=208).collect();
    v.push(226);
    v.extend(300..=308);
    v
}
fn passive_bad_statuses() -> Vec<u16> {
    vec![429, 500, 503]
}
