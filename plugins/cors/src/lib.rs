//! `cors`: Cross-Origin Resource Sharing (APISIX 3.x fields and answers). Preflights are
//! answered by the plugin without contacting the upstream; every response to an allowed
//! origin gets the `Access-Control-*` headers; an origin that is not allowed gets none.
//!
//! Which origin is allowed is decided by [`origins`]; everything (lists, regexes, metadata
//! lists, header values) is compiled when the instance is built.

pub mod origins;

use std::collections::BTreeMap;
use std::sync::Arc;

use origins::{Allowed, OriginRule, Origins};
use regex::RegexSet;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use weir_plugin::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use weir_plugin::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx,
    ResponseHead,
};

/// APISIX's pattern of an origin list: `*`, `**`, `null`, or `scheme://host[:port]` items
/// separated by commas.
pub const ORIGINS_PATTERN: &str = r"^(\*|\*\*|null|\w+://[^,]+(,\w+://[^,]+)*)$";

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Allowed origins: `*` (any, without credentials), `**` (any, echoed, also with
    /// credentials), or `scheme://host[:port]` items separated by commas.
    #[serde(default = "star")]
    #[schemars(regex(pattern = r"^(\*|\*\*|null|\w+://[^,]+(,\w+://[^,]+)*)$"))]
    pub allow_origins: String,
    /// Allowed methods, comma-separated; `*`, or `**` for every method.
    #[serde(default = "star")]
    pub allow_methods: String,
    /// Allowed request headers, comma-separated; `*`, or `**` for those the preflight asks for.
    #[serde(default = "star")]
    pub allow_headers: String,
    /// Response headers the browser may read, comma-separated.
    #[serde(default)]
    pub expose_headers: Option<String>,
    /// Seconds a preflight answer may be cached (`-1`: not at all).
    #[serde(default = "five")]
    pub max_age: i64,
    /// Allow credentials (cookies, `Authorization`): no `*` anywhere then.
    #[serde(default)]
    pub allow_credential: bool,
    /// Regexes searched in the request's origin; when set, `allow_origins` is not used.
    #[serde(default)]
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096)))]
    pub allow_origins_by_regex: Option<Vec<String>>,
    /// Names of origin lists in the plugin metadata's `allow_origins`.
    #[serde(default)]
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096)))]
    pub allow_origins_by_metadata: Option<Vec<String>>,
    /// Origins that may read resource timing (`Timing-Allow-Origin`), as `allow_origins`.
    #[serde(default)]
    #[schemars(regex(pattern = r"^(\*|\*\*|null|\w+://[^,]+(,\w+://[^,]+)*)$"))]
    pub timing_allow_origins: Option<String>,
    /// Regexes for `Timing-Allow-Origin`; when set, `timing_allow_origins` is not used.
    #[serde(default)]
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096)))]
    pub timing_allow_origins_by_regex: Option<Vec<String>>,
}

fn star() -> String {
    "*".into()
}

fn five() -> i64 {
    5
}

/// The plugin metadata: named origin lists routes refer to with `allow_origins_by_metadata`.
#[derive(Debug, Default, Deserialize)]
pub struct Metadata {
    /// Name → origin list (as `allow_origins`).
    #[serde(default)]
    pub allow_origins: BTreeMap<String, String>,
}

/// What `allow_methods: "**"` answers.
const ALL_METHODS: &str = "GET,POST,PUT,DELETE,PATCH,HEAD,OPTIONS,CONNECT,TRACE";

/// The plugin.
pub struct Cors;

/// How `Access-Control-Allow-Headers` is answered.
enum AllowHeaders {
    Fixed(HeaderValue),
    /// `**`: what the request's `Access-Control-Request-Headers` asked for.
    Requested,
}

struct Instance {
    origins: OriginRule,
    timing: Option<OriginRule>,
    methods: HeaderValue,
    headers: AllowHeaders,
    expose: Option<HeaderValue>,
    max_age: HeaderValue,
    credentials: bool,
    vary: bool,
}

/// The request's `Origin` (and, for `allow_headers: "**"`, its
/// `Access-Control-Request-Headers`), kept from the rewrite phase: other plugins may change
/// the request headers, and the host may have moved them upstream by the header filter.
struct Seen {
    origin: HeaderValue,
    requested_headers: Option<HeaderValue>,
}

fn value(field: &str, text: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(text).map_err(|_| format!("{field}: `{text}` is not a valid header value"))
}

impl Instance {
    fn set_headers(&self, ctx: &RequestCtx, resp: &mut ResponseHead, origin: Option<&HeaderValue>) {
        if self.vary {
            add_vary_origin(&mut resp.headers);
        }
        let seen = ctx.slot::<Seen>();
        if let Some(allowed) = self.origins.allow(origin) {
            let h = &mut resp.headers;
            h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, answer(allowed));
            h.insert(ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone());
            h.insert(ACCESS_CONTROL_MAX_AGE, self.max_age.clone());
            if let Some(e) = &self.expose {
                h.insert(ACCESS_CONTROL_EXPOSE_HEADERS, e.clone());
            }
            match &self.headers {
                AllowHeaders::Fixed(v) => {
                    h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v.clone());
                }
                AllowHeaders::Requested => {
                    let asked = match seen {
                        Some(s) => s.requested_headers.clone(),
                        None => ctx.headers.get(ACCESS_CONTROL_REQUEST_HEADERS).cloned(),
                    };
                    match asked {
                        Some(v) => h.insert(ACCESS_CONTROL_ALLOW_HEADERS, v),
                        None => h.remove(ACCESS_CONTROL_ALLOW_HEADERS),
                    };
                }
            }
            if self.credentials {
                h.insert(ACCESS_CONTROL_ALLOW_CREDENTIALS, HeaderValue::from_static("true"));
            }
        }
        if let Some(allowed) = self.timing.as_ref().and_then(|t| t.allow(origin)) {
            resp.headers.insert(HeaderName::from_static("timing-allow-origin"), answer(allowed));
        }
    }
}

