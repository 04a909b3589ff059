//! The Admin API (`deployment.admin`, with the etcd provider): APISIX v3's resource API over
//! etcd, under `/weir/admin/<kind>[/<id>]` and the same paths under `/apisix/admin/` so that
//! APISIX tooling works unchanged.
//!
//! Every write is validated by the same snapshot builder as the file and etcd (400 with the
//! same `key.path: reason` wording) before it reaches etcd, and is a compare-and-swap on the
//! key's revision: with `If-Match: <modifiedIndex>` the write applies only to that revision
//! (412 otherwise), and PATCH always applies to the revision it read. Instances see the write
//! through their etcd watch, this one included.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::etcd::{Client, Compare, RequestOp, TxnRequest};
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::{json, Map, Value};
use weir_plugin::cidr::Cidr;

use crate::config::{AdminRole, AdminSection, EtcdSection};
use crate::control::typed_response;
use crate::openapi::bodies::{self as body, Deleted, ErrorBody, KeyNotFound, Node, NodeList};
use crate::resources::etcd::{route_id, valid_document, with_id, KeysByList, Values, CREDENTIALS, KINDS};
use crate::state::{Followed, Gateway};
use crate::tables::snapshot::{Prints, RouteChange};

/// Largest request body.
const MAX_BODY: usize = 4 << 20;

struct Admin {
    /// One etcd client for every request (its channel reconnects by itself).
    client: tokio::sync::OnceCell<Client>,
    gateway: Arc<Gateway>,
    settings: AdminSection,
    allow: Vec<Cidr>,
    etcd: EtcdSection,
    prefix: String,
}

/// Binds the Admin API (the caller runs it).
pub fn server(
    gateway: Arc<Gateway>,
    settings: AdminSection,
    etcd: EtcdSection,
    prefix: String,
) -> std::io::Result<actix_web::dev::Server> {
    let addr = SocketAddr::new(settings.admin_listen.ip, settings.admin_listen.port);
    let allow = settings.allow_admin.iter().filter_map(|c| Cidr::parse(c).ok()).collect();
    let data = web::Data::new(Admin { client: tokio::sync::OnceCell::new(), gateway, settings, allow, etcd, prefix });
    Ok(HttpServer::new(move || {
        App::new().app_data(data.clone()).app_data(web::PayloadConfig::new(MAX_BODY)).default_service(web::to(dispatch))
    })
    .workers(1)
    .disable_signals()
    .listen(crate::handover::tcp(addr)?)?
    .run())
}

fn error(status: StatusCode, msg: impl Into<String>) -> HttpResponse {
    typed_response(status, &ErrorBody { error_msg: msg.into() })
}

