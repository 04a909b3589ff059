//! `request-validation`: refuses requests whose headers or body do not validate against a JSON
//! Schema (APISIX 3.x fields and answers). The schemas are compiled once ([`schema`]); the body
//! is read only when `body_schema` is set, and parsed as JSON or as a form ([`input`]).

pub mod input;
pub mod schema;

use std::sync::Arc;

use jsonschema::Validator;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
use weir_plugin::http::header::CONTENT_TYPE;
use weir_plugin::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use weir_plugin::{
    register_plugin, BuildContext, Bytes, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// JSON Schema of the request headers (an object of lower-case names; repeated headers are
    /// arrays).
    #[serde(default)]
    pub header_schema: Option<Map<String, Value>>,
    /// JSON Schema of the request body (JSON, or an `application/x-www-form-urlencoded` form).
    #[serde(default)]
    pub body_schema: Option<Map<String, Value>>,
    /// Largest body validated; a larger one is refused.
    #[serde(default = "default_max")]
    #[schemars(range(min = 1))]
    pub max_req_body_size: u64,
    /// Status of a refused request.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Body of a refused request (instead of the reason).
    #[serde(default)]
    #[schemars(length(min = 1, max = 256))]
    pub rejected_msg: Option<String>,
}

fn default_max() -> u64 {
    64 << 20
}

fn default_code() -> u16 {
    400
}

/// The content type read as a form.
const FORM: &[u8] = b"application/x-www-form-urlencoded";

/// The plugin.
pub struct RequestValidation;

struct Instance {
    headers: Option<HeaderCheck>,
    body: Option<Validator>,
    max_body: u64,
    status: StatusCode,
    msg: Option<Bytes>,
}

struct HeaderCheck {
    validator: Validator,
    /// Names the schema spells in another case than the lower case of the header map.
    aliases: Vec<(HeaderName, String)>,
}

/// The names a header schema mentions at its top level (`properties`, `required`) that differ
/// from their lower case: they are looked up whatever their case, as APISIX's header table is.
fn aliases(schema: &Map<String, Value>) -> Vec<(HeaderName, String)> {
    let props = schema.get("properties").and_then(Value::as_object).into_iter().flat_map(|p| p.keys());
    let required = schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
    let mut out: Vec<(HeaderName, String)> = Vec::new();
    for name in props.map(String::as_str).chain(required) {
        let Ok(h) = HeaderName::from_bytes(name.as_bytes()) else { continue };
        if h.as_str() != name && !out.iter().any(|(n, _)| *n == h) {
            out.push((h, name.to_owned()));
        }
    }
    out
}

impl Instance {
    fn refuse(&self, reason: &str) -> Flow<'static> {
        let mut headers = HeaderMap::with_capacity(1);
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        let body = match &self.msg {
            Some(m) => m.clone(),
            None => Bytes::copy_from_slice(reason.as_bytes()),
        };
        Flow::Respond(PluginResponse { status: self.status, headers, body })
    }

    /// The reason the body is refused, if it is.
    fn check_body(&self, validator: &Validator, ctx: &RequestCtx) -> Option<String> {
        let body = match &ctx.body {
            Some(b) if !b.is_empty() => b,
            _ => return Some("request body is missing".into()),
        };
        if body.len() as u64 > self.max_body {
            return Some(format!("request body is larger than {} bytes", self.max_body));
        }
        let mut types = ctx.headers.get_all(CONTENT_TYPE).iter();
        let content_type = types.next();
        if types.next().is_some() {
            // The gateway and the upstream could read the body as two different things.
            return Some("more than one Content-Type".into());
        }
        // As APISIX: a form when the type starts so, JSON otherwise (whatever it says).
        let form =
            content_type.is_some_and(|t| t.as_bytes().get(..FORM.len()).is_some_and(|p| p.eq_ignore_ascii_case(FORM)));
        let parsed = if form { input::form(body) } else { input::json(body) };
        match parsed {
            Ok(value) => schema::first_error(validator, &value),
            Err(e) => Some(e),
        }
    }
}

impl PluginInstance for Instance {
    fn wants_request_body(&self) -> bool {
        self.body.is_some()
    }
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if let Some(h) = &self.headers {
            let value = input::headers(&ctx.headers, &h.aliases);
            if let Some(why) = schema::first_error(&h.validator, &value) {
                log::debug!("request-validation: headers refused: {why}");
                return self.refuse(&why);
            }
        }
        if let Some(v) = &self.body {
            if let Some(why) = self.check_body(v, ctx) {
                log::debug!("request-validation: body refused: {why}");
                return self.refuse(&why);
            }
        }
        Flow::Continue
    }
}

impl Plugin for RequestValidation {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "request-validation"
    }
    fn priority(&self) -> i32 {
        2800
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        if conf.header_schema.is_none() && conf.body_schema.is_none() {
            return Err("at least one of `header_schema` and `body_schema` is required".into());
        }
        let headers = match conf.header_schema {
            None => None,
            Some(s) => Some(HeaderCheck {
                aliases: aliases(&s),
                validator: schema::compile("header_schema", &Value::Object(s))?,
            }),
        };
        let body = conf.body_schema.map(|s| schema::compile("body_schema", &Value::Object(s))).transpose()?;
        Ok(Arc::new(Instance {
            headers,
            body,
            max_body: conf.max_req_body_size,
            status: StatusCode::from_u16(conf.rejected_code).map_err(|e| format!("rejected_code: {e}"))?,
            msg: conf.rejected_msg.map(Bytes::from),
        }))
    }
}

register_plugin!(RequestValidation);

#[cfg(test)]
mod tests;
