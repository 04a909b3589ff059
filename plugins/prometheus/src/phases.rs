//! `plugin_latency`: each plugin phase's time, a histogram per `(plugin, phase)`
//! (`plugin_attr.prometheus.plugin_latency: true`; off by default, and then no series exists and
//! no clock is read for it).
//!
//! The host times the phases of every request while it is on (`weir_plugin::measure`) and
//! hands them here after the log phase. As the request series, each worker thread counts into
//! histograms of its own (a plain load and store), registered once in [`ALL`], which the scrape
//! merges.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use weir_plugin::measure::{Phase, PhaseTime};
use weir_plugin::metrics::{bump, render_labels, Exposition};

/// Upper bounds of the buckets, in milliseconds: plugin phases are mostly microseconds, and a
/// phase that waits (a remote call) takes milliseconds to seconds.
pub const BOUNDS: [f64; 14] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 50.0, 250.0, 1000.0];

struct Histogram {
    plugin: &'static str,
    phase: Phase,
    /// Per-bucket counts (not cumulative), then the +Inf overflow.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

static ALL: Mutex<Vec<Arc<Histogram>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: RefCell<Vec<Arc<Histogram>>> = const { RefCell::new(Vec::new()) };
}

/// Counts one request's phases (the host calls it after the log phase).
pub fn record(times: &[PhaseTime]) {
    MINE.with(|mine| {
        let mut mine = mine.borrow_mut();
        for t in times {
            // A handful of (plugin, phase) pairs per thread: a linear scan.
            let h = match mine.iter().position(|h| h.phase == t.phase && h.plugin == t.plugin) {
                Some(i) => &mine[i],
                None => {
                    let h = Arc::new(Histogram {
                        plugin: t.plugin,
                        phase: t.phase,
                        buckets: std::array::from_fn(|_| AtomicU64::new(0)),
                        sum_nanos: AtomicU64::new(0),
                        count: AtomicU64::new(0),
                    });
                    ALL.lock().unwrap_or_else(|e| e.into_inner()).push(h.clone());
                    mine.push(h);
                    &mine[mine.len() - 1]
                }
            };
            let nanos = u64::try_from(t.busy.as_nanos()).unwrap_or(u64::MAX);
            let ms = nanos as f64 / 1e6;
            let i = BOUNDS.iter().position(|b| ms <= *b).unwrap_or(BOUNDS.len());
            bump(&h.buckets[i], 1);
            bump(&h.sum_nanos, nanos as i64);
            bump(&h.count, 1);
        }
    });
}

/// Writes `plugin_latency` (nothing at all while no phase was ever counted).
pub fn write(e: &mut Exposition) {
    let all: Vec<Arc<Histogram>> = ALL.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if all.is_empty() {
        return;
    }
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut merged: BTreeMap<(&str, &str), ([u64; BOUNDS.len() + 1], u64, u64)> = BTreeMap::new();
    for h in &all {
        let m = merged.entry((h.plugin, h.phase.as_str())).or_insert(([0; BOUNDS.len() + 1], 0, 0));
        for (acc, b) in m.0.iter_mut().zip(h.buckets.iter()) {
            *acc += get(b);
        }
        m.1 += get(&h.sum_nanos);
        m.2 += get(&h.count);
    }
    e.family("plugin_latency", "histogram", "Time spent in each plugin phase, in milliseconds.");
    for ((plugin, phase), (buckets, sum, count)) in &merged {
        let labels = render_labels(&[("plugin", plugin), ("phase", phase)]);
        let mut cumulative = 0;
        for (i, bound) in BOUNDS.iter().enumerate() {
            cumulative += buckets[i];
            e.sample_rendered("plugin_latency_bucket", &labels, Some(("le", &format!("{bound}"))), cumulative);
        }
        // The count is written last by the recorder: never below the buckets' sum.
        let count = (*count).max(cumulative + buckets[BOUNDS.len()]);
        e.sample_rendered("plugin_latency_bucket", &labels, Some(("le", "+Inf")), count);
        e.sample_rendered("plugin_latency_sum", &labels, None, *sum as f64 / 1e6);
        e.sample_rendered("plugin_latency_count", &labels, None, count);
    }
}
