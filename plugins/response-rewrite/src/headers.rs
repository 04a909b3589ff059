//! Response header operations in every shape APISIX 3.x accepts, compiled once: `add` as a
//! list of `"Name: value"` lines (or, as Weir had it, an object), `set` as an object of
//! strings or numbers, `remove` as a list, or the older flat object (every key set). Values may
//! hold `$variables` (`$balancer_ip:$balancer_port`), rendered per response; values without one
//! are made into header values at load. Applied in APISIX's order: add, set, remove.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderMap, HeaderName, HeaderValue};
use weir_plugin::template::{Piece, Template};
use weir_plugin::RequestCtx;

/// A header value as configured: text or a number.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Scalar {
    /// Text (may hold `$variables`).
    Text(String),
    /// A number, written as JSON writes it.
    Number(serde_json::Number),
}

impl Scalar {
    fn text(&self) -> String {
        match self {
            Scalar::Text(t) => t.clone(),
            Scalar::Number(n) => n.to_string(),
        }
    }
}

/// `headers.add`: APISIX's `"Name: value"` lines, or an object.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum AddConf {
    /// `["X-Server: 1", ...]`.
    Lines(#[schemars(length(min = 1))] Vec<String>),
    /// `{"X-Server": "1"}`.
    Map(BTreeMap<String, Scalar>),
}

/// `headers` with operations.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderOpsConf {
    /// Appended (values already there are kept).
    #[serde(default)]
    pub add: Option<AddConf>,
    /// Replaced.
    #[serde(default)]
    pub set: Option<BTreeMap<String, Scalar>>,
    /// Removed.
    #[serde(default)]
    pub remove: Option<Vec<String>>,
}

/// `headers`: operations, or the older flat object whose every key is set.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HeadersConf {
    /// `{add, set, remove}`.
    Ops(HeaderOpsConf),
    /// `{"X-Server": "1"}`: set.
    Flat(BTreeMap<String, Scalar>),
}

/// A header value to write: made at load when it has no variable.
enum FieldValue {
    Fixed(HeaderValue),
    Template(Template),
}

impl FieldValue {
    fn new(at: &str, text: &str) -> Result<Self, String> {
        let t = Template::compile(text).map_err(|e| format!("{at}: {e}"))?;
        match t.literal() {
            Some(lit) => HeaderValue::from_str(lit)
                .map(FieldValue::Fixed)
                .map_err(|_| format!("{at}: `{lit}` is not a valid header value")),
            None => Ok(FieldValue::Template(t)),
        }
    }

    fn value(&self, ctx: &RequestCtx) -> Option<HeaderValue> {
        match self {
            FieldValue::Fixed(v) => Some(v.clone()),
            FieldValue::Template(t) => HeaderValue::from_str(&t.render(ctx)).ok(),
        }
    }

    fn reads_request_headers(&self) -> bool {
        match self {
            FieldValue::Fixed(_) => false,
            FieldValue::Template(t) => t.pieces().iter().any(|p| match p {
                Piece::Var(name) => reads_request_headers(name),
                Piece::Text(_) => false,
            }),
        }
    }
}

/// Whether variable `name` is read from the request headers.
pub fn reads_request_headers(name: &str) -> bool {
    name == "host" || name.starts_with("http_") || name.starts_with("cookie_")
}

/// Compiled operations.
#[derive(Default)]
pub struct HeaderOps {
    add: Vec<(HeaderName, FieldValue)>,
    set: Vec<(HeaderName, FieldValue)>,
    remove: Vec<HeaderName>,
}

fn name(at: &str, text: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(text.trim().as_bytes()).map_err(|_| format!("{at}: `{text}` is not a header name"))
}

fn pairs(field: &str, map: &BTreeMap<String, Scalar>) -> Result<Vec<(HeaderName, FieldValue)>, String> {
    map.iter()
        .map(|(k, v)| {
            let at = format!("{field}.{k}");
            Ok((name(&at, k)?, FieldValue::new(&at, &v.text())?))
        })
        .collect()
}

