//! Memory accounting and reclamation (`POST /v1/gc`): jemalloc is the global allocator (feature
//! `jemalloc`, on by default), so freed memory can be returned to the operating system on demand
//! instead of waiting for decay. Without it, allocator figures read 0 and purging does nothing.
#![allow(unsafe_code)] // each block says why it is sound (SAFETY)

use schemars::JsonSchema;
use serde::Serialize;

/// Memory figures at one moment.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema, Default)]
pub struct MemoryStats {
    /// Bytes allocated by the application (jemalloc `stats.allocated`).
    pub allocated: u64,
    /// Bytes in physically resident allocator pages (jemalloc `stats.resident`).
    pub resident: u64,
    /// Resident set size of the process (`VmRSS`).
    pub rss: u64,
}

/// Current figures.
pub fn stats() -> MemoryStats {
    let (allocated, resident) = allocator_stats();
    MemoryStats { allocated, resident, rss: process_rss().unwrap_or(0) }
}

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
fn allocator_stats() -> (u64, u64) {
    use tikv_jemalloc_ctl::{epoch, stats};
    // Statistics are cached by jemalloc; advancing the epoch refreshes them.
    let _ = epoch::advance();
    let allocated = stats::allocated::read().unwrap_or(0) as u64;
    let resident = stats::resident::read().unwrap_or(0) as u64;
    (allocated, resident)
}

#[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
fn allocator_stats() -> (u64, u64) {
    (0, 0)
}

/// Returns every unused dirty page of every arena to the OS and flushes this thread's cache.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
pub fn purge() -> Result<(), String> {
    use std::ffi::c_char;
    use std::ptr::null_mut;
    // `arena.<MALLCTL_ARENAS_ALL>.purge` takes no value: old and new pointers must be null, which
    // the typed wrappers of jemalloc-ctl cannot express.
    let call = |name: &[u8]| {
        // SAFETY: `name` is NUL-terminated and the control takes no input or output.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(name.as_ptr() as *const c_char, null_mut(), null_mut(), null_mut(), 0)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("mallctl {} failed: {rc}", String::from_utf8_lossy(&name[..name.len() - 1])))
        }
    };
    call(b"thread.tcache.flush\0")?;
    call(b"arena.4096.purge\0")
}

#[cfg(not(all(feature = "jemalloc", not(target_env = "msvc"))))]
pub fn purge() -> Result<(), String> {
    Ok(())
}

/// The process's resident set size in bytes, from `/proc/self/status`.
pub fn process_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}
