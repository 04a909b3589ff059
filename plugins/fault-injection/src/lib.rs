//! `fault-injection`: makes a route fail or slow down on purpose, as APISIX 3.x does, to test how
//! clients and callers cope: `abort` answers with a status, body and headers of its own without
//! contacting the upstream; `delay` holds the request for a while first. Each applies to a
//! `percentage` of requests and, with `vars`, only when one of its expressions holds.
//!
//! Runs in `rewrite` (priority 11000, before authentication). The delay waits with
//! `weir_plugin::timer`: the worker's other requests go on meanwhile. Expressions and `$var`
//! templates are compiled at load; a request that injects nothing costs the checks only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::expr::Expr;
use weir_plugin::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use weir_plugin::template::Template;
use weir_plugin::{
    register_plugin, timer, BuildContext, Bytes, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx,
};

/// Route configuration: `abort`, `delay`, or both.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("minProperties" = 1))]
pub struct Conf {
    /// Answer the request here.
    #[serde(default)]
    pub abort: Option<Abort>,
    /// Hold the request before it goes on (or is aborted).
    #[serde(default)]
    pub delay: Option<Delay>,
}

/// A header value: text (with `$variables`) or a number.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum HeaderText {
    /// Text; `$name` and `${name}` are the request's variables.
    Text(String),
    /// A number, written as it is.
    Number(serde_json::Number),
}

/// `abort`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Abort {
    /// The status of the answer.
    #[schemars(range(min = 200, max = 599))]
    pub http_status: u16,
    /// Its body; `$name` and `${name}` are the request's variables. Absent: empty.
    #[serde(default)]
    pub body: Option<String>,
    /// Its headers; text values may hold `$variables`.
    #[serde(default)]
    #[schemars(extend("minProperties" = 1))]
    pub headers: Option<BTreeMap<String, HeaderText>>,
    /// The share of requests aborted, 0-100 (absent: all).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub percentage: Option<u8>,
    /// APISIX expressions: the abort applies only when one of them holds.
    #[serde(default)]
    #[schemars(length(max = 20))]
    pub vars: Option<Vec<Vec<Value>>>,
}

/// `delay`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Delay {
    /// Seconds (fractions allowed).
    #[schemars(range(min = 0.0))]
    pub duration: f64,
    /// The share of requests delayed, 0-100 (absent: all).
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub percentage: Option<u8>,
    /// APISIX expressions: the delay applies only when one of them holds.
    #[serde(default)]
    #[schemars(length(max = 20))]
    pub vars: Option<Vec<Vec<Value>>>,
}

/// The plugin.
pub struct FaultInjection;

/// When a fault applies: its share of requests, and expressions of which one must hold.
struct When {
    percentage: Option<u8>,
    /// `None`: no condition. `Some(empty)`: never (APISIX: no expression matched).
    any: Option<Box<[Expr]>>,
}

impl When {
    fn compile(percentage: Option<u8>, vars: Option<Vec<Vec<Value>>>, at: &str) -> Result<When, String> {
        let any = match vars {
            None => None,
            Some(list) => {
                let mut any = Vec::with_capacity(list.len());
                for (i, e) in list.into_iter().enumerate() {
                    any.push(Expr::compile(&Value::Array(e)).map_err(|why| format!("{at}.vars[{i}]{why}"))?);
                }
                Some(any.into_boxed_slice())
            }
        };
        Ok(When { percentage, any })
    }

    fn holds(&self, ctx: &RequestCtx) -> bool {
        self.any.as_ref().is_none_or(|any| any.iter().any(|e| e.matches(ctx)))
    }

    fn sampled(&self) -> bool {
        self.percentage.is_none_or(|p| fastrand::u8(1..=100) <= p)
    }
}

struct AbortFault {
    status: StatusCode,
    body: Template,
    headers: Vec<(HeaderName, Template)>,
    when: When,
}

