//! Requests that outlive the client's request (proxy-mirror's copies, a logger's deliveries):
//! sent through the host's HTTP client on the calling worker, detached from the request that
//! started them, and bounded.
//!
//! [`Background::send`] returns at once. The request runs on the worker as a task of its own
//! (its answer is read and discarded), so the client's request is never delayed by it and never
//! fails because of it. At most `limit` requests of one [`Background`] are in flight at a time:
//! beyond that a request is dropped, not queued, and counted, so that a target that hangs costs
//! at most `limit` connections and never memory without bound. Outcomes are counted in
//! [`BackgroundCounters`], which a plugin shares between its instances and exposes as metrics
//! ([`BackgroundCounters::expose`], from a source registered in `Plugin::init`).
//!
//! ```
//! use std::sync::{Arc, LazyLock};
//! use weir_plugin::background::{Background, BackgroundCounters};
//! use weir_plugin::http::Method;
//! use weir_plugin::{NoServices, OutboundRequest, Services};
//!
//! static COUNTERS: LazyLock<Arc<BackgroundCounters>> = LazyLock::new(Default::default);
//!
//! // In `build`: one per instance, so that each configuration has its own bound.
//! let copies = Background::new(NoServices.http_client(), 64, COUNTERS.clone());
//! // In a phase: never waits. Without a worker to run it (here), it is dropped and counted.
//! let started = copies.send(OutboundRequest::new(Method::GET, "http://127.0.0.1:1/copy"));
//! assert!(!started);
//! assert_eq!(COUNTERS.snapshot().dropped, 1);
//! ```

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::Exposition;
use crate::services::{HttpClient, OutboundRequest};

/// Outcomes of background requests, shared by the instances of a plugin.
#[derive(Debug, Default)]
pub struct BackgroundCounters {
    started: AtomicU64,
    dropped: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
    in_flight: AtomicI64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountersSnapshot {
    /// Started on a worker.
    pub started: u64,
    /// Not started: the bound was reached, or no worker could run them.
    pub dropped: u64,
    /// Answered (any status).
    pub answered: u64,
    /// No answer: refused, timed out, unreadable.
    pub failed: u64,
    /// Running now.
    pub in_flight: i64,
}

impl BackgroundCounters {
    /// The counters now.
    pub fn snapshot(&self) -> CountersSnapshot {
        CountersSnapshot {
            started: self.started.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            answered: self.answered.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
        }
    }

