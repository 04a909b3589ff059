//! The `etcd` resource provider's reading side (`deployment.config_provider: etcd`).
//!
//! Resources live under `<deployment.prefix>/<kind>/<id>` (`/weir/routes/1`), each value one JSON
//! object of the same shape as a resources.yaml entry. Start-up reads every key in one range
//! read at a revision ([`initial_read`]); [`valid_document`] turns values into a document whose
//! invalid entries (written behind Weir's back) are named and left out. Watching from the next
//! revision and applying changes is `crate::watch::etcd`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::etcd::{Client, Options};
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::config::{EtcdSection, EtcdTls};
use crate::validate::Issue;

/// Resource kinds stored in etcd, as `<prefix>/<kind>/<id>` (the lists of resources.yaml).
pub const KINDS: [&str; 11] = [
    "routes",
    "services",
    "upstreams",
    "consumers",
    "consumer_groups",
    "credentials",
    "global_rules",
    "plugin_configs",
    "plugin_metadata",
    "ssls",
    "stream_routes",
];

/// What `GET /v1/config_status` reports.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProviderStatus {
    /// `yaml` or `etcd`.
    pub provider: &'static str,
    /// Whether the provider is connected (always true for yaml).
    pub connected: bool,
    /// The etcd revision of the last applied snapshot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The last error (connection, watch, or a skipped invalid value).
    pub last_error: Option<String>,
    /// Keys skipped as invalid in the snapshot in force.
    pub skipped: Vec<String>,
}

impl ProviderStatus {
    /// The status of a provider that is not connected yet.
    pub fn new(provider: &'static str) -> Self {
        ProviderStatus {
            provider,
            connected: provider == "yaml",
            revision: None,
            last_error: None,
            skipped: Vec::new(),
        }
    }
}

/// Every resource value by key, as read from etcd.
pub type Values = BTreeMap<String, Value>;

/// The kind (as its place in [`KINDS`]) and id of `key` under `prefix`, if it is a resource key.
/// Run for every key of every build, so with byte searches (`/` is ASCII) rather than `str`
/// patterns.
fn kind_at<'k>(prefix: &str, key: &'k str) -> Option<(usize, &'k str)> {
    let slash = |s: &str| s.bytes().position(|b| b == b'/');
    let rest = key.strip_prefix(prefix)?.strip_prefix('/')?;
    let cut = slash(rest)?;
    let (kind, id) = (&rest[..cut], &rest[cut + 1..]);
    if kind == "consumers" {
        if let Some((consumer, credential)) = id.split_once(CREDENTIALS) {
            let plain = |s: &str| !s.is_empty() && slash(s).is_none();
            let at = KINDS.iter().position(|k| *k == "credentials")?;
            return (plain(consumer) && plain(credential)).then_some((at, id));
        }
    }
    // Credentials live under their consumer only.
    let at = KINDS.iter().position(|k| *k == kind && *k != "credentials")?;
    (!id.is_empty() && slash(id).is_none()).then_some((at, id))
}

/// The id of `key` when it is a route's (`<prefix>/routes/<id>`).
pub fn route_id<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    kind_at(prefix, key).filter(|(at, _)| KINDS[*at] == "routes").map(|(_, id)| id)
}

/// What separates a consumer from its credential's id in a credential's key
/// (`<prefix>/consumers/jack/credentials/key-1`, as APISIX keeps them); a credential's id in
/// [`KINDS`] terms is `jack/credentials/key-1`.
pub const CREDENTIALS: &str = "/credentials/";

/// Parses a value: a JSON object, or why not.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("the value is not a JSON object".into()),
        Err(e) => Err(format!("the value is not JSON: {e}")),
    }
}

/// Keys left out of a snapshot, with the reason (an empty key: an issue naming no entry).
pub type Skipped = Vec<(String, String)>;

/// The key of each entry of each list of a document, in the list's order (borrowed from the
/// values the document was taken from: no copy of 10,000 keys per build).
pub type KeysByList<'v> = BTreeMap<&'static str, Vec<&'v str>>;

