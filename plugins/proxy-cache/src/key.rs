//! Cache keys: `cache_key` items (`$variables` and literal text) rendered for a request, and the
//! lists of `cache_bypass` and `no_cache`.
//!
//! A key is never the plain concatenation APISIX makes (`$arg_a$arg_b` with `a=1&b=23` equals it
//! with `a=12&b=3`): each part is written with its length, after a prefix that keeps apart what
//! must never share an entry: the method class (`GET`/`HEAD` apart from `POST`), the route, and
//! the consumer when `consumer_isolation` holds. `$request_uri` is the normalized path and query
//! as the upstream receives them (after proxy-rewrite), not the raw request target, so two
//! spellings of one resource share an entry and a rewritten request never takes another's. The
//! key's digest (SHA-256, first 16 bytes) indexes zones and names files; the whole key is kept in
//! the entry and compared on every hit.

use std::borrow::Cow;

use weir_plugin::http::Method;
use weir_plugin::{template, RequestCtx};

use crate::lru::Digest;

/// Variables that already make the key per identity: `consumer_isolation` adds nothing then
/// (APISIX's list).
const IDENTITY_VARS: &[&str] = &["consumer_name", "consumer_group_id", "remote_user", "http_authorization"];

/// One item of `cache_key`, `cache_bypass` or `no_cache`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// Text as written.
    Literal(Box<str>),
    /// `$request_uri`: the path and query the upstream receives.
    UpstreamUri,
    /// Any other variable (checked at load).
    Var(Box<str>),
}

impl Item {
    /// Parses one item: `$name` is a variable (unknown names are refused with a suggestion),
    /// anything else literal text.
    pub fn parse(text: &str) -> Result<Item, String> {
        let Some(name) = text.strip_prefix('$') else {
            return Ok(Item::Literal(text.into()));
        };
        if name == "request_uri" {
            return Ok(Item::UpstreamUri);
        }
        template::Template::compile(text)?;
        Ok(Item::Var(name.into()))
    }

    /// The item's value for `ctx`.
    pub fn value<'c>(&'c self, ctx: &'c RequestCtx) -> Cow<'c, str> {
        match self {
            Item::Literal(t) => Cow::Borrowed(t),
            Item::UpstreamUri if ctx.query.is_empty() => Cow::Borrowed(ctx.path.as_str()),
            Item::UpstreamUri => Cow::Owned(format!("{}?{}", ctx.path, ctx.query)),
            Item::Var(name) => template::value(name, ctx).unwrap_or(Cow::Borrowed("")),
        }
    }
}

/// Parses a list of items; errors name the index.
pub fn parse_items(field: &str, items: &[String]) -> Result<Vec<Item>, String> {
    items.iter().enumerate().map(|(i, t)| Item::parse(t).map_err(|e| format!("{field}[{i}]: {e}"))).collect()
}

/// Whether any item has a value other than empty and `0` (nginx's `proxy_cache_bypass` and
/// `proxy_no_cache` test, item by item).
pub fn any_set(items: &[Item], ctx: &RequestCtx) -> bool {
    items.iter().any(|i| {
        let v = i.value(ctx);
        !v.is_empty() && v != "0"
    })
}

/// Which methods share entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `GET` and `HEAD` (a `HEAD` is answered from what a `GET` stored).
    Get,
    /// `POST`.
    Post,
}

impl Class {
    /// The class of `method`, if it is one the cache may serve.
    pub fn of(method: &Method) -> Option<Class> {
        match *method {
            Method::GET | Method::HEAD => Some(Class::Get),
            Method::POST => Some(Class::Post),
            _ => None,
        }
    }
}

/// A compiled `cache_key`.
#[derive(Debug, Clone)]
pub struct KeySpec {
    items: Vec<Item>,
    /// Prefix the consumer's name (`consumer_isolation`, no identity variable in the key).
    isolate: bool,
}

impl KeySpec {
    /// Compiles `cache_key`. `$request_method` is refused, as APISIX does: `PURGE` must find
    /// the entry a `GET` stored.
    pub fn compile(items: &[String], consumer_isolation: bool) -> Result<KeySpec, String> {
        if let Some(i) = items.iter().position(|t| t == "$request_method") {
            return Err(format!("cache_key[{i}]: `$request_method` cannot be part of the key (PURGE must find what GET stored; methods are kept apart already)"));
        }
        let items = parse_items("cache_key", items)?;
        let has_identity = items.iter().any(|i| matches!(i, Item::Var(n) if IDENTITY_VARS.contains(&&**n)));
        Ok(KeySpec { items, isolate: consumer_isolation && !has_identity })
    }

    /// Whether the key names the consumer (so a response to an authenticated request is the
    /// consumer's own).
    pub fn isolates(&self, ctx: &RequestCtx) -> bool {
        (self.isolate && ctx.consumer.is_some())
            || self.items.iter().any(|i| matches!(i, Item::Var(n) if IDENTITY_VARS.contains(&&**n)))
    }

