//! `proxy-mirror`: copies a route's requests to another server (`host`), as APISIX 3.x does,
//! for testing a new release or analysing traffic; the copy's answer is discarded.
//!
//! What is copied is the request as it went upstream: method, path and query and headers as the
//! plugins left them (proxy-rewrite's changes included), and the body when the gateway had it
//! whole (up to 1 MiB; `body`). Requests a plugin answered (an auth failure, a rate limit) are not
//! copied, as nginx's mirror runs only for proxied requests: the copy is decided in `access`
//! (sampling, the body kept) and sent from `header_filter` once the upstream was contacted.
//!
//! The copy goes through the host's client as a background request
//! (`weir_plugin::background`): it never delays or fails the client's request, and at most
//! `max_in_flight` copies of a configuration are in flight; beyond, copies are dropped and
//! counted. `attr` reads `plugin_attr.proxy-mirror`; `metrics` exposes the counters.

mod attr;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::background::{Background, BackgroundCounters};
use weir_plugin::metrics::Exposition;
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, Flow, InitEnv, Late, OutboundRequest, Plugin, PluginInstance,
    RequestCtx, ResponseHead, Value,
};

/// The largest body copied; a request with a larger one (or one that streamed) is not mirrored.
pub const MAX_BODY: usize = 1 << 20;
/// The largest answer of the mirror target read (and discarded); a larger one ends the exchange.
const MAX_ANSWER: usize = 1 << 20;

/// How `path` is used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConcatMode {
    /// `path` replaces the request's path (the query stays).
    #[default]
    Replace,
    /// `path` is put before the request's path and query.
    Prefix,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Where copies go: `scheme://host[:port]`, no path.
    #[schemars(regex(pattern = r"^(http(s)?|grpc(s)?):\/\/([\da-zA-Z.-]+|\[[\da-fA-F:]+\])(:\d+)?$"))]
    pub host: String,
    /// The copies' path (see `path_concat_mode`); absent: the request's.
    #[serde(default)]
    #[schemars(regex(pattern = r"^/[^?&]+$"))]
    pub path: Option<String>,
    /// `replace` or `prefix`.
    #[serde(default)]
    pub path_concat_mode: ConcatMode,
    /// The share of requests copied.
    #[serde(default = "all")]
    #[schemars(range(min = 0.00001, max = 1.0))]
    pub sample_ratio: f64,
}

fn all() -> f64 {
    1.0
}

/// Counters of every configuration's copies (the metrics source reads them).
static COPIES: LazyLock<Arc<BackgroundCounters>> = LazyLock::new(Default::default);
/// Copies not made because the body was not whole in hand (streamed, or over [`MAX_BODY`]).
static SKIPPED_BODY: AtomicU64 = AtomicU64::new(0);

/// The plugin.
pub struct ProxyMirror;

struct Mirror {
    host: String,
    path: Option<String>,
    mode: ConcatMode,
    sample_ratio: f64,
    copies: Background,
}

/// A copy decided in `access`: the body as it will go upstream (a shared reference).
struct Pending(Bytes);

impl Mirror {
    /// The copy's URL: `host`, then the path and query as configured.
    fn url(&self, ctx: &RequestCtx) -> String {
        let mut url = String::with_capacity(self.host.len() + ctx.path.len() + ctx.query.len() + 16);
        url.push_str(&self.host);
        let query = |url: &mut String| {
            if !ctx.query.is_empty() {
                url.push('?');
                url.push_str(&ctx.query);
            }
        };
        match (&self.path, self.mode) {
            (Some(p), ConcatMode::Replace) => url.push_str(p),
            (Some(p), ConcatMode::Prefix) => {
                url.push_str(p);
                url.push_str(&ctx.path);
            }
            (None, _) => url.push_str(&ctx.path),
        }
        query(&mut url);
        url
    }
}

