//! What the host does for plugins: requests of a plugin's own through the host's upstream client
//! (its connection pool, timeouts and TLS: no second HTTP stack per plugin), and choosing the
//! upstream of a request (traffic-split).
//!
//! A plugin gets the [`Services`] in [`BuildContext::services`](crate::BuildContext), keeps the
//! [`HttpClient`] it hands out, and calls it from a waiting phase:
//!
//! ```
//! use std::time::Duration;
//! use weir_plugin::{Flow, OutboundRequest, PluginInstance, PluginResponse, RequestCtx};
//! use weir_plugin::http::{Method, StatusCode};
//!
//! struct Check { client: std::sync::Arc<dyn weir_plugin::HttpClient> }
//!
//! impl PluginInstance for Check {
//!     fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
//!         Flow::wait(async move {
//!             let mut req = OutboundRequest::new(Method::GET, "http://127.0.0.1:1/check");
//!             req.timeout = Duration::from_millis(500);
//!             match self.client.send(req).await {
//!                 Ok(resp) if resp.status.is_success() => {
//!                     ctx.set_var("checked", "yes".into()); // the request is still in hand
//!                     Flow::Continue
//!                 }
//!                 _ => Flow::Respond(PluginResponse::message(StatusCode::FORBIDDEN, "denied")),
//!             }
//!         })
//!     }
//! }
//! ```

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use serde_json::Value;

/// The upstream a request goes to instead of its route's ([`RequestCtx::upstream`](crate::RequestCtx)).
#[derive(Clone)]
pub enum UpstreamRef {
    /// An `upstreams` object of the current snapshot, by id (a 503 if it does not exist when
    /// the request is proxied).
    Id(Arc<str>),
    /// An upstream the host compiled from a plugin's configuration
    /// ([`Services::compile_upstream`]); opaque to plugins.
    Compiled(Arc<dyn Any + Send + Sync>),
}

impl std::fmt::Debug for UpstreamRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamRef::Id(id) => write!(f, "UpstreamRef::Id({id})"),
            UpstreamRef::Compiled(_) => f.write_str("UpstreamRef::Compiled(..)"),
        }
    }
}

/// A request a plugin sends through the host's client.
#[derive(Debug, Clone)]
pub struct OutboundRequest {
    /// Method.
    pub method: Method,
    /// Absolute `http://` or `https://` URL.
    pub url: String,
    /// Headers (the client sets `Content-Length` from the body, and `Host` from the URL unless
    /// one is given here).
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
    /// For the whole exchange: connect, send, and the response to its last byte.
    pub timeout: Duration,
    /// Keep the connection in the host's pool for the next request.
    pub keepalive: bool,
    /// Verify the server's certificate (`https`).
    pub verify_tls: bool,
    /// The largest response body read (longer ones fail with an error).
    pub max_body: usize,
}

impl OutboundRequest {
    /// A request with no headers and no body, a 3 s timeout, keep-alive, TLS verified, and
    /// responses up to 1 MiB.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        OutboundRequest {
            method,
            url: url.into(),
            headers: HeaderMap::new(),
            body: Bytes::new(),
            timeout: Duration::from_secs(3),
            keepalive: true,
            verify_tls: true,
            max_body: 1 << 20,
        }
    }
}

/// The answer to an [`OutboundRequest`], read whole.
#[derive(Debug, Clone)]
pub struct OutboundResponse {
    /// Status.
    pub status: StatusCode,
    /// Headers (hop-by-hop fields removed).
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// Why an [`OutboundRequest`] got no answer.
#[derive(Debug, Clone)]
pub struct OutboundError {
    /// The timeout passed.
    pub timeout: bool,
    /// What went wrong, for logs (never sent to clients as it is).
    pub reason: String,
}

impl std::fmt::Display for OutboundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The future of [`HttpClient::send`]; runs on the calling worker (not `Send`).
pub type SendFuture = Pin<Box<dyn Future<Output = Result<OutboundResponse, OutboundError>>>>;

/// Work detached from any request, run on the calling worker ([`HttpClient::spawn`]).
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// The host's HTTP client, for plugins.
pub trait HttpClient: Send + Sync {
    /// Sends `req` and reads the whole answer. On a data-plane worker it uses that worker's
    /// upstream connection pool.
    fn send(&self, req: OutboundRequest) -> SendFuture;
    /// Runs `task` on the calling data-plane worker, detached from the request that started it
    /// (it may outlive it); `false`, with the task dropped unrun, when there is no worker here.
    /// Plugins use it through [`crate::background::Background`], which bounds it.
    fn spawn(&self, task: LocalTask) -> bool {
        drop(task);
        false
    }
}

/// The host's services, given to [`Plugin::build`](crate::Plugin::build).
pub trait Services: Send + Sync {
    /// The host's HTTP client.
    fn http_client(&self) -> Arc<dyn HttpClient>;
    /// Compiles an upstream object (the `upstreams` schema, `nodes` and all) for
    /// [`RequestCtx::upstream`](crate::RequestCtx); errors name the key at fault.
    fn compile_upstream(&self, conf: &Value) -> Result<UpstreamRef, String>;
    /// The `upstreams` object `id` of the resources being loaded, for
    /// [`RequestCtx::upstream`](crate::RequestCtx): an error naming it when there is none, so
    /// that a configuration naming a missing upstream is refused at load (and rebuilt when the
    /// set of upstream ids changes). The object itself is found per request, as it is then.
    fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
        Err(format!("upstream `{id}` cannot be looked up here"))
    }
    /// Builds an instance of another enabled plugin, `name`, from `conf` (checked against its
    /// schema, secrets resolved, its consumer state given), for the same owner: how a plugin
    /// that runs others (multi-auth) gets them. Returns the instance and the plugin's type.
    fn build_plugin(
        &self,
        name: &str,
        conf: &Value,
        owner: crate::Owner<'_>,
    ) -> Result<(Arc<dyn crate::PluginInstance>, Option<&'static str>), String> {
        let _ = (conf, owner);
        Err(format!("plugin `{name}` cannot be built here"))
    }
}

/// Services of a context without a host (unit tests): every call fails.
pub struct NoServices;

struct NoClient;

impl HttpClient for NoClient {
    fn send(&self, req: OutboundRequest) -> SendFuture {
        Box::pin(async move {
            Err(OutboundError { timeout: false, reason: format!("no HTTP client here (request to {})", req.url) })
        })
    }
}

impl Services for NoServices {
    fn http_client(&self) -> Arc<dyn HttpClient> {
        Arc::new(NoClient)
    }
    fn compile_upstream(&self, _conf: &Value) -> Result<UpstreamRef, String> {
        Err("no host to compile upstreams here".into())
    }
}
