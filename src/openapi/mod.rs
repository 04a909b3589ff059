//! The OpenAPI 3.1 document of the control API and the Admin API, served at
//! `GET /v1/openapi.json` and kept in `docs/openapi.json`.
//!
//! Nothing in it is written twice. Paths come from the control server's own endpoint table and
//! the Admin API's list of kinds; request bodies are the resource kind schemas that validate
//! every write; response bodies are the schemas of the types the handlers serialize
//! ([`bodies`]). A test keeps `docs/openapi.json` equal to what this builds.

pub mod bodies;
pub mod explain;

use schemars::JsonSchema;
use serde_json::{json, Map, Value};

use crate::control_routes::{self, Tag};
use crate::health;
use crate::resources::etcd::{ProviderStatus, KINDS};
use crate::tables::KindSchemas;

/// The schema of a response type, as it serializes (an `Option` is nullable here).
fn schema<T: JsonSchema>() -> Value {
    weir_plugin::serialized_schema_of::<T>()
}

/// The schema of a request type, as it deserializes.
fn request_schema<T: JsonSchema>() -> Value {
    let mut s = weir_plugin::schema_of::<T>();
    if let Value::Object(o) = &mut s {
        o.remove("$schema");
    }
    s
}

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn response(description: &str, schema: Value) -> Value {
    json!({ "description": description, "content": json_content(schema) })
}

fn error_response(description: &str) -> Value {
    response(description, reference("Error"))
}

/// Resource kind (`routes`) to its schema's component name (`route`).
fn singular(kind: &str) -> &str {
    match kind {
        "routes" => "route",
        "services" => "service",
        "upstreams" => "upstream",
        "consumers" => "consumer",
        "consumer_groups" => "consumer_group",
        "credentials" => "credential",
        "global_rules" => "global_rule",
        "plugin_configs" => "plugin_config",
        "plugin_metadata" => "plugin_metadata",
        "ssls" => "ssl",
        "stream_routes" => "stream_route",
        other => other,
    }
}

/// The whole document.
pub fn document() -> Value {
    let mut schemas = Map::new();
    for (kind, compiled) in &KindSchemas::get().kinds {
        let mut s = compiled.schema().clone();
        if let Value::Object(o) = &mut s {
            o.remove("$schema");
        }
        schemas.insert((*kind).to_owned(), s);
    }
    schemas.insert("Error".into(), schema::<bodies::ErrorBody>());
    schemas.insert("KeyNotFound".into(), schema::<bodies::KeyNotFound>());
    schemas.insert("SchemaDoc".into(), schema::<bodies::SchemaDoc>());
    schemas.insert("HealthEntry".into(), schema::<health::Entry>());
    schemas.insert("GcReport".into(), schema::<bodies::GcReport>());
    schemas.insert("ConfigStatus".into(), schema::<ProviderStatus>());
    schemas.insert("Reloaded".into(), schema::<bodies::Reloaded>());
    schemas.insert("Node".into(), schema::<bodies::Node>());
    schemas.insert("NodeList".into(), schema::<bodies::NodeList>());
    schemas.insert("Stored".into(), schema::<bodies::Stored>());
    schemas.insert("Deleted".into(), schema::<bodies::Deleted>());
    schemas.insert("ExplainRequest".into(), request_schema::<explain::ExplainRequest>());
    schemas.insert("Explanation".into(), schema::<explain::Explanation>());
    schemas.insert("DashboardStats".into(), schema::<crate::route_stats::DashboardStats>());
    schemas.insert("Certificates".into(), schema::<bodies::Certificates>());
    schemas.insert("RenewRequested".into(), schema::<bodies::RenewRequested>());

    let mut paths = Map::new();
    control_paths(&mut paths);
    admin_paths(&mut paths);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Weir control API and Admin API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Two servers of one Weir instance. The control API (paths under /v1/) listens on gateway.control (default http://127.0.0.1:9090, loopback only, no authentication). The Admin API (paths under /weir/admin/, and the same under /apisix/admin/) listens on deployment.admin.admin_listen (default http://127.0.0.1:9180) with the etcd provider, and needs an X-API-KEY. Plugins may mount further control endpoints (docs/control-api.md); they are not listed here.",
            "license": { "name": "Apache-2.0", "identifier": "Apache-2.0" },
        },
        "servers": [
            { "url": "http://127.0.0.1:9090", "description": "control server (paths under /v1/)" },
            { "url": "http://127.0.0.1:9180", "description": "Admin API (paths under /weir/admin/)" },
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "adminKey": { "type": "apiKey", "in": "header", "name": "X-API-KEY" },
            },
        },
    })
}

fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({ "name": name, "in": "path", "required": true, "description": description, "schema": schema })
}

/// Every built-in control endpoint, from the table the server routes with.
fn control_paths(paths: &mut Map<String, Value>) {
    let html_or = |schema: Value| {
        json!({
            "application/json": { "schema": schema },
            "text/html": { "schema": { "type": "string" } },
        })
    };
    for (path, tag, methods) in control_routes::endpoints() {
        // The trailing-slash spelling of an endpoint is the same operation.
        if path.ends_with('/') {
            continue;
        }
        let (summary, params, responses): (&str, Vec<Value>, Value) = match tag {
            Tag::OpenApi => (
                "This document",
                vec![],
                json!({ "200": response("The OpenAPI 3.1 document", json!({ "type": "object" })) }),
            ),
            Tag::Schema => (
                "Schemas of the resource kinds and of the enabled plugins",
                vec![],
                json!({ "200": response("The schemas", reference("SchemaDoc")) }),
            ),
            Tag::Healthchecks => (
                "Health of every checked upstream (HTML when the client accepts text/html)",
                vec![],
                json!({ "200": { "description": "One entry per checker", "content": html_or(json!({ "type": "array", "items": reference("HealthEntry") })) } }),
            ),
            Tag::HealthMissingId => (
                "Always 404: the id is missing",
                vec![path_param(
                    "src_type",
                    "routes, services, upstreams or stream_routes",
                    json!({ "type": "string" }),
                )],
                json!({ "404": error_response("`missing src id for src type <type>`") }),
            ),
            Tag::Healthcheck => (
                "Health of one resource's checker (HTML when the client accepts text/html)",
                vec![
                    path_param("src_type", "routes, services, upstreams or stream_routes", json!({ "type": "string" })),
                    path_param("src_id", "the resource's id", json!({ "type": "string" })),
                ],
                json!({
                    "200": { "description": "The checker's entry", "content": html_or(reference("HealthEntry")) },
                    "400": error_response("An unknown src_type"),
                    "404": error_response("No such resource, or it has no checker yet"),
                }),
            ),
            Tag::Gc => (
                "Return the allocator's free pages to the operating system",
                vec![],
                json!({
                    "200": response("Memory before and after", reference("GcReport")),
                    "500": error_response("The allocator refused"),
                }),
            ),
            Tag::Certificates => (
                "Every ssls entry: static or ACME, the names it serves, expiry, the ACME order state",
                vec![],
                json!({ "200": response("The entries", reference("Certificates")) }),
            ),
            Tag::CertificateRenew => (
                "Order an ACME entry's certificate now (the one in use stays until the new one is stored)",
                vec![path_param("id", "the ssls entry", json!({ "type": "string" }))],
                json!({
                    "202": response("The order starts", reference("RenewRequested")),
                    "404": error_response("No ssls entry with acme has this id"),
                }),
            ),
            Tag::ConfigStatus => (
                "The resource provider's state (yaml or etcd)",
                vec![],
                json!({ "200": response("The provider's state", reference("ConfigStatus")) }),
            ),
            Tag::PluginMetadatas => (
                "Every loaded plugin metadata object",
                vec![],
                json!({ "200": response("Metadata objects, in plugin order", json!({ "type": "array", "items": reference("plugin_metadata") })) }),
            ),
            Tag::PluginMetadata => (
                "One plugin's metadata",
                vec![path_param("plugin_name", "the plugin", json!({ "type": "string" }))],
                json!({
                    "200": response("The metadata object", reference("plugin_metadata")),
                    "404": error_response("No metadata for this plugin"),
                }),
            ),
            Tag::List(kind) => (
                "Every loaded resource of this kind (validated, defaults filled)",
                vec![],
                json!({ "200": response("The resources", json!({ "type": "array", "items": reference(kind.singular()) })) }),
            ),
            Tag::One(kind) => (
                "One loaded resource",
                vec![path_param("id", "the resource's id", json!({ "type": "string" }))],
                json!({
                    "200": response("The resource", reference(kind.singular())),
                    "404": error_response("No such resource"),
                }),
            ),
            Tag::PluginsReload => (
                "Re-read `plugins:` and `plugin_attr` from config.yaml",
                vec![],
                json!({
                    "200": response("The plugins now enabled", reference("Reloaded")),
                    "400": error_response("The new list was refused; nothing changed"),
                }),
            ),
            Tag::Explain => (
                "What the data plane would do with a request or a stream connection, and why",
                vec![],
                json!({
                    "200": response("The explanation", reference("Explanation")),
                    "400": error_response("A malformed body: what is wrong and where"),
                }),
            ),
            Tag::Dashboard => (
                "The dashboard: an HTML page (routes, upstreams, traffic, provider, explain form)",
                vec![],
                json!({ "200": { "description": "The page", "content": { "text/html": { "schema": { "type": "string" } } } } }),
            ),
            Tag::DashboardStats => (
                "The dashboard's live numbers: per-route request rate, error rate and latency",
                vec![],
                json!({ "200": response("The numbers", reference("DashboardStats")) }),
            ),
        };
        let mut item = Map::new();
        for m in methods {
            let body = (matches!(tag, Tag::Explain))
                .then(|| json!({ "required": true, "content": json_content(reference("ExplainRequest")) }));
            let mut op = json!({
                "tags": ["control"],
                "summary": summary,
                "operationId": format!("control_{}_{}", m.to_lowercase(), operation_name(path)),
                "parameters": params,
                "responses": responses,
            });
            if let Some(b) = body {
                op["requestBody"] = b;
            }
            item.insert(m.to_lowercase(), op);
        }
        paths.insert(path.to_owned(), Value::Object(item));
    }
}

