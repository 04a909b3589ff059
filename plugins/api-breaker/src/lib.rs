//! `api-breaker`: a circuit breaker in front of an unhealthy upstream, as APISIX 3.x's: after
//! `unhealthy.failures` upstream answers with an unhealthy status, the route's requests are
//! answered with `break_response_code` for 2 s, then 4, 8... up to `max_breaker_sec`; healthy
//! answers in a row (`healthy.successes`) close it again (`breaker`).
//!
//! One breaker per route: an instance on a route has its own; one on a service, a global rule or
//! a consumer keeps one per route it serves. Statuses are observed in `header_filter`, only for
//! answers the upstream gave (or the 502/504 the gateway made after trying it), never for the
//! plugin's own or another plugin's answer.

mod breaker;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use weir_plugin::template::Template;
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx,
    ResponseHead,
};

use breaker::{Breaker, Policy, Seen};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The status answered while the breaker is open.
    #[schemars(range(min = 200, max = 599))]
    pub break_response_code: u16,
    /// The body answered while the breaker is open (absent: none, and no headers either).
    #[serde(default)]
    pub break_response_body: Option<String>,
    /// Headers of that answer (with `break_response_body` only); values may hold `$variables`.
    #[serde(default)]
    pub break_response_headers: Option<Vec<KeyValue>>,
    /// The longest the breaker stays open, in seconds.
    #[serde(default = "default_max_breaker_sec")]
    #[schemars(range(min = 3))]
    pub max_breaker_sec: u64,
    /// What opens the breaker.
    #[serde(default)]
    pub unhealthy: Unhealthy,
    /// What closes it.
    #[serde(default)]
    pub healthy: Healthy,
}

/// A header of the break answer.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyValue {
    /// Its name.
    #[schemars(length(min = 1))]
    pub key: String,
    /// Its value (`$variables` allowed).
    #[schemars(length(min = 1))]
    pub value: String,
}

/// `unhealthy`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Unhealthy {
    /// Upstream statuses counted as failures.
    #[serde(default = "default_unhealthy_statuses")]
    #[schemars(length(min = 1), inner(range(min = 500, max = 599)), extend("uniqueItems" = true))]
    pub http_statuses: Vec<u16>,
    /// Every this many failures the breaker (re)opens.
    #[serde(default = "three")]
    #[schemars(range(min = 1))]
    pub failures: u64,
}

/// `healthy`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Healthy {
    /// Upstream statuses counted as successes.
    #[serde(default = "default_healthy_statuses")]
    #[schemars(length(min = 1), inner(range(min = 200, max = 499)), extend("uniqueItems" = true))]
    pub http_statuses: Vec<u16>,
    /// This many successes in a row after failures close the breaker.
    #[serde(default = "three")]
    #[schemars(range(min = 1))]
    pub successes: u64,
}

impl Default for Unhealthy {
    fn default() -> Self {
        Unhealthy { http_statuses: default_unhealthy_statuses(), failures: 3 }
    }
}

impl Default for Healthy {
    fn default() -> Self {
        Healthy { http_statuses: default_healthy_statuses(), successes: 3 }
    }
}

fn default_max_breaker_sec() -> u64 {
    300
}
fn default_unhealthy_statuses() -> Vec<u16> {
    vec![500]
}
fn default_healthy_statuses() -> Vec<u16> {
    vec![200]
}
fn three() -> u64 {
    3
}

/// The plugin.
pub struct ApiBreaker;

/// Where the breakers of an instance live.
enum Scope {
    /// The instance belongs to one route.
    Route(Breaker),
    /// A service's, global rule's or consumer's: one per route id (routes are the operator's,
    /// so the map is bounded by the configuration).
    PerRoute(RwLock<HashMap<Arc<str>, Arc<Breaker>>>),
}

struct Instance {
    policy: Policy,
    unhealthy: Box<[u16]>,
    healthy: Box<[u16]>,
    status: StatusCode,
    /// The body and headers of the break answer (`None`: status only).
    answer: Option<(Bytes, Vec<(HeaderName, Template)>)>,
    scope: Scope,
}

impl Instance {
    fn with_breaker<T>(&self, ctx: &RequestCtx, create: bool, f: impl FnOnce(&Breaker) -> T) -> Option<T> {
        match &self.scope {
            Scope::Route(b) => Some(f(b)),
            Scope::PerRoute(map) => {
                let route = ctx.route_id.as_deref().unwrap_or("");
                let found = map.read().get(route).cloned();
                let b = match found {
                    Some(b) => b,
                    None if create => map.write().entry(Arc::from(route)).or_default().clone(),
                    None => return None,
                };
                Some(f(&b))
            }
        }
    }

