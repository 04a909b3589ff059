//! `response-rewrite`: rewrites what the client receives: status, body, headers (add / set /
//! remove). Applies to upstream responses and to responses produced by other plugins.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, HeaderOps, Late, Plugin, PluginInstance, RequestCtx, ResponseHead,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// New status code.
    #[serde(default)]
    #[schemars(range(min = 200, max = 598))]
    pub status_code: Option<u16>,
    /// New body (replaces the whole body).
    #[serde(default)]
    pub body: Option<String>,
    /// Header operations.
    #[serde(default)]
    pub headers: Option<HeaderOps>,
}

/// The plugin.
pub struct ResponseRewrite;

struct Instance {
    status: Option<StatusCode>,
    body: Option<Bytes>,
    add: Vec<(HeaderName, HeaderValue)>,
    set: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

/// Response header values are fixed: parse them once, at build time.
fn values(pairs: Vec<(HeaderName, String)>) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    pairs
        .into_iter()
        .map(|(n, v)| HeaderValue::from_str(&v).map(|v| (n.clone(), v)).map_err(|e| format!("header `{n}`: {e}")))
        .collect()
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::HEADER_FILTER
    }
    fn header_filter(&self, _ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        if let Some(s) = self.status {
            resp.status = s;
        }
        for n in &self.remove {
            resp.headers.remove(n);
        }
        for (n, v) in &self.set {
            resp.headers.insert(n.clone(), v.clone());
        }
        for (n, v) in &self.add {
            resp.headers.append(n.clone(), v.clone());
        }
        if self.body.is_some() {
            resp.headers.remove(weir_plugin::http::header::CONTENT_LENGTH);
            resp.headers.remove(weir_plugin::http::header::CONTENT_ENCODING);
            return BodyFilter::Filter;
        }
        BodyFilter::Skip
    }
    fn body_filter(&self, _ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        if let Some(body) = &self.body {
            *chunk = if eof { body.clone() } else { Bytes::new() };
        }
    }
}

impl Plugin for ResponseRewrite {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "response-rewrite"
    }
    fn priority(&self) -> i32 {
        899
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c = conf;
        let ops = c.headers.unwrap_or_default().named()?;
        Ok(Arc::new(Instance {
            status: c.status_code.map(|s| StatusCode::from_u16(s).map_err(|e| e.to_string())).transpose()?,
            body: c.body.map(Bytes::from),
            add: values(ops.add)?,
            set: values(ops.set)?,
            remove: ops.remove,
        }))
    }
}

register_plugin!(ResponseRewrite);
