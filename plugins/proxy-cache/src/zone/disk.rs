//! A disk zone: one file per entry under `disk_path`, in nginx's `levels` subdirectories
//! (`1:2`: `<root>/c/ab/<32 hex digits ending in abc>`).
//!
//! - Writing: a writer thread of the zone takes entries from a bounded queue (a full queue drops
//!   the write and counts it; a worker never waits for the disk), writes each to `tmp/` and
//!   renames it into place, then indexes it. A file under its final name is therefore always
//!   complete as far as this process is concerned: a `kill -9` leaves at worst a stray temporary
//!   file, removed at the next start. No fsync: this is a cache, every entry can be fetched
//!   again, and a file the machine's crash left short or damaged is caught by the length check at
//!   start and the checksum on every read (then deleted), never served.
//! - The index (digest → expiry) is bounded by `disk_size` bytes of files and by
//!   `memory_size / 128` keys (nginx's keys zone holds about 8,000 keys per megabyte); the least
//!   recently used entry's file is deleted beyond either. It is rebuilt at start from the files'
//!   heads, oldest first.
//! - Reading: entries served lately stay in memory (up to `memory_size` bytes, LRU); others are
//!   read by tokio's blocking pool and verified before they are served.
//! - Purging removes the index entry at once and the file through the writer, in order with the
//!   writes queued before it (inline when the queue is full, so a purge is never lost).

use std::fs;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use weir_plugin::cache_zones::CacheZone;
use weir_plugin::Bytes;

use super::{count, Found, Stats};
use crate::entry::{read_head, DecodeError, Entry, HEAD_LEN};
use crate::key::{hex, parse_hex};
use crate::lru::{Digest, Lru};

/// Entries that may wait for the writer.
const QUEUE: usize = 4096;
/// Bytes of index per key (nginx: about 8,000 keys per megabyte of keys zone).
const INDEX_BYTES_PER_KEY: u64 = 128;

/// What the index knows of an entry file.
#[derive(Debug, Clone, Copy)]
struct Meta {
    expires_at_ms: u64,
}

enum Job {
    Write(Digest, Arc<Entry>),
    Remove(Digest),
    Flush(std::sync::mpsc::Sender<()>),
}

/// Where files go; shared by the zone and its writer.
struct Layout {
    root: PathBuf,
    levels: Vec<usize>,
}

impl Layout {
    /// The file of `digest`: level directories from the end of its hex digits, as nginx.
    fn path(&self, digest: &Digest) -> PathBuf {
        let name = hex(digest);
        let mut path = self.root.clone();
        let mut end = name.len();
        for &l in &self.levels {
            path.push(&name[end - l..end]);
            end -= l;
        }
        path.push(&name);
        path
    }
}

/// See the module documentation.
pub struct DiskStore {
    layout: Arc<Layout>,
    index: Arc<Mutex<Lru<Meta>>>,
    hot: Mutex<Lru<Arc<Entry>>>,
    hot_cap: u64,
    entry_cap: u64,
    jobs: SyncSender<Job>,
    stats: Arc<Stats>,
}

impl DiskStore {
    /// Opens the zone `def` (see [`super::Zone::open_disk`]).
    pub fn open(def: &CacheZone, stats: Arc<Stats>) -> Result<DiskStore, String> {
        let at = |key: &str| format!("gateway.proxy_cache zone `{}`: {key}", def.name);
        let memory = def.memory_size.bytes().map_err(|e| format!("{}: {e}", at("memory_size")))?;
        let disk = def.disk_size.as_ref().ok_or_else(|| at("disk_size is missing"))?;
        let disk = disk.bytes().map_err(|e| format!("{}: {e}", at("disk_size")))?;
        let root = PathBuf::from(def.disk_path.as_deref().ok_or_else(|| at("disk_path is missing"))?);
        let levels: Vec<usize> = def
            .cache_levels
            .as_deref()
            .unwrap_or("1:2")
            .split(':')
            .map(|l| l.parse().map_err(|_| at("cache_levels is not like 1:2")))
            .collect::<Result<_, _>>()?;
        if levels.len() > 3 || levels.iter().any(|l| !(1..=2).contains(l)) {
            return Err(at("cache_levels: at most three levels of 1 or 2"));
        }
        fs::create_dir_all(root.join("tmp"))
            .map_err(|e| format!("{}: cannot create {}: {e}", at("disk_path"), root.display()))?;
        let layout = Arc::new(Layout { root, levels });
        let max_keys = (memory / INDEX_BYTES_PER_KEY).max(16) as usize;
        let index = Arc::new(Mutex::new(Lru::new(disk, max_keys)));
        let started = std::time::Instant::now();
        let kept = rebuild(&layout, &index, &stats);
        log::info!(
            "proxy-cache zone `{}`: {kept} entries indexed from {} in {:?}",
            def.name,
            layout.root.display(),
            started.elapsed()
        );
        let (jobs, rx) = sync_channel(QUEUE);
        let writer = Writer { layout: layout.clone(), index: index.clone(), stats: stats.clone(), seq: 0 };
        std::thread::Builder::new()
            .name(format!("cache-{}", def.name))
            .spawn(move || writer.run(rx))
            .map_err(|e| format!("{}: cannot start its writer thread: {e}", at("zones")))?;
        Ok(DiskStore {
            layout,
            index,
            hot: Mutex::new(Lru::new(memory, usize::MAX)),
            hot_cap: memory / 8,
            entry_cap: disk / 8,
            jobs,
            stats,
        })
    }

