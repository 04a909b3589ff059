//! APISIX expressions (lua-resty-expr), as route `vars` and a plugin's `_meta.filter` write
//! them, compiled once per configuration and evaluated per request without parsing.
//!
//! - A list of conditions is their AND: `[["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]]`.
//! - A logical operator may come first, with expressions after it, nested at will:
//!   `["OR", [["arg_a", "==", "1"]], ["AND", ["arg_b", "==", "2"], ["arg_c", "==", "3"]]]`
//!   (`"!AND"` and `"!OR"` negate).
//! - A condition is `[var, op, value]`, or `[var, "!", op, value]` to negate it. Operators: `==`,
//!   `~=`, `>`, `<`, `>=`, `<=` (numbers when the value is a number), `~~` (regex), `~*`
//!   (case-insensitive regex), `in` (the value is a list), `has` (the variable, a
//!   comma-separated list, contains the value), `ipmatch` (CIDRs).
//! - Variables are the request's (`uri`, `host`, `arg_*`, `http_*`, `cookie_*`, `remote_addr`,
//!   `server_port`, `request_method`...; [`crate::template::is_known`]). A missing variable
//!   makes every comparison false except `~=`.
//!
//! Compiling refuses what cannot work, naming the place: an unknown operator or variable, a
//! regex that does not compile, a malformed list (`[1].op: unknown operator `=~``).
//!
//! ```
//! use serde_json::json;
//! use weir_plugin::expr::Expr;
//! let e = Expr::compile(&json!([["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]])).expect("valid");
//! let vars = |name: &str| match name { "arg_name" => Some("jack".into()), "http_x_env" => Some("canary".into()), _ => None };
//! assert!(e.eval(&vars));
//! assert!(Expr::compile(&json!([["arg_name", "=~", "x"]])).is_err());
//! ```

use std::borrow::Cow;

use regex::Regex;
use serde_json::Value;

use crate::cidr::Cidr;
use crate::RequestCtx;

/// A compiled expression.
#[derive(Debug, Clone)]
pub enum Expr {
    /// Every one holds (an empty list holds).
    All(Vec<Expr>),
    /// At least one holds.
    Any(Vec<Expr>),
    /// The negation.
    Not(Box<Expr>),
    /// One condition.
    Cond(Cond),
}

/// `[var, op, value]`.
#[derive(Debug, Clone)]
pub struct Cond {
    var: Box<str>,
    /// `http_<name>`'s header, resolved once: a request's lookup allocates nothing.
    header: Option<http::HeaderName>,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
    Eq(Value),
    Ne(Value),
    Gt(f64),
    Lt(f64),
    Ge(f64),
    Le(f64),
    Regex(Regex),
    In(Vec<String>),
    Has(String),
    IpMatch(Vec<Cidr>),
}

fn at(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Expr {
    /// Compiles `v` (see the module documentation); errors name the place in `v`.
    pub fn compile(v: &Value) -> Result<Expr, String> {
        Self::compile_at(v, "")
    }

    fn compile_at(v: &Value, path: &str) -> Result<Expr, String> {
        let Value::Array(items) = v else { return Err(format!("{path}: an expression is a list")) };
        match items.first() {
            Some(Value::String(first)) => {
                let logical = match first.as_str() {
                    "AND" | "and" => Some((false, false)),
                    "OR" | "or" => Some((true, false)),
                    "!AND" | "!and" => Some((false, true)),
                    "!OR" | "!or" => Some((true, true)),
                    _ => None,
                };
                match logical {
                    Some((any, negate)) => {
                        let mut subs = Vec::with_capacity(items.len() - 1);
                        for (i, sub) in items.iter().enumerate().skip(1) {
                            subs.push(Self::compile_at(sub, &at(path, i))?);
                        }
                        let e = if any { Expr::Any(subs) } else { Expr::All(subs) };
                        Ok(if negate { Expr::Not(Box::new(e)) } else { e })
                    }
                    // A single condition where a list of them was expected.
                    None => Cond::compile(items, path),
                }
            }
            _ => {
                let mut all = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    all.push(Self::compile_at(item, &at(path, i))?);
                }
                Ok(Expr::All(all))
            }
        }
    }

    /// Whether the expression holds for the variables `vars` gives.
    pub fn eval<'v>(&self, vars: &dyn Fn(&str) -> Option<Cow<'v, str>>) -> bool {
        match self {
            Expr::All(all) => all.iter().all(|e| e.eval(vars)),
            Expr::Any(any) => any.iter().any(|e| e.eval(vars)),
            Expr::Not(e) => !e.eval(vars),
            Expr::Cond(c) => c.eval(vars(&c.var).as_deref()),
        }
    }

    /// Whether the expression holds for a request.
    pub fn matches(&self, ctx: &RequestCtx) -> bool {
        match self {
            Expr::All(all) => all.iter().all(|e| e.matches(ctx)),
            Expr::Any(any) => any.iter().any(|e| e.matches(ctx)),
            Expr::Not(e) => !e.matches(ctx),
            Expr::Cond(c) => match &c.header {
                Some(h) => c.eval(ctx.headers.get(h).and_then(|v| v.to_str().ok())),
                None => c.eval(ctx.var(&c.var).as_deref()),
            },
        }
    }

    /// The variables the expression reads, in order (a name once per condition naming it).
    pub fn variables(&self) -> Vec<&str> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'e>(&'e self, out: &mut Vec<&'e str>) {
        match self {
            Expr::All(list) | Expr::Any(list) => list.iter().for_each(|e| e.collect(out)),
            Expr::Not(e) => e.collect(out),
            Expr::Cond(c) => out.push(&c.var),
        }
    }
}

