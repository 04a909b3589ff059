//! Validation of configuration documents against JSON Schemas, with messages a person can act on:
//! the dotted key path (`gateway.control.port`, `routes[2].upstream.nodes`), the reason, and a
//! "did you mean" for unknown keys that are close to a known one.

use std::fmt;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::ValidationError;
use serde_json::Value;

/// One problem found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issue {
    /// Dotted path of the offending key (empty for the document root).
    pub path: String,
    /// Why it is wrong.
    pub reason: String,
}

impl Issue {
    /// An issue at `path`.
    pub fn new(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Issue { path: path.into(), reason: reason.into() }
    }
    /// The same issue, located under key path `prefix` (e.g. `plugins.key-auth`).
    pub fn under(self, prefix: &str) -> Self {
        let path = match (prefix.is_empty(), self.path.is_empty()) {
            (true, _) => self.path,
            (false, true) => prefix.to_owned(),
            (false, false) if self.path.starts_with('[') => format!("{prefix}{}", self.path),
            (false, false) => format!("{prefix}.{}", self.path),
        };
        Issue { path, reason: self.reason }
    }

    /// The same issue, inside the resource named `owner` (e.g. `routes[0] (id 1)`), which is
    /// written before the key path: `routes[0] (id 1): upstream.nodes`.
    pub fn in_resource(self, owner: &str) -> Self {
        let path = if self.path.is_empty() { owner.to_owned() } else { format!("{owner}: {}", self.path) };
        Issue { path, reason: self.reason }
    }
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.path, self.reason)
        }
    }
}

/// A JSON Schema together with its compiled validator. The schema is what `/v1/schema` reports;
/// the validator is built from that very value.
pub struct CompiledSchema {
    schema: Value,
    validator: jsonschema::Validator,
}

impl CompiledSchema {
    /// Compiles `schema`.
    pub fn new(schema: Value) -> Result<Self, String> {
        let validator = jsonschema::validator_for(&schema).map_err(|e| format!("invalid schema: {e}"))?;
        Ok(CompiledSchema { schema, validator })
    }

    /// The schema document.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Validates `instance`; on failure, every problem found, each with its path.
    pub fn check(&self, instance: &Value) -> Result<(), Vec<Issue>> {
        let mut issues = Vec::new();
        for error in self.validator.iter_errors(instance) {
            describe(&error, instance, &self.schema, &mut issues);
        }
        issues.dedup();
        if issues.is_empty() {
            Ok(())
        } else {
            Err(issues)
        }
    }
}

fn describe(error: &ValidationError<'_>, root: &Value, schema: &Value, out: &mut Vec<Issue>) {
    let path = dotted(root, error.instance_path().as_str());
    match error.kind() {
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            let known = known_keys(schema, error.schema_path().as_str());
            for key in unexpected {
                let reason = match did_you_mean(key, &known) {
                    Some(s) => format!("unknown key (did you mean `{s}`?)"),
                    None if known.is_empty() => "unknown key".to_owned(),
                    None => format!("unknown key (known keys: {})", known.join(", ")),
                };
                out.push(Issue::new(join(&path, key), reason));
            }
        }
        ValidationErrorKind::Required { property } => {
            let key = property.as_str().map(str::to_owned).unwrap_or_else(|| property.to_string());
            out.push(Issue::new(join(&path, &key), "required key is missing"));
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(set) => set.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(" or "),
            };
            out.push(Issue::new(path, format!("expected {expected}, got {}", show(error.instance()))));
        }
        ValidationErrorKind::AnyOf { context } | ValidationErrorKind::OneOfNotValid { context } => {
            // Branches whose failure is a type mismatch at this very location are alternatives of
            // another shape; when exactly one branch has the right shape, its errors are the story.
            let here = error.instance_path().as_str();
            let plausible: Vec<&Vec<ValidationError<'static>>> = context
                .iter()
                .filter(|branch| {
                    !branch.iter().any(|e| {
                        e.instance_path().as_str() == here
                            && matches!(
                                e.kind(),
                                ValidationErrorKind::Type { .. } | ValidationErrorKind::Constant { .. }
                            )
                    })
                })
                .collect();
            if plausible.len() == 1 {
                for e in plausible[0] {
                    describe(e, root, schema, out);
                }
            } else {
                let forms: Vec<String> = context.iter().filter_map(|b| b.first()).map(|e| e.to_string()).collect();
                out.push(Issue::new(path, format!("matches none of the accepted forms ({})", forms.join("; "))));
            }
        }
        _ => out.push(Issue::new(path, error.to_string())),
    }
}