    /// Largest body an entry may have: an eighth of `disk_size`.
    pub fn entry_cap(&self) -> u64 {
        self.entry_cap
    }

    /// The entry of `digest` in memory, or what the index says of its file.
    pub fn lookup(&self, digest: &Digest) -> Found {
        if let Some(e) = self.hot.lock().get(digest).cloned() {
            return Found::Entry(e);
        }
        match self.index.lock().get(digest).copied() {
            Some(m) => Found::OnDisk { expires_at_ms: m.expires_at_ms },
            None => Found::Nothing,
        }
    }

    /// Reads and verifies the file of `digest` on the blocking pool.
    pub async fn read(&self, digest: Digest) -> Option<Arc<Entry>> {
        let path = self.layout.path(&digest);
        let read = tokio::task::spawn_blocking(move || -> Result<Entry, Option<DecodeError>> {
            let bytes = fs::read(&path).map_err(|_| None)?;
            Entry::decode(Bytes::from(bytes)).map_err(Some)
        })
        .await;
        match read {
            Ok(Ok(entry)) => {
                let entry = Arc::new(entry);
                self.keep_hot(digest, &entry);
                Some(entry)
            }
            Ok(Err(damage)) => {
                if let Some(why) = damage {
                    log::warn!("proxy-cache: entry file {} discarded: {why:?}", self.layout.path(&digest).display());
                    count(&self.stats.corrupt);
                }
                self.remove(&digest);
                None
            }
            Err(e) => {
                log::warn!("proxy-cache: reading an entry file failed: {e}");
                None
            }
        }
    }

    fn keep_hot(&self, digest: Digest, entry: &Arc<Entry>) {
        let weight = entry.weight();
        if weight <= self.hot_cap {
            let evicted = self.hot.lock().insert(digest, entry.clone(), weight);
            drop(evicted);
        }
    }

    /// Keeps `entry` in memory and queues its file.
    pub fn store(&self, digest: Digest, entry: Arc<Entry>) {
        self.keep_hot(digest, &entry);
        match self.jobs.try_send(Job::Write(digest, entry)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => count(&self.stats.writes_dropped),
            Err(TrySendError::Disconnected(_)) => count(&self.stats.write_errors),
        }
    }

    /// Removes the entry of `digest` (memory, index, file); whether there was one.
    pub fn remove(&self, digest: &Digest) -> bool {
        let hot = self.hot.lock().remove(digest).is_some();
        let indexed = self.index.lock().remove(digest).is_some();
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.jobs.try_send(Job::Remove(*digest)) {
            let _ = fs::remove_file(self.layout.path(digest));
        }
        hot || indexed
    }

    /// Waits (up to 10 s) until the queued writes are done.
    pub fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.jobs.send(Job::Flush(tx)).is_ok() {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }

    /// `(entries, bytes)` in memory and on disk.
    pub fn gauges(&self) -> [(usize, u64); 2] {
        let hot = {
            let h = self.hot.lock();
            (h.len(), h.weight())
        };
        let index = self.index.lock();
        [hot, (index.len(), index.weight())]
    }
}

/// The zone's writer thread.
struct Writer {
    layout: Arc<Layout>,
    index: Arc<Mutex<Lru<Meta>>>,
    stats: Arc<Stats>,
    seq: u64,
}

