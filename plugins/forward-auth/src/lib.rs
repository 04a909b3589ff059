//! `forward-auth`: asks an authorization service about each request, as APISIX 3.x does, through
//! the host's HTTP client (its pool, timeouts and TLS).
//!
//! The service receives `X-Forwarded-Proto/-Method/-Host/-Uri/-For` and the client headers named
//! in `request_headers` (and the body, with `request_method: POST`). A 2xx lets the request go
//! on, with the service's `upstream_headers` set on it: a name in `upstream_headers` that the
//! service did not return is removed from the request, so a client can never supply it. Any
//! other status is the client's answer: the service's status and body, with its
//! `client_headers`. A service that is down, slow or unreadable fails closed with
//! `status_on_error` (403), unless `allow_degradation` lets the request through.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, Method, StatusCode};
use weir_plugin::{
    register_plugin, BuildContext, Flow, HttpClient, Late, OutboundRequest, Plugin, PluginInstance, PluginResponse,
    RequestCtx,
};

/// The method of the request to the authorization service.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum AuthMethod {
    /// No body.
    #[default]
    GET,
    /// With the client's request body.
    POST,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The authorization service (`http://` or `https://`).
    #[schemars(length(min = 1), regex(pattern = "^https?://"))]
    pub uri: String,
    /// Verify the service's certificate.
    #[serde(default = "yes")]
    pub ssl_verify: bool,
    /// `GET`, or `POST` with the client's body.
    #[serde(default)]
    pub request_method: AuthMethod,
    /// Client headers sent on to the service.
    #[serde(default)]
    pub request_headers: Vec<String>,
    /// Service response headers set on the upstream request (when the service allows).
    #[serde(default)]
    pub upstream_headers: Vec<String>,
    /// Service response headers sent to the client (when the service denies).
    #[serde(default)]
    pub client_headers: Vec<String>,
    /// Milliseconds the service has to answer.
    #[serde(default = "default_timeout")]
    #[schemars(range(min = 1, max = 60000))]
    pub timeout: u64,
    /// Keep connections to the service open.
    #[serde(default = "yes")]
    pub keepalive: bool,
    /// Accepted for APISIX compatibility: idle connections close after the host's pool timeout.
    #[serde(default)]
    pub keepalive_timeout: Option<u64>,
    /// Accepted for APISIX compatibility: the host's pool decides how many stay open.
    #[serde(default)]
    pub keepalive_pool: Option<u64>,
    /// Let the request through when the service cannot be asked.
    #[serde(default)]
    pub allow_degradation: bool,
    /// The status when the service cannot be asked.
    #[serde(default = "default_status_on_error")]
    #[schemars(range(min = 200, max = 599))]
    pub status_on_error: u16,
}

fn yes() -> bool {
    true
}
fn default_timeout() -> u64 {
    3000
}
fn default_status_on_error() -> u16 {
    403
}

/// The plugin.
pub struct ForwardAuth;

struct Instance {
    uri: String,
    method: AuthMethod,
    verify: bool,
    request_headers: Vec<HeaderName>,
    upstream_headers: Vec<HeaderName>,
    client_headers: Vec<HeaderName>,
    timeout: Duration,
    keepalive: bool,
    allow_degradation: bool,
    status_on_error: StatusCode,
    client: Arc<dyn HttpClient>,
}

const X_FORWARDED: [&str; 5] =
    ["x-forwarded-proto", "x-forwarded-method", "x-forwarded-host", "x-forwarded-uri", "x-forwarded-for"];

impl Instance {
    /// The request to the service.
    fn auth_request(&self, ctx: &RequestCtx) -> OutboundRequest {
        let method = match self.method {
            AuthMethod::GET => Method::GET,
            AuthMethod::POST => Method::POST,
        };
        let mut req = OutboundRequest::new(method, self.uri.clone());
        req.timeout = self.timeout;
        req.keepalive = self.keepalive;
        req.verify_tls = self.verify;
        for name in &self.request_headers {
            for v in ctx.headers.get_all(name) {
                req.headers.append(name.clone(), v.clone());
            }
        }
        let host = ctx.var("host").unwrap_or_default();
        let values = [ctx.scheme, ctx.method.as_str(), &host, &ctx.request_uri(), &ctx.remote_ip];
        for (name, value) in X_FORWARDED.iter().zip(values) {
            if let Ok(v) = HeaderValue::from_str(value) {
                req.headers.insert(HeaderName::from_static(name), v);
            }
        }
        if let (AuthMethod::POST, Some(body)) = (self.method, &ctx.body) {
            req.body = body.clone();
        }
        req
    }

    fn unavailable(&self, why: &str) -> Flow<'static> {
        log::warn!("forward-auth: {} could not be asked: {why}", self.uri);
        if self.allow_degradation {
            return Flow::Continue;
        }
        let msg = serde_json::json!({ "message": "the authorization service is unavailable" });
        Flow::Respond(PluginResponse::json(self.status_on_error, &msg))
    }
}

