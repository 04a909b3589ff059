//! Schema generation: JSON Schemas derived from Rust types with `schemars`, inlined (no `$ref`), so
//! that the document `/v1/schema` reports is self-contained and is exactly what validates input.
//!
//! Optional fields are described by their inner type: an absent key means "not set", and an
//! explicit `null` is rejected. This keeps schemas readable and validation errors precise (no
//! `anyOf [T, null]` wrappers).

use schemars::generate::SchemaSettings;
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// The JSON Schema (draft 2020-12, subschemas inlined, no `$schema`/`title` noise) of `T`.
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut value = serialized_schema_of::<T>();
    strip_nullable(&mut value);
    value
}

/// The schema of `T` as it serializes, for output (response bodies): unlike [`schema_of`],
/// an `Option` field stays nullable, since `None` is written as `null`.
pub fn serialized_schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::draft2020_12()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(map) = &mut value {
        map.remove("title");
    }
    value
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null") && v.as_object().is_some_and(|m| m.len() == 1)
}

/// Removes the `null` alternative schemars adds for `Option<T>`, recursively.
fn strip_nullable(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(Value::Array(types)) = map.get("type") {
                let non_null: Vec<Value> = types.iter().filter(|t| t.as_str() != Some("null")).cloned().collect();
                if non_null.len() < types.len() {
                    let replacement = if non_null.len() == 1 { non_null[0].clone() } else { Value::Array(non_null) };
                    map.insert("type".into(), replacement);
                }
            }
            if let Some(Value::Array(alts)) = map.get("anyOf") {
                if alts.len() == 2 && alts.iter().any(is_null_schema) {
                    let inner = alts.iter().find(|a| !is_null_schema(a)).cloned();
                    map.remove("anyOf");
                    if let Some(Value::Object(inner)) = inner {
                        merge_missing(map, inner);
                    }
                }
            }
            if map.get("default") == Some(&Value::Null) {
                map.remove("default");
            }
            if let Some(Value::Array(e)) = map.get_mut("enum") {
                e.retain(|v| !v.is_null());
            }
            for v in map.values_mut() {
                strip_nullable(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nullable),
        _ => {}
    }
}

fn merge_missing(into: &mut Map<String, Value>, from: Map<String, Value>) {
    for (k, v) in from {
        into.entry(k).or_insert(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Inner {
        a: u8,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Outer {
        name: Option<String>,
        inner: Option<Inner>,
    }

    #[test]
    fn options_are_described_by_their_inner_type() {
        let s = schema_of::<Outer>();
        assert_eq!(s["properties"]["name"]["type"], "string");
        assert_eq!(s["properties"]["inner"]["type"], "object");
        assert!(s["properties"]["inner"].get("anyOf").is_none());
        assert!(s.get("$defs").is_none(), "subschemas must be inlined: {s}");
    }
}