impl HeaderOps {
    /// Compiles `conf`; a bad name, value or variable is refused with its place.
    pub fn compile(conf: &HeadersConf) -> Result<HeaderOps, String> {
        match conf {
            HeadersConf::Flat(map) => Ok(HeaderOps { set: pairs("headers", map)?, ..HeaderOps::default() }),
            HeadersConf::Ops(ops) => {
                let add = match &ops.add {
                    None => Vec::new(),
                    Some(AddConf::Map(map)) => pairs("headers.add", map)?,
                    Some(AddConf::Lines(lines)) => lines
                        .iter()
                        .enumerate()
                        .map(|(i, line)| {
                            let at = format!("headers.add[{i}]");
                            let (n, v) =
                                line.split_once(':').ok_or_else(|| format!("{at}: `{line}` is not `Name: value`"))?;
                            Ok((name(&at, n)?, FieldValue::new(&at, v.trim())?))
                        })
                        .collect::<Result<_, String>>()?,
                };
                let set = match &ops.set {
                    Some(map) => pairs("headers.set", map)?,
                    None => Vec::new(),
                };
                let remove = ops
                    .remove
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, n)| name(&format!("headers.remove[{i}]"), n))
                    .collect::<Result<_, String>>()?;
                Ok(HeaderOps { add, set, remove })
            }
        }
    }

    /// Whether a value reads request headers (`$http_x`, `$host`): they must be kept for the
    /// header filter.
    pub fn reads_request_headers(&self) -> bool {
        self.add.iter().chain(&self.set).any(|(_, v)| v.reads_request_headers())
    }

    /// Applies the operations to a response's headers (a value that renders to something that
    /// cannot be a header value is skipped).
    pub fn apply(&self, ctx: &RequestCtx, headers: &mut HeaderMap) {
        for (n, v) in &self.add {
            if let Some(v) = v.value(ctx) {
                headers.append(n.clone(), v);
            }
        }
        for (n, v) in &self.set {
            if let Some(v) = v.value(ctx) {
                headers.insert(n.clone(), v);
            }
        }
        for n in &self.remove {
            headers.remove(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::TestRequest;

    fn ops(v: serde_json::Value) -> Result<HeaderOps, String> {
        let conf: HeadersConf = serde_json::from_value(v).map_err(|e| e.to_string())?;
        HeaderOps::compile(&conf)
    }

    #[test]
    fn every_apisix_shape() {
        let mut ctx = TestRequest::get("/").header("x-in", "v").build();
        ctx.upstream_addrs.push("10.0.0.7:8080".parse().unwrap_or_else(|e| panic!("{e}")));
        let o = ops(json!({
            "add": ["X-Added: a", "Set-Cookie: k=v; Max-Age=10"],
            "set": {"X-Server-id": 3, "X-Server-status": "on", "X-Server-balancer-addr": "$balancer_ip:$balancer_port", "X-In": "$http_x_in"},
            "remove": ["server"]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(o.reads_request_headers());
        let mut h = HeaderMap::new();
        h.insert("server", HeaderValue::from_static("upstream"));
        h.insert("x-added", HeaderValue::from_static("upstream"));
        o.apply(&ctx, &mut h);
        assert!(h.get("server").is_none());
        assert_eq!(h.get_all("x-added").iter().count(), 2);
        assert_eq!(h.get("x-server-id").map(|v| v.as_bytes()), Some(&b"3"[..]));
        assert_eq!(h.get("x-server-balancer-addr").map(|v| v.as_bytes()), Some(&b"10.0.0.7:8080"[..]));
        assert_eq!(h.get("x-in").map(|v| v.as_bytes()), Some(&b"v"[..]));
        assert_eq!(h.get("set-cookie").map(|v| v.as_bytes()), Some(&b"k=v; Max-Age=10"[..]));

        let flat = ops(json!({"X-Server": "weir", "X-Count": 1.5})).unwrap_or_else(|e| panic!("{e}"));
        assert!(!flat.reads_request_headers());
        let mut h = HeaderMap::new();
        flat.apply(&ctx, &mut h);
        assert_eq!(h.get("x-count").map(|v| v.as_bytes()), Some(&b"1.5"[..]));
        let weir_map = ops(json!({"add": {"x-extra": "1"}})).unwrap_or_else(|e| panic!("{e}"));
        let mut h = HeaderMap::new();
        weir_map.apply(&ctx, &mut h);
        assert!(h.get("x-extra").is_some(), "Weir's earlier `add` object still works");
    }

    #[test]
    fn bad_headers_are_refused_with_their_place() {
        let e = |v| ops(v).err().unwrap_or_default();
        assert_eq!(e(json!({"add": ["no colon"]})), "headers.add[0]: `no colon` is not `Name: value`");
        assert!(e(json!({"set": {"bad name": "x"}})).starts_with("headers.set.bad name:"));
        assert!(e(json!({"set": {"x": "$nope"}})).contains("unknown variable `$nope`"));
        assert!(e(json!({"set": {"x": "a\u{7f}b"}})).contains("not a valid header value"));
        assert!(e(json!({"remove": ["a b"]})).starts_with("headers.remove[0]:"));
    }
}
