//! `response-rewrite`: rewrites what the client receives (APISIX 3.x fields): status, headers,
//! and the body, replaced whole (`body`, `body_base64`) or substituted by regexes (`filters`),
//! only for the responses `vars` holds for. Applies to upstream responses and to the answers
//! of other plugins and of the gateway.
//!
//! [`headers`] compiles the header operations, [`filters`] the body substitutions; everything
//! is compiled when the instance is built.

pub mod filters;
pub mod headers;

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::expr::Expr;
use weir_plugin::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, ETAG, LAST_MODIFIED};
use weir_plugin::http::StatusCode;
use weir_plugin::{
    register_plugin, BodyFilter, BuildContext, Bytes, Late, Plugin, PluginInstance, RequestCtx, ResponseHead,
};

use filters::{Filter, FilterConf};
use headers::{HeaderOps, HeadersConf};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// New status code.
    #[serde(default)]
    #[schemars(range(min = 200, max = 598))]
    pub status_code: Option<u16>,
    /// New body (replaces the whole body; not with `filters`).
    #[serde(default)]
    pub body: Option<String>,
    /// `body` is base64: sent decoded (binary bodies).
    #[serde(default)]
    pub body_base64: bool,
    /// Header operations.
    #[serde(default)]
    pub headers: Option<HeadersConf>,
    /// An APISIX expression over the request's and the response's variables (`status`): the
    /// response is rewritten only when it holds.
    #[serde(default)]
    pub vars: Option<Vec<Value>>,
    /// Regex substitutions on the body (not with `body`).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub filters: Option<Vec<FilterConf>>,
    /// Largest body `filters` hold to substitute; a larger one passes unchanged.
    #[serde(default = "default_max")]
    #[schemars(range(min = 1))]
    pub max_resp_body_size: u64,
}

fn default_max() -> u64 {
    64 << 20
}

/// The plugin.
pub struct ResponseRewrite;

/// What happens to the body.
enum Body {
    Keep,
    Replace(Bytes),
    Filter(Vec<Filter>, u64),
}

struct Instance {
    vars: Option<Expr>,
    status: Option<StatusCode>,
    headers: HeaderOps,
    body: Body,
    late: Late,
}

impl Instance {
    fn holds(&self, ctx: &RequestCtx, resp: &ResponseHead) -> bool {
        let Some(e) = &self.vars else { return true };
        // `status` is the response's as it is now (an earlier header filter may have changed it).
        e.eval(&|name| if name == "status" { Some(Cow::Borrowed(resp.status.as_str())) } else { ctx.var(name) })
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        self.late
    }
    fn header_filter(&self, ctx: &mut RequestCtx, resp: &mut ResponseHead) -> BodyFilter {
        if !self.holds(ctx, resp) {
            return BodyFilter::Skip;
        }
        if let Some(s) = self.status {
            resp.status = s;
        }
        self.headers.apply(ctx, &mut resp.headers);
        let encoded =
            resp.headers.get(CONTENT_ENCODING).is_some_and(|e| !e.as_bytes().eq_ignore_ascii_case(b"identity"));
        match &self.body {
            Body::Keep => return BodyFilter::Skip,
            Body::Filter(..) if encoded => {
                log::debug!("response-rewrite: a compressed body is passed on unfiltered");
                return BodyFilter::Skip;
            }
            Body::Replace(_) | Body::Filter(..) => {}
        }
        for h in [CONTENT_LENGTH, CONTENT_ENCODING, ETAG, LAST_MODIFIED] {
            resp.headers.remove(h);
        }
        BodyFilter::Filter
    }
    fn body_filter(&self, ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        match &self.body {
            Body::Keep => {}
            Body::Replace(body) => *chunk = if eof { body.clone() } else { Bytes::new() },
            Body::Filter(fs, max) => filters::body_filter(fs, *max, ctx, chunk, eof),
        }
    }
}

/// Every string in `v`, at any depth.
fn strings(v: &Value) -> Box<dyn Iterator<Item = &str> + '_> {
    match v {
        Value::String(s) => Box::new(std::iter::once(s.as_str())),
        Value::Array(a) => Box::new(a.iter().flat_map(strings)),
        _ => Box::new(std::iter::empty()),
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
        let body = match (c.body, c.filters) {
            (Some(_), Some(_)) => return Err("`body` and `filters` cannot be configured together".into()),
            (Some(b), None) if c.body_base64 => {
                let engine = base64::engine::GeneralPurpose::new(
                    &base64::alphabet::STANDARD,
                    base64::engine::GeneralPurposeConfig::new()
                        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
                );
                match engine.decode(b.trim()) {
                    Ok(d) if !b.is_empty() => Body::Replace(Bytes::from(d)),
                    _ => return Err("body: invalid base64 content".into()),
                }
            }
            (Some(b), None) => Body::Replace(Bytes::from(b)),
            (None, Some(fs)) => {
                let compiled = fs.iter().enumerate().map(|(i, f)| Filter::compile(i, f)).collect::<Result<_, _>>()?;
                Body::Filter(compiled, c.max_resp_body_size)
            }
            (None, None) if c.body_base64 => return Err("body: invalid base64 content".into()),
            (None, None) => Body::Keep,
        };
        let vars = match &c.vars {
            None => None,
            Some(v) => {
                let v = Value::Array(v.clone());
                Some(Expr::compile(&v).map_err(|e| format!("vars{e}"))?)
            }
        };
        let headers = c.headers.as_ref().map(HeaderOps::compile).transpose()?.unwrap_or_default();
        // Request headers are read after forwarding only by `$http_*`/`$cookie_*`/`$host`, in
        // header values or in `vars`.
        let vars_read_headers = c.vars.iter().flatten().flat_map(strings).any(headers::reads_request_headers);
        let late =
            Late { headers: vars_read_headers || headers.reads_request_headers(), header_filter: true, log: false };
        Ok(Arc::new(Instance {
            vars,
            status: c
                .status_code
                .map(|s| StatusCode::from_u16(s).map_err(|e| format!("status_code: {e}")))
                .transpose()?,
            headers,
            body,
            late,
        }))
    }
}

register_plugin!(ResponseRewrite);

#[cfg(test)]
mod tests;
