//! `sync_interval` with a Redis policy (APISIX's delayed synchronization): between syncs a key
//! is counted here, against what Redis said was left, and the counts made here are added to
//! Redis in one call per key every `sync_interval` seconds.
//!
//! A key's first request in a window asks Redis (one round trip, as without `sync_interval`);
//! the following ones are decided locally, without waiting, from the quota Redis reported minus
//! what this instance counted since. Every interval a background task (on the worker that
//! counted first) adds each key's local count to Redis and takes Redis's new quota, which
//! includes what the other instances added. So one instance never lets more than the limit
//! through, and N instances together may let through, within one interval, up to what each
//! believed was left: at most the limit plus (N - 1) times one interval's local counts. Counts
//! made in the last interval of a window may land in the next window (they are added when the
//! task runs); counts not yet added when a key's window ends are dropped with it. At most
//! [`MAX_QUEUE`] keys wait for a sync per configuration; beyond, a key's counts stay local until
//! it is queued again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use weir_plugin::limit::redis::{RedisStore, Unavailable};

use crate::local::{Counter, Store};
use crate::{shared, Verdict};

/// Keys waiting for a sync, per configuration (APISIX's bound).
pub const MAX_QUEUE: usize = 10_000;

/// What this instance knows of a key's quota in Redis (24 bytes).
#[derive(Debug, Default, Clone, Copy)]
pub struct Quota {
    /// What Redis said was left, at the last sync.
    remaining: i64,
    /// When the window ends (wall ms); 0 = never synced.
    reset_at: u64,
    /// Counted here since the last sync.
    delta: u32,
    /// Waiting in the queue.
    queued: bool,
}

/// How windows are kept in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// `window_type: fixed`.
    Fixed,
    /// `window_type: sliding`.
    Sliding,
}

struct Pending {
    hash: u64,
    key: Box<str>,
    limit: u64,
    window_ms: u64,
}

/// The syncing of one configuration.
pub struct Syncer {
    redis: Arc<RedisStore>,
    store: Arc<Store>,
    interval: Duration,
    window: Window,
    queue: Mutex<Vec<Pending>>,
    scheduled: AtomicBool,
}

/// The decision made locally, or the need to ask Redis first.
pub enum Local {
    /// Decided; `queue` says the key must be queued for the next sync.
    Decided { verdict: Verdict, queue: bool },
    /// The window is unknown or over: ask Redis ([`Syncer::ask`]).
    Ask,
}

fn quota(c: &mut Counter) -> &mut Quota {
    if !matches!(c, Counter::Synced(_)) {
        *c = Counter::Synced(Quota::default());
    }
    match c {
        Counter::Synced(q) => q,
        // Just made one.
        _ => unreachable!("the counter was made a synced one above"),
    }
}

impl Syncer {
    /// The syncer of a configuration.
    pub fn new(redis: Arc<RedisStore>, store: Arc<Store>, interval: Duration, window: Window) -> Arc<Syncer> {
        Arc::new(Syncer {
            redis,
            store,
            interval,
            window,
            queue: Mutex::new(Vec::new()),
            scheduled: AtomicBool::new(false),
        })
    }

    /// The local store's hash of `key` in scope `scope_id`.
    pub fn hash(&self, scope_id: u64, key: &str) -> u64 {
        self.store.hash(scope_id, key)
    }

    /// The Redis key of `key` in `scope`, for this window type.
    pub fn redis_key(&self, scope: &str, key: &str) -> String {
        match self.window {
            Window::Fixed => shared::fixed_key(scope, key),
            Window::Sliding => shared::sliding_base(scope, key),
        }
    }

    /// Decides locally if the key's quota is known.
    pub fn local(&self, hash: u64, now: u64) -> Local {
        self.store.with_entry(
            hash,
            || Counter::Synced(Quota::default()),
            |c| {
                let q = quota(c);
                if q.reset_at == 0 || now >= q.reset_at || q.delta == u32::MAX {
                    // Counts of an ended window are dropped with it.
                    *q = Quota::default();
                    return Local::Ask;
                }
                let reset = (q.reset_at - now).div_ceil(1000);
                let remaining = q.remaining - i64::from(q.delta) - 1;
                if remaining < 0 {
                    return Local::Decided { verdict: Verdict { allowed: false, remaining: 0, reset }, queue: false };
                }
                q.delta += 1;
                let queue = !q.queued;
                q.queued = true;
                Local::Decided { verdict: Verdict { allowed: true, remaining: remaining as u64, reset }, queue }
            },
        )
    }

    async fn add(&self, key: &str, cost: u64, limit: u64, window_ms: u64, now: u64) -> Result<(i64, u64), Unavailable> {
        match self.window {
            Window::Fixed => {
                let (n, left) = shared::fixed_add(&self.redis, key, cost, window_ms).await?;
                Ok((limit as i64 - n as i64, left))
            }
            Window::Sliding => shared::sliding_add(&self.redis, key, cost, limit, window_ms, now).await,
        }
    }

    /// Counts one request in Redis and keeps the quota Redis reports.
    pub async fn ask(
        &self,
        hash: u64,
        key: &str,
        limit: u64,
        window_ms: u64,
        now: u64,
    ) -> Result<Verdict, Unavailable> {
        let (remaining, left) = self.add(key, 1, limit, window_ms, now).await?;
        let reset_at = now + left.max(1);
        self.store.with_entry(
            hash,
            || Counter::Synced(Quota::default()),
            |c| {
                let q = quota(c);
                q.remaining = remaining;
                q.reset_at = reset_at;
            },
        );
        let reset = left.div_ceil(1000);
        Ok(Verdict { allowed: remaining >= 0, remaining: remaining.max(0) as u64, reset })
    }

    /// Queues `key` for the next sync, and schedules one if none is.
    pub fn queue(self: &Arc<Self>, hash: u64, key: String, limit: u64, window_ms: u64) {
        {
            let mut queue = self.queue.lock();
            if queue.len() >= MAX_QUEUE {
                // Not queued: let the next request of the key try again.
                drop(queue);
                self.store.update(hash, |c| {
                    if let Counter::Synced(q) = c {
                        q.queued = false;
                    }
                    ((), true)
                });
                return;
            }
            queue.push(Pending { hash, key: key.into(), limit, window_ms });
        }
        if !self.scheduled.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            let spawned = weir_plugin::limit::spawn(async move {
                weir_plugin::limit::sleep(me.interval).await;
                me.scheduled.store(false, Ordering::Release);
                me.flush().await;
            });
            if !spawned {
                self.scheduled.store(false, Ordering::Release);
            }
        }
    }

    /// Adds every queued key's local count to Redis and takes its new quota.
    async fn flush(&self) {
        let pending = std::mem::take(&mut *self.queue.lock());
        for p in pending {
            let delta = self.store.update(p.hash, |c| match c {
                Counter::Synced(q) => {
                    q.queued = false;
                    (q.delta, true)
                }
                _ => (0, true),
            });
            let Some(delta) = delta.filter(|d| *d > 0) else { continue };
            let now = weir_plugin::limit::wall_ms();
            let Ok((remaining, left)) = self.add(&p.key, u64::from(delta), p.limit, p.window_ms, now).await else {
                // Redis is down (logged by the store): the counts stay here for the next sync.
                continue;
            };
            self.store.update(p.hash, |c| {
                if let Counter::Synced(q) = c {
                    q.delta = q.delta.saturating_sub(delta);
                    q.remaining = remaining;
                    q.reset_at = now + left.max(1);
                }
                ((), true)
            });
        }
    }
}
