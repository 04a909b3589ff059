//! Verified bearer tokens, keyed by the SHA-256 of the token (the token itself is not kept as a
//! key), each expiring with its token: a token seen again costs a hash and a lookup instead of
//! a signature check. Bounded: when full, expired entries go first, then arbitrary ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value};

/// Entries at most.
pub const CAPACITY: usize = 1024;

type Key = [u8; 32];
/// Verified claims and when they stop being valid.
type Entry = (Arc<Map<String, Value>>, i64);

/// The cache of one configuration.
#[derive(Default)]
pub struct TokenCache {
    map: Mutex<HashMap<Key, Entry>>,
}

/// The cache key of a token.
pub fn key(token: &str) -> Key {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut k = [0u8; 32];
    k.copy_from_slice(d.as_ref());
    k
}

impl TokenCache {
    /// The claims of a token verified before and not yet expired at `now`.
    pub fn get(&self, key: &Key, now: i64) -> Option<Arc<Map<String, Value>>> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some((claims, until)) if *until > now => Some(claims.clone()),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `claims` until `until` (Unix seconds).
    pub fn put(&self, key: Key, claims: Arc<Map<String, Value>>, until: i64, now: i64) {
        if until <= now {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= CAPACITY {
            map.retain(|_, (_, u)| *u > now);
        }
        while map.len() >= CAPACITY {
            let Some(k) = map.keys().next().copied() else { break };
            map.remove(&k);
        }
        map.insert(key, (claims, until));
    }

    /// Entries now.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_with_their_token_and_the_cache_stays_bounded() {
        let c = TokenCache::default();
        let claims = Arc::new(Map::new());
        c.put(key("a"), claims.clone(), 100, 10);
        assert!(c.get(&key("a"), 99).is_some());
        assert!(c.get(&key("a"), 100).is_none(), "expired with the token");
        c.put(key("expired"), claims.clone(), 5, 10);
        assert!(c.is_empty(), "an expired token is not kept");
        for i in 0..CAPACITY + 10 {
            c.put(key(&i.to_string()), claims.clone(), 100, 10);
        }
        assert_eq!(c.len(), CAPACITY);
    }
}
