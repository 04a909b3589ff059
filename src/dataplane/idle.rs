//! The idle keep-alive connections a worker may close to make room when it runs out of file
//! descriptors (nginx reuses its idle keep-alive connections the same way): the parked HTTP/1.1
//! connections (`h1server`: idle for a second, holding no server state), oldest first. One set
//! per worker, on its thread: no lock, and nothing on a request's path (a connection joins when
//! it parks and leaves when its client sends again or goes).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;

use tokio::sync::Notify;

/// How many idle connections one failed `accept` closes at most (nginx's drain batch).
pub const RECLAIM_BATCH: usize = 32;

/// A worker's parked connections, by the order they parked in.
#[derive(Default)]
pub struct IdleSet {
    next: Cell<u64>,
    parked: RefCell<BTreeMap<u64, Rc<Notify>>>,
}

/// A connection's place in its worker's [`IdleSet`] while parked; leaves it when dropped.
pub struct Parked<'a> {
    set: &'a IdleSet,
    id: u64,
    close: Rc<Notify>,
}

impl Parked<'_> {
    /// Resolves when the worker wants the connection closed to make room.
    pub async fn reclaimed(&self) {
        self.close.notified().await
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.set.parked.borrow_mut().remove(&self.id);
    }
}

impl IdleSet {
    /// Enters a parked connection (the newest).
    pub fn park(&self) -> Parked<'_> {
        let id = self.next.get();
        self.next.set(id + 1);
        let close = Rc::new(Notify::new());
        self.parked.borrow_mut().insert(id, close.clone());
        Parked { set: self, id, close }
    }

    /// Asks up to `n` of the oldest parked connections to close; returns how many were asked.
    pub fn reclaim(&self, n: usize) -> usize {
        let mut parked = self.parked.borrow_mut();
        let mut asked = 0;
        while asked < n {
            let Some((_, close)) = parked.pop_first() else { break };
            // A stored permit: the connection closes even if it is not waiting this instant.
            close.notify_one();
            asked += 1;
        }
        asked
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_are_reclaimed_first_and_leavers_are_forgotten() {
        let set = IdleSet::default();
        let a = set.park();
        let b = set.park();
        let c = set.park();
        drop(b);
        assert_eq!(set.len(), 2);
        assert_eq!(set.reclaim(1), 1);
        // `a` was the oldest: its permit is stored, `c` has none.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(100), a.reclaimed()).await.expect("a reclaimed");
            assert!(tokio::time::timeout(std::time::Duration::from_millis(20), c.reclaimed()).await.is_err());
        });
        assert_eq!(set.reclaim(10), 1);
        assert!(set.is_empty());
        drop((a, c));
        assert!(set.is_empty());
    }
}
