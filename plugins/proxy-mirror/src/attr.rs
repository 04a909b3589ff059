//! `plugin_attr.proxy-mirror` in config.yaml: the mirrored requests' timeouts (APISIX's
//! `timeout: {connect, read, send}` as nginx times: `60s`, `2000ms`), and Weir's bound on
//! mirrored requests in flight per configuration. Read at `init`, kept in atomics that requests
//! read without a lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;

/// `plugin_attr.proxy-mirror`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Attr {
    /// Timeouts of the mirrored requests (nginx times: `60s`, `500ms`, `1m`; a bare number is
    /// seconds).
    #[serde(default)]
    pub timeout: Option<Timeouts>,
    /// Mirrored requests of one configuration in flight at once; beyond, copies are dropped and
    /// counted (`proxy_mirror_requests_total{outcome="dropped"}`).
    #[serde(default)]
    #[schemars(range(min = 1, max = 100000))]
    pub max_in_flight: Option<usize>,
}

/// `timeout`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Connecting.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)?$"))]
    pub connect: Option<String>,
    /// Between two reads of the answer.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)?$"))]
    pub read: Option<String>,
    /// Between two writes of the request.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)?$"))]
    pub send: Option<String>,
}

/// APISIX's default for each timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Weir's default bound of mirrored requests in flight per configuration.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 128;

static BUDGET_MS: AtomicU64 = AtomicU64::new(3 * 60_000);
static MAX_IN_FLIGHT: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_IN_FLIGHT);

/// An nginx time (`60s`, `500ms`, `1m`, `2h`, `30`: seconds).
pub fn nginx_time(text: &str) -> Result<Duration, String> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let n: u64 = text[..digits].parse().map_err(|_| format!("`{text}` is not a time (60s, 500ms, 1m)"))?;
    let unit = match &text[digits..] {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("`{text}` is not a time (60s, 500ms, 1m)")),
    };
    Ok(Duration::from_millis(n.saturating_mul(unit)))
}

/// Applies `attr` (from `Plugin::init`); errors name the key.
pub fn apply(attr: &Attr, check_only: bool) -> Result<(), String> {
    let t = attr.timeout.as_ref();
    let one = |v: Option<&String>, key: &str| -> Result<Duration, String> {
        v.map_or(Ok(DEFAULT_TIMEOUT), |s| nginx_time(s).map_err(|e| format!("timeout.{key}: {e}")))
    };
    let connect = one(t.and_then(|t| t.connect.as_ref()), "connect")?;
    let read = one(t.and_then(|t| t.read.as_ref()), "read")?;
    let send = one(t.and_then(|t| t.send.as_ref()), "send")?;
    if !check_only {
        let total = connect.saturating_add(read).saturating_add(send);
        BUDGET_MS.store(u64::try_from(total.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
        MAX_IN_FLIGHT.store(attr.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT).max(1), Ordering::Relaxed);
    }
    Ok(())
}

/// How long a mirrored exchange may take in all: connect + send + read (the host's client
/// bounds the whole exchange, and each step by the same).
pub fn budget() -> Duration {
    Duration::from_millis(BUDGET_MS.load(Ordering::Relaxed))
}

/// The in-flight bound of a configuration built now.
pub fn max_in_flight() -> usize {
    MAX_IN_FLIGHT.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_times_parse() {
        assert_eq!(nginx_time("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(nginx_time("2000ms"), Ok(Duration::from_millis(2000)));
        assert_eq!(nginx_time("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(nginx_time("7"), Ok(Duration::from_secs(7)));
        assert!(nginx_time("7x").is_err() && nginx_time("").is_err() && nginx_time("s").is_err());
        assert!(nginx_time("99999999999999999999999h").is_err(), "too many digits: refused, no panic");
        assert_eq!(nginx_time("18446744073709551615h"), Ok(Duration::from_millis(u64::MAX)), "saturates");
    }
}
