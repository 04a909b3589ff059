//! The plugin test kit (feature `testing`, for a plugin crate's `[dev-dependencies]`): build an
//! instance from a `json!` configuration validated against the plugin's own schema (as the host
//! validates it), make a request context in one line, and run a chain's phases on it, waiting
//! phases included.
//!
//! ```
//! # #[cfg(feature = "testing")] {
//! use weir_plugin::testing::{instance, run, TestRequest};
//! # use std::sync::Arc;
//! # use weir_plugin::{BuildContext, Flow, Plugin, PluginInstance, PluginResponse, RequestCtx};
//! # use weir_plugin::http::StatusCode;
//! # #[derive(serde::Deserialize, schemars::JsonSchema)]
//! # #[serde(deny_unknown_fields)]
//! # struct Conf { deny: bool }
//! # struct Deny(bool);
//! # impl PluginInstance for Deny {
//! #     fn access<'a>(&'a self, _ctx: &'a mut RequestCtx) -> Flow<'a> {
//! #         if self.0 { Flow::Respond(PluginResponse::message(StatusCode::FORBIDDEN, "no")) } else { Flow::Continue }
//! #     }
//! # }
//! # struct DenyPlugin;
//! # impl Plugin for DenyPlugin {
//! #     type Conf = Conf;
//! #     fn name(&self) -> &'static str { "deny" }
//! #     fn priority(&self) -> i32 { 1 }
//! #     fn build(&self, c: Conf, _: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> { Ok(Arc::new(Deny(c.deny))) }
//! # }
//! let deny = instance(&DenyPlugin, serde_json::json!({"deny": true})).expect("valid");
//! let mut ctx = TestRequest::get("/x").header("apikey", "k").build();
//! assert_eq!(run(&[deny], &mut ctx).map(|r| r.status.as_u16()), Some(403));
//! assert!(instance(&DenyPlugin, serde_json::json!({"deny": "yes"})).is_err()); // schema says no
//! # }
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use serde_json::Value;

use crate::{
    BodyFilter, BuildContext, Consumer, ConsumerDirectory, ConsumerRef, DynPlugin, Flow, NoServices, Owner, Plugin,
    PluginInstance, PluginResponse, RequestCtx, ResponseHead, Services, SharedState,
};

/// A request context made in a few calls.
pub struct TestRequest {
    ctx: RequestCtx,
}

impl TestRequest {
    /// A request with `method` to `target` (`/path?query`) from 127.0.0.1.
    pub fn new(method: Method, target: &str) -> Self {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let addr = SocketAddr::from(([127, 0, 0, 1], 40000));
        let local = SocketAddr::from(([127, 0, 0, 1], 9080));
        let mut ctx =
            RequestCtx::new(method, path.into(), query.into(), HeaderMap::new(), addr, Arc::from("127.0.0.1"), local);
        ctx.request_target = target.parse().ok();
        TestRequest { ctx }
    }
    /// A GET of `target`.
    pub fn get(target: &str) -> Self {
        Self::new(Method::GET, target)
    }
    /// Adds a request header (panics on an invalid name or value: test input).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        let name = HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|e| panic!("header name {name:?}: {e}"));
        let value = HeaderValue::from_str(value).unwrap_or_else(|e| panic!("header value {value:?}: {e}"));
        self.ctx.headers.append(name, value);
        self
    }
    /// Sets the client address.
    pub fn remote(mut self, addr: SocketAddr) -> Self {
        self.ctx.remote_addr = addr;
        self.ctx.remote_ip = Arc::from(addr.ip().to_string());
        self
    }
    /// Sets the request body (what `wants_request_body` plugins read).
    pub fn body(mut self, body: &[u8]) -> Self {
        self.ctx.body = Some(Bytes::copy_from_slice(body));
        self
    }
    /// The context.
    pub fn build(self) -> RequestCtx {
        self.ctx
    }
}

