//! A map bounded by total weight (bytes) and by length, evicting the least recently used entry
//! first. Keys are cache-key digests. Used for a memory zone's entries, a disk zone's index and
//! its hot entries. Not locked here: each zone holds its maps behind its own mutex, taken for
//! the map operation only (never across an await).

use hashlink::LinkedHashMap;

/// A cache key's digest (the first 16 bytes of its SHA-256).
pub type Digest = [u8; 16];

/// See the module documentation.
pub struct Lru<V> {
    map: LinkedHashMap<Digest, (V, u64)>,
    weight: u64,
    max_weight: u64,
    max_len: usize,
}

impl<V> Lru<V> {
    /// An empty map holding at most `max_weight` in total and `max_len` entries.
    pub fn new(max_weight: u64, max_len: usize) -> Self {
        Lru { map: LinkedHashMap::new(), weight: 0, max_weight, max_len: max_len.max(1) }
    }

    /// The value of `key`, made the most recently used.
    pub fn get(&mut self, key: &Digest) -> Option<&V> {
        self.map.to_back(key).map(|(v, _)| &*v)
    }

    /// The value of `key`, without changing its recency.
    pub fn peek(&self, key: &Digest) -> Option<&V> {
        self.map.get(key).map(|(v, _)| v)
    }

    /// Inserts (or replaces) `key` as the most recently used entry, then evicts the least
    /// recently used ones until the bounds hold. Returns the evicted entries (a replaced value
    /// is not among them), or the value back when it alone is heavier than the whole map.
    pub fn insert(&mut self, key: Digest, value: V, weight: u64) -> Result<Vec<(Digest, V)>, V> {
        if weight > self.max_weight {
            return Err(value);
        }
        if let Some((_, old)) = self.map.insert(key, (value, weight)) {
            self.weight -= old;
        }
        self.weight += weight;
        let mut evicted = Vec::new();
        while self.weight > self.max_weight || self.map.len() > self.max_len {
            match self.map.pop_front() {
                Some((k, (v, w))) => {
                    self.weight -= w;
                    evicted.push((k, v));
                }
                None => break,
            }
        }
        Ok(evicted)
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &Digest) -> Option<V> {
        let (v, w) = self.map.remove(key)?;
        self.weight -= w;
        Some(v)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Total weight held.
    pub fn weight(&self) -> u64 {
        self.weight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u8) -> Digest {
        [n; 16]
    }

    #[test]
    fn evicts_the_least_recently_used_by_weight_and_length() {
        let mut lru = Lru::new(100, 3);
        assert!(lru.insert(k(1), "a", 40).unwrap_or_default().is_empty());
        assert!(lru.insert(k(2), "b", 40).unwrap_or_default().is_empty());
        assert_eq!(lru.get(&k(1)), Some(&"a"), "1 is now the most recent");
        let evicted = lru.insert(k(3), "c", 40).unwrap_or_default();
        assert_eq!(evicted, vec![(k(2), "b")], "2 was the least recently used");
        assert_eq!(lru.weight(), 80);
        let evicted = lru.insert(k(4), "d", 1).unwrap_or_default();
        assert!(evicted.is_empty());
        let evicted = lru.insert(k(5), "e", 1).unwrap_or_default();
        assert_eq!(evicted, vec![(k(1), "a")], "the length bound evicts too");
        assert_eq!(lru.len(), 3);
    }

    #[test]
    fn replacing_keeps_the_weight_right_and_too_heavy_values_come_back() {
        let mut lru = Lru::new(100, 10);
        let _ = lru.insert(k(1), 1, 60);
        let _ = lru.insert(k(1), 2, 30);
        assert_eq!((lru.len(), lru.weight()), (1, 30));
        assert_eq!(lru.insert(k(2), 3, 101), Err(3));
        assert_eq!(lru.remove(&k(1)), Some(2));
        assert_eq!((lru.len(), lru.weight()), (0, 0));
        assert_eq!(lru.peek(&k(1)), None);
    }
}
