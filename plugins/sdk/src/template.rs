//! The one `$variable` template engine of plugins and the access log: text with `$name` or
//! `${name}` parsed once at load, every name checked there (a misspelled variable refuses the
//! configuration, it does not render empty for ever), rendered per request without parsing.
//!
//! Variables are those of [`RequestCtx::var`] (`uri`, `host`, `remote_addr`, `route_id`,
//! `consumer_name`...), the families `http_<header>`, `arg_<name>`, `post_arg_<name>` (a form
//! body's field), `cookie_<name>` and `param_<name>`, the clock (`time_local`, `time_iso8601`, `msec`), and the variables plugins
//! declare with [`declare_var!`](crate::declare_var) (request-id's `$request_id`).
//!
//! ```
//! use weir_plugin::template::Template;
//!
//! let t = Template::compile("/v2$uri?from=${remote_addr}").expect("valid");
//! assert!(!t.is_literal());
//! assert!(Template::compile("$ur1").is_err()); // a typo fails at load
//! assert_eq!(Template::compile("plain").expect("valid").literal(), Some("plain"));
//! ```

use std::borrow::Cow;

use crate::RequestCtx;

/// A variable a plugin sets with [`RequestCtx::set_var`], declared so templates may name it.
pub struct PluginVar(pub &'static str);

inventory::collect!(PluginVar);

/// Declares a variable the plugin sets, so that templates may name it (`$request_id`).
#[macro_export]
macro_rules! declare_var {
    ($name:literal) => {
        $crate::inventory::submit! { $crate::template::PluginVar($name) }
    };
}

/// Variables of [`RequestCtx::var`] and the clock.
const BUILTIN: &[&str] = &[
    "host",
    "uri",
    "request_uri",
    "args",
    "query_string",
    "request_method",
    "scheme",
    "remote_addr",
    "remote_port",
    "server_addr",
    "server_port",
    "status",
    "request_time",
    "upstream_addr",
    "balancer_ip",
    "balancer_port",
    "upstream_response_time",
    "request_length",
    "bytes_sent",
    "body_bytes_sent",
    "server_protocol",
    "request",
    "remote_user",
    "matched_uri",
    "matched_host",
    "route_id",
    "service_id",
    "consumer_name",
    "ssl_client_s_dn",
    "ssl_client_fingerprint",
    "ssl_client_verify",
    "plugin_time",
    "time_local",
    "time_iso8601",
    "msec",
];

/// Families of variables: a prefix and a name of the caller's choice.
const FAMILIES: &[&str] = &["http_", "arg_", "cookie_", "param_", "post_arg_"];

/// Whether `name` (without `$`) is a variable a template may use.
pub fn is_known(name: &str) -> bool {
    BUILTIN.contains(&name)
        || FAMILIES.iter().any(|f| name.len() > f.len() && name.starts_with(f))
        || inventory::iter::<PluginVar>.into_iter().any(|v| v.0 == name)
}

/// The nearest known variable to a misspelled one, for messages.
fn suggestion(name: &str) -> Option<&'static str> {
    let plugin_vars = inventory::iter::<PluginVar>.into_iter().map(|v| v.0);
    BUILTIN
        .iter()
        .copied()
        .chain(plugin_vars)
        .map(|k| (distance(name, k), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// A part of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text written as it is.
    Text(Box<str>),
    /// A variable, by name (checked at compile).
    Var(Box<str>),
}

/// A compiled template (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `text`; an unknown variable, an unclosed `${` or a `$` without a name is an error
    /// that says which.
    pub fn compile(text: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut lit = String::new();
        let mut rest = text;
        while let Some(at) = rest.find('$') {
            lit.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced.find('}').ok_or_else(|| format!("unclosed `${{` in `{text}`"))?;
                (&braced[..end], &braced[end + 1..])
            } else {
                let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
                (&after[..end], &after[end..])
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "`$` must be followed by a variable name (letters, digits, `_`), near `{}`",
                    &rest[at..]
                ));
            }
            if !is_known(name) {
                let hint = suggestion(name).map(|s| format!(" (did you mean `${s}`?)")).unwrap_or_default();
                return Err(format!("unknown variable `${name}`{hint}"));
            }
            if !lit.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut lit).into()));
            }
            pieces.push(Piece::Var(name.into()));
            rest = tail;
        }
        lit.push_str(rest);
        if !lit.is_empty() {
            pieces.push(Piece::Text(lit.into()));
        }
        Ok(Template { pieces })
    }

    /// The parts, for callers that write variables their own way (escaped, `-` when absent).
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Whether the template has no variable.
    pub fn is_literal(&self) -> bool {
        !self.pieces.iter().any(|p| matches!(p, Piece::Var(_)))
    }

    /// The text of a template without variables.
    pub fn literal(&self) -> Option<&str> {
        match self.pieces.as_slice() {
            [] => Some(""),
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// Renders with the request's variables (an absent variable renders empty).
    pub fn render<'c>(&'c self, ctx: &RequestCtx) -> Cow<'c, str> {
        if let Some(t) = self.literal() {
            return Cow::Borrowed(t);
        }
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(name) => {
                    if let Some(v) = value(name, ctx) {
                        out.push_str(&v);
                    }
                }
            }
        }
        Cow::Owned(out)
    }
}

/// The value of a checked variable: the clock's, or [`RequestCtx::var`]'s.
pub fn value<'c>(name: &str, ctx: &'c RequestCtx) -> Option<Cow<'c, str>> {
    match name {
        "time_iso8601" => Some(Cow::Owned(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true))),
        "time_local" => Some(Cow::Owned(chrono::Local::now().format("%d/%b/%Y:%H:%M:%S %z").to_string())),
        "msec" => Some(Cow::Owned(format!("{:.3}", chrono::Utc::now().timestamp_millis() as f64 / 1000.0))),
        _ => ctx.var(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_checks_and_renders() {
        let mut ctx = crate::phase::tests_support::ctx();
        ctx.path = "/a".into();
        ctx.query = "x=1".into();
        let t = Template::compile("$uri|${arg_x}|$http_x_missing|$$").err();
        assert!(t.is_some(), "a `$` without a name is refused");
        let t = Template::compile("$uri|${arg_x}|$http_x_missing|end").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.render(&ctx), "/a|1||end");
        let e = Template::compile("$remote_adr").err().unwrap_or_default();
        assert_eq!(e, "unknown variable `$remote_adr` (did you mean `$remote_addr`?)");
        assert!(Template::compile("${uri").is_err());
        assert!(Template::compile("$http_").is_err(), "a family needs a name");
    }

    #[test]
    fn clock_variables_have_their_shapes() {
        let ctx = crate::phase::tests_support::ctx();
        let t = value("time_iso8601", &ctx).unwrap_or_default();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z') && t.as_bytes()[10] == b'T', "{t}");
        assert!(value("msec", &ctx).unwrap_or_default().contains('.'));
    }
}
