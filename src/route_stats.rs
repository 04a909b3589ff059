//! Per-route traffic for the dashboard: requests, 4xx and 5xx answers and latency, counted
//! where the log phase runs and turned into rates over the last minute by a sampler thread.
//!
//! Counting follows the Prometheus plugin's pattern: each data-plane thread owns its counters
//! (a thread-local map from route id to counters, a plain load and store per counter, no locked
//! instruction, no allocation once the route was seen on that thread); a route seen for the first
//! time on a thread registers its counters in `ALL`, the only lock, taken then and by the
//! sampler. Nothing is counted until the control server turns counting on ([`enable`]): with
//! `gateway.enable_control: false` a request pays one relaxed load.
//!
//! Every [`SAMPLE`] the sampler sums the counters per route, and every [`MARK`] samples it
//! notes each route's totals: a route's rates are over the window from the older of its two last
//! marks to the last sample (30 to 60 seconds), at three totals per route ever seen (~400 bytes).
//! For all routes together it keeps the deltas of the last [`SERIES`] samples (the dashboard's
//! sparkline).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Serialize;
use weir_plugin::metrics::bump;
use weir_plugin::RequestCtx;

use crate::fastmap::FastMap;

/// How often the sampler reads the counters.
pub const SAMPLE: Duration = Duration::from_secs(2);
/// Samples between two marks of the per-route window (30 s): the window covers the last 30 to
/// 60 seconds.
pub const MARK: u64 = 15;
/// Samples of the all-routes series (five minutes).
pub const SERIES: usize = 150;
/// Upper bounds of the latency buckets, in milliseconds (the last bucket is everything above).
pub const BUCKETS_MS: [u64; 11] = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000];
const NB: usize = BUCKETS_MS.len() + 1;

/// The key of requests no route took (404s and requests refused before routing).
pub const NO_ROUTE: &str = "";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Counters of one route on one thread (written by that thread only).
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    s4xx: AtomicU64,
    s5xx: AtomicU64,
    latency_us: AtomicU64,
    buckets: [AtomicU64; NB],
}

type Registry = Vec<(Arc<str>, Arc<Counters>)>;

/// Every thread's counters, by route id (pushed once per route and thread).
static ALL: Mutex<Registry> = Mutex::new(Vec::new());

