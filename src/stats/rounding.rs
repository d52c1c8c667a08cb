//! What one rounding did to a tensor: sums and counts gathered in one pass over the values
//! before (`x`) and after (`q`) rounding, and the figures derived from them.
//!
//! Over the `n` pairs where both `x` and `q` are finite, with `e = q - x` computed in f64:
//!
//! - relative error (2-norm) `‖e‖₂ / ‖x‖₂ = sqrt(Σe² / Σx²)`;
//! - SQNR in dB `10 log10(Σx² / Σe²)` (the signal-to-quantization-noise ratio; +∞ when
//!   nothing changed, so `SQNR = -20 log10(relative error)`);
//! - mean signed error (bias) `Σe / n`, and relative bias `Σe / Σ|x|`.
//!
//! Counts, over the elements whose `x` is finite and nonzero (a zero rounds to zero in every
//! format; [`RoundingStats::fraction`] divides by their number, which is also the
//! histogram's total): `flushed` (`q = 0`), `at_max` (`|q|` is the format's largest finite
//! magnitude: saturation, or an input already there), `at_min` (`|q|` is its smallest
//! positive magnitude, where a posit puts every nonzero value below it), `became_nonfinite`
//! (`q` is NaN or ±Inf: overflow), and `exact` (`q = x`). Zeros are counted apart
//! (`zero_inputs`). The largest and smallest magnitudes are compared in the tensor's dtype;
//! formats whose range depends on the data (block floating point, MX, NVFP4) count neither.
//! Inputs that are already NaN/±Inf are counted apart (`nonfinite_inputs`) and left out of
//! everything else.
//!
//! The histogram is of `log2|x|` of the finite nonzero inputs ([`Log2Histogram`]).
//!
//! Sums are f64 and therefore depend on the order they are added in: [`RoundingStats::record`]
//! adds in element order, and [`super::Collector`] merges parts in a canonical order, so the
//! same tensors give the same bits.

use crate::backend::cpu::Element;
use crate::format::Format;

use super::histogram::Log2Histogram;

/// The largest and smallest positive magnitudes of a format in a tensor's dtype, as f64
/// (`None` where they depend on the data).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The largest finite magnitude.
    pub max: Option<f64>,
    /// The smallest positive magnitude.
    pub min: Option<f64>,
}

impl Limits {
    /// The limits of `format` as stored in element type `T`.
    pub fn of<T: Element>(format: &Format) -> Self {
        let stored = |v: Option<f64>| v.map(|v| T::from_f64(v).to_f64());
        Limits {
            max: stored(format.max_finite()),
            min: stored(format.min_positive()),
        }
    }
}

/// Pairs per block of the f32 pass (positions within a block fit a `u16`).
const F32_BLOCK: usize = 2048;

/// Sums and counts of one or more roundings (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoundingStats {
    /// Elements seen.
    pub count: u64,
    /// Elements whose input was NaN or ±Inf (left out of everything else).
    pub nonfinite_inputs: u64,
    /// Elements whose input was zero.
    pub zero_inputs: u64,
    /// Nonzero inputs left unchanged (`q = x`).
    pub exact: u64,
    /// Nonzero inputs rounded to zero.
    pub flushed: u64,
    /// Results of the largest finite magnitude.
    pub at_max: u64,
    /// Results of the smallest positive magnitude.
    pub at_min: u64,
    /// Finite inputs rounded to NaN or ±Inf.
    pub became_nonfinite: u64,
    /// Σx² over the pairs where `x` and `q` are finite.
    pub sum_x2: f64,
    /// Σ(q - x)² over those pairs.
    pub sum_e2: f64,
    /// Σ(q - x) over those pairs.
    pub sum_e: f64,
    /// Σ|x| over those pairs.
    pub sum_abs_x: f64,
    /// log2|x| of the finite nonzero inputs.
    pub histogram: Log2Histogram,
}

impl RoundingStats {
    /// Statistics of rounding `x` to `q` (element by element, equal lengths) in a format with
    /// `limits`.
    pub fn of<T: Element>(x: &[T], q: &[T], limits: Limits) -> Self {
        let mut s = RoundingStats::default();
        s.record(x, q, limits);
        s
    }

    /// Adds the pairs `(x[i], q[i])`, in order (elements past the shorter slice are
    /// ignored).
    pub fn record<T: Element>(&mut self, x: &[T], q: &[T], limits: Limits) {
        if let (Some(x), Some(q)) = (T::as_f32s(x), T::as_f32s(q)) {
            return self.record_f32(x, q, limits);
        }
        let mut acc = Sums::from(&*self);
        for (&x, &q) in x.iter().zip(q) {
            self.add_pair(&mut acc, x.to_f64(), q.to_f64(), limits);
        }
        acc.store(self);
    }

