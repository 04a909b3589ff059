//! `limit-conn` on HTTP routes: at most `conn` requests of a key in progress at once; the next
//! `burst` wait `default_conn_delay` seconds for each `conn` they are over (lua-resty-limit-conn's
//! arithmetic), the ones beyond are rejected. A request's place is taken in the access phase and
//! given back when the request ends: its context is dropped after the log phase, which happens
//! on every path (answered, rejected by a later plugin, failed upstream, client gone while
//! waiting or while the response streams, WebSocket closed).
//!
//! Unless `only_use_default_delay`, the delay unit follows the latency of finished requests (the
//! average of the unit and each latency), as lua-resty-limit-conn's `leaving` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_plugin::limit::redis::{Policy, RedisStore, RedisTarget, Registry, Shared};
use weir_plugin::limit::store::BoundedStore;
use weir_plugin::limit::{self, Amount, KeyType, LimitKey, MaxKeys, Rejection, DEFAULT_MAX_KEYS};
use weir_plugin::{BuildContext, Flow, InitEnv, Late, Owner, Plugin, PluginInstance, RequestCtx, Value};

use crate::conf::Conf;
use crate::shared;

/// Requests in progress per key (entries leave the store at zero).
type Store = BoundedStore<u64>;

/// A local place: one request counted under `hash`; given back when dropped.
struct LocalPlace {
    store: Arc<Store>,
    hash: u64,
}

impl Drop for LocalPlace {
    fn drop(&mut self) {
        self.store.update(self.hash, |n| {
            *n = n.saturating_sub(1);
            ((), *n > 0)
        });
    }
}

/// A place held for its `Drop`, which gives it back.
enum Place {
    Local(#[allow(dead_code)] LocalPlace),
    Redis(#[allow(dead_code)] shared::Place),
}

/// The places a request holds (all limit-conn configurations of the request), and the delay
/// each configuration imposed; dropped with the request's context.
#[derive(Default)]
struct Held {
    places: Vec<Place>,
    delays: Vec<(usize, f64)>,
}

fn held(ctx: &mut RequestCtx) -> &mut Held {
    if ctx.slots.get::<Held>().is_none() {
        ctx.slots.insert(Held::default());
    }
    match ctx.slots.get_mut::<Held>() {
        Some(h) => h,
        None => unreachable!("inserted above"),
    }
}

struct RuleSpec {
    conn: Amount,
    burst: Amount,
    key: LimitKey,
}

enum Mode {
    Local(Arc<Store>),
    Redis(Arc<RedisStore>, u64),
}

struct Instance {
    rules: Vec<RuleSpec>,
    /// `rules` form: a rule whose key or limits do not resolve is skipped (APISIX); the plain
    /// form answers 500 then.
    skip_unresolved: bool,
    /// The delay unit in seconds, as f64 bits (it moves with latency unless fixed).
    unit: AtomicU64,
    adaptive: bool,
    degrade: bool,
    scope: Arc<str>,
    scope_id: u64,
    mode: Mode,
    rejection: Rejection,
}

/// The delay of the `n`th request in progress with `conn` allowed: one unit per `conn` over.
fn delay_of(n: u64, conn: u64, unit: f64) -> f64 {
    if n > conn {
        unit * ((n - 1) / conn) as f64
    } else {
        0.0
    }
}

enum Step {
    Skip,
    Go { conn: u64, max: u64, rule: usize },
    Fail(String),
}

impl Instance {
    fn id(&self) -> usize {
        self as *const Instance as usize
    }

    fn unit(&self) -> f64 {
        f64::from_bits(self.unit.load(Ordering::Relaxed))
    }

    fn limits(&self, ctx: &RequestCtx, i: usize, rule: &RuleSpec) -> Step {
        match (rule.conn.get(ctx), rule.burst.get(ctx)) {
            (Ok(conn), Ok(burst)) => Step::Go { conn, max: conn.saturating_add(burst), rule: i },
            _ if self.skip_unresolved => Step::Skip,
            (Err(e), _) => Step::Fail(format!("conn: {e}")),
            (_, Err(e)) => Step::Fail(format!("burst: {e}")),
        }
    }

    fn failed(&self, why: &str) -> Flow<'static> {
        if self.degrade {
            return Flow::Continue;
        }
        log::error!("limit-conn: {why}");
        Flow::Respond(Rejection::new(500, "failed to limit conn").response())
    }

    fn finish(&self, ctx: &mut RequestCtx, delay: f64) -> Flow<'static> {
        if delay >= 0.001 {
            held(ctx).delays.push((self.id(), delay));
            return Flow::wait(async move {
                limit::sleep(Duration::from_secs_f64(delay.min(86_400.0))).await;
                Flow::Continue
            });
        }
        Flow::Continue
    }

