//! The `local` policy: fixed-window counters in this process, shared by its workers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::Verdict;

/// Counters in this process.
#[derive(Default)]
pub struct LocalStore {
    inner: Mutex<LocalInner>,
}

/// Windows by scope, then by key: a lookup borrows the key (no copy of it per request).
#[derive(Default)]
struct LocalInner {
    windows: HashMap<u64, HashMap<String, (Instant, u64)>>,
    /// Keys across all scopes.
    count: usize,
    swept: Option<Instant>,
}

impl LocalStore {
    /// Counts one request of `key` in scope `scope` against `limit` per `window`.
    pub fn incoming(&self, scope: u64, key: &str, limit: u64, window: Duration) -> Verdict {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        // Drop expired windows now and then so that the map stays bounded by live keys.
        if inner.count > 10_000 && inner.swept.is_none_or(|t| now.duration_since(t) > window) {
            let mut count = 0;
            inner.windows.retain(|_, keys| {
                keys.retain(|_, (start, _)| now.duration_since(*start) < window);
                count += keys.len();
                !keys.is_empty()
            });
            inner.count = count;
            inner.swept = Some(now);
        }
        let inner = &mut *inner;
        let keys = inner.windows.entry(scope).or_default();
        let slot = match keys.get_mut(key) {
            Some(s) => s,
            None => {
                inner.count += 1;
                keys.entry(key.to_owned()).or_insert((now, 0))
            }
        };
        if now.duration_since(slot.0) >= window {
            *slot = (now, 0);
        }
        let reset = window.saturating_sub(now.duration_since(slot.0)).as_secs_f64().ceil() as u64;
        if slot.1 >= limit {
            return Verdict { allowed: false, remaining: 0, reset };
        }
        slot.1 += 1;
        Verdict { allowed: true, remaining: limit - slot.1, reset }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_window_counts_and_resets() {
        let s = LocalStore::default();
        let w = Duration::from_millis(200);
        assert_eq!(s.incoming(1, "a", 2, w).remaining, 1);
        assert!(s.incoming(1, "a", 2, w).allowed);
        assert!(!s.incoming(1, "a", 2, w).allowed);
        assert!(s.incoming(1, "b", 2, w).allowed, "keys are independent");
        assert!(s.incoming(2, "a", 2, w).allowed, "scopes are independent");
        std::thread::sleep(Duration::from_millis(220));
        assert!(s.incoming(1, "a", 2, w).allowed, "a new window starts");
    }
}
