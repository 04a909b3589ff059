//! The hash map for keys the operator chooses (resource ids, route paths): foldhash, seeded per
//! process, instead of SipHash, whose cost showed in every route lookup and was a fifth of
//! rebuilding 10,000 routes. Clients can look keys up but never add them, so the flooding that
//! SipHash defends against needs write access to the configuration.

use std::collections::HashMap;

/// A `HashMap` with foldhash.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