    fn local(&self, ctx: &mut RequestCtx, store: &Arc<Store>) -> Flow<'static> {
        let unit = self.unit();
        let mut delay = 0.0;
        for (i, rule) in self.rules.iter().enumerate() {
            let (conn, max) = match self.limits(ctx, i, rule) {
                Step::Go { conn, max, .. } => (conn, max),
                Step::Skip => continue,
                Step::Fail(why) => return self.failed(&why),
            };
            let scope = self.scope_id.wrapping_add(i as u64);
            let hash = if self.skip_unresolved {
                match rule.key.try_with(ctx, |k| store.hash(scope, k)) {
                    Some(h) => h,
                    None => continue,
                }
            } else {
                rule.key.with(ctx, |k| store.hash(scope, k))
            };
            let entered = store.with_entry(
                hash,
                || 0,
                |n| {
                    if *n >= max {
                        return None;
                    }
                    *n += 1;
                    Some(*n)
                },
            );
            let Some(n) = entered else {
                // Over conn + burst. Places taken by earlier rules are given back with the context.
                return Flow::Respond(self.rejection.response());
            };
            held(ctx).places.push(Place::Local(LocalPlace { store: store.clone(), hash }));
            delay += delay_of(n, conn, unit);
        }
        self.finish(ctx, delay)
    }

    async fn shared(&self, ctx: &mut RequestCtx, redis: &Arc<RedisStore>, ttl: u64) -> Flow<'static> {
        let unit = self.unit();
        let mut delay = 0.0;
        for (i, rule) in self.rules.iter().enumerate() {
            let (conn, max, rule_no) = match self.limits(ctx, i, rule) {
                Step::Go { conn, max, rule } => (conn, max, rule),
                Step::Skip => continue,
                Step::Fail(why) => return self.failed(&why),
            };
            let scope = if rule_no == 0 { self.scope.to_string() } else { format!("{}#{rule_no}", self.scope) };
            let key = if self.skip_unresolved {
                match rule.key.try_with(ctx, |k| shared::redis_key(&scope, k)) {
                    Some(k) => k,
                    None => continue,
                }
            } else {
                rule.key.with(ctx, |k| shared::redis_key(&scope, k))
            };
            match shared::enter(redis, key, max, ttl).await {
                Ok(Some((place, n))) => {
                    held(ctx).places.push(Place::Redis(place));
                    delay += delay_of(n, conn, unit);
                }
                Ok(None) => return Flow::Respond(self.rejection.response()),
                Err(_) if self.degrade => return Flow::Continue,
                Err(_) => return Flow::Respond(limit::store_unavailable("limit-conn")),
            }
        }
        match self.finish(ctx, delay) {
            Flow::Wait(f) => f.await,
            other => other,
        }
    }
}

impl PluginInstance for Instance {
    fn late(&self) -> Late {
        if self.adaptive {
            Late::LOG
        } else {
            Late::NONE
        }
    }

    fn access<'a>(&'a self, ctx: &'a mut RequestCtx) -> Flow<'a> {
        match &self.mode {
            Mode::Local(store) => self.local(ctx, store),
            Mode::Redis(redis, ttl) => Flow::wait(self.shared(ctx, redis, *ttl)),
        }
    }

    /// The delay unit moves halfway to this request's latency (upstream time when it was
    /// proxied, else its whole time less the delay it was given).
    fn log(&self, ctx: &RequestCtx) {
        if !self.adaptive {
            return;
        }
        let Some(h) = ctx.slot::<Held>() else { return };
        let Some(&(_, delay)) = h.delays.iter().find(|(id, _)| *id == self.id()) else { return };
        let latency = match ctx.upstream_time {
            Some(t) => t.as_secs_f64(),
            None => (ctx.started.elapsed().as_secs_f64() - delay).max(0.0),
        };
        let _ = self.unit.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
            Some(((f64::from_bits(bits) + latency) / 2.0).to_bits())
        });
    }
}

