//! `traffic-split`: sends a share of a route's requests to other upstreams (canary, blue-green),
//! as APISIX 3.x does: rules tried in order, the first whose `match` holds (any of its `vars`
//! expressions) chooses among its `weighted_upstreams` by smooth weighted round robin (`pick`).
//!
//! Everything is compiled when the instance is built: the expressions (`weir_plugin::expr`),
//! inline `upstream` objects (by the host, as a route's own; their balancer state lives with the
//! instance), and `upstream_id` names, which must exist (a missing one refuses the configuration,
//! naming it). A request evaluates the expressions, takes the next pick and sets
//! `ctx.upstream`: no allocation, no lock for tables of up to 4096 picks per cycle.

mod pick;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::expr::Expr;
use weir_plugin::schemars::{json_schema, Schema, SchemaGenerator};
use weir_plugin::{register_plugin, BuildContext, Flow, Late, Plugin, PluginInstance, RequestCtx, UpstreamRef};

use pick::Picker;

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Tried in order: the first rule whose `match` holds chooses the upstream. No rule holding:
    /// the route's own upstream.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// One rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Conditions, any one of which applies the rule; absent or empty: always.
    #[serde(default, rename = "match")]
    pub matches: Option<Vec<Match>>,
    /// The upstreams to share the rule's requests, with their weights. An entry without
    /// `upstream_id` or `upstream` is the route's own upstream.
    #[serde(default = "route_only")]
    #[schemars(length(min = 1, max = 20))]
    pub weighted_upstreams: Vec<Weighted>,
}

/// One condition of a rule.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// An APISIX expression (lua-resty-expr): a list of `[var, op, value]` conditions, all of
    /// which must hold. Absent: holds.
    #[serde(default)]
    pub vars: Option<Vec<Value>>,
}

/// An upstream of a rule and its weight.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Weighted {
    /// An `upstreams` object, by id (it must exist).
    #[serde(default)]
    #[schemars(schema_with = "id_schema")]
    pub upstream_id: Option<Value>,
    /// An upstream defined here (the `upstreams` schema; `checks` not supported).
    #[serde(default)]
    #[schemars(schema_with = "object_schema")]
    pub upstream: Option<Value>,
    /// Its share of the rule's requests relative to the others' (0: never chosen).
    #[serde(default = "one")]
    pub weight: u32,
}

fn route_only() -> Vec<Weighted> {
    vec![Weighted { upstream_id: None, upstream: None, weight: 1 }]
}

fn one() -> u32 {
    1
}

fn id_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "integer, or string of 1-64 characters [a-zA-Z0-9-_.]",
        "anyOf": [
            {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[a-zA-Z0-9-_.]+$"},
            {"type": "integer", "minimum": 1}
        ]
    })
}

fn object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "object", "description": "an upstream object (validated as `upstreams` entries are)"})
}

/// The plugin.
pub struct TrafficSplit;

/// Where a pick sends the request.
enum Target {
    /// The route's own upstream.
    Route,
    /// Another one (an object by id, or one compiled from the configuration).
    Upstream(UpstreamRef),
}

/// A rule, compiled.
struct CompiledRule {
    /// `None`: always applies.
    when: Option<Box<[Expr]>>,
    targets: Box<[Target]>,
    /// `None` when every weight is 0: the route's own upstream.
    picker: Option<Picker>,
}

struct Split {
    rules: Box<[CompiledRule]>,
    /// A rule reads `post_arg_*`: the body must be read before `access`.
    wants_body: bool,
}

impl PluginInstance for Split {
    fn wants_request_body(&self) -> bool {
        self.wants_body
    }

    fn late(&self) -> Late {
        Late::NONE
    }

    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        let applies = |r: &&CompiledRule| r.when.as_ref().is_none_or(|any| any.iter().any(|e| e.matches(ctx)));
        let Some(rule) = self.rules.iter().find(applies) else { return Flow::Continue };
        ctx.upstream = match rule.picker.as_ref().map(|p| &rule.targets[p.pick()]) {
            Some(Target::Upstream(u)) => Some(u.clone()),
            Some(Target::Route) | None => None,
        };
        Flow::Continue
    }
}

