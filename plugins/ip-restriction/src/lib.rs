//! `ip-restriction` (stream plugin): lets a connection through, or closes it, by the client's
//! address. APISIX's fields: `whitelist` or `blacklist`, each a list of IPs and CIDRs.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::cidr::Cidr;
use weir_plugin::{register_stream_plugin, schema_of, StreamCtx, StreamFlow, StreamInstance, StreamPlugin};

/// Route configuration: exactly one of the two lists.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Only these clients get through.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub whitelist: Option<Vec<String>>,
    /// These clients are closed.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub blacklist: Option<Vec<String>>,
}

/// The plugin.
pub struct IpRestriction;

enum Rule {
    Allow(Vec<Cidr>),
    Deny(Vec<Cidr>),
}

impl StreamInstance for Rule {
    fn preread(&self, ctx: &mut StreamCtx) -> StreamFlow {
        let ip = ctx.remote_addr.ip();
        match self {
            Rule::Allow(list) if !list.iter().any(|c| c.contains(ip)) => {
                StreamFlow::Close(format!("client {ip} is not in the whitelist"))
            }
            Rule::Deny(list) if list.iter().any(|c| c.contains(ip)) => {
                StreamFlow::Close(format!("client {ip} is in the blacklist"))
            }
            _ => StreamFlow::Continue,
        }
    }
}

fn parse(list: &[String], field: &str) -> Result<Vec<Cidr>, String> {
    list.iter().enumerate().map(|(i, s)| Cidr::parse(s).map_err(|e| format!("{field}[{i}]: {e}"))).collect()
}

impl StreamPlugin for IpRestriction {
    fn name(&self) -> &'static str {
        "ip-restriction"
    }
    fn priority(&self) -> i32 {
        3000
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn build(&self, conf: &Value) -> Result<Arc<dyn StreamInstance>, String> {
        let c: Conf = weir_plugin::parse_conf(conf)?;
        let rule = match (&c.whitelist, &c.blacklist) {
            (Some(w), None) => Rule::Allow(parse(w, "whitelist")?),
            (None, Some(b)) => Rule::Deny(parse(b, "blacklist")?),
            _ => return Err("exactly one of `whitelist` and `blacklist` is required".into()),
        };
        Ok(Arc::new(rule))
    }
}

register_stream_plugin!(IpRestriction);
