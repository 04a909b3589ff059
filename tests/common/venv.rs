//! Python virtualenvs the tests make under the target directory, with packages from PyPI
//! (made once per name; a lock file keeps parallel test processes from racing).
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The python of virtualenv `name` with `packages` installed; `None` (the test skips, loudly)
/// when it cannot be made, unless the environment variable `require` is `1`: then a panic.
pub fn python(name: &str, packages: &[&str], require: &str) -> Option<PathBuf> {
    static MADE: Mutex<Option<HashMap<String, Result<PathBuf, String>>>> = Mutex::new(None);
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let made = made.get_or_insert_with(HashMap::new);
    let result = made.entry(name.to_owned()).or_insert_with(|| make(name, packages)).clone();
    match result {
        Ok(p) => Some(p),
        Err(why) if std::env::var(require).is_ok_and(|v| v == "1") => {
            panic!("{require}=1 but the virtualenv {name} cannot be made: {why}")
        }
        Err(why) => {
            super::skip(name, &format!("no virtualenv ({why}); set {require}=1 to make this a failure"));
            None
        }
    }
}

fn make(name: &str, packages: &[&str]) -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let python = dir.join("bin/python");
    let ready = dir.join(".ready");
    let lock = dir.with_extension("lock");
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if ready.exists() {
            return Ok(python);
        }
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => {
                // Another process is making it; a lock older than 10 minutes is stale.
                let stale = std::fs::metadata(&lock)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > Duration::from_secs(600));
                if stale {
                    let _ = std::fs::remove_file(&lock);
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", lock.display())),
        }
    }
    let result = (|| {
        let _ = std::fs::remove_dir_all(&dir);
        let out =
            Command::new("python3").args(["-m", "venv"]).arg(&dir).output().map_err(|e| format!("python3: {e}"))?;
        if !out.status.success() {
            return Err(format!("python3 -m venv: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let out = Command::new(dir.join("bin/pip"))
            .args(["install", "-q", "--disable-pip-version-check"])
            .args(packages)
            .output()
            .map_err(|e| format!("pip: {e}"))?;
        if !out.status.success() {
            return Err(format!("pip install {packages:?}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        std::fs::write(&ready, b"").map_err(|e| e.to_string())?;
        Ok(python.clone())
    })();
    let _ = std::fs::remove_file(&lock);
    result
}
