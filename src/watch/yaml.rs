//! Watches `conf/resources.yaml` (`deployment.config_provider: yaml`) and applies changes.
//!
//! The file is polled (every 200 ms: cheap, and robust to editors that replace files by rename,
//! which inotify-based watchers often miss). A changed file is read once it has held still for
//! [`SETTLE`] (its size and time unchanged), so a file being written in place (`cp` over it, `>`
//! truncating it first) is not applied half-written: a prefix of a YAML document is often valid
//! YAML, and an empty file is a valid empty set. It is then parsed and handed to
//! [`Gateway::apply_resources`]; an invalid one is logged and the last good snapshot stays.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use crate::resources::yaml::load;
use crate::state::Gateway;

/// How often the file is checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How long a changed file must hold still before it is read: long against the pauses of a
/// copy in progress, short against the time between two edits (a change every 300 ms must
/// still apply, each in turn).
pub const SETTLE: Duration = Duration::from_millis(50);

#[derive(PartialEq, Eq, Clone, Copy)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| Stamp { modified: m.modified().ok(), len: m.len() })
}

/// Stamps of the files the current resources were read from (`ssls[].cert_file`, `key_file`).
fn stamps(files: &[PathBuf]) -> Vec<Option<Stamp>> {
    files.iter().map(|f| stamp(f)).collect()
}

/// Whether a changed file has held still: the same stamps (the document's and its certificate
/// files') on two looks in a row, [`SETTLE`] apart.
#[derive(Default)]
struct Settle {
    seen: Option<(Option<Stamp>, Vec<Option<Stamp>>)>,
}

impl Settle {
    fn holds_still(&mut self, now: Option<Stamp>, referenced: &[Option<Stamp>]) -> bool {
        if self.seen.as_ref().is_some_and(|(n, r)| *n == now && r == referenced) {
            return true;
        }
        self.seen = Some((now, referenced.to_vec()));
        false
    }
}

/// Watches `path` on a background thread for as long as `gateway` lives.
pub fn watch(path: PathBuf, gateway: &Arc<Gateway>) {
    let weak: Weak<Gateway> = Arc::downgrade(gateway);
    let mut last = stamp(&path);
    let mut settle = Settle::default();
    let mut pause = POLL_INTERVAL;
    // A hash of the content, not the content: a large file is not kept twice in memory.
    let digest = |bytes: Option<Vec<u8>>| {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        bytes.hash(&mut h);
        h.finish()
    };
    let mut last_text = digest(std::fs::read(&path).ok());
    let mut files = gateway.resources.load().certs.files.clone();
    let mut file_stamps = stamps(&files);
    let spawned = std::thread::Builder::new().name("resources-watch".into()).spawn(move || loop {
        std::thread::sleep(pause);
        pause = POLL_INTERVAL;
        let Some(gateway) = weak.upgrade() else { return };
        let now = stamp(&path);
        // A certificate file replaced in place (a renewal) reloads as if the document changed.
        let referenced = stamps(&files);
        if now == last && referenced == file_stamps {
            continue;
        }
        if !settle.holds_still(now, &referenced) {
            pause = SETTLE;
            continue;
        }
        let files_changed = referenced != file_stamps;
        file_stamps = referenced;
        last = now;
        let text = digest(std::fs::read(&path).ok());
        if text == last_text && !files_changed {
            continue;
        }
        last_text = text;
        let file = path.display();
        match load(&path) {
            Err(e) => {
                log::error!("{e}; keeping the last good resources");
                gateway.provider_status.lock().last_error = Some(e.to_string());
            }
            Ok(raw) => match gateway.apply_resources(raw) {
                Ok(summary) => {
                    log::info!("{file}: reloaded: {summary}");
                    gateway.provider_status.lock().last_error = None;
                    files = gateway.resources.load().certs.files.clone();
                    file_stamps = stamps(&files);
                }
                Err(issues) => {
                    // `GET /v1/config_status` and the dashboard show why the file was refused.
                    let text: Vec<String> = issues.iter().map(|i| format!("{file}: {i}")).collect();
                    gateway.provider_status.lock().last_error = Some(text.join("\n"));
                    for issue in issues {
                        log::error!("{file}: {issue}");
                    }
                    log::error!("{file}: invalid, keeping the last good resources");
                }
            },
        }
    });
    if let Err(e) = spawned {
        log::error!("cannot watch {}: {e}", gateway.prefix.resources_file().display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_read_once_it_holds_still() {
        let at = |len: u64| Some(Stamp { modified: Some(SystemTime::UNIX_EPOCH + Duration::from_millis(len)), len });
        let mut settle = Settle::default();
        // A file growing on every poll (a slow `cp` over it) is never read half-written.
        for len in [0, 10, 20, 35, 50] {
            assert!(!settle.holds_still(at(len), &[]), "{len} bytes, still growing");
        }
        assert!(settle.holds_still(at(50), &[]), "the same stamp on the next look");
        // A certificate file it names changing counts as a change too.
        assert!(!settle.holds_still(at(50), &[at(7)]));
        assert!(settle.holds_still(at(50), &[at(7)]));
        // A removed file holds still as well (it is read as the empty set).
        assert!(!settle.holds_still(None, &[]));
        assert!(settle.holds_still(None, &[]));
    }
}