/// The identity field of a kind: `username` for consumers, `id` for the rest.
fn id_field(kind: &str) -> &'static str {
    if kind == "consumers" {
        "username"
    } else {
        "id"
    }
}

/// Gives `value` the id its key names (APISIX stores values without it, or with the same one),
/// without the Admin API's `create_time` / `update_time`. In place: doing it again is a no-op.
pub fn with_id(kind: &str, id: &str, value: &mut Value) -> Result<(), String> {
    let Value::Object(o) = value else { return Err("the value is not a JSON object".into()) };
    // Bookkeeping the Admin API (and APISIX) stores with every value, not part of the resource
    // (looked for among the few keys first: removing is a search per key, on every build).
    if o.keys().any(|k| k.ends_with("_time")) {
        o.remove("create_time");
        o.remove("update_time");
    }
    let field = id_field(kind);
    let credential = if kind == "credentials" { id.split_once(CREDENTIALS) } else { None };
    let id = match credential {
        Some((consumer, credential)) => {
            match o.get("consumer") {
                Some(Value::String(c)) if c != consumer => {
                    return Err(format!("`consumer` is `{c}` but the key names `{consumer}`"))
                }
                _ => o.insert("consumer".into(), Value::String(consumer.to_owned())),
            };
            credential
        }
        _ => id,
    };
    match o.get(field) {
        None => {
            o.insert(field.to_owned(), Value::String(id.to_owned()));
        }
        Some(Value::String(s)) if s == id => {}
        Some(Value::Number(n)) if n.to_string() == id => {}
        Some(other) => return Err(format!("`{field}` is {other} but the key names `{id}`")),
    }
    Ok(())
}

/// Moves the entries of `values` (except `left_out`) into the resource document
/// `{"routes": [...], ...}`, in key order, leaving `null` behind; [`give_back`] moves them back.
/// Moving instead of copying is what keeps a change to one of 10,000 routes cheap. Returns, per
/// list, the key of each entry (to name skipped entries), the list of each entry taken in key
/// order (for [`give_back`]), and entries whose id contradicts their key (left in place).
fn take_document<'v>(values: &'v mut Values, left_out: &HashSet<String>, prefix: &str) -> Taken<'v> {
    let mut lists: [Vec<Value>; KINDS.len()] = Default::default();
    let mut names: [Vec<&'v str>; KINDS.len()] = Default::default();
    let mut order = Vec::with_capacity(values.len());
    let mut wrong = Vec::new();
    let mut foreign = Vec::new();
    for (at, (key, value)) in values.iter_mut().enumerate() {
        // (Usually empty: no hashing of every key then.)
        if !left_out.is_empty() && left_out.contains(key) {
            continue;
        }
        let Some((list, id)) = kind_at(prefix, key) else {
            foreign.push(key.clone());
            continue;
        };
        match with_id(KINDS[list], id, value) {
            Ok(()) => {
                lists[list].push(std::mem::take(value));
                names[list].push(key.as_str());
                order.push((at as u32, list as u8));
            }
            Err(why) => wrong.push((key.clone(), why)),
        }
    }
    let keys: KeysByList<'v> =
        KINDS.iter().zip(names).filter(|(_, names)| !names.is_empty()).map(|(kind, names)| (*kind, names)).collect();
    let doc: Map<String, Value> = KINDS
        .iter()
        .zip(lists)
        .filter(|(_, items)| !items.is_empty())
        .map(|(kind, items)| ((*kind).to_owned(), Value::Array(items)))
        .collect();
    Taken { doc: Value::Object(doc), keys, order, wrong, foreign }
}

/// What [`take_document`] took.
struct Taken<'v> {
    doc: Value,
    keys: KeysByList<'v>,
    /// The place (in key order) and list ([`KINDS`] index) of each entry taken.
    order: Vec<(u32, u8)>,
    wrong: Vec<(String, String)>,
    /// Keys that are not resource keys (`<prefix>/<kind>/<id>`).
    foreign: Vec<String>,
}

