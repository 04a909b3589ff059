//! The `redis` and `redis-cluster` policies: the requests in progress for a key are the members
//! of one Redis sorted set (`weir:limit-conn:<scope>:<key>`), one member per request, scored by
//! when it expires (`key_ttl` after it entered). A script drops the expired members (those of
//! a gateway that died holding them), counts, and adds the request when it fits, atomically;
//! the request's member is removed when it ends. One key per script: Redis Cluster runs it on
//! the key's slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use weir_plugin::limit::redis::{Cmd, RedisStore, Script, Unavailable};

/// KEYS[1]: the set; ARGV: conn + burst, key_ttl (s), now (s), the request's member. Returns
/// {1, count with it} when it entered, {0, count} when it did not fit.
const ENTER: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, ARGV[3])
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[1]) then
  return {0, n}
end
redis.call('ZADD', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[2]), ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {1, n + 1}
";

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ENTER));

/// A member name unique across instances: a random number per process and a counter.
fn member() -> String {
    static PROCESS: LazyLock<u64> = LazyLock::new(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        h.write_u32(std::process::id());
        h.finish()
    });
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{:016x}-{}", *PROCESS, NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The Redis key of `key`'s set in `scope`.
pub fn redis_key(scope: &str, key: &str) -> String {
    format!("weir:limit-conn:{scope}:{key}")
}

/// A request's place in a Redis set; given back (in the background) when dropped.
pub struct Place {
    redis: Arc<RedisStore>,
    key: String,
    member: String,
}

impl Drop for Place {
    fn drop(&mut self) {
        let (redis, key, member) =
            (self.redis.clone(), std::mem::take(&mut self.key), std::mem::take(&mut self.member));
        let spawned = weir_plugin::limit::spawn(async move {
            let mut cmd = Cmd::new();
            cmd.arg("ZREM").arg(&key).arg(&member);
            // Failure is logged by the store; the member expires with its score (key_ttl).
            let _ = redis.query::<i64>(&cmd).await;
        });
        if !spawned {
            log::debug!("limit-conn: no runtime to give back a place; it expires after key_ttl");
        }
    }
}

/// Enters the request into the set `key`: `Ok(Some((place, count)))` when it fits,
/// `Ok(None)` when it does not.
pub async fn enter(
    redis: &Arc<RedisStore>,
    key: String,
    max: u64,
    ttl: u64,
) -> Result<Option<(Place, u64)>, Unavailable> {
    let member = member();
    let now = weir_plugin::limit::wall_ms() / 1000;
    let mut call = SCRIPT.key(&key);
    call.arg(max).arg(ttl).arg(now).arg(&member);
    let (entered, n): (u8, u64) = redis.eval(&call).await?;
    if entered == 0 {
        return Ok(None);
    }
    Ok(Some((Place { redis: redis.clone(), key, member }, n)))
}
