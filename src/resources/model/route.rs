//! Routes (which requests, which plugins, where to proxy) and services (an upstream and plugins
//! shared by several routes); a route is read and written in its APISIX document shape and kept
//! in memory in a smaller one.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use super::{one, Id, PluginConfs, Timeout, Upstream};

/// HTTP methods a route can match. The declaration order is the bit order of the router's method
/// mask: append new methods at the end.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
pub enum HttpMethod {
    GET,
    POST,
    PUT,
    DELETE,
    PATCH,
    HEAD,
    OPTIONS,
    CONNECT,
    TRACE,
    PURGE,
}

// The document shape of a route (file, etcd, Admin API, `/v1/schema`); kept in memory as
// [`Route`]. Its doc comment below is the schema's description.
/// A route: which requests it matches, the plugins it runs, where it proxies.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Route")]
struct RouteDoc {
    /// Identity.
    id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    desc: Option<String>,
    /// Path to match: exact, trailing `*` for a prefix, `:name` or `{name}` segments as parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096), regex(pattern = "^/"))]
    uri: Option<String>,
    /// Several paths (any matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096), regex(pattern = "^/")))]
    uris: Option<Vec<String>>,
    /// Methods to match (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    methods: Option<Vec<HttpMethod>>,
    /// Host to match: exact, or `*.example.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\*?[0-9a-zA-Z-._\[\]:]+$"))]
    host: Option<String>,
    /// Several hosts (any matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(regex(pattern = r"^\*?[0-9a-zA-Z-._\[\]:]+$")))]
    hosts: Option<Vec<String>>,
    /// Client addresses to match: IPs or CIDRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    remote_addrs: Option<Vec<String>>,
    /// Conditions on request variables, in APISIX's expression language (lua-resty-expr):
    /// `[["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]]`, or a logical operator first:
    /// `["OR", [...], [...]]`. Compiled when the configuration loads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "vars_schema")]
    vars: Option<serde_json::Value>,
    /// APISIX's Lua filter function: refused (Weir runs no Lua; use `vars`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    filter_func: Option<String>,
    /// Higher wins among routes matching one request.
    #[serde(default)]
    priority: i64,
    /// Upstream timeouts of this route, in seconds (overrides the upstream's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout: Option<Timeout>,
    /// Plugins of this route.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    plugins: PluginConfs,
    /// Reference to a plugin config (its plugins are merged under the route's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plugin_config_id: Option<Id>,
    /// Inline upstream (boxed: most routes name an upstream by id, and an inline `Upstream`
    /// is several hundred bytes that every route would otherwise carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    upstream_id: Option<Id>,
    /// Reference to a service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service_id: Option<Id>,
    /// 1 enabled, 0 disabled.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1))]
    status: u8,
    /// Proxy `Upgrade: websocket` requests (HTTP/1.1); without it the upgrade is not performed
    /// and the request is proxied as plain HTTP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    enable_websocket: bool,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
}

/// A route as kept in memory: what requests and the router read are fields; what most routes
/// leave out (names, labels, lists) sits behind one pointer, so that 10,000 routes cost 192
/// bytes each here rather than 384. Reads and writes the `RouteDoc` shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(from = "RouteDoc", into = "RouteDoc")]
pub struct Route {
    /// Identity.
    pub id: Id,
    /// Path to match (or `more.uris`).
    pub uri: Option<String>,
    /// Higher wins among routes matching one request.
    pub priority: i64,
    /// Plugins of this route.
    pub plugins: PluginConfs,
    /// Inline upstream.
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    pub upstream_id: Option<Id>,
    /// Reference to a service.
    pub service_id: Option<Id>,
    /// 1 enabled, 0 disabled.
    pub status: u8,
    /// Proxy `Upgrade: websocket` requests.
    pub enable_websocket: bool,
    /// The rarely set fields (`None` when all are absent).
    pub more: Option<Box<RouteMore>>,
}

/// The fields of a [`Route`] most routes leave out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RouteMore {
    pub name: Option<String>,
    pub desc: Option<String>,
    pub uris: Option<Vec<String>>,
    pub methods: Option<Vec<HttpMethod>>,
    pub host: Option<String>,
    pub hosts: Option<Vec<String>>,
    pub remote_addrs: Option<Vec<String>>,
    pub vars: Option<serde_json::Value>,
    pub filter_func: Option<String>,
    pub timeout: Option<Timeout>,
    pub plugin_config_id: Option<Id>,
    pub labels: BTreeMap<String, String>,
}

/// `vars`: a list (an expression), checked further when it is compiled.
fn vars_schema(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({ "type": "array" })
}