fn operation_name(path: &str) -> String {
    path.trim_matches('/').replace(['/', '{', '}'], "_").replace("__", "_").trim_matches('_').to_owned()
}

/// The Admin API's operations, per kind, under `/weir/admin/`.
fn admin_paths(paths: &mut Map<String, Value>) {
    let id_param = path_param(
        "id",
        "the resource's id (a consumer's username)",
        json!({ "type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$" }),
    );
    let security = json!([{ "adminKey": [] }]);
    let common = |extra: Value| {
        let mut r = json!({
            "401": error_response("No X-API-KEY, or not one of deployment.admin.admin_key"),
            "403": error_response("A viewer key used to write, or a client outside allow_admin"),
            "503": error_response("etcd cannot be reached"),
        });
        if let (Value::Object(r), Value::Object(extra)) = (&mut r, extra) {
            r.extend(extra);
        }
        r
    };
    let body = |kind: &str, required: bool| {
        json!({
            "required": required,
            "description": format!("A {} object, as in resources.yaml (`create_time` and `update_time` are set by the server)", singular(kind)),
            "content": json_content(reference(singular(kind))),
        })
    };
    let write_errors = json!({
        "400": error_response("Invalid JSON, a schema or reference error (`key.path: reason`), or a write that would break another entry"),
        "409": error_response("Another Admin API write happened meanwhile: send it again"),
    });
    for kind in KINDS {
        let tag = json!([format!("admin: {kind}")]);
        let mut collection = Map::new();
        collection.insert(
            "get".into(),
            json!({
                "tags": tag, "security": security,
                "summary": format!("List {kind}"),
                "operationId": format!("admin_list_{kind}"),
                "parameters": [
                    { "name": "page", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1 } },
                    { "name": "page_size", "in": "query", "required": false, "schema": { "type": "integer", "minimum": 1 } },
                ],
                "responses": common(json!({ "200": response("The entries (one page with page_size)", reference("NodeList")) })),
            }),
        );
        let create = |method: &str, summary: String| {
            json!({
                "tags": tag, "security": security,
                "summary": summary,
                "operationId": format!("admin_{method}_{kind}"),
                "requestBody": body(kind, true),
                "responses": common(merge(json!({
                    "200": response("Replaced", reference("Stored")),
                    "201": response("Created", reference("Stored")),
                }), write_errors.clone())),
            })
        };
        if kind == "consumers" {
            collection
                .insert("put".into(), create("put", "Create or replace a consumer (username in the body)".into()));
        } else if kind == "credentials" {
            collection.insert("put".into(), create("put", "Create or replace a credential (id in the body)".into()));
        } else {
            collection.insert("post".into(), create("post", format!("Create one of {kind} with a generated id")));
        }
        paths.insert(format!("/weir/admin/{kind}"), Value::Object(collection));

        let mut one = Map::new();
        one.insert(
            "get".into(),
            json!({
                "tags": tag, "security": security,
                "summary": format!("One of {kind}"),
                "operationId": format!("admin_get_{kind}_id"),
                "parameters": [id_param],
                "responses": common(json!({
                    "200": response("The entry", reference("Node")),
                    "400": error_response("An invalid id"),
                    "404": response("No such key", reference("KeyNotFound")),
                })),
            }),
        );
        one.insert(
            "put".into(),
            json!({
                "tags": tag, "security": security,
                "summary": format!("Create or replace one of {kind}"),
                "operationId": format!("admin_put_{kind}_id"),
                "parameters": [id_param, {
                    "name": "If-Match", "in": "header", "required": false,
                    "description": "Apply only if the entry's modifiedIndex is still this (compare-and-swap)",
                    "schema": { "type": "string" },
                }],
                "requestBody": body(kind, true),
                "responses": common(merge(json!({
                    "200": response("Replaced", reference("Stored")),
                    "201": response("Created", reference("Stored")),
                    "412": error_response("If-Match named a revision that is no longer current"),
                }), write_errors.clone())),
            }),
        );
        one.insert(
            "patch".into(),
            json!({
                "tags": tag, "security": security,
                "summary": format!("Merge a JSON merge patch (RFC 7396) into one of {kind}"),
                "operationId": format!("admin_patch_{kind}_id"),
                "parameters": [id_param],
                "requestBody": { "required": true, "content": json_content(json!({ "type": "object" })) },
                "responses": common(merge(json!({
                    "200": response("The merged entry", reference("Stored")),
                    "404": response("No such key", reference("KeyNotFound")),
                }), write_errors.clone())),
            }),
        );
        one.insert(
            "delete".into(),
            json!({
                "tags": tag, "security": security,
                "summary": format!("Delete one of {kind}"),
                "operationId": format!("admin_delete_{kind}_id"),
                "parameters": [id_param],
                "responses": common(json!({
                    "200": response("Deleted", reference("Deleted")),
                    "400": error_response("An invalid id, or the entry is still in use (named)"),
                    "404": response("No such key", reference("KeyNotFound")),
                    "409": error_response("Another Admin API write happened meanwhile: send it again"),
                })),
            }),
        );
        paths.insert(format!("/weir/admin/{kind}/{{id}}"), Value::Object(one));
    }
    // Credentials live under their consumer (`/consumers/{username}/credentials/{id}`), without
    // POST and PATCH, as in APISIX.
    let username = path_param(
        "username",
        "the consumer's username",
        json!({ "type": "string", "pattern": "^[A-Za-z0-9_-]{1,100}$" }),
    );
    for (from, to, drop) in [
        ("/weir/admin/credentials", "/weir/admin/consumers/{username}/credentials", "post"),
        ("/weir/admin/credentials/{id}", "/weir/admin/consumers/{username}/credentials/{id}", "patch"),
    ] {
        let Some(Value::Object(mut ops)) = paths.remove(from) else { continue };
        ops.remove(drop);
        for op in ops.values_mut() {
            match op.get_mut("parameters") {
                Some(Value::Array(params)) => params.insert(0, username.clone()),
                _ => op["parameters"] = json!([username.clone()]),
            }
            // Every operation checks the username (and id) in the path.
            if let Some(Value::Object(responses)) = op.get_mut("responses") {
                responses.entry("400").or_insert_with(|| error_response("An invalid username or id"));
            }
        }
        paths.insert(to.to_owned(), Value::Object(ops));
    }
}