impl PluginInstance for Mirror {
    fn late(&self) -> Late {
        // The copy is made from the request headers after forwarding.
        Late { headers: true, header_filter: true, log: false }
    }

    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if self.sample_ratio < 1.0 && fastrand::f64() >= self.sample_ratio {
            return Flow::Continue;
        }
        let body = match &ctx.body {
            _ if ctx.body_streams => None,
            Some(b) if b.len() > MAX_BODY => None,
            Some(b) => Some(b.clone()),
            None => Some(Bytes::new()),
        };
        match body {
            Some(b) => ctx.slots.insert(Pending(b)),
            None => {
                SKIPPED_BODY.fetch_add(1, Ordering::Relaxed);
            }
        }
        Flow::Continue
    }

    fn header_filter(&self, ctx: &mut RequestCtx, _resp: &mut ResponseHead) -> BodyFilter {
        let Some(Pending(body)) = ctx.slots.remove::<Pending>() else { return BodyFilter::Skip };
        // Only requests that went upstream (not a plugin's answer), and no WebSocket handshake.
        if ctx.upstream_addrs.is_empty() || ctx.status == 101 {
            return BodyFilter::Skip;
        }
        let mut req = OutboundRequest::new(ctx.method.clone(), self.url(ctx));
        req.headers = ctx.headers.clone();
        req.body = body;
        req.timeout = attr::budget();
        req.max_body = MAX_ANSWER;
        self.copies.send(req);
        BodyFilter::Skip
    }
}

fn expose(e: &mut Exposition) {
    COPIES.expose(e, "proxy_mirror", "Mirrored copies of requests");
    e.family(
        "proxy_mirror_skipped_total",
        "counter",
        "Requests not mirrored because their body was not whole in hand (streamed, or over 1 MiB).",
    );
    e.sample("proxy_mirror_skipped_total", &[("reason", "body")], SKIPPED_BODY.load(Ordering::Relaxed));
}

impl Plugin for ProxyMirror {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "proxy-mirror"
    }
    fn priority(&self) -> i32 {
        1010
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(weir_plugin::schema_of::<attr::Attr>())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let parsed: attr::Attr = attr.map(weir_plugin::parse_conf::<attr::Attr>).transpose()?.unwrap_or_default();
        attr::apply(&parsed, env.check_only)?;
        if !env.check_only {
            weir_plugin::metrics::set_source("proxy-mirror", expose);
        }
        Ok(())
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        if conf.host.starts_with("grpc") {
            return Err(format!("host: `{}`: mirroring gRPC is not supported (http:// or https://)", conf.host));
        }
        let copies = Background::new(ctx.services.http_client(), attr::max_in_flight(), COPIES.clone());
        Ok(Arc::new(Mirror {
            host: conf.host,
            path: conf.path,
            mode: conf.path_concat_mode,
            sample_ratio: conf.sample_ratio,
            copies,
        }))
    }
}

register_plugin!(ProxyMirror);

#[cfg(test)]
mod tests {
    use serde_json::json;
    use weir_plugin::http::{HeaderMap, StatusCode};
    use weir_plugin::testing::{instance, run, TestRequest};

    use super::*;

    fn mirror(conf: Value) -> Arc<dyn PluginInstance> {
        instance(&ProxyMirror, conf).unwrap_or_else(|e| panic!("{e}"))
    }

    fn url_of(conf: Value, target: &str) -> String {
        let Conf { host, path, path_concat_mode, .. } =
            weir_plugin::parse_conf(&conf).unwrap_or_else(|e| panic!("{e}"));
        let m = Mirror {
            host,
            path,
            mode: path_concat_mode,
            sample_ratio: 1.0,
            copies: Background::new(weir_plugin::Services::http_client(&weir_plugin::NoServices), 1, COPIES.clone()),
        };
        m.url(&TestRequest::get(target).build())
    }