/// The HTTP plugin: the process-wide bounded store and the Redis targets in use.
pub struct LimitConnHttp {
    local: Arc<Store>,
    redis: Registry,
}

impl Default for LimitConnHttp {
    fn default() -> Self {
        LimitConnHttp { local: Store::new("limit-conn", DEFAULT_MAX_KEYS), redis: Registry::new("limit-conn") }
    }
}

#[cfg(test)]
impl LimitConnHttp {
    pub(crate) fn local_store(&self) -> Arc<Store> {
        self.local.clone()
    }
}

/// `routes/7`: the owner's name, the same on every instance.
fn scope_name(owner: &Owner<'_>) -> String {
    if owner.id.is_empty() {
        owner.label.to_owned()
    } else {
        format!("{}/{}", owner.kind, owner.id)
    }
}

fn rules_of(conf: &Conf) -> Result<(Vec<RuleSpec>, bool), String> {
    match (&conf.rules, &conf.conn, &conf.burst) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            Err("conn/burst and rules cannot be specified at the same time".into())
        }
        (Some(rules), None, None) => {
            if rules.is_empty() {
                return Err("rules: at least one rule".into());
            }
            let mut out = Vec::with_capacity(rules.len());
            for (i, r) in rules.iter().enumerate() {
                let at = |e: String| format!("rules[{i}].{e}");
                out.push(RuleSpec {
                    conn: Amount::compile(&r.conn, "conn", false).map_err(at)?,
                    burst: Amount::compile(&r.burst, "burst", true).map_err(at)?,
                    key: LimitKey::compile(KeyType::VarCombination, &r.key).map_err(at)?,
                });
            }
            Ok((out, true))
        }
        (None, Some(conn), Some(burst)) => {
            let key = LimitKey::compile(conf.key_type, conf.key.as_deref().unwrap_or("remote_addr"))?;
            let rule = RuleSpec {
                conn: Amount::compile(conn, "conn", false)?,
                burst: Amount::compile(burst, "burst", true)?,
                key,
            };
            Ok((vec![rule], false))
        }
        (None, _, _) => Err("conn and burst are required (or rules)".into()),
    }
}

impl Plugin for LimitConnHttp {
    type Conf = Conf;
    fn name(&self) -> &'static str {
        "limit-conn"
    }
    fn priority(&self) -> i32 {
        1003
    }
    fn attr_schema(&self) -> Option<Value> {
        Some(MaxKeys::schema())
    }
    fn init(&self, attr: Option<&Value>, env: &InitEnv) -> Result<(), String> {
        let max = MaxKeys::of(attr)?;
        if !env.check_only {
            self.local.set_max_keys(max);
        }
        Ok(())
    }
    fn build(&self, conf: Conf, ctx: &BuildContext<'_>) -> Result<Arc<dyn PluginInstance>, String> {
        let d = conf.default_conn_delay;
        if !(d.is_finite() && d > 0.0 && d <= 86_400.0) {
            return Err("default_conn_delay: must be greater than 0 (seconds, at most a day)".into());
        }
        let (rules, skip_unresolved) = rules_of(&conf)?;
        // A changed configuration starts its counts afresh (APISIX keys them by configuration
        // version); requests in progress give their places back to the old counts.
        let scope: Arc<str> =
            Arc::from(format!("{}:{:016x}", scope_name(&ctx.owner), limit::fnv1a64(ctx.raw.to_string().as_bytes())));
        let scope_id = limit::fnv1a64(scope.as_bytes());
        let shared = match conf.policy {
            Policy::Local => None,
            Policy::Redis => Some(Shared::Redis),
            Policy::RedisCluster => Some(Shared::Cluster),
        };
        let mode = match shared {
            None => Mode::Local(self.local.clone()),
            Some(p) => {
                let target = RedisTarget::from_conf(p, &conf.redis)?;
                if ctx.check_only {
                    Mode::Local(self.local.clone())
                } else {
                    Mode::Redis(self.redis.get(target), conf.key_ttl)
                }
            }
        };
        let msg = conf.rejected_msg.as_deref().unwrap_or("too many requests in progress");
        Ok(Arc::new(Instance {
            rules,
            skip_unresolved,
            unit: AtomicU64::new(d.to_bits()),
            adaptive: !conf.only_use_default_delay,
            degrade: conf.allow_degradation,
            scope,
            scope_id,
            mode,
            rejection: Rejection::new(conf.rejected_code, msg),
        }))
    }
}
