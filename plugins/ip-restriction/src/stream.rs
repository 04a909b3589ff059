//! The stream side of `ip-restriction`: closes a TCP connection (or drops a UDP session) whose
//! client the list refuses, before any upstream is contacted.

use std::sync::Arc;

use serde_json::Value;
use weir_plugin::{schema_of, StreamCtx, StreamFlow, StreamInstance, StreamPlugin};

use crate::{Conf, Rule};

/// The stream plugin.
pub struct IpRestriction;

struct Instance(Rule);

impl StreamInstance for Instance {
    fn preread(&self, ctx: &mut StreamCtx) -> StreamFlow {
        let ip = ctx.remote_addr.ip();
        if self.0.refuses(ip) {
            return StreamFlow::Close(format!("client {ip} {}", self.0.reason()));
        }
        StreamFlow::Continue
    }
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
        Ok(Arc::new(Instance(Rule::new(&c)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    #[test]
    fn refused_clients_are_closed() {
        let p = IpRestriction;
        let i = p
            .build(&serde_json::json!({"blacklist": ["127.0.0.0/8"], "message": "ignored on streams"}))
            .unwrap_or_else(|e| panic!("{e}"));
        let local = SocketAddr::from(([127, 0, 0, 1], 9100));
        let mut ctx = StreamCtx::new("tcp", SocketAddr::from(([127, 0, 0, 9], 5000)), local);
        assert!(matches!(i.preread(&mut ctx), StreamFlow::Close(r) if r == "client 127.0.0.9 is in the blacklist"));
        let mut ctx = StreamCtx::new("tcp", SocketAddr::from(([10, 0, 0, 9], 5000)), local);
        assert!(matches!(i.preread(&mut ctx), StreamFlow::Continue));
    }
}
