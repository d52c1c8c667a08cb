//! Shared by the test files: a mismatch collector that counts every failure, keeps the
//! first few descriptions, and merges across parallel workers; the one seeded generator
//! ([`SplitMix`]), so every run sees the same inputs and failures reproduce; a format's
//! finite values ([`finite_values`]); and the reference decoders of [`reference`].

pub mod reference;

/// Counts mismatches and keeps the first [`Mismatches::KEEP`] descriptions.
#[derive(Default)]
pub struct Mismatches {
    /// Number of mismatches recorded.
    pub count: u64,
    /// Descriptions of the first ones.
    pub first: Vec<String>,
}

#[allow(dead_code)] // each test file uses part of it
impl Mismatches {
    /// Descriptions kept.
    pub const KEEP: usize = 12;

    /// Records a mismatch; `what` is evaluated only while descriptions are kept.
    pub fn record(&mut self, what: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.len() < Self::KEEP {
            self.first.push(what());
        }
    }

    /// Records a mismatch unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.record(what);
        }
    }

    /// Both collectors' mismatches.
    pub fn merge(mut self, other: Mismatches) -> Mismatches {
        self.count += other.count;
        self.first.extend(other.first);
        self.first.truncate(Self::KEEP);
        self
    }

    /// Fails the test if anything was recorded.
    pub fn assert_none(&self, what: &str) {
        assert!(
            self.count == 0,
            "{what}: {} mismatches; first ones:\n  {}",
            self.count,
            self.first.join("\n  ")
        );
    }

    /// Prints the tally of `checked` checks and fails the test if anything was recorded.
    pub fn assert_none_of(&self, what: &str, checked: u64) {
        println!("{what}: {checked} checks, {} mismatches", self.count);
        self.assert_none(what);
    }
}

/// SplitMix64: a tiny deterministic generator, so failures reproduce.
pub struct SplitMix(pub u64);

#[allow(dead_code)] // each test file uses part of it
impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// The top 32 bits of the next word.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// A fair coin.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
    /// A float with a random sign, a log-uniform magnitude over 2^lo..2^hi and random bits.
    pub fn float_between(&mut self, lo: i32, hi: i32) -> f64 {
        let e = lo + self.below((hi - lo) as u64) as i32;
        let m = 1.0 + (self.next_u64() >> 12) as f64 / (1u64 << 52) as f64;
        let s = if self.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        s * m * 2f64.powi(e)
    }
}

/// The finite values of `format` from every bit pattern, ascending, each once (`-0` and `+0`
/// are one).
#[allow(dead_code)] // each test file uses part of it
pub fn finite_values(format: &qcandle::Format) -> Vec<f64> {
    let mut values: Vec<f64> = (0..1u32 << format.bits())
        .map(|p| format.decode(p).expect("a pattern"))
        .filter(|v| v.is_finite())
        .collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    values
}