    /// The key of `ctx` for method class `class`.
    pub fn render(&self, ctx: &RequestCtx, class: Class) -> Box<[u8]> {
        let mut out = Vec::with_capacity(96);
        out.extend_from_slice(b"pc1");
        out.push(match class {
            Class::Get => b'G',
            Class::Post => b'P',
        });
        field(&mut out, ctx.route_id.as_deref().unwrap_or(""));
        let identity = match (&ctx.consumer, self.isolate) {
            (Some(c), true) => &*c.username,
            _ => "",
        };
        field(&mut out, identity);
        for item in &self.items {
            field(&mut out, &item.value(ctx));
        }
        out.into_boxed_slice()
    }
}

fn field(out: &mut Vec<u8>, value: &str) {
    out.extend_from_slice(&(value.len() as u32).to_le_bytes());
    out.extend_from_slice(value.as_bytes());
}

/// The digest of a key.
pub fn digest(key: &[u8]) -> Digest {
    let sum = ring::digest::digest(&ring::digest::SHA256, key);
    let mut d = [0u8; 16];
    d.copy_from_slice(&sum.as_ref()[..16]);
    d
}

/// A digest as 32 lower-case hex digits (file names).
pub fn hex(d: &Digest) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(32);
    for b in d {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The digest a 32-hex-digit file name stands for.
pub fn parse_hex(name: &str) -> Option<Digest> {
    if name.len() != 32 {
        return None;
    }
    let mut d = [0u8; 16];
    for (i, pair) in name.as_bytes().chunks(2).enumerate() {
        let text = std::str::from_utf8(pair).ok()?;
        if text.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        d[i] = u8::from_str_radix(text, 16).ok()?;
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use weir_plugin::testing::TestRequest;
    use weir_plugin::Consumer;

    fn spec(items: &[&str]) -> KeySpec {
        let items: Vec<String> = items.iter().map(|s| s.to_string()).collect();
        KeySpec::compile(&items, true).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parts_are_length_prefixed_so_shifting_text_between_them_changes_the_key() {
        let k = spec(&["$arg_a", "$arg_b"]);
        let a = k.render(&TestRequest::get("/?a=1&b=23").build(), Class::Get);
        let b = k.render(&TestRequest::get("/?a=12&b=3").build(), Class::Get);
        assert_ne!(a, b);
    }

    #[test]
    fn host_path_case_method_class_route_and_consumer_separate_entries() {
        let k = spec(&["$host", "$request_uri"]);
        let key = |path: &str, host: &str| k.render(&TestRequest::get(path).header("host", host).build(), Class::Get);
        assert_ne!(key("/a", "x.test"), key("/A", "x.test"), "path case");
        assert_ne!(key("/a", "x.test"), key("/a", "y.test"), "host");
        assert_ne!(key("/a?q=1", "x.test"), key("/a?q=2", "x.test"), "query");
        assert_eq!(key("/a", "x.test:80"), key("/a", "x.test"), "$host has no port, as nginx's");
        let ctx = TestRequest::get("/a").header("host", "x.test").build();
        assert_ne!(k.render(&ctx, Class::Get), k.render(&ctx, Class::Post));
        let mut routed = TestRequest::get("/a").header("host", "x.test").build();
        routed.route_id = Some(Arc::from("r2"));
        assert_ne!(k.render(&ctx, Class::Get), k.render(&routed, Class::Get), "route");
        let mut jack = TestRequest::get("/a").header("host", "x.test").build();
        jack.consumer = Some(Arc::new(Consumer::named("jack")));
        assert_ne!(k.render(&ctx, Class::Get), k.render(&jack, Class::Get), "consumer isolation");
        assert!(k.isolates(&jack) && !k.isolates(&ctx));
        let shared = KeySpec::compile(&["$host".into()], false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shared.render(&ctx, Class::Get), shared.render(&{ jack }, Class::Get), "isolation off");
    }

    #[test]
    fn request_uri_is_what_the_upstream_receives() {
        let k = spec(&["$request_uri"]);
        let mut ctx = TestRequest::get("/a/./b?x=1").build();
        ctx.path = "/a/b".into();
        let mut same = TestRequest::get("/a/b?x=1").build();
        same.request_target = None;
        assert_eq!(k.render(&ctx, Class::Get), k.render(&same, Class::Get));
    }

    #[test]
    fn items_are_checked_at_load() {
        assert!(KeySpec::compile(&["$request_method".into()], true).is_err());
        let e = KeySpec::compile(&["$hots".into()], true).err().unwrap_or_default();
        assert!(e.starts_with("cache_key[0]: unknown variable `$hots`"), "{e}");
        assert_eq!(Item::parse("plain$text"), Ok(Item::Literal("plain$text".into())));
    }

    #[test]
    fn bypass_values_count_item_by_item() {
        let items = parse_items("cache_bypass", &["$arg_a".into(), "$arg_b".into()]).unwrap_or_default();
        assert!(!any_set(&items, &TestRequest::get("/?a=0&b=0").build()), "0 and 0 is not set");
        assert!(!any_set(&items, &TestRequest::get("/").build()));
        assert!(any_set(&items, &TestRequest::get("/?b=yes").build()));
    }

    #[test]
    fn hex_round_trips_and_refuses_other_names() {
        let d = digest(b"k");
        assert_eq!(parse_hex(&hex(&d)), Some(d));
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex(&hex(&d).to_uppercase()), None);
        assert_eq!(parse_hex(&"é".repeat(16)), None);
    }
}
