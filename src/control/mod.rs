//! The control server: a small actix-web server on a loopback address exposing the instance's
//! state (`/v1/schema`, health checks, plugin metadata, loaded resources) and controlling it
//! (`/v1/gc`, `/v1/plugins/reload`), plus the control endpoints of enabled plugins.
//!
//! One worker: the control plane is not a hot path. Routing is ours (built-ins, then plugin
//! routes), so that unknown paths get a JSON 404 and wrong methods a 405 with `Allow`.

pub mod builtin;
pub mod dashboard;
pub mod explain;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::http::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Value};
use weir_plugin::{ControlRequest, ControlResponse};

use crate::openapi::bodies::ErrorBody;
use crate::state::Gateway;

/// Largest request body the control server reads.
pub const MAX_BODY: usize = 1 << 20;

/// Binds the control server (the caller runs it).
pub fn server(gateway: Arc<Gateway>, addr: SocketAddr) -> std::io::Result<actix_web::dev::Server> {
    // The dashboard's per-route numbers are counted while the control server runs.
    crate::route_stats::enable();
    let data = web::Data::from(gateway);
    Ok(HttpServer::new(move || {
        App::new().app_data(data.clone()).app_data(web::PayloadConfig::new(MAX_BODY)).default_service(web::to(dispatch))
    })
    .workers(1)
    .disable_signals()
    .listen(crate::handover::tcp(addr)?)?
    .run())
}

/// Binds the listener a plugin asked for (`Plugin::listener`, e.g. the Prometheus exporter): its
/// endpoints by exact URI (a trailing `*` is a prefix), a JSON 404 or 405 otherwise. One worker.
pub fn plugin_listener(
    plugin: &'static str,
    listener: weir_plugin::PluginListener,
) -> std::io::Result<actix_web::dev::Server> {
    let endpoints = web::Data::new((plugin, listener.endpoints));
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(endpoints.clone())
            .app_data(web::PayloadConfig::new(MAX_BODY))
            .default_service(web::to(dispatch_plugin_listener))
    })
    .workers(1)
    .disable_signals()
    .listen(crate::handover::tcp(listener.addr)?)?
    .run())
}

async fn dispatch_plugin_listener(
    req: HttpRequest,
    body: web::Bytes,
    endpoints: web::Data<(&'static str, Vec<weir_plugin::ControlEndpoint>)>,
) -> HttpResponse {
    let path = req.path();
    let at_path: Vec<&weir_plugin::ControlEndpoint> = endpoints
        .1
        .iter()
        .filter(|ep| {
            ep.uris.iter().any(|u| match u.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => u == path,
            })
        })
        .collect();
    if at_path.is_empty() {
        return json_response(StatusCode::NOT_FOUND, &json!({ "error_msg": "not found" }));
    }
    let method = req.method().as_str();
    let Some(ep) = at_path.iter().find(|ep| ep.methods.contains(&method)) else {
        let allowed: Vec<&str> = at_path.iter().flat_map(|ep| ep.methods.iter().copied()).collect();
        return method_not_allowed(&allowed);
    };
    to_http((ep.handler)(control_request(&req, path, Vec::new(), body)).await)
}

/// A plugin's view of a control request.
fn control_request(req: &HttpRequest, path: &str, params: Vec<(String, String)>, body: web::Bytes) -> ControlRequest {
    ControlRequest {
        method: req.method().as_str().to_owned(),
        path: path.to_owned(),
        query: req.query_string().to_owned(),
        params,
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect(),
        body,
    }
}

async fn dispatch(req: HttpRequest, body: web::Bytes, gw: web::Data<Gateway>) -> HttpResponse {
    let path = req.path();
    if let Some((endpoint, methods)) = crate::control_routes::lookup(path) {
        if !methods.contains(&req.method().as_str()) {
            return method_not_allowed(methods);
        }
        return builtin::handle(endpoint, &req, &body, &gw);
    }
    let routes = gw.control_routes.load();
    if let Some(found) = routes.at(path) {
        let method = req.method().as_str();
        let Some(mounted) = found.mounted.iter().find(|m| m.methods.contains(&method)) else {
            let allowed: Vec<&str> = found.mounted.iter().flat_map(|m| m.methods.iter().copied()).collect();
            return method_not_allowed(&allowed);
        };
        let request = control_request(&req, path, found.params, body.clone());
        let handler = mounted.handler.clone();
        drop(routes);
        return to_http(handler(request).await);
    }
    json_response(StatusCode::NOT_FOUND, &json!({ "error_msg": "not found" }))
}

fn method_not_allowed(methods: &[&str]) -> HttpResponse {
    let mut resp = json_response(StatusCode::METHOD_NOT_ALLOWED, &json!({ "error_msg": "method not allowed" }));
    if let Ok(v) = HeaderValue::from_str(&methods.join(", ")) {
        resp.headers_mut().insert(ALLOW, v);
    }
    resp
}

/// A JSON response.
pub fn json_response(status: StatusCode, value: &Value) -> HttpResponse {
    HttpResponse::build(status).insert_header((CONTENT_TYPE, "application/json")).body(value.to_string())
}

/// A JSON response of a typed body (see `crate::openapi::bodies`).
pub fn typed_response<T: serde::Serialize>(status: StatusCode, body: &T) -> HttpResponse {
    match serde_json::to_string(body) {
        Ok(text) => HttpResponse::build(status).insert_header((CONTENT_TYPE, "application/json")).body(text),
        Err(e) => json_response(StatusCode::INTERNAL_SERVER_ERROR, &json!({ "error_msg": e.to_string() })),
    }
}

/// A `{"error_msg": ...}` response.
pub fn error(status: StatusCode, msg: impl Into<String>) -> HttpResponse {
    typed_response(status, &ErrorBody { error_msg: msg.into() })
}

fn to_http(resp: ControlResponse) -> HttpResponse {
    let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    out.insert_header((CONTENT_TYPE, resp.content_type));
    for (k, v) in &resp.headers {
        out.append_header((k.as_str(), v.as_str()));
    }
    out.body(resp.body)
}
