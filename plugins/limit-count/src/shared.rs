//! The `redis`, `redis-cluster` and `redis-sentinel` policies: counters in Redis, so that every
//! instance naming the same Redis enforces one limit together. One request is one round trip: a
//! server-side script decides and counts atomically. Connections, timeouts and outages are the
//! SDK's (`weir_plugin::limit::redis`).
//!
//! - Fixed window: `weir:limit-count:<scope>:<key>`, incremented, expiring with its window.
//! - Sliding window: `weir:limit-count:{<scope>:<key>}:<window number>` for the current and the
//!   previous window (one hash tag, so one Redis Cluster slot: one script sees both).

use std::sync::LazyLock;

use weir_plugin::limit::redis::{RedisStore, Script, Unavailable};

use crate::local::slide;
use crate::Verdict;

/// Adds `ARGV[2]` to the window of `KEYS[1]` (`ARGV[1]` ms long, started by its first
/// request); returns the count and the milliseconds left.
const FIXED: &str = r"
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
";

/// The sliding-window decision, atomically: KEYS[1] is the current window, KEYS[2] the
/// previous one; ARGV: limit, window ms, ms left of the current window. Counts the request only
/// when it is let through. Returns {let through (0/1), current count before it, previous count}.
const SLIDING: &str = r"
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local left = tonumber(ARGV[3])
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local last = prev
if last > limit then last = limit end
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if cur >= limit or last * left / window + cur >= limit then
  return {0, cur, prev}
end
redis.call('INCR', KEYS[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], window * 2) end
return {1, cur, prev}
";

/// Adds ARGV[2] to the current sliding window KEYS[1] (expiring after two windows of ARGV[1]
/// ms) and reads the previous one KEYS[2]: {current count, previous count}.
const SLIDING_ADD: &str = r"
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) * 2) end
return {n, tonumber(redis.call('GET', KEYS[2]) or '0')}
";

static FIXED_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(FIXED));
static SLIDING_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING));
static SLIDING_ADD_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SLIDING_ADD));

/// The Redis key of a fixed window.
pub fn fixed_key(scope: &str, key: &str) -> String {
    format!("weir:limit-count:{scope}:{key}")
}

/// The common part of a sliding window's two Redis keys.
pub fn sliding_base(scope: &str, key: &str) -> String {
    format!("weir:limit-count:{{{scope}:{key}}}")
}

/// Adds `cost` to a fixed window: (count now, ms left).
pub async fn fixed_add(redis: &RedisStore, key: &str, cost: u64, window_ms: u64) -> Result<(u64, u64), Unavailable> {
    let mut call = FIXED_SCRIPT.key(key);
    call.arg(window_ms).arg(cost);
    let (n, ttl): (u64, i64) = redis.eval(&call).await?;
    Ok((n, ttl.max(0) as u64))
}

/// The decision for a request that counted `n` in a fixed window with `ttl` ms left.
pub fn fixed_verdict(n: u64, ttl: u64, limit: u64) -> Verdict {
    Verdict { allowed: n <= limit, remaining: limit.saturating_sub(n), reset: ttl.div_ceil(1000) }
}

fn window_keys(base: &str, id: u64) -> (String, String) {
    (format!("{base}:{id}"), format!("{base}:{}", id.wrapping_sub(1)))
}

/// Counts one request in a sliding window; `now` is wall-clock ms.
pub async fn sliding(
    redis: &RedisStore,
    base: &str,
    limit: u64,
    window_ms: u64,
    now: u64,
) -> Result<Verdict, Unavailable> {
    let (id, left) = (now / window_ms, window_ms - now % window_ms);
    let (cur_key, prev_key) = window_keys(base, id);
    let mut call = SLIDING_SCRIPT.key(&cur_key);
    call.key(&prev_key).arg(limit).arg(window_ms).arg(left);
    let (accepted, cur, prev): (u8, u64, u64) = redis.eval(&call).await?;
    let mut v = slide(limit, window_ms, left, cur, prev);
    // The script decided; the same arithmetic here gives the headers.
    v.allowed = accepted == 1;
    if !v.allowed {
        v.remaining = 0;
    }
    Ok(v)
}

/// Adds `cost` to the current sliding window: (what is left of the limit, ms left).
pub async fn sliding_add(
    redis: &RedisStore,
    base: &str,
    cost: u64,
    limit: u64,
    window_ms: u64,
    now: u64,
) -> Result<(i64, u64), Unavailable> {
    let (id, left) = (now / window_ms, window_ms - now % window_ms);
    let (cur_key, prev_key) = window_keys(base, id);
    let mut call = SLIDING_ADD_SCRIPT.key(&cur_key);
    call.key(&prev_key).arg(window_ms).arg(cost);
    let (n, prev): (u64, u64) = redis.eval(&call).await?;
    let weighted = prev.min(limit) as f64 * left as f64 / window_ms as f64;
    Ok(((limit as f64 - n as f64 - weighted).floor() as i64, left))
}
