//! Secret references in plugin configurations: a string value `$env://NAME` (or
//! `$env://NAME/field` for a JSON object held by the variable) stands for the value of the
//! environment variable, as in APISIX.
//!
//! References are resolved when a snapshot is built, on a copy: the stored resource (the file,
//! etcd, what the Admin API returns) keeps the reference, never the secret. Messages about a
//! resolved configuration pass through [`Resolved::redact`], so a schema error about a secret
//! names its reference, never its value.

use std::borrow::Cow;

use serde_json::Value;

/// The prefix of an environment reference.
const ENV: &str = "$env://";

/// A configuration with its references resolved.
pub struct Resolved<'a> {
    /// The configuration to check and build (borrowed when it holds no reference).
    pub value: Cow<'a, Value>,
    /// `(secret, reference)` of each resolved reference.
    secrets: Vec<(String, String)>,
}

impl Resolved<'_> {
    /// `text` with every resolved secret replaced by its reference.
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (secret, reference) in &self.secrets {
            if !secret.is_empty() {
                out = out.replace(secret.as_str(), reference);
            }
        }
        out
    }
}

/// Resolves every reference in `conf` from the process environment. An error names the
/// reference's key path (dotted, from `conf`) and why: an unset variable, a missing field, or
/// a secret manager Weir does not have.
pub fn resolve(conf: &Value) -> Result<Resolved<'_>, (String, String)> {
    resolve_with(conf, &|name| std::env::var(name).ok())
}

fn resolve_with<'a>(conf: &'a Value, env: &dyn Fn(&str) -> Option<String>) -> Result<Resolved<'a>, (String, String)> {
    if !holds_reference(conf) {
        return Ok(Resolved { value: Cow::Borrowed(conf), secrets: Vec::new() });
    }
    let mut value = conf.clone();
    let mut secrets = Vec::new();
    walk(&mut value, String::new(), env, &mut secrets)?;
    Ok(Resolved { value: Cow::Owned(value), secrets })
}

fn holds_reference(v: &Value) -> bool {
    match v {
        Value::String(s) => s.starts_with(ENV) || s.starts_with("$secret://"),
        Value::Array(a) => a.iter().any(holds_reference),
        Value::Object(o) => o.values().any(holds_reference),
        _ => false,
    }
}

fn walk(
    v: &mut Value,
    path: String,
    env: &dyn Fn(&str) -> Option<String>,
    secrets: &mut Vec<(String, String)>,
) -> Result<(), (String, String)> {
    match v {
        Value::String(s) if s.starts_with("$secret://") => {
            Err((path, "secret managers (`$secret://`) are not supported: give the value as `$env://NAME`".into()))
        }
        Value::String(s) => {
            let Some(reference) = s.strip_prefix(ENV) else { return Ok(()) };
            let (name, field) = match reference.split_once('/') {
                Some((n, f)) => (n, Some(f)),
                None => (reference, None),
            };
            if name.is_empty() {
                return Err((path, format!("`{s}` names no environment variable")));
            }
            let Some(raw) = env(name) else {
                return Err((path, format!("environment variable `{name}` (from `{s}`) is not set")));
            };
            let secret = match field {
                None => raw,
                Some(f) => match serde_json::from_str::<Value>(&raw).ok().as_ref().and_then(|j| j.get(f)) {
                    Some(Value::String(x)) => x.clone(),
                    Some(other) => other.to_string(),
                    None => {
                        return Err((path, format!("environment variable `{name}` holds no JSON object with `{f}`")))
                    }
                },
            };
            secrets.push((secret.clone(), s.clone()));
            *s = secret;
            Ok(())
        }
        Value::Array(a) => {
            for (i, item) in a.iter_mut().enumerate() {
                walk(item, format!("{path}[{i}]"), env, secrets)?;
            }
            Ok(())
        }
        Value::Object(o) => {
            for (k, item) in o.iter_mut() {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                walk(item, p, env, secrets)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(name: &str) -> Option<String> {
        match name {
            "JWT_SECRET" => Some("s3cr3t-value".into()),
            "KEYS" => Some(r#"{"a": "from-json"}"#.into()),
            _ => None,
        }
    }

    #[test]
    fn references_resolve_on_a_copy_and_redact() {
        let conf = json!({"key": "jack", "secret": "$env://JWT_SECRET", "list": ["$env://KEYS/a"]});
        let r = resolve_with(&conf, &env).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(r.value["secret"], "s3cr3t-value");
        assert_eq!(r.value["list"][0], "from-json");
        assert_eq!(conf["secret"], "$env://JWT_SECRET", "the stored configuration keeps the reference");
        assert_eq!(r.redact("secret: \"s3cr3t-value\" is too short"), "secret: \"$env://JWT_SECRET\" is too short");
    }

    #[test]
    fn configurations_without_references_are_borrowed() {
        let conf = json!({"key": "plain"});
        assert!(matches!(resolve_with(&conf, &env).map(|r| r.value), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn unusable_references_are_refused_with_their_path() {
        let e = resolve_with(&json!({"a": {"b": "$env://NOPE"}}), &env).err();
        assert_eq!(e, Some(("a.b".into(), "environment variable `NOPE` (from `$env://NOPE`) is not set".into())));
        assert!(resolve_with(&json!({"a": "$env://KEYS/zz"}), &env).is_err());
        assert!(resolve_with(&json!({"a": "$secret://vault/1/x"}), &env).is_err());
        assert!(resolve_with(&json!({"a": "$env://"}), &env).is_err());
    }
}
