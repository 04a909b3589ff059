//! `consumer-restriction`: lets a request through by who it is, as APISIX 3.x's plugin: its
//! consumer's name or group, or the route or service it matched, against a `whitelist` or a
//! `blacklist`, and per consumer the methods it may use (`allowed_by_methods`).
//!
//! Runs in the access phase, after authentication (priority 2400): the consumer is known. A
//! request without the value (no consumer on a `consumer_name` restriction) answers 401
//! `The request is rejected, please check the <type> for this request`; a refused one
//! `rejected_code` (403) with `rejected_msg` or `The <type> is forbidden.`.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::http::{Method, StatusCode};
use weir_plugin::{register_plugin, BuildContext, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx};

/// What the lists name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The consumer's username.
    #[default]
    ConsumerName,
    /// The consumer's group.
    ConsumerGroupId,
    /// The matched route's id.
    RouteId,
    /// The matched route's service id.
    ServiceId,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ConsumerName => "consumer_name",
            Kind::ConsumerGroupId => "consumer_group_id",
            Kind::RouteId => "route_id",
            Kind::ServiceId => "service_id",
        }
    }
}

/// The methods one consumer may use.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MethodsOf {
    /// The consumer (by the `type`'s value).
    #[serde(default)]
    pub user: Option<String>,
    /// Its methods.
    #[schemars(
        length(min = 1),
        inner(regex(pattern = "^(GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS|CONNECT|TRACE|PURGE)$"))
    )]
    pub methods: Vec<String>,
}

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [{"required": ["blacklist"]}, {"required": ["whitelist"]}, {"required": ["allowed_by_methods"]}]))]
pub struct Conf {
    /// What the lists name.
    #[serde(default, rename = "type")]
    pub kind: Kind,
    /// Values refused.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub blacklist: Option<Vec<String>>,
    /// The only values let through (unless `allowed_by_methods` allows the method).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub whitelist: Option<Vec<String>>,
    /// Per value, the methods it may use.
    #[serde(default)]
    pub allowed_by_methods: Vec<MethodsOf>,
    /// Status of a refusal.
    #[serde(default = "default_code")]
    #[schemars(range(min = 200, max = 599))]
    pub rejected_code: u16,
    /// Message of a refusal.
    #[serde(default)]
    pub rejected_msg: Option<String>,
}

fn default_code() -> u16 {
    403
}

/// The plugin.
pub struct ConsumerRestriction;

struct Instance {
    conf: Conf,
    methods: Vec<(Option<String>, Vec<Method>)>,
    missing: PluginResponse,
    rejected: PluginResponse,
}

impl Instance {
    fn value<'c>(&self, ctx: &'c RequestCtx) -> Option<&'c str> {
        match self.conf.kind {
            Kind::ConsumerName => ctx.consumer.as_ref().map(|c| &*c.username),
            Kind::ConsumerGroupId => ctx.consumer.as_ref().and_then(|c| c.group_id.as_deref()),
            Kind::RouteId => ctx.route_id.as_deref(),
            Kind::ServiceId => ctx.service_id.as_deref(),
        }
    }

    /// APISIX's rule: a value listed in `allowed_by_methods` may use its methods only; one not
    /// listed is not restricted by it.
    fn method_allowed(&self, value: &str, method: &Method) -> bool {
        match self.methods.iter().find(|(user, _)| user.as_deref() == Some(value)) {
            Some((_, methods)) => methods.contains(method),
            None => true,
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access(&self, ctx: &mut RequestCtx) -> Flow<'_> {
        let Some(value) = self.value(ctx) else { return Flow::Respond(self.missing.clone()) };
        if self.conf.blacklist.as_ref().is_some_and(|b| b.iter().any(|v| v == value)) {
            return Flow::Respond(self.rejected.clone());
        }
        let whitelisted = self.conf.whitelist.as_ref().is_some_and(|w| w.iter().any(|v| v == value));
        let mut block = self.conf.whitelist.is_some() && !whitelisted;
        if !self.methods.is_empty() && !whitelisted && !self.method_allowed(value, &ctx.method) {
            block = true;
        }
        if block {
            Flow::Respond(self.rejected.clone())
        } else {
            Flow::Continue
        }
    }
}