impl AbortFault {
    fn answer(&self, ctx: &RequestCtx) -> PluginResponse {
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 1);
        headers.insert(weir_plugin::http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        for (name, value) in &self.headers {
            match HeaderValue::from_str(&value.render(ctx)) {
                Ok(v) => {
                    headers.insert(name.clone(), v);
                }
                Err(_) => log::debug!("fault-injection: header {name} renders to an invalid value; left out"),
            }
        }
        let body = match self.body.render(ctx) {
            std::borrow::Cow::Borrowed(b) => Bytes::copy_from_slice(b.as_bytes()),
            std::borrow::Cow::Owned(b) => Bytes::from(b),
        };
        PluginResponse { status: self.status, headers, body }
    }
}

struct Faults {
    abort: Option<AbortFault>,
    delay: Option<(Duration, When)>,
}

impl PluginInstance for Faults {
    fn late(&self) -> Late {
        Late::NONE
    }

    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        // As APISIX: both conditions are read first, then the delay, then the abort.
        let abort = self.abort.as_ref().filter(|a| a.when.holds(ctx));
        let delay = self.delay.as_ref().filter(|(_, w)| w.holds(ctx) && w.sampled());
        let abort_now = move |ctx: &RequestCtx| abort.filter(|a| a.when.sampled()).map(|a| a.answer(ctx));
        match delay {
            None => abort_now(ctx).map_or(Flow::Continue, Flow::Respond),
            Some((duration, _)) => Flow::wait(async move {
                timer::sleep(*duration).await;
                abort_now(ctx).map_or(Flow::Continue, Flow::Respond)
            }),
        }
    }
}

fn compile_abort(a: Abort) -> Result<AbortFault, String> {
    let status = StatusCode::from_u16(a.http_status).map_err(|e| format!("abort.http_status: {e}"))?;
    let body = Template::compile(a.body.as_deref().unwrap_or("")).map_err(|e| format!("abort.body: {e}"))?;
    let mut headers = Vec::new();
    for (name, value) in a.headers.unwrap_or_default() {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("abort.headers: `{name}` is not a header name"))?;
        let text = match value {
            HeaderText::Text(t) => t,
            HeaderText::Number(n) => n.to_string(),
        };
        let value = Template::compile(&text).map_err(|e| format!("abort.headers.{name}: {e}"))?;
        if let Some(literal) = value.literal() {
            HeaderValue::from_str(literal).map_err(|_| format!("abort.headers.{name}: not a valid header value"))?;
        }
        headers.push((header, value));
    }
    Ok(AbortFault { status, body, headers, when: When::compile(a.percentage, a.vars, "abort")? })
}

impl Plugin for FaultInjection {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "fault-injection"
    }
    fn priority(&self) -> i32 {
        11000
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        if conf.abort.is_none() && conf.delay.is_none() {
            return Err("one of `abort` and `delay` is required".into());
        }
        let abort = conf.abort.map(compile_abort).transpose()?;
        let delay = match conf.delay {
            None => None,
            Some(d) => {
                let duration = Duration::try_from_secs_f64(d.duration)
                    .map_err(|e| format!("delay.duration: {} is not a duration: {e}", d.duration))?;
                Some((duration, When::compile(d.percentage, d.vars, "delay")?))
            }
        };
        Ok(Arc::new(Faults { abort, delay }))
    }
}