impl Cond {
    fn compile(items: &[Value], path: &str) -> Result<Expr, String> {
        let (var, negate, op, value) = match items {
            [Value::String(var), Value::String(op), value] => (var, false, op.as_str(), value),
            [Value::String(var), Value::String(bang), Value::String(op), value] if bang == "!" => {
                (var, true, op.as_str(), value)
            }
            _ => {
                return Err(format!(
                    "{path}: a condition is [variable, operator, value] or [variable, \"!\", operator, value]"
                ))
            }
        };
        if !crate::template::is_known(var) {
            return Err(format!("{path}[0]: unknown variable `{var}`"));
        }
        let number = |v: &Value| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .ok_or_else(|| format!("{path}: `{op}` compares numbers; {v} is not one"))
        };
        let regex = |v: &Value, insensitive: bool| {
            let pattern = v.as_str().ok_or_else(|| format!("{path}: `{op}` takes a regex string"))?;
            regex::RegexBuilder::new(pattern)
                .case_insensitive(insensitive)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| format!("{path}: invalid regex: {e}"))
        };
        let op = match op {
            "==" => Op::Eq(value.clone()),
            "~=" => Op::Ne(value.clone()),
            ">" => Op::Gt(number(value)?),
            "<" => Op::Lt(number(value)?),
            ">=" => Op::Ge(number(value)?),
            "<=" => Op::Le(number(value)?),
            "~~" => Op::Regex(regex(value, false)?),
            "~*" => Op::Regex(regex(value, true)?),
            "in" => match value {
                Value::Array(a) => Op::In(a.iter().map(text).collect()),
                _ => return Err(format!("{path}: `in` takes a list")),
            },
            "has" => Op::Has(text(value)),
            "ipmatch" => {
                let list = match value {
                    Value::Array(a) => a.iter().map(text).collect(),
                    other => vec![text(other)],
                };
                let mut cidrs = Vec::with_capacity(list.len());
                for c in list {
                    cidrs.push(Cidr::parse(&c).map_err(|e| format!("{path}: {e}"))?);
                }
                Op::IpMatch(cidrs)
            }
            other => {
                return Err(format!(
                    "{path}[1]: unknown operator `{other}` (==, ~=, >, <, >=, <=, ~~, ~*, in, has, ipmatch, and ! before one)"
                ))
            }
        };
        let header =
            var.strip_prefix("http_").and_then(|h| http::HeaderName::from_bytes(h.replace('_', "-").as_bytes()).ok());
        let c = Expr::Cond(Cond { var: var.as_str().into(), header, op });
        Ok(if negate { Expr::Not(Box::new(c)) } else { c })
    }

    fn eval(&self, got: Option<&str>) -> bool {
        let Some(got) = got else { return matches!(self.op, Op::Ne(_)) };
        let num = || got.trim().parse::<f64>().ok();
        match &self.op {
            Op::Eq(Value::Number(n)) => num().is_some_and(|g| Some(g) == n.as_f64()),
            Op::Eq(v) => equal(got, v),
            Op::Ne(Value::Number(n)) => num() != n.as_f64(),
            Op::Ne(v) => !equal(got, v),
            Op::Gt(n) => num().is_some_and(|g| g > *n),
            Op::Lt(n) => num().is_some_and(|g| g < *n),
            Op::Ge(n) => num().is_some_and(|g| g >= *n),
            Op::Le(n) => num().is_some_and(|g| g <= *n),
            Op::Regex(r) => r.is_match(got),
            Op::In(list) => list.iter().any(|x| x == got),
            Op::Has(x) => got.split(',').any(|part| part.trim() == x),
            Op::IpMatch(cidrs) => got.parse().is_ok_and(|ip| cidrs.iter().any(|c| c.contains(ip))),
        }
    }
}

fn equal(got: &str, v: &Value) -> bool {
    match v {
        Value::String(s) => got == s,
        Value::Bool(b) => got == if *b { "true" } else { "false" },
        _ => false,
    }
}

