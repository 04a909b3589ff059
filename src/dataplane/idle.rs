//! A worker's parked keep-alive connections (`h1server`: idle for a second, holding no server
//! state), oldest first. The set closes them, so that a parked connection needs no timer or
//! stop signal of its own: the oldest when `accept` runs out of file descriptors (nginx reuses
//! its idle keep-alive connections the same way), those idle past their limit (one sweep a
//! second for the whole worker, [`IdleSet::expire`]), and all of them when the worker stops.
//! One set per worker, on its thread: no lock, and nothing on a request's path (a connection
//! joins when it parks and leaves when its client sends again or goes).
//!
//! A plain TCP connection parks outside any task ([`IdleSet::park_socket`]): the set keeps its
//! socket, registered in the worker's own readiness set (an epoll instance, off tokio's
//! reactor), and what resumes it. The worker's [`sweep`] task waits on that set too, and when a
//! client sends again, hands the socket back to tokio and starts the connection's task anew.
//! Parked this way a connection costs its socket and a few hundred bytes: no task, no timer, no
//! reactor registration. A TLS connection keeps its session, so it parks inside its task
//! ([`IdleSet::park`]) and is told when to close.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;

use mio::unix::SourceFd;
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many idle connections one failed `accept` closes at most (nginx's drain batch).
pub const RECLAIM_BATCH: usize = 32;

/// Readiness events taken from the parked sockets' set per look.
const EVENTS: usize = 256;

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

/// What resumes a socket parked outside its task, given the socket back.
pub type Resume = Box<dyn FnOnce(std::net::TcpStream)>;

/// What the set keeps of one parked connection.
enum Entry {
    /// Parked inside its task, which the notice tells to close.
    Task { until: Instant, close: Rc<Notice> },
    /// Parked outside any task: closed by dropping it.
    Socket { until: Instant, socket: std::net::TcpStream, resume: Resume },
}

impl Entry {
    fn until(&self) -> Instant {
        match self {
            Entry::Task { until, .. } | Entry::Socket { until, .. } => *until,
        }
    }

    /// Closes the connection: its task is told why, its socket is closed (dropped).
    fn close(self, why: Closed) {
        match self {
            Entry::Task { close, .. } => {
                close.why.set(Some(why));
                // A stored permit: the connection closes even if it is not waiting this instant.
                close.notify.notify_one();
            }
            Entry::Socket { socket, .. } => {
                log::debug!(
                    "client {}: {}",
                    socket.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
                    why.why()
                );
            }
        }
    }
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
    /// Where parked sockets are registered (set up by [`sweep`]; none before, or when the
    /// system refused one: connections then park inside their tasks).
    registry: RefCell<Option<mio::Registry>>,
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
    fn next_id(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        id
    }

    /// Enters a connection parked inside its task (the newest), which may stay idle until
    /// `until`.
    pub fn park(&self, until: Instant) -> Parked<'_> {
        let id = self.next_id();
        let close = Rc::new(Notice::default());
        let entry = Entry::Task { until, close: close.clone() };
        if self.stopping.get() {
            entry.close(Closed::Stopping);
        } else {
            self.parked.borrow_mut().insert(id, entry);
        }
        Parked { set: self, id, close }
    }

    /// Whether sockets can park outside their tasks ([`IdleSet::park_socket`]).
    pub fn takes_sockets(&self) -> bool {
        !self.stopping.get() && self.registry.borrow().is_some()
    }

    /// Keeps `socket` (parked, the newest) until its client sends again, then gives it to
    /// `resume`; or closes it (at `until`, on a stop, to make room). Refused sockets (the
    /// set takes none, see [`IdleSet::takes_sockets`], or the system refused to watch it)
    /// are closed.
    pub fn park_socket(&self, socket: std::net::TcpStream, until: Instant, resume: Resume) {
        let id = self.next_id();
        let registered = match &*self.registry.borrow() {
            Some(registry) if !self.stopping.get() => {
                // Tokens are the set's own numbers, never reused: an event for a socket closed
                // meanwhile finds no entry.
                let token = mio::Token(id as usize);
                registry.register(&mut SourceFd(&socket.as_raw_fd()), token, mio::Interest::READABLE)
            }
            _ => Err(std::io::Error::other("the worker stops")),
        };
        match registered {
            Ok(()) => {
                self.parked.borrow_mut().insert(id, Entry::Socket { until, socket, resume });
            }
            Err(e) => log::debug!("parking an idle connection: {e}; closed"),
        }
    }

    /// The client of the socket parked as `id` sent again (or left): it goes back to its task.
    fn wake(&self, id: u64) {
        let entry = {
            let mut parked = self.parked.borrow_mut();
            match parked.get(&id) {
                Some(Entry::Socket { .. }) => parked.remove(&id),
                _ => None,
            }
        };
        if let Some(Entry::Socket { socket, resume, .. }) = entry {
            if let Some(registry) = &*self.registry.borrow() {
                let _ = registry.deregister(&mut SourceFd(&socket.as_raw_fd()));
            }
            resume(socket);
        }
    }

    /// Closes the sockets parked outside their tasks (those inside theirs stay).
    fn close_sockets(&self) {
        let all = std::mem::take(&mut *self.parked.borrow_mut());
        let (sockets, tasks): (BTreeMap<_, _>, _) =
            all.into_iter().partition(|(_, e)| matches!(e, Entry::Socket { .. }));
        *self.parked.borrow_mut() = tasks;
        for (_, entry) in sockets {
            entry.close(Closed::Stopping);
        }
    }

    /// Closes up to `n` of the oldest parked connections; returns how many.
    pub fn reclaim(&self, n: usize) -> usize {
        let mut closed = 0;
        while closed < n {
            let Some((_, entry)) = self.parked.borrow_mut().pop_first() else { break };
            entry.close(Closed::Reclaimed);
            closed += 1;
        }
        closed
    }

    /// Closes the parked connections idle past their limit at `now`. They parked in order and
    /// share one limit, so only the oldest are looked at.
    pub fn expire(&self, now: Instant) -> usize {
        let mut closed = 0;
        loop {
            let entry = {
                let mut parked = self.parked.borrow_mut();
                match parked.first_entry() {
                    Some(first) if first.get().until() <= now => first.remove(),
                    _ => break,
                }
            };
            entry.close(Closed::Expired);
            closed += 1;
        }
        closed
    }

    /// The worker stops: every parked connection closes, and any that parks from now on.
    pub fn stop(&self) {
        self.stopping.set(true);
        let parked = std::mem::take(&mut *self.parked.borrow_mut());
        for (_, entry) in parked {
            entry.close(Closed::Stopping);
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

/// The worker's idle task, until it stops: runs [`IdleSet::expire`] once a second, and wakes
/// the sockets parked outside their tasks whose clients send again.
pub async fn sweep(set: &IdleSet) {
    let mut ready = match watch_sockets(set) {
        Ok(ready) => Some(ready),
        Err(e) => {
            log::warn!("idle keep-alive connections park inside their tasks: no readiness set ({e})");
            None
        }
    };
    let mut events = mio::Events::with_capacity(EVENTS);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !set.stopping.get() {
        let woken = async {
            match ready.as_mut() {
                Some(ready) => ready.readable_mut().await.map(Some),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            now = tick.tick() => {
                set.expire(now);
            }
            guard = woken => {
                let mut guard = match guard {
                    Ok(Some(guard)) => guard,
                    Ok(None) => continue,
                    Err(e) => {
                        // Without its readiness set no parked socket would ever wake: close
                        // them (their clients reconnect) and park inside tasks from now on.
                        log::warn!("idle keep-alive connections park inside their tasks: {e}");
                        set.registry.borrow_mut().take();
                        set.close_sockets();
                        ready = None;
                        continue;
                    }
                };
                events.clear();
                match guard.get_inner_mut().poll(&mut events, Some(Duration::ZERO)) {
                    // All taken: the set stays quiet until it signals again.
                    Ok(()) if events.iter().count() < EVENTS => guard.clear_ready(),
                    Ok(()) => {}
                    Err(e) => {
                        // (EINTR at most, with no wait.) Still ready: looked at again after a
                        // pause, so that nothing is lost and nothing spins.
                        log::debug!("idle keep-alive connections: {e}");
                        drop(guard);
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                }
                drop(guard);
                for event in events.iter() {
                    set.wake(event.token().0 as u64);
                }
            }
        }
    }
    set.registry.borrow_mut().take();
}

/// The parked sockets' readiness set, itself watched by tokio's reactor.
fn watch_sockets(set: &IdleSet) -> std::io::Result<AsyncFd<mio::Poll>> {
    let poll = mio::Poll::new()?;
    *set.registry.borrow_mut() = Some(poll.registry().try_clone()?);
    // SAFETY: the `Poll` owns its epoll descriptor from creation until it is dropped, which
    // `AsyncFd` does last; `as_raw_fd` returns that same descriptor every time.
    #[allow(unsafe_code)]
    let ready = unsafe { AsyncFd::register_with_interest(poll, tokio::io::Interest::READABLE) };
    ready.map_err(|e| e.into_parts().1)
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
        assert!(set.is_empty(), "told at once, never kept");
    }

    /// A server-side socket of a new loopback connection, and its client.
    fn pair(listener: &std::net::TcpListener) -> (std::net::TcpStream, std::net::TcpStream) {
        let client = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        client.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        (server, client)
    }

    /// Whether the server closed `client`'s connection (it reads the end of the stream).
    fn closed_by_server(client: &mut std::net::TcpStream) -> bool {
        use std::io::Read;
        matches!(client.read(&mut [0u8; 1]), Ok(0))
    }

    #[test]
    fn a_parked_socket_wakes_when_its_client_sends_and_closes_when_the_set_says() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let set = IdleSet::default();
        let woken: Rc<RefCell<Vec<std::net::TcpStream>>> = Rc::default();
        let resume = |into: &Rc<RefCell<Vec<std::net::TcpStream>>>| -> Resume {
            let into = into.clone();
            Box::new(move |socket| into.borrow_mut().push(socket))
        };
        let later = Instant::now() + Duration::from_secs(60);
        rt().block_on(async {
            let test = async {
                while !set.takes_sockets() {
                    tokio::task::yield_now().await;
                }
                // Bytes wake it: the socket comes back with them unread.
                let (server, mut client) = pair(&listener);
                set.park_socket(server, later, resume(&woken));
                assert_eq!(set.len(), 1);
                client.write_all(b"x").expect("write");
                let deadline = Instant::now() + Duration::from_secs(5);
                while woken.borrow().is_empty() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                let mut back = woken.borrow_mut().pop().expect("woken by the client's bytes");
                assert!(set.is_empty());
                back.set_nonblocking(false).expect("blocking");
                let mut byte = [0u8; 1];
                back.read_exact(&mut byte).expect("read");
                assert_eq!(&byte, b"x");
                // Expired, reclaimed and stopped sockets are closed; none is resumed.
                let (expiring, mut c1) = pair(&listener);
                set.park_socket(expiring, Instant::now(), resume(&woken));
                let (oldest, mut c2) = pair(&listener);
                set.park_socket(oldest, later, resume(&woken));
                let (last, mut c3) = pair(&listener);
                set.park_socket(last, later, resume(&woken));
                assert_eq!(set.expire(Instant::now()), 1);
                assert!(closed_by_server(&mut c1), "expired");
                assert_eq!(set.reclaim(1), 1);
                assert!(closed_by_server(&mut c2), "reclaimed");
                set.stop();
                assert!(closed_by_server(&mut c3), "stopped");
                assert!(!set.takes_sockets());
                let (late, mut c4) = pair(&listener);
                set.park_socket(late, later, resume(&woken));
                assert!(closed_by_server(&mut c4), "parked after the stop");
                assert!(set.is_empty() && woken.borrow().is_empty());
            };
            tokio::join!(sweep(&set), test);
        });
    }
}
