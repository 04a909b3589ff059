//! `example-plugin`: a minimal plugin showing every part of the SDK (configuration, metadata,
//! control endpoints, a request hook). Priority 0, version 0.1, like the peer's example plugin.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use weir_plugin::{
    register_plugin, schema_of, BuildContext, ControlEndpoint, ControlResponse, Late, Plugin, PluginInstance, Value,
};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// A required non-negative integer.
    #[schemars(range(min = 0))]
    pub i: i64,
    /// An optional string.
    #[serde(default)]
    pub s: Option<String>,
    /// An optional non-empty list of integers.
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub t: Option<Vec<i64>>,
    /// An optional IP address.
    #[serde(default)]
    pub ip: Option<std::net::IpAddr>,
    /// An optional port.
    #[serde(default)]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
    /// An optional flag.
    #[serde(default)]
    pub flag: Option<bool>,
}

/// Plugin metadata (`plugin_metadata` resource with `id: example-plugin`).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// An integer.
    pub ikey: i64,
    /// A string.
    pub skey: String,
}

/// The plugin.
pub struct ExamplePlugin;

struct Instance;
impl PluginInstance for Instance {
    fn late(&self) -> Late {
        Late::NONE
    }
}

impl Plugin for ExamplePlugin {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "example-plugin"
    }
    fn priority(&self) -> i32 {
        0
    }
    fn version(&self) -> f64 {
        0.1
    }
    fn metadata_schema(&self) -> Option<Value> {
        Some(schema_of::<Metadata>())
    }
    fn control_endpoints(&self) -> Vec<ControlEndpoint> {
        vec![
            ControlEndpoint::sync(&["GET"], &["/v1/plugin/example-plugin/hello"], |req| {
                if req.has_arg("json") {
                    ControlResponse::json(200, &serde_json::json!({ "msg": "world" }))
                } else {
                    ControlResponse::text(200, "world\n")
                }
            }),
            ControlEndpoint::sync(&["GET"], &["/v1/plugin/example-plugin/echo/:word"], |req| {
                match req.param("word") {
                    Some(word) => ControlResponse::text(200, format!("{word}\n")),
                    // Literal router mode: the URI matched as written, nothing was captured.
                    None => ControlResponse::text(200, ":word\n"),
                }
            }),
        ]
    }
    fn build(&self, conf: Conf, _ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let _ = conf;
        Ok(Arc::new(Instance))
    }
}

register_plugin!(ExamplePlugin);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_requires_i_and_rejects_unknown_keys() {
        let schema = weir_plugin::DynPlugin::schema(&ExamplePlugin);
        assert_eq!(schema["required"], serde_json::json!(["i"]));
        assert_eq!(schema["additionalProperties"], serde_json::json!(false));
        assert_eq!(schema["properties"]["i"]["type"], "integer");
    }

    #[test]
    fn metadata_schema_requires_both_keys() {
        let schema = ExamplePlugin.metadata_schema().unwrap_or_default();
        let mut required: Vec<_> = schema["required"].as_array().cloned().unwrap_or_default();
        required.sort_by_key(|v| v.to_string());
        assert_eq!(required, vec![serde_json::json!("ikey"), serde_json::json!("skey")]);
    }
}
