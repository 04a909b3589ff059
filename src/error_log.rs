//! Weir's own log (`gateway.error_log`): standard error until the configuration names a file,
//! then that file, reopened on SIGUSR1. `env_logger` writes every record through [`Writer`].

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use parking_lot::Mutex;
use weir_plugin::logfile::open_append;

static TARGET: Mutex<Option<(File, PathBuf)>> = Mutex::new(None);

/// The `env_logger` target: the configured file, or standard error.
pub struct Writer;

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match TARGET.lock().as_mut() {
            Some((file, _)) => file.write(buf),
            None => std::io::stderr().write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match TARGET.lock().as_mut() {
            Some((file, _)) => file.flush(),
            None => std::io::stderr().flush(),
        }
    }
}

/// From now on the log goes to `path`. The error names the key and the file.
pub fn start(path: PathBuf) -> Result<(), String> {
    let file =
        open_append(&path).map_err(|e| format!("gateway.error_log.path: cannot open {}: {e}", path.display()))?;
    *TARGET.lock() = Some((file, path));
    Ok(())
}

/// Reopens the file (SIGUSR1, after logrotate moved it); the old one stays on failure.
pub fn reopen() {
    let mut target = TARGET.lock();
    if let Some((file, path)) = target.as_mut() {
        match open_append(path) {
            Ok(f) => *file = f,
            Err(e) => {
                let _ = writeln!(file, "error log: cannot reopen {}: {e}", path.display());
            }
        }
    }
}
