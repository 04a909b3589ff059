//! `redirect`: answers a request with a redirect instead of proxying it (APISIX 3.x fields):
//! to HTTPS (`http_to_https`), to a `uri` template with `$variables`, or to what `regex_uri`
//! makes of the request path. Everything is compiled at load; a request that is redirected
//! costs one `Location` string.

mod location;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::Arc;

use regex::Regex;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::http::header::LOCATION;
use weir_plugin::http::{HeaderMap, HeaderValue, Method, StatusCode};
use weir_plugin::resub::Replacement;
use weir_plugin::template::Template;
use weir_plugin::{
    register_plugin, schema_of, BuildContext, Bytes, Flow, InitEnv, Late, Plugin, PluginInstance, PluginResponse,
    RequestCtx,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Redirect plain-HTTP requests to HTTPS (301 for GET and HEAD, 308 otherwise).
    #[serde(default)]
    pub http_to_https: Option<bool>,
    /// The target, with `$variables` (`$uri/index.html`, `https://example.com$request_uri`).
    #[serde(default)]
    #[schemars(length(min = 2))]
    pub uri: Option<String>,
    /// `[regex, template]`: the request path with the regex's first match replaced (`$1` names a
    /// group); a path that does not match is proxied as usual.
    #[serde(default)]
    #[schemars(length(min = 2, max = 2))]
    pub regex_uri: Option<Vec<String>>,
    /// Status of `uri` and `regex_uri` redirects.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 999))]
    pub ret_code: u16,
    /// Escape the target's path as nginx escapes a URI.
    #[serde(default)]
    pub encode_uri: bool,
    /// Append the request's query string to the target.
    #[serde(default)]
    pub append_query_string: bool,
}

fn default_code() -> u16 {
    302
}

/// `plugin_attr.redirect`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Attr {
    /// The port of `http_to_https` targets (443, the default, is left out of them).
    #[serde(default)]
    #[schemars(range(min = 1, max = 65535))]
    pub https_port: Option<u16>,
}

/// The plugin; holds `plugin_attr.redirect.https_port` (0: none), read per redirect so that a
/// plugin reload applies it to instances built before.
#[derive(Default)]
pub struct Redirect {
    https_port: Arc<AtomicU16>,
}

enum Target {
    Https,
    Uri(Template),
    Regex(Regex, Replacement),
}

struct Instance {
    target: Target,
    status: StatusCode,
    encode_uri: bool,
    append_query_string: bool,
    https_port: Arc<AtomicU16>,
}

impl Instance {
    /// The redirect for `ctx`, or `None` to proxy it.
    fn location(&self, ctx: &RequestCtx) -> Option<Result<(StatusCode, String), StatusCode>> {
        let mut target = match &self.target {
            Target::Https => {
                let scheme = ctx.header("x-forwarded-proto").unwrap_or(ctx.scheme);
                if scheme.eq_ignore_ascii_case("https") {
                    return None;
                }
                let Some(host) = location::host(ctx) else { return Some(Err(StatusCode::BAD_REQUEST)) };
                let status = if ctx.method == Method::GET || ctx.method == Method::HEAD {
                    StatusCode::MOVED_PERMANENTLY
                } else {
                    StatusCode::PERMANENT_REDIRECT
                };
                let port = match self.https_port.load(Ordering::Relaxed) {
                    0 | 443 => String::new(),
                    p => format!(":{p}"),
                };
                return Some(Ok((status, format!("https://{host}{port}{}", ctx.request_uri()))));
            }
            Target::Uri(t) => t.render(ctx).into_owned(),
            Target::Regex(re, rep) => {
                let caps = re.captures(&ctx.path)?;
                let mut out = String::with_capacity(ctx.path.len() + 16);
                let whole = caps.get(0)?;
                out.push_str(&ctx.path[..whole.start()]);
                rep.expand(&caps, &mut out);
                out.push_str(&ctx.path[whole.end()..]);
                out
            }
        };
        if self.encode_uri {
            target = match target.split_once('?') {
                Some((path, query)) => format!("{}?{query}", location::escape_uri(path)),
                None => location::escape_uri(&target),
            };
        }
        if self.append_query_string && !ctx.query.is_empty() {
            target.push(if target.contains('?') { '&' } else { '?' });
            target.push_str(&ctx.query);
        }
        Some(Ok((self.status, target)))
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let (status, target) = match self.location(ctx) {
            None => return Flow::Continue,
            Some(Ok(found)) => found,
            Some(Err(status)) => {
                return Flow::Respond(PluginResponse::json(
                    status,
                    &serde_json::json!({"error_msg": "400 Bad Request: invalid Host"}),
                ))
            }
        };
        let Ok(value) = HeaderValue::from_str(&target) else {
            log::warn!("redirect: the target `{}` is not a valid Location", target.escape_debug());
            return Flow::Respond(PluginResponse::json(
                StatusCode::INTERNAL_SERVER_ERROR,
                &serde_json::json!({"error_msg": "500 Internal Server Error: invalid redirect target"}),
            ));
        };
        let mut headers = HeaderMap::with_capacity(1);
        headers.insert(LOCATION, value);
        Flow::Respond(PluginResponse { status, headers, body: Bytes::new() })
    }
}

impl Plugin for Redirect {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "redirect"
    }
    fn priority(&self) -> i32 {
        900
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(schema_of::<Attr>())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let attr: Attr = attr.map(weir_plugin::parse_conf).transpose()?.unwrap_or_default();
        if !env.check_only {
            self.https_port.store(attr.https_port.unwrap_or(0), Ordering::Relaxed);
        }
        Ok(())
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let target = match (conf.http_to_https, &conf.uri, &conf.regex_uri) {
            (Some(_), None, None) => Target::Https,
            (None, Some(uri), None) => Target::Uri(Template::compile(uri).map_err(|e| format!("uri: {e}"))?),
            (None, None, Some(pair)) => {
                let (Some(pattern), Some(template)) = (pair.first(), pair.get(1)) else {
                    return Err("regex_uri: [regex, template]".into());
                };
                let re = Regex::new(pattern).map_err(|e| format!("regex_uri[0]: invalid regex: {e}"))?;
                let rep = Replacement::parse(template).map_err(|e| format!("regex_uri[1]: {e}"))?;
                rep.check_groups(re.captures_len()).map_err(|e| format!("regex_uri[1]: {e}"))?;
                Target::Regex(re, rep)
            }
            _ => return Err("exactly one of `http_to_https`, `uri` and `regex_uri` is required".into()),
        };
        if conf.http_to_https.is_some() && conf.append_query_string {
            return Err("only one of `http_to_https` and `append_query_string` can be configured".into());
        }
        if conf.http_to_https == Some(false) {
            // Present, so no other target may be set (APISIX's oneOf), and never redirects.
            return Ok(Arc::new(Never));
        }
        Ok(Arc::new(Instance {
            target,
            status: StatusCode::from_u16(conf.ret_code).map_err(|e| format!("ret_code: {e}"))?,
            encode_uri: conf.encode_uri,
            append_query_string: conf.append_query_string,
            https_port: self.https_port.clone(),
        }))
    }
}

/// `http_to_https: false` alone: a configuration that redirects nothing.
struct Never;

impl PluginInstance for Never {
    fn late(&self) -> Late {
        Late::NONE
    }
}

register_plugin!(Redirect::default());

#[cfg(test)]
mod tests;
