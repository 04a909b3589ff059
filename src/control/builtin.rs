//! The plugin-independent control endpoints. Bodies and error messages follow the control
//! reference (APISIX wording where operators grep for it).

use std::sync::OnceLock;

use actix_web::http::header::{ACCEPT, CONTENT_TYPE};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::{error, json_response, typed_response};
use crate::health::html;
use crate::memory;
use crate::openapi::bodies::{GcReport, GcSubsystems, Reloaded, SchemaDoc, StreamGc};
use crate::resources::snapshot::dump;
use crate::resources::KindSchemas;
use crate::state::Gateway;

/// Resource kinds dumped by `/v1/<kinds>` and `/v1/<kind>/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Routes.
    Route,
    /// Services.
    Service,
    /// Upstream objects.
    Upstream,
}

impl Kind {
    /// `route`, `service`, `upstream`.
    pub fn singular(self) -> &'static str {
        match self {
            Kind::Route => "route",
            Kind::Service => "service",
            Kind::Upstream => "upstream",
        }
    }
}

/// What a built-in path serves (the table's values; also what `crate::openapi` documents).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub enum Tag {
    Schema,
    OpenApi,
    Healthchecks,
    HealthMissingId,
    Healthcheck,
    Gc,
    ConfigStatus,
    PluginMetadatas,
    PluginMetadata,
    List(Kind),
    One(Kind),
    PluginsReload,
}

/// A resolved built-in endpoint with its captured parameters.
#[derive(Debug, Clone)]
pub enum Endpoint {
    /// `GET /v1/schema`.
    Schema,
    /// `GET /v1/openapi.json`.
    OpenApi,
    /// `GET /v1/healthcheck`.
    Healthchecks,
    /// `GET /v1/healthcheck/{src_type}` (no id).
    HealthMissingId(String),
    /// `GET /v1/healthcheck/{src_type}/{src_id}`.
    Healthcheck(String, String),
    /// `POST /v1/gc`.
    Gc,
    /// `GET /v1/config_status`.
    ConfigStatus,
    /// `GET /v1/plugin_metadatas`.
    PluginMetadatas,
    /// `GET /v1/plugin_metadata/{plugin_name}`.
    PluginMetadata(String),
    /// `GET /v1/routes|services|upstreams`.
    List(Kind),
    /// `GET /v1/route|service|upstream/{id}`.
    One(Kind, String),
    /// `PUT /v1/plugins/reload`.
    PluginsReload,
}

const GET: &[&str] = &["GET"];

/// Every built-in endpoint: `(path, what it serves, methods)`.
pub fn endpoints() -> impl Iterator<Item = (&'static str, Tag, &'static [&'static str])> {
    table().iter().copied()
}

fn table() -> &'static [(&'static str, Tag, &'static [&'static str])] {
    &[
        ("/v1/schema", Tag::Schema, GET),
        ("/v1/openapi.json", Tag::OpenApi, GET),
        ("/v1/healthcheck", Tag::Healthchecks, GET),
        ("/v1/healthcheck/{src_type}", Tag::HealthMissingId, GET),
        ("/v1/healthcheck/{src_type}/", Tag::HealthMissingId, GET),
        ("/v1/healthcheck/{src_type}/{src_id}", Tag::Healthcheck, GET),
        ("/v1/gc", Tag::Gc, &["POST"]),
        ("/v1/config_status", Tag::ConfigStatus, &["GET"]),
        ("/v1/plugin_metadatas", Tag::PluginMetadatas, GET),
        ("/v1/plugin_metadata/{plugin_name}", Tag::PluginMetadata, GET),
        ("/v1/routes", Tag::List(Kind::Route), GET),
        ("/v1/route/{id}", Tag::One(Kind::Route), GET),
        ("/v1/services", Tag::List(Kind::Service), GET),
        ("/v1/service/{id}", Tag::One(Kind::Service), GET),
        ("/v1/upstreams", Tag::List(Kind::Upstream), GET),
        ("/v1/upstream/{id}", Tag::One(Kind::Upstream), GET),
        ("/v1/plugins/reload", Tag::PluginsReload, &["PUT"]),
    ]
}

fn router() -> &'static matchit::Router<(Tag, &'static [&'static str])> {
    static ROUTER: OnceLock<matchit::Router<(Tag, &'static [&'static str])>> = OnceLock::new();
    ROUTER.get_or_init(|| {
        let mut r = matchit::Router::new();
        for (path, tag, methods) in table() {
            if let Err(e) = r.insert(*path, (*tag, *methods)) {
                panic!("built-in control route {path}: {e}");
            }
        }
        r
    })
}

/// The built-in endpoint at `path`, with its allowed methods.
pub fn lookup(path: &str) -> Option<(Endpoint, &'static [&'static str])> {
    let m = router().at(path).ok()?;
    let p = |k: &str| m.params.get(k).unwrap_or_default().to_owned();
    let (tag, methods) = *m.value;
    let endpoint = match tag {
        Tag::Schema => Endpoint::Schema,
        Tag::OpenApi => Endpoint::OpenApi,
        Tag::Healthchecks => Endpoint::Healthchecks,
        Tag::HealthMissingId => Endpoint::HealthMissingId(p("src_type")),
        Tag::Healthcheck => Endpoint::Healthcheck(p("src_type"), p("src_id")),
        Tag::Gc => Endpoint::Gc,
        Tag::ConfigStatus => Endpoint::ConfigStatus,
        Tag::PluginMetadatas => Endpoint::PluginMetadatas,
        Tag::PluginMetadata => Endpoint::PluginMetadata(p("plugin_name")),
        Tag::List(k) => Endpoint::List(k),
        Tag::One(k) => Endpoint::One(k, p("id")),
        Tag::PluginsReload => Endpoint::PluginsReload,
    };
    Some((endpoint, methods))
}

/// A concrete path matching a matchit `pattern` (parameters filled with `x`).
fn sample(pattern: &str) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                out.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                out.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                out.push('x');
            }
            c => out.push(c),
        }
    }
    out
}

/// The built-in endpoint a plugin route `pattern` would shadow or be shadowed by, if any.
pub fn shadowed_by(pattern: &str) -> Option<String> {
    if lookup(&sample(pattern)).is_some() {
        return Some(sample(pattern));
    }
    let mut alone = matchit::Router::new();
    alone.insert(pattern, ()).ok()?;
    table().iter().map(|(p, _, _)| sample(p)).find(|s| alone.at(s).is_ok())
}

/// Serves one built-in endpoint.
pub fn handle(endpoint: Endpoint, req: &HttpRequest, gw: &Gateway) -> HttpResponse {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_and_shadowing() {
        assert_eq!(sample("/v1/route/{id}"), "/v1/route/x");
        assert_eq!(sample("/a/{{b}}"), "/a/{b}");
        assert!(shadowed_by("/v1/schema").is_some());
        assert!(shadowed_by("/v1/route/foo").is_some());
        assert!(shadowed_by("/v1/{*rest}").is_some());
        assert!(shadowed_by("/v1/plugin/example-plugin/hello").is_none());
    }

    #[test]
    fn healthcheck_paths() {
        assert!(matches!(lookup("/v1/healthcheck/routes"), Some((Endpoint::HealthMissingId(t), _)) if t == "routes"));
        assert!(matches!(lookup("/v1/healthcheck/routes/"), Some((Endpoint::HealthMissingId(_), _))));
        assert!(matches!(lookup("/v1/healthcheck/routes/1"), Some((Endpoint::Healthcheck(_, i), _)) if i == "1"));
        assert!(lookup("/v1/nothing").is_none());
    }
}