impl Writer {
    fn run(mut self, jobs: Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Write(digest, entry) => self.write(digest, &entry),
                Job::Remove(digest) => {
                    self.index.lock().remove(&digest);
                    let _ = fs::remove_file(self.layout.path(&digest));
                }
                Job::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    fn write(&mut self, digest: Digest, entry: &Entry) {
        let path = self.layout.path(&digest);
        self.seq += 1;
        let tmp = self.layout.root.join("tmp").join(format!("{}.{}.tmp", hex(&digest), self.seq));
        let written = (|| -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                fs::create_dir_all(dir)?;
            }
            let mut out = BufWriter::with_capacity(64 << 10, fs::File::create(&tmp)?);
            entry.write_to(&mut out)?;
            out.flush()?;
            drop(out);
            fs::rename(&tmp, &path)
        })();
        if let Err(e) = written {
            log::warn!("proxy-cache: cannot write {}: {e}", path.display());
            count(&self.stats.write_errors);
            let _ = fs::remove_file(&tmp);
            return;
        }
        let meta = Meta { expires_at_ms: entry.expires_at_ms };
        let inserted = self.index.lock().insert(digest, meta, entry.file_len());
        match inserted {
            Ok(evicted) => {
                self.stats.evicted.fetch_add(evicted.len() as u64, Ordering::Relaxed);
                for (d, _) in evicted {
                    let _ = fs::remove_file(self.layout.path(&d));
                }
            }
            Err(_) => {
                let _ = fs::remove_file(&path);
            }
        }
    }
}

/// Rebuilds the index from the files under the zone's root; the number of entries kept.
/// Temporary files are removed; files cut short, damaged in their head, misplaced or expired
/// are deleted. Only names this zone writes are touched.
fn rebuild(layout: &Layout, index: &Mutex<Lru<Meta>>, stats: &Stats) -> usize {
    if let Ok(dir) = fs::read_dir(layout.root.join("tmp")) {
        for f in dir.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".tmp") && name.get(..32).and_then(parse_hex).is_some() {
                let _ = fs::remove_file(f.path());
            }
        }
    }
    let now = crate::now_ms();
    let mut found: Vec<(u64, Digest, Meta, u64)> = Vec::new();
    walk(layout, &layout.root, 0, &mut |path, digest| {
        if layout.path(&digest) != path {
            let _ = fs::remove_file(path);
            return;
        }
        match check_file(path) {
            Ok((head, len)) if head.expires_at_ms > now => {
                found.push((head.stored_at_ms, digest, Meta { expires_at_ms: head.expires_at_ms }, len));
            }
            Ok(_) => {
                let _ = fs::remove_file(path);
            }
            Err(damage) => {
                log::warn!("proxy-cache: entry file {} discarded at start: {damage:?}", path.display());
                count(if damage == DecodeError::Torn { &stats.torn } else { &stats.corrupt });
                let _ = fs::remove_file(path);
            }
        }
    });
    found.sort_by_key(|(stored, ..)| *stored);
    let mut index = index.lock();
    for (_, digest, meta, len) in found {
        if let Ok(evicted) = index.insert(digest, meta, len) {
            stats.evicted.fetch_add(evicted.len() as u64, Ordering::Relaxed);
            for (d, _) in evicted {
                let _ = fs::remove_file(layout.path(&d));
            }
        }
    }
    index.len()
}

/// Calls `f` with every file at the leaf level whose name is a digest.
fn walk(layout: &Layout, dir: &Path, depth: usize, f: &mut dyn FnMut(&Path, Digest)) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = e.file_type() else { continue };
        match layout.levels.get(depth) {
            Some(&len) if kind.is_dir() && name.len() == len && name.bytes().all(|b| b.is_ascii_hexdigit()) => {
                walk(layout, &e.path(), depth + 1, f);
            }
            None if kind.is_file() => {
                if let Some(d) = parse_hex(&name) {
                    f(&e.path(), d);
                }
            }
            _ => {}
        }
    }
}

