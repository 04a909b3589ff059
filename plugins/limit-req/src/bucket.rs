//! The leaky bucket (lua-resty-limit-req's arithmetic, in thousandths of a request): a key's
//! `excess` drains at `rate` per second; each request adds one. A request finding more than
//! `burst` in the bucket is rejected (and not added); otherwise it waits `excess / rate`
//! seconds, unless `nodelay`. A key's first request finds the bucket empty.
//!
//! Local buckets live in the plugin's bounded store (at most `max_keys` keys, least recently
//! used evicted): 16 bytes of state per key.

use weir_plugin::limit::store::BoundedStore;

/// One key's bucket: the excess (thousandths of a request) at `last` (ms).
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    excess: f64,
    last: u64,
}

/// The plugin's local store.
pub type Store = BoundedStore<Bucket>;

/// `rate` and `burst`, in thousandths of a request (per second, and in the bucket).
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Requests per second × 1000.
    pub rate: f64,
    /// Requests allowed over the rate × 1000.
    pub burst: f64,
}

/// What a request finds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Let through after this many seconds (0 for none).
    Delay(f64),
    /// Over `burst`.
    Reject,
}

impl Shape {
    /// The excess after one more request at `now`, from `excess` at `last`.
    pub fn next(&self, excess: f64, last: u64, now: u64) -> f64 {
        let elapsed = now.abs_diff(last) as f64;
        (excess - self.rate * elapsed / 1000.0 + 1000.0).max(0.0)
    }

    /// The delay of a request let through with `excess` in the bucket.
    pub fn delay(&self, excess: f64) -> f64 {
        excess / self.rate
    }
}

/// One request of `hash` at `now` (monotonic ms).
pub fn incoming(store: &Store, hash: u64, shape: Shape, now: u64) -> Decision {
    store.with_entry(
        hash,
        // A new bucket, marked so: its first request goes at once.
        || Bucket { excess: 0.0, last: u64::MAX },
        |b| {
            if b.last == u64::MAX {
                *b = Bucket { excess: 0.0, last: now };
                return Decision::Delay(0.0);
            }
            let excess = shape.next(b.excess, b.last, now);
            if excess > shape.burst {
                return Decision::Reject;
            }
            *b = Bucket { excess, last: now };
            Decision::Delay(shape.delay(excess))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_is_small() {
        // docs/plugins/limit-req.md states the memory per key from this.
        assert_eq!(std::mem::size_of::<Bucket>(), 16);
    }

    #[test]
    fn rate_burst_and_delay() {
        let s = Store::new("test", 1000);
        let h = s.hash(1, "a");
        // 1 request per second, burst 1.
        let shape = Shape { rate: 1000.0, burst: 1000.0 };
        assert_eq!(incoming(&s, h, shape, 0), Decision::Delay(0.0));
        assert_eq!(incoming(&s, h, shape, 0), Decision::Delay(1.0), "within burst: wait a second");
        assert_eq!(incoming(&s, h, shape, 0), Decision::Reject, "over burst");
        // Half a second later half a request has drained: 1.5 > 1.
        assert_eq!(incoming(&s, h, shape, 500), Decision::Reject);
        // A second later: excess 0 + 1 = 1, allowed with a delay of one second.
        assert_eq!(incoming(&s, h, shape, 1000), Decision::Delay(1.0));
        assert_eq!(incoming(&s, h, shape, 10_000), Decision::Delay(0.0), "a long pause drains the bucket");
        assert_eq!(incoming(&s, s.hash(1, "b"), shape, 0), Decision::Delay(0.0), "keys are apart");
    }
}
