//! `limit-conn` on stream routes: bounds the connections open at once per key (the client
//! address by default). Up to `conn` go through at once; the next `burst` wait
//! `default_conn_delay` seconds for each `conn` they are over; beyond `conn + burst` a
//! connection is closed. APISIX's fields and arithmetic (lua-resty-limit-conn).
//!
//! Counts live as long as connections hold them: a configuration left unchanged by a reload
//! keeps its counts (the new instance finds the old state), a changed one starts afresh.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use weir_plugin::{schema_of, StreamCtx, StreamFlow, StreamInstance, StreamPlugin};

/// Route configuration.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Conf {
    /// Connections allowed at once per key.
    #[schemars(range(min = 1))]
    pub conn: u32,
    /// Connections over `conn` that are delayed rather than closed.
    #[schemars(range(min = 0))]
    pub burst: u32,
    /// Seconds of delay per `conn` connections over the limit.
    #[schemars(range(min = 0.0, max = 3600.0))]
    pub default_conn_delay: f64,
    /// What connections are counted by.
    #[serde(default)]
    pub key: Key,
}

/// `key`.
#[derive(Debug, Default, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    /// The client's IP.
    #[default]
    RemoteAddr,
    /// The listener's address: one limit for everyone on it.
    ServerAddr,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open connections per key, for one configuration.
#[derive(Default)]
struct Counts(Mutex<HashMap<String, u32>>);

/// A connection's place in the count; gives it back when the connection ends.
struct Slot {
    counts: Arc<Counts>,
    key: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut map = lock(&self.counts.0);
        if let Some(n) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

struct Limit {
    conn: u32,
    burst: u32,
    delay: Duration,
    key: Key,
    counts: Arc<Counts>,
}

impl StreamInstance for Limit {
    fn preread(&self, ctx: &mut StreamCtx) -> StreamFlow {
        let key = match self.key {
            Key::RemoteAddr => ctx.remote_addr.ip().to_string(),
            Key::ServerAddr => ctx.local_addr.to_string(),
        };
        let n = {
            let mut map = lock(&self.counts.0);
            let n = map.entry(key.clone()).or_insert(0);
            if *n >= self.conn + self.burst {
                return StreamFlow::Close(format!(
                    "{} connections open for {key} (conn {} + burst {})",
                    n, self.conn, self.burst
                ));
            }
            *n += 1;
            *n
        };
        ctx.hold(Box::new(Slot { counts: self.counts.clone(), key }));
        if n > self.conn {
            // lua-resty-limit-conn: one unit of delay per `conn` connections over the limit.
            let units = (n - 1) / self.conn;
            return StreamFlow::Delay(self.delay * units);
        }
        StreamFlow::Continue
    }
}

/// The plugin: remembers the counts of each configuration across reloads.
#[derive(Default)]
pub struct LimitConn {
    states: Mutex<HashMap<String, Weak<Counts>>>,
}

impl StreamPlugin for LimitConn {
    fn name(&self) -> &'static str {
        "limit-conn"
    }
    fn priority(&self) -> i32 {
        1003
    }
    fn schema(&self) -> Value {
        schema_of::<Conf>()
    }
    fn build(&self, conf: &Value) -> Result<Arc<dyn StreamInstance>, String> {
        let c: Conf = weir_plugin::parse_conf(conf)?;
        if !c.default_conn_delay.is_finite() || c.default_conn_delay > 3600.0 {
            return Err("default_conn_delay must be between 0 and 3600 seconds".into());
        }
        let mut states = lock(&self.states);
        states.retain(|_, w| w.strong_count() > 0);
        let id = conf.to_string();
        let counts = match states.get(&id).and_then(Weak::upgrade) {
            Some(c) => c,
            None => {
                let c = Arc::new(Counts::default());
                states.insert(id, Arc::downgrade(&c));
                c
            }
        };
        Ok(Arc::new(Limit {
            conn: c.conn,
            burst: c.burst,
            delay: Duration::try_from_secs_f64(c.default_conn_delay).unwrap_or(Duration::from_secs(3600)),
            key: c.key,
            counts,
        }))
    }
}
