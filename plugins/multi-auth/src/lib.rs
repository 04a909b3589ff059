//! `multi-auth`: several authentication methods on one route, as APISIX 3.x's plugin: each
//! auth plugin of `auth_plugins` is tried in order and the first that identifies a consumer
//! wins; when none does, 401 `{"message":"Authorization Failed"}`.
//!
//! The plugins it runs are built by the host (`Services::build_plugin`) with the snapshot's
//! consumers, so each keeps its credential index, answers and checks. A plugin that waits
//! (forward-auth asking its service) is awaited before the next one is tried.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Map;
use weir_plugin::http::StatusCode;
use weir_plugin::{
    register_plugin, BuildContext, Flow, Late, Plugin, PluginInstance, PluginResponse, RequestCtx, Value,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// The auth plugins to try, in order: `[{"basic-auth": {}}, {"key-auth": {}}]`.
    #[schemars(length(min = 2))]
    pub auth_plugins: Vec<Map<String, Value>>,
}

/// The plugin.
pub struct MultiAuth;

struct Instance {
    /// `(name, instance)`, in order.
    plugins: Vec<(String, Arc<dyn PluginInstance>)>,
}

fn failed() -> Flow<'static> {
    Flow::Respond(PluginResponse::message(StatusCode::UNAUTHORIZED, "Authorization Failed"))
}

fn note_failure(name: &str, r: &PluginResponse) {
    log::info!("multi-auth: {name} failed to authenticate the request, code: {}", r.status.as_u16());
}

impl Instance {
    /// The attempts from `from` on, awaiting the plugins that wait.
    async fn from(&self, ctx: &mut RequestCtx, from: usize) -> Flow<'static> {
        for (name, p) in &self.plugins[from..] {
            let mut flow = match p.rewrite(ctx) {
                Flow::Continue => return Flow::Continue,
                Flow::Respond(r) => Flow::Respond(r),
                Flow::Wait(f) => f.await,
            };
            loop {
                match flow {
                    Flow::Continue => return Flow::Continue,
                    Flow::Respond(r) => {
                        note_failure(name, &r);
                        break;
                    }
                    Flow::Wait(f) => flow = f.await,
                }
            }
        }
        failed()
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
    fn rewrite<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        for (i, (name, p)) in self.plugins.iter().enumerate() {
            let waits = match p.rewrite(ctx) {
                Flow::Continue => return Flow::Continue,
                Flow::Respond(r) => {
                    note_failure(name, &r);
                    false
                }
                // This plugin waits: its future is dropped before it ran (futures are lazy),
                // and the attempts go on in one future from this plugin, so the request
                // context is borrowed by one attempt at a time.
                Flow::Wait(_) => true,
            };
            if waits {
                return Flow::wait(self.from(ctx, i));
            }
        }
        failed()
    }
}

impl Plugin for MultiAuth {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "multi-auth"
    }
    fn priority(&self) -> i32 {
        2600
    }
    fn plugin_type(&self) -> Option<&'static str> {
        Some("auth")
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let mut plugins = Vec::new();
        for (i, item) in conf.auth_plugins.iter().enumerate() {
            if item.is_empty() {
                return Err(format!("auth_plugins[{i}]: name one auth plugin, as {{\"key-auth\": {{}}}}"));
            }
            for (name, sub) in item {
                if name == "multi-auth" {
                    return Err(format!("auth_plugins[{i}]: multi-auth cannot run itself"));
                }
                let (instance, kind) = ctx
                    .services
                    .build_plugin(name, sub, ctx.owner)
                    .map_err(|e| format!("auth_plugins[{i}]: plugin {name} check schema failed: {e}"))?;
                if kind != Some("auth") {
                    return Err(format!("auth_plugins[{i}]: {name} plugin is not supported (not an auth plugin)"));
                }
                plugins.push((name.clone(), instance));
            }
        }
        Ok(Arc::new(Instance { plugins }))
    }
}

register_plugin!(MultiAuth);
