//! Process logging: `env_logger` (level from `RUST_LOG`, default `info`), with one correction.
//!
//! actix-http reports every malformed request it refuses (bad chunked bodies, smuggling shapes,
//! garbage on the socket) at error level. Those are the client's errors, not Weir's: at error
//! level, anyone able to open a connection could fill the error log. They are demoted to debug
//! (one short line, prefixed `client protocol error:`); the client still gets its 400.

use log::{Level, LevelFilter, Log, Metadata, Record};

/// Records (target prefix, message prefix) that a client can cause at will.
const CLIENT_ERRORS: [(&str, &str); 2] =
    [("actix_http::h1::dispatcher", "stream error"), ("actix_http::h1::decoder", "")];

struct Demoting {
    inner: env_logger::Logger,
}

fn is_client_error(record: &Record<'_>) -> bool {
    record.level() == Level::Error
        && CLIENT_ERRORS
            .iter()
            .any(|(target, prefix)| record.target().starts_with(target) && starts_with(record, prefix))
}

fn starts_with(record: &Record<'_>, prefix: &str) -> bool {
    match record.args().as_str() {
        Some(s) => s.starts_with(prefix),
        None => record.args().to_string().starts_with(prefix),
    }
}

impl Log for Demoting {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        if !is_client_error(record) {
            if self.inner.matches(record) {
                self.inner.log(record);
            }
            return;
        }
        let demoted = Metadata::builder().level(Level::Debug).target(record.target()).build();
        if self.inner.enabled(&demoted) {
            self.inner.log(
                &Record::builder()
                    .metadata(demoted)
                    .args(format_args!("client protocol error: {}", record.args()))
                    .module_path(record.module_path())
                    .file(record.file())
                    .line(record.line())
                    .build(),
            );
        }
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

/// Installs the process logger.
pub fn init() {
    let inner = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max = inner.filter().max(LevelFilter::Error);
    if log::set_boxed_logger(Box::new(Demoting { inner })).is_ok() {
        log::set_max_level(max);
    }
}
