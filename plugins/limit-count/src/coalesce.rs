//! Requests counting the same key of a fixed window in Redis at the same time share calls:
//! while a key's call is in flight, the requests that arrive join one batch, sent as a single
//! `INCRBY` of its size when that call returns. A request still gets a count of its own (the
//! batch's counts are consecutive: the request that joined `i`-th a batch of `c` whose `INCRBY`
//! returned `n` counted `n - c + 1 + i`), so every decision is exactly the one a call per
//! request would have made, in the order the batch was joined. What changes is the number of
//! round trips under load (one per batch, not per request) and a joiner's wait: the call in
//! flight, then its batch's call.
//!
//! A request alone (no call in flight for its key) makes its own call, on its own task. A
//! batch's call runs on a task of its own, so a client that leaves never strands the others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;
use weir_plugin::limit::redis::{RedisStore, Unavailable};

use crate::shared;

/// What one call returned: the count after it and the window's milliseconds left.
type Counted = Result<(u64, u64), Unavailable>;

/// The requests that joined while a call for their key was in flight.
#[derive(Default)]
struct Batch {
    size: AtomicU64,
    counted: Mutex<Option<(Counted, u64)>>,
    done: Notify,
}

impl Batch {
    async fn wait(&self) -> (Counted, u64) {
        loop {
            let done = self.done.notified();
            if let Some(c) = *self.counted.lock() {
                return c;
            }
            done.await;
        }
    }

    fn finish(&self, counted: Counted, size: u64) {
        *self.counted.lock() = Some((counted, size));
        self.done.notify_waiters();
    }
}

/// The keys with a call in flight, and each one's batch waiting to be sent.
#[derive(Default)]
pub struct Coalescer {
    keys: Mutex<HashMap<String, Option<Arc<Batch>>>>,
}

/// Ends a key's call: its batch, if any joined, is sent next by a task of its own.
struct HandOver {
    coalescer: Arc<Coalescer>,
    redis: Arc<RedisStore>,
    key: String,
    window_ms: u64,
}

impl Drop for HandOver {
    fn drop(&mut self) {
        let next = {
            let mut keys = self.coalescer.keys.lock();
            match keys.get_mut(&self.key).and_then(Option::take) {
                Some(batch) => batch,
                None => {
                    keys.remove(&self.key);
                    return;
                }
            }
        };
        let (coalescer, redis, key, window_ms) =
            (self.coalescer.clone(), self.redis.clone(), std::mem::take(&mut self.key), self.window_ms);
        let fallback = next.clone();
        if !weir_plugin::limit::spawn(flush(coalescer.clone(), redis, key.clone(), window_ms, next)) {
            // No runtime to send it on (never on a worker): the batch fails as an outage would.
            fallback.finish(Err(Unavailable), fallback.size.load(Ordering::Relaxed));
            coalescer.keys.lock().remove(&key);
        }
    }
}

/// Sends batches for `key` until none is waiting.
async fn flush(coalescer: Arc<Coalescer>, redis: Arc<RedisStore>, key: String, window_ms: u64, mut batch: Arc<Batch>) {
    loop {
        // Taken out of the map: nobody joins it any more.
        let size = batch.size.load(Ordering::Relaxed);
        let counted = shared::fixed_add(&redis, &key, size, window_ms).await;
        batch.finish(counted, size);
        let mut keys = coalescer.keys.lock();
        match keys.get_mut(&key).and_then(Option::take) {
            Some(next) => batch = next,
            None => {
                keys.remove(&key);
                return;
            }
        }
    }
}

impl Coalescer {
    /// Counts one request for `key` in a fixed window of `window_ms`: the count including it
    /// and the milliseconds left.
    pub async fn count(self: &Arc<Self>, redis: &Arc<RedisStore>, key: String, window_ms: u64) -> Counted {
        let joined = {
            let mut keys = self.keys.lock();
            match keys.get_mut(&key) {
                Some(open) => {
                    let batch = open.get_or_insert_with(Default::default).clone();
                    let i = batch.size.fetch_add(1, Ordering::Relaxed);
                    Some((batch, i))
                }
                None => {
                    keys.insert(key.clone(), None);
                    None
                }
            }
        };
        match joined {
            Some((batch, i)) => {
                let (counted, size) = batch.wait().await;
                counted.map(|(n, left)| ((n + 1 + i).saturating_sub(size), left))
            }
            None => {
                let turn = HandOver { coalescer: self.clone(), redis: redis.clone(), key, window_ms };
                shared::fixed_add(redis, &turn.key, 1, window_ms).await
            }
        }
    }
}
