//! `real-ip`: APISIX's per-route client address. The address a variable names (`source`: a
//! header such as `http_x_forwarded_for`, an argument, a cookie...) becomes the request's
//! `remote_addr` (and `remote_port` when it carries one) for every later plugin, the
//! `X-Forwarded-For` sent upstream and the log. The gateway-wide `gateway.real_ip` does the same
//! before routing; both decide with `weir_plugin::client_ip`.
//!
//! As in APISIX, the source is believed only from `trusted_addresses` when they are given, and
//! from anyone when they are not (a warning says so at load).

use std::net::SocketAddr;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::cidr::Cidr;
use weir_plugin::client_ip::{from_forwarded_for, is_trusted, parse_addr};
use weir_plugin::{register_plugin, BuildContext, Flow, Plugin, PluginInstance, RequestCtx};

/// Route configuration (APISIX 3.x fields).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The variable holding the client's address: `http_x_forwarded_for`, `http_x_real_ip`,
    /// `arg_realip`...
    #[schemars(length(min = 1))]
    pub source: String,
    /// Peers whose `source` is believed (IPs or CIDRs); everyone's when absent.
    #[serde(default)]
    pub trusted_addresses: Option<Vec<String>>,
    /// `http_x_forwarded_for`: walk from the right past `trusted_addresses` (default: the last
    /// address).
    #[serde(default)]
    pub recursive: bool,
}

/// The plugin.
pub struct RealIp;

struct Instance {
    /// The variable without `$`.
    source: String,
    forwarded_for: bool,
    trusted: Option<Vec<Cidr>>,
    recursive: bool,
}

impl Instance {
    fn address(&self, ctx: &RequestCtx) -> Option<(std::net::IpAddr, Option<u16>)> {
        if self.forwarded_for {
            let values = ctx.headers.get_all("x-forwarded-for").iter().filter_map(|v| v.to_str().ok());
            let trusted = self.trusted.as_deref().unwrap_or(&[]);
            // Without trusted addresses APISIX takes the last address, recursive or not.
            let recursive = self.recursive && self.trusted.is_some();
            return from_forwarded_for(values, trusted, recursive).map(|ip| (ip, None));
        }
        parse_addr(&ctx.var(&self.source)?)
    }
}

impl PluginInstance for Instance {
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        if let Some(trusted) = &self.trusted {
            if !is_trusted(trusted, ctx.remote_addr.ip()) {
                return Flow::Continue;
            }
        }
        let Some((ip, port)) = self.address(ctx) else {
            log::debug!("real-ip: no usable address in `{}`", self.source);
            return Flow::Continue;
        };
        ctx.remote_addr = SocketAddr::new(ip, port.unwrap_or(ctx.remote_addr.port()));
        ctx.remote_ip = Arc::from(ip.to_string());
        Flow::Continue
    }
}

impl Plugin for RealIp {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "real-ip"
    }
    fn priority(&self) -> i32 {
        23000
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let source = conf.source.strip_prefix('$').unwrap_or(&conf.source).to_owned();
        if !weir_plugin::template::is_known(&source) {
            return Err(format!("source: unknown variable `{source}`"));
        }
        let trusted = match &conf.trusted_addresses {
            None => {
                log::warn!(
                    "{}: real-ip without trusted_addresses believes `{source}` from any client",
                    ctx.owner.label
                );
                None
            }
            Some(list) => Some(
                list.iter()
                    .enumerate()
                    .map(|(i, a)| Cidr::parse(a).map_err(|e| format!("trusted_addresses[{i}]: {e}")))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(Arc::new(Instance {
            forwarded_for: source == "http_x_forwarded_for",
            source,
            trusted,
            recursive: conf.recursive,
        }))
    }
}

register_plugin!(RealIp);

#[cfg(test)]
mod tests {
    use serde_json::json;
    use weir_plugin::testing::TestRequest;

    fn run(conf: serde_json::Value, peer: &str, headers: &[(&str, &str)], query: &str) -> String {
        let instance = weir_plugin::testing::instance(&super::RealIp, conf).unwrap_or_else(|e| panic!("{e}"));
        let peer = peer.parse().unwrap_or_else(|e| panic!("{peer}: {e}"));
        let mut req = TestRequest::get(&format!("/?{query}")).remote(peer);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let mut ctx = req.build();
        assert!(weir_plugin::testing::run(&[instance], &mut ctx).is_none());
        assert_eq!(&*ctx.remote_ip, ctx.remote_addr.ip().to_string(), "both forms of the address agree");
        ctx.remote_addr.to_string()
    }

    #[test]
    fn the_source_becomes_the_client_only_from_trusted_peers() {
        let conf = json!({"source": "arg_realip", "trusted_addresses": ["127.0.0.0/24"]});
        assert_eq!(run(conf.clone(), "127.0.0.1:999", &[], "realip=1.2.3.4:80"), "1.2.3.4:80");
        assert_eq!(run(conf.clone(), "10.9.9.9:999", &[], "realip=1.2.3.4:80"), "10.9.9.9:999");
        assert_eq!(run(conf, "127.0.0.1:999", &[], "realip=garbage"), "127.0.0.1:999");
        let xff = json!({"source": "http_x_forwarded_for", "trusted_addresses": ["10.0.0.0/8", "127.0.0.1"], "recursive": true});
        let h = [("x-forwarded-for", "6.6.6.6, 5.5.5.5, 10.0.0.3")];
        assert_eq!(run(xff, "127.0.0.1:1", &h, ""), "5.5.5.5:1");
        let last = json!({"source": "http_x_forwarded_for"});
        assert_eq!(run(last, "9.9.9.9:1", &h, ""), "10.0.0.3:1", "no trusted list: APISIX's last address");
    }
}
