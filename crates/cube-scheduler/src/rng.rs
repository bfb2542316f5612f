//! A small seeded pseudo-random generator, so that a scheduler that samples nodes still decides
//! the same way for the same snapshot and the same state. Not for anything secret.

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
/// OOPSLA 2014): a 64-bit counter passed through a mixing function. Tiny state, a full period of
/// 2^64, and good enough statistics for spreading samples over nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64 {
    /// The counter; every draw adds the golden-ratio increment to it.
    state: u64,
}

impl SplitMix64 {
    /// A generator that will always draw the same sequence for the same `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// A number in `0..bound`, or 0 when `bound` is 0. One draw, scaled by multiplication
    /// (Lemire's method without the rejection step): the bias is at most `bound / 2^64`,
    /// nothing next to the scheduler's other approximations.
    pub fn below(&mut self, bound: usize) -> usize {
        let scaled = (u128::from(self.next_u64()) * bound as u128) >> 64;
        // `scaled < bound`, so it fits in a usize.
        scaled as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_sequence() {
        let mut first = SplitMix64::new(42);
        let mut second = SplitMix64::new(42);
        let drawn: Vec<u64> = (0..5).map(|_| first.next_u64()).collect();
        assert_eq!(drawn, (0..5).map(|_| second.next_u64()).collect::<Vec<_>>());
        assert_ne!(drawn[0], SplitMix64::new(43).next_u64());
    }

    #[test]
    fn the_first_draw_of_seed_zero_is_the_reference_value() {
        // The first output of SplitMix64 seeded with 0, as published with the algorithm.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn draws_below_a_bound_stay_below_it_and_cover_it() {
        let mut rng = SplitMix64::new(7);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            let drawn = rng.below(10);
            assert!(drawn < 10);
            seen[drawn] = true;
        }
        assert!(seen.iter().all(|&hit| hit));
        assert_eq!(rng.below(0), 0);
        assert_eq!(rng.below(1), 0);
    }
}