    #[test]
    fn the_copy_goes_to_host_with_the_path_as_configured() {
        let h = json!({"host": "http://127.0.0.1:8081"});
        assert_eq!(url_of(h.clone(), "/a/b?x=1"), "http://127.0.0.1:8081/a/b?x=1");
        let replace = json!({"host": "http://m:1", "path": "/copy"});
        assert_eq!(url_of(replace, "/a?x=1"), "http://m:1/copy?x=1");
        let prefix = json!({"host": "https://[::1]:9", "path": "/copy", "path_concat_mode": "prefix"});
        assert_eq!(url_of(prefix, "/a?x=1"), "https://[::1]:9/copy/a?x=1");
        assert_eq!(url_of(h, "/a"), "http://127.0.0.1:8081/a");
    }

    #[test]
    fn only_proxied_requests_with_a_whole_body_are_copied() {
        let before = COPIES.snapshot();
        let skipped = SKIPPED_BODY.load(Ordering::Relaxed);
        let p = mirror(json!({"host": "http://127.0.0.1:1"}));
        let head = || ResponseHead { status: StatusCode::OK, headers: HeaderMap::new() };
        // A plugin's answer (no upstream contacted): nothing is sent.
        let mut ctx = TestRequest::get("/").build();
        assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
        assert!(ctx.slot::<Pending>().is_some(), "decided in access");
        p.header_filter(&mut ctx, &mut head());
        assert_eq!(COPIES.snapshot(), before, "not proxied: not copied");
        // Proxied: handed to the host (none here, so dropped and counted).
        let mut ctx = TestRequest::get("/").build();
        assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
        ctx.upstream_addrs.push("127.0.0.1:2".parse().unwrap_or_else(|e| panic!("{e}")));
        p.header_filter(&mut ctx, &mut head());
        assert_eq!(COPIES.snapshot().dropped, before.dropped + 1);
        // A body that streamed is not copied.
        let mut ctx = TestRequest::get("/").build();
        ctx.body_streams = true;
        assert!(run(std::slice::from_ref(&p), &mut ctx).is_none());
        assert!(ctx.slot::<Pending>().is_none());
        assert_eq!(SKIPPED_BODY.load(Ordering::Relaxed), skipped + 1);
    }

    #[test]
    fn sampling_copies_a_share() {
        let p = mirror(json!({"host": "http://127.0.0.1:1", "sample_ratio": 0.25}));
        let n = (0..4000)
            .filter(|_| {
                let mut ctx = TestRequest::get("/").build();
                run(std::slice::from_ref(&p), &mut ctx);
                ctx.slot::<Pending>().is_some()
            })
            .count();
        assert!((800..1200).contains(&n), "{n} of 4000");
    }

    #[test]
    fn what_cannot_work_is_refused() {
        let err = |conf: Value| instance(&ProxyMirror, conf).err().unwrap_or_default();
        assert!(err(json!({})).starts_with("schema"), "host is required");
        assert!(err(json!({"host": "http://a/b"})).starts_with("schema"), "no path in host");
        assert!(err(json!({"host": "ftp://a"})).starts_with("schema"));
        assert!(err(json!({"host": "http://a", "path": "/a?b"})).starts_with("schema"));
        assert!(err(json!({"host": "http://a", "sample_ratio": 0})).starts_with("schema"));
        assert!(err(json!({"host": "http://a", "path_concat_mode": "append"})).starts_with("schema"));
        assert!(err(json!({"host": "grpc://a:1"})).contains("gRPC is not supported"));
    }

    #[test]
    fn plugin_attr_is_checked() {
        let env = InitEnv { data_dir: std::env::temp_dir(), check_only: true, proxy_cache: Default::default() };
        let init = |v: Value| ProxyMirror.init(Some(&v), &env);
        assert!(init(json!({"timeout": {"connect": "2000ms", "read": "2s", "send": "1m"}})).is_ok());
        assert!(init(json!({"timeout": {"connect": "2 s"}})).is_err());
        assert!(init(json!({"retries": 1})).is_err());
    }
}
