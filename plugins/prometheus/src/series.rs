//! Request series: counted per worker thread without locks, merged by label set at scrape time.
//!
//! A worker thread finds its series for a request's labels in a thread-local map (hashed by
//! content, compared field by field, so a hit clones nothing) and adds to its counters with a
//! plain load and store: only that thread writes them. A label set seen for the first time on a
//! thread gets a new series, also pushed to [`ALL`], the only lock, taken once per new series
//! and by the scrape.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use weir_plugin::metrics::{render_labels, Exposition};
use weir_plugin::RequestCtx;

/// The labels of one series.
struct Labels {
    code: u16,
    route: Option<Arc<str>>,
    matched_uri: Option<Arc<str>>,
    matched_host: Option<Arc<str>>,
    service: Option<Arc<str>>,
    consumer: Option<Arc<str>>,
    node: Option<SocketAddr>,
}

impl Labels {
    fn of(ctx: &RequestCtx) -> Labels {
        Labels {
            code: ctx.status,
            route: ctx.route_id.clone(),
            matched_uri: ctx.matched_uri.clone(),
            matched_host: ctx.matched_host.clone(),
            service: ctx.service_id.clone(),
            consumer: ctx.consumer.as_ref().map(|c| c.username.clone()),
            node: ctx.upstream_addrs.last().copied(),
        }
    }

    fn matches(&self, ctx: &RequestCtx) -> bool {
        self.code == ctx.status
            && self.route == ctx.route_id
            && self.node.as_ref() == ctx.upstream_addrs.last()
            && self.matched_uri == ctx.matched_uri
            && self.matched_host == ctx.matched_host
            && self.service == ctx.service_id
            && self.consumer.as_deref() == ctx.consumer.as_ref().map(|c| &*c.username)
    }
}

fn hash_of(ctx: &RequestCtx) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    ctx.status.hash(&mut h);
    ctx.route_id.as_deref().hash(&mut h);
    ctx.upstream_addrs.last().hash(&mut h);
    ctx.matched_uri.as_deref().hash(&mut h);
    ctx.matched_host.as_deref().hash(&mut h);
    ctx.service_id.as_deref().hash(&mut h);
    ctx.consumer.as_ref().map(|c| &*c.username).hash(&mut h);
    h.finish()
}

/// Adds to a counter only this thread writes (no locked instruction).
#[inline]
fn add(c: &AtomicU64, n: u64) {
    weir_plugin::metrics::bump(c, n as i64);
}

