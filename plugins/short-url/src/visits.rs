//! Visit recording off the redirect path: a redirect classifies the user agent, takes the
//! referer's host and hashes the client IP with the current salt, then hands the visit to a
//! bounded buffer without waiting ([`Sink::record`]). A flusher thread folds the buffer into
//! per-code counts and writes them every `flush_interval` (or once `batch_size` distinct keys
//! wait) in one transaction. A full buffer drops the visit and counts it
//! (`short_url_visits_dropped_total`).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::store::links::{flush_visits, UaClass, Visit, VisitBatch};
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

/// The host of a `Referer` value, lower case, without port, credentials or a trailing dot; `None`
/// unless the value is an absolute URI (`scheme://host...`) whose host is a name (letters,
/// digits, `-`, `_`, `.`) or a bracketed IPv6 address. The header is the client's to write:
/// whatever else it holds (`<script>`, `not a url`) is not a host, and is never stored for a
/// dashboard to show.
pub fn referer_host(referer: &str) -> Option<String> {
    let (scheme, rest) = referer.split_once("://")?;
    let mut sc = scheme.bytes();
    if !sc.next().is_some_and(|b| b.is_ascii_alphabetic())
        || !sc.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
    {
        return None;
    }
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?;
    let host = match host.strip_prefix('[') {
        Some(v6) => {
            let v6 = v6.split(']').next()?;
            v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.').then_some(v6)?
        }
        None => {
            let name = host.split(':').next()?;
            let name = name.strip_suffix('.').unwrap_or(name);
            name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')).then_some(name)?
        }
    };
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
    /// Distinct keys (code, day, class, referer host) per write transaction at most; also the
    /// number of buffered visits that wakes the flusher to fold them.
    pub batch_size: usize,
    /// Salt rotation.
    pub salt_rotate_secs: i64,
    /// Visit rows kept per code (see [`flush_visits`]).
    pub keep_recent: i64,
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
        // Counted before it is sent: the flusher may take it off the channel (and subtract it)
        // before this thread runs again, and `pending` must never go below zero. Counting after
        // the send let the flusher's subtraction come first and wrap the counter, which a debug
        // build caught as an overflow under load.
        let waiting = self.pending.fetch_add(1, Ordering::Relaxed) + 1;
        match self.tx.try_send(v) {
            Ok(()) => {
                if waiting == self.batch_size {
                    if let Some(t) = &self.flusher {
                        t.unpark();
                    }
                }
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.pending.fetch_sub(1, Ordering::Relaxed);
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Folds the buffer into a [`VisitBatch`] whenever woken, and writes the batch every
/// `flush_interval`, or sooner once it holds `batch_size` distinct keys. Visits to a hot code fold
/// into the same few rows, so the number of write transactions does not grow with traffic.
fn flusher(connector: Arc<dyn Connector>, rx: Receiver<Visit>, s: Settings, sink: std::sync::Weak<Sink>) {
    let mut conn = None;
    let mut last_error: Option<Instant> = None;
    let batch_size = s.batch_size.max(1);
    let mut batch = VisitBatch::default();
    let mut deadline = Instant::now() + s.flush_interval;
    loop {
        // Sleep until the deadline, or until a redirect wakes us because `batch_size` visits wait.
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
        // Fold what waits, writing whenever the batch is full. At most one buffer's worth per
        // pass, so a steady stream cannot keep us from the deadline.
        let mut closed = false;
        let mut taken = 0;
        while taken < s.buffer.max(1) {
            match rx.try_recv() {
                Ok(v) => {
                    taken += 1;
                    batch.add(v);
                    if batch.keys() >= batch_size {
                        write(&*connector, &mut conn, &mut last_error, &batch, s.keep_recent);
                        batch.clear();
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        if let Some(k) = sink.upgrade() {
            k.pending.fetch_sub(taken, Ordering::Relaxed);
        }
        if closed || Instant::now() >= deadline {
            if batch.visits() > 0 {
                write(&*connector, &mut conn, &mut last_error, &batch, s.keep_recent);
                batch.clear();
            }
            deadline = Instant::now() + s.flush_interval;
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
    batch: &VisitBatch,
    keep_recent: i64,
) {
    let n = batch.visits();
    if conn.is_none() {
        match connector.connect() {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    log::warn!("short-url: visits not written ({e}); dropping {n} visits");
                    *last_error = Some(Instant::now());
                }
            }
        }
    }
    match conn.as_mut().map(|c| flush_visits(c.as_mut(), batch, keep_recent)) {
        Some(Ok(())) => {
            RECORDED.fetch_add(n, Ordering::Relaxed);
        }
        Some(Err(e)) => {
            log::warn!("short-url: {n} visits not written: {e}");
            *conn = None;
            DROPPED.fetch_add(n, Ordering::Relaxed);
        }
        None => {
            DROPPED.fetch_add(n, Ordering::Relaxed);
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
        assert_eq!(referer_host("https://www.Google.com./x").as_deref(), Some("www.google.com"), "one name, one entry");
        assert_eq!(referer_host("android-app://com.example.app/").as_deref(), Some("com.example.app"));
        for not_a_host in [
            "<script>alert(1)</script>",
            "not a url",
            "https://<script>alert(1)</script>",
            "http://a b/",
            "http://x\"y/",
            "/relative/path",
            "://nohost",
            "1http://x/",
            "http://[::1<b>]/",
            "https:///path",
        ] {
            assert_eq!(referer_host(not_a_host), None, "{not_a_host}");
        }
    }

    /// A burst of visits to one code, far more than `batch_size`, is written in one transaction
    /// when the interval ends: the code's sample holds one flush's 20 rows, not one per
    /// `batch_size` visits. Distinct codes still split into batches of `batch_size`.
    #[test]
    fn a_hot_code_folds_into_one_write_per_interval() {
        use crate::store::links::{self, RECENT_PER_CODE};
        use crate::store::NewEntry;
        let dir = std::env::temp_dir().join(format!("weir-short-url-fold-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let connector: Arc<dyn Connector> = Arc::new(crate::store::sqlite::Sqlite::new(dir.join("t.db")));
        let mut conn = connector.connect().unwrap_or_else(|e| panic!("{e}"));
        let codes: Vec<String> =
            std::iter::once("hot".to_owned()).chain((0..250).map(|i| format!("c{i:03}"))).collect();
        for code in &codes {
            let e = NewEntry { origin_url: format!("https://{code}.example/"), ..NewEntry::default() };
            assert_eq!(links::insert_committed(&mut *conn, code, &e, 1), Ok(true));
        }
        let settings = Settings {
            buffer: 100_000,
            flush_interval: Duration::from_secs(1),
            batch_size: 100,
            salt_rotate_secs: 86_400,
            keep_recent: links::DEFAULT_KEEP_RECENT,
        };
        let sink = Sink::start(connector, settings);
        let visit = |code: &str, at: i64| Visit {
            code: code.to_owned(),
            at,
            referer: Some("news.example".into()),
            class: UaClass::Browser,
            country: None,
            ip_hash: 7,
        };
        // 100 bursts of 200 over about 0.3 s: each wakes the flusher, which folds and waits.
        let started = Instant::now();
        for burst in 0..100 {
            for i in 0..200 {
                sink.record(visit("hot", 1_000 + burst * 200 + i));
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        for code in &codes[1..] {
            sink.record(visit(code, 1_000));
        }
        // The intervals the visits were recorded in (a slow machine stretches the bursts).
        let intervals = started.elapsed().as_secs() as i64 + 2;
        let one = |conn: &mut dyn Conn, sql: &str| conn.query(sql, &[]).ok().and_then(|r| r[0][0].int());
        let deadline = Instant::now() + Duration::from_secs(10);
        while one(&mut *conn, "SELECT sum(visits) FROM short_url_codes") != Some(20_250) {
            assert!(Instant::now() < deadline, "visits not written in time");
            std::thread::sleep(Duration::from_millis(50));
        }
        let hot = links::get(&mut *conn, "hot").ok().flatten().map(|l| l.visits);
        assert_eq!(hot, Some(20_000));
        let rows = one(&mut *conn, "SELECT count(*) FROM short_url_visits WHERE code = 'hot'").unwrap_or(0);
        // One flush per interval keeps 20 rows each; deadlines may split the bursts. Written per
        // `batch_size` visits it would be about 100 flushes and 2,000 rows.
        let per_flush = RECENT_PER_CODE as i64;
        assert!((per_flush..=intervals * per_flush).contains(&rows), "{rows} sample rows in {intervals} intervals");
        assert_eq!(
            one(&mut *conn, "SELECT n FROM short_url_visit_stats WHERE code = 'hot' AND referer = 'news.example'"),
            Some(20_000)
        );
        drop(sink);
        let _ = std::fs::remove_dir_all(&dir);
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