/// Moves the entries of a document made by [`take_document`] back into `values`: the same walk
/// in the same (key) order, each entry to the place it was taken from, without a lookup.
fn give_back(values: &mut Values, doc: Value, order: &[(u32, u8)]) {
    let Value::Object(mut lists) = doc else { return };
    let mut items: [std::vec::IntoIter<Value>; KINDS.len()] = Default::default();
    for (i, kind) in KINDS.iter().enumerate() {
        if let Some(Value::Array(list)) = lists.remove(*kind) {
            items[i] = list.into_iter();
        }
    }
    let mut order = order.iter().peekable();
    for (at, slot) in values.values_mut().enumerate() {
        let Some(&&(place, list)) = order.peek() else { return };
        if place as usize != at {
            continue;
        }
        order.next();
        if let Some(item) = items.get_mut(usize::from(list)).and_then(Iterator::next) {
            *slot = item;
        }
    }
}

/// The list and index an issue is about (`routes[2] (id 7): uri: ...`).
fn located(issue: &Issue) -> Option<(&str, usize)> {
    let (list, rest) = issue.path.split_once('[')?;
    let (index, _) = rest.split_once(']')?;
    Some((list, index.parse().ok()?))
}

/// Builds the largest valid snapshot of `values`: entries the builder names in its issues are
/// dropped, and the rest is built again (a dropped upstream can take the routes that name it
/// along). Returns what `check` built (with a copy of the document that built, when
/// `want_document`), and the skipped keys with their reasons. `None` when an issue names no
/// single entry (two consumers sharing a credential, conflicting routes): then nothing valid can
/// be assembled and the caller keeps what it has (an unnamed issue has an empty key in the list).
/// `values` comes back as it went in, except that entries carry their ids (see [`with_id`]).
pub fn valid_document<T>(
    check: impl Fn(&Value, &KeysByList<'_>) -> Result<T, Vec<Issue>>,
    values: &mut Values,
    prefix: &str,
    want_document: bool,
) -> (Option<(Option<Value>, T)>, Skipped) {
    // Entries left out so far (instead of a copy of every value without them).
    let mut left_out: HashSet<String> = HashSet::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    for _ in 0..16 {
        let Taken { doc, keys, order, wrong, foreign } = take_document(values, &left_out, prefix);
        for key in foreign {
            // (Found on the first pass only: left out of the next ones.)
            skipped.push((key.clone(), "not a resource key (<prefix>/<kind>/<id>)".into()));
            left_out.insert(key);
        }
        for (key, why) in wrong {
            left_out.insert(key.clone());
            skipped.push((key, why));
        }
        let result = check(&doc, &keys);
        let copy = (want_document && result.is_ok()).then(|| doc.clone());
        // The keys the issues name, copied before the values they borrow from are given back.
        let named: Vec<Option<String>> = match &result {
            Ok(_) => Vec::new(),
            Err(issues) => issues
                .iter()
                .map(|issue| {
                    let (list, i) = located(issue)?;
                    let key = keys.iter().find(|(k, _)| **k == list).and_then(|(_, ks)| ks.get(i))?;
                    Some((*key).to_owned())
                })
                .collect(),
        };
        drop(keys);
        give_back(values, doc, &order);
        let issues = match result {
            Ok(built) => return (Some((copy, built)), skipped),
            Err(issues) => issues,
        };
        let mut dropped = false;
        for (key, issue) in named.into_iter().zip(&issues) {
            let Some(key) = key else { continue };
            if left_out.insert(key.clone()) {
                dropped = true;
            }
            skipped.push((key, issue.to_string()));
        }
        if !dropped {
            // Issues not tied to one entry (for example two routes conflicting): nothing to drop.
            for issue in issues {
                skipped.push((String::new(), issue.to_string()));
            }
            break;
        }
    }
    (None, skipped)
}

/// Connection options of `deployment.etcd`: timeouts, authentication, TLS. Certificate files
/// are read on every connection, so a renewed client certificate is used from the next one.
pub fn options(settings: &EtcdSection) -> Result<Options, String> {
    let timeout = Duration::from_secs_f64(settings.timeout.max(0.1));
    let user = match (&settings.user, &settings.password) {
        (Some(user), Some(password)) => Some((user.clone(), password.clone())),
        _ => None,
    };
    let tls = match settings.host.iter().any(|h| h.starts_with("https://")) {
        true => Some(tls_options(settings.tls.as_ref())?),
        false => None,
    };
    Ok(Options { timeout: Some(timeout), user, tls })
}

fn tls_options(tls: Option<&EtcdTls>) -> Result<ClientTlsConfig, String> {
    let read =
        |what: &str, path: &str| std::fs::read(path).map_err(|e| format!("deployment.etcd.tls.{what}: {path}: {e}"));
    let mut t = ClientTlsConfig::new();
    t = match tls.and_then(|t| t.ca.as_deref()) {
        Some(ca) => t.ca_certificate(Certificate::from_pem(read("ca", ca)?)),
        None => t.with_native_roots(),
    };
    if let Some(tls) = tls {
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            t = t.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
        }
        if let Some(sni) = &tls.sni {
            t = t.domain_name(sni.clone());
        }
    }
    Ok(t)
}

