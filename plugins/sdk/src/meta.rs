//! `_meta`: the key APISIX reserves in every plugin configuration for the host's own settings
//! (`disable`, `priority`, `filter`, `error_response`). The SDK adds it to every plugin schema,
//! and strips it before the plugin's own parser sees the configuration; the host reads it.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The reserved key.
pub const META: &str = "_meta";

/// What `_meta` may hold.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// The plugin is configured but does not run.
    #[serde(default)]
    pub disable: bool,
    /// Overrides the plugin's priority on this resource (higher runs first).
    pub priority: Option<i32>,
    /// APISIX's expression deciding per request whether the plugin runs (`[["arg_v", "==", "1"]]`,
    /// see [`crate::expr`]), compiled at load (an invalid one refuses the configuration) and
    /// evaluated before each of the plugin's phases.
    pub filter: Option<Vec<Value>>,
    /// The body of this plugin's own error answers (status 400 and above) instead of its own:
    /// a string as it is, an object as JSON.
    pub error_response: Option<Value>,
    /// APISIX's log level of the plugin's messages; accepted, and ignored (Weir's log level is
    /// process-wide).
    pub log_level: Option<String>,
}

/// `schema` with `_meta` added to its properties (for an object schema).
pub fn with_meta(mut schema: Value) -> Value {
    if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert(META.into(), crate::schema_of::<Meta>());
    } else if let Value::Object(map) = &mut schema {
        if map.get("type").and_then(Value::as_str) == Some("object") {
            let mut props = Map::new();
            props.insert(META.into(), crate::schema_of::<Meta>());
            map.insert("properties".into(), Value::Object(props));
        }
    }
    schema
}

/// A copy of `conf` without `_meta` (only made when a configuration has one).
pub fn without_meta(conf: &Value) -> Value {
    match conf {
        Value::Object(map) => {
            Value::Object(map.iter().filter(|(k, _)| *k != META).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

/// The `_meta` of a validated configuration (`Ok(None)` without one).
pub fn meta_of(conf: &Value) -> Result<Option<Meta>, String> {
    conf.get(META).map(|m| crate::parse_conf::<Meta>(m).map_err(|e| format!("{META}: {e}"))).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Conf {
        a: u32,
    }

    #[test]
    fn meta_is_reserved_and_stripped() {
        let schema = with_meta(crate::schema_of::<Conf>());
        assert!(schema["properties"]["_meta"].is_object());
        assert_eq!(schema["additionalProperties"], json!(false));
        let conf = json!({"a": 1, "_meta": {"disable": true}});
        assert_eq!(without_meta(&conf), json!({"a": 1}));
        assert!(meta_of(&conf).ok().flatten().is_some_and(|m| m.disable));
        assert!(meta_of(&json!({"a": 1})).ok().flatten().is_none());
    }
}