    /// [`RoundingStats::record`] of f32 values, in blocks of [`F32_BLOCK`] pairs: a first pass
    /// counts the zeros rounded to zero and lists the other pairs' positions without a branch
    /// on the data; a second pass takes those in order, normal inputs with a finite result
    /// (the common case) inline, the binade counted by the f32 exponent byte, every other
    /// pair through the general path. The same operations in the same order as the general
    /// path, so the same bits: a zero rounded to zero adds `+0` (or, to `Σ(q - x)`, `±0`) to
    /// each sum there, which changes no sum (a sum is never `-0`: it starts at `+0`, and under
    /// round-to-nearest only `-0 + -0` gives `-0`).
    ///
    /// Speed: ReLU outputs and their errors are about half zeros in no pattern, so a branch on
    /// zero is mispredicted about every other element, and the four sums are chains of
    /// dependent additions that zeros need not wait for. The general path (a call, which
    /// clobbers every vector register) runs outside the inner loop, which ends at each of its
    /// pairs, so the four sums stay in registers.
    fn record_f32(&mut self, x: &[f32], q: &[f32], limits: Limits) {
        let max = limits.max.map_or(f32::NAN, |m| m as f32);
        let min = limits.min.map_or(f32::NAN, |m| m as f32);
        let n = x.len().min(q.len());
        let mut acc = Sums::from(&*self);
        // Normal inputs per exponent byte (1 to 254: binade e - 127).
        let mut by_exponent = [0u64; 256];
        let (mut zeros, mut exact, mut flushed, mut at_max, mut at_min) = (0u64, 0, 0, 0, 0);
        let mut live = [0u16; F32_BLOCK];
        for (xb, qb) in x[..n].chunks(F32_BLOCK).zip(q[..n].chunks(F32_BLOCK)) {
            let mut k = 0;
            for (j, (&xv, &qv)) in xb.iter().zip(qb).enumerate() {
                // Written always, kept (k advanced) unless a zero was rounded to zero.
                live[k] = j as u16;
                k += usize::from(!((xv.to_bits() << 1 == 0) & (qv == 0.0)));
            }
            zeros += (xb.len() - k) as u64;
            let live = &live[..k];
            let mut t = 0;
            while t < k {
                let mut sums = [acc.x2, acc.e2, acc.e, acc.abs_x];
                while t < k {
                    let j = usize::from(live[t]);
                    let (xv, qv) = (xb[j], qb[j]);
                    let e = (xv.to_bits() >> 23) & 0xff;
                    if e == 0 || e == 0xff || !qv.is_finite() {
                        break;
                    }
                    by_exponent[e as usize] += 1;
                    exact += u64::from(xv == qv);
                    flushed += u64::from(qv == 0.0);
                    let a = qv.abs();
                    at_max += u64::from(a == max);
                    at_min += u64::from(a == min);
                    let (xd, qd) = (f64::from(xv), f64::from(qv));
                    let err = qd - xd;
                    sums[0] += xd * xd;
                    sums[1] += err * err;
                    sums[2] += err;
                    sums[3] += xd.abs();
                    t += 1;
                }
                [acc.x2, acc.e2, acc.e, acc.abs_x] = sums;
                if t < k {
                    // Subnormal or non-finite input, or non-finite result: the general path.
                    let j = usize::from(live[t]);
                    self.add_pair(&mut acc, f64::from(xb[j]), f64::from(qb[j]), limits);
                    t += 1;
                }
            }
        }
        self.count += zeros;
        self.zero_inputs += zeros;
        for (e, &c) in by_exponent.iter().enumerate().take(255).skip(1) {
            if c > 0 {
                self.count += c;
                self.histogram.add_to_bin(e as i32 - 127, c);
            }
        }
        self.exact += exact;
        self.flushed += flushed;
        self.at_max += at_max;
        self.at_min += at_min;
        acc.store(self);
    }

    /// One pair through the general path (the sums in `acc`).
    #[inline(always)]
    fn add_pair(&mut self, acc: &mut Sums, x: f64, q: f64, limits: Limits) {
        self.count += 1;
        if !x.is_finite() {
            self.nonfinite_inputs += 1;
            return;
        }
        if x == 0.0 {
            self.zero_inputs += 1;
        } else {
            self.histogram.add(x);
            self.exact += u64::from(x == q);
            self.flushed += u64::from(q == 0.0);
        }
        if !q.is_finite() {
            self.became_nonfinite += 1;
            return;
        }
        let a = q.abs();
        self.at_max += u64::from(Some(a) == limits.max);
        self.at_min += u64::from(Some(a) == limits.min);
        acc.add(x, q);
    }

