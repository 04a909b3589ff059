//! The plugin-independent control endpoints. Bodies and error messages follow the control
//! reference (APISIX wording where operators grep for it).

use std::sync::OnceLock;

use actix_web::http::header::{ACCEPT, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::{error, json_response, typed_response};
use crate::control_routes::{Endpoint, Kind};
use crate::health::html;
use crate::memory;
use crate::openapi::bodies::{GcReport, GcSubsystems, Reloaded, SchemaDoc, StreamGc};
use crate::state::Gateway;
use crate::tables::snapshot::dump;
use crate::tables::KindSchemas;

/// Serves one built-in endpoint.
pub fn handle(endpoint: Endpoint, req: &HttpRequest, body: &[u8], gw: &Gateway) -> HttpResponse {
    match endpoint {
        Endpoint::Schema => {
            // The document changes only with the enabled set: serialize it once per set.
            let enabled = gw.enabled.load();
            let body = enabled.schema_json.get_or_init(|| {
                let object = |v: Value| match v {
                    Value::Object(m) => m,
                    _ => serde_json::Map::new(),
                };
                let doc = SchemaDoc {
                    main: object(KindSchemas::get().describe()),
                    plugins: object(enabled.describe()),
                    stream_plugins: object(enabled.describe_stream()),
                };
                bytes::Bytes::from(serde_json::to_string(&doc).unwrap_or_default())
            });
            HttpResponse::Ok().insert_header((CONTENT_TYPE, "application/json")).body(body.clone())
        }
        Endpoint::OpenApi => {
            static DOC: OnceLock<bytes::Bytes> = OnceLock::new();
            let body = DOC.get_or_init(|| bytes::Bytes::from(crate::openapi::document().to_string()));
            HttpResponse::Ok().insert_header((CONTENT_TYPE, "application/json")).body(body.clone())
        }
        Endpoint::Healthchecks => {
            let entries = gw.health.entries();
            if wants_html(req) {
                return HttpResponse::Ok()
                    .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
                    .body(html::render(&entries));
            }
            json_response(StatusCode::OK, &serde_json::to_value(&entries).unwrap_or_else(|_| json!([])))
        }
        Endpoint::HealthMissingId(src_type) => {
            error(StatusCode::NOT_FOUND, format!("missing src id for src type {src_type}"))
        }
        Endpoint::Healthcheck(src_type, id) => healthcheck(gw, &src_type, &id, wants_html(req)),
        Endpoint::Gc => gc(gw),
        Endpoint::Certificates => certificates(gw),
        Endpoint::CertificateRenew(id) => {
            if crate::acme::renew(&id) {
                let message = "an order starts now; GET /v1/certificates shows its outcome".to_owned();
                typed_response(StatusCode::ACCEPTED, &crate::openapi::bodies::RenewRequested { id, message })
            } else {
                error(StatusCode::NOT_FOUND, format!("no ssls entry with acme has id {id}"))
            }
        }
        Endpoint::ConfigStatus => {
            let status = gw.provider_status.lock().clone();
            json_response(StatusCode::OK, &serde_json::to_value(&status).unwrap_or_default())
        }
        Endpoint::PluginMetadatas => {
            let snap = gw.resources.load();
            json_response(StatusCode::OK, &Value::Array(snap.plugin_metadata.iter().map(dump).collect()))
        }
        Endpoint::PluginMetadata(name) => match gw.resources.load().metadata(&name) {
            Some(m) => json_response(StatusCode::OK, &dump(m)),
            None => error(StatusCode::NOT_FOUND, format!("plugin metadata[{name}] not found")),
        },
        Endpoint::List(kind) => {
            let snap = gw.resources.load();
            let items: Vec<Value> = match kind {
                Kind::Route => snap.routes.iter().map(|r| dump(&**r)).collect(),
                Kind::Service => snap.services.iter().map(|s| dump(&**s)).collect(),
                Kind::Upstream => snap.upstreams.iter().map(|u| dump(&**u)).collect(),
            };
            json_response(StatusCode::OK, &Value::Array(items))
        }
        Endpoint::One(kind, id) => {
            let snap = gw.resources.load();
            let found = match kind {
                Kind::Route => snap.route(&id).map(|r| dump(&**r)),
                Kind::Service => snap.service(&id).map(|s| dump(&**s)),
                Kind::Upstream => snap.upstream(&id).map(|u| dump(&**u)),
            };
            match found {
                Some(v) => json_response(StatusCode::OK, &v),
                None => error(StatusCode::NOT_FOUND, format!("{}[{id}] not found", kind.singular())),
            }
        }
        Endpoint::PluginsReload => match gw.reload_plugins() {
            Ok(names) => {
                log::info!("plugins reloaded: {}", names.join(", "));
                typed_response(StatusCode::OK, &Reloaded { message: "plugins reloaded".into(), plugins: names })
            }
            Err(e) => {
                log::error!("plugin reload refused: {e}");
                error(StatusCode::BAD_REQUEST, format!("{e}\n(the running configuration is unchanged)"))
            }
        },
        Endpoint::Explain => {
            // The dashboard's form posts a form when the page runs no script.
            let form = req.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| {
                v.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"))
            });
            let converted;
            let body = if form {
                match super::dashboard::form_to_json(body) {
                    Ok(b) => {
                        converted = b;
                        &converted[..]
                    }
                    Err(why) => return error(StatusCode::BAD_REQUEST, why),
                }
            } else {
                body
            };
            let snap = gw.resources.load();
            match super::explain::explain(body, &snap, &gw.config.load()) {
                Ok(answer) if form && wants_html(req) => super::dashboard::explanation_page(&answer),
                Ok(answer) => typed_response(StatusCode::OK, &answer),
                Err(why) => error(StatusCode::BAD_REQUEST, why),
            }
        }
        Endpoint::Dashboard => super::dashboard::page(gw),
        Endpoint::DashboardStats => super::dashboard::stats(gw),
    }
}

