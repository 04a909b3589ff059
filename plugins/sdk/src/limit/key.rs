//! The limiter key: what a limiter counts by, from APISIX's `key_type` and `key`, compiled once
//! at build and resolved per request.
//!
//! - `var` (the default): `key` names one variable (`remote_addr`, `consumer_name`,
//!   `http_x_user`, `arg_k`...; a leading `$` is accepted). Resolved without allocating: a header
//!   variable's header name is made at build.
//! - `var_combination`: `key` is a template of variables (`$remote_addr $consumer_name`),
//!   compiled with the SDK's [`template`] engine (a misspelled variable refuses
//!   the configuration). Rendered into a per-thread buffer, so no allocation per request either.
//! - `constant`: `key` as written: one counter for every request.
//!
//! A key that resolves to nothing falls back to the client address (`ctx.remote_ip`), as APISIX
//! does: for `var`, the variable is absent (an empty header value is a value); for
//! `var_combination`, none of its variables is present. The fallback is logged at debug level
//! (per request: an info line would let clients flood the log).

use std::borrow::Cow;
use std::cell::Cell;

use http::HeaderName;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::template::{self, Piece, Template};
use crate::RequestCtx;

/// APISIX's `key_type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KeyType {
    /// `key` is one variable.
    #[default]
    Var,
    /// `key` is a combination of `$variables` and text.
    VarCombination,
    /// `key` is the key itself.
    Constant,
}

/// One variable, resolved the cheapest way its family allows.
#[derive(Debug, Clone)]
pub(super) enum Var {
    /// `remote_addr`: the client address (`ctx.remote_ip`).
    RemoteAddr,
    /// `http_<name>`: a request header, its name made at build.
    Header(HeaderName),
    /// `arg_<name>`: a query argument.
    Arg(Box<str>),
    /// Anything else: [`template::value`].
    Other(Box<str>),
}

impl Var {
    /// A checked variable (`name` without `$`).
    pub(super) fn compile(name: &str) -> Result<Var, String> {
        if !template::is_known(name) {
            // The engine's own message, with its suggestion.
            return Err(Template::compile(&format!("${{{name}}}")).err().unwrap_or_else(|| format!("`{name}`")));
        }
        Ok(match name {
            "remote_addr" => Var::RemoteAddr,
            _ => {
                if let Some(h) = name.strip_prefix("http_") {
                    let header = h.replace('_', "-").to_ascii_lowercase();
                    let header = HeaderName::from_bytes(header.as_bytes())
                        .map_err(|_| format!("`${name}` does not name a request header"))?;
                    Var::Header(header)
                } else if let Some(a) = name.strip_prefix("arg_") {
                    Var::Arg(a.into())
                } else {
                    Var::Other(name.into())
                }
            }
        })
    }

    pub(super) fn get<'c>(&self, ctx: &'c RequestCtx) -> Option<Cow<'c, str>> {
        match self {
            Var::RemoteAddr => Some(Cow::Borrowed(&ctx.remote_ip)),
            Var::Header(h) => ctx.headers.get(h).and_then(|v| v.to_str().ok()).map(Cow::Borrowed),
            Var::Arg(a) => ctx.arg(a).map(Cow::Borrowed),
            Var::Other(name) => template::value(name, ctx),
        }
    }
}

#[derive(Debug, Clone)]
enum Part {
    Text(Box<str>),
    Var(Var),
}

#[derive(Debug, Clone)]
enum Kind {
    Var(Var),
    Combination(Vec<Part>),
    Constant(Box<str>),
}

/// A compiled limiter key (see the module documentation).
#[derive(Debug, Clone)]
pub struct LimitKey {
    kind: Kind,
}

thread_local! {
    /// The buffer `var_combination` keys are rendered into (taken while in use, so a nested
    /// call gets a buffer of its own instead of a borrow error).
    static BUF: Cell<String> = const { Cell::new(String::new()) };
}

impl LimitKey {
    /// Compiles `key` as `key_type` says; an unknown variable is an error naming it.
    pub fn compile(key_type: KeyType, key: &str) -> Result<LimitKey, String> {
        let kind = match key_type {
            KeyType::Constant => Kind::Constant(key.into()),
            KeyType::Var => {
                let name = key.strip_prefix('$').unwrap_or(key);
                let name = name.strip_prefix('{').and_then(|n| n.strip_suffix('}')).unwrap_or(name);
                Kind::Var(Var::compile(name).map_err(|e| format!("key: {e}"))?)
            }
            KeyType::VarCombination => {
                let t = Template::compile(key).map_err(|e| format!("key: {e}"))?;
                if t.is_literal() {
                    return Err(format!(
                        "key: `{key}` has no `$variable`; with key_type var_combination every request would fall back to the client address (use key_type constant for one shared counter)"
                    ));
                }
                let mut parts = Vec::with_capacity(t.pieces().len());
                for p in t.pieces() {
                    parts.push(match p {
                        Piece::Text(s) => Part::Text(s.clone()),
                        Piece::Var(name) => Part::Var(Var::compile(name).map_err(|e| format!("key: {e}"))?),
                    });
                }
                Kind::Combination(parts)
            }
        };
        Ok(LimitKey { kind })
    }

