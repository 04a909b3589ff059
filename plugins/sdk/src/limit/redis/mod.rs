//! Limiters' counters in Redis (the client needs feature `limit-redis`): the configuration fields every limiter
//! shares ([`conf`]), and the client that runs their scripts with a breaker ([`client`]).
//! limit-count, limit-req and limit-conn keep their own scripts; the connections, timeouts,
//! outage handling and TLS are here, once.

#[cfg(feature = "limit-redis")]
pub mod client;
pub mod conf;
#[cfg(feature = "limit-redis")]
mod lean;
#[cfg(feature = "limit-redis")]
pub mod resp;

#[cfg(feature = "limit-redis")]
pub use client::{RedisStore, Registry, Unavailable, DOWN_FOR};
pub use conf::{Policy, RedisConf, RedisTarget, SentinelConf, SentinelNode, SentinelRole, Shared, Tls};
#[cfg(feature = "limit-redis")]
pub use redis::{Cmd, FromRedisValue};
#[cfg(feature = "limit-redis")]
pub use resp::{Script, ScriptCall};
