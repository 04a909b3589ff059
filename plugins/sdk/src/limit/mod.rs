//! The limiters' kit: what limit-count, limit-req and limit-conn share.
//!
//! - [`key`]: APISIX's `key_type` / `key` compiled once, resolved per request without
//!   allocating (a key that resolves to nothing falls back to the client address).
//! - [`amount`]: limits given as numbers or as `${variable ?? default}` strings.
//! - [`store`]: the bounded local store (at most `max_keys` keys per plugin, least recently used
//!   evicted, sharded), and [`stats`], which exports its keys and evictions to Prometheus.
//! - [`redis`]: the Redis fields of every limiter and, with feature `limit-redis`, the client
//!   (connections per worker, timeouts, a breaker, TLS, Sentinel).
//! - [`MaxKeys`]: the `plugin_attr.<plugin>.max_keys` every limiter accepts; [`sleep`]: a
//!   delay awaited in a waiting phase without blocking the worker; the clocks the algorithms
//!   run on; [`Rejection`]: the answer to a limited request.

pub mod amount;
pub mod key;
pub mod redis;
pub mod stats;
pub mod store;

use std::sync::LazyLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use schemars::JsonSchema;
use serde::Deserialize;

pub use amount::{Amount, NumberOrVar};
pub use key::{KeyType, LimitKey};
pub use store::{BoundedStore, DEFAULT_MAX_KEYS, SHARDS};

use crate::PluginResponse;

/// `plugin_attr.<limiter>` in config.yaml: the bound of the plugin's local store.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MaxKeys {
    /// Keys the plugin's local store holds at most (default 100000); beyond, the least recently
    /// used are evicted (and counted in `limiter_evictions_total`).
    #[serde(default = "default_max_keys")]
    #[schemars(range(min = 64, max = 100_000_000))]
    pub max_keys: usize,
}

fn default_max_keys() -> usize {
    DEFAULT_MAX_KEYS
}

impl MaxKeys {
    /// The schema of `plugin_attr.<limiter>` ([`crate::Plugin::attr_schema`]).
    pub fn schema() -> serde_json::Value {
        crate::schema_of::<MaxKeys>()
    }
    /// The bound `attr` sets (the default without one).
    pub fn of(attr: Option<&serde_json::Value>) -> Result<usize, String> {
        match attr {
            None => Ok(DEFAULT_MAX_KEYS),
            Some(v) => crate::parse_conf::<MaxKeys>(v).map(|m| m.max_keys),
        }
    }
}

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Monotonic milliseconds since the process's first call: for windows only this process sees.
#[inline]
pub fn mono_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// Wall-clock milliseconds since 1970: for windows shared with other instances (through Redis)
/// or aligned on the clock (sliding windows), as APISIX's `ngx.now()`.
#[inline]
pub fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Waits `d` on the worker's timer, from a waiting phase (`Flow::wait`): the worker serves other
/// requests meanwhile. A request whose client goes away stops waiting with it (the phase's
/// future is dropped).
pub async fn sleep(d: Duration) {
    crate::timer::sleep(d).await;
}

/// Runs `fut` in the background on the calling worker's runtime (a periodic sync, a release
/// that must not hold up the response); `false` when called outside a runtime, where nothing
/// runs it.
pub fn spawn(fut: impl std::future::Future<Output = ()> + Send + 'static) -> bool {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn(fut);
            true
        }
        Err(_) => false,
    }
}

/// The answer to a request over its limit: `rejected_code` with `{"error_msg": rejected_msg}`
/// (made once per configuration).
#[derive(Debug, Clone)]
pub struct Rejection {
    status: StatusCode,
    body: Bytes,
}

impl Rejection {
    /// `code` (checked by the schema to be 200..=599; 503 otherwise) with `msg`.
    pub fn new(code: u16, msg: &str) -> Rejection {
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        let body = serde_json::to_vec(&serde_json::json!({ "error_msg": msg })).map(Bytes::from).unwrap_or_default();
        Rejection { status, body }
    }

    /// The response.
    pub fn response(&self) -> PluginResponse {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        PluginResponse { status: self.status, headers, body: self.body.clone() }
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

/// The answer when the shared store cannot be asked and `allow_degradation` is off: 503
/// `{"error_msg": "<plugin>: the rate-limit store is unavailable"}`.
pub fn store_unavailable(plugin: &str) -> PluginResponse {
    Rejection::new(503, &format!("{plugin}: the rate-limit store is unavailable")).response()
}

/// 64-bit FNV-1a: stable across builds, processes and hosts (for names that end up in shared
/// Redis keys, such as a configuration's scope).
pub fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
