//! `uri-blocker`: refuses requests whose URI matches one of `block_rules` (APISIX 3.x fields).
//!
//! The rules are compiled once into one `RegexSet` (linear time, whatever the URI). They are
//! matched against the request URI as the upstream receives it: Weir's normalized path (dot
//! segments resolved, slashes merged, escapes of unreserved characters decoded, the rest kept
//! upper-case: docs/data-plane.md), then `?` and the query as the client sent it; and, when the
//! URI has `%` escapes, against the same text decoded once, which is what the upstream
//! application reads (see `view`). So `^/admin` blocks `//admin`, `/x/../admin` and
//! `/%61dmin`, and `<script` blocks `?q=%3Cscript`.

mod view;

use std::sync::Arc;

use regex::bytes::{RegexSet, RegexSetBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::StatusCode;
use weir_plugin::{register_plugin, BuildContext, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Regexes; a request whose URI matches any of them is refused.
    #[schemars(length(min = 1), inner(length(min = 1, max = 4096)))]
    pub block_rules: Vec<String>,
    /// Status of a refused request.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 999))]
    pub rejected_code: u16,
    /// `{"error_msg": ...}` of a refused request.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub rejected_msg: Option<String>,
    /// Match the rules regardless of case.
    #[serde(default)]
    pub case_insensitive: bool,
}

fn default_code() -> u16 {
    403
}

/// The plugin.
pub struct UriBlocker;

struct Instance {
    rules: RegexSet,
    refusal: PluginResponse,
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if view::any_view(&ctx.path, &ctx.query, |uri| self.rules.is_match(uri)) {
            log::debug!("uri-blocker: refused `{}`", ctx.request_uri().escape_debug());
            return Flow::Respond(self.refusal.clone());
        }
        Flow::Continue
    }
}

/// Compiles the rules; a rule the `regex` crate refuses is named by its place.
fn compile(rules: &[String], case_insensitive: bool) -> Result<RegexSet, String> {
    for (i, rule) in rules.iter().enumerate() {
        if rules[..i].contains(rule) {
            return Err(format!("block_rules[{i}]: `{rule}` is listed twice"));
        }
        regex::bytes::RegexBuilder::new(rule)
            .case_insensitive(case_insensitive)
            .build()
            .map_err(|e| format!("block_rules[{i}]: invalid regex: {e}"))?;
    }
    RegexSetBuilder::new(rules).case_insensitive(case_insensitive).build().map_err(|e| format!("block_rules: {e}"))
}

impl Plugin for UriBlocker {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "uri-blocker"
    }
    fn priority(&self) -> i32 {
        2900
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let rules = compile(&conf.block_rules, conf.case_insensitive)?;
        let status = StatusCode::from_u16(conf.rejected_code).map_err(|e| format!("rejected_code: {e}"))?;
        let msg = match conf.rejected_msg {
            Some(m) => m,
            None => format!("{} {}", status.as_str(), status.canonical_reason().unwrap_or("")).trim_end().to_owned(),
        };
        Ok(Arc::new(Instance {
            rules,
            refusal: PluginResponse::json(status, &serde_json::json!({ "error_msg": msg })),
        }))
    }
}

register_plugin!(UriBlocker);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use weir_plugin::testing::{instance, run, TestRequest};

    fn status(conf: Value, target: &str) -> Option<u16> {
        let i = instance(&UriBlocker, conf).unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get(target).build();
        run(&[i], &mut ctx).map(|r| r.status.as_u16())
    }

    #[test]
    fn apisix_example() {
        let conf = json!({"block_rules": ["root.exe", "root.m+"]});
        assert_eq!(status(conf.clone(), "/root.exe"), Some(403));
        assert_eq!(status(conf.clone(), "/x/rootammm"), Some(403));
        assert_eq!(status(conf.clone(), "/ROOT.exe"), None, "case-sensitive by default");
        assert_eq!(status(conf, "/hello"), None);
        let i = instance(&UriBlocker, json!({"block_rules": ["root.exe"], "rejected_msg": "access is not allowed"}))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/root.exe").build();
        let r = run(&[i], &mut ctx).map(|r| (r.status.as_u16(), r.body));
        assert_eq!(r, Some((403, "{\"error_msg\":\"access is not allowed\"}".into())));
        let i = instance(&UriBlocker, json!({"block_rules": ["x"], "rejected_code": 404}))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/x").build();
        let r = run(&[i], &mut ctx).map(|r| (r.status.as_u16(), r.body));
        assert_eq!(r, Some((404, "{\"error_msg\":\"404 Not Found\"}".into())));
    }

    #[test]
    fn query_case_and_escapes() {
        let conf = json!({"block_rules": ["^/admin", "<script", "select.+from"], "case_insensitive": true});
        assert_eq!(status(conf.clone(), "/ADMIN/x"), Some(403));
        assert_eq!(status(conf.clone(), "/search?q=%3CScript%3E"), Some(403), "decoded query");
        assert_eq!(status(conf.clone(), "/search?q=SELECT%20a%20FROM%20b"), Some(403));
        assert_eq!(status(conf.clone(), "/a%20dmin"), None);
        assert_eq!(status(conf, "/public?next=/admin"), None, "anchored rules see the path first");
        // A rule written against the encoded form matches too.
        assert_eq!(status(json!({"block_rules": ["%2F"]}), "/a%2Fb"), Some(403));
        assert_eq!(
            status(json!({"block_rules": ["/a/b"]}), "/a%2Fb"),
            Some(403),
            "what an upstream decoding %2F reads"
        );
    }

    #[test]
    fn what_cannot_work_is_refused_at_load() {
        for (bad, why) in [
            (json!({}), ""),
            (json!({"block_rules": []}), ""),
            (json!({"block_rules": [""]}), ""),
            (json!({"block_rules": ["ok", "("]}), "block_rules[1]: invalid regex"),
            (json!({"block_rules": ["(?<=a)b"]}), "block_rules[0]: invalid regex"),
            (json!({"block_rules": ["a", "a"]}), "block_rules[1]: `a` is listed twice"),
            (json!({"block_rules": ["a"], "rejected_code": 199}), ""),
            (json!({"block_rules": ["a"], "rejected_msg": ""}), ""),
        ] {
            let e = instance(&UriBlocker, bad.clone()).err().unwrap_or_default();
            assert!(!e.is_empty() && e.contains(why), "{bad}: {e}");
        }
    }
}
