//! `proxy-rewrite`: rewrites the request sent upstream: URI (literal with `$variables`, or a
//! regex replacement), Host, method, and headers (add / set / remove).

use std::sync::Arc;

use regex::Regex;
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, Method};
use weir_plugin::template::Template;
use weir_plugin::{
    register_plugin, BuildContext, Flow, HeaderOps, Late, NamedHeaderOps, Plugin, PluginInstance, RequestCtx,
};

/// Methods `method` may set.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[allow(clippy::upper_case_acronyms)]
pub enum RewriteMethod {
    GET,
    POST,
    PUT,
    DELETE,
    PATCH,
    HEAD,
    OPTIONS,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// New upstream URI (path, optional `?query`); `$variables` are substituted.
    #[serde(default)]
    #[schemars(length(min = 1), regex(pattern = "^/"))]
    pub uri: Option<String>,
    /// `[pattern, replacement]`: regex replacement on the path (`$1` refers to groups).
    #[serde(default)]
    #[schemars(length(min = 2, max = 2))]
    pub regex_uri: Option<Vec<String>>,
    /// New Host header.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub host: Option<String>,
    /// New method.
    #[serde(default)]
    pub method: Option<RewriteMethod>,
    /// Header operations.
    #[serde(default)]
    pub headers: Option<HeaderOps>,
}

/// The plugin.
pub struct ProxyRewrite;

struct Instance {
    uri: Option<Template>,
    regex: Option<(Regex, String)>,
    host: Option<HeaderValue>,
    method: Option<Method>,
    remove: Vec<HeaderName>,
    set: Vec<(HeaderName, FieldValue)>,
    add: Vec<(HeaderName, FieldValue)>,
}

/// A header value to write: made once when it has no `$variable`, expanded per request
/// otherwise.
enum FieldValue {
    Fixed(HeaderValue),
    Template(Template),
}

impl FieldValue {
    fn new(name: &HeaderName, text: String) -> Result<Self, String> {
        let t = Template::compile(&text).map_err(|e| format!("headers: `{name}`: {e}"))?;
        if let Some(lit) = t.literal() {
            return HeaderValue::from_str(lit)
                .map(FieldValue::Fixed)
                .map_err(|_| format!("headers: invalid value of `{name}`"));
        }
        Ok(FieldValue::Template(t))
    }

    fn value(&self, ctx: &RequestCtx) -> Option<HeaderValue> {
        match self {
            FieldValue::Fixed(v) => Some(v.clone()),
            FieldValue::Template(t) => HeaderValue::from_str(&t.render(ctx)).ok(),
        }
    }
}

fn field_values(ops: Vec<(HeaderName, String)>) -> Result<Vec<(HeaderName, FieldValue)>, String> {
    ops.into_iter()
        .map(|(name, text)| {
            let value = FieldValue::new(&name, text)?;
            Ok((name, value))
        })
        .collect()
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        if let Some(uri) = &self.uri {
            let new = uri.render(ctx).into_owned();
            match new.split_once('?') {
                Some((p, q)) => {
                    ctx.path = p.to_owned();
                    ctx.query = q.to_owned();
                }
                None => ctx.path = new,
            }
        } else if let Some((re, rep)) = &self.regex {
            if re.is_match(&ctx.path) {
                ctx.path = re.replace(&ctx.path, rep.as_str()).into_owned();
            }
        }
        if let Some(m) = &self.method {
            ctx.method = m.clone();
        }
        if let Some(h) = &self.host {
            ctx.headers.insert(weir_plugin::http::header::HOST, h.clone());
        }
        for name in &self.remove {
            ctx.headers.remove(name);
        }
        for (name, v) in &self.set {
            if let Some(v) = v.value(ctx) {
                ctx.headers.insert(name.clone(), v);
            }
        }
        for (name, v) in &self.add {
            if let Some(v) = v.value(ctx) {
                ctx.headers.append(name.clone(), v);
            }
        }
        Flow::Continue
    }
}

impl Plugin for ProxyRewrite {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "proxy-rewrite"
    }
    fn priority(&self) -> i32 {
        1008
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        let regex = match &c.regex_uri {
            Some(pair) => {
                let re = Regex::new(&pair[0]).map_err(|e| format!("regex_uri: {e}"))?;
                Some((re, pair[1].clone()))
            }
            None => None,
        };
        let NamedHeaderOps { add, set, remove } = c.headers.unwrap_or_default().named()?;
        Ok(Arc::new(Instance {
            uri: c.uri.as_deref().map(Template::compile).transpose().map_err(|e| format!("uri: {e}"))?,
            regex,
            host: c.host.map(|h| HeaderValue::from_str(&h).map_err(|e| format!("host: {e}"))).transpose()?,
            method: c.method.map(|m| match m {
                RewriteMethod::GET => Method::GET,
                RewriteMethod::POST => Method::POST,
                RewriteMethod::PUT => Method::PUT,
                RewriteMethod::DELETE => Method::DELETE,
                RewriteMethod::PATCH => Method::PATCH,
                RewriteMethod::HEAD => Method::HEAD,
                RewriteMethod::OPTIONS => Method::OPTIONS,
            }),
            remove,
            set: field_values(set)?,
            add: field_values(add)?,
        }))
    }
}

register_plugin!(ProxyRewrite);