fn wants_html(req: &HttpRequest) -> bool {
    req.headers()
        .get_all(ACCEPT)
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("text/html")))
}

/// One checker's entry: JSON, or (when the client asks for HTML, as APISIX does) the list page with
/// that one entry. Errors stay JSON either way.
fn healthcheck(gw: &Gateway, src_type: &str, id: &str, html: bool) -> HttpResponse {
    let snap = gw.resources.load();
    let exists = match src_type {
        "routes" => snap.route(id).is_some(),
        "services" => snap.service(id).is_some(),
        "upstreams" => snap.upstream(id).is_some(),
        "stream_routes" => snap.stream_route(id).is_some(),
        _ => return error(StatusCode::BAD_REQUEST, format!("invalid src type {src_type}")),
    };
    if !exists {
        return error(StatusCode::NOT_FOUND, format!("{src_type}[{id}] not found"));
    }
    match gw.health.entry(src_type, id) {
        Some(entry) if html => HttpResponse::Ok()
            .insert_header((CONTENT_TYPE, "text/html; charset=utf-8"))
            .body(html::render(std::slice::from_ref(&entry))),
        Some(entry) => json_response(StatusCode::OK, &serde_json::to_value(&entry).unwrap_or_default()),
        None => error(StatusCode::NOT_FOUND, format!("no checker for {src_type}[{id}]")),
    }
}

/// Every `ssls` entry: its source, the names it serves, expiry, and the ACME status.
fn certificates(gw: &Gateway) -> HttpResponse {
    use crate::openapi::bodies::{Certificate, Certificates};
    let snap = gw.resources.load();
    let served = snap.certs.expiries();
    let acme: std::collections::HashMap<String, crate::acme::Status> = crate::acme::statuses().into_iter().collect();
    let list = snap
        .ssls
        .iter()
        .map(|ssl| {
            let mine: Vec<&(String, String, i64)> = served.iter().filter(|(id, _, _)| *id == ssl.id.0).collect();
            Certificate {
                id: ssl.id.0.clone(),
                source: if ssl.acme.is_some() { "acme" } else { "static" },
                snis: mine.iter().map(|(_, sni, _)| sni.clone()).collect(),
                not_after: mine.first().map(|(_, _, t)| *t),
                acme: acme.get(&ssl.id.0).cloned(),
            }
        })
        .collect();
    typed_response(StatusCode::OK, &Certificates { list })
}

fn gc(_gw: &Gateway) -> HttpResponse {
    let before = memory::stats();
    let mut actions = Vec::new();
    match memory::purge() {
        Ok(()) => actions.push("allocator: dirty pages of all arenas returned to the OS".to_owned()),
        Err(e) => {
            log::warn!("gc: {e}");
            return error(StatusCode::INTERNAL_SERVER_ERROR, e);
        }
    }
    let after = memory::stats();
    let (tcp, udp) = crate::stream::live();
    log::info!(
        "gc: resident {} -> {} bytes, rss {} -> {} bytes",
        before.resident,
        after.resident,
        before.rss,
        after.rss
    );
    typed_response(
        StatusCode::OK,
        &GcReport {
            before,
            after,
            freed_rss: before.rss.saturating_sub(after.rss),
            actions,
            // One process, one allocator: the purge covers both subsystems.
            subsystems: GcSubsystems {
                http: "covered by the allocator purge".into(),
                stream: StreamGc {
                    covered: "by the allocator purge (relays hold no buffer while idle)".into(),
                    tcp_connections: tcp,
                    udp_sessions: udp,
                },
            },
        },
    )
}
