//! Random numbers for what needs to differ, not to be secret: lease tokens, clock epochs,
//! worker ids and jitter. A room of its own, below the clock and the ids that use it.

use std::sync::atomic::{AtomicU64, Ordering};

/// A random number from the standard library's hash keys (seeded from the operating system
/// per thread, and moved on at each use) and a count of calls in this process, so that two
/// calls never hash the same input; enough for tokens, epochs, worker ids and jitter, none
/// of which need cryptographic quality.
pub(crate) fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// Two of [`random_u64`].
pub(crate) fn random_u128() -> u128 {
    (u128::from(random_u64()) << 64) | u128::from(random_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_in_a_row_and_on_other_threads_differ() {
        let here: Vec<u64> = (0..64).map(|_| random_u64()).collect();
        let there = std::thread::spawn(|| (0..64).map(|_| random_u64()).collect::<Vec<_>>())
            .join()
            .unwrap_or_default();
        let mut all: Vec<u64> = here.into_iter().chain(there).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 128, "a random number repeated");
    }
}