fn answer(allowed: Allowed<'_>) -> HeaderValue {
    match allowed {
        Allowed::Star => HeaderValue::from_static("*"),
        Allowed::Origin(o) => o.clone(),
    }
}

/// Adds `Origin` to `Vary` unless it (or `*`) is there already.
fn add_vary_origin(headers: &mut HeaderMap) {
    let present = headers.get_all(VARY).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|t| {
        let t = t.trim();
        t == "*" || t.eq_ignore_ascii_case("origin")
    });
    if !present {
        headers.append(VARY, HeaderValue::from_static("Origin"));
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::HEADER_FILTER
    }
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let Some(origin) = ctx.headers.get(ORIGIN).cloned() else { return Flow::Continue };
        let requested_headers = match self.headers {
            AllowHeaders::Requested => ctx.headers.get(ACCESS_CONTROL_REQUEST_HEADERS).cloned(),
            AllowHeaders::Fixed(_) => None,
        };
        let preflight = ctx.method == Method::OPTIONS && ctx.headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD);
        ctx.slots.insert(Seen { origin, requested_headers });
        if preflight {
            // Answered here; the header filter adds the CORS headers, as to any response.
            return Flow::Respond(PluginResponse {
                status: StatusCode::OK,
                headers: HeaderMap::new(),
                body: Bytes::new(),
            });
        }
        Flow::Continue
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        let ctx: &RequestCtx = ctx;
        // Without a slot, the rewrite phase saw no Origin or did not run (a plugin answered
        // first, so the request headers are still the client's).
        let origin = match ctx.slot::<Seen>() {
            Some(seen) => Some(&seen.origin),
            None => ctx.headers.get(ORIGIN),
        };
        self.set_headers(ctx, resp, origin);
        BodyFilter::Skip
    }
}

/// Compiles `*_by_regex`; a regex the `regex` crate refuses is named by its place.
fn regexes(field: &str, list: Option<&Vec<String>>) -> Result<Option<RegexSet>, String> {
    let Some(list) = list else { return Ok(None) };
    for (i, r) in list.iter().enumerate() {
        if list[..i].contains(r) {
            return Err(format!("{field}[{i}]: `{r}` is listed twice"));
        }
        regex::Regex::new(r).map_err(|e| format!("{field}[{i}]: invalid regex: {e}"))?;
    }
    RegexSet::new(list).map(Some).map_err(|e| format!("{field}: {e}"))
}

impl Plugin for Cors {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "cors"
    }
    fn priority(&self) -> i32 {
        4000
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(json!({
            "type": "object",
            "properties": {
                "allow_origins": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "pattern": ORIGINS_PATTERN},
                },
            },
        }))
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        if c.allow_credential {
            let stars = [
                ("allow_origins", Some(&c.allow_origins)),
                ("allow_methods", Some(&c.allow_methods)),
                ("allow_headers", Some(&c.allow_headers)),
                ("expose_headers", c.expose_headers.as_ref()),
                ("timing_allow_origins", c.timing_allow_origins.as_ref()),
            ];
            if let Some((field, _)) = stars.iter().find(|(_, v)| v.is_some_and(|v| v == "*")) {
                return Err(format!(
                    "{field}: you can not set '*' for other option when 'allow_credential' is true (use '**' to allow any)"
                ));
            }
        }
        let metadata = match &c.allow_origins_by_metadata {
            None => None,
            Some(names) => {
                let meta: Metadata = ctx.metadata_as()?.unwrap_or_default();
                // A name the metadata lacks allows nothing (the metadata may come later).
                Some(names.iter().filter_map(|n| meta.allow_origins.get(n)).map(|l| Origins::parse(l)).collect())
            }
        };
        let origins = OriginRule {
            list: Some(Origins::parse(&c.allow_origins)),
            regex: regexes("allow_origins_by_regex", c.allow_origins_by_regex.as_ref())?,
            metadata,
        };
        let timing_regex = regexes("timing_allow_origins_by_regex", c.timing_allow_origins_by_regex.as_ref())?;
        let timing = match (&c.timing_allow_origins, timing_regex) {
            (None, None) => None,
            (list, regex) => Some(OriginRule { list: list.as_deref().map(Origins::parse), regex, metadata: None }),
        };
        let vary = origins.depends_on_origin() || timing.as_ref().is_some_and(OriginRule::depends_on_origin);
        let methods = if c.allow_methods == "**" { ALL_METHODS } else { c.allow_methods.as_str() };
        Ok(Arc::new(Instance {
            origins,
            timing,
            methods: value("allow_methods", methods)?,
            headers: match c.allow_headers.as_str() {
                "**" => AllowHeaders::Requested,
                h => AllowHeaders::Fixed(value("allow_headers", h)?),
            },
            expose: match c.expose_headers.as_deref() {
                None | Some("") => None,
                Some(e) => Some(value("expose_headers", e)?),
            },
            max_age: HeaderValue::from(c.max_age),
            credentials: c.allow_credential,
            vary,
        }))
    }
}

register_plugin!(Cors);

#[cfg(test)]
mod tests;