/// `upstream_id` as text (ids are strings or integers).
fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn compile_rule(rule: Rule, at: &str, ctx: &BuildContext<'_>) -> Result<(CompiledRule, bool), String> {
    let mut reads_body = false;
    let when = match rule.matches {
        None => None,
        Some(list) if list.is_empty() => None,
        Some(list) => {
            let mut any = Vec::with_capacity(list.len());
            for (j, m) in list.into_iter().enumerate() {
                let vars = Value::Array(m.vars.unwrap_or_default());
                let e = Expr::compile(&vars).map_err(|why| format!("{at}.match[{j}].vars{why}"))?;
                reads_body |= e.variables().iter().any(|v| v.starts_with("post_arg_"));
                any.push(e);
            }
            Some(any.into_boxed_slice())
        }
    };
    let mut targets = Vec::with_capacity(rule.weighted_upstreams.len());
    let mut weights = Vec::with_capacity(rule.weighted_upstreams.len());
    for (j, w) in rule.weighted_upstreams.into_iter().enumerate() {
        let here = format!("{at}.weighted_upstreams[{j}]");
        let target = match (&w.upstream_id, &w.upstream) {
            (Some(_), Some(_)) => return Err(format!("{here}: `upstream` and `upstream_id` are mutually exclusive")),
            (Some(id), None) => Target::Upstream(
                ctx.services.upstream_by_id(&id_text(id)).map_err(|e| format!("{here}.upstream_id: {e}"))?,
            ),
            (None, Some(up)) => {
                if up.get("checks").is_some() {
                    return Err(format!(
                        "{here}.upstream.checks: health checks are not supported on an upstream defined here (as in APISIX); define an `upstreams` object and name it with `upstream_id`"
                    ));
                }
                Target::Upstream(ctx.services.compile_upstream(up).map_err(|e| format!("{here}.upstream: {e}"))?)
            }
            (None, None) => Target::Route,
        };
        targets.push(target);
        weights.push(w.weight);
    }
    let picker = Picker::new(&weights);
    Ok((CompiledRule { when, targets: targets.into_boxed_slice(), picker }, reads_body))
}

impl Plugin for TrafficSplit {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "traffic-split"
    }
    fn priority(&self) -> i32 {
        966
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let mut rules = Vec::with_capacity(conf.rules.len());
        let mut wants_body = false;
        for (i, rule) in conf.rules.into_iter().enumerate() {
            let (compiled, reads_body) = compile_rule(rule, &format!("rules[{i}]"), ctx)?;
            wants_body |= reads_body;
            rules.push(compiled);
        }
        Ok(Arc::new(Split { rules: rules.into_boxed_slice(), wants_body }))
    }
}

