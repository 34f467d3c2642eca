//! The unit tests' deterministic generator (xorshift64): a failing random
//! case replays from its seed. One for every test in the crate; the
//! integration tests in `tests/` and the binary's own modules (`fleet/`)
//! cannot reach it (`cfg(test)` in the library).

/// xorshift64 (13, 7, 17) from a non-zero seed.
pub(crate) struct Rng(pub u64);

impl Rng {
    /// The next word.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next word modulo `n` (0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// The next word's pick from `of` (not empty).
    pub fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}
