//! The HTTP side of `ip-restriction`: in the access phase, a client the list refuses gets
//! `response_code` with `{"message": message}`, and the upstream is not contacted.

use std::sync::Arc;

use weir_plugin::http::StatusCode;
use weir_plugin::{BuildContext, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx};

use crate::{Conf, Rule};

/// The HTTP plugin.
pub struct IpRestriction;

struct Instance {
    rule: Rule,
    /// The answer to a refused client, made once.
    refusal: PluginResponse,
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if self.rule.refuses(ctx.remote_addr.ip()) {
            log::debug!("ip-restriction: client {} {}", ctx.remote_ip, self.rule.reason());
            return Flow::Respond(self.refusal.clone());
        }
        Flow::Continue
    }
}

impl Plugin for IpRestriction {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "ip-restriction"
    }
    fn priority(&self) -> i32 {
        3000
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let rule = Rule::new(&conf)?;
        let status = StatusCode::from_u16(conf.response_code).map_err(|e| format!("response_code: {e}"))?;
        Ok(Arc::new(Instance { rule, refusal: PluginResponse::message(status, &conf.message) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::testing::{instance, run, TestRequest};

    #[test]
    fn whitelist_and_blacklist_with_apisix_answers() {
        let w = instance(&IpRestriction, json!({"whitelist": ["192.168.0.1/24"], "message": "Access denied"}))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/").build();
        let r = run(std::slice::from_ref(&w), &mut ctx).map(|r| (r.status.as_u16(), r.body));
        assert_eq!(r, Some((403, "{\"message\":\"Access denied\"}".into())));
        let mut ctx =
            TestRequest::get("/").remote("192.168.0.77:1000".parse().unwrap_or_else(|e| panic!("{e}"))).build();
        assert!(run(&[w], &mut ctx).is_none());

        let b = instance(&IpRestriction, json!({"blacklist": ["127.0.0.1", "::1"], "response_code": 404}))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ctx = TestRequest::get("/").build();
        let r = run(std::slice::from_ref(&b), &mut ctx).map(|r| (r.status.as_u16(), r.body));
        assert_eq!(r, Some((404, "{\"message\":\"Your IP address is not allowed\"}".into())));
        let mut ctx = TestRequest::get("/").remote("[::1]:1000".parse().unwrap_or_else(|e| panic!("{e}"))).build();
        assert!(run(std::slice::from_ref(&b), &mut ctx).is_some());
        let mut ctx = TestRequest::get("/").remote("10.0.0.1:1000".parse().unwrap_or_else(|e| panic!("{e}"))).build();
        assert!(run(&[b], &mut ctx).is_none());
    }

    #[test]
    fn what_apisix_refuses_is_refused() {
        for bad in [
            json!({}),
            json!({"whitelist": []}),
            json!({"whitelist": ["1.1.1.1"], "blacklist": ["2.2.2.2"]}),
            json!({"whitelist": ["1.1.1.1"], "response_code": 401}),
            json!({"whitelist": ["1.1.1.1"], "response_code": 405}),
            json!({"whitelist": ["1.1.1.1"], "message": ""}),
            json!({"whitelist": ["1.1.1.1"], "message": "x".repeat(1025)}),
            json!({"whitelist": ["1.1.1.1/33"]}),
            json!({"whitelist": ["example.com"]}),
        ] {
            assert!(instance(&IpRestriction, bad.clone()).is_err(), "{bad}");
        }
    }
}
