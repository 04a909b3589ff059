//! The bounded local store of limiters: state per key, at most `max_keys` keys, the least
//! recently used evicted first, evictions counted.
//!
//! Keys are stored as 64-bit hashes keyed by a random seed chosen at start (the key text is not
//! kept): two keys share a counter only if their hashes collide, about `n / 2^64` for a new key
//! among `n`, and a client cannot aim for a collision without the seed. The map is split into
//! [`SHARDS`] shards by hash, each a `parking_lot` mutex over a hash index and a slab of entries
//! threaded on a least-recently-used list: a request locks one shard for one lookup and a few
//! index writes, and never across an `.await`. Each shard holds `max_keys / SHARDS` keys (the
//! remainder spread over the first ones), so the store never holds more than `max_keys` keys;
//! eviction is least-recently-used within a shard. Memory per key: the entry (8 bytes of hash,
//! 8 of list links, the value) plus its index slot (about 20 bytes): ~60 bytes for the
//! limiters' 16-24-byte values. Slabs grow up to their share and no further.
//!
//! Every store registers itself with [`stats`], which exports its key count and
//! evictions to Prometheus.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::stats::{self, StoreStats};
use crate::prehashed::PrehashedMap;

/// Keys per plugin unless `plugin_attr.<plugin>.max_keys` says otherwise.
pub const DEFAULT_MAX_KEYS: usize = 100_000;
/// Shards of a store (and the smallest `max_keys`: one key per shard).
pub const SHARDS: usize = 64;

const NIL: u32 = u32::MAX;

struct Entry<V> {
    hash: u64,
    prev: u32,
    next: u32,
    value: V,
}

struct Shard<V> {
    index: PrehashedMap<u32>,
    entries: Vec<Entry<V>>,
    /// Most recently used.
    head: u32,
    /// Least recently used: the next to go.
    tail: u32,
    cap: usize,
    evictions: u64,
}

/// A shard on a cache line of its own, so that workers locking neighbouring shards do not
/// share one.
#[repr(align(64))]
struct Padded<V>(Mutex<Shard<V>>);