impl PluginInstance for Instance {
    fn wants_request_body(&self) -> bool {
        matches!(self.method, AuthMethod::POST)
    }
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let req = self.auth_request(ctx);
        Flow::wait(async move {
            let resp = match self.client.send(req).await {
                Ok(r) => r,
                Err(e) => return self.unavailable(&e.reason),
            };
            if resp.status.is_success() {
                for name in &self.upstream_headers {
                    ctx.headers.remove(name);
                    for v in resp.headers.get_all(name) {
                        ctx.headers.append(name.clone(), v.clone());
                    }
                }
                return Flow::Continue;
            }
            // The service's denial, as it made it.
            let mut answer = PluginResponse { status: resp.status, headers: Default::default(), body: resp.body };
            for name in &self.client_headers {
                for v in resp.headers.get_all(name) {
                    answer.headers.append(name.clone(), v.clone());
                }
            }
            if let Some(t) = resp.headers.get(weir_plugin::http::header::CONTENT_TYPE) {
                answer.headers.entry(weir_plugin::http::header::CONTENT_TYPE).or_insert(t.clone());
            }
            Flow::Respond(answer)
        })
    }
}

fn names(field: &str, list: &[String]) -> Result<Vec<HeaderName>, String> {
    list.iter()
        .map(|n| HeaderName::from_bytes(n.as_bytes()).map_err(|_| format!("{field}: `{n}` is not a header name")))
        .collect()
}

impl Plugin for ForwardAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "forward-auth"
    }
    fn priority(&self) -> i32 {
        2002
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let uri: weir_plugin::http::Uri = conf.uri.parse().map_err(|e| format!("uri: {e}"))?;
        if uri.authority().is_none() {
            return Err("uri: must name a host".into());
        }
        Ok(Arc::new(Instance {
            uri: conf.uri.clone(),
            method: conf.request_method,
            verify: conf.ssl_verify,
            request_headers: names("request_headers", &conf.request_headers)?,
            upstream_headers: names("upstream_headers", &conf.upstream_headers)?,
            client_headers: names("client_headers", &conf.client_headers)?,
            timeout: Duration::from_millis(conf.timeout),
            keepalive: conf.keepalive,
            allow_degradation: conf.allow_degradation,
            status_on_error: StatusCode::from_u16(conf.status_on_error).map_err(|e| format!("status_on_error: {e}"))?,
            client: ctx.services.http_client(),
        }))
    }
}

register_plugin!(ForwardAuth);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::{instance, run, TestRequest};

    #[test]
    fn configurations_are_checked_at_load() {
        assert!(instance(&ForwardAuth, json!({"uri": "http://127.0.0.1:1/auth"})).is_ok());
        assert!(instance(&ForwardAuth, json!({})).is_err(), "uri is required");
        assert!(instance(&ForwardAuth, json!({"uri": "ftp://x"})).is_err());
        assert!(instance(&ForwardAuth, json!({"uri": "http://x", "timeout": 0})).is_err());
        assert!(instance(&ForwardAuth, json!({"uri": "http://x", "request_headers": ["bad header"]})).is_err());
    }

    #[test]
    fn without_a_service_it_fails_closed_or_degrades() {
        // The test kit's client reaches nothing: the service is "down".
        let closed =
            instance(&ForwardAuth, json!({"uri": "http://127.0.0.1:1/auth"})).unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/").build();
        assert_eq!(run(&[closed], &mut ctx).map(|r| r.status.as_u16()), Some(403));
        let open = instance(&ForwardAuth, json!({"uri": "http://127.0.0.1:1/auth", "allow_degradation": true}))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(run(&[open], &mut ctx).is_none());
    }

    #[test]
    fn the_service_learns_the_request() {
        let conf = Conf {
            uri: "http://127.0.0.1:1/auth".into(),
            ..serde_json::from_value(json!({"uri": "http://x", "request_headers": ["authorization"]}))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let i = Instance {
            uri: conf.uri.clone(),
            method: AuthMethod::GET,
            verify: true,
            request_headers: names("request_headers", &conf.request_headers).unwrap_or_default(),
            upstream_headers: Vec::new(),
            client_headers: Vec::new(),
            timeout: Duration::from_secs(1),
            keepalive: true,
            allow_degradation: false,
            status_on_error: StatusCode::FORBIDDEN,
            client: weir_plugin::Services::http_client(&weir_plugin::NoServices),
        };
        let ctx = TestRequest::get("/a/b?c=d").header("host", "api.example:9080").header("authorization", "t").build();
        let req = i.auth_request(&ctx);
        let h = |n: &str| req.headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert_eq!(h("x-forwarded-proto"), "http");
        assert_eq!(h("x-forwarded-method"), "GET");
        assert_eq!(h("x-forwarded-host"), "api.example");
        assert_eq!(h("x-forwarded-uri"), "/a/b?c=d");
        assert_eq!(h("x-forwarded-for"), "127.0.0.1");
        assert_eq!(h("authorization"), "t");
    }
}
