//! The stream proxy: TCP and UDP listeners (`gateway.stream_proxy`) routed by `stream_routes`,
//! with stream plugins (preread, connect, log).
//!
//! Follow a connection: `dataplane::server` (accept, on the same workers as HTTP) → `tcp::serve`
//! (SNI from `sni` on TLS listeners, `tables::stream_router` match, plugins, connect with retries) → `copy`
//! (relay with half-close and idle timeout, or TLS termination then copy). UDP: `udp::serve`.

pub mod copy;
pub mod sni;
pub mod tcp;
pub mod udp;

use std::sync::atomic::{AtomicUsize, Ordering};

static TCP_CONNECTIONS: AtomicUsize = AtomicUsize::new(0);
static UDP_SESSIONS: AtomicUsize = AtomicUsize::new(0);

/// Counts a live connection or session while it exists (for `/v1/gc`'s report).
pub struct Live(&'static AtomicUsize);

impl Live {
    /// A TCP connection.
    pub fn tcp() -> Live {
        TCP_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        Live(&TCP_CONNECTIONS)
    }
    /// A UDP session.
    pub fn udp() -> Live {
        UDP_SESSIONS.fetch_add(1, Ordering::Relaxed);
        Live(&UDP_SESSIONS)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// `(TCP connections, UDP sessions)` open now.
pub fn live() -> (usize, usize) {
    (TCP_CONNECTIONS.load(Ordering::Relaxed), UDP_SESSIONS.load(Ordering::Relaxed))
}
