//! Log files written off the request path: a bounded queue per file and a writer thread. A full
//! queue drops lines (and counts them) instead of blocking a worker; `reopen` follows log
//! rotation (SIGUSR1) before the next line written; `finish` drains the queue on graceful
//! shutdown, within a bound. The host's access log and the logging plugins share this writer.
//!
//! Plugins share one writer per path: [`LogFiles`] keeps them.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Lines waiting for a writer before new ones are dropped (and counted).
pub const QUEUE: usize = 65_536;

/// How long a graceful stop waits for queued lines (a stalled disk must not hold it forever).
pub const FINISH_WAIT: Duration = Duration::from_secs(5);

enum Msg {
    Line(String),
    /// Write out everything queued before, answer, and stop.
    Finish(SyncSender<()>),
}

/// Locks, ignoring poisoning (a panicked writer thread leaves nothing half-done here).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the writer thread shares with the senders.
#[derive(Default)]
struct Shared {
    written: AtomicU64,
    dropped: AtomicU64,
    reopen: AtomicBool,
}

/// One file and its writer thread. Queuing a line takes no lock.
pub struct LineWriter {
    /// Who writes, for messages (`file-logger`).
    owner: &'static str,
    tx: SyncSender<Msg>,
    shared: Arc<Shared>,
}

impl LineWriter {
    /// Opens (creating directories and the file as needed) and starts the writer.
    pub fn start(owner: &'static str, path: PathBuf) -> Result<Arc<LineWriter>, String> {
        Self::start_with(owner, path, QUEUE)
    }

    /// As [`LineWriter::start`], with room for `queue` waiting lines.
    pub fn start_with(owner: &'static str, path: PathBuf, queue: usize) -> Result<Arc<LineWriter>, String> {
        let file = open_append(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let (tx, rx) = sync_channel(queue);
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name(owner.into())
            .spawn(move || write_loop(owner, path, file, rx, &theirs))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(LineWriter { owner, tx, shared }))
    }

    /// Queues one line (without its newline); never blocks. A full queue drops it (counted).
    pub fn line(&self, line: String) {
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() {
                    log::warn!("{}: writer behind, {} lines dropped so far", self.owner, n + 1);
                }
            }
            // Finished: the process is stopping.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Asks the writer to reopen the file (after rotation) before the next line it writes.
    pub fn reopen(&self) {
        self.shared.reopen.store(true, Ordering::Release);
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Relaxed)
    }

    /// Lines dropped so far (queue full, or a failed write).
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Waits (at most [`FINISH_WAIT`]) until every line queued so far is written, then stops
    /// the writer; later lines are ignored.
    pub fn finish(&self) {
        let deadline = Instant::now() + FINISH_WAIT;
        let (done, wait) = sync_channel(1);
        let mut msg = Msg::Finish(done);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return,
            }
        }
        let _ = wait.recv_timeout(deadline.saturating_duration_since(Instant::now()));
    }
}

/// Opens `path` for appending, creating its directories and the file as needed.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

fn write_loop(owner: &str, path: PathBuf, file: File, rx: Receiver<Msg>, shared: &Shared) {
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    // One error line when writing starts failing, not one per line.
    let mut failing = false;
    let report = |r: std::io::Result<()>, failing: &mut bool| match r {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            log::error!("{owner}: writing {} (lines are dropped and counted): {e}", path.display());
        }
        Err(_) => {}
    };
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(line) => {
                    if shared.reopen.swap(false, Ordering::AcqRel) {
                        report(out.flush(), &mut failing);
                        match open_append(&path) {
                            Ok(f) => out = BufWriter::with_capacity(64 * 1024, f),
                            Err(e) => log::error!("{owner}: reopening {}: {e}", path.display()),
                        }
                    }
                    let r = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n"));
                    let counter = if r.is_ok() { &shared.written } else { &shared.dropped };
                    counter.fetch_add(1, Ordering::Relaxed);
                    report(r, &mut failing);
                }
                Msg::Finish(done) => {
                    report(out.flush(), &mut failing);
                    let _ = done.send(());
                    return;
                }
            }
            next = rx.try_recv().ok();
        }
        // The queue is empty: make what was written visible.
        report(out.flush(), &mut failing);
    }
    report(out.flush(), &mut failing);
}

/// The writers of one plugin, one per path.
#[derive(Default)]
pub struct LogFiles {
    writers: Mutex<HashMap<PathBuf, Arc<LineWriter>>>,
}

impl LogFiles {
    /// The writer of `path`, started on first use.
    pub fn get(&self, owner: &'static str, path: PathBuf) -> Result<Arc<LineWriter>, String> {
        let mut writers = lock(&self.writers);
        if let Some(w) = writers.get(&path) {
            return Ok(w.clone());
        }
        let w = LineWriter::start(owner, path.clone())?;
        writers.insert(path, w.clone());
        Ok(w)
    }

    /// Reopens every file (SIGUSR1).
    pub fn reopen(&self) {
        for w in lock(&self.writers).values() {
            w.reopen();
        }
    }

    /// Drains and closes every file (graceful shutdown).
    pub fn finish(&self) {
        let writers: Vec<Arc<LineWriter>> = lock(&self.writers).drain().map(|(_, w)| w).collect();
        for w in writers {
            w.finish();
        }
    }
}
