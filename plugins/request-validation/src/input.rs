//! What the schemas validate: the request headers as a JSON object (names lower-case, or
//! spelled as the schema spells them; repeated headers as arrays), and the body read as JSON
//! (strictly: a key repeated in an object is refused, since the upstream's parser may keep the
//! other one) or as an `application/x-www-form-urlencoded` form.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use weir_plugin::http::{HeaderMap, HeaderName};

/// The request headers as the header schema sees them. `aliases` maps a lower-case name to
/// the spelling the schema uses (`User-Agent`), as APISIX's header table answers any case.
pub fn headers(headers: &HeaderMap, aliases: &[(HeaderName, String)]) -> Value {
    let mut out = Map::new();
    for name in headers.keys() {
        let key = aliases.iter().find(|(n, _)| n == name).map_or(name.as_str(), |(_, s)| s.as_str());
        let text =
            |v: &weir_plugin::http::HeaderValue| Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned());
        let mut values = headers.get_all(name).iter();
        let value = match (values.next(), values.next()) {
            (Some(one), None) => text(one),
            _ => Value::Array(headers.get_all(name).iter().map(text).collect()),
        };
        out.insert(key.to_owned(), value);
    }
    Value::Object(out)
}

/// A JSON value whose objects have no repeated key, at any depth.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Strict, E> {
        Ok(Strict(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Strict, E> {
        Ok(Strict(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Strict(Value::Object(out)))
    }
}

/// Parses a JSON body; a repeated key is an error.
pub fn json(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice::<Strict>(body).map(|s| s.0).map_err(|e| format!("invalid JSON body: {e}"))
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `+` as a space and `%XX` decoded; text that does not decode to UTF-8 is an error.
fn form_decode(raw: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < raw.len() => match (hex(raw[i + 1]), hex(raw[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "the form body is not UTF-8 once decoded".to_owned())
}

/// Parses an `application/x-www-form-urlencoded` body as OpenResty's `ngx.decode_args` does:
/// `k=v` pairs, a repeated key as an array of its values, a key without `=` as `true`.
pub fn form(body: &[u8]) -> Result<Value, String> {
    let mut out = Map::new();
    for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.iter().position(|b| *b == b'=') {
            Some(at) => (&pair[..at], Some(&pair[at + 1..])),
            None => (pair, None),
        };
        let key = form_decode(k)?;
        if key.is_empty() {
            continue;
        }
        let value = match v {
            Some(v) => Value::String(form_decode(v)?),
            None => Value::Bool(true),
        };
        match out.get_mut(&key) {
            None => {
                out.insert(key, value);
            }
            Some(Value::Array(items)) => items.push(value),
            Some(first) => {
                let first = first.take();
                out.insert(key, Value::Array(vec![first, value]));
            }
        }
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use weir_plugin::http::HeaderValue;

    #[test]
    fn headers_as_the_schema_spells_them() {
        let mut h = HeaderMap::new();
        h.insert("user-agent", HeaderValue::from_static("curl/8"));
        h.insert("host", HeaderValue::from_static("httpbin"));
        h.append("x-many", HeaderValue::from_static("1"));
        h.append("x-many", HeaderValue::from_static("2"));
        let aliases = vec![(HeaderName::from_static("user-agent"), "User-Agent".to_owned())];
        assert_eq!(headers(&h, &aliases), json!({"User-Agent": "curl/8", "host": "httpbin", "x-many": ["1", "2"]}));
    }

    #[test]
    fn json_is_read_strictly() {
        assert_eq!(json(br#"{"a": [1, {"b": null}], "c": 1.5}"#), Ok(json!({"a": [1, {"b": null}], "c": 1.5})));
        assert!(json(br#"{"a": 1, "a": 2}"#).is_err_and(|e| e.contains("duplicate key `a`")));
        assert!(json(br#"{"x": {"a": 1, "a": 2}}"#).is_err(), "at any depth");
        assert!(json(br#"{"a": 1} trailing"#).is_err());
        assert!(json(br#"{"a": "\ud800"}"#).is_err(), "lone surrogate");
        let deep = "[".repeat(1000) + &"]".repeat(1000);
        assert!(json(deep.as_bytes()).is_err(), "nesting is bounded (serde_json's recursion limit)");
    }

    #[test]
    fn forms_as_openresty_reads_them() {
        let f = form(b"required_payload=hello+world&enum_payload=enum_string_1&k=a&k=b&k=%41&flag&=x&&e=")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f,
            json!({"required_payload": "hello world", "enum_payload": "enum_string_1", "k": ["a", "b", "A"], "flag": true, "e": ""})
        );
        assert!(form(b"a=%ff").is_err());
        assert_eq!(form(b"a=%zz%4").ok(), Some(json!({"a": "%zz%4"})));
    }
}
