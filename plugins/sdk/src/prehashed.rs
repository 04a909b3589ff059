//! Maps keyed by a hash already computed and well mixed (a keyed SipHash of a credential, a
//! limiter key's hash): the map uses the key as it is instead of hashing it a second time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by a finished hash.
pub(crate) type PrehashedMap<V> = HashMap<u64, V, BuildHasherDefault<Passthrough>>;

/// The hasher of [`PrehashedMap`]: a `u64` key is its own hash.
#[derive(Default)]
pub(crate) struct Passthrough(u64);

impl Hasher for Passthrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used (the keys are `u64`); any other input still hashes.
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