fn show(v: &Value) -> String {
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    match v {
        Value::Array(_) | Value::Object(_) | Value::Null => kind.to_owned(),
        other => format!("{kind} {other}"),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

/// Turns a JSON pointer into a dotted path, using the document to tell array indices from keys.
pub fn dotted(root: &Value, pointer: &str) -> String {
    let mut out = String::new();
    let mut cur = Some(root);
    for raw in pointer.split('/').skip(1) {
        let seg = unescape(raw);
        match cur {
            Some(Value::Array(items)) => {
                out.push_str(&format!("[{seg}]"));
                cur = seg.parse::<usize>().ok().and_then(|i| items.get(i));
            }
            other => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(&seg);
                cur = other.and_then(|v| v.get(&seg));
            }
        }
    }
    out
}

/// The property names of the schema object owning the keyword at `schema_pointer`.
fn known_keys(schema: &Value, schema_pointer: &str) -> Vec<String> {
    let parent = schema_pointer.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
    schema
        .pointer(parent)
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|props| props.keys().cloned().collect())
        .unwrap_or_default()
}

/// The closest candidate to `input`, if it is close enough to be a plausible typo.
pub fn did_you_mean<'a>(input: &str, candidates: &'a [String]) -> Option<&'a str> {
    let limit = (input.chars().count() / 3).max(1);
    candidates
        .iter()
        .map(|c| (edit_distance(input, c), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

/// Edit distance counting insertions, deletions, substitutions and adjacent transpositions
/// (optimal string alignment), so `prot` is one edit away from `port`.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> CompiledSchema {
        CompiledSchema::new(json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "control": {
                    "type": "object",
                    "additionalProperties": false,
                    "properties": {"port": {"type": "integer", "maximum": 65535}, "ip": {"type": "string"}}
                },
                "list": {"type": "array", "items": {"type": "object", "required": ["a"]}}
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn unknown_key_gets_a_suggestion() {
        let err = schema().check(&json!({"control": {"prot": 1}})).unwrap_err();
        assert_eq!(err, vec![Issue::new("control.prot", "unknown key (did you mean `port`?)")]);
    }

    #[test]
    fn far_unknown_key_lists_known_keys() {
        let err = schema().check(&json!({"control": {"zzzzzz": 1}})).unwrap_err();
        assert_eq!(err[0].path, "control.zzzzzz");
        assert!(err[0].reason.contains("known keys: ip, port"), "{}", err[0].reason);
    }

    #[test]
    fn paths_show_array_indices_and_reasons() {
        let err = schema().check(&json!({"list": [{"a": 1}, {}], "control": {"port": 70000}})).unwrap_err();
        let text: Vec<String> = err.iter().map(|i| i.to_string()).collect();
        assert!(text.contains(&"list[1].a: required key is missing".to_owned()), "{text:?}");
        assert!(text.iter().any(|t| t.starts_with("control.port: 70000 is greater than")), "{text:?}");
    }

    #[test]
    fn type_errors_say_what_was_expected() {
        let err = schema().check(&json!({"control": {"port": "x"}})).unwrap_err();
        assert_eq!(err[0].to_string(), "control.port: expected integer, got string \"x\"");
    }

    #[test]
    fn edit_distances() {
        assert_eq!(edit_distance("prot", "port"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(did_you_mean("pluginz", &["plugins".into(), "routes".into()]), Some("plugins"));
        assert_eq!(did_you_mean("x", &["plugins".into()]), None);
    }
}
