//! Limits given as numbers or as variables: APISIX 3.16+ lets `count`, `conn` and `burst` be a
//! string resolved per request (`"$http_x_quota"`, `"${http_x_custom_conn ?? 5}"`: the value of
//! the variable, or the default after `??` when it is absent). Compiled once (every variable
//! checked); resolved per request into a whole number, refused (as APISIX does) when it is not
//! one, not positive (zero allowed where the field allows it) or beyond 2^53 - 1.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde::Deserialize;

use super::key::Var;
use crate::RequestCtx;

/// A number, or a string of variables that resolves to one (the configuration's shape).
#[derive(Debug, Clone, serde::Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum NumberOrVar {
    /// A number as written.
    Number(u64),
    /// Variables, resolved per request.
    Text(String),
}

#[derive(Debug, Clone)]
enum Part {
    Text(Box<str>),
    Var { var: Var, default: Option<Box<str>> },
}

/// A compiled [`NumberOrVar`].
#[derive(Debug, Clone)]
pub struct Amount(Inner);

#[derive(Debug, Clone)]
enum Inner {
    /// Known at build.
    Fixed(u64),
    /// Resolved per request; `allow_zero` for `burst`.
    Resolved { parts: Vec<Part>, allow_zero: bool },
}

/// The largest whole number APISIX accepts (what a double holds exactly).
const MAX_SAFE: u64 = (1 << 53) - 1;

impl Amount {
    /// Compiles `v` (`what` names the field in messages). `allow_zero`: zero is a valid value.
    pub fn compile(v: &NumberOrVar, what: &str, allow_zero: bool) -> Result<Amount, String> {
        match v {
            NumberOrVar::Number(n) => {
                if *n == 0 && !allow_zero {
                    return Err(format!("{what}: must be greater than 0"));
                }
                Ok(Amount(Inner::Fixed(*n)))
            }
            NumberOrVar::Text(t) => {
                let parts = parse(t).map_err(|e| format!("{what}: {e}"))?;
                if !parts.iter().any(|p| matches!(p, Part::Var { .. })) {
                    // A number in a string: checked once, here.
                    let n = check(t.trim(), allow_zero).map_err(|e| format!("{what}: {e}"))?;
                    return Ok(Amount(Inner::Fixed(n)));
                }
                Ok(Amount(Inner::Resolved { parts, allow_zero }))
            }
        }
    }

    /// The value for this request.
    pub fn get(&self, ctx: &RequestCtx) -> Result<u64, String> {
        match &self.0 {
            Inner::Fixed(n) => Ok(*n),
            Inner::Resolved { parts, allow_zero } => {
                let mut text = String::new();
                for p in parts {
                    match p {
                        Part::Text(t) => text.push_str(t),
                        Part::Var { var, default } => match (var.get(ctx), default) {
                            (Some(v), _) => text.push_str(&v),
                            (None, Some(d)) => text.push_str(d),
                            (None, None) => {}
                        },
                    }
                }
                check(text.trim(), *allow_zero)
            }
        }
    }

    /// The value if it does not depend on the request.
    pub fn fixed(&self) -> Option<u64> {
        match &self.0 {
            Inner::Fixed(n) => Some(*n),
            Inner::Resolved { .. } => None,
        }
    }
}

fn check(text: &str, allow_zero: bool) -> Result<u64, String> {
    let n: f64 = text.parse().map_err(|_| format!("resolved value {text:?} is not a number"))?;
    if !n.is_finite() || n.fract() != 0.0 {
        return Err(format!("resolved value must be an integer, got {text}"));
    }
    if n < 0.0 || (n == 0.0 && !allow_zero) {
        let bound = if allow_zero { "non-negative" } else { "positive" };
        return Err(format!("resolved value must be a {bound} number, got {text}"));
    }
    if n > MAX_SAFE as f64 {
        return Err(format!("resolved value exceeds the safe integer range (2^53-1), got {text}"));
    }
    Ok(n as u64)
}

/// `$name`, `${name}`, `${ name ?? default }` and text (`\$` is a literal `$`).
fn parse(t: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = t;
    while let Some(at) = rest.find(['$', '\\']) {
        text.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(escaped) = tail.strip_prefix("\\$") {
            text.push('$');
            rest = escaped;
            continue;
        }
        if let Some(after) = tail.strip_prefix('\\') {
            text.push('\\');
            rest = after;
            continue;
        }
        let after = &tail[1..];
        let (inner, next) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').ok_or_else(|| format!("unclosed `${{` in `{t}`"))?;
            (braced[..end].trim(), &braced[end + 1..])
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let (name, default) = match inner.split_once("??") {
            Some((n, d)) => (n.trim(), Some(d.trim())),
            None => (inner, None),
        };
        if name.is_empty() {
            return Err(format!("`$` must be followed by a variable name in `{t}`"));
        }
        if !text.is_empty() {
            parts.push(Part::Text(std::mem::take(&mut text).into()));
        }
        parts.push(Part::Var { var: Var::compile(name)?, default: default.map(Into::into) });
        rest = next;
    }
    text.push_str(rest);
    if !text.is_empty() {
        parts.push(Part::Text(text.into()));
    }
    Ok(parts)
}

impl std::fmt::Display for Amount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Inner::Fixed(n) => write!(f, "{n}"),
            Inner::Resolved { parts, .. } => {
                for p in parts {
                    match p {
                        Part::Text(t) => f.write_str(t)?,
                        Part::Var { var, default } => {
                            write!(f, "${{{var:?}")?;
                            if let Some(d) = default {
                                write!(f, " ?? {d}")?;
                            }
                            f.write_char('}')?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::tests_support::ctx;
    use http::HeaderValue;

    fn amount(v: serde_json::Value, zero: bool) -> Result<Amount, String> {
        let v: NumberOrVar = serde_json::from_value(v).map_err(|e| e.to_string())?;
        Amount::compile(&v, "conn", zero)
    }

    #[test]
    fn numbers_variables_and_defaults() {
        let mut c = ctx();
        assert_eq!(amount(serde_json::json!(5), false).and_then(|a| a.get(&c)), Ok(5));
        assert!(amount(serde_json::json!(0), false).is_err());
        assert_eq!(amount(serde_json::json!("7"), false).map(|a| a.fixed()), Ok(Some(7)));
        let a = amount(serde_json::json!("${http_x_custom_conn ?? 5}"), false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.get(&c), Ok(5), "absent: the default");
        c.headers.insert("x-custom-conn", HeaderValue::from_static("12"));
        assert_eq!(a.get(&c), Ok(12));
        c.headers.insert("x-custom-conn", HeaderValue::from_static("1.5"));
        assert!(a.get(&c).is_err(), "not an integer");
        c.headers.insert("x-custom-conn", HeaderValue::from_static("-3"));
        assert!(a.get(&c).is_err());
        c.headers.insert("x-custom-conn", HeaderValue::from_static("9007199254740993"));
        assert!(a.get(&c).is_err(), "beyond 2^53-1");
        c.headers.insert("x-custom-conn", HeaderValue::from_static("nan"));
        assert!(a.get(&c).is_err());
        let b = amount(serde_json::json!("$http_x_burst"), true).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.get(&c).is_err(), "absent without a default: empty, not a number");
        c.headers.insert("x-burst", HeaderValue::from_static("0"));
        assert_eq!(b.get(&c), Ok(0), "burst may be zero");
        assert!(amount(serde_json::json!("${nope ?? 1}"), false).is_err(), "unknown variables refused at load");
        assert!(amount(serde_json::json!("${http_x"), false).is_err());
    }
}