    /// Adds `other`'s sums and counts to these (sums in this order: `self` then `other`).
    pub fn merge(&mut self, other: &RoundingStats) {
        self.count += other.count;
        self.nonfinite_inputs += other.nonfinite_inputs;
        self.zero_inputs += other.zero_inputs;
        self.exact += other.exact;
        self.flushed += other.flushed;
        self.at_max += other.at_max;
        self.at_min += other.at_min;
        self.became_nonfinite += other.became_nonfinite;
        self.sum_x2 += other.sum_x2;
        self.sum_e2 += other.sum_e2;
        self.sum_e += other.sum_e;
        self.sum_abs_x += other.sum_abs_x;
        self.histogram.merge(&other.histogram);
    }

    /// Elements whose input was finite.
    pub fn finite_inputs(&self) -> u64 {
        self.count - self.nonfinite_inputs
    }

    /// Pairs in the error sums (input and result finite).
    pub fn finite_pairs(&self) -> u64 {
        self.finite_inputs() - self.became_nonfinite
    }

    /// `sqrt(Σe² / Σx²)`; `None` when `Σx² = 0` (no nonzero finite input).
    pub fn relative_error(&self) -> Option<f64> {
        (self.sum_x2 > 0.0).then(|| (self.sum_e2 / self.sum_x2).sqrt())
    }

    /// `10 log10(Σx² / Σe²)` in dB: +∞ when no value changed; `None` when `Σx² = 0`.
    pub fn sqnr_db(&self) -> Option<f64> {
        (self.sum_x2 > 0.0).then(|| 10.0 * (self.sum_x2 / self.sum_e2).log10())
    }

    /// The mean signed error `Σe / n`; `None` without finite pairs.
    pub fn mean_error(&self) -> Option<f64> {
        let n = self.finite_pairs();
        (n > 0).then(|| self.sum_e / n as f64)
    }

    /// The relative bias `Σe / Σ|x|`; `None` when `Σ|x| = 0`.
    pub fn relative_bias(&self) -> Option<f64> {
        (self.sum_abs_x > 0.0).then(|| self.sum_e / self.sum_abs_x)
    }

    /// Finite nonzero inputs: the denominator of [`RoundingStats::fraction`].
    pub fn nonzero_inputs(&self) -> u64 {
        self.finite_inputs() - self.zero_inputs
    }

    /// `count / nonzero_inputs` (0 without nonzero finite inputs).
    pub fn fraction(&self, count: u64) -> f64 {
        match self.nonzero_inputs() {
            0 => 0.0,
            n => count as f64 / n as f64,
        }
    }

    /// A total order on the sums and counts, so parts merged in this order give the same
    /// bits whatever order they were recorded in (equal keys mean equal parts).
    pub(crate) fn canonical_key(&self) -> [u64; 12] {
        [
            self.count,
            self.nonfinite_inputs,
            self.zero_inputs,
            self.exact,
            self.flushed,
            self.at_max,
            self.at_min,
            self.became_nonfinite,
            self.sum_x2.to_bits(),
            self.sum_e2.to_bits(),
            self.sum_e.to_bits(),
            self.sum_abs_x.to_bits(),
        ]
    }
}

/// The four running sums of [`RoundingStats`], kept in registers during a pass.
struct Sums {
    x2: f64,
    e2: f64,
    e: f64,
    abs_x: f64,
}

impl Sums {
    fn from(s: &RoundingStats) -> Self {
        Sums {
            x2: s.sum_x2,
            e2: s.sum_e2,
            e: s.sum_e,
            abs_x: s.sum_abs_x,
        }
    }

    /// Adds a pair of finite values: `x²`, `(q - x)²`, `q - x`, `|x|`.
    #[inline(always)]
    fn add(&mut self, x: f64, q: f64) {
        let e = q - x;
        self.x2 += x * x;
        self.e2 += e * e;
        self.e += e;
        self.abs_x += x.abs();
    }

