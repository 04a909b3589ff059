//! The `local` policy: counters in this process, shared by its workers, in the plugin's bounded
//! store (`weir_plugin::limit::store`: at most `max_keys` keys, least recently used evicted).
//!
//! - Fixed windows start at a key's first request and last `time_window` seconds (monotonic
//!   clock), as lua-resty-limit-count's.
//! - Sliding windows (APISIX 3.x): windows aligned on the clock; a request is let through while
//!   the current window's count, plus the previous window's count weighted by the share of it
//!   still inside the sliding window, stays under the limit.

use weir_plugin::limit::store::BoundedStore;

use crate::Verdict;

/// One key's state. Every variant fits in 24 bytes.
pub enum Counter {
    /// A fixed window: when it started (monotonic ms) and requests counted in it.
    Fixed { start: u64, n: u64 },
    /// A sliding window: the current window's number (wall ms / window) and the counts of it and
    /// of the one before.
    Sliding { window: u64, cur: u64, prev: u64 },
    /// `sync_interval` with Redis: what Redis said last and what was counted here since.
    Synced(crate::sync::Quota),
}

/// The plugin's local store.
pub type Store = BoundedStore<Counter>;

/// Counts one request of `hash` against `limit` per `window_ms` in a fixed window.
pub fn fixed(store: &Store, hash: u64, limit: u64, window_ms: u64, now: u64) -> Verdict {
    store.with_entry(
        hash,
        || Counter::Fixed { start: now, n: 0 },
        |c| {
            if !matches!(c, Counter::Fixed { .. }) {
                *c = Counter::Fixed { start: now, n: 0 };
            }
            let Counter::Fixed { start, n } = c else { return Verdict::REJECT };
            if now.saturating_sub(*start) >= window_ms {
                (*start, *n) = (now, 0);
            }
            let reset = (window_ms - now.saturating_sub(*start).min(window_ms)).div_ceil(1000);
            if *n >= limit {
                return Verdict { allowed: false, remaining: 0, reset };
            }
            *n += 1;
            Verdict { allowed: true, remaining: limit - *n, reset }
        },
    )
}

/// The sliding-window decision on one window's counts (shared by the local and Redis stores).
/// `cur` and `prev` are the counts before this request; `remaining_ms` is what is left of the
/// current window. Returns the verdict and whether the request is to be counted.
pub fn slide(limit: u64, window_ms: u64, remaining_ms: u64, cur: u64, prev: u64) -> Verdict {
    let last = prev.min(limit) as f64;
    let weighted = last * remaining_ms as f64 / window_ms as f64;
    let reset_s = |ms: f64| (ms / 1000.0).ceil().max(0.0) as u64;
    if cur >= limit || weighted + cur as f64 >= limit as f64 {
        // APISIX: when the current window alone is not full, the wait is until enough of the
        // previous window has slid out.
        let wait = if cur >= limit || last == 0.0 {
            remaining_ms as f64
        } else {
            let rate = last / window_ms as f64;
            (remaining_ms as f64 - (limit - cur) as f64 / rate).max(0.0)
        };
        return Verdict { allowed: false, remaining: 0, reset: reset_s(wait) };
    }
    let remaining = (limit as f64 - (cur + 1) as f64 - weighted).floor().max(0.0) as u64;
    Verdict { allowed: true, remaining, reset: reset_s(remaining_ms as f64) }
}

/// Counts one request of `hash` in a sliding window; `now` is wall-clock ms.
pub fn sliding(store: &Store, hash: u64, limit: u64, window_ms: u64, now: u64) -> Verdict {
    let id = now / window_ms;
    let remaining_ms = window_ms - now % window_ms;
    store.with_entry(
        hash,
        || Counter::Sliding { window: id, cur: 0, prev: 0 },
        |c| {
            if !matches!(c, Counter::Sliding { .. }) {
                *c = Counter::Sliding { window: id, cur: 0, prev: 0 };
            }
            let Counter::Sliding { window, cur, prev } = c else { return Verdict::REJECT };
            if *window != id {
                *prev = if *window + 1 == id { *cur } else { 0 };
                (*window, *cur) = (id, 0);
            }
            let v = slide(limit, window_ms, remaining_ms, *cur, *prev);
            if v.allowed {
                *cur += 1;
            }
            v
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_is_small() {
        // docs/plugins/limit-count.md states the memory per key from this.
        assert_eq!(std::mem::size_of::<Counter>(), 32);
    }

    #[test]
    fn fixed_window_counts_and_resets() {
        let s = Store::new("test", 1000);
        let h = s.hash(1, "a");
        let v = fixed(&s, h, 2, 1000, 0);
        assert_eq!((v.allowed, v.remaining, v.reset), (true, 1, 1));
        assert!(fixed(&s, h, 2, 1000, 10).allowed);
        let v = fixed(&s, h, 2, 1000, 500);
        assert_eq!((v.allowed, v.remaining, v.reset), (false, 0, 1));
        assert!(fixed(&s, s.hash(1, "b"), 2, 1000, 500).allowed, "keys are independent");
        assert!(fixed(&s, s.hash(2, "a"), 2, 1000, 500).allowed, "scopes are independent");
        assert!(fixed(&s, h, 2, 1000, 1000).allowed, "a new window starts");
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let s = Store::new("test", 1000);
        let h = s.hash(1, "a");
        // Window 0 (0..10 s): 10 of 10 at its start.
        for i in 0..10 {
            assert!(sliding(&s, h, 10, 10_000, i).allowed, "request {i}");
        }
        assert!(!sliding(&s, h, 10, 10_000, 5_000).allowed, "full");
        // 2.5 s into window 1: 75 % of the previous window still counts (7.5): 3 more fit
        // (7.5 + 2 < 10), the fourth does not (7.5 + 3 >= 10).
        for _ in 0..3 {
            assert!(sliding(&s, h, 10, 10_000, 12_500).allowed);
        }
        let v = sliding(&s, h, 10, 10_000, 12_500);
        assert!(!v.allowed);
        // Not a fixed window: the boundary does not hand out a whole new quota.
        assert!(v.reset <= 8);
        // Two windows later, nothing of window 0 remains.
        assert!(sliding(&s, h, 10, 10_000, 30_000).allowed);
    }
}
