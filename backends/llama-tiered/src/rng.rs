//! A seeded pseudo-random generator for benchmark data (the hardware probe) and synthetic
//! weights (`hypura-synth`): the same seed gives the same values everywhere.

/// SplitMix64: tiny, fast, and the same on every platform and version.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-1, 1).
    pub fn signed_unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in [0, n), n > 0.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Normal values (Box-Muller).
    pub fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
            let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let r = (-2.0 * u1.ln()).sqrt();
            let t = std::f64::consts::TAU * u2;
            pair[0] = mean + std * (r * t.cos()) as f32;
            if let Some(second) = pair.get_mut(1) {
                *second = mean + std * (r * t.sin()) as f32;
            }
        }
    }
}