fn merge(mut a: Value, b: Value) -> Value {
    if let (Value::Object(a), Value::Object(b)) = (&mut a, b) {
        a.extend(b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reference_resolves_and_every_table_entry_is_documented() {
        let doc = document();
        let schemas = doc["components"]["schemas"].as_object().cloned().unwrap_or_default();
        let text = doc.to_string();
        for part in text.split("\"#/components/schemas/").skip(1) {
            let name = part.split('"').next().unwrap_or_default();
            assert!(schemas.contains_key(name), "dangling reference {name}");
        }
        for (path, _, methods) in control_routes::endpoints() {
            if path.ends_with('/') {
                continue;
            }
            for m in methods {
                assert!(doc["paths"][path][m.to_lowercase()].is_object(), "{m} {path} is not documented");
            }
        }
        for kind in KINDS.iter().filter(|k| **k != "credentials") {
            assert!(doc["paths"][format!("/weir/admin/{kind}/{{id}}")]["put"].is_object(), "{kind}");
        }
        assert!(doc["paths"]["/weir/admin/consumers/{username}/credentials/{id}"]["put"].is_object());
    }

    #[test]
    fn docs_copy_is_current() {
        let want = serde_json::to_string_pretty(&document()).unwrap_or_default() + "\n";
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
        let have = std::fs::read_to_string(path).unwrap_or_default();
        if have != want {
            if std::env::var_os("WEIR_WRITE_OPENAPI").is_some() {
                std::fs::write(path, &want).unwrap_or_else(|e| panic!("write {path}: {e}"));
            } else {
                panic!("docs/openapi.json is out of date: run WEIR_WRITE_OPENAPI=1 cargo test --lib openapi");
            }
        }
    }
}