/// The endpoints of `deployment.etcd`.
pub fn endpoints(settings: &EtcdSection) -> Vec<String> {
    settings.host.iter().map(|h| h.trim_end_matches('/').to_owned()).collect()
}

/// A client of `deployment.etcd`.
pub async fn connect(settings: &EtcdSection) -> Result<Client, String> {
    Client::connect(&endpoints(settings), options(settings)?)
        .await
        .map_err(|e| format!("cannot connect to etcd {:?}: {e}", settings.host))
}

/// Connects and reads every resource under `prefix`: the values and the revision of the read.
pub async fn read_all(settings: &EtcdSection, prefix: &str) -> Result<(Client, Values, i64), String> {
    let mut client = connect(settings).await?;
    let resp =
        client.get(format!("{prefix}/"), true).await.map_err(|e| format!("etcd range read of {prefix}/: {e}"))?;
    let revision = resp.header.as_ref().map_or(0, |h| h.revision);
    let mut values = Values::new();
    for kv in &resp.kvs {
        let key = String::from_utf8_lossy(&kv.key).into_owned();
        match parse(&kv.value) {
            Ok(v) => {
                values.insert(key, v);
            }
            Err(e) => log::error!("etcd {key}: {e}; skipped"),
        }
    }
    Ok((client, values, revision))
}

