//! The limiters' stores as Prometheus sees them: every [`BoundedStore`](super::store::BoundedStore)
//! registers here, and one metrics source (`limiters`) reports, per plugin, the keys held, the
//! bound, and the keys evicted to stay within it:
//!
//! ```text
//! weir_limiter_keys{plugin="limit-req"} 100000
//! weir_limiter_max_keys{plugin="limit-req"} 100000
//! weir_limiter_evictions_total{plugin="limit-req"} 912345
//! ```
//!
//! Nothing here is on the request path: a scrape locks each shard once to read its counts.

use std::sync::{Mutex, Once, Weak};

use crate::metrics::{self, Exposition};

/// What a scrape reads of a store.
pub trait StoreStats: Send + Sync {
    /// The plugin owning the store (the `plugin` label).
    fn plugin(&self) -> &'static str;
    /// Keys held now.
    fn keys(&self) -> usize;
    /// Keys evicted since the store was made.
    fn evictions(&self) -> u64;
    /// The bound.
    fn max_keys(&self) -> usize;
}

static STORES: Mutex<Vec<Weak<dyn StoreStats>>> = Mutex::new(Vec::new());
static SOURCE: Once = Once::new();

/// Registers a store (dropped stores fall out by themselves).
pub fn register(store: Weak<dyn StoreStats>) {
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    stores.retain(|s| s.strong_count() > 0);
    stores.push(store);
    drop(stores);
    SOURCE.call_once(|| metrics::set_source("limiters", write));
}

/// `(plugin, keys, max_keys, evictions)` of every live store, summed per plugin, by name.
pub fn snapshot() -> Vec<(&'static str, usize, usize, u64)> {
    let stores: Vec<_> = STORES.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
    let mut out: Vec<(&'static str, usize, usize, u64)> = Vec::new();
    for s in stores {
        let (keys, max, evicted) = (s.keys(), s.max_keys(), s.evictions());
        match out.iter_mut().find(|(p, ..)| *p == s.plugin()) {
            Some(row) => {
                row.1 += keys;
                row.2 += max;
                row.3 += evicted;
            }
            None => out.push((s.plugin(), keys, max, evicted)),
        }
    }
    out.sort_by_key(|r| r.0);
    out
}

fn write(e: &mut Exposition) {
    let rows = snapshot();
    if rows.is_empty() {
        return;
    }
    e.family("limiter_keys", "gauge", "Keys held in a limiter plugin's local store.");
    for (plugin, keys, ..) in &rows {
        e.sample("limiter_keys", &[("plugin", plugin)], keys);
    }
    e.family("limiter_max_keys", "gauge", "The bound of a limiter plugin's local store (plugin_attr max_keys).");
    for (plugin, _, max, _) in &rows {
        e.sample("limiter_max_keys", &[("plugin", plugin)], max);
    }
    e.family(
        "limiter_evictions_total",
        "counter",
        "Keys evicted (least recently used first) to keep a limiter plugin's store within max_keys.",
    );
    for (plugin, .., evicted) in &rows {
        e.sample("limiter_evictions_total", &[("plugin", plugin)], evicted);
    }
}
