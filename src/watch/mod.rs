//! Keeping the gateway in step with its resource provider: the threads that watch
//! `conf/resources.yaml` or etcd and publish each valid change through `state::Gateway`.
//!
//! Layering: the providers' documents are read in `resources::{yaml, etcd}` (below `state`);
//! watching drives the gateway, so it sits above `state`, next to `run` which starts it.

pub mod etcd;
pub mod yaml;