    fn break_answer(&self, ctx: &RequestCtx) -> PluginResponse {
        let mut headers = HeaderMap::new();
        let body = match &self.answer {
            None => Bytes::new(),
            Some((body, extra)) => {
                headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                for (name, value) in extra {
                    match HeaderValue::from_str(&value.render(ctx)) {
                        Ok(v) => {
                            headers.append(name.clone(), v);
                        }
                        Err(_) => log::debug!("api-breaker: header {name} renders to an invalid value; left out"),
                    }
                }
                body.clone()
            }
        };
        PluginResponse { status: self.status, headers, body }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::HEADER_FILTER
    }

    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let now = Instant::now();
        if self.with_breaker(ctx, false, |b| b.is_open(now)).unwrap_or(false) {
            return Flow::Respond(self.break_answer(ctx));
        }
        Flow::Continue
    }

    fn header_filter(&self, ctx: &mut RequestCtx, _resp: &mut ResponseHead) -> BodyFilter {
        // Only what the upstream answered (or the gateway's 502/504 after trying it), as it
        // arrived: ctx.status is set before the header filters run.
        if ctx.upstream_addrs.is_empty() {
            return BodyFilter::Skip;
        }
        let seen = if self.unhealthy.contains(&ctx.status) {
            Seen::Unhealthy
        } else if self.healthy.contains(&ctx.status) {
            Seen::Healthy
        } else {
            return BodyFilter::Skip;
        };
        let now = Instant::now();
        self.with_breaker(ctx, true, |b| b.observe(seen, &self.policy, now));
        BodyFilter::Skip
    }
}

impl Plugin for ApiBreaker {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "api-breaker"
    }
    fn priority(&self) -> i32 {
        1005
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let status = StatusCode::from_u16(conf.break_response_code).map_err(|e| format!("break_response_code: {e}"))?;
        let mut headers = Vec::new();
        for (i, kv) in conf.break_response_headers.iter().flatten().enumerate() {
            let name = HeaderName::from_bytes(kv.key.as_bytes())
                .map_err(|_| format!("break_response_headers[{i}].key: `{}` is not a header name", kv.key))?;
            let value = Template::compile(&kv.value).map_err(|e| format!("break_response_headers[{i}].value: {e}"))?;
            if value.literal().is_some_and(|v| HeaderValue::from_str(v).is_err()) {
                return Err(format!("break_response_headers[{i}].value: not a valid header value"));
            }
            headers.push((name, value));
        }
        if !headers.is_empty() && conf.break_response_body.is_none() && !ctx.check_only {
            log::warn!(
                "{}: api-breaker: break_response_headers apply only with break_response_body (as in APISIX)",
                ctx.owner
            );
        }
        let answer = conf.break_response_body.map(|b| (Bytes::from(b), headers));
        let scope = match ctx.owner.kind {
            "routes" => Scope::Route(Breaker::default()),
            _ => Scope::PerRoute(RwLock::new(HashMap::new())),
        };
        Ok(Arc::new(Instance {
            policy: Policy {
                failures: conf.unhealthy.failures.max(1),
                successes: conf.healthy.successes.max(1),
                max_open: Duration::from_secs(conf.max_breaker_sec),
            },
            unhealthy: conf.unhealthy.http_statuses.into(),
            healthy: conf.healthy.http_statuses.into(),
            status,
            answer,
            scope,
        }))
    }
}

