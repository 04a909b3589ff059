//! What the host does for plugins while they are built (`weir_plugin::Services`): its HTTP
//! client (registered by the data plane, which owns connections) and upstreams compiled from a
//! plugin's configuration, for `RequestCtx::upstream`.

use std::sync::{Arc, OnceLock};

use serde_json::Value;
use weir_plugin::services::{LocalTask, SendFuture};
use weir_plugin::{HttpClient, NoServices, OutboundRequest, Services, UpstreamRef};

use crate::resources::model::{parse_node_key, Nodes, Upstream};
use crate::tables::upstream::CompiledUpstream;
use crate::tables::KindSchemas;

static CLIENT: OnceLock<Arc<dyn HttpClient>> = OnceLock::new();

/// Registers the host's HTTP client (the data plane does, at start).
pub fn set_http_client(client: Arc<dyn HttpClient>) {
    let _ = CLIENT.set(client);
}

/// The host's services as plugins see them.
pub struct HostServices;

/// The client plugins hold: it finds the registered one when a request is sent, so that
/// instances built before the data plane started use it too.
struct LateClient;

impl HttpClient for LateClient {
    fn send(&self, req: OutboundRequest) -> SendFuture {
        match CLIENT.get() {
            Some(c) => c.send(req),
            None => NoServices.http_client().send(req),
        }
    }

    fn spawn(&self, task: LocalTask) -> bool {
        CLIENT.get().is_some_and(|c| c.spawn(task))
    }
}

impl Services for HostServices {
    fn http_client(&self) -> Arc<dyn HttpClient> {
        Arc::new(LateClient)
    }

    fn compile_upstream(&self, conf: &Value) -> Result<UpstreamRef, String> {
        if let Err(issues) = KindSchemas::get().kind("upstream").check(conf) {
            let all: Vec<String> = issues.iter().map(ToString::to_string).collect();
            return Err(all.join("; "));
        }
        let upstream: Upstream = serde_json::from_value(conf.clone()).map_err(|e| e.to_string())?;
        if let Nodes::Map(map) = &upstream.nodes {
            for key in map.keys() {
                parse_node_key(key).map_err(|e| format!("nodes.{key}: {e}"))?;
            }
        }
        let (compiled, warnings) =
            CompiledUpstream::compile(("plugins", Arc::from("")), Arc::new(upstream), &Default::default());
        for w in warnings {
            log::warn!("upstream of a plugin: {w}");
        }
        Ok(UpstreamRef::Compiled(Arc::new(compiled)))
    }
}