/// 405 with the `Allow` field RFC 9110 requires: the methods `allow` names.
fn not_allowed(method: &str, path: &str, allow: &'static str) -> HttpResponse {
    let mut resp =
        error(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed on {path} (allowed: {allow})"));
    resp.headers_mut().insert(actix_web::http::header::ALLOW, actix_web::http::header::HeaderValue::from_static(allow));
    resp
}

fn not_found() -> HttpResponse {
    typed_response(StatusCode::NOT_FOUND, &KeyNotFound { message: "Key not found".into() })
}

/// `(kind, id, sub-path)` of an Admin API path.
fn parse_path(path: &str) -> Option<(&'static str, Option<&str>, Vec<&str>)> {
    let rest = path.strip_prefix("/weir/admin/").or_else(|| path.strip_prefix("/apisix/admin/"))?;
    let mut parts = rest.trim_end_matches('/').split('/');
    let kind = parts.next()?;
    let kind = KINDS.iter().copied().find(|k| *k == kind)?;
    let id = parts.next().filter(|s| !s.is_empty());
    Some((kind, id, parts.collect()))
}

/// Compares keys in time that does not depend on where they differ.
fn same_key(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Private keys and credentials, hidden from viewer keys.
fn redact(kind: &str, value: &mut Value) {
    let Value::Object(o) = value else { return };
    match kind {
        "ssls" => {
            for field in ["key", "keys"] {
                if let Some(v) = o.get_mut(field) {
                    *v = match v {
                        Value::Array(a) => Value::Array(a.iter().map(|_| json!("******")).collect()),
                        _ => json!("******"),
                    };
                }
            }
        }
        "consumers" | "credentials" => {
            if let Some(Value::Object(plugins)) = o.get_mut("plugins") {
                for conf in plugins.values_mut() {
                    if let Value::Object(c) = conf {
                        for v in c.values_mut() {
                            if v.is_string() {
                                *v = json!("******");
                            }
                        }
                    }
                }
            }
        }
        _ => {}
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

async fn dispatch(req: HttpRequest, body: web::Bytes, admin: web::Data<Admin>) -> HttpResponse {
    // Who may ask: the client address, then the key and its role.
    let peer = req.peer_addr().map(|a| a.ip());
    if !peer.is_some_and(|ip: IpAddr| admin.allow.iter().any(|c| c.contains(ip))) {
        return error(StatusCode::FORBIDDEN, "Forbidden: this client address is not in deployment.admin.allow_admin");
    }
    let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
    let Some(role) = key.and_then(|k| admin.settings.admin_key.iter().find(|a| same_key(&a.key, k))).map(|a| a.role)
    else {
        return error(StatusCode::UNAUTHORIZED, "failed to check token: send a valid X-API-KEY");
    };
    let method = req.method().as_str().to_owned();
    if role == AdminRole::Viewer && method != "GET" {
        return error(StatusCode::FORBIDDEN, "this key's role is viewer: it may only read");
    }
    let rest = req.path().strip_prefix("/apisix/admin/").or_else(|| req.path().strip_prefix("/weir/admin/"));
    if rest.map(|r| r.trim_end_matches('/')) == Some("plugins/reload") {
        if method != "PUT" {
            return not_allowed(&method, req.path(), "PUT");
        }
        let gateway = admin.gateway.clone();
        return match actix_web::rt::task::spawn_blocking(move || gateway.reload_plugins()).await {
            Ok(Ok(names)) => typed_response(StatusCode::OK, &json!({ "message": "done", "plugins": names })),
            Ok(Err(e)) => error(StatusCode::BAD_REQUEST, e),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        };
    }
    if let Some(kind) = rest.and_then(|r| r.strip_prefix("schema/validate/")) {
        let Some(kind) = KINDS.iter().copied().find(|k| *k == kind.trim_end_matches('/')) else {
            return error(StatusCode::NOT_FOUND, format!("unknown resource kind in {}", req.path()));
        };
        if method != "POST" {
            return not_allowed(&method, req.path(), "POST");
        }
        let mut client = match admin.client.get_or_try_init(|| connect(&admin.etcd)).await {
            Ok(c) => c.clone(),
            Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
        };
        return validate_only(&mut client, &admin, kind, &body)
            .await
            .unwrap_or_else(|e| error(StatusCode::SERVICE_UNAVAILABLE, format!("etcd: {e}")));
    }
    let Some((kind, id, sub)) = parse_path(req.path()) else {
        return error(StatusCode::NOT_FOUND, "not found: paths are /weir/admin/<kind>[/<id>] (or /apisix/admin/...)");
    };
    if id.is_some_and(|i| !valid_id(i)) {
        return error(StatusCode::BAD_REQUEST, "invalid id: 1-64 of [a-zA-Z0-9-_.]");
    }
    let mut client = match admin.client.get_or_try_init(|| connect(&admin.etcd)).await {
        Ok(c) => c.clone(),
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, e),
    };
    let if_match = req.headers().get("if-match").and_then(|v| v.to_str().ok()).map(|v| v.trim_matches('"').to_owned());
    let query = req.query_string().to_owned();
    // A consumer's credentials: `/consumers/<username>/credentials[/<id>]`.
    if let (Some(username), ["credentials", rest @ ..]) = (id.filter(|_| kind == "consumers"), sub.as_slice()) {
        let result = match (method.as_str(), rest) {
            ("GET", []) => {
                list(&mut client, &admin, "credentials", &format!("{username}{CREDENTIALS}"), &query, role).await
            }
            (_, [cid]) if !valid_id(cid) => Ok(error(StatusCode::BAD_REQUEST, "invalid id: 1-64 of [a-zA-Z0-9-_.]")),
            ("GET", [cid]) => {
                get(&mut client, &admin, "credentials", &format!("{username}{CREDENTIALS}{cid}"), role).await
            }
            ("PUT", [cid]) => {
                let id = format!("{username}{CREDENTIALS}{cid}");
                put(&mut client, &admin, "credentials", Some(&id), &body, if_match, false).await
            }
            // The id in the body, as APISIX's plugin documentation writes it.
            ("PUT", []) => {
                let cid = match parse_body(&body).as_ref().and_then(|v| v.get("id")) {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Number(n)) => n.to_string(),
                    _ => String::new(),
                };
                if valid_id(&cid) {
                    let id = format!("{username}{CREDENTIALS}{cid}");
                    put(&mut client, &admin, "credentials", Some(&id), &body, if_match, false).await
                } else {
                    Ok(error(StatusCode::BAD_REQUEST, "`id` is required in the body (or in the path)"))
                }
            }
            ("DELETE", [cid]) => {
                delete(&mut client, &admin, "credentials", &format!("{username}{CREDENTIALS}{cid}")).await
            }
            (_, []) => Ok(not_allowed(&method, req.path(), "GET, PUT")),
            _ => Ok(not_allowed(&method, req.path(), "GET, PUT, DELETE")),
        };
        return result.unwrap_or_else(|e| error(StatusCode::SERVICE_UNAVAILABLE, format!("etcd: {e}")));
    }
    if kind == "credentials" {
        return error(
            StatusCode::NOT_FOUND,
            "not found: credentials are at /apisix/admin/consumers/<username>/credentials/<id>",
        );
    }
    let result = match (method.as_str(), id) {
        ("GET", None) => list(&mut client, &admin, kind, "", &query, role).await,
        ("GET" | "DELETE", Some(_)) if !sub.is_empty() => {
            Ok(error(StatusCode::NOT_FOUND, "not found: a sub-path (/routes/1/plugins) is for PATCH only"))
        }
        ("GET", Some(id)) => get(&mut client, &admin, kind, id, role).await,
        ("PUT", Some(id)) if sub.is_empty() => put(&mut client, &admin, kind, Some(id), &body, if_match, false).await,
        // With the id (a consumer's username) in the body, as APISIX takes it.
        ("PUT", None) => put(&mut client, &admin, kind, None, &body, if_match, false).await,
        ("POST", None) if kind != "consumers" => put(&mut client, &admin, kind, None, &body, None, true).await,
        ("PATCH", Some(id)) => patch(&mut client, &admin, kind, id, &sub, &body).await,
        ("DELETE", Some(id)) => delete(&mut client, &admin, kind, id).await,
        _ => Ok(not_allowed(
            &method,
            req.path(),
            match id {
                Some(_) if !sub.is_empty() => "PATCH",
                Some(_) => "GET, PUT, PATCH, DELETE",
                None if kind == "consumers" => "GET, PUT",
                None => "GET, PUT, POST",
            },
        )),
    };
    result.unwrap_or_else(|e| error(StatusCode::SERVICE_UNAVAILABLE, format!("etcd: {e}")))
}

async fn connect(etcd: &EtcdSection) -> Result<Client, String> {
    crate::resources::etcd::connect(etcd).await
}

fn key_of(admin: &Admin, kind: &str, id: &str) -> String {
    match kind {
        // `jack/credentials/key-1`: under the consumer, as APISIX keeps them.
        "credentials" => format!("{}/consumers/{id}", admin.prefix),
        _ => format!("{}/{kind}/{id}", admin.prefix),
    }
}

/// The id a value carries in its identity field: a credential's own id, not its consumer's.
fn own_id(kind: &str, id: &str) -> String {
    match id.split_once(CREDENTIALS) {
        Some((_, credential)) if kind == "credentials" => credential.to_owned(),
        _ => id.to_owned(),
    }
}

/// One stored node as APISIX reports it.
fn node(key: &str, value: Value, created: i64, modified: i64) -> Node {
    Node { key: key.to_owned(), value, created_index: created, modified_index: modified }
}

async fn list(
    client: &mut Client,
    admin: &Admin,
    kind: &str,
    within: &str,
    query: &str,
    role: AdminRole,
) -> Result<HttpResponse, String> {
    // `within`: a consumer's credentials (`jack/credentials/`).
    let prefix = key_of(admin, kind, within);
    let resp = client.get(prefix.clone(), true).await.map_err(|e| e.to_string())?;
    let mut items: Vec<Node> = resp
        .kvs
        .iter()
        // Only this kind's entries: a consumer's credentials are not consumers.
        .filter(|kv| !String::from_utf8_lossy(&kv.key).get(prefix.len()..).is_some_and(|rest| rest.contains('/')))
        .filter_map(|kv| {
            let mut value: Value = serde_json::from_slice(&kv.value).ok()?;
            if role == AdminRole::Viewer {
                redact(kind, &mut value);
            }
            Some(node(&String::from_utf8_lossy(&kv.key), value, kv.create_revision, kv.mod_revision))
        })
        .collect();
    let total = items.len();
    let arg = |name: &str| weir_plugin::query_arg(query, name).and_then(|v| v.parse::<usize>().ok());
    if let Some(size) = arg("page_size").filter(|s| *s > 0) {
        let page = arg("page").unwrap_or(1).max(1);
        items = items.into_iter().skip((page - 1).saturating_mul(size)).take(size).collect();
    }
    Ok(typed_response(StatusCode::OK, &NodeList { total, list: items }))
}

async fn get(
    client: &mut Client,
    admin: &Admin,
    kind: &str,
    id: &str,
    role: AdminRole,
) -> Result<HttpResponse, String> {
    let key = key_of(admin, kind, id);
    let resp = client.get(key.clone(), false).await.map_err(|e| e.to_string())?;
    let Some(kv) = resp.kvs.first() else { return Ok(not_found()) };
    let mut value: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
    if role == AdminRole::Viewer {
        redact(kind, &mut value);
    }
    Ok(typed_response(StatusCode::OK, &node(&key, value, kv.create_revision, kv.mod_revision)))
}

/// The key every Admin API write bumps (outside `<prefix>/`, so the watchers never see it): a
/// write applies only if no other Admin API write happened since it read the set it validated
/// against.
fn marker(admin: &Admin) -> String {
    format!("{}_admin_revision", admin.prefix)
}

/// Every resource value under the prefix (for validation with the whole set), and the marker's
/// revision read before it.
async fn all_values(client: &mut Client, admin: &Admin) -> Result<(Values, i64), String> {
    let (mark, _) = marks(client, admin).await?;
    Ok((values_now(client, admin).await?, mark))
}

/// How long a write waits for the etcd watcher to have seen the Admin API's last write before
/// it reads the whole set itself instead.
const CATCH_UP: std::time::Duration = std::time::Duration::from_millis(250);

/// The revision of the last Admin API write ([`marker`]), and the store's revision as it was
/// read.
async fn marks(client: &mut Client, admin: &Admin) -> Result<(i64, i64), String> {
    let mark = client.get(marker(admin), false).await.map_err(|e| e.to_string())?;
    let now = mark.header.as_ref().map_or(i64::MAX, |h| h.revision);
    Ok((mark.kvs.first().map_or(0, |kv| kv.mod_revision), now))
}

/// Why writing `new` at `key` must be refused ([`refusal`]). Judged against the set the etcd
/// watcher follows (no read of the whole set: 10,000 values are tens of milliseconds to read and
/// parse) when it has folded in every Admin API write up to `mark`, and no key under the prefix
/// was written or deleted behind the Admin API's back since (none written after its revision,
/// as many keys as it holds); else against the set read now.
async fn refusal_of_write(
    client: &mut Client,
    admin: &Admin,
    (mark, now): (i64, i64),
    key: &str,
    new: Value,
) -> Result<Option<String>, String> {
    // The watcher applies each write a few milliseconds after it is stored: a write right after
    // another waits for that rather than reading the whole set. (0: no watch in progress.)
    let at = {
        let mut seen = admin.gateway.followed_revision.subscribe();
        // (The value read is copied out: its guard must not outlive this block.)
        let waited = tokio::time::timeout(CATCH_UP, seen.wait_for(|r| *r >= mark || *r == 0)).await;
        let revision = waited.ok().and_then(Result::ok).map(|r| *r);
        revision.filter(|r| *r >= mark)
    };
    // Keys written since (and the number of keys now, which tells a deletion): none when the
    // store is at the watcher's revision, the common case with an etcd of Weir's own.
    let since = match at {
        Some(at) if at >= now => Some((0, None)),
        Some(at) => {
            let (written, count) = client.written_since(format!("{}/", admin.prefix), at).await?;
            Some((written, Some(count)))
        }
        None => None,
    };
    if let (Some(at), Some((0, count))) = (at, since) {
        let judged = admin.gateway.with_followed(Some(CATCH_UP), |followed| {
            let current = |f: &&mut Followed| f.revision >= at && count.is_none_or(|n| n == f.values.len() as i64);
            let f = followed.as_mut().filter(current)?;
            if patch_builds(admin, f, key, &new) {
                return Some(None);
            }
            Some(judge(admin, &mut f.values, Some(&mut f.prints), key, new.clone()))
        });
        if let Some(Some(why)) = judged {
            return Ok(why);
        }
    }
    let mut values = values_now(client, admin).await?;
    Ok(judge(admin, &mut values, None, key, new))
}

/// Whether a write of route `key` builds as a patch of the snapshot serving, when that is
/// the one built from exactly the followed values (`Followed::clean`): then nothing else can
/// break (no resource names a route), and the write is accepted without building the whole
/// set. `false` says nothing: the write is then judged in full ([`judge`]), which names what
/// is wrong.
fn patch_builds(admin: &Admin, f: &Followed, key: &str, new: &Value) -> bool {
    let Some(id) = route_id(&admin.prefix, key) else { return false };
    let mut value = new.clone();
    if f.clean.is_none() || with_id("routes", id, &mut value).is_err() {
        return false;
    }
    // The snapshot and the enabled set as one plugin reload left them (the watcher's order of
    // locks: the followed set, then this).
    let _held = admin.gateway.hold_reloads();
    if f.clean != Some(admin.gateway.generation()) {
        return false;
    }
    admin.gateway.patch_routes(&[RouteChange { id, value: Some(&value) }], true).is_some()
}

/// [`refusal`] of `key` becoming `new` in `values`, which are left as they were.
fn judge(admin: &Admin, values: &mut Values, mut prints: Option<&mut Prints>, key: &str, new: Value) -> Option<String> {
    let mut old = Some(values.insert(key.to_owned(), new));
    if let Some(p) = prints.as_deref_mut() {
        p.forget(key);
    }
    let why = refusal(admin, values, prints.as_deref_mut(), key, |v| {
        if let Some(o) = old.take() {
            restore(v, key, o);
        }
    });
    if let Some(o) = old.take() {
        restore(values, key, o);
    }
    if let Some(p) = prints {
        p.forget(key);
    }
    why
}

/// Every resource value under the prefix, read now.
async fn values_now(client: &mut Client, admin: &Admin) -> Result<Values, String> {
    let resp = client.get(format!("{}/", admin.prefix), true).await.map_err(|e| e.to_string())?;
    let values = resp
        .kvs
        .iter()
        // As the watcher takes them: JSON objects only.
        .filter_map(|kv| {
            let v = crate::resources::etcd::parse(&kv.value).ok()?;
            Some((String::from_utf8_lossy(&kv.key).into_owned(), v))
        })
        .collect();
    Ok(values)
}

/// Why the write of `key` (which made `after`) must be refused: the key itself would be left out
/// of the snapshot, the set could not be built at all, or another entry that builds today would
/// be left out (a write may not break what others wrote). `undo` turns `after` back into the
/// set before the write, in place, when that set must be built too (not in the common case: no
/// copy of 10,000 values per write).
fn refusal(
    admin: &Admin,
    after: &mut Values,
    prints: Option<&mut Prints>,
    key: &str,
    undo: impl FnOnce(&mut Values),
) -> Option<String> {
    let prints = std::cell::RefCell::new(prints);
    let check = |d: &Value, keys: &KeysByList<'_>| {
        let known = prints.borrow_mut().as_deref_mut().map(|p| p.of_document(d, keys));
        admin.gateway.check_resources(d, known.as_ref())
    };
    let (doc, skipped_after) = valid_document(check, after, &admin.prefix, false);
    let own: Vec<&str> = skipped_after.iter().filter(|(k, _)| k == key).map(|(_, why)| why.as_str()).collect();
    if !own.is_empty() {
        return Some(own.join("; "));
    }
    if doc.is_some() && skipped_after.is_empty() {
        // The whole set builds with the write: nothing to compare with (the common case, one
        // build instead of two).
        return None;
    }
    undo(after);
    if let Some(p) = prints.borrow_mut().as_deref_mut() {
        p.forget(key);
    }
    let (_, skipped_before) = valid_document(check, after, &admin.prefix, false);
    let broken: Vec<String> = skipped_after
        .iter()
        // An entry by its key (its place in the list, which the messages name, moves when a
        // write adds a key before it); an issue naming no entry by its message.
        .filter(|(k, why)| match k.is_empty() {
            true => !skipped_before.iter().any(|(kb, wb)| kb.is_empty() && wb == why),
            false => !skipped_before.iter().any(|(kb, _)| kb == k),
        })
        .map(|(k, why)| if k.is_empty() { why.clone() } else { format!("{k} would become invalid: {why}") })
        .collect();
    if doc.is_none() || !broken.is_empty() {
        return Some(broken.join("; "));
    }
    None
}

/// Puts `key` back as it was (`old`: its value before the write, if it had one).
fn restore(values: &mut Values, key: &str, old: Option<Value>) {
    match old {
        Some(v) => {
            values.insert(key.to_owned(), v);
        }
        None => {
            values.remove(key);
        }
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// PUT (with `id`, or a consumer's username in the body) and POST (`generate`).
async fn put(
    client: &mut Client,
    admin: &Admin,
    kind: &str,
    id: Option<&str>,
    body: &[u8],
    if_match: Option<String>,
    generate: bool,
) -> Result<HttpResponse, String> {
    let Some(Value::Object(mut value)) = parse_body(body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid request body: a JSON object is required"));
    };
    let field = if kind == "consumers" { "username" } else { "id" };
    if kind == "credentials" {
        // Implied by the path (and added back when the set is read).
        value.remove("consumer");
    }
    let id: String = match (id, generate) {
        (Some(id), _) => id.to_owned(),
        (None, true) => format!("{:020}", chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default().unsigned_abs()),
        (None, false) => match value.get(field) {
            Some(Value::String(u)) if valid_id(u) => u.to_owned(),
            Some(Value::Number(n)) if valid_id(&n.to_string()) => n.to_string(),
            _ => return Ok(error(StatusCode::BAD_REQUEST, format!("`{field}` is required in the body"))),
        },
    };
    let own = own_id(kind, &id);
    match value.get(field) {
        Some(Value::String(s)) if *s != own => {
            return Ok(error(StatusCode::BAD_REQUEST, format!("wrong {field}: the body says `{s}`, the path `{own}`")))
        }
        Some(Value::Number(n)) if n.to_string() != own => {
            return Ok(error(StatusCode::BAD_REQUEST, format!("wrong {field}: the body says `{n}`, the path `{own}`")))
        }
        _ => {}
    }
    value.insert(field.to_owned(), Value::String(own));
    let key = key_of(admin, kind, &id);
    let marks = marks(client, admin).await?;
    let existing = client.get(key.clone(), false).await.map_err(|e| e.to_string())?;
    let current = existing.kvs.first().map(|kv| (kv.mod_revision, serde_json::from_slice::<Value>(&kv.value).ok()));
    let created_at = current
        .as_ref()
        .and_then(|(_, v)| v.as_ref())
        .and_then(|v| v.get("create_time"))
        .and_then(Value::as_i64)
        .unwrap_or_else(now);
    value.insert("create_time".into(), json!(created_at));
    value.insert("update_time".into(), json!(now()));
    let value = Value::Object(value);
    if let Some(why) = refusal_of_write(client, admin, marks, &key, value.clone()).await? {
        return Ok(error(StatusCode::BAD_REQUEST, why));
    }
    let expected = match if_match {
        Some(tag) => match tag.parse::<i64>() {
            Ok(rev) => Some(rev),
            Err(_) => return Ok(error(StatusCode::BAD_REQUEST, "If-Match must be a modifiedIndex")),
        },
        None => None,
    };
    let created = current.is_none();
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(match store(client, admin, &key, Some(&value), expected, marks.0).await? {
        Stored::Yes => typed_response(status, &body::Stored { key, value }),
        Stored::Stale => conflict(),
        Stored::Raced => raced(),
    })
}

/// A JSON request body, also when it has raw control characters (newlines, tabs) inside
/// strings, which APISIX's parser takes and strict JSON does not: they are escaped and the body
/// parsed again.
fn parse_body(body: &[u8]) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice(body) {
        return Some(v);
    }
    let mut fixed = Vec::with_capacity(body.len() + 16);
    let (mut in_string, mut escaped) = (false, false);
    for &b in body {
        match b {
            _ if escaped => escaped = false,
            b'\\' if in_string => escaped = true,
            b'"' => in_string = !in_string,
            b'\n' | b'\r' | b'\t' if in_string => {
                fixed.extend_from_slice(match b {
                    b'\n' => b"\\n",
                    b'\r' => b"\\r",
                    _ => b"\\t",
                });
                continue;
            }
            _ => {}
        }
        fixed.push(b);
    }
    serde_json::from_slice(&fixed).ok()
}

/// `POST /apisix/admin/schema/validate/<kind>`: whether the body is a valid resource of `kind`
/// together with the resources stored now (references checked); nothing is stored.
async fn validate_only(client: &mut Client, admin: &Admin, kind: &str, body: &[u8]) -> Result<HttpResponse, String> {
    let Some(Value::Object(mut value)) = parse_body(body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid request body: a JSON object is required"));
    };
    let field = if kind == "consumers" { "username" } else { "id" };
    let id = match value.get(field) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "weir-validate".to_owned(),
    };
    value.insert(field.to_owned(), Value::String(id.clone()));
    let key = key_of(admin, kind, &id);
    let marks = marks(client, admin).await?;
    Ok(match refusal_of_write(client, admin, marks, &key, Value::Object(value)).await? {
        Some(why) => error(StatusCode::BAD_REQUEST, why),
        None => typed_response(StatusCode::OK, &json!({ "message": "valid" })),
    })
}

fn conflict() -> HttpResponse {
    error(StatusCode::PRECONDITION_FAILED, "the resource changed since the revision given (If-Match): read it again")
}

fn raced() -> HttpResponse {
    error(StatusCode::CONFLICT, "another Admin API write changed the resources meanwhile: send the request again")
}

/// What a conditional write did.
enum Stored {
    Yes,
    /// The key is not at the `If-Match` revision.
    Stale,
    /// Another Admin API write happened since the set was read.
    Raced,
}

/// Writes `value` at `key` (deletes it for `None`), only if no Admin API write happened since
/// `mark` and, with `expected`, only if the key is still at that revision.
async fn store(
    client: &mut Client,
    admin: &Admin,
    key: &str,
    value: Option<&Value>,
    expected: Option<i64>,
    mark: i64,
) -> Result<Stored, String> {
    store_with(client, admin, key, value, expected, mark, None).await
}

/// [`store`], with one more operation in the same transaction.
async fn store_with(
    client: &mut Client,
    admin: &Admin,
    key: &str,
    value: Option<&Value>,
    expected: Option<i64>,
    mark: i64,
    also: Option<RequestOp>,
) -> Result<Stored, String> {
    let m = marker(admin);
    let mut compare = vec![Compare::mod_revision_is(m.clone(), mark)];
    if let Some(rev) = expected {
        compare.push(Compare::mod_revision_is(key, rev));
    }
    let op = match value {
        Some(v) => RequestOp::put(key, v.to_string()),
        None => RequestOp::delete(key, false),
    };
    let mut success = vec![op, RequestOp::put(m, "")];
    success.extend(also);
    let txn = TxnRequest { compare, success, failure: Vec::new() };
    let resp = client.txn(txn).await?;
    if resp.succeeded {
        return Ok(Stored::Yes);
    }
    let now = client.get(key, false).await.map_err(|e| e.to_string())?;
    let rev = now.kvs.first().map_or(0, |kv| kv.mod_revision);
    Ok(if expected.is_some_and(|e| e != rev) { Stored::Stale } else { Stored::Raced })
}

/// RFC 7396 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

async fn patch(
    client: &mut Client,
    admin: &Admin,
    kind: &str,
    id: &str,
    sub: &[&str],
    body: &[u8],
) -> Result<HttpResponse, String> {
    let Some(patch) = parse_body(body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid request body: JSON is required"));
    };
    let key = key_of(admin, kind, id);
    let resp = client.get(key.clone(), false).await.map_err(|e| e.to_string())?;
    let Some(kv) = resp.kvs.first() else { return Ok(not_found()) };
    let revision = kv.mod_revision;
    let mut value: Value = serde_json::from_slice(&kv.value).unwrap_or_else(|_| json!({}));
    // A sub-path (`/routes/1/plugins`) patches that member only.
    let mut at = &mut value;
    for part in sub {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(o) = at else { break };
        at = o.entry((*part).to_owned()).or_insert_with(|| json!({}));
    }
    merge(at, &patch);
    if !value.is_object() {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid request body: the patched value must be a JSON object"));
    }
    if let Value::Object(o) = &mut value {
        o.insert("update_time".into(), json!(now()));
    }
    let marks = marks(client, admin).await?;
    if let Some(why) = refusal_of_write(client, admin, marks, &key, value.clone()).await? {
        return Ok(error(StatusCode::BAD_REQUEST, why));
    }
    // Always against the revision read: a concurrent change is never overwritten.
    Ok(match store(client, admin, &key, Some(&value), Some(revision), marks.0).await? {
        Stored::Yes => typed_response(StatusCode::OK, &body::Stored { key, value }),
        Stored::Stale => conflict(),
        Stored::Raced => raced(),
    })
}

/// Which resources name `kind`/`id` (an upstream or service still in use cannot be deleted).
fn users(values: &Values, admin: &Admin, kind: &str, id: &str) -> Vec<String> {
    let field = match kind {
        "upstreams" => "upstream_id",
        "services" => "service_id",
        "consumer_groups" => "group_id",
        "plugin_configs" => "plugin_config_id",
        _ => return Vec::new(),
    };
    let mut found = Vec::new();
    for (key, v) in values {
        let named = match v.get(field) {
            Some(Value::String(s)) => s == id,
            Some(Value::Number(n)) => n.to_string() == id,
            _ => false,
        };
        if named {
            found.push(key.strip_prefix(&admin.prefix).unwrap_or(key).trim_start_matches('/').to_owned());
        }
    }
    found
}

async fn delete(client: &mut Client, admin: &Admin, kind: &str, id: &str) -> Result<HttpResponse, String> {
    let key = key_of(admin, kind, id);
    let (values, mark) = all_values(client, admin).await?;
    if !values.contains_key(&key) {
        return Ok(not_found());
    }
    let in_use = users(&values, admin, kind, id);
    let what = kind.trim_end_matches('s');
    if !in_use.is_empty() {
        return Ok(error(
            StatusCode::BAD_REQUEST,
            format!("can not delete this {what}, {} still using it now", in_use.join(", ")),
        ));
    }
    // Nor may a deletion leave another entry invalid: a plugin naming this upstream by id
    // (traffic-split's `upstream_id`, as APISIX checks) or anything else the set needs.
    let mut after = values;
    let mut removed: Vec<(String, Value)> = after.remove_entry(&key).into_iter().collect();
    if kind == "consumers" {
        // Its credentials go with it (below).
        let credentials = format!("{key}{CREDENTIALS}");
        let theirs: Vec<String> = after
            .range(credentials.clone()..)
            .map(|(k, _)| k)
            .take_while(|k| k.starts_with(&credentials))
            .cloned()
            .collect();
        removed.extend(theirs.into_iter().filter_map(|k| after.remove_entry(&k)));
    }
    if let Some(why) = refusal(admin, &mut after, None, &key, |v| v.extend(removed)) {
        return Ok(error(StatusCode::BAD_REQUEST, format!("can not delete this {what}: {why}")));
    }
    // A consumer goes with its credentials.
    let also = (kind == "consumers").then(|| RequestOp::delete(format!("{key}{CREDENTIALS}"), true));
    Ok(match store_with(client, admin, &key, None, None, mark, also).await? {
        Stored::Yes => typed_response(StatusCode::OK, &Deleted { key, deleted: "1".into() }),
        Stored::Stale | Stored::Raced => raced(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_kind_id_and_sub_path() {
        assert_eq!(parse_path("/weir/admin/routes"), Some(("routes", None, vec![])));
        assert_eq!(parse_path("/apisix/admin/routes/1"), Some(("routes", Some("1"), vec![])));
        assert_eq!(parse_path("/apisix/admin/routes/1/plugins"), Some(("routes", Some("1"), vec!["plugins"])));
        assert_eq!(parse_path("/apisix/admin/nope/1"), None);
        assert_eq!(parse_path("/v1/routes"), None);
    }

    #[test]
    fn merge_patch() {
        let mut v = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge(&mut v, &json!({"b": {"c": null, "e": 4}, "f": [1]}));
        assert_eq!(v, json!({"a": 1, "b": {"d": 3, "e": 4}, "f": [1]}));
    }
}