/// A thread's counters by route id, and the last route it counted (requests of one route in a
/// row, the usual case, skip the lookup; the id it holds cannot be freed and its address reused).
#[derive(Default)]
struct Local {
    last: Option<(Arc<str>, Arc<Counters>)>,
    map: FastMap<Arc<str>, Arc<Counters>>,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

/// Counts a finished request (its route, status and time since it started). Called by the log
/// phase of every request.
#[inline]
pub fn record(ctx: &RequestCtx) {
    if ENABLED.load(Ordering::Relaxed) {
        count(ctx);
    }
}

#[inline(never)]
fn count(ctx: &RequestCtx) {
    let id: &str = ctx.route_id.as_deref().unwrap_or(NO_ROUTE);
    let micros = u64::try_from(ctx.started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let status = ctx.status;
    LOCAL.with(|local| {
        let mut guard = local.borrow_mut();
        let local = &mut *guard;
        let hit = matches!((&local.last, &ctx.route_id), (Some((last, _)), Some(now)) if Arc::ptr_eq(last, now));
        if !hit {
            // A route not counted last on this thread: look it up (registering it the first time).
            let c = match local.map.get(id) {
                Some(c) => c.clone(),
                None => {
                    let key: Arc<str> = ctx.route_id.clone().unwrap_or_else(|| Arc::from(NO_ROUTE));
                    let c = Arc::new(Counters::default());
                    ALL.lock().push((key.clone(), c.clone()));
                    local.map.insert(key, c.clone());
                    c
                }
            };
            if let Some(now) = &ctx.route_id {
                local.last = Some((now.clone(), c));
            }
        }
        // No reference count is touched on the usual path: the counters are borrowed.
        let counters: &Counters = match (&ctx.route_id, &local.last) {
            (Some(_), Some((_, c))) => c,
            _ => match local.map.get(NO_ROUTE) {
                Some(c) => c,
                None => return,
            },
        };
        bump(&counters.requests, 1);
        if (400..500).contains(&status) {
            bump(&counters.s4xx, 1);
        } else if status >= 500 {
            bump(&counters.s5xx, 1);
        }
        bump(&counters.latency_us, i64::try_from(micros).unwrap_or(i64::MAX));
        let ms = micros / 1000;
        let b = BUCKETS_MS.iter().position(|&limit| ms < limit).unwrap_or(BUCKETS_MS.len());
        bump(&counters.buckets[b], 1);
    });
}

/// Sums of one route (or of all) since the process started, or over an interval.
#[derive(Clone, Copy, Default)]
struct Totals {
    requests: u64,
    s4xx: u64,
    s5xx: u64,
    latency_us: u64,
    buckets: [u64; NB],
}

impl Totals {
    fn add(&mut self, o: &Totals) {
        self.requests += o.requests;
        self.s4xx += o.s4xx;
        self.s5xx += o.s5xx;
        self.latency_us += o.latency_us;
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }
    fn minus(&self, o: &Totals) -> Totals {
        let mut d = Totals {
            requests: self.requests.saturating_sub(o.requests),
            s4xx: self.s4xx.saturating_sub(o.s4xx),
            s5xx: self.s5xx.saturating_sub(o.s5xx),
            latency_us: self.latency_us.saturating_sub(o.latency_us),
            buckets: [0; NB],
        };
        for (i, b) in d.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(o.buckets[i]);
        }
        d
    }
}

/// One route: its totals at the last sample, and at the two last marks.
#[derive(Default)]
struct RouteWindow {
    last: Totals,
    marks: [Totals; 2],
}

struct Sampler {
    /// Samples taken.
    n: u64,
    /// When the two last marks were set (the older one starts the window).
    marks_at: [Instant; 2],
    /// Time of the last sample.
    last_at: Instant,
    routes: FastMap<Arc<str>, RouteWindow>,
    /// Deltas of all routes together, newest last.
    series: VecDeque<Totals>,
}

impl Default for Sampler {
    fn default() -> Self {
        let now = Instant::now();
        Sampler { n: 0, marks_at: [now, now], last_at: now, routes: FastMap::default(), series: VecDeque::new() }
    }
}

static SAMPLER: OnceLock<Mutex<Sampler>> = OnceLock::new();

/// Turns counting on and starts the sampler (once; the control server calls it when it starts).
pub fn enable() {
    if ENABLED.swap(true, Ordering::Relaxed) {
        return;
    }
    let sampler = SAMPLER.get_or_init(|| Mutex::new(Sampler::default()));
    let spawned = std::thread::Builder::new().name("route-stats".into()).spawn(move || loop {
        std::thread::sleep(SAMPLE);
        sampler.lock().sample(Instant::now());
    });
    if let Err(e) = spawned {
        log::warn!("dashboard: no sampler thread ({e}); per-route rates stay empty");
    }
}

impl Sampler {
    /// Reads every counter. Every [`MARK`] samples the marks move on, so that the window (from
    /// the older mark to the last sample) covers between one and two [`MARK`] periods.
    fn sample(&mut self, at: Instant) {
        self.n += 1;
        let mut now: FastMap<Arc<str>, Totals> = FastMap::default();
        for (id, c) in ALL.lock().iter() {
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
            let mut t = Totals {
                requests: get(&c.requests),
                s4xx: get(&c.s4xx),
                s5xx: get(&c.s5xx),
                latency_us: get(&c.latency_us),
                buckets: [0; NB],
            };
            for (b, a) in t.buckets.iter_mut().zip(c.buckets.iter()) {
                *b = get(a);
            }
            match now.get_mut(&**id) {
                Some(sum) => sum.add(&t),
                None => {
                    now.insert(id.clone(), t);
                }
            }
        }
        let mut all = Totals::default();
        for (id, cum) in now {
            // Counters start at zero when registered: a new route's marks are zero too.
            let w = self.routes.entry(id).or_default();
            all.add(&cum.minus(&w.last));
            w.last = cum;
        }
        if self.n.is_multiple_of(MARK) {
            for w in self.routes.values_mut() {
                w.marks = [w.marks[1], w.last];
            }
            self.marks_at = [self.marks_at[1], at];
        }
        self.last_at = at;
        if self.series.len() == SERIES {
            self.series.pop_front();
        }
        self.series.push_back(all);
    }

    fn window_of(&self, w: &RouteWindow) -> Totals {
        w.last.minus(&w.marks[0])
    }

    fn window_seconds(&self) -> f64 {
        self.last_at.saturating_duration_since(self.marks_at[0]).as_secs_f64()
    }
}

/// Rates of one route (or all) over a window.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Rates {
    /// The route id (`""`: requests no route took).
    pub id: String,
    /// Requests in the window.
    pub requests: u64,
    /// Requests per second.
    pub rps: f64,
    /// Share of 5xx answers (0 to 1; `null` without requests).
    pub error_rate: Option<f64>,
    /// Share of 4xx answers (0 to 1; `null` without requests).
    pub client_error_rate: Option<f64>,
    /// Mean latency in milliseconds (request start to log phase; `null` without requests).
    pub mean_ms: Option<f64>,
    /// The 99th percentile's bucket bound in milliseconds (`null` without requests, or above
    /// the last bound).
    pub p99_ms: Option<u64>,
}

/// One point of the all-routes series.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Point {
    /// Requests per second.
    pub rps: f64,
    /// Share of 5xx answers (0 when there were no requests).
    pub error_rate: f64,
    /// Mean latency in milliseconds (0 when there were no requests).
    pub mean_ms: f64,
}