    /// Writes `<family>_requests_total{outcome="started|dropped|answered|failed"}` (counter) and
    /// `<family>_in_flight` (gauge).
    pub fn expose(&self, e: &mut Exposition, family: &str, what: &str) {
        let now = self.snapshot();
        let total = format!("{family}_requests_total");
        e.family(&total, "counter", &format!("{what}, by outcome (dropped: over the in-flight bound)."));
        for (outcome, n) in
            [("started", now.started), ("dropped", now.dropped), ("answered", now.answered), ("failed", now.failed)]
        {
            e.sample(&total, &[("outcome", outcome)], n);
        }
        let gauge = format!("{family}_in_flight");
        e.family(&gauge, "gauge", &format!("{what} running now."));
        e.sample(&gauge, &[], now.in_flight);
    }
}

/// A bounded sender of background requests (see the module documentation).
pub struct Background {
    client: Arc<dyn HttpClient>,
    limit: usize,
    in_flight: Arc<AtomicUsize>,
    counters: Arc<BackgroundCounters>,
}

/// One in-flight place, given back when the request's task ends (however it ends: answered,
/// failed, or dropped with its worker).
struct Place {
    in_flight: Arc<AtomicUsize>,
    counters: Arc<BackgroundCounters>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.counters.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Background {
    /// A sender through `client` with at most `limit` requests in flight, counting into
    /// `counters`.
    pub fn new(client: Arc<dyn HttpClient>, limit: usize, counters: Arc<BackgroundCounters>) -> Self {
        Background { client, limit, in_flight: Arc::new(AtomicUsize::new(0)), counters }
    }

    /// Starts `req` on the calling worker and returns at once: `true` when it started, `false`
    /// when it was dropped (the bound is reached, or there is no worker to run it here).
    pub fn send(&self, req: OutboundRequest) -> bool {
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let place = Place { in_flight: self.in_flight.clone(), counters: self.counters.clone() };
        let answer = self.client.send(req);
        let task = Box::pin(async move {
            let outcome = answer.await;
            let counter = match &outcome {
                Ok(_) => &place.counters.answered,
                Err(e) => {
                    log::debug!("background request: {e}");
                    &place.counters.failed
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
            drop(place);
        });
        // A task the host cannot run is dropped here, giving its place back.
        if self.client.spawn(task) {
            self.counters.started.fetch_add(1, Ordering::Relaxed);
            true
        } else {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    /// Requests of this sender running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::{Cell, RefCell};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use http::{HeaderMap, Method, StatusCode};

    use super::*;
    use crate::services::{LocalTask, OutboundError, OutboundResponse, SendFuture};

    /// Answers when told to; the tasks it is given wait in `TASKS`, polled by hand.
    struct Manual {
        fail: bool,
    }

    thread_local! {
        /// Whether the answers may come (each test thread has its own).
        static OPEN: Cell<bool> = const { Cell::new(false) };
        static TASKS: RefCell<Vec<LocalTask>> = const { RefCell::new(Vec::new()) };
    }

    struct Gate;
    impl Future for Gate {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if OPEN.get() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    impl HttpClient for Manual {
        fn send(&self, _req: OutboundRequest) -> SendFuture {
            let fail = self.fail;
            Box::pin(async move {
                Gate.await;
                if fail {
                    Err(OutboundError { timeout: true, reason: "slow".into() })
                } else {
                    Ok(OutboundResponse { status: StatusCode::OK, headers: HeaderMap::new(), body: Default::default() })
                }
            })
        }
        fn spawn(&self, task: LocalTask) -> bool {
            TASKS.with(|t| t.borrow_mut().push(task));
            true
        }
    }

    fn poll_all() -> usize {
        let mut cx = Context::from_waker(Waker::noop());
        TASKS.with(|t| {
            let mut tasks = t.borrow_mut();
            tasks.retain_mut(|t| t.as_mut().poll(&mut cx).is_pending());
            tasks.len()
        })
    }

    #[test]
    fn the_bound_drops_and_counts_then_frees_places_as_requests_end() {
        for fail in [false, true] {
            OPEN.set(false);
            let client = Arc::new(Manual { fail });
            let counters = Arc::new(BackgroundCounters::default());
            let b = Background::new(client.clone(), 2, counters.clone());
            let req = || OutboundRequest::new(Method::GET, "http://127.0.0.1:1/");
            assert!(b.send(req()) && b.send(req()));
            assert!(!b.send(req()), "the third is over the bound");
            assert_eq!(poll_all(), 2, "both still wait");
            assert_eq!((b.in_flight(), counters.snapshot().in_flight), (2, 2));
            OPEN.set(true);
            assert_eq!(poll_all(), 0);
            let now = counters.snapshot();
            assert_eq!((now.started, now.dropped, now.in_flight), (2, 1, 0));
            assert_eq!((now.answered, now.failed), if fail { (0, 2) } else { (2, 0) });
            assert!(b.send(req()), "places are given back");
            TASKS.with(|t| t.borrow_mut().clear());
            assert_eq!(b.in_flight(), 0, "a task dropped unfinished gives its place back");
        }
    }

    #[test]
    fn counters_are_exposed_as_two_families() {
        let c = BackgroundCounters::default();
        c.dropped.fetch_add(3, Ordering::Relaxed);
        let mut e = Exposition::new("weir_");
        c.expose(&mut e, "proxy_mirror", "Mirrored requests");
        let text = e.into_text();
        assert!(text.contains("weir_proxy_mirror_requests_total{outcome=\"dropped\"} 3"), "{text}");
        assert!(text.contains("# TYPE weir_proxy_mirror_in_flight gauge\nweir_proxy_mirror_in_flight 0"), "{text}");
    }
}
