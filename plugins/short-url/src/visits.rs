//! Visit recording off the redirect path: a redirect classifies the user agent, takes the
//! referer's host and hashes the client IP with the current salt, then hands the visit to a
//! bounded buffer without waiting ([`Sink::record`]). A flusher thread writes what the buffer
//! holds every `flush_interval` (or as soon as `batch_size` visits wait) in one transaction per
//! batch. A full buffer drops the visit and counts it (`short_url_visits_dropped_total`).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::store::links::{flush_visits, UaClass, Visit};
use crate::store::{Conn, Connector};

/// Visits recorded (written to storage).
pub static RECORDED: AtomicU64 = AtomicU64::new(0);
/// Visits dropped: buffer full, or their batch failed to write.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Tokens (lower case) that make a user agent a bot.
const BOT_TOKENS: [&str; 14] = [
    "bot",
    "crawl",
    "spider",
    "slurp",
    "facebookexternalhit",
    "embedly",
    "preview",
    "headlesschrome",
    "lighthouse",
    "pingdom",
    "monitor",
    "whatsapp",
    "skypeuripreview",
    "bitlybot",
];

/// The class of a `User-Agent`: bot when it names a crawler or previewer, browser when it starts
/// like one (`Mozilla/`), other otherwise (curl, scripts, none).
pub fn classify(ua: Option<&str>) -> UaClass {
    let Some(ua) = ua else { return UaClass::Other };
    // Lower-cased on the stack: no allocation on the redirect path (the first 512 bytes decide).
    let mut buf = [0u8; 512];
    let n = ua.len().min(buf.len());
    for (d, s) in buf.iter_mut().zip(ua.as_bytes()) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &buf[..n];
    if BOT_TOKENS.iter().any(|t| lower.windows(t.len()).any(|w| w == t.as_bytes())) {
        UaClass::Bot
    } else if lower.starts_with(b"mozilla/") || lower.starts_with(b"opera/") {
        UaClass::Browser
    } else {
        UaClass::Other
    }
}

/// The host of a `Referer` value, lower case, without port or credentials.
pub fn referer_host(referer: &str) -> Option<String> {
    let rest = referer.split_once("://").map_or(referer, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = if host.starts_with('[') { host.split(']').next().map(|h| &h[1..])? } else { host.split(':').next()? };
    (!host.is_empty() && host.len() <= 253).then(|| host.to_ascii_lowercase())
}

/// The salt of client IP hashes: a random SipHash key, replaced every `rotate_secs`. It lives
/// only in memory, so a restart rotates it too; a hash links one client's visits within one
/// period and never across periods.
pub struct Salt {
    rotate_secs: i64,
    current: RwLock<(i64, std::collections::hash_map::RandomState)>,
}

impl Salt {
    /// A salt replaced every `rotate_secs`.
    pub fn new(rotate_secs: i64) -> Self {
        Salt { rotate_secs: rotate_secs.max(1), current: RwLock::new((i64::MIN, Default::default())) }
    }
    /// The hash of `ip` at `now`.
    pub fn hash(&self, ip: &str, now: i64) -> u64 {
        let period = now.div_euclid(self.rotate_secs);
        {
            let cur = self.current.read();
            if cur.0 == period {
                return cur.1.hash_one(ip);
            }
        }
        let mut cur = self.current.write();
        if cur.0 != period {
            *cur = (period, Default::default());
        }
        cur.1.hash_one(ip)
    }
}

/// Visit settings (`plugin_attr.short-url.visits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Visits the buffer holds at most.
    pub buffer: usize,
    /// Longest wait of a visit before it is written.
    pub flush_interval: Duration,
    /// Visits per write transaction at most.
    pub batch_size: usize,
    /// Salt rotation.
    pub salt_rotate_secs: i64,
}

/// The buffer and its flusher.
pub struct Sink {
    tx: SyncSender<Visit>,
    /// Visits buffered and not yet taken by the flusher.
    pending: AtomicUsize,
    batch_size: usize,
    /// The flusher, woken only when a full batch waits (not per visit: on a busy core a wake-up
    /// per redirect cost more than the write).
    flusher: Option<std::thread::Thread>,
    /// The salt of IP hashes.
    pub salt: Salt,
}

