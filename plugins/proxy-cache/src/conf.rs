//! The route configuration of proxy-cache: APISIX's fields, names and defaults, and its
//! translation into a [`crate::instance::Cache`] (zone checked against `gateway.proxy_cache`,
//! variables checked, defaults resolved).

use schemars::JsonSchema;
use serde::Deserialize;

use crate::instance::Cache;
use crate::key::{parse_items, KeySpec};
use crate::zone::registry;

/// `max_resp_body_size` when not given (APISIX's, 64 MiB).
pub const DEFAULT_MAX_BODY: u64 = 64 << 20;
/// `cache_ttl` of memory zones when not given (seconds).
pub const DEFAULT_MEMORY_TTL: u64 = 300;

/// Where entries are kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// A disk zone (the default).
    #[default]
    Disk,
    /// A memory zone.
    Memory,
}

/// A method whose responses may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum CacheMethod {
    Get,
    Post,
    Head,
}

/// A `cache_key`, `cache_bypass` or `no_cache` item: `$variable` or literal text (APISIX's
/// pattern).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct Item(#[schemars(regex(pattern = r"(^[^\$].+$|^\$[0-9a-zA-Z_]+$)"))] pub String);

/// A status whose responses may be cached.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
pub struct CacheStatus(#[schemars(range(min = 200, max = 599))] pub u16);

/// Route configuration (APISIX 3.x's fields).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// `disk` (default) or `memory`; must match the kind of `cache_zone`.
    #[serde(default)]
    pub cache_strategy: Strategy,
    /// A zone of `gateway.proxy_cache` (default `disk_cache_one`).
    #[serde(default = "default_zone")]
    #[schemars(length(min = 1, max = 100))]
    pub cache_zone: String,
    /// The key: `$variables` and literal text (default `["$host", "$request_uri"]`).
    #[serde(default = "default_key")]
    #[schemars(length(min = 1))]
    pub cache_key: Vec<Item>,
    /// A request with any of these not empty and not `0` is not answered from the cache.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub cache_bypass: Option<Vec<Item>>,
    /// Methods whose responses are cached (default `["GET", "HEAD"]`).
    #[serde(default = "default_methods")]
    #[schemars(length(min = 1), extend("uniqueItems" = true))]
    pub cache_method: Vec<CacheMethod>,
    /// Statuses whose responses are cached (default `[200, 301, 404]`).
    #[serde(default = "default_statuses")]
    #[schemars(length(min = 1), extend("uniqueItems" = true))]
    pub cache_http_status: Vec<CacheStatus>,
    /// Remove `Cache-Control` and `Expires` from responses.
    #[serde(default)]
    pub hide_cache_headers: bool,
    /// Follow `Cache-Control`: the upstream's validity is the time to live, and the client's
    /// directives (`no-cache`, `no-store`, `max-age`, `min-fresh`, `only-if-cached`) count.
    #[serde(default)]
    pub cache_control: bool,
    /// A response to a request with any of these not empty and not `0` is not stored.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub no_cache: Option<Vec<Item>>,
    /// Seconds an entry is fresh when the upstream's validity is not used or not given
    /// (default 300; for disk zones `gateway.proxy_cache.cache_ttl`).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub cache_ttl: Option<u64>,
    /// Largest body stored; larger ones pass through (default 64 MiB, and at most an eighth of
    /// the zone).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_resp_body_size: Option<u64>,
    /// Keep the entries of each authenticated consumer apart (default true).
    #[serde(default = "yes")]
    pub consumer_isolation: bool,
    /// Accepted for APISIX compatibility; only `false`: responses with `Set-Cookie` are never
    /// stored.
    #[serde(default)]
    pub cache_set_cookie: bool,
}

fn default_zone() -> String {
    "disk_cache_one".into()
}
fn default_key() -> Vec<Item> {
    vec![Item("$host".into()), Item("$request_uri".into())]
}
fn default_methods() -> Vec<CacheMethod> {
    vec![CacheMethod::Get, CacheMethod::Head]
}
fn default_statuses() -> Vec<CacheStatus> {
    vec![CacheStatus(200), CacheStatus(301), CacheStatus(404)]
}
fn yes() -> bool {
    true
}

impl Conf {
    /// The runtime form; `serving` opens the zone (validation builds open nothing).
    pub fn into_cache(self, serving: bool) -> Result<Cache, String> {
        let (def, disk_ttl) = registry::definition(&self.cache_zone)?;
        let memory = self.cache_strategy == Strategy::Memory;
        if memory && def.is_disk() {
            return Err(format!(
                "cache_zone: `{}` is a disk zone, but cache_strategy is memory (a memory zone has only name and memory_size)",
                self.cache_zone
            ));
        }
        if !memory && !def.is_disk() {
            return Err(format!(
                "cache_zone: `{}` is a memory zone, but cache_strategy is disk (the default); set cache_strategy: memory",
                self.cache_zone
            ));
        }
        if self.cache_set_cookie {
            return Err("cache_set_cookie: responses with Set-Cookie are never stored by Weir (they are per recipient); remove the field or set it to false".into());
        }
        let strings = |items: Vec<Item>| items.into_iter().map(|i| i.0).collect::<Vec<String>>();
        let key = KeySpec::compile(&strings(self.cache_key), self.consumer_isolation)?;
        let bypass = parse_items("cache_bypass", &strings(self.cache_bypass.unwrap_or_default()))?;
        let no_cache = parse_items("no_cache", &strings(self.no_cache.unwrap_or_default()))?;
        let ttl_secs = self.cache_ttl.unwrap_or(if memory { DEFAULT_MEMORY_TTL } else { disk_ttl });
        let mut max_body = self.max_resp_body_size.unwrap_or(DEFAULT_MAX_BODY);
        let zone = if serving { Some(registry::open(&self.cache_zone)?) } else { None };
        if let Some(z) = &zone {
            max_body = max_body.min(z.entry_cap);
        }
        Ok(Cache {
            zone,
            key,
            get: self.cache_method.contains(&CacheMethod::Get),
            head: self.cache_method.contains(&CacheMethod::Head),
            post: self.cache_method.contains(&CacheMethod::Post),
            statuses: self.cache_http_status.iter().map(|s| s.0).collect(),
            bypass,
            no_cache,
            hide: self.hide_cache_headers,
            cache_control: self.cache_control,
            memory,
            ttl_ms: ttl_secs.saturating_mul(1000),
            max_body,
        })
    }
}
