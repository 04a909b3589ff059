//! Plugin control endpoints: what a plugin mounts on the control server.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

/// The future a control handler returns. Control handlers run on the control server's single
/// worker, so the future need not be `Send`.
pub type ControlFuture = Pin<Box<dyn Future<Output = ControlResponse>>>;

/// A control endpoint handler.
pub type ControlHandler = Arc<dyn Fn(ControlRequest) -> ControlFuture + Send + Sync>;

/// One control endpoint: the methods and URIs it answers, and its handler.
///
/// URIs are absolute on the control listener, by convention `/v1/plugin/<plugin-name>/...`.
/// A trailing `*` is a prefix match. A `:name` segment captures one non-empty path segment when
/// the control router is `radixtree_uri_with_parameter`; otherwise it is matched literally.
#[derive(Clone)]
pub struct ControlEndpoint {
    /// HTTP methods, upper case (`GET`, `POST`, ...).
    pub methods: Vec<&'static str>,
    /// URIs this endpoint answers.
    pub uris: Vec<String>,
    /// The handler.
    pub handler: ControlHandler,
}

impl ControlEndpoint {
    /// An endpoint from a synchronous closure.
    pub fn sync(
        methods: &[&'static str],
        uris: &[&str],
        f: impl Fn(ControlRequest) -> ControlResponse + Send + Sync + 'static,
    ) -> Self {
        ControlEndpoint {
            methods: methods.to_vec(),
            uris: uris.iter().map(|u| (*u).to_owned()).collect(),
            handler: Arc::new(move |req| {
                let resp = f(req);
                Box::pin(async move { resp })
            }),
        }
    }
}

/// A request to a plugin control endpoint.
#[derive(Debug, Clone)]
pub struct ControlRequest {
    /// Upper-case method.
    pub method: String,
    /// Request path (not decoded).
    pub path: String,
    /// Raw query string, without `?`.
    pub query: String,
    /// Captured path parameters (`:name` segments), in order.
    pub params: Vec<(String, String)>,
    /// Request headers, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: Bytes,
}

impl ControlRequest {
    /// A captured path parameter.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    /// Whether the query string has argument `name` (with or without a value).
    pub fn has_arg(&self, name: &str) -> bool {
        self.arg(name).is_some()
    }
    /// The raw value of query argument `name` (`""` when it has no value).
    pub fn arg(&self, name: &str) -> Option<&str> {
        crate::query_arg(&self.query, name)
    }
    /// A request header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// The answer of a control endpoint.
#[derive(Debug, Clone)]
pub struct ControlResponse {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type` of the body.
    pub content_type: &'static str,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Bytes,
}

impl ControlResponse {
    /// A JSON answer.
    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        ControlResponse {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Bytes::from(value.to_string()),
        }
    }
    /// A `{"error_msg": ...}` answer.
    pub fn error(status: u16, msg: impl Into<String>) -> Self {
        Self::json(status, &serde_json::json!({ "error_msg": msg.into() }))
    }
    /// A plain-text answer.
    pub fn text(status: u16, body: impl Into<Bytes>) -> Self {
        ControlResponse { status, content_type: "text/plain; charset=utf-8", headers: Vec::new(), body: body.into() }
    }
}
