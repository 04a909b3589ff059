//! A worker's parked keep-alive connections (`h1server`: idle for a second, holding no server
//! state), oldest first. The set closes them, so that a parked connection needs no timer or
//! stop signal of its own: the oldest when `accept` runs out of file descriptors (nginx reuses
//! its idle keep-alive connections the same way), those idle past their limit (one sweep a
//! second for the whole worker, [`IdleSet::expire`]), and all of them when the worker stops.
//! One set per worker, on its thread: no lock, and nothing on a request's path (a connection
//! joins when it parks and leaves when its client sends again or goes).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How many idle connections one failed `accept` closes at most (nginx's drain batch).
pub const RECLAIM_BATCH: usize = 32;

/// Why the set closed a parked connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// The worker ran out of file descriptors.
    Reclaimed,
    /// Idle past its limit.
    Expired,
    /// The worker stops.
    Stopping,
}

impl Closed {
    /// For the connection's debug line.
    pub fn why(self) -> &'static str {
        match self {
            Closed::Reclaimed => "idle connection closed to make room for new clients",
            Closed::Expired => "idle for longer than the keep-alive timeout",
            Closed::Stopping => "stopping",
        }
    }
}

/// What the set keeps of one parked connection.
struct Entry {
    /// When it may be idle until.
    until: Instant,
    close: Rc<Notice>,
}

/// How the set tells a connection to close, and why.
#[derive(Default)]
struct Notice {
    notify: Notify,
    why: Cell<Option<Closed>>,
}

/// A worker's parked connections, by the order they parked in.
#[derive(Default)]
pub struct IdleSet {
    next: Cell<u64>,
    parked: RefCell<BTreeMap<u64, Entry>>,
    stopping: Cell<bool>,
}

/// A connection's place in its worker's [`IdleSet`] while parked; leaves it when dropped.
pub struct Parked<'a> {
    set: &'a IdleSet,
    id: u64,
    close: Rc<Notice>,
}

impl Parked<'_> {
    /// Resolves when the set closes the connection, with why.
    pub async fn closed(&self) -> Closed {
        self.close.notify.notified().await;
        self.close.why.get().unwrap_or(Closed::Reclaimed)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.set.parked.borrow_mut().remove(&self.id);
    }
}

impl IdleSet {
    /// Enters a parked connection (the newest), which may stay idle until `until`.
    pub fn park(&self, until: Instant) -> Parked<'_> {
        let id = self.next.get();
        self.next.set(id + 1);
        let close = Rc::new(Notice::default());
        if self.stopping.get() {
            Self::tell(&close, Closed::Stopping);
        }
        self.parked.borrow_mut().insert(id, Entry { until, close: close.clone() });
        Parked { set: self, id, close }
    }

    fn tell(close: &Notice, why: Closed) {
        close.why.set(Some(why));
        // A stored permit: the connection closes even if it is not waiting this instant.
        close.notify.notify_one();
    }

    /// Asks up to `n` of the oldest parked connections to close; returns how many were asked.
    pub fn reclaim(&self, n: usize) -> usize {
        let mut parked = self.parked.borrow_mut();
        let mut asked = 0;
        while asked < n {
            let Some((_, entry)) = parked.pop_first() else { break };
            Self::tell(&entry.close, Closed::Reclaimed);
            asked += 1;
        }
        asked
    }

    /// Closes the parked connections idle past their limit at `now`. They parked in order and
    /// share one limit, so only the oldest are looked at.
    pub fn expire(&self, now: Instant) -> usize {
        let mut parked = self.parked.borrow_mut();
        let mut closed = 0;
        while let Some(entry) = parked.first_entry() {
            if entry.get().until > now {
                break;
            }
            Self::tell(&entry.remove().close, Closed::Expired);
            closed += 1;
        }
        closed
    }

    /// The worker stops: every parked connection closes, and any that parks from now on.
    pub fn stop(&self) {
        self.stopping.set(true);
        for (_, entry) in std::mem::take(&mut *self.parked.borrow_mut()) {
            Self::tell(&entry.close, Closed::Stopping);
        }
    }

    /// How many connections are parked.
    pub fn len(&self) -> usize {
        self.parked.borrow().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Runs [`IdleSet::expire`] once a second until the worker stops.
pub async fn sweep(set: &IdleSet) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !set.stopping.get() {
        let now = tick.tick().await;
        set.expire(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    }

    async fn closed_soon(p: &Parked<'_>) -> Option<Closed> {
        tokio::time::timeout(Duration::from_millis(50), p.closed()).await.ok()
    }

    #[test]
    fn the_oldest_are_reclaimed_first_and_leavers_are_forgotten() {
        let set = IdleSet::default();
        let later = Instant::now() + Duration::from_secs(60);
        let a = set.park(later);
        let b = set.park(later);
        let c = set.park(later);
        drop(b);
        assert_eq!(set.len(), 2);
        assert_eq!(set.reclaim(1), 1);
        // `a` was the oldest: its permit is stored, `c` has none.
        rt().block_on(async {
            assert_eq!(closed_soon(&a).await, Some(Closed::Reclaimed));
            assert_eq!(closed_soon(&c).await, None);
        });
        assert_eq!(set.reclaim(10), 1);
        assert!(set.is_empty());
        drop((a, c));
        assert!(set.is_empty());
    }

    #[test]
    fn idle_connections_expire_in_order_and_all_close_on_stop() {
        let set = IdleSet::default();
        let now = Instant::now();
        let a = set.park(now + Duration::from_secs(1));
        let b = set.park(now + Duration::from_secs(2));
        let c = set.park(now + Duration::from_secs(3));
        assert_eq!(set.expire(now), 0);
        assert_eq!(set.expire(now + Duration::from_secs(2)), 2);
        rt().block_on(async {
            assert_eq!(closed_soon(&a).await, Some(Closed::Expired));
            assert_eq!(closed_soon(&b).await, Some(Closed::Expired));
            assert_eq!(closed_soon(&c).await, None);
        });
        set.stop();
        let d = set.park(now + Duration::from_secs(60));
        rt().block_on(async {
            assert_eq!(closed_soon(&c).await, Some(Closed::Stopping));
            assert_eq!(closed_soon(&d).await, Some(Closed::Stopping), "a connection parking after the stop closes");
        });
        assert_eq!(set.len(), 1);
    }
}
