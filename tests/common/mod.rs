//! Shared by the oracle test files: a mismatch collector that counts every failure, keeps
//! the first few descriptions, and merges across parallel workers.

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
