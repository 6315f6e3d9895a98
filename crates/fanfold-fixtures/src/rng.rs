//! A tiny seeded PRNG.
//!
//! Fixtures are committed to the repository and compared byte for byte, so
//! their randomness must never change underneath us. Owning the generator
//! (xoshiro256** seeded through SplitMix64, both public-domain reference
//! algorithms) means no dependency upgrade can silently reshuffle them.

/// One SplitMix64 step. Used for seeding and for deriving sub-streams, because
/// its output function is a bijection that spreads nearby inputs far apart.
pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256**: fast, small, and good enough statistically for test data.
#[derive(Clone, Debug)]
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Self { s }
    }

    /// A generator that depends only on `(seed, stream, index)`. Giving every
    /// issue its own stream keeps one issue's text from shifting the
    /// randomness of all later issues when a template is edited.
    pub(crate) fn derived(seed: u64, stream: u64, index: u64) -> Self {
        let mut sm = seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let a = splitmix64(&mut sm);
        let mut sm2 = a ^ index.wrapping_mul(0xA24B_AED4_963E_E407);
        Self::new(splitmix64(&mut sm2))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` (Lemire's multiply-and-reject, so no modulo bias).
    /// Returns 0 for `n == 0` so callers never divide by zero.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        let mut low = m as u64;
        if low < n {
            let threshold = n.wrapping_neg() % n;
            while low < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
                low = m as u64;
            }
        }
        (m >> 64) as u64
    }

    /// Uniform in `lo..=hi`; an inverted range collapses to `lo`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    pub(crate) fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A uniformly chosen item of `items`. Only ever called on non-empty
    /// lists; an empty one gives `T::default()`, as `below(0)` gives 0.
    pub(crate) fn pick<T: Clone + Default>(&mut self, items: &[T]) -> T {
        let i = self.index(items.len());
        items.get(i).cloned().unwrap_or_default()
    }

    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }

    /// `k` distinct elements, in random order.
    pub(crate) fn sample<T: Clone>(&mut self, items: &[T], k: usize) -> Vec<T> {
        let mut v = items.to_vec();
        self.shuffle(&mut v);
        v.truncate(k);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_vector() {
        // First outputs of the reference implementation for seed 1234567.
        let mut s = 1_234_567u64;
        assert_eq!(splitmix64(&mut s), 6_457_827_717_110_365_317);
        assert_eq!(splitmix64(&mut s), 3_203_168_211_198_807_973);
    }

    #[test]
    fn below_stays_in_range() {
        let mut r = Rng::new(3);
        for n in 1..200u64 {
            for _ in 0..50 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
        assert_eq!(r.range(5, 5), 5);
        assert_eq!(r.range(9, 2), 9);
    }
}
