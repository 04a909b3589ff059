//! The `redis` and `redis-cluster` policies: the bucket of a key is one Redis hash
//! (`weir:limit-req:<scope>:<key>`, fields `excess` and `last`), read, drained, checked and
//! written back by one script, atomically, so concurrent requests on several instances cannot
//! all see the same stale excess. One key per script: Redis Cluster runs it on the key's slot.
//! The clock is the gateway's wall clock (ms), as APISIX's `ngx.now()`: instances sharing a
//! bucket should keep their clocks in sync (NTP).

use std::sync::LazyLock;

use weir_plugin::limit::redis::{RedisStore, Script, Unavailable};

use crate::bucket::{Decision, Shape};

/// KEYS[1]: the bucket; ARGV: rate ×1000, burst ×1000, now (ms), expiry (s). Returns
/// {1, excess} when let through (and stored), {0, excess} when rejected (nothing stored); the
/// excess as a string, to keep its fraction.
const BUCKET: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 'excess', 'last')
local excess = 0
if state[1] and state[2] then
  local elapsed = math.abs(now - tonumber(state[2]))
  excess = math.max(tonumber(state[1]) - rate * elapsed / 1000 + 1000, 0)
  if excess > burst then
    return {0, tostring(excess)}
  end
end
redis.call('HSET', KEYS[1], 'excess', tostring(excess), 'last', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {1, tostring(excess)}
";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(BUCKET));

/// The Redis key of `key`'s bucket in `scope`.
pub fn redis_key(scope: &str, key: &str) -> String {
    format!("weir:limit-req:{scope}:{key}")
}

/// One request in the bucket `key` at `now` (wall ms).
pub async fn incoming(redis: &RedisStore, key: &str, shape: Shape, now: u64) -> Result<Decision, Unavailable> {
    // The bucket is empty again after burst / rate seconds; keep it one second longer.
    let ttl = (shape.burst / shape.rate).ceil() as u64 + 1;
    let mut call = SCRIPT.key(key);
    call.arg(shape.rate).arg(shape.burst).arg(now).arg(ttl);
    let (allowed, excess): (u8, String) = redis.eval(&call).await?;
    if allowed == 0 {
        return Ok(Decision::Reject);
    }
    let excess: f64 = excess.parse().unwrap_or(0.0);
    Ok(Decision::Delay(shape.delay(excess)))
}
