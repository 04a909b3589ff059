//! The in-process cache of hot codes: code → (origin_url, expires_at). Bounded; when full, an
//! arbitrary half is dropped. It never decides validity on its own: expiry is checked against the
//! clock on every hit, and unknown codes are never cached.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// A cached code.
pub type Hit = (Arc<str>, Option<i64>);

/// The cache.
pub struct Cache {
    map: Mutex<HashMap<String, Hit>>,
    cap: usize,
}

impl Cache {
    /// A cache of at most `cap` codes.
    pub fn new(cap: usize) -> Self {
        Cache { map: Mutex::new(HashMap::new()), cap }
    }
    /// A cached code.
    pub fn get(&self, code: &str) -> Option<Hit> {
        self.map.lock().get(code).cloned()
    }
    /// Caches a stored code.
    pub fn put(&self, code: &str, origin: &str, expires_at: Option<i64>) {
        let mut map = self.map.lock();
        if map.len() >= self.cap {
            let drop: Vec<String> = map.keys().take(self.cap / 2).cloned().collect();
            for k in drop {
                map.remove(&k);
            }
        }
        map.insert(code.to_owned(), (Arc::from(origin), expires_at));
    }
    /// Codes cached.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }
    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Forgets everything.
    pub fn clear(&self) {
        self.map.lock().clear();
    }
}
