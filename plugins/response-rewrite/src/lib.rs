//! `response-rewrite`: rewrites what the client receives: status, body, headers (add / set /
//! remove). Applies to upstream responses and to responses produced by other plugins.

use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{HeaderName, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Bytes, Plugin, PluginInstance, RequestCtx, ResponseHead, Value,
};

/// Header operations.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeaderOps {
    /// Appended.
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Replaced.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Removed.
    #[serde(default)]
    pub remove: Vec<String>,
}

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

fn pairs(map: &BTreeMap<String, String>) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    map.iter()
        .map(|(k, v)| {
            let n = HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}"))?;
            let v = HeaderValue::from_str(v).map_err(|e| format!("header `{k}`: {e}"))?;
            Ok((n, v))
        })
        .collect()
}

impl PluginInstance for Instance {
    fn header_filter(&self, _ctx: &mut RequestCtx, resp: &mut ResponseHead) {
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
        }
    }
    fn wants_response_body(&self) -> bool {
        self.body.is_some()
    }
    fn body_filter(&self, _ctx: &mut RequestCtx, chunk: &mut Bytes, eof: bool) {
        if let Some(body) = &self.body {
            *chunk = if eof { body.clone() } else { Bytes::new() };
        }
    }
}

impl Plugin for ResponseRewrite {
    fn name(&self) -> &'static str {
        "response-rewrite"
    }
    fn priority(&self) -> i32 {
        899
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn build(&self, conf: &Value, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let c: Conf = serde_json::from_value(conf.clone()).map_err(|e| e.to_string())?;
        let ops = c.headers.unwrap_or_default();
        Ok(Arc::new(Instance {
            status: c.status_code.map(|s| StatusCode::from_u16(s).map_err(|e| e.to_string())).transpose()?,
            body: c.body.map(Bytes::from),
            add: pairs(&ops.add)?,
            set: pairs(&ops.set)?,
            remove: ops
                .remove
                .iter()
                .map(|k| HeaderName::from_bytes(k.as_bytes()).map_err(|e| format!("header `{k}`: {e}")))
                .collect::<Result<_, _>>()?,
        }))
    }
}

register_plugin!(ResponseRewrite);