impl Sink {
    /// Starts the flusher thread over its own connection.
    pub fn start(connector: Arc<dyn Connector>, s: Settings) -> Arc<Sink> {
        let (tx, rx) = sync_channel(s.buffer.max(1));
        let sink = Arc::new_cyclic(|weak: &std::sync::Weak<Sink>| {
            let weak = weak.clone();
            let flusher = std::thread::Builder::new()
                .name("short-url-visits".into())
                .spawn(move || flusher(connector, rx, s, weak))
                .map(|h| h.thread().clone())
                .map_err(|err| log::warn!("short-url: no visit flusher ({err}); visits are dropped"))
                .ok();
            Sink {
                tx,
                pending: AtomicUsize::new(0),
                batch_size: s.batch_size.max(1),
                flusher,
                salt: Salt::new(s.salt_rotate_secs),
            }
        });
        sink
    }

    /// Buffers a visit without waiting; a full buffer drops it (counted).
    pub fn record(&self, v: Visit) {
        match self.tx.try_send(v) {
            Ok(()) => {
                if self.pending.fetch_add(1, Ordering::Relaxed) + 1 == self.batch_size {
                    if let Some(t) = &self.flusher {
                        t.unpark();
                    }
                }
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Writes what the buffer holds every `flush_interval`, or sooner when woken by a full batch.
fn flusher(connector: Arc<dyn Connector>, rx: Receiver<Visit>, s: Settings, sink: std::sync::Weak<Sink>) {
    let mut conn = None;
    let mut last_error: Option<Instant> = None;
    let batch_size = s.batch_size.max(1);
    let mut batch = Vec::with_capacity(batch_size.min(100_000));
    loop {
        let deadline = Instant::now() + s.flush_interval;
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            std::thread::park_timeout(deadline - now);
            match sink.upgrade() {
                Some(k) if k.pending.load(Ordering::Relaxed) < batch_size => {}
                _ => break,
            }
        }
        let mut closed = false;
        loop {
            batch.clear();
            while batch.len() < batch_size {
                match rx.try_recv() {
                    Ok(v) => batch.push(v),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        closed = true;
                        break;
                    }
                }
            }
            if let Some(k) = sink.upgrade() {
                k.pending.fetch_sub(batch.len(), Ordering::Relaxed);
            }
            if batch.is_empty() {
                break;
            }
            write(&*connector, &mut conn, &mut last_error, &batch);
            if batch.len() < batch_size {
                break;
            }
        }
        if closed {
            return;
        }
    }
}

fn write(
    connector: &dyn Connector,
    conn: &mut Option<Box<dyn Conn>>,
    last_error: &mut Option<Instant>,
    batch: &[Visit],
) {
    if conn.is_none() {
        match connector.connect() {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    log::warn!("short-url: visits not written ({e}); dropping {} visits", batch.len());
                    *last_error = Some(Instant::now());
                }
            }
        }
    }
    match conn.as_mut().map(|c| flush_visits(c.as_mut(), batch)) {
        Some(Ok(())) => {
            RECORDED.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        Some(Err(e)) => {
            log::warn!("short-url: {} visits not written: {e}", batch.len());
            *conn = None;
            DROPPED.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        None => {
            DROPPED.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_referers() {
        let chrome =
            "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36";
        assert_eq!(classify(Some(chrome)), UaClass::Browser);
        assert_eq!(
            classify(Some("Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)")),
            UaClass::Bot
        );
        assert_eq!(classify(Some("facebookexternalhit/1.1")), UaClass::Bot);
        assert_eq!(classify(Some("curl/8.5.0")), UaClass::Other);
        assert_eq!(classify(None), UaClass::Other);
        assert_eq!(referer_host("https://News.Example.com:8443/a?b#c").as_deref(), Some("news.example.com"));
        assert_eq!(referer_host("http://u:p@x.org/").as_deref(), Some("x.org"));
        assert_eq!(referer_host("http://[::1]:80/").as_deref(), Some("::1"));
        assert_eq!(referer_host("").as_deref(), None);
    }

    #[test]
    fn the_salt_is_stable_within_a_period_and_changes_across() {
        let s = Salt::new(100);
        assert_eq!(s.hash("10.0.0.1", 1000), s.hash("10.0.0.1", 1099));
        assert_ne!(s.hash("10.0.0.1", 1000), s.hash("10.0.0.2", 1000));
        let a = s.hash("10.0.0.1", 1000);
        assert_ne!(a, s.hash("10.0.0.1", 1100), "a new period, a new key");
    }
}