impl Plugin for ConsumerRestriction {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "consumer-restriction"
    }
    fn priority(&self) -> i32 {
        2400
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let code = StatusCode::from_u16(conf.rejected_code).map_err(|_| "rejected_code: not a status".to_owned())?;
        let kind = conf.kind.name();
        let missing = PluginResponse::message(
            StatusCode::UNAUTHORIZED,
            &format!("The request is rejected, please check the {kind} for this request"),
        );
        let text = conf.rejected_msg.clone().unwrap_or_else(|| format!("The {kind} is forbidden."));
        let rejected = PluginResponse::message(code, &text);
        let mut methods = Vec::new();
        for (i, m) in conf.allowed_by_methods.iter().enumerate() {
            let parsed: Result<Vec<Method>, String> = m
                .methods
                .iter()
                .map(|x| Method::from_bytes(x.as_bytes()).map_err(|_| format!("allowed_by_methods[{i}]: method {x}")))
                .collect();
            methods.push((m.user.clone(), parsed?));
        }
        Ok(Arc::new(Instance { conf, methods, missing, rejected }))
    }
}

register_plugin!(ConsumerRestriction);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::{instance, run, TestRequest};
    use weir_plugin::{Consumer, Value};

    fn status(conf: Value, who: Option<(&str, Option<&str>)>, method: Method) -> (Option<u16>, String) {
        let p = instance(&ConsumerRestriction, conf).unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::new(method, "/").build();
        ctx.route_id = Some(Arc::from("r1"));
        if let Some((name, group)) = who {
            let mut c = Consumer::named(name);
            c.group_id = group.map(Arc::from);
            ctx.consumer = Some(Arc::new(c));
        }
        let r = run(&[p], &mut ctx);
        let body = r.as_ref().map(|r| String::from_utf8_lossy(&r.body).into_owned()).unwrap_or_default();
        (r.map(|r| r.status.as_u16()), body)
    }

    #[test]
    fn lists_and_methods_as_apisix() {
        let w = json!({"whitelist": ["jack"]});
        assert_eq!(status(w.clone(), Some(("jack", None)), Method::GET).0, None);
        assert_eq!(
            status(w.clone(), Some(("rose", None)), Method::GET),
            (Some(403), r#"{"message":"The consumer_name is forbidden."}"#.into())
        );
        assert_eq!(
            status(w, None, Method::GET),
            (
                Some(401),
                r#"{"message":"The request is rejected, please check the consumer_name for this request"}"#.into()
            )
        );
        let b = json!({"blacklist": ["jack"], "rejected_code": 401, "rejected_msg": "go away"});
        assert_eq!(
            status(b.clone(), Some(("jack", None)), Method::GET),
            (Some(401), r#"{"message":"go away"}"#.into())
        );
        assert_eq!(status(b, Some(("rose", None)), Method::GET).0, None);
        let m = json!({"allowed_by_methods": [{"user": "jack", "methods": ["POST"]}]});
        assert_eq!(status(m.clone(), Some(("jack", None)), Method::GET).0, Some(403));
        assert_eq!(status(m.clone(), Some(("jack", None)), Method::POST).0, None);
        assert_eq!(status(m, Some(("rose", None)), Method::GET).0, None, "not listed: not restricted");
        let g = json!({"type": "consumer_group_id", "whitelist": ["gold"]});
        assert_eq!(status(g.clone(), Some(("jack", Some("gold"))), Method::GET).0, None);
        assert_eq!(status(g, Some(("jack", Some("free"))), Method::GET).0, Some(403));
        assert_eq!(status(json!({"type": "route_id", "blacklist": ["r1"]}), None, Method::GET).0, Some(403));
    }

    #[test]
    fn a_restriction_needs_a_list() {
        assert!(instance(&ConsumerRestriction, json!({})).is_err());
        assert!(instance(&ConsumerRestriction, json!({"whitelist": []})).is_err());
    }
}
