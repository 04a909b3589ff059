//! Cache zones: where entries live, bounded, shared by every worker and every route naming the
//! zone. A memory zone is an LRU of entries bounded by `memory_size`; a disk zone
//! ([`disk::DiskStore`]) keeps entry files bounded by `disk_size` under an index rebuilt from the
//! files at start, with its recently served entries in memory. Each zone counts what happens to
//! it ([`Stats`]) and keeps its fills in progress ([`crate::collapse::Fills`]).

pub mod disk;
pub mod registry;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use weir_plugin::cache_zones::CacheZone;

use crate::collapse::Fills;
use crate::entry::Entry;
use crate::lru::{Digest, Lru};

/// What happened in a zone, for the metrics source.
#[derive(Default)]
pub struct Stats {
    pub hit: AtomicU64,
    pub miss: AtomicU64,
    pub expired: AtomicU64,
    pub stale: AtomicU64,
    pub bypass: AtomicU64,
    /// Responses stored.
    pub stored: AtomicU64,
    /// Entries evicted to keep the zone within its bounds.
    pub evicted: AtomicU64,
    /// Entries removed by `PURGE`.
    pub purged: AtomicU64,
    /// Misses answered from another request's fill instead of the upstream.
    pub collapsed: AtomicU64,
    /// Entry files cut short, found at start.
    pub torn: AtomicU64,
    /// Entry files that failed their checksum or did not parse.
    pub corrupt: AtomicU64,
    /// Entry files that could not be written.
    pub write_errors: AtomicU64,
    /// Entries not written because the writer was too far behind.
    pub writes_dropped: AtomicU64,
}

/// Adds one.
pub fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// What a lookup found.
pub enum Found {
    /// An entry in memory (fresh or not: the caller decides).
    Entry(Arc<Entry>),
    /// An entry file, to read ([`Zone::read`]); `expires_at_ms` from the index.
    OnDisk { expires_at_ms: u64 },
    /// Nothing.
    Nothing,
}

enum Store {
    Memory(Mutex<Lru<Arc<Entry>>>),
    Disk(disk::DiskStore),
}

/// One zone (see the module documentation).
pub struct Zone {
    /// Its name.
    pub name: String,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Fills in progress.
    pub fills: Arc<Fills>,
    /// Largest body one entry may have: an eighth of the zone.
    pub entry_cap: u64,
    store: Store,
}

impl Zone {
    /// A memory zone of `memory_size` bytes.
    pub fn memory(name: &str, memory_size: u64) -> Zone {
        Zone {
            name: name.to_owned(),
            stats: Arc::default(),
            fills: Arc::default(),
            entry_cap: memory_size / 8,
            store: Store::Memory(Mutex::new(Lru::new(memory_size, usize::MAX))),
        }
    }

    /// Opens a disk zone: creates its directory, rebuilds its index from the files there
    /// (discarding torn and expired ones) and starts its writer thread. Blocking: called while
    /// a snapshot is built, never on a worker.
    pub fn open_disk(def: &CacheZone) -> Result<Zone, String> {
        let stats = Arc::new(Stats::default());
        let store = disk::DiskStore::open(def, stats.clone())?;
        Ok(Zone {
            name: def.name.clone(),
            entry_cap: store.entry_cap(),
            stats,
            fills: Arc::default(),
            store: Store::Disk(store),
        })
    }

    /// Whether entries are kept on disk.
    pub fn is_disk(&self) -> bool {
        matches!(self.store, Store::Disk(_))
    }

    /// The entry of `digest`, without reading any file.
    pub fn lookup(&self, digest: &Digest) -> Found {
        match &self.store {
            Store::Memory(lru) => lru.lock().get(digest).cloned().map_or(Found::Nothing, Found::Entry),
            Store::Disk(d) => d.lookup(digest),
        }
    }

    /// Reads the entry file of `digest` off the worker (a damaged or vanished file is
    /// forgotten and counts as nothing found).
    pub async fn read(&self, digest: Digest) -> Option<Arc<Entry>> {
        match &self.store {
            Store::Memory(_) => None,
            Store::Disk(d) => d.read(digest).await,
        }
    }

    /// Stores `entry` under `digest`, evicting the least recently used entries beyond the bounds.
    pub fn store(&self, digest: Digest, entry: Arc<Entry>) {
        count(&self.stats.stored);
        match &self.store {
            Store::Memory(lru) => {
                let weight = entry.weight();
                let evicted = lru.lock().insert(digest, entry, weight);
                // Dropped outside the lock.
                if let Ok(evicted) = evicted {
                    self.stats.evicted.fetch_add(evicted.len() as u64, Ordering::Relaxed);
                }
            }
            Store::Disk(d) => d.store(digest, entry),
        }
    }

    /// Removes the entry of `digest`; whether there was one.
    pub fn purge(&self, digest: &Digest) -> bool {
        let found = match &self.store {
            Store::Memory(lru) => lru.lock().remove(digest).is_some(),
            Store::Disk(d) => d.remove(digest),
        };
        if found {
            count(&self.stats.purged);
        }
        found
    }

    /// Forgets an entry that must not be served (its key is another request's).
    pub fn discard(&self, digest: &Digest) {
        match &self.store {
            Store::Memory(lru) => drop(lru.lock().remove(digest)),
            Store::Disk(d) => drop(d.remove(digest)),
        }
    }

    /// Waits until the entries handed to the writer are on disk (graceful stop).
    pub fn flush(&self) {
        if let Store::Disk(d) = &self.store {
            d.flush();
        }
    }

    /// `(entries, bytes)` in memory and on disk.
    pub fn gauges(&self) -> [(usize, u64); 2] {
        match &self.store {
            Store::Memory(lru) => {
                let lru = lru.lock();
                [(lru.len(), lru.weight()), (0, 0)]
            }
            Store::Disk(d) => d.gauges(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::tests::sample;

    #[test]
    fn a_memory_zone_evicts_beyond_its_size_and_counts() {
        let zone = Zone::memory("m", 2_000);
        for i in 0..10u8 {
            zone.store([i; 16], Arc::new(sample(b"0123456789012345678901234567890123456789")));
        }
        let [(entries, bytes), _] = zone.gauges();
        assert!(bytes <= 2_000 && entries < 10, "{entries} entries, {bytes} bytes");
        assert_eq!(zone.stats.evicted.load(Ordering::Relaxed) as usize, 10 - entries);
        assert!(matches!(zone.lookup(&[9; 16]), Found::Entry(_)), "the newest stays");
        assert!(matches!(zone.lookup(&[0; 16]), Found::Nothing), "the oldest went");
        assert!(zone.purge(&[9; 16]));
        assert!(!zone.purge(&[9; 16]));
    }
}