/// A latency histogram: per-bucket counts (not cumulative; the scrape sums them), the sum in
/// microseconds and the count.
struct Histogram {
    buckets: Box<[AtomicU64]>,
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(n: usize) -> Self {
        Histogram {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
            sum_micros: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn observe(&self, bounds: &[f64], micros: u64) {
        let ms = micros as f64 / 1000.0;
        if let Some(i) = bounds.iter().position(|b| ms <= *b) {
            add(&self.buckets[i], 1);
        }
        add(&self.sum_micros, micros);
        add(&self.count, 1);
    }
}

const REQUEST: usize = 0;
const UPSTREAM: usize = 1;
const GATEWAY: usize = 2;
const LATENCY_TYPES: [&str; 3] = ["request", "upstream", "gateway"];

struct Series {
    labels: Labels,
    bounds: Arc<[f64]>,
    status: AtomicU64,
    latency: [Histogram; 3],
    ingress: AtomicU64,
    egress: AtomicU64,
}

static BOUNDS: Mutex<Option<Arc<[f64]>>> = Mutex::new(None);
static ALL: Mutex<Vec<Arc<Series>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: RefCell<HashMap<u64, Vec<Arc<Series>>, foldhash::fast::FixedState>> = RefCell::new(HashMap::default());
}

/// The histogram bounds (ms). The first call decides for the life of the process: series
/// already counted keep theirs, and one family must have one set of buckets.
pub fn set_buckets(bounds: &[f64]) {
    let mut current = BOUNDS.lock().unwrap_or_else(|e| e.into_inner());
    match current.as_ref() {
        None => *current = Some(Arc::from(bounds)),
        Some(b) if **b != *bounds => {
            log::warn!("plugin_attr.prometheus.default_buckets: a change applies at the next restart")
        }
        Some(_) => {}
    }
}

fn bounds() -> Arc<[f64]> {
    BOUNDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(|| Arc::from(&[1.0, 10.0, 100.0, 1000.0][..]))
        .clone()
}

thread_local! {
    /// The request recorded last on this thread: its context's address and arrival.
    static LAST: std::cell::Cell<(usize, Option<std::time::Instant>)> = const { std::cell::Cell::new((0, None)) };
}

/// Counts one finished request, once: with the plugin on a global rule and on the route, the log
/// phase calls it twice in a row for the same request (APISIX's `prefer_route`).
pub fn record(ctx: &RequestCtx) {
    let me = (ctx as *const RequestCtx as usize, Some(ctx.started));
    if LAST.with(|l| l.replace(me)) == me {
        return;
    }
    let total = ctx.started.elapsed();
    let request = u64::try_from(total.as_micros()).unwrap_or(u64::MAX);
    let upstream = ctx.upstream_time.map(|t| u64::try_from(t.as_micros()).unwrap_or(u64::MAX));
    let h = hash_of(ctx);
    MINE.with(|mine| {
        let mut mine = mine.borrow_mut();
        let list = mine.entry(h).or_default();
        let series = match list.iter().position(|s| s.labels.matches(ctx)) {
            Some(i) => &list[i],
            None => {
                let bounds = bounds();
                let n = bounds.len();
                let s = Arc::new(Series {
                    labels: Labels::of(ctx),
                    bounds,
                    status: AtomicU64::new(0),
                    latency: [Histogram::new(n), Histogram::new(n), Histogram::new(n)],
                    ingress: AtomicU64::new(0),
                    egress: AtomicU64::new(0),
                });
                ALL.lock().unwrap_or_else(|e| e.into_inner()).push(s.clone());
                list.push(s);
                &list[list.len() - 1]
            }
        };
        add(&series.status, 1);
        series.latency[REQUEST].observe(&series.bounds, request);
        if let Some(up) = upstream {
            series.latency[UPSTREAM].observe(&series.bounds, up);
        }
        series.latency[GATEWAY].observe(&series.bounds, request.saturating_sub(upstream.unwrap_or(0)));
        add(&series.ingress, ctx.request_length);
        add(&series.egress, ctx.head_bytes_sent + ctx.body_bytes_sent);
    });
}

fn text(v: &Option<Arc<str>>) -> String {
    v.as_deref().unwrap_or("").to_owned()
}

/// Latency sums of one label set: per-bucket counts, sum (µs), count.
type Merged = (Vec<u64>, u64, u64);

/// Writes `http_status`, `http_latency` and `bandwidth`, merging every thread's series.
pub fn write(e: &mut Exposition) {
    let all: Vec<Arc<Series>> = ALL.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    // code, route, matched_uri, matched_host, service, consumer, node
    let mut status: BTreeMap<[String; 7], u64> = BTreeMap::new();
    // route, service, consumer, node
    let mut latency: BTreeMap<(usize, [String; 4]), Merged> = BTreeMap::new();
    let mut bandwidth: BTreeMap<(&str, [String; 4]), u64> = BTreeMap::new();
    let mut bounds: Option<Arc<[f64]>> = None;
    for s in &all {
        let l = &s.labels;
        let node = l.node.map(|a| a.ip().to_string()).unwrap_or_default();
        let short = [text(&l.route), text(&l.service), text(&l.consumer), node.clone()];
        let key = [
            l.code.to_string(),
            text(&l.route),
            text(&l.matched_uri),
            text(&l.matched_host),
            text(&l.service),
            text(&l.consumer),
            node,
        ];
        *status.entry(key).or_default() += get(&s.status);
        for (t, h) in s.latency.iter().enumerate() {
            // Buckets first, the count last (the recorder writes them in that order), and the
            // count never below the buckets' sum: +Inf is never lower than a finite bucket.
            let buckets: Vec<u64> = h.buckets.iter().map(get).collect();
            let sum = get(&h.sum_micros);
            let count = get(&h.count).max(buckets.iter().sum());
            if count == 0 {
                continue;
            }
            let m = latency.entry((t, short.clone())).or_insert_with(|| (vec![0; buckets.len()], 0, 0));
            for (acc, b) in m.0.iter_mut().zip(buckets) {
                *acc += b;
            }
            m.1 += sum;
            m.2 += count;
        }
        *bandwidth.entry(("ingress", short.clone())).or_default() += get(&s.ingress);
        *bandwidth.entry(("egress", short)).or_default() += get(&s.egress);
        bounds.get_or_insert_with(|| s.bounds.clone());
    }

    e.family("http_status", "counter", "HTTP status codes per service in Weir.");
    for (k, v) in &status {
        let names = ["code", "route", "matched_uri", "matched_host", "service", "consumer", "node"];
        let labels: Vec<(&str, &str)> = names.iter().copied().zip(k.iter().map(String::as_str)).collect();
        e.sample("http_status", &labels, v);
    }
    e.family("http_latency", "histogram", "HTTP request latency in milliseconds per service in Weir.");
    let bounds = bounds.unwrap_or_else(|| Arc::from(&[][..]));
    let le: Vec<String> = bounds.iter().map(|b| format!("{b}")).collect();
    for ((t, k), (buckets, sum, count)) in &latency {
        let labels = render_labels(&[
            ("type", LATENCY_TYPES[*t]),
            ("route", &k[0]),
            ("service", &k[1]),
            ("consumer", &k[2]),
            ("node", &k[3]),
        ]);
        let mut cumulative = 0;
        for (i, n) in buckets.iter().enumerate() {
            cumulative += n;
            let le = le.get(i).map_or("+Inf", String::as_str);
            e.sample_rendered("http_latency_bucket", &labels, Some(("le", le)), cumulative);
        }
        e.sample_rendered("http_latency_bucket", &labels, Some(("le", "+Inf")), count);
        e.sample_rendered("http_latency_sum", &labels, None, *sum as f64 / 1000.0);
        e.sample_rendered("http_latency_count", &labels, None, count);
    }
    e.family("bandwidth", "counter", "Total bandwidth in bytes consumed per service in Weir.");
    for ((t, k), v) in &bandwidth {
        let labels = [("type", *t), ("route", &k[0]), ("service", &k[1]), ("consumer", &k[2]), ("node", &k[3])];
        e.sample("bandwidth", &labels, v);
    }
}
