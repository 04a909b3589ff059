//! `proxy-cache`: APISIX's response cache. Responses are stored in the zones of
//! config.yaml's `gateway.proxy_cache` (in memory, or on disk where they survive restarts), keyed
//! by `cache_key`, and answered from the access phase while fresh, with `Apisix-Cache-Status`
//! telling `HIT`, `MISS`, `EXPIRED`, `STALE` or `BYPASS`. `PURGE` removes an entry.
//!
//! Beyond APISIX: zones are bounded with LRU eviction (counted), concurrent misses of one key
//! make one upstream fetch ([`collapse`]), a disk entry is never served torn ([`entry`],
//! [`zone::disk`]), keys cannot be confused across hosts, paths, methods, routes or consumers
//! ([`key`]), and what a shared cache must never store is never stored ([`policy`]).
//!
//! Modules: [`conf`] (the configuration), [`instance`] (the phases), [`key`], [`policy`],
//! [`collapse`], [`entry`] (entries and their file format), [`lru`], [`zone`] (memory and disk
//! zones, the zone registry), [`stats`] (the metrics source).

pub mod collapse;
pub mod conf;
pub mod entry;
pub mod instance;
pub mod key;
pub mod lru;
pub mod policy;
pub mod stats;
pub mod zone;

use std::sync::Arc;

use weir_plugin::{register_plugin, BuildContext, InitEnv, Plugin, PluginInstance, Value};

/// The plugin.
pub struct ProxyCache;

/// Unix time in milliseconds (entries outlive the process, so not a monotonic clock).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Plugin for ProxyCache {
    type Conf = conf::Conf;

    fn name(&self) -> &'static str {
        "proxy-cache"
    }

    /// APISIX's: after authentication (so the consumer is known for isolation), before
    /// limit-count (a hit is answered without counting, as in APISIX).
    fn priority(&self) -> i32 {
        1085
    }

    fn version(&self) -> f64 {
        0.2
    }

    fn init(&self, _attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        zone::registry::init(&env.proxy_cache).map_err(|e| format!("gateway.proxy_cache: {e}"))?;
        if !env.check_only {
            weir_plugin::metrics::set_source("proxy-cache", stats::render);
        }
        Ok(())
    }

    fn shutdown(&self) {
        for z in zone::registry::opened() {
            z.flush();
        }
    }

    fn build(&self, conf: conf::Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        Ok(Arc::new(conf.into_cache(!ctx.check_only)?))
    }
}

