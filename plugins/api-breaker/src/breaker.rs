//! One circuit breaker: APISIX's api-breaker arithmetic, per route.
//!
//! Unhealthy upstream statuses are counted; every `failures`-th one (re)opens the breaker at
//! that moment for `2^floor(count / failures)` seconds (2, 4, 8...), at most `max_breaker_sec`.
//! While it is open, requests are answered by the plugin. A healthy status seen after failures
//! counts towards `successes`, which close it and forget everything; an unhealthy one resets
//! that count. Counting takes a lock for the arithmetic; whether the breaker is open is one
//! atomic load (the moment it closes, precomputed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// The thresholds of a configuration.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Unhealthy statuses that (re)open the breaker, counted.
    pub failures: u64,
    /// Healthy statuses in a row that close it.
    pub successes: u64,
    /// The longest it stays open.
    pub max_open: Duration,
}

/// What a status is, to the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// In `unhealthy.http_statuses`.
    Unhealthy,
    /// In `healthy.http_statuses`.
    Healthy,
}

#[derive(Default)]
struct Counts {
    unhealthy: u64,
    healthy: u64,
    /// When the breaker last (re)opened.
    opened: Option<Instant>,
}

/// A breaker (see the module documentation).
#[derive(Default)]
pub struct Breaker {
    counts: Mutex<Counts>,
    /// Milliseconds since [`EPOCH`] until which requests are refused (0: closed).
    open_until: AtomicU64,
}

/// The origin of [`Breaker::open_until`].
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn millis(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_millis()).unwrap_or(u64::MAX)
}

impl Breaker {
    /// Whether requests are refused at `now`.
    pub fn is_open(&self, now: Instant) -> bool {
        let until = self.open_until.load(Ordering::Acquire);
        until != 0 && millis(now) <= until
    }

    /// How long the breaker stays open after the `count`-th unhealthy status.
    fn open_for(count: u64, p: &Policy) -> Duration {
        let times = (count / p.failures).max(1);
        let secs = if times >= 32 { u64::MAX } else { 1u64 << times };
        Duration::from_secs(secs).min(p.max_open)
    }

    /// Counts an upstream status seen at `now`.
    pub fn observe(&self, seen: Seen, p: &Policy, now: Instant) {
        let mut c = self.counts.lock();
        match seen {
            Seen::Unhealthy => {
                c.unhealthy = c.unhealthy.saturating_add(1);
                c.healthy = 0;
                if c.unhealthy.is_multiple_of(p.failures) {
                    c.opened = Some(now);
                    let until = now.checked_add(Self::open_for(c.unhealthy, p)).map_or(u64::MAX, millis);
                    self.open_until.store(until.max(1), Ordering::Release);
                }
            }
            Seen::Healthy if c.unhealthy > 0 => {
                c.healthy += 1;
                if c.healthy >= p.successes {
                    *c = Counts::default();
                    self.open_until.store(0, Ordering::Release);
                }
            }
            Seen::Healthy => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Policy = Policy { failures: 3, successes: 2, max_open: Duration::from_secs(10) };

    #[test]
    fn opens_every_failures_th_time_for_twice_as_long_up_to_the_cap() {
        let b = Breaker::default();
        let t0 = Instant::now();
        for _ in 0..2 {
            b.observe(Seen::Unhealthy, &P, t0);
        }
        assert!(!b.is_open(t0), "two of three");
        b.observe(Seen::Unhealthy, &P, t0);
        assert!(b.is_open(t0) && b.is_open(t0 + Duration::from_millis(2000)));
        assert!(!b.is_open(t0 + Duration::from_millis(2001)), "2 s");
        let t1 = t0 + Duration::from_secs(3);
        for _ in 0..3 {
            b.observe(Seen::Unhealthy, &P, t1);
        }
        assert!(b.is_open(t1 + Duration::from_secs(4)) && !b.is_open(t1 + Duration::from_millis(4001)), "then 4 s");
        let t2 = t1 + Duration::from_secs(5);
        for _ in 0..3 {
            b.observe(Seen::Unhealthy, &P, t2);
        }
        assert!(!b.is_open(t2 + Duration::from_millis(8001)), "then 8 s");
        let t3 = t2 + Duration::from_secs(9);
        for _ in 0..30 {
            b.observe(Seen::Unhealthy, &P, t3);
        }
        assert!(b.is_open(t3 + Duration::from_secs(10)) && !b.is_open(t3 + Duration::from_millis(10_001)), "capped");
    }

    #[test]
    fn healthy_statuses_close_it_after_the_count_and_an_unhealthy_one_restarts_that_count() {
        let b = Breaker::default();
        let t0 = Instant::now();
        b.observe(Seen::Healthy, &P, t0);
        for _ in 0..3 {
            b.observe(Seen::Unhealthy, &P, t0);
        }
        b.observe(Seen::Healthy, &P, t0);
        b.observe(Seen::Unhealthy, &P, t0);
        b.observe(Seen::Healthy, &P, t0);
        assert!(b.is_open(t0), "one success, then a failure: the count starts again");
        b.observe(Seen::Healthy, &P, t0);
        assert!(!b.is_open(t0), "two in a row close it");
        for _ in 0..2 {
            b.observe(Seen::Unhealthy, &P, t0);
        }
        assert!(!b.is_open(t0), "and the failures were forgotten");
    }

    #[test]
    fn huge_counts_and_caps_do_not_overflow() {
        let p = Policy { failures: 1, successes: 1, max_open: Duration::from_secs(u64::MAX / 2) };
        let b = Breaker::default();
        let now = Instant::now();
        for _ in 0..100 {
            b.observe(Seen::Unhealthy, &p, now);
        }
        assert!(b.is_open(now + Duration::from_secs(1 << 40)));
    }
}
