//! Histogram of log2|x| by binade: bin `k` counts the values with `2^k <= |x| < 2^(k+1)`.
//!
//! The bin of a finite nonzero `x` is `floor(log2|x|)`, read exactly from the bits of `x` as an
//! f64 (the unbiased exponent of a normal f64; for an f64 subnormal `m · 2^-1074`,
//! `-1074 + floor(log2 m)`), never from a floating-point logarithm, so powers of two fall in
//! the bin they open and every count is exact. Zeros and NaN/±Inf have no bin.
//!
//! Every finite nonzero f32 lies in a bin of [`DENSE_MIN`]..=[`DENSE_MAX`], which are held in
//! an array; the rarer bins of wider inputs (f64 tensors) in a map.

use std::collections::BTreeMap;

/// The lowest bin held in the dense array: the binade of the smallest f32 subnormal, 2^-149.
pub const DENSE_MIN: i32 = -149;
/// The highest bin held in the dense array: the binade of f32's largest finite value.
pub const DENSE_MAX: i32 = 127;

const DENSE_LEN: usize = (DENSE_MAX - DENSE_MIN + 1) as usize;

/// `floor(log2|x|)` of a finite nonzero `x`, exactly; `None` for zero, NaN and ±Inf.
///
/// ```
/// use qcandle::stats::binade;
/// assert_eq!(binade(1.0), Some(0));
/// assert_eq!(binade(-0.75), Some(-1));
/// assert_eq!(binade(f64::from_bits(1)), Some(-1074)); // the smallest subnormal, 2^-1074
/// assert_eq!(binade(0.0), None);
/// ```
#[inline(always)]
pub fn binade(x: f64) -> Option<i32> {
    let bits = x.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as i32;
    let mantissa = bits & ((1u64 << 52) - 1);
    match exponent {
        0x7ff => None,
        0 if mantissa == 0 => None,
        0 => Some(-1074 + 63 - mantissa.leading_zeros() as i32),
        e => Some(e - 1023),
    }
}

/// Counts of values per binade (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log2Histogram {
    dense: Box<[u64; DENSE_LEN]>,
    wide: BTreeMap<i32, u64>,
}

impl Default for Log2Histogram {
    fn default() -> Self {
        Log2Histogram {
            dense: Box::new([0; DENSE_LEN]),
            wide: BTreeMap::new(),
        }
    }
}

impl Log2Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `count` values to bin `k`.
    #[inline(always)]
    pub fn add_to_bin(&mut self, k: i32, count: u64) {
        match usize::try_from(k - DENSE_MIN) {
            Ok(i) if i < DENSE_LEN => self.dense[i] += count,
            _ => *self.wide.entry(k).or_insert(0) += count,
        }
    }

    /// Adds `x` to its bin; zeros and NaN/±Inf are not counted. Returns whether it was.
    #[inline(always)]
    pub fn add(&mut self, x: f64) -> bool {
        match binade(x) {
            Some(k) => {
                self.add_to_bin(k, 1);
                true
            }
            None => false,
        }
    }

    /// The count of bin `k`.
    pub fn count(&self, k: i32) -> u64 {
        match usize::try_from(k - DENSE_MIN) {
            Ok(i) if i < DENSE_LEN => self.dense[i],
            _ => self.wide.get(&k).copied().unwrap_or(0),
        }
    }

    /// The nonempty bins `(k, count)`, in increasing `k`.
    pub fn bins(&self) -> Vec<(i32, u64)> {
        let below = self.wide.range(..DENSE_MIN).map(|(&k, &c)| (k, c));
        let dense = self
            .dense
            .iter()
            .enumerate()
            .map(|(i, &c)| (DENSE_MIN + i as i32, c));
        let above = self.wide.range(DENSE_MAX + 1..).map(|(&k, &c)| (k, c));
        below
            .chain(dense)
            .chain(above)
            .filter(|p| p.1 > 0)
            .collect()
    }

    /// The number of values counted.
    pub fn total(&self) -> u64 {
        self.dense.iter().sum::<u64>() + self.wide.values().sum::<u64>()
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Log2Histogram) {
        for (a, b) in self.dense.iter_mut().zip(other.dense.iter()) {
            *a += b;
        }
        for (&k, &c) in &other.wide {
            *self.wide.entry(k).or_insert(0) += c;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_of_two_open_their_bin_and_the_value_below_closes_the_previous_one() {
        for k in -1074..=1023 {
            let p = crate::format::grid::pow2(k);
            assert_eq!(binade(p), Some(k), "2^{k}");
            assert_eq!(binade(-p), Some(k), "-2^{k}");
            if k > -1074 {
                let below = f64::from_bits(p.to_bits() - 1);
                assert_eq!(binade(below), Some(k - 1), "just below 2^{k}");
            }
        }
        assert_eq!(binade(f64::MAX), Some(1023));
        assert_eq!(binade(f64::NAN), None);
        assert_eq!(binade(f64::NEG_INFINITY), None);
        assert_eq!(binade(-0.0), None);
    }

    #[test]
    fn every_f32_binade_lies_in_the_dense_range() {
        let smallest = f32::from_bits(1);
        assert_eq!(binade(f64::from(smallest)), Some(DENSE_MIN));
        assert_eq!(binade(f64::from(f32::MAX)), Some(DENSE_MAX));
    }

    #[test]
    fn counts_edges_and_merges_are_exact() {
        let mut h = Log2Histogram::new();
        let values = [
            1.0,
            1.999,
            2.0,
            0.5,
            -0.5,
            0.0,
            f64::NAN,
            3.0,
            1e-300,
            1e300,
        ];
        let counted: usize = values.iter().filter(|&&x| h.add(x)).count();
        assert_eq!(counted, 8);
        assert_eq!(h.bins(), vec![(-997, 1), (-1, 2), (0, 2), (1, 2), (996, 1)]);
        assert_eq!(h.total(), 8);
        let mut m = h.clone();
        m.merge(&h);
        assert_eq!(m.count(-1), 4);
        assert_eq!(m.count(996), 2);
        assert_eq!(m.count(5), 0);
        assert_eq!(m.total(), 16);
    }
}
