//! Request collapsing: one upstream fetch for concurrent misses of one key.
//!
//! The first miss of a key becomes its *filler* ([`Fills::begin`] gives it a [`FillGuard`]); the
//! misses that follow wait on the fill (any worker: fills are shared by the zone) until the
//! filler stored the response, found it not cacheable, or went away; or until their wait runs
//! out ([`LOCK_TIMEOUT`], nginx's `proxy_cache_lock_timeout`), after which they fetch without
//! storing, as nginx does. A filler that goes away (client gone, upstream failed mid-body) hands
//! the fill to one of the waiters. No lock is held across an await: the state sits behind a
//! mutex taken for a read or a write, and waiters sleep on a `Notify`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::entry::Entry;
use crate::lru::Digest;

/// Longest a miss waits for another request's fill of its key.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How a fill ended.
#[derive(Debug, Clone)]
pub enum State {
    /// Still fetching.
    Pending,
    /// Stored: waiters answer with it.
    Stored(Arc<Entry>),
    /// The response was not cacheable: waiters fetch for themselves, without storing.
    Uncacheable,
    /// The filler went away before storing: one waiter takes the fill over.
    Abandoned,
}

/// One key's fill in progress.
pub struct Fill {
    state: Mutex<State>,
    done: Notify,
}

impl Fill {
    /// What the fill came to so far.
    pub fn state(&self) -> State {
        self.state.lock().clone()
    }

    /// Waits until the fill ends or `deadline` passes; the state then (`Pending` when the wait
    /// ran out).
    pub async fn wait(&self, deadline: tokio::time::Instant) -> State {
        loop {
            // Registered before the state is read: a notification between the read and the
            // await is not lost (`notify_waiters` reaches every `Notified` already created).
            let notified = self.done.notified();
            let state = self.state();
            if !matches!(state, State::Pending) {
                return state;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.state();
            }
        }
    }
}

/// The fills in progress of one zone.
#[derive(Default)]
pub struct Fills {
    by_key: Mutex<HashMap<Digest, Arc<Fill>>>,
}

impl Fills {
    /// Becomes the filler of `digest` (`Ok`), or finds the fill in progress to wait on (`Err`).
    pub fn begin(self: &Arc<Self>, digest: Digest) -> Result<FillGuard, Arc<Fill>> {
        let mut map = self.by_key.lock();
        if let Some(fill) = map.get(&digest) {
            return Err(fill.clone());
        }
        let fill = Arc::new(Fill { state: Mutex::new(State::Pending), done: Notify::new() });
        map.insert(digest, fill.clone());
        Ok(FillGuard { fills: self.clone(), digest, fill, ended: false })
    }

    /// Fills in progress.
    pub fn len(&self) -> usize {
        self.by_key.lock().len()
    }

    /// Whether no fill is in progress.
    pub fn is_empty(&self) -> bool {
        self.by_key.lock().is_empty()
    }
}

/// The filler's hold on a fill: ending it wakes the waiters; dropping it unended abandons it.
pub struct FillGuard {
    fills: Arc<Fills>,
    digest: Digest,
    fill: Arc<Fill>,
    ended: bool,
}

impl FillGuard {
    /// The response was stored as `entry`.
    pub fn stored(mut self, entry: Arc<Entry>) {
        self.end(State::Stored(entry));
    }

    /// The response is not cacheable.
    pub fn uncacheable(mut self) {
        self.end(State::Uncacheable);
    }

    fn end(&mut self, state: State) {
        if self.ended {
            return;
        }
        self.ended = true;
        {
            let mut map = self.fills.by_key.lock();
            if map.get(&self.digest).is_some_and(|f| Arc::ptr_eq(f, &self.fill)) {
                map.remove(&self.digest);
            }
        }
        *self.fill.state.lock() = state;
        self.fill.done.notify_waiters();
    }
}

impl Drop for FillGuard {
    fn drop(&mut self) {
        self.end(State::Abandoned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn waiters_see_how_the_fill_ended_and_an_abandoned_fill_can_be_taken_over() {
        let fills = Arc::new(Fills::default());
        let d = [7u8; 16];
        let guard = fills.begin(d).unwrap_or_else(|_| panic!("first is the filler"));
        let Err(fill) = fills.begin(d) else { panic!("second waits") };
        rt().block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            let waiter = fill.wait(deadline);
            let ender = async {
                tokio::task::yield_now().await;
                guard.uncacheable();
            };
            let (state, ()) = tokio::join!(waiter, ender);
            assert!(matches!(state, State::Uncacheable));
        });
        assert_eq!(fills.len(), 0);
        let guard = fills.begin(d).unwrap_or_else(|_| panic!("the key is free again"));
        let Err(fill) = fills.begin(d) else { panic!("waits") };
        drop(guard);
        assert!(matches!(fill.state(), State::Abandoned));
        assert!(fills.begin(d).is_ok(), "a waiter can take an abandoned fill over");
    }

    #[test]
    fn a_wait_runs_out() {
        let fills = Arc::new(Fills::default());
        let _guard = fills.begin([1; 16]).unwrap_or_else(|_| panic!("filler"));
        let Err(fill) = fills.begin([1; 16]) else { panic!("waits") };
        let state = rt().block_on(fill.wait(tokio::time::Instant::now() + Duration::from_millis(20)));
        assert!(matches!(state, State::Pending));
    }
}
