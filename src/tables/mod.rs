//! The compiled tables of one resource snapshot: what the request and connection paths read.
//!
//! A snapshot is built here from a raw resource document (`snapshot`: schemas, references,
//! plugin instances) and holds the tables compiled for the data plane: routes (`router`),
//! upstreams with their balancers (`upstream`), listener certificates (`certs`) and stream
//! routes (`stream_router`).
//!
//! Layering: this module reads the model (`resources`), the plugins and `health` (an upstream's
//! checker); the request path (`dataplane`, `stream`) and `state` read it. Nothing here names the
//! request path or the gateway's state.

pub mod certs;
pub mod router;
pub mod services;
pub mod shards;
pub mod snapshot;
pub mod stream_router;
pub mod upstream;

pub use snapshot::{KindSchemas, Snapshot};
