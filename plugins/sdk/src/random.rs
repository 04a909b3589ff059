//! Random bytes for identifiers (request ids, short codes): from the thread's CSPRNG (rand's
//! `ThreadRng`: ChaCha, seeded and periodically reseeded from the OS). Seeding a generator per
//! identifier, as `nanoid`'s default source does, costs a `getrandom` system call and a ChaCha
//! setup each time (about 14,000 instructions a request in request-id, 4.6% of short-url's
//! creation).

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) {
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), buf);
}

/// `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    fill(&mut b);
    b
}