    /// The default key: the client address.
    pub fn remote_addr() -> LimitKey {
        LimitKey { kind: Kind::Var(Var::RemoteAddr) }
    }

    /// Calls `f` with this request's key (the client address when the key resolves to nothing).
    /// Allocates nothing for `var` and `constant`; `var_combination` renders into a buffer kept
    /// by the thread.
    pub fn with<R>(&self, ctx: &RequestCtx, f: impl FnOnce(&str) -> R) -> R {
        self.visit(ctx, |key| match key {
            Some(k) => f(k),
            None => {
                log::debug!("the limiter key resolved to nothing; counting by the client address");
                f(&ctx.remote_ip)
            }
        })
    }

    /// Calls `f` with this request's key, or returns `None` without calling it when the key
    /// resolves to nothing (the variable is absent; none of a combination's variables is
    /// present): APISIX's `rules` skip a rule then.
    pub fn try_with<R>(&self, ctx: &RequestCtx, f: impl FnOnce(&str) -> R) -> Option<R> {
        self.visit(ctx, |key| key.map(f))
    }

    fn visit<R>(&self, ctx: &RequestCtx, f: impl FnOnce(Option<&str>) -> R) -> R {
        match &self.kind {
            Kind::Constant(k) => f(Some(k)),
            Kind::Var(v) => match v.get(ctx) {
                Some(k) => f(Some(&k)),
                None => f(None),
            },
            Kind::Combination(parts) => {
                let mut buf = BUF.take();
                buf.clear();
                let mut resolved = 0usize;
                for p in parts {
                    match p {
                        Part::Text(t) => buf.push_str(t),
                        Part::Var(v) => {
                            if let Some(value) = v.get(ctx) {
                                buf.push_str(&value);
                                resolved += 1;
                            }
                        }
                    }
                }
                let out = f((resolved > 0).then_some(buf.as_str()));
                // Keep the capacity for the next request, but not a hostile key's.
                if buf.capacity() <= 4096 {
                    BUF.set(buf);
                }
                out
            }
        }
    }

    /// This request's key, owned (for a key that must outlive the call, e.g. a Redis key).
    pub fn resolve(&self, ctx: &RequestCtx) -> String {
        self.with(ctx, str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase::tests_support::ctx;
    use http::HeaderValue;

    fn key(t: KeyType, k: &str) -> LimitKey {
        LimitKey::compile(t, k).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn var_keys_resolve_or_fall_back_to_the_client() {
        let mut c = ctx();
        c.headers.insert("x-user", HeaderValue::from_static("alice"));
        assert_eq!(key(KeyType::Var, "remote_addr").resolve(&c), "127.0.0.1");
        assert_eq!(key(KeyType::Var, "http_x_user").resolve(&c), "alice");
        assert_eq!(key(KeyType::Var, "$http_x_user").resolve(&c), "alice");
        assert_eq!(key(KeyType::Var, "http_x_other").resolve(&c), "127.0.0.1", "absent: the client address");
        assert_eq!(key(KeyType::Var, "consumer_name").resolve(&c), "127.0.0.1");
        c.headers.insert("x-user", HeaderValue::from_static(""));
        assert_eq!(key(KeyType::Var, "http_x_user").resolve(&c), "", "an empty value is a value (APISIX)");
        c.query = "k=v1&z".into();
        assert_eq!(key(KeyType::Var, "arg_k").resolve(&c), "v1");
    }

    #[test]
    fn combinations_count_what_resolved() {
        let mut c = ctx();
        let k = key(KeyType::VarCombination, "$remote_addr $consumer_name");
        assert_eq!(k.resolve(&c), "127.0.0.1 ", "one of two resolved: rendered as is");
        let k = key(KeyType::VarCombination, "u:${http_x_a}/$http_x_b");
        assert_eq!(k.resolve(&c), "127.0.0.1", "none resolved: the client address");
        c.headers.insert("x-b", HeaderValue::from_static("b"));
        assert_eq!(k.resolve(&c), "u:/b");
        // Nested use of the thread's buffer.
        let outer = k.with(&c, |a| k.with(&c, |b| format!("{a}|{b}")));
        assert_eq!(outer, "u:/b|u:/b");
    }

    #[test]
    fn constants_and_errors() {
        let c = ctx();
        assert_eq!(key(KeyType::Constant, "everyone").resolve(&c), "everyone");
        let e = LimitKey::compile(KeyType::Var, "remote_adr").err().unwrap_or_default();
        assert!(e.contains("did you mean `$remote_addr`"), "{e}");
        let e = LimitKey::compile(KeyType::VarCombination, "$remote_addr $nope").err().unwrap_or_default();
        assert!(e.contains("unknown variable `$nope`"), "{e}");
        assert!(LimitKey::compile(KeyType::VarCombination, "plain").is_err());
    }
}