impl<V> Shard<V> {
    fn new(cap: usize) -> Self {
        Shard { index: HashMap::default(), entries: Vec::new(), head: NIL, tail: NIL, cap, evictions: 0 }
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let e = &self.entries[i as usize];
            (e.prev, e.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.entries[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.entries[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let e = &mut self.entries[i as usize];
            e.prev = NIL;
            e.next = old;
        }
        match old {
            NIL => self.tail = i,
            o => self.entries[o as usize].prev = i,
        }
        self.head = i;
    }

    fn touch(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// Removes entry `i`; the last entry moves into its place.
    fn remove_at(&mut self, i: u32) {
        self.unlink(i);
        let hash = self.entries[i as usize].hash;
        self.index.remove(&hash);
        let last = (self.entries.len() - 1) as u32;
        if i != last {
            // Relink the last entry under its new position.
            let (prev, next, moved) = {
                let e = &self.entries[last as usize];
                (e.prev, e.next, e.hash)
            };
            match prev {
                NIL => self.head = i,
                p => self.entries[p as usize].next = i,
            }
            match next {
                NIL => self.tail = i,
                n => self.entries[n as usize].prev = i,
            }
            if let Some(slot) = self.index.get_mut(&moved) {
                *slot = i;
            }
        }
        self.entries.swap_remove(i as usize);
    }

    /// Room for one more entry: grows by doubling up to the shard's share, never beyond.
    fn reserve_one(&mut self) {
        if self.entries.len() == self.entries.capacity() {
            let want = (self.entries.len() * 2).max(8).min(self.cap.max(1));
            self.entries.reserve_exact(want.saturating_sub(self.entries.len()).max(1));
        }
    }

    fn shrink_to(&mut self, cap: usize) {
        self.cap = cap;
        while self.entries.len() > cap && self.tail != NIL {
            self.remove_at(self.tail);
            self.evictions += 1;
        }
        if self.entries.capacity() > cap.max(8) {
            self.entries.shrink_to(cap);
            self.index.shrink_to(cap);
        }
    }
}

/// A bounded, sharded, least-recently-used map from key hashes to `V` (see the module
/// documentation).
pub struct BoundedStore<V> {
    name: &'static str,
    shards: Box<[Padded<V>]>,
    max_keys: AtomicUsize,
    seed: foldhash::quality::RandomState,
}

impl<V: Send + 'static> BoundedStore<V> {
    /// A store for plugin `name` (the label of its metrics) holding at most `max_keys` keys
    /// (at least [`SHARDS`]); registered for the metrics.
    pub fn new(name: &'static str, max_keys: usize) -> Arc<Self> {
        let max_keys = max_keys.max(SHARDS);
        let shards = (0..SHARDS).map(|i| Padded(Mutex::new(Shard::new(share(max_keys, i))))).collect();
        let store = Arc::new(BoundedStore {
            name,
            shards,
            max_keys: AtomicUsize::new(max_keys),
            seed: foldhash::quality::RandomState::default(),
        });
        let weak: std::sync::Weak<dyn StoreStats> = Arc::downgrade(&(store.clone() as Arc<dyn StoreStats>));
        stats::register(weak);
        store
    }
}

impl<V> BoundedStore<V> {
    /// The hash of `key` in counter namespace `scope` (a route's configuration, a group).
    #[inline]
    pub fn hash(&self, scope: u64, key: &str) -> u64 {
        let mut h = self.seed.build_hasher();
        h.write_u64(scope);
        h.write(key.as_bytes());
        h.finish()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<Shard<V>> {
        &self.shards[((hash >> 32) as usize) % SHARDS].0
    }

    /// Runs `f` on the value of `hash`, made by `init` when absent (evicting the shard's least
    /// recently used key when it is full); the entry becomes the most recently used.
    pub fn with_entry<R>(&self, hash: u64, init: impl FnOnce() -> V, f: impl FnOnce(&mut V) -> R) -> R {
        let mut guard = self.shard(hash).lock();
        let s = &mut *guard;
        if let Some(&i) = s.index.get(&hash) {
            s.touch(i);
            return f(&mut s.entries[i as usize].value);
        }
        if s.cap == 0 {
            // No room at all: the value lives for this call only.
            s.evictions += 1;
            return f(&mut init());
        }
        let i = if s.entries.len() < s.cap {
            s.reserve_one();
            let i = s.entries.len() as u32;
            s.entries.push(Entry { hash, prev: NIL, next: NIL, value: init() });
            s.push_front(i);
            i
        } else {
            // Reuse the least recently used entry in place.
            let i = s.tail;
            let old = s.entries[i as usize].hash;
            s.index.remove(&old);
            s.evictions += 1;
            let e = &mut s.entries[i as usize];
            e.hash = hash;
            e.value = init();
            s.touch(i);
            i
        };
        s.index.insert(hash, i);
        f(&mut s.entries[i as usize].value)
    }

    /// Runs `f` on the value of `hash` if present (without making it recently used); the
    /// entry is removed when `f` returns `false`.
    pub fn update<R>(&self, hash: u64, f: impl FnOnce(&mut V) -> (R, bool)) -> Option<R> {
        let mut guard = self.shard(hash).lock();
        let s = &mut *guard;
        let i = *s.index.get(&hash)?;
        let (r, keep) = f(&mut s.entries[i as usize].value);
        if !keep {
            s.remove_at(i);
        }
        Some(r)
    }

    /// Visits every entry, one shard locked at a time; `f` returns `false` to remove one.
    pub fn retain(&self, mut f: impl FnMut(u64, &mut V) -> bool) {
        for shard in self.shards.iter() {
            let mut guard = shard.0.lock();
            let s = &mut *guard;
            let mut i = 0;
            while i < s.entries.len() {
                let e = &mut s.entries[i];
                if f(e.hash, &mut e.value) {
                    i += 1;
                } else {
                    // The last entry moves into `i`: visit `i` again.
                    s.remove_at(i as u32);
                }
            }
        }
    }

    /// Changes the bound; a smaller one evicts the least recently used keys at once.
    pub fn set_max_keys(&self, max_keys: usize) {
        let max_keys = max_keys.max(SHARDS);
        self.max_keys.store(max_keys, Ordering::Relaxed);
        for (i, shard) in self.shards.iter().enumerate() {
            shard.0.lock().shrink_to(share(max_keys, i));
        }
    }
}

/// Shard `i`'s share of `max_keys`.
fn share(max_keys: usize, i: usize) -> usize {
    max_keys / SHARDS + usize::from(i < max_keys % SHARDS)
}

impl<V: Send> StoreStats for BoundedStore<V> {
    fn plugin(&self) -> &'static str {
        self.name
    }
    fn keys(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().entries.len()).sum()
    }
    fn evictions(&self) -> u64 {
        self.shards.iter().map(|s| s.0.lock().evictions).sum()
    }
    fn max_keys(&self) -> usize {
        self.max_keys.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_links<V>(s: &Shard<V>) {
        let mut n = 0;
        let mut at = s.head;
        let mut prev = NIL;
        while at != NIL {
            let e = &s.entries[at as usize];
            assert_eq!(e.prev, prev);
            assert_eq!(s.index.get(&e.hash), Some(&at));
            prev = at;
            at = e.next;
            n += 1;
        }
        assert_eq!(s.tail, prev);
        assert_eq!(n, s.entries.len());
        assert_eq!(s.index.len(), s.entries.len());
    }

    #[test]
    fn bounded_lru_evicts_the_least_recently_used() {
        let store: Arc<BoundedStore<u32>> = BoundedStore::new("test", SHARDS * 2);
        // Keys of one shard: the shard is picked by bits 32.. of the hash.
        let key = |n: u64| n;
        for n in 0..3u64 {
            store.with_entry(key(n), || n as u32, |_| ());
        }
        // Shard 0 holds two: key 0 was evicted.
        assert_eq!(store.update(key(0), |v| (*v, true)), None);
        assert_eq!(store.update(key(1), |v| (*v, true)), Some(1));
        // Touch 1, insert 3: 2 goes.
        store.with_entry(key(1), || 99, |_| ());
        store.with_entry(key(3), || 3, |_| ());
        assert_eq!(store.update(key(2), |v| (*v, true)), None);
        assert_eq!(store.with_entry(key(1), || 99, |v| *v), 1, "kept, value intact");
        assert_eq!(store.evictions(), 2);
        check_links(&store.shards[0].0.lock());
    }

    #[test]
    fn removal_keeps_the_list_and_index_consistent() {
        let store: Arc<BoundedStore<u64>> = BoundedStore::new("test", SHARDS * 100);
        for n in 0..100u64 {
            store.with_entry(n, || n, |_| ());
        }
        for n in (0..100u64).step_by(3) {
            assert_eq!(store.update(n, |v| (*v, false)), Some(n));
        }
        check_links(&store.shards[0].0.lock());
        store.retain(|h, v| {
            assert_eq!(h, *v);
            h % 2 == 0
        });
        check_links(&store.shards[0].0.lock());
        assert_eq!(store.keys(), (0..100).filter(|n| n % 3 != 0 && n % 2 == 0).count());
        store.set_max_keys(SHARDS * 5);
        check_links(&store.shards[0].0.lock());
        assert_eq!(store.keys(), 5);
        assert_eq!(store.max_keys(), SHARDS * 5);
    }

    #[test]
    fn a_flood_of_distinct_keys_stays_at_the_bound() {
        let store: Arc<BoundedStore<u64>> = BoundedStore::new("test", 1000);
        for n in 0..50_000u64 {
            let h = store.hash(7, &n.to_string());
            store.with_entry(h, || n, |v| *v += 1);
        }
        assert_eq!(store.keys(), 1000);
        assert_eq!(store.evictions(), 49_000);
        for s in store.shards.iter() {
            let s = s.0.lock();
            assert!(s.entries.capacity() <= s.cap.max(8), "slabs grow to their share only");
            check_links(&s);
        }
        assert_ne!(store.hash(1, "a"), store.hash(2, "a"), "scopes apart");
    }
}
