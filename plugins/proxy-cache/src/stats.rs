//! The metrics source of proxy-cache: per zone, requests by cache status, stores, evictions,
//! purges, collapsed misses, discarded entry files, and the entries and bytes held in memory and
//! on disk. Counters are the zones' own atomics; a scrape only reads them.

use std::sync::atomic::{AtomicU64, Ordering};

use weir_plugin::metrics::Exposition;

use crate::zone::{registry, Stats};

/// A counter family: name, help, and the zone counter it reads.
type Counter = (&'static str, &'static str, fn(&Stats) -> &AtomicU64);

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// Writes the families (nothing while no zone is open).
pub fn render(out: &mut Exposition) {
    let zones = registry::opened();
    if zones.is_empty() {
        return;
    }
    out.family(
        "proxy_cache_requests_total",
        "counter",
        "Requests of routes with proxy-cache, by zone and Apisix-Cache-Status.",
    );
    for z in &zones {
        let s = &z.stats;
        for (status, c) in
            [("HIT", &s.hit), ("MISS", &s.miss), ("EXPIRED", &s.expired), ("STALE", &s.stale), ("BYPASS", &s.bypass)]
        {
            out.sample("proxy_cache_requests_total", &[("zone", &z.name), ("status", status)], get(c));
        }
    }
    let counters: [Counter; 4] = [
        ("proxy_cache_stored_total", "Responses stored.", |s| &s.stored),
        ("proxy_cache_evictions_total", "Entries evicted (least recently used) to keep a zone within its size.", |s| {
            &s.evicted
        }),
        ("proxy_cache_purges_total", "Entries removed by PURGE.", |s| &s.purged),
        ("proxy_cache_collapsed_total", "Misses answered from another request's fetch of the same key.", |s| {
            &s.collapsed
        }),
    ];
    for (name, help, field) in counters {
        out.family(name, "counter", help);
        for z in &zones {
            out.sample(name, &[("zone", &z.name)], get(field(&z.stats)));
        }
    }
    out.family(
        "proxy_cache_discarded_total",
        "counter",
        "Entries not kept: files cut short (torn) or damaged (corrupt), writes failed or dropped by a full queue.",
    );
    for z in &zones {
        let s = &z.stats;
        for (reason, c) in [
            ("torn", &s.torn),
            ("corrupt", &s.corrupt),
            ("write_error", &s.write_errors),
            ("write_dropped", &s.writes_dropped),
        ] {
            out.sample("proxy_cache_discarded_total", &[("zone", &z.name), ("reason", reason)], get(c));
        }
    }
    let gauges: Vec<(&str, [(usize, u64); 2])> = zones.iter().map(|z| (z.name.as_str(), z.gauges())).collect();
    out.family("proxy_cache_entries", "gauge", "Entries held, in memory and on disk.");
    for (name, [mem, disk]) in &gauges {
        out.sample("proxy_cache_entries", &[("zone", name), ("tier", "memory")], mem.0);
        out.sample("proxy_cache_entries", &[("zone", name), ("tier", "disk")], disk.0);
    }
    out.family("proxy_cache_bytes", "gauge", "Bytes held, in memory and on disk.");
    for (name, [mem, disk]) in &gauges {
        out.sample("proxy_cache_bytes", &[("zone", name), ("tier", "memory")], mem.1);
        out.sample("proxy_cache_bytes", &[("zone", name), ("tier", "disk")], disk.1);
    }
}
