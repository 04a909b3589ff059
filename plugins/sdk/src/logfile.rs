//! Log files written off the request path: a bounded queue per file and a writer thread. A full
//! queue drops lines (and counts them) instead of blocking a worker; `reopen` follows log
//! rotation (SIGUSR1); `finish` drains the queue on graceful shutdown.
//!
//! Plugins share one writer per path: [`LogFiles`] keeps them.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// Lines waiting for a writer before new ones are dropped (and counted).
pub const QUEUE: usize = 65_536;

enum Msg {
    Line(String),
    Reopen,
}

/// Locks, ignoring poisoning (a panicked writer thread leaves nothing half-done here).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One file and its writer thread.
pub struct LineWriter {
    /// Who writes, for messages (`file-logger`).
    owner: &'static str,
    tx: Mutex<Option<SyncSender<Msg>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    dropped: AtomicU64,
}

impl LineWriter {
    /// Opens (creating directories and the file as needed) and starts the writer.
    pub fn start(owner: &'static str, path: PathBuf) -> Result<Arc<LineWriter>, String> {
        let file = open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let (tx, rx) = sync_channel(QUEUE);
        let thread = std::thread::Builder::new()
            .name(owner.into())
            .spawn(move || write_loop(owner, path, file, rx))
            .map_err(|e| e.to_string())?;
        Ok(Arc::new(LineWriter {
            owner,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            dropped: AtomicU64::new(0),
        }))
    }

    /// Queues one line (without its newline); never blocks.
    pub fn line(&self, line: String) {
        self.send(Msg::Line(line));
    }

    /// Asks the writer to reopen the file (after rotation).
    pub fn reopen(&self) {
        self.send(Msg::Reopen);
    }

    fn send(&self, msg: Msg) {
        let guard = lock(&self.tx);
        let Some(tx) = guard.as_ref() else { return };
        match tx.try_send(msg) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_power_of_two() {
                    log::warn!("{}: writer behind, {} lines dropped so far", self.owner, n + 1);
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Closes the queue and waits until every queued line is written.
    pub fn finish(&self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

fn open(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new().create(true).append(true).open(path)
}

fn write_loop(owner: &str, path: PathBuf, file: File, rx: Receiver<Msg>) {
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    let mut failing = false;
    let report = |r: std::io::Result<()>, failing: &mut bool| match r {
        Ok(()) => *failing = false,
        Err(e) if !*failing => {
            *failing = true;
            log::error!("{owner}: writing {}: {e}", path.display());
        }
        Err(_) => {}
    };
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Line(line) => {
                    let r = out.write_all(line.as_bytes()).and_then(|_| out.write_all(b"\n"));
                    report(r, &mut failing);
                }
                Msg::Reopen => {
                    report(out.flush(), &mut failing);
                    match open(&path) {
                        Ok(f) => out = BufWriter::with_capacity(64 * 1024, f),
                        Err(e) => log::error!("{owner}: reopening {}: {e}", path.display()),
                    }
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