fn check(schema: &Value, conf: &Value, what: &str) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| format!("{what}: invalid schema: {e}"))?;
    let errors: Vec<String> = validator.iter_errors(conf).map(|e| format!("{}: {e}", e.instance_path())).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {}", errors.join("; ")))
    }
}

/// Builds an instance of `plugin` from `conf`, validated against the plugin's schema first
/// (an invalid configuration is the `Err` the host would report).
pub fn instance<P: Plugin>(plugin: &P, conf: Value) -> Result<Arc<dyn PluginInstance>, String> {
    instance_with_consumers(plugin, conf, &[])
}

/// [`instance`], with consumers carrying `(username, credential)` of this plugin (validated
/// against its consumer schema, then given to `prepare_consumers`).
pub fn instance_with_consumers<P: Plugin>(
    plugin: &P,
    conf: Value,
    consumers: &[(&str, Value)],
) -> Result<Arc<dyn PluginInstance>, String> {
    instance_with(plugin, conf, consumers, &NoServices)
}

/// [`instance_with_consumers`], with the host services of the caller's choice.
pub fn instance_with<P: Plugin>(
    plugin: &P,
    conf: Value,
    consumers: &[(&str, Value)],
    services: &dyn Services,
) -> Result<Arc<dyn PluginInstance>, String> {
    check(&DynPlugin::schema(plugin), &conf, "schema")?;
    let people: Vec<Arc<Consumer>> = consumers.iter().map(|(name, _)| Arc::new(Consumer::named(name))).collect();
    let mut refs = Vec::new();
    if let Some(schema) = DynPlugin::consumer_schema(plugin) {
        for ((name, credential), consumer) in consumers.iter().zip(&people) {
            check(&schema, credential, "consumer_schema")?;
            refs.push(ConsumerRef { username: name, consumer, conf: credential });
        }
    }
    let shared: Option<SharedState> = DynPlugin::prepare_consumers(plugin, &refs)?;
    let directory = ConsumerDirectory::new(people.iter().cloned());
    let ctx = BuildContext {
        owner: Owner { kind: "routes", id: "test", label: "routes[0] (id test)" },
        raw: &conf,
        metadata: None,
        shared: shared.as_ref(),
        check_only: false,
        consumers: &directory,
        services,
    };
    DynPlugin::build(plugin, &conf, &ctx)
}

/// Runs `rewrite` then `access` of `chain` on `ctx` as the host does (in order, waiting phases
/// awaited on a single-threaded runtime); the answer of the plugin that ended the request.
pub fn run(chain: &[Arc<dyn PluginInstance>], ctx: &mut RequestCtx) -> Option<PluginResponse> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        for phase in 0..2 {
            for p in chain {
                let flow = if phase == 0 { p.rewrite(ctx) } else { p.access(ctx) };
                let mut flow: Flow<'_> = flow;
                loop {
                    match flow {
                        Flow::Continue => break,
                        Flow::Respond(r) => return Some(r),
                        Flow::Wait(f) => flow = f.await,
                    }
                }
            }
        }
        None
    })
}

/// Runs the response side of `chain` on a response: `header_filter`, then `body_filter` over
/// `body` as one last chunk for the plugins that asked to filter (or observe) it.
pub fn respond(
    chain: &[Arc<dyn PluginInstance>],
    ctx: &mut RequestCtx,
    mut head: ResponseHead,
    body: &[u8],
) -> (ResponseHead, Bytes) {
    let filters: Vec<BodyFilter> = chain.iter().map(|p| p.header_filter(ctx, &mut head)).collect();
    let mut body = Bytes::copy_from_slice(body);
    for (p, filter) in chain.iter().zip(filters) {
        match filter {
            BodyFilter::Skip => {}
            BodyFilter::Filter => p.body_filter(ctx, &mut body, true),
            BodyFilter::Observe => p.body_filter(ctx, &mut body.clone(), true),
        }
    }
    (head, body)
}