register_plugin!(ProxyCache);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::cache_zones::ProxyCacheSection;
    use weir_plugin::http::{HeaderMap, HeaderValue, StatusCode};
    use weir_plugin::testing::{instance, respond, run, TestRequest};
    use weir_plugin::ResponseHead;

    fn init() {
        let env =
            InitEnv { data_dir: std::env::temp_dir(), check_only: true, proxy_cache: ProxyCacheSection::default() };
        Plugin::init(&ProxyCache, None, &env).unwrap_or_else(|e| panic!("{e}"));
    }

    fn status(ctx: &weir_plugin::RequestCtx) -> Option<&str> {
        ctx.response_headers.iter().find(|(k, _)| k == instance::STATUS_HEADER).and_then(|(_, v)| v.to_str().ok())
    }

    #[test]
    fn zones_and_strategies_are_checked_at_load() {
        init();
        let e = instance(&ProxyCache, json!({"cache_zone": "nope"})).err().unwrap_or_default();
        assert!(
            e.contains("cache_zone `nope` is not a zone of gateway.proxy_cache (zones: disk_cache_one, memory_cache)"),
            "{e}"
        );
        let e = instance(&ProxyCache, json!({"cache_zone": "memory_cache"})).err().unwrap_or_default();
        assert!(e.contains("is a memory zone, but cache_strategy is disk"), "{e}");
        let e = instance(&ProxyCache, json!({"cache_strategy": "memory"})).err().unwrap_or_default();
        assert!(e.contains("`disk_cache_one` is a disk zone, but cache_strategy is memory"), "{e}");
        let e = instance(
            &ProxyCache,
            json!({"cache_strategy": "memory", "cache_zone": "memory_cache", "cache_set_cookie": true}),
        )
        .err()
        .unwrap_or_default();
        assert!(e.starts_with("cache_set_cookie:"), "{e}");
        assert!(instance(&ProxyCache, json!({"cache_key": ["$"]})).is_err(), "schema pattern");
        assert!(instance(&ProxyCache, json!({"cache_http_status": [200, 200]})).is_err(), "unique statuses");
        assert!(instance(&ProxyCache, json!({"cache_method": ["PUT"]})).is_err());
    }

    #[test]
    fn a_miss_is_stored_as_it_streams_and_the_next_request_hits() {
        init();
        let conf = json!({"cache_strategy": "memory", "cache_zone": "memory_cache", "cache_key": ["$host", "$request_uri", "unit"]});
        let plugin = instance(&ProxyCache, conf).unwrap_or_else(|e| panic!("{e}"));
        let chain = [plugin];
        let mut ctx = TestRequest::get("/a?x=1").header("host", "h.test").header("if-none-match", "\"x\"").build();
        assert!(run(&chain, &mut ctx).is_none(), "a miss goes upstream");
        assert_eq!(status(&ctx), Some("MISS"));
        assert!(ctx.headers.get("if-none-match").is_none(), "the filler asks for the whole response");
        let mut headers = HeaderMap::new();
        headers.insert("etag", HeaderValue::from_static("\"v1\""));
        let (_, body) = respond(&chain, &mut ctx, ResponseHead { status: StatusCode::OK, headers }, b"cached body");
        assert_eq!(&body[..], b"cached body", "the body passes unchanged");
        let mut ctx = TestRequest::get("/a?x=1").header("host", "h.test").build();
        let hit = run(&chain, &mut ctx).unwrap_or_else(|| panic!("a hit is answered in access"));
        assert_eq!((hit.status, &hit.body[..]), (StatusCode::OK, &b"cached body"[..]));
        assert_eq!(hit.headers.get("apisix-cache-status").and_then(|v| v.to_str().ok()), Some("HIT"));
        assert_eq!(hit.headers.get("age").and_then(|v| v.to_str().ok()), Some("0"));
        let mut ctx = TestRequest::get("/a?x=1").header("host", "h.test").header("if-none-match", "\"v1\"").build();
        assert_eq!(run(&chain, &mut ctx).map(|r| r.status), Some(StatusCode::NOT_MODIFIED));
        let mut ctx = TestRequest::get("/A?x=1").header("host", "h.test").build();
        assert!(run(&chain, &mut ctx).is_none(), "another path case is another entry");
        let mut purge =
            TestRequest::new("PURGE".parse().unwrap_or_default(), "/a?x=1").header("host", "h.test").build();
        assert_eq!(run(&chain, &mut purge).map(|r| r.status), Some(StatusCode::OK));
        let mut purge =
            TestRequest::new("PURGE".parse().unwrap_or_default(), "/a?x=1").header("host", "h.test").build();
        assert_eq!(run(&chain, &mut purge).map(|r| r.status), Some(StatusCode::NOT_FOUND));
    }

    #[test]
    fn set_cookie_private_and_oversized_bodies_are_not_stored() {
        init();
        let conf = json!({"cache_strategy": "memory", "cache_zone": "memory_cache", "max_resp_body_size": 4, "cache_key": ["$request_uri", "unit2"]});
        let chain = [instance(&ProxyCache, conf).unwrap_or_else(|e| panic!("{e}"))];
        for (path, header, body) in [
            ("/c", Some(("set-cookie", "a=1")), &b"ok"[..]),
            ("/p", Some(("cache-control", "private")), b"ok"),
            ("/big", None, b"12345"),
        ] {
            let mut ctx = TestRequest::get(path).build();
            assert!(run(&chain, &mut ctx).is_none());
            let mut headers = HeaderMap::new();
            if let Some((k, v)) = header {
                headers.insert(k, HeaderValue::from_static(v));
            }
            let _ = respond(&chain, &mut ctx, ResponseHead { status: StatusCode::OK, headers }, body);
            let mut again = TestRequest::get(path).build();
            assert!(run(&chain, &mut again).is_none(), "{path} was stored");
        }
    }
}
