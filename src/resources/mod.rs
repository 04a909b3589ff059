//! Resources (routes, services, upstreams, consumers, global rules, plugin metadata): their types,
//! validation into immutable snapshots, and the providers that feed snapshots.

pub mod checks;
pub mod etcd;
/// IP addresses and CIDR blocks (shared with plugins through the SDK).
pub use weir_plugin::cidr;
pub mod model;
pub mod snapshot;
pub mod yaml;

pub use snapshot::{KindSchemas, Snapshot};