/// Reads a file's head and checks the file has the length it announces.
fn check_file(path: &Path) -> Result<(crate::entry::FileHead, u64), DecodeError> {
    let mut file = fs::File::open(path).map_err(|_| DecodeError::Torn)?;
    let len = file.metadata().map_err(|_| DecodeError::Torn)?.len();
    let mut head = [0u8; HEAD_LEN];
    file.read_exact(&mut head).map_err(|_| DecodeError::Torn)?;
    let head = read_head(&head)?;
    if head.total_len != len {
        return Err(DecodeError::Torn);
    }
    Ok((head, len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::tests::sample;
    use std::sync::atomic::AtomicU64;
    use weir_plugin::cache_zones::Amount;

    fn load(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    fn def(root: &Path, disk: &str) -> CacheZone {
        CacheZone {
            name: "d".into(),
            memory_size: Amount::Text("64k".into()),
            disk_size: Some(Amount::Text(disk.into())),
            disk_path: Some(root.to_string_lossy().into_owned()),
            cache_levels: Some("1:2".into()),
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-pc-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn fresh(body: &'static [u8]) -> Arc<Entry> {
        let mut e = sample(body);
        e.stored_at_ms = crate::now_ms();
        e.expires_at_ms = e.stored_at_ms + 60_000;
        Arc::new(e)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn files_survive_a_reopen_and_torn_or_damaged_ones_are_never_served() {
        let root = scratch("reopen");
        let stats = Arc::new(Stats::default());
        let store = DiskStore::open(&def(&root, "1m"), stats.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..3u8 {
            store.store([i; 16], fresh(b"body"));
        }
        store.flush();
        let path = store.layout.path(&[0; 16]);
        assert!(path.starts_with(root.join("0").join("00")), "{}", path.display());
        drop(store);
        // Cut one file short, flip a body byte of another, leave a stray temporary file.
        let cut = Layout { root: root.clone(), levels: vec![1, 2] }.path(&[1; 16]);
        let bytes = fs::read(&cut).unwrap_or_default();
        fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap_or_else(|e| panic!("{e}"));
        let flip = Layout { root: root.clone(), levels: vec![1, 2] }.path(&[2; 16]);
        let mut bytes = fs::read(&flip).unwrap_or_default();
        let at = bytes.len() - 10;
        bytes[at] ^= 1;
        fs::write(&flip, &bytes).unwrap_or_else(|e| panic!("{e}"));
        fs::write(root.join("tmp").join(format!("{}.9.tmp", hex(&[5; 16]))), b"half").unwrap_or_else(|e| panic!("{e}"));
        fs::write(root.join("README"), b"not ours").unwrap_or_else(|e| panic!("{e}"));

        let stats = Arc::new(Stats::default());
        let store = DiskStore::open(&def(&root, "1m"), stats.clone()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(&stats.torn), 1, "the cut file is found at start");
        assert!(!cut.exists());
        assert!(fs::read_dir(root.join("tmp")).map(|d| d.count()).unwrap_or(1) == 0, "temporary files removed");
        assert!(root.join("README").exists(), "files that are not entries are left alone");
        rt().block_on(async {
            assert!(matches!(store.lookup(&[0; 16]), Found::OnDisk { .. }));
            let e = store.read([0; 16]).await.map(|e| e.body.clone());
            assert_eq!(e.as_deref(), Some(&b"body"[..]));
            assert!(matches!(store.lookup(&[0; 16]), Found::Entry(_)), "now in memory");
            assert!(store.read([2; 16]).await.is_none(), "a damaged body is caught by the checksum");
            assert_eq!(load(&stats.corrupt), 1);
            assert!(matches!(store.lookup(&[2; 16]), Found::Nothing), "and forgotten");
        });
        assert!(store.remove(&[0; 16]));
        store.flush();
        assert!(!store.layout.path(&[0; 16]).exists());
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn disk_size_bounds_the_files_with_lru_eviction() {
        let root = scratch("evict");
        let stats = Arc::new(Stats::default());
        let one = fresh(&[b'x'; 1000]).file_len();
        let store =
            DiskStore::open(&def(&root, &(one * 4).to_string()), stats.clone()).unwrap_or_else(|e| panic!("{e}"));
        for i in 0..10u8 {
            store.store([i; 16], fresh(&[b'x'; 1000]));
        }
        store.flush();
        let [_, (files, bytes)] = store.gauges();
        assert_eq!((files, bytes), (4, one * 4));
        assert_eq!(load(&stats.evicted), 6);
        assert!(!store.layout.path(&[0; 16]).exists() && store.layout.path(&[9; 16]).exists());
        let _ = fs::remove_dir_all(&root);
    }
}