/// `GET /v1/dashboard/stats`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DashboardStats {
    /// Whether per-route counting is on (it is while the control server runs).
    pub enabled: bool,
    /// Seconds between samples.
    pub sample_seconds: f64,
    /// Seconds the per-route rates cover (up to one minute; less just after start).
    pub window_seconds: f64,
    /// Samples taken since start.
    pub samples: u64,
    /// All routes together over the window.
    pub total: Rates,
    /// Each route with traffic in the window, busiest first.
    pub routes: Vec<Rates>,
    /// All routes together, one point per sample, oldest first (up to five minutes).
    pub series: Vec<Point>,
}

fn rates(id: &str, t: &Totals, secs: f64) -> Rates {
    let n = t.requests;
    let share = |x: u64| (n > 0).then(|| x as f64 / n as f64);
    let p99 = (n > 0).then(|| {
        let want = n - n / 100;
        let mut seen = 0;
        for (i, b) in t.buckets.iter().enumerate() {
            seen += b;
            if seen >= want {
                return BUCKETS_MS.get(i).copied();
            }
        }
        None
    });
    Rates {
        id: id.to_owned(),
        requests: n,
        rps: if secs > 0.0 { n as f64 / secs } else { 0.0 },
        error_rate: share(t.s5xx),
        client_error_rate: share(t.s4xx),
        mean_ms: (n > 0).then(|| t.latency_us as f64 / n as f64 / 1000.0),
        p99_ms: p99.flatten(),
    }
}

/// The numbers of the dashboard now.
pub fn stats() -> DashboardStats {
    let sample = SAMPLE.as_secs_f64();
    let Some(sampler) = SAMPLER.get() else {
        return DashboardStats {
            enabled: false,
            sample_seconds: sample,
            window_seconds: 0.0,
            samples: 0,
            total: rates("*", &Totals::default(), 0.0),
            routes: Vec::new(),
            series: Vec::new(),
        };
    };
    let s = sampler.lock();
    let secs = s.window_seconds();
    let mut total = Totals::default();
    let mut routes: Vec<Rates> = s
        .routes
        .iter()
        .map(|(id, w)| {
            let t = s.window_of(w);
            total.add(&t);
            rates(id, &t, secs)
        })
        .filter(|r| r.requests > 0)
        .collect();
    routes.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.id.cmp(&b.id)));
    let series = s
        .series
        .iter()
        .map(|t| {
            let r = rates("*", t, sample);
            Point { rps: r.rps, error_rate: r.error_rate.unwrap_or(0.0), mean_ms: r.mean_ms.unwrap_or(0.0) }
        })
        .collect();
    DashboardStats {
        enabled: ENABLED.load(Ordering::Relaxed),
        sample_seconds: sample,
        window_seconds: secs,
        samples: s.n,
        total: rates("*", &total, secs),
        routes,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_rates() {
        let mut s = Sampler::default();
        let c = Arc::new(Counters::default());
        ALL.lock().push((Arc::from("stats-test"), c.clone()));
        c.requests.store(10, Ordering::Relaxed);
        c.s5xx.store(1, Ordering::Relaxed);
        c.latency_us.store(20_000, Ordering::Relaxed);
        c.buckets[1].store(9, Ordering::Relaxed);
        c.buckets[5].store(1, Ordering::Relaxed);
        let t0 = s.last_at;
        s.sample(t0 + SAMPLE);
        c.requests.store(30, Ordering::Relaxed);
        c.buckets[1].store(29, Ordering::Relaxed);
        s.sample(t0 + 2 * SAMPLE);
        let w = s.routes.get("stats-test").map(|w| s.window_of(w)).unwrap_or_default();
        assert_eq!(w.requests, 30);
        assert_eq!(s.window_seconds(), 4.0);
        let r = rates("stats-test", &w, s.window_seconds());
        assert_eq!(r.rps, 7.5);
        assert_eq!(r.error_rate, Some(1.0 / 30.0));
        assert_eq!(r.p99_ms, Some(100), "the 30th request is in the 100 ms bucket");
        assert_eq!(s.series.len(), 2);
        assert_eq!(s.series[1].requests, 20);
        // Two marks later, the window holds only what came after the older mark.
        for i in 3..=(2 * MARK) {
            s.sample(t0 + SAMPLE * i as u32);
        }
        c.requests.store(31, Ordering::Relaxed);
        s.sample(t0 + SAMPLE * (2 * MARK as u32 + 1));
        let w = s.routes.get("stats-test").map(|w| s.window_of(w)).unwrap_or_default();
        assert_eq!(w.requests, 1);
        assert_eq!(s.window_seconds(), (SAMPLE * (MARK as u32 + 1)).as_secs_f64());
    }
}