    fn store(self, s: &mut RoundingStats) {
        (s.sum_x2, s.sum_e2, s.sum_e, s.sum_abs_x) = (self.x2, self.e2, self.e, self.abs_x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posit8() -> Format {
        "posit<8,0>".parse().unwrap()
    }

    #[test]
    fn a_known_tensor_gives_the_hand_computed_statistics() {
        // posit<8,0>: 0.1 -> 0.09375, -1.7 -> -1.6875, 2.6 -> 2.625, 300 -> 64 (maxpos),
        // 1e-9 -> 2^-6 (minpos), 0 -> 0, NaN -> NaN (left out).
        let x: [f32; 7] = [0.1, -1.7, 2.6, 300.0, 1e-9, 0.0, f32::NAN];
        let q: [f32; 7] = [0.09375, -1.6875, 2.625, 64.0, 0.015625, 0.0, f32::NAN];
        let s = RoundingStats::of(&x, &q, Limits::of::<f32>(&posit8()));
        assert_eq!(
            (s.count, s.nonfinite_inputs, s.zero_inputs, s.exact),
            (7, 1, 1, 0)
        );
        assert_eq!(
            (s.flushed, s.at_max, s.at_min, s.became_nonfinite),
            (0, 1, 1, 0)
        );
        let xs: Vec<f64> = x[..6].iter().map(|&v| f64::from(v)).collect();
        let es: Vec<f64> = x[..6]
            .iter()
            .zip(&q)
            .map(|(&a, &b)| f64::from(b) - f64::from(a))
            .collect();
        // By hand: the errors are -0.00625, 0.0125, 0.025, -236, 2^-6 - 1e-9 and 0 (to f32
        // input precision, checked exactly below from the f32 inputs).
        assert!((es[3] + 236.0).abs() == 0.0);
        assert!((es[1] - 0.0125).abs() < 1e-7);
        let sum_x2: f64 = xs.iter().map(|v| v * v).sum();
        let sum_e2: f64 = es.iter().map(|e| e * e).sum();
        let sum_e: f64 = es.iter().sum();
        assert_eq!(s.sum_x2, sum_x2);
        assert_eq!(s.sum_e2, sum_e2);
        assert_eq!(s.sum_e, sum_e);
        assert_eq!(s.sum_abs_x, xs.iter().map(|v| v.abs()).sum::<f64>());
        // 90000 + 2.89 + 6.76 + 0.01 (+1e-18): the relative error is dominated by 300 -> 64.
        let rel = (sum_e2 / sum_x2).sqrt();
        assert_eq!(s.relative_error(), Some(rel));
        assert!((rel - 236.0 / 90009.66f64.sqrt()).abs() < 1e-6, "{rel}");
        assert!((s.sqnr_db().unwrap() - (-20.0 * rel.log10())).abs() < 1e-9);
        // Σe² = 236² + 0.00625² + 0.0125² + 0.025² + (2^-6)² = 55696.001064...
        let by_hand = 10.0 * (90_009.66f64 / 55_696.001_064).log10();
        assert!((s.sqnr_db().unwrap() - by_hand).abs() < 1e-6, "{by_hand}");
        assert!((by_hand - 2.0847).abs() < 1e-4);
        assert_eq!(s.mean_error(), Some(sum_e / 6.0));
        assert_eq!(s.fraction(s.at_max), 1.0 / 5.0);
        assert_eq!(s.nonzero_inputs(), s.histogram.total());
        // log2|x|: 0.1 in [2^-4, 2^-3), 1.7 in [1, 2), 2.6 in [2, 4), 300 in [256, 512),
        // 1e-9 in [2^-30, 2^-29).
        assert_eq!(
            s.histogram.bins(),
            vec![(-30, 1), (-4, 1), (0, 1), (1, 1), (8, 1)]
        );
    }

    #[test]
    fn flushes_overflows_and_unchanged_tensors_are_counted() {
        let e4m3: Format = "e5m2".parse().unwrap();
        let x = [1e-9f32, 1e6, 1.0, -3.0];
        let q = [0.0f32, f32::INFINITY, 1.0, -3.0];
        let s = RoundingStats::of(&x, &q, Limits::of::<f32>(&e4m3));
        assert_eq!(
            (s.flushed, s.became_nonfinite, s.exact, s.at_max),
            (1, 1, 2, 0)
        );
        assert_eq!(s.finite_pairs(), 3);
        let same = RoundingStats::of(&x[2..], &q[2..], Limits::of::<f32>(&e4m3));
        assert_eq!(same.sqnr_db(), Some(f64::INFINITY));
        assert_eq!(same.relative_error(), Some(0.0));
        let empty = RoundingStats::of::<f32>(&[0.0], &[0.0], Limits::of::<f32>(&e4m3));
        assert_eq!((empty.sqnr_db(), empty.relative_bias()), (None, None));
    }

    #[test]
    fn the_f32_pass_gives_the_bits_of_the_general_pass() {
        let format: Format = "e4m3".parse().unwrap();
        let mut x: Vec<f32> = (0..5000)
            .map(|i| ((i as f32) * 0.618).sin() * 2f32.powi(i % 40 - 20))
            .collect();
        x.extend([
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::from_bits(3),
            1e30,
            -1e-40,
        ]);
        let q: Vec<f32> = x
            .iter()
            .map(|&v| format.round(f64::from(v), crate::Rounding::NearestEven, 0) as f32)
            .collect();
        let fast = RoundingStats::of(&x, &q, Limits::of::<f32>(&format));
        let (x64, q64): (Vec<f64>, Vec<f64>) = x
            .iter()
            .zip(&q)
            .map(|(&a, &b)| (f64::from(a), f64::from(b)))
            .unzip();
        let mut general = RoundingStats::of(&x64, &q64, Limits::of::<f32>(&format));
        assert_eq!(fast.canonical_key(), general.canonical_key());
        assert_eq!(fast.histogram, general.histogram);
        assert!(fast.became_nonfinite > 0 && fast.flushed > 0 && fast.at_max > 0);
        general.count += 1;
        assert_ne!(fast, general);
    }

    #[test]
    fn the_f32_pass_gives_the_bits_of_the_general_pass_with_special_pairs_anywhere() {
        // ReLU-like data: about half zeros in no pattern (both signs, rounded to either
        // signed zero), and every kind of pair the f32 pass hands to the general path
        // scattered among them, in slices long enough for many runs between them.
        let format: Format = "posit<8,0>".parse().unwrap();
        let specials = [
            (f32::from_bits(5), 0.0),
            (0.0, 1.0),
            (f32::NAN, f32::NAN),
            (3.0, f32::INFINITY),
            (f32::NEG_INFINITY, -64.0),
            (-1e-39, -0.015625),
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut x, mut q) = (Vec::new(), Vec::new());
        for _ in 0..20_000 {
            let r = next();
            let (xv, qv) = match r % 16 {
                0..=6 => {
                    let xv = if r & 16 == 0 { 0.0 } else { -0.0 };
                    (xv, if r & 32 == 0 { 0.0 } else { -0.0 })
                }
                7 => specials[(r >> 8) as usize % specials.len()],
                _ => {
                    let xv = ((r >> 20) as f32 / 1e12 - 0.5) * 2f32.powi((r % 30) as i32 - 15);
                    let qv = format.round(f64::from(xv), crate::Rounding::NearestEven, 0);
                    (xv, qv as f32)
                }
            };
            x.push(xv);
            q.push(qv);
        }
        let limits = Limits::of::<f32>(&format);
        let (x64, q64): (Vec<f64>, Vec<f64>) = x
            .iter()
            .zip(&q)
            .map(|(&a, &b)| (f64::from(a), f64::from(b)))
            .unzip();
        for len in [0, 1, 7, 333, 20_000] {
            let fast = RoundingStats::of(&x[..len], &q[..len], limits);
            let general = RoundingStats::of(&x64[..len], &q64[..len], limits);
            assert_eq!(fast.canonical_key(), general.canonical_key(), "{len}");
            assert_eq!(fast.histogram, general.histogram, "{len}");
        }
        let whole = RoundingStats::of(&x, &q, limits);
        assert!(whole.zero_inputs > 8_000 && whole.nonfinite_inputs > 0);
        assert!(whole.became_nonfinite > 0 && whole.flushed > 0 && whole.at_max > 0);
        // Recorded onto earlier sums, as a collector's parts are not: the same bits too.
        let mut fast = RoundingStats::of(&x[..500], &q[..500], limits);
        fast.record(&x[500..], &q[500..], limits);
        let mut general = RoundingStats::of(&x64[..500], &q64[..500], limits);
        general.record(&x64[500..], &q64[500..], limits);
        assert_eq!(fast.canonical_key(), general.canonical_key());
    }

    #[test]
    fn merging_parts_equals_recording_the_whole_in_counts() {
        let x: Vec<f32> = (0..100).map(|i| (i as f32 - 50.0) * 0.37).collect();
        let q: Vec<f32> = x.iter().map(|v| v.round()).collect();
        let limits = Limits::of::<f32>(&posit8());
        let whole = RoundingStats::of(&x, &q, limits);
        let mut parts = RoundingStats::of(&x[..40], &q[..40], limits);
        parts.merge(&RoundingStats::of(&x[40..], &q[40..], limits));
        assert_eq!(parts.histogram, whole.histogram);
        assert_eq!(parts.canonical_key()[..8], whole.canonical_key()[..8]);
        assert!((parts.sum_e2 - whole.sum_e2).abs() <= 1e-12 * whole.sum_e2);
    }
}
