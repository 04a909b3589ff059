//! The in-process cache of hot links: code → the link and when it was read. Bounded; when full,
//! an arbitrary half is dropped. It never decides validity on its own: expiry, `valid_since` and
//! deletion are checked against the clock on every hit, unknown codes are never cached, and an
//! entry older than [`TTL_SECS`] is read again (so a change or deletion made through another
//! instance shows within that time).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::store::links::Link;

/// Seconds a cached link is trusted.
pub const TTL_SECS: i64 = 5;

/// The cache.
pub struct Cache {
    map: Mutex<HashMap<String, (Arc<Link>, i64)>>,
    cap: usize,
}

impl Cache {
    /// A cache of at most `cap` codes.
    pub fn new(cap: usize) -> Self {
        Cache { map: Mutex::new(HashMap::new()), cap }
    }
    /// A cached link, read less than [`TTL_SECS`] before `now`.
    pub fn get(&self, code: &str, now: i64) -> Option<Arc<Link>> {
        self.map.lock().get(code).filter(|(_, at)| now - at < TTL_SECS).map(|(l, _)| l.clone())
    }
    /// Caches a stored link, read at `now`.
    pub fn put(&self, link: Arc<Link>, now: i64) {
        let mut map = self.map.lock();
        if map.len() >= self.cap {
            let drop: Vec<String> = map.keys().take(self.cap / 2).cloned().collect();
            for k in drop {
                map.remove(&k);
            }
        }
        map.insert(link.code.clone(), (link, now));
    }
    /// Forgets a code (changed or deleted here).
    pub fn remove(&self, code: &str) {
        self.map.lock().remove(code);
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
