//! Resources (routes, services, upstreams, consumers, global rules, plugin metadata): their types,
//! validation into immutable snapshots, and the providers that feed snapshots.

pub mod checks;
pub mod cidr;
pub mod model;
pub mod snapshot;
pub mod yaml;

pub use snapshot::{KindSchemas, Snapshot};
