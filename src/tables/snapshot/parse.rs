//! The parse cache of snapshot builds: entries fingerprinted by content, validated against their
//! kind schema and deserialized once, reused while their JSON is unchanged.

use std::sync::Arc;

use serde_json::Value;

use crate::resources::etcd::KeysByList;

use super::*;

/// Parsed entries by the [`fingerprint`] of the list name and JSON they were parsed from. A parse
/// depends on nothing else, so the content is the key: no id is kept (a 40-byte slot per entry).
type Parsed = FastMap<Fingerprint, ParsedEntry>;

/// One cached entry: the parsed value, whether it passed the checks that depend on nothing
/// but itself (so that a reused entry skips them too; one that failed them is checked again),
/// and the last build that used it ([`ParseCache::build`]).
type ParsedEntry = (Arc<dyn std::any::Any + Send + Sync>, bool, u32);

/// A 128-bit [`Fingerprint`] of a list name and a JSON value: SipHash under two random keys, over
/// a walk that tells types, lengths and keys apart. The cache keeps this rather than a copy of
/// every entry (as a tree, ~2 KB per route: 20 MB for 10,000 routes).
pub fn fingerprint(list: &str, v: &Value) -> Fingerprint {
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
pub type Fingerprint = [u64; 2];

/// Fingerprints a provider already knows for the entries of a document, by list, aligned with
/// each list's entries (`fingerprint(list, entry)` of each). A provider that keeps its entries
/// between builds (etcd) computes each entry's once, when it arrives, rather than once per build
/// for every entry (a third of a 10,000-route build's time).
pub type DocPrints = FastMap<&'static str, Vec<Fingerprint>>;

/// The fingerprint of each value a provider holds (etcd), by its key: computed once, when the
/// value is first built, and forgotten when the provider sees it change. A build then looks every
/// unchanged entry up in its parse cache without walking it again.
#[derive(Default)]
pub struct Prints(FastMap<String, Fingerprint>);

impl Prints {
    /// The fingerprints of the entries of `doc` (listed by `keys`), computing the unknown ones.
    pub fn of_document(&mut self, doc: &Value, keys: &KeysByList<'_>) -> DocPrints {
        let mut out = DocPrints::default();
        for (&list, keys) in keys {
            let items = doc.get(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
            let prints = keys
                .iter()
                .zip(items)
                .map(|(&key, item)| match self.0.get(key) {
                    Some(p) => *p,
                    None => *self.0.entry(key.to_owned()).or_insert_with(|| fingerprint(list, item)),
                })
                .collect();
            out.insert(list, prints);
        }
        out
    }

    /// Forgets the fingerprint of `key`, whose value changed.
    pub fn forget(&mut self, key: &str) {
        self.0.remove(key);
    }
}

/// The entries the last build parsed. Validating an entry against its kind schema and
/// deserializing it is most of a build's cost, and depends on nothing but the entry's JSON (kind
/// schemas are fixed for the process), so an entry equal to last time's is reused: a change to
/// one route of 10,000 re-parses one route.
pub(super) static PARSED: parking_lot::Mutex<Option<ParseCache>> = parking_lot::Mutex::new(None);

/// The parse cache one build works with: entries are marked with the build that used them in
/// place (no moving 10,000 entries from one map to another), and those the build did not use are
/// dropped when it ends.
#[derive(Default)]
pub(super) struct ParseCache {
    entries: Parsed,
    build: u32,
}

impl ParseCache {
    /// The cache as the last build left it (empty when another build holds it now), for one
    /// more build.
    pub(super) fn take() -> ParseCache {
        let mut cache = PARSED.lock().take().unwrap_or_default();
        cache.build = cache.build.wrapping_add(1);
        cache
    }

    /// Keeps what this build used, for the next one.
    pub(super) fn put_back(mut self) {
        let build = self.build;
        self.entries.retain(|_, e| e.2 == build);
        *PARSED.lock() = Some(self);
    }

    /// Folds what a patch ([`Snapshot::patch_routes`]) parsed into the cache the last build left,
    /// as used by it, and drops every route entry of the ids the patch `changed` (their earlier
    /// versions, including those of a patch that found the cache held by a build and could not
    /// fold). Nothing happens while a build holds the cache: the next build's parses are what it
    /// keeps.
    pub(super) fn fold_patch(self, changed: &[&str]) {
        let mut held = PARSED.lock();
        let Some(cache) = held.as_mut() else { return };
        let replaced =
            |e: &ParsedEntry| e.0.downcast_ref::<Route>().is_some_and(|r| changed.contains(&r.id.0.as_str()));
        cache.entries.retain(|_, e| !replaced(e));
        let build = cache.build;
        cache.entries.extend(self.entries.into_iter().map(|(print, (v, ok, _))| (print, (v, ok, build))));
    }

    /// Records that `print` passed the checks that depend on nothing but itself.
    pub(super) fn passed(&mut self, print: &Fingerprint) {
        if let Some(entry) = self.entries.get_mut(print) {
            entry.1 = true;
        }
    }
}

impl Builder<'_> {
    /// Validates every item of one list against its kind schema, then deserializes it. An item
    /// equal to one the previous build parsed is taken from the [`ParseCache`] instead.
    pub(super) fn parse<'r, T>(
        &mut self,
        raw: &'r Value,
        list: &'static str,
        kind: &str,
    ) -> Vec<(EntryName<'r>, Arc<T>)>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        self.parse_checked(raw, list, kind).0
    }

    /// [`Builder::parse`], with each entry's cache key and whether it is known to pass its own
    /// checks (see [`ParsedEntry`]).
    #[allow(clippy::type_complexity)]
    pub(super) fn parse_checked<'r, T>(
        &mut self,
        raw: &'r Value,
        list: &'static str,
        kind: &str,
    ) -> (Vec<(EntryName<'r>, Arc<T>)>, Vec<(Fingerprint, bool)>)
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let mut checked = Vec::new();
        let schema = KindSchemas::get().kind(kind);
        let items = raw.get(list).and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
        let mut out = Vec::with_capacity(items.len());
        let prints = self.prints.and_then(|p| p.get(list)).map_or(&[][..], Vec::as_slice);
        for (i, item) in items.iter().enumerate() {
            if let Some((o, t, print)) = self.parse_entry(schema, (list, i, item), prints.get(i)) {
                out.push((o, t));
                checked.push(print);
            }
        }
        (out, checked)
    }

    /// One entry of `list` (at place `i`), with its cache key and whether it is known to pass its
    /// own checks; `None` when it is not valid (the issues go to the builder).
    #[allow(clippy::type_complexity)]
    pub(super) fn parse_entry<'r, T>(
        &mut self,
        schema: &CompiledSchema,
        (list, i, item): (&'static str, usize, &'r Value),
        known: Option<&Fingerprint>,
    ) -> Option<(EntryName<'r>, Arc<T>, (Fingerprint, bool))>
    where
        T: DeserializeOwned + Send + Sync + 'static,
    {
        let o = EntryName::new(list, i, item);
        let print = known.copied().unwrap_or_else(|| fingerprint(list, item));
        let build = self.cache.build;
        if let Some((parsed, ok, used)) = self.cache.entries.get_mut(&print) {
            if let Ok(t) = parsed.clone().downcast::<T>() {
                *used = build;
                let ok = *ok;
                return Some((o, t, (print, ok)));
            }
        }
        if let Err(found) = schema.check(item) {
            self.issues.extend(found.into_iter().map(|f| f.in_resource(&o)));
            return None;
        }
        match serde_json::from_value::<T>(item.clone()) {
            Ok(v) => {
                let v = Arc::new(v);
                self.cache.entries.insert(print, (v.clone(), false, build));
                Some((o, v, (print, false)))
            }
            Err(e) => {
                self.issue(&o, "", &e.to_string());
                None
            }
        }
    }

    pub(super) fn index<'o>(
        &mut self,
        list: &'static str,
        ids: impl ExactSizeIterator<Item = (&'o EntryName<'o>, String)>,
    ) {
        // (A build's own index is not shared yet: no copy.)
        let index = Arc::make_mut(&mut self.snap.index);
        index.reserve(ids.len());
        let mut twice = Vec::new();
        for (i, (o, id)) in ids.enumerate() {
            if id.is_empty() {
                continue;
            }
            // (The id moves into the index: the message, rare, copies it back out.)
            match index.entry((list, id)) {
                std::collections::hash_map::Entry::Vacant(slot) => {
                    slot.insert(i);
                }
                std::collections::hash_map::Entry::Occupied(taken) => {
                    twice.push((o, format!("duplicate id `{}` in {list}", taken.key().1)));
                }
            }
        }
        for (o, why) in twice {
            self.issue(o, "id", &why);
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
