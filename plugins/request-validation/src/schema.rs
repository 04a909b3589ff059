//! The configured JSON Schemas, compiled once: draft 7 unless the schema names its own
//! (`$schema`), `pattern` with the `regex` crate (linear time, so a schema cannot be made to
//! backtrack on a request's data), nothing fetched over the network. A schema that does not
//! compile is refused with the place in it (`body_schema.properties.age.type: ...`).

use std::fmt::Write as _;

use jsonschema::{Draft, PatternOptions, Validator};
use serde_json::Value;

/// Compiles `schema`, the value of configuration field `field`.
pub fn compile(field: &str, schema: &Value) -> Result<Validator, String> {
    let mut options = jsonschema::options().with_pattern_options(PatternOptions::regex());
    if schema.get("$schema").is_none() {
        options = options.with_draft(Draft::Draft7);
    }
    options.build(schema).map_err(|e| {
        let at = dotted(schema, e.instance_path().as_str());
        format!("{field}{at}: {e}")
    })
}

/// A JSON pointer into `root` as Weir writes key paths: `.properties.a.items[0]`.
fn dotted(root: &Value, pointer: &str) -> String {
    let mut out = String::new();
    let mut at = Some(root);
    for raw in pointer.split('/').skip(1) {
        let seg = raw.replace("~1", "/").replace("~0", "~");
        match at {
            Some(Value::Array(items)) if seg.parse::<usize>().is_ok() => {
                let _ = write!(out, "[{seg}]");
                at = seg.parse::<usize>().ok().and_then(|i| items.get(i));
            }
            _ => {
                out.push('.');
                out.push_str(&seg);
                at = at.and_then(|v| v.get(&seg));
            }
        }
    }
    out
}

/// The first reason `instance` fails `validator`, for the client (bounded: it may quote the
/// request's own data): `property "/a/0" validation failed: ...`, as APISIX words it.
pub fn first_error(validator: &Validator, instance: &Value) -> Option<String> {
    let e = validator.iter_errors(instance).next()?;
    let path = e.instance_path().as_str().to_owned();
    let mut msg = if path.is_empty() { e.to_string() } else { format!("property \"{path}\" validation failed: {e}") };
    if msg.len() > 512 {
        let mut end = 509;
        while !msg.is_char_boundary(end) {
            end -= 1;
        }
        msg.truncate(end);
        msg.push_str("...");
    }
    Some(msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemas_that_cannot_work_are_refused_with_their_place() {
        let e = compile("body_schema", &json!({"type": "object", "properties": {"age": {"type": "integr"}}}))
            .err()
            .unwrap_or_default();
        assert!(e.starts_with("body_schema.properties.age.type: "), "{e}");
        let e = compile("header_schema", &json!({"properties": {"a": {"type": "string", "pattern": "(?=look)"}}}))
            .err()
            .unwrap_or_default();
        assert!(e.starts_with("header_schema"), "{e}");
        let e = compile("body_schema", &json!({"required": ["a", 1]})).err().unwrap_or_default();
        assert!(e.starts_with("body_schema.required[1]: "), "{e}");
        assert!(compile("body_schema", &json!({"$ref": "http://example.com/schema.json"})).is_err(), "no network");
    }

    #[test]
    fn errors_are_bounded() {
        let v = compile("body_schema", &json!({"type": "object", "properties": {"a": {"type": "integer"}}}))
            .unwrap_or_else(|e| panic!("{e}"));
        let long = json!({"a": "x".repeat(10_000)});
        let msg = first_error(&v, &long).unwrap_or_default();
        assert!(msg.starts_with("property \"/a\" validation failed: ") && msg.len() <= 512, "{msg}");
        assert_eq!(first_error(&v, &json!({"a": 1})), None);
    }
}