register_plugin!(ApiBreaker);

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};
    use weir_plugin::http::HeaderMap;
    use weir_plugin::testing::{instance, run, TestRequest};

    use super::*;

    fn breaker(conf: Value) -> Arc<dyn PluginInstance> {
        instance(&ApiBreaker, conf).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A request answered by the upstream with `status`; the break answer if the breaker is open.
    fn through(p: &Arc<dyn PluginInstance>, status: u16, route: &str) -> Option<PluginResponse> {
        let mut ctx = TestRequest::get("/hello").build();
        ctx.route_id = Some(Arc::from(route));
        if let Some(r) = run(std::slice::from_ref(p), &mut ctx) {
            return Some(r);
        }
        ctx.upstream_addrs.push("127.0.0.1:1980".parse().unwrap_or_else(|e| panic!("{e}")));
        ctx.status = status;
        let mut head =
            ResponseHead { status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK), headers: HeaderMap::new() };
        p.header_filter(&mut ctx, &mut head);
        None
    }

    #[test]
    fn opens_after_the_failures_with_the_configured_answer() {
        let p = breaker(json!({
            "break_response_code": 502, "break_response_body": "breaker open",
            "break_response_headers": [{"key": "X-Client", "value": "$remote_addr:$remote_port"}],
            "unhealthy": {"http_statuses": [500, 503], "failures": 3},
            "healthy": {"http_statuses": [200], "successes": 1}
        }));
        assert!(through(&p, 500, "1").is_none() && through(&p, 503, "1").is_none() && through(&p, 404, "1").is_none());
        assert!(through(&p, 500, "1").is_none(), "the third failure still went through");
        let r = through(&p, 200, "1").unwrap_or_else(|| panic!("open"));
        assert_eq!((r.status.as_u16(), &r.body[..]), (502, &b"breaker open"[..]));
        assert_eq!(r.headers.get("x-client").map(|v| v.as_bytes()), Some(&b"127.0.0.1:40000"[..]));
    }

    #[test]
    fn without_a_body_the_answer_is_the_status_alone() {
        let p = breaker(
            json!({"break_response_code": 503, "break_response_headers": [{"key": "X-A", "value": "b"}], "unhealthy": {"failures": 1}}),
        );
        assert!(through(&p, 500, "1").is_none());
        let r = through(&p, 200, "1").unwrap_or_else(|| panic!("open"));
        assert_eq!(
            (r.status.as_u16(), r.body.len(), r.headers.len()),
            (503, 0, 0),
            "as APISIX: headers only with a body"
        );
    }

    #[test]
    fn answers_not_from_the_upstream_are_not_counted() {
        let p = breaker(json!({"break_response_code": 503, "unhealthy": {"failures": 1}}));
        let mut ctx = TestRequest::get("/").build();
        ctx.status = 500; // a plugin's 500: no upstream was contacted
        let mut head = ResponseHead { status: StatusCode::INTERNAL_SERVER_ERROR, headers: HeaderMap::new() };
        p.header_filter(&mut ctx, &mut head);
        assert!(through(&p, 200, "1").is_none());
    }

    #[test]
    fn a_shared_instance_keeps_one_breaker_per_route() {
        let conf = json!({"break_response_code": 503, "unhealthy": {"failures": 1}});
        let services = weir_plugin::NoServices;
        let directory = weir_plugin::ConsumerDirectory::default();
        let ctx = BuildContext {
            owner: weir_plugin::Owner { kind: "services", id: "s", label: "services[0] (id s)" },
            raw: &conf,
            metadata: None,
            shared: None,
            check_only: false,
            consumers: &directory,
            services: &services,
        };
        let p = weir_plugin::DynPlugin::build(&ApiBreaker, &conf, &ctx).unwrap_or_else(|e| panic!("{e}"));
        assert!(through(&p, 500, "a").is_none());
        assert!(through(&p, 200, "a").is_some(), "route a is open");
        assert!(through(&p, 200, "b").is_none(), "route b is not");
    }

    #[test]
    fn what_cannot_work_is_refused() {
        let err = |conf: Value| instance(&ApiBreaker, conf).err().unwrap_or_default();
        assert!(err(json!({})).starts_with("schema"), "break_response_code is required");
        assert!(err(json!({"break_response_code": 600})).starts_with("schema"));
        assert!(err(json!({"break_response_code": 502, "max_breaker_sec": 2})).starts_with("schema"));
        assert!(err(json!({"break_response_code": 502, "unhealthy": {"http_statuses": [404]}})).starts_with("schema"));
        assert!(
            err(json!({"break_response_code": 502, "unhealthy": {"http_statuses": [500, 500]}})).starts_with("schema")
        );
        assert!(err(json!({"break_response_code": 502, "healthy": {"successes": 0}})).starts_with("schema"));
        assert!(err(json!({"break_response_code": 502, "break_response_headers": [{"key": "a b", "value": "x"}]}))
            .contains("not a header name"));
        assert!(err(json!({"break_response_code": 502, "break_response_headers": [{"key": "a", "value": "$nope"}]}))
            .contains("unknown variable"));
    }
}