/// Fuzzing entry point: any bytes, as JSON, compile or are refused, and a compiled expression
/// evaluates against fixed variables without panicking.
pub fn fuzz_expr(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    if let Ok(e) = Expr::compile(&v) {
        let _ = e.eval(&|name| (name.len() % 2 == 0).then(|| Cow::Owned(format!("{name}-1,127.0.0.1"))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn holds(expr: Value, vars: &[(&str, &str)]) -> bool {
        let e = Expr::compile(&expr).unwrap_or_else(|e| panic!("{e}"));
        e.eval(&|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| Cow::Borrowed(*v)))
    }

    #[test]
    fn apisix_shapes_evaluate() {
        let vars = [("arg_name", "jack"), ("http_x_env", "canary"), ("arg_age", "30"), ("remote_addr", "10.1.2.3")];
        assert!(holds(json!([["arg_name", "==", "jack"], ["http_x_env", "~~", "^ca"]]), &vars));
        assert!(!holds(json!([["arg_name", "==", "jack"], ["http_x_env", "~~", "^prod"]]), &vars));
        assert!(holds(json!(["OR", ["arg_name", "==", "rose"], ["arg_age", ">", 18]]), &vars));
        assert!(holds(
            json!(["OR", [["arg_name", "==", "rose"]], ["AND", ["arg_age", ">=", 30], ["arg_age", "<", "31"]]]),
            &vars
        ));
        assert!(holds(json!([["arg_name", "!", "==", "rose"]]), &vars));
        assert!(holds(json!([["arg_name", "in", ["rose", "jack"]]]), &vars));
        assert!(holds(json!([["http_x_env", "~*", "^CANARY$"]]), &vars));
        assert!(holds(json!([["remote_addr", "ipmatch", ["10.0.0.0/8"]]]), &vars));
        assert!(holds(json!(["!AND", ["arg_name", "==", "rose"]]), &vars));
        assert!(holds(json!([]), &vars), "no condition holds");
        // A missing variable: only ~= holds.
        assert!(!holds(json!([["arg_missing", "==", "x"]]), &vars));
        assert!(holds(json!([["arg_missing", "~=", "x"]]), &vars));
        assert!(!holds(json!([["arg_missing", ">", 1]]), &vars));
        // Numbers compare as numbers; text does not pass for one.
        assert!(holds(json!([["arg_age", "==", 30]]), &vars));
        assert!(!holds(json!([["arg_name", ">", 1]]), &vars));
    }

    #[test]
    fn a_request_matches_as_its_variables_say() {
        let mut ctx = crate::phase::tests_support::ctx();
        ctx.query = "name=jack".into();
        ctx.headers.insert("user-id", http::HeaderValue::from_static("30"));
        ctx.headers.insert("x-api-key", http::HeaderValue::from_static("abc"));
        let e = |v: Value| Expr::compile(&v).unwrap_or_else(|e| panic!("{e}"));
        let three =
            e(json!([["arg_name", "==", "jack"], ["http_user-id", ">", "23"], ["http_X_API_KEY", "~~", "[a-z]+"]]));
        assert!(three.matches(&ctx));
        assert_eq!(three.variables(), ["arg_name", "http_user-id", "http_X_API_KEY"]);
        ctx.headers.insert("user-id", http::HeaderValue::from_static("3"));
        assert!(!three.matches(&ctx));
        assert!(e(json!([["http_missing", "~=", "x"]])).matches(&ctx), "a missing header: only ~= holds");
        ctx.headers.insert("content-type", http::HeaderValue::from_static("application/x-www-form-urlencoded"));
        ctx.body = Some(bytes::Bytes::from_static(b"a=1&id=1%202&name=j+k&bad=%zz"));
        assert!(e(json!([["post_arg_id", "==", "1 2"], ["post_arg_name", "==", "j k"]])).matches(&ctx));
        assert!(e(json!([["post_arg_bad", "==", "%zz"]])).matches(&ctx), "a stray % stays as it is");
        ctx.headers.insert("content-type", http::HeaderValue::from_static("application/json"));
        assert!(!e(json!([["post_arg_a", "==", "1"]])).matches(&ctx), "only form bodies have post args");
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_place() {
        let e = |v: Value| Expr::compile(&v).err().unwrap_or_default();
        assert_eq!(
            e(json!([["arg_a", "=~", "x"]])),
            "[0][1]: unknown operator `=~` (==, ~=, >, <, >=, <=, ~~, ~*, in, has, ipmatch, and ! before one)"
        );
        assert!(e(json!([["arg_a", "~~", "("]])).starts_with("[0]: invalid regex"));
        assert_eq!(e(json!([["nope", "==", "x"]])), "[0][0]: unknown variable `nope`");
        assert!(e(json!(["OR", ["arg_a", "==", "1"], ["arg_b", ">", "x"]])).starts_with("[2]: `>` compares numbers"));
        assert!(!e(json!("arg_a == 1")).is_empty());
        assert!(!e(json!([["arg_a", "in", "x"]])).is_empty());
        assert!(!e(json!([["remote_addr", "ipmatch", "not-a-cidr"]])).is_empty());
    }
}
