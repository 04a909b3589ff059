//! A map by string in shards that a table and the tables patched from it share.
//!
//! The route table holds one entry per URI: 10,000 for 10,000 routes. Copying all of them to
//! change one (a route change applied as a patch, `RouteTable::patched`) cost more than the rest
//! of the patch together. Here the entries live in [`SHARDS`] hash tables behind `Arc`s, picked by
//! six bits of the key's hash: a copy of the map copies the `Arc`s, and a change copies the one
//! shard it touches (about 1/64 of the entries) when another table still holds it. A lookup
//! hashes the key once, as a `HashMap`'s does (foldhash, seeded per process: keys are the
//! operator's, see `crate::fastmap`).
//!
//! The shard's bits are 32 to 37: hashbrown takes a slot's position from the low bits and its
//! one-byte filter from the top seven, so keys that share a shard still differ in both (shard by
//! the top bits and every key of a shard would share six of the filter's seven bits, and each
//! probe would compare strings with half its group).

use std::borrow::Borrow;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

/// How many shards a map has (a power of two: six bits of a hash pick one).
pub const SHARDS: usize = 64;

/// Where the bits that pick a shard start in a hash (see the module's doc).
const SHARD_SHIFT: u32 = 32;

/// A map from `K` (a string) to `V`, in shards shared between copies.
pub struct Shards<K, V> {
    hasher: foldhash::fast::RandomState,
    /// (An array, not a slice: a shard's index needs no bounds check.)
    shards: [Arc<HashTable<(K, V)>>; SHARDS],
}

impl<K, V> Default for Shards<K, V> {
    fn default() -> Self {
        Shards {
            hasher: foldhash::fast::RandomState::default(),
            shards: std::array::from_fn(|_| Arc::new(HashTable::new())),
        }
    }
}

impl<K, V> Clone for Shards<K, V> {
    /// A copy that shares every shard until one side changes it.
    fn clone(&self) -> Self {
        Shards { hasher: self.hasher.clone(), shards: self.shards.clone() }
    }
}

impl<K: Borrow<str>, V> Shards<K, V> {
    #[inline(always)]
    fn place(&self, key: &str) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, (hash >> SHARD_SHIFT) as usize & (SHARDS - 1))
    }

    /// The value of `key` (on the request path: inlined into the route lookup).
    #[inline(always)]
    pub fn get(&self, key: &str) -> Option<&V> {
        let (hash, at) = self.place(key);
        self.shards[at].find(hash, |(k, _)| k.borrow() == key).map(|(_, v)| v)
    }

    /// Makes room for `n` more keys in all (a build's first step: no rehashing on the way).
    pub fn reserve(&mut self, n: usize) {
        let Shards { hasher, shards } = self;
        for shard in shards.iter_mut() {
            if let Some(table) = Arc::get_mut(shard) {
                table.reserve(n / SHARDS + 1, |(k, _)| hasher.hash_one(k.borrow()));
            }
        }
    }

    /// Every key.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.shards.iter().flat_map(|s| s.iter().map(|(k, _)| k))
    }
}

impl<K: Borrow<str> + Clone, V: Clone> Shards<K, V> {
    /// The value of `key` to change, put in by `make` when there is none (the key it returns
    /// must be `key`). Its shard is copied first when another map shares it.
    pub fn get_or_insert_with(&mut self, key: &str, make: impl FnOnce() -> (K, V)) -> &mut V {
        let (hash, at) = self.place(key);
        let Shards { hasher, shards } = self;
        let table = Arc::make_mut(&mut shards[at]);
        let entry = table.entry(hash, |(k, _)| k.borrow() == key, |(k, _)| hasher.hash_one(k.borrow()));
        &mut entry.or_insert_with(make).into_mut().1
    }

    /// The value of `key` to change, if there is one (its shard copied first when shared).
    pub fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        let (hash, at) = self.place(key);
        // (A shard is copied only when the key is in it.)
        self.shards[at].find(hash, |(k, _)| k.borrow() == key)?;
        let table = Arc::make_mut(&mut self.shards[at]);
        table.find_mut(hash, |(k, _)| k.borrow() == key).map(|(_, v)| v)
    }

    /// Removes `key`; its value, if it had one.
    pub fn remove(&mut self, key: &str) -> Option<V> {
        let (hash, at) = self.place(key);
        self.shards[at].find(hash, |(k, _)| k.borrow() == key)?;
        let table = Arc::make_mut(&mut self.shards[at]);
        let found = table.find_entry(hash, |(k, _)| k.borrow() == key).ok()?;
        Some(found.remove().0 .1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_share_shards_until_one_changes() {
        let mut a: Shards<String, u32> = Shards::default();
        a.reserve(1000);
        for i in 0..1000 {
            *a.get_or_insert_with(&format!("/k/{i}"), || (format!("/k/{i}"), 0)) += i;
        }
        let mut b = a.clone();
        *b.get_mut("/k/7").expect("/k/7") = 70;
        assert_eq!(b.remove("/k/8"), Some(8));
        assert_eq!(b.remove("/k/8"), None);
        *b.get_or_insert_with("/new", || ("/new".into(), 1)) += 1;
        assert_eq!((a.get("/k/7"), a.get("/k/8"), a.get("/new")), (Some(&7), Some(&8), None));
        assert_eq!((b.get("/k/7"), b.get("/k/8"), b.get("/new")), (Some(&70), None, Some(&2)));
        assert_eq!((a.keys().count(), b.keys().count()), (1000, 1000));
        // At most the three shards b changed were copied.
        let shared = a.shards.iter().zip(b.shards.iter()).filter(|(x, y)| Arc::ptr_eq(x, y)).count();
        assert!(shared >= SHARDS - 3, "{shared} of {SHARDS} shards shared");
        assert!(b.get_mut("/absent").is_none());
    }
}