/// The blocking start-up read (`Gateway::load`): values and revision, or why not.
pub fn initial_read(settings: &EtcdSection, prefix: &str) -> Result<(Values, i64), String> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    runtime.block_on(async { read_all(settings, prefix).await.map(|(_, v, r)| (v, r)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of<'k>(prefix: &str, key: &'k str) -> Option<(&'static str, &'k str)> {
        kind_at(prefix, key).map(|(at, id)| (KINDS[at], id))
    }

    #[test]
    fn keys_name_kind_and_id() {
        assert_eq!(kind_of("/weir", "/weir/routes/1"), Some(("routes", "1")));
        assert_eq!(kind_of("/weir", "/weir/plugin_metadata/key-auth"), Some(("plugin_metadata", "key-auth")));
        assert_eq!(kind_of("/weir", "/weir/routes/"), None);
        assert_eq!(kind_of("/weir", "/weir/routes/1/plugins"), None);
        assert_eq!(kind_of("/weir", "/weir/nope/1"), None);
        assert_eq!(kind_of("/weir", "/other/routes/1"), None);
        let key = "/weir/consumers/jack/credentials/k1";
        assert_eq!(kind_of("/weir", key), Some(("credentials", "jack/credentials/k1")));
        assert_eq!(kind_of("/weir", "/weir/consumers/jack/credentials/"), None);
        assert_eq!(kind_of("/weir", "/weir/credentials/k1"), None);
        let mut v = serde_json::json!({"id": "k1", "plugins": {}});
        assert_eq!(with_id("credentials", "jack/credentials/k1", &mut v), Ok(()));
        assert_eq!(v["consumer"], "jack");
    }

    #[test]
    fn a_document_is_taken_and_given_back_whole() {
        let mut values = Values::new();
        values.insert("/weir/routes/2".into(), serde_json::json!({"uri": "/b", "create_time": 1}));
        values.insert("/weir/routes/10".into(), serde_json::json!({"uri": "/a"}));
        values.insert("/weir/consumers/jack".into(), serde_json::json!({"plugins": {}}));
        values.insert("/weir/upstreams/u".into(), serde_json::json!({"id": "other"}));
        values.insert("/weir/upstreams/v".into(), serde_json::json!({"nodes": {}}));
        // Not an object: not taken, and no other entry may land in its place.
        values.insert("/weir/routes/11".into(), serde_json::Value::Null);
        let left_out: HashSet<String> = ["/weir/upstreams/v".to_owned()].into();
        let Taken { doc, keys, order, wrong, .. } = take_document(&mut values, &left_out, "/weir");
        assert_eq!(wrong.len(), 2, "the id contradicts the key; null is no object");
        assert_eq!(keys["routes"], ["/weir/routes/10", "/weir/routes/2"]);
        assert_eq!(doc["routes"][0], serde_json::json!({"id": "10", "uri": "/a"}));
        assert_eq!(doc["routes"][1], serde_json::json!({"id": "2", "uri": "/b"}));
        assert_eq!(doc["consumers"][0]["username"], "jack");
        assert!(doc.get("upstreams").is_none());
        give_back(&mut values, doc, &order);
        assert_eq!(values["/weir/routes/2"], serde_json::json!({"id": "2", "uri": "/b"}));
        assert_eq!(values["/weir/routes/10"], serde_json::json!({"id": "10", "uri": "/a"}));
        assert_eq!(values["/weir/consumers/jack"], serde_json::json!({"username": "jack", "plugins": {}}));
        assert_eq!(values["/weir/upstreams/u"], serde_json::json!({"id": "other"}));
        assert_eq!(values["/weir/upstreams/v"], serde_json::json!({"nodes": {}}));
        assert_eq!(values["/weir/routes/11"], serde_json::Value::Null);
    }

    #[test]
    fn an_entry_an_issue_names_is_skipped_by_its_key_and_the_rest_builds() {
        let mut values = Values::new();
        for (id, uri) in [("a", "/a"), ("b", "bad"), ("c", "/c")] {
            values.insert(format!("/weir/routes/{id}"), serde_json::json!({ "uri": uri }));
        }
        let check = |d: &Value, keys: &KeysByList<'_>| {
            let routes = d["routes"].as_array().map(Vec::as_slice).unwrap_or_default();
            assert_eq!(keys["routes"].len(), routes.len());
            let issues: Vec<Issue> = routes
                .iter()
                .enumerate()
                .filter(|(_, r)| r["uri"] == "bad")
                .map(|(i, _)| Issue::new("uri", "not a path").in_resource(&format!("routes[{i}]")))
                .collect();
            if issues.is_empty() {
                Ok(routes.len())
            } else {
                Err(issues)
            }
        };
        let (built, skipped) = valid_document(check, &mut values, "/weir", false);
        assert_eq!(built.map(|(_, n)| n), Some(2));
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        assert_eq!(skipped[0].0, "/weir/routes/b");
        assert_eq!(values.len(), 3);
        assert_eq!(values["/weir/routes/b"], serde_json::json!({"id": "b", "uri": "bad"}));
    }

    #[test]
    fn issues_point_at_entries() {
        let i = Issue::new("uri", "bad").in_resource("routes[3] (id 7)");
        assert_eq!(located(&i), Some(("routes", 3)));
        assert_eq!(located(&Issue::new("routes", "conflict")), None);
    }
}
