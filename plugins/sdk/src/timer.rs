//! Waiting without blocking the worker: an awaitable sleep for a plugin's waiting phase
//! ([`Flow::wait`](crate::Flow::wait)), as fault-injection's `delay` and a rate limiter's delay use.
//!
//! A data-plane worker serves all its connections on one thread, so `std::thread::sleep` in a
//! hook would stall every one of them; [`sleep`] parks only the request that awaits it. The
//! host's workers (and `testing::run`) run their futures with a timer; a
//! future polled outside any runtime finds no timer and ends at once, with a warning, rather
//! than panic on a request.
//!
//! ```
//! use std::time::Duration;
//! use weir_plugin::{timer, Flow, PluginInstance, RequestCtx};
//!
//! struct Slow(Duration);
//!
//! impl PluginInstance for Slow {
//!     fn rewrite<'a>(&'a self, _ctx: &'a mut RequestCtx) -> Flow<'a> {
//!         Flow::wait(async move {
//!             timer::sleep(self.0).await; // other requests of the worker go on meanwhile
//!             Flow::Continue
//!         })
//!     }
//! }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The future of [`sleep`] and [`sleep_until`]: ready once its deadline has passed.
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    inner: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.inner.as_mut() {
            Some(s) => s.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

/// Waits `duration` without blocking the worker (see the module documentation). A zero
/// duration is ready at once and costs no timer; one too long to represent waits for ever.
pub fn sleep(duration: Duration) -> Sleep {
    if duration.is_zero() || !on_runtime() {
        return Sleep { inner: None };
    }
    Sleep { inner: Some(Box::pin(tokio::time::sleep(duration))) }
}

fn on_runtime() -> bool {
    let on = tokio::runtime::Handle::try_current().is_ok();
    if !on {
        log::warn!("timer::sleep outside the host's runtime: not waiting");
    }
    on
}

/// Waits until `deadline` (a deadline already past is ready at once).
pub fn sleep_until(deadline: Instant) -> Sleep {
    if deadline <= Instant::now() || !on_runtime() {
        return Sleep { inner: None };
    }
    Sleep { inner: Some(Box::pin(tokio::time::sleep_until(deadline.into()))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn sleeps_concurrently_on_one_thread() {
        let started = Instant::now();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime(), async {
            // Ten 100 ms sleeps on one thread take 100 ms, not a second: none blocks the others.
            let all: Vec<_> = (0..10).map(|_| tokio::task::spawn_local(sleep(Duration::from_millis(100)))).collect();
            for s in all {
                assert!(s.await.is_ok());
            }
        });
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100) && took < Duration::from_millis(600), "{took:?}");
    }

    fn futures_poll(s: Pin<&mut Sleep>) -> Poll<()> {
        s.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[test]
    fn zero_and_past_deadlines_are_ready_at_once() {
        runtime().block_on(async {
            // The longest duration saturates instead of overflowing the deadline.
            let mut forever = std::pin::pin!(sleep(Duration::MAX));
            assert!(futures_poll(forever.as_mut()).is_pending());
            sleep(Duration::ZERO).await;
            sleep_until(Instant::now().checked_sub(Duration::from_millis(1)).unwrap_or_else(Instant::now)).await;
        });
        // Outside a runtime: no panic, no wait.
        let s = sleep(Duration::from_secs(5));
        assert!(s.inner.is_none());
    }
}