register_plugin!(FaultInjection);

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use serde_json::json;
    use weir_plugin::testing::{instance, run, TestRequest};

    use super::*;

    fn faults(conf: Value) -> Arc<dyn PluginInstance> {
        instance(&FaultInjection, conf).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn abort_answers_with_its_status_body_and_headers() {
        let p = faults(
            json!({"abort": {"http_status": 404, "body": "client addr: $remote_addr\n", "headers": {"X-APISIX-Remote-Addr": "$remote_addr", "X-N": 7}}}),
        );
        let r = run(std::slice::from_ref(&p), &mut TestRequest::get("/").build()).unwrap_or_else(|| panic!("aborted"));
        assert_eq!(r.status, 404);
        assert_eq!(&r.body[..], b"client addr: 127.0.0.1\n");
        assert_eq!(r.headers.get("x-apisix-remote-addr").map(|v| v.as_bytes()), Some(&b"127.0.0.1"[..]));
        assert_eq!(r.headers.get("x-n").map(|v| v.as_bytes()), Some(&b"7"[..]));
        let bare = faults(json!({"abort": {"http_status": 503}}));
        let r = run(&[bare], &mut TestRequest::get("/").build()).unwrap_or_else(|| panic!("aborted"));
        assert_eq!((r.status.as_u16(), r.body.len()), (503, 0));
    }

    #[test]
    fn vars_are_a_list_of_expressions_any_of_which_enables_the_fault() {
        let p = faults(json!({"abort": {"http_status": 403, "vars": [
            [["arg_name", "==", "jack"], ["arg_age", "==", 18]],
            [["arg_name2", "==", "allen"]]
        ]}}));
        let aborted = |target: &str| run(std::slice::from_ref(&p), &mut TestRequest::get(target).build()).is_some();
        assert!(aborted("/?name=jack&age=18"));
        assert!(!aborted("/?name=jack&age=19"), "AND inside one expression");
        assert!(aborted("/?name2=allen"), "OR between expressions");
        assert!(!aborted("/"));
        let never = faults(json!({"abort": {"http_status": 403, "vars": []}}));
        assert!(run(&[never], &mut TestRequest::get("/").build()).is_none(), "no expression: no match (APISIX)");
    }

    #[test]
    fn percentages_sample_requests() {
        let zero = faults(json!({"abort": {"http_status": 500, "percentage": 0}}));
        assert!((0..200).all(|_| run(std::slice::from_ref(&zero), &mut TestRequest::get("/").build()).is_none()));
        let half = faults(json!({"abort": {"http_status": 500, "percentage": 50}}));
        let hits = (0..2000)
            .filter(|_| run(std::slice::from_ref(&half), &mut TestRequest::get("/").build()).is_some())
            .count();
        assert!((800..1200).contains(&hits), "{hits} of 2000");
    }

    #[test]
    fn delay_waits_then_goes_on_or_aborts() {
        let p = faults(
            json!({"delay": {"duration": 0.2}, "abort": {"http_status": 500, "vars": [[["arg_fail", "==", "1"]]]}}),
        );
        let started = Instant::now();
        assert!(run(std::slice::from_ref(&p), &mut TestRequest::get("/").build()).is_none());
        assert!(started.elapsed() >= Duration::from_millis(200));
        let started = Instant::now();
        let r = run(std::slice::from_ref(&p), &mut TestRequest::get("/?fail=1").build());
        assert_eq!(r.map(|r| r.status.as_u16()), Some(500));
        assert!(started.elapsed() >= Duration::from_millis(200), "the delay comes first");
        let skipped = faults(json!({"delay": {"duration": 5, "vars": [[["arg_slow", "==", "1"]]]}}));
        let started = Instant::now();
        assert!(run(&[skipped], &mut TestRequest::get("/").build()).is_none());
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn what_cannot_work_is_refused() {
        let err = |conf: Value| instance(&FaultInjection, conf).err().unwrap_or_default();
        assert!(err(json!({})).starts_with("schema"), "one of abort and delay");
        assert!(err(json!({"abort": {"http_status": 199}})).starts_with("schema"));
        assert!(err(json!({"abort": {"body": "x"}})).starts_with("schema"), "http_status is required");
        assert!(err(json!({"delay": {"duration": -1}})).starts_with("schema"));
        assert!(err(json!({"delay": {"duration": 1, "percentage": 101}})).starts_with("schema"));
        assert_eq!(
            err(json!({"abort": {"http_status": 500, "body": "$remote_adr"}})),
            "abort.body: unknown variable `$remote_adr` (did you mean `$remote_addr`?)"
        );
        assert!(err(json!({"abort": {"http_status": 500, "headers": {"bad name": "x"}}})).contains("not a header name"));
        assert!(
            err(json!({"abort": {"http_status": 500, "headers": {"x": "a\nb"}}})).contains("not a valid header value")
        );
        assert!(err(json!({"abort": {"http_status": 500, "vars": [[["arg_a", "=~", "1"]]]}}))
            .starts_with("abort.vars[0][0][1]: unknown operator"));
        assert!(err(json!({"delay": {"duration": 1e300}})).starts_with("delay.duration"));
    }
}