register_plugin!(TrafficSplit);

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;
    use weir_plugin::testing::{instance_with, run, TestRequest};
    use weir_plugin::{HttpClient, NoServices, Services};

    use super::*;

    /// Upstream objects `u1` and `u2` exist; inline upstreams compile to a marker of their
    /// first node.
    struct Host;

    impl Services for Host {
        fn http_client(&self) -> Arc<dyn HttpClient> {
            NoServices.http_client()
        }
        fn compile_upstream(&self, conf: &Value) -> Result<UpstreamRef, String> {
            let nodes = conf.get("nodes").and_then(Value::as_object).ok_or("nodes: required")?;
            let first = nodes.keys().next().ok_or("nodes: empty")?;
            Ok(UpstreamRef::Id(Arc::from(format!("inline:{first}"))))
        }
        fn upstream_by_id(&self, id: &str) -> Result<UpstreamRef, String> {
            match id {
                "u1" | "u2" | "7" => Ok(UpstreamRef::Id(Arc::from(id))),
                _ => Err(format!("upstream `{id}` does not exist")),
            }
        }
    }

    fn split(conf: Value) -> Arc<dyn PluginInstance> {
        instance_with(&TrafficSplit, conf, &[], &Host).unwrap_or_else(|e| panic!("{e}"))
    }

    fn chosen(p: &Arc<dyn PluginInstance>, req: TestRequest) -> String {
        let mut ctx = req.build();
        assert!(run(std::slice::from_ref(p), &mut ctx).is_none(), "traffic-split never answers");
        match ctx.upstream {
            None => "route".into(),
            Some(UpstreamRef::Id(id)) => id.to_string(),
            Some(other) => format!("{other:?}"),
        }
    }

    fn counts(p: &Arc<dyn PluginInstance>, n: usize, req: impl Fn() -> TestRequest) -> HashMap<String, usize> {
        let mut all = HashMap::new();
        for _ in 0..n {
            *all.entry(chosen(p, req())).or_default() += 1;
        }
        all
    }

    #[test]
    fn weights_share_requests_and_an_empty_entry_is_the_route() {
        let p = split(json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u1", "weight": 3}, {"weight": 2}]}]}));
        let got = counts(&p, 100, || TestRequest::get("/"));
        assert_eq!((got["u1"], got["route"]), (60, 40));
        let zero = split(
            json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u1", "weight": 0}, {"upstream_id": "u2"}]}]}),
        );
        assert_eq!(counts(&zero, 50, || TestRequest::get("/")).get("u1"), None, "weight 0 is never chosen");
        let none = split(json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u1", "weight": 0}]}]}));
        assert_eq!(chosen(&none, TestRequest::get("/")), "route", "all weights 0: the route's own");
        assert_eq!(chosen(&split(json!({})), TestRequest::get("/")), "route");
        assert_eq!(chosen(&split(json!({"rules": [{}]})), TestRequest::get("/")), "route", "the default entry");
    }

    #[test]
    fn matches_are_or_and_vars_are_and_rules_go_in_order() {
        let p = split(json!({"rules": [
            {"match": [
                {"vars": [["arg_name", "==", "jack"], ["http_user-id", ">", "23"], ["http_apisix-key", "~~", "[a-z]+"]]},
                {"vars": [["arg_name2", "==", "rose"], ["http_user-id2", "!", ">", "33"]]}
             ],
             "weighted_upstreams": [{"upstream_id": "u1"}]},
            {"match": [{"vars": [["http_x-api-id", "==", "2"]]}], "weighted_upstreams": [{"upstream_id": 7}]}
        ]}));
        let first = TestRequest::get("/?name=jack").header("user-id", "30").header("apisix-key", "hello");
        assert_eq!(chosen(&p, first), "u1");
        let second = TestRequest::get("/?name2=rose").header("user-id2", "30");
        assert_eq!(chosen(&p, second), "u1", "the second match entry (OR)");
        let partial = TestRequest::get("/?name=jack").header("user-id", "30");
        assert_eq!(chosen(&p, partial), "route", "one condition short (AND)");
        assert_eq!(chosen(&p, TestRequest::get("/").header("x-api-id", "2")), "7", "the next rule");
        assert_eq!(chosen(&p, TestRequest::get("/").header("x-api-id", "3")), "route");
    }

    #[test]
    fn inline_upstreams_and_post_args() {
        let p = split(json!({"rules": [{
            "match": [{"vars": [["post_arg_id", "==", "1"]]}],
            "weighted_upstreams": [{"upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1980": 1}}}]
        }]}));
        assert!(p.wants_request_body(), "post_arg_ needs the body");
        let form = || {
            TestRequest::new(weir_plugin::http::Method::POST, "/")
                .header("content-type", "application/x-www-form-urlencoded")
        };
        assert_eq!(chosen(&p, form().body(b"id=1")), "inline:127.0.0.1:1980");
        assert_eq!(chosen(&p, form().body(b"id=2")), "route");
        assert!(!split(json!({"rules": [{"match": [{"vars": [["arg_a", "==", "1"]]}]}]})).wants_request_body());
    }

    #[test]
    fn what_cannot_work_is_refused_naming_it() {
        let err = |conf: Value| instance_with(&TrafficSplit, conf, &[], &Host).err().unwrap_or_default();
        assert_eq!(
            err(json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u1"}, {"upstream_id": "nope"}]}]})),
            "rules[0].weighted_upstreams[1].upstream_id: upstream `nope` does not exist"
        );
        assert!(err(json!({"rules": [{"match": [{"vars": [["arg_a", "=~", "1"]]}]}]}))
            .starts_with("rules[0].match[0].vars[0][1]: unknown operator"));
        assert!(err(
            json!({"rules": [{"weighted_upstreams": [{"upstream_id": "u1", "upstream": {"nodes": {"a:1": 1}}}]}]})
        )
        .contains("mutually exclusive"));
        assert!(err(json!({"rules": [{"weighted_upstreams": [{"upstream": {"nodes": {"a:1": 1}, "checks": {}}}]}]}))
            .starts_with("rules[0].weighted_upstreams[0].upstream.checks: health checks are not supported"));
        assert!(err(json!({"rules": [{"weighted_upstreams": [{"weight": -1}]}]})).starts_with("schema"));
        assert!(err(json!({"rules": [{"weighted_upstreams": []}]})).starts_with("schema"), "at least one");
        assert!(err(json!({"rules": [{"weighted_upstreams": [{"upstream_id": "bad id!"}]}]})).starts_with("schema"));
        assert!(err(json!({"rule": []})).starts_with("schema"), "a misspelled key");
    }
}
