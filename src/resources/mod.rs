//! Resources (routes, services, upstreams, consumers, global rules, plugin metadata): their types
//! and checks, and the providers' raw documents (the YAML file, etcd's values). The bottom layer:
//! compiling them into tables is `crate::tables`, following a provider is `crate::watch`.

pub mod checks;
pub mod etcd;
/// IP addresses and CIDR blocks (shared with plugins through the SDK).
pub use weir_plugin::cidr;
pub mod model;
pub mod secrets;
pub mod yaml;