impl Route {
    /// The paths it matches: `uris` when present, else `uri`.
    pub fn uri_list(&self) -> &[String] {
        match (self.uris(), &self.uri) {
            (Some(list), _) => list,
            (None, Some(one)) => std::slice::from_ref(one),
            (None, None) => &[],
        }
    }
    /// Several paths (any matches).
    pub fn uris(&self) -> Option<&[String]> {
        self.more.as_ref()?.uris.as_deref()
    }
    /// Methods to match (all when absent).
    pub fn methods(&self) -> Option<&[HttpMethod]> {
        self.more.as_ref()?.methods.as_deref()
    }
    /// One host to match.
    pub fn host(&self) -> Option<&String> {
        self.more.as_ref()?.host.as_ref()
    }
    /// Several hosts (any matches).
    pub fn hosts(&self) -> Option<&[String]> {
        self.more.as_ref()?.hosts.as_deref()
    }
    /// Client addresses to match.
    pub fn remote_addrs(&self) -> Option<&[String]> {
        self.more.as_ref()?.remote_addrs.as_deref()
    }
    /// Conditions on request variables (uncompiled).
    pub fn vars(&self) -> Option<&serde_json::Value> {
        self.more.as_ref()?.vars.as_ref()
    }
    /// APISIX's Lua filter function (refused by the checks).
    pub fn filter_func(&self) -> Option<&str> {
        self.more.as_ref()?.filter_func.as_deref()
    }
    /// Upstream timeouts of this route.
    pub fn timeout(&self) -> Option<&Timeout> {
        self.more.as_ref()?.timeout.as_ref()
    }
    /// The plugin config whose plugins this route runs (under its own).
    pub fn plugin_config_id(&self) -> Option<&Id> {
        self.more.as_ref()?.plugin_config_id.as_ref()
    }
}

impl From<RouteDoc> for Route {
    fn from(d: RouteDoc) -> Route {
        let more = RouteMore {
            name: d.name,
            desc: d.desc,
            uris: d.uris,
            methods: d.methods,
            host: d.host,
            hosts: d.hosts,
            remote_addrs: d.remote_addrs,
            vars: d.vars,
            filter_func: d.filter_func,
            timeout: d.timeout,
            plugin_config_id: d.plugin_config_id,
            labels: d.labels,
        };
        Route {
            id: d.id,
            uri: d.uri,
            priority: d.priority,
            plugins: d.plugins,
            upstream: d.upstream,
            upstream_id: d.upstream_id,
            service_id: d.service_id,
            status: d.status,
            enable_websocket: d.enable_websocket,
            more: (more != RouteMore::default()).then(|| Box::new(more)),
        }
    }
}

impl From<Route> for RouteDoc {
    fn from(r: Route) -> RouteDoc {
        let more = r.more.map(|m| *m).unwrap_or_default();
        RouteDoc {
            id: r.id,
            name: more.name,
            desc: more.desc,
            uri: r.uri,
            uris: more.uris,
            methods: more.methods,
            host: more.host,
            hosts: more.hosts,
            remote_addrs: more.remote_addrs,
            vars: more.vars,
            filter_func: more.filter_func,
            priority: r.priority,
            timeout: more.timeout,
            plugins: r.plugins,
            plugin_config_id: more.plugin_config_id,
            upstream: r.upstream,
            upstream_id: r.upstream_id,
            service_id: r.service_id,
            status: r.status,
            enable_websocket: r.enable_websocket,
            labels: more.labels,
        }
    }
}

impl JsonSchema for Route {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        RouteDoc::schema_name()
    }
    fn schema_id() -> std::borrow::Cow<'static, str> {
        RouteDoc::schema_id()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        RouteDoc::json_schema(g)
    }
}

/// A service: an upstream and plugins shared by several routes.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Identity.
    pub id: Id,
    /// Human-readable name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub name: Option<String>,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub desc: Option<String>,
    /// Plugins shared by the service's routes (a route's own conf of the same plugin wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: PluginConfs,
    /// Inline upstream (boxed: most routes name an upstream by id, and an inline `Upstream`
    /// is several hundred bytes that every route would otherwise carry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Box<Upstream>>,
    /// Reference to an upstream object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_id: Option<Id>,
    /// Hosts the service's routes match when they name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub hosts: Option<Vec<String>>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// WebSocket handshakes on the service's routes are tunnelled (as a route's own flag).
    #[serde(default)]
    pub enable_websocket: bool,
}

#[cfg(test)]
mod tests {
    use super::Route;
    use serde_json::json;

    #[test]
    fn a_route_reads_and_writes_its_document_shape() {
        let full = json!({
            "id": "r1", "name": "n", "desc": "d", "uris": ["/a", "/b/*"], "methods": ["GET", "POST"],
            "hosts": ["*.example.com"], "remote_addrs": ["10.0.0.0/8"], "priority": 3,
            "plugins": {"key-auth": {}}, "upstream_id": "u", "service_id": "s", "status": 0,
            "enable_websocket": true, "labels": {"team": "edge"}
        });
        let r: Route = serde_json::from_value(full.clone()).expect("full route");
        assert!(r.more.is_some());
        assert_eq!(r.uri_list(), ["/a", "/b/*"]);
        assert_eq!(serde_json::to_value(&r).expect("serialize"), full);

        let bare = json!({"id": "7", "uri": "/x", "upstream_id": "1"});
        let r: Route = serde_json::from_value(bare).expect("bare route");
        assert!(r.more.is_none(), "nothing rare set: no box");
        assert_eq!(r.uri_list(), ["/x"]);
        assert_eq!(
            serde_json::to_value(&r).expect("serialize"),
            json!({"id": "7", "uri": "/x", "upstream_id": "1", "priority": 0, "status": 1})
        );

        let e = serde_json::from_value::<Route>(json!({"id": 1, "uri": "/", "nope": 1})).expect_err("unknown key");
        assert!(e.to_string().contains("unknown field `nope`"), "{e}");
    }
}
