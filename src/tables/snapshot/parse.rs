//! The parse cache of snapshot builds: entries fingerprinted by content, validated against their
//! kind schema and deserialized once, reused while their JSON is unchanged.

use std::sync::Arc;

use serde_json::Value;

use super::*;

/// Parsed entries by the [`fingerprint`] of the list name and JSON they were parsed from. A parse
/// depends on nothing else, so the content is the key: no id is kept (a 40-byte slot per entry).
type Parsed = FastMap<Fingerprint, ParsedEntry>;

/// One cached entry: the parsed value, and whether it passed the checks that depend on nothing
/// but itself (so that a reused entry skips them too; one that failed them is checked again).
type ParsedEntry = (Arc<dyn std::any::Any + Send + Sync>, bool);

/// A 128-bit [`Fingerprint`] of a list name and a JSON value: SipHash under two random keys, over
/// a walk that tells types, lengths and keys apart. The cache keeps this rather than a copy of
/// every entry (as a tree, ~2 KB per route: 20 MB for 10,000 routes).
pub(super) fn fingerprint(list: &str, v: &Value) -> Fingerprint {
    use std::hash::{BuildHasher, Hasher};
    static KEYS: std::sync::LazyLock<(std::hash::RandomState, std::hash::RandomState)> =
        std::sync::LazyLock::new(|| (std::hash::RandomState::new(), std::hash::RandomState::new()));
    struct Both<A, B>(A, B);
    impl<A: Hasher, B: Hasher> Hasher for Both<A, B> {
        fn write(&mut self, bytes: &[u8]) {
            self.0.write(bytes);
            self.1.write(bytes);
        }
        fn finish(&self) -> u64 {
            self.0.finish()
        }
    }
    pub(super) fn feed(v: &Value, h: &mut impl Hasher) {
        match v {
            Value::Null => h.write_u8(0),
            Value::Bool(b) => h.write(&[1, u8::from(*b)]),
            Value::Number(n) => {
                h.write_u8(2);
                match (n.as_u64(), n.as_i64()) {
                    (Some(u), _) => {
                        h.write_u8(0);
                        h.write_u64(u);
                    }
                    (None, Some(i)) => {
                        h.write_u8(1);
                        h.write_i64(i);
                    }
                    _ => {
                        h.write_u8(2);
                        h.write_u64(n.as_f64().map_or(0, f64::to_bits));
                    }
                }
            }
            Value::String(s) => {
                h.write_u8(3);
                h.write_usize(s.len());
                h.write(s.as_bytes());
            }
            Value::Array(a) => {
                h.write_u8(4);
                h.write_usize(a.len());
                a.iter().for_each(|x| feed(x, h));
            }
            Value::Object(m) => {
                h.write_u8(5);
                h.write_usize(m.len());
                for (k, x) in m {
                    h.write_usize(k.len());
                    h.write(k.as_bytes());
                    feed(x, h);
                }
            }
        }
    }
    let mut both = Both(KEYS.0.build_hasher(), KEYS.1.build_hasher());
    both.write_usize(list.len());
    both.write(list.as_bytes());
    feed(v, &mut both);
    [both.0.finish(), both.1.finish()]
}

/// Two 64-bit halves rather than a `u128`, whose 16-byte alignment would pad a cache slot.
pub(super) type Fingerprint = [u64; 2];

/// The entries the last build parsed. Validating an entry against its kind schema and
/// deserializing it is most of a build's cost, and depends on nothing but the entry's JSON (kind
/// schemas are fixed for the process), so an entry equal to last time's is reused: a change to
/// one route of 10,000 re-parses one route.
pub(super) static PARSED: parking_lot::Mutex<Option<Parsed>> = parking_lot::Mutex::new(None);

pub(super) struct ParseCache {
    pub(super) previous: Parsed,
    pub(super) current: Parsed,
}

impl Builder<'_> {
    /// Validates every item of one list against its kind schema, then deserializes it. An item
    /// equal to one the previous build parsed is taken from the [`ParseCache`] instead.
    pub(super) fn parse<T>(&mut self, raw: &Value, list: &'static str, kind: &str) -> Vec<(String, Arc<T>)>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        self.parse_checked(raw, list, kind).0
    }

    /// [`Builder::parse`], with each entry's cache key and whether it is known to pass its own
    /// checks (see [`ParsedEntry`]).
    #[allow(clippy::type_complexity)]
    pub(super) fn parse_checked<T>(
        &mut self,
        raw: &Value,
        list: &'static str,
        kind: &str,
    ) -> (Vec<(String, Arc<T>)>, Vec<(Fingerprint, bool)>)
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let mut checked = Vec::new();
        let schema = KindSchemas::get().kind(kind);
        let items = raw.get(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let o = owner(list, i, item);
            // Moved, not copied, from the previous build's cache to this one's.
            let print = fingerprint(list, item);
            if let Some((parsed, ok)) = self.cache.previous.remove(&print) {
                if let Ok(t) = parsed.clone().downcast::<T>() {
                    out.push((o, t));
                    checked.push((print, ok));
                    self.cache.current.insert(print, (parsed, ok));
                    continue;
                }
            }
            if let Err(found) = schema.check(item) {
                self.issues.extend(found.into_iter().map(|f| f.in_resource(&o)));
                continue;
            }
            match serde_json::from_value::<T>(item.clone()) {
                Ok(v) => {
                    let v = Arc::new(v);
                    self.cache.current.insert(print, (v.clone(), false));
                    out.push((o, v));
                    checked.push((print, false));
                }
                Err(e) => self.issue(&o, "", &e.to_string()),
            }
        }
        (out, checked)
    }

    pub(super) fn index<'o>(&mut self, list: &'static str, ids: impl Iterator<Item = (&'o String, String)>) {
        for (i, (o, id)) in ids.enumerate() {
            if id.is_empty() {
                continue;
            }
            if self.snap.index.insert((list, id.clone()), i).is_some() {
                self.issue(o, "id", &format!("duplicate id `{id}` in {list}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint;
    use serde_json::json;

    #[test]
    pub(super) fn fingerprints_tell_values_apart() {
        let a = json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 1}}});
        assert_eq!(fingerprint("routes", &a), fingerprint("routes", &a.clone()));
        for other in [
            json!({"uri": "/b", "upstream": {"nodes": {"127.0.0.1:80": 1}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 2}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": 1.0}}}),
            json!({"uri": "/a", "upstream": {"nodes": {"127.0.0.1:80": "1"}}}),
            json!({"uri": "/a", "upstream": {"nodes": [["127.0.0.1:80", 1]]}}),
            json!({"uri": "/a"}),
            json!({"ur": "i/a", "upstream": {"nodes": {"127.0.0.1:80": 1}}}),
        ] {
            assert_ne!(fingerprint("routes", &a), fingerprint("routes", &other), "{other}");
        }
        assert_ne!(fingerprint("routes", &json!(["ab", "c"])), fingerprint("routes", &json!(["a", "bc"])));
        assert_ne!(fingerprint("routes", &json!(null)), fingerprint("routes", &json!(false)));
        // One JSON in two lists parses to two types: two cache entries.
        assert_ne!(fingerprint("routes", &a), fingerprint("services", &a));
    }
}
