//! NVFP4: FP4 E2M1 elements in blocks of 16 consecutive elements along one axis, each block
//! with an FP8 E4M3 scale, and one f32 scale for the whole tensor (NVIDIA Blackwell's
//! two-level scaled FP4, as TransformerEngine and ModelOpt quantize to it).
//!
//! Spelling: `nvfp4` (blocks along the last axis) or `nvfp4<dim=d>` (negative dims count
//! from the end). Blocks are placed as MX blocks are ([`MxGrid`](super::mx::MxGrid)), with
//! 16 elements instead of 32; the tensor scale is shared by every block of the tensor.
//!
//! # The exact rules
//! With `amax_t` the tensor's largest finite magnitude and `amax_b` a block's largest
//! magnitude (NaN or Inf when the block holds one):
//!
//! 1. tensor scale `s_t = fl32(amax_t / (448 · 6))`: the exact quotient rounded once to f32
//!    (nearest-even), clamped to `[2^-149, f32::MAX]`; `s_t = 1` when `amax_t = 0` (no
//!    finite nonzero element). This is the stored per-tensor f32 decode scale.
//! 2. block scale `s_b = e4m3(amax_b / (6 · s_t))`: the exact quotient rounded once to E4M3,
//!    nearest-even, saturating at 448, subnormals kept (0 when the quotient is below 2^-10).
//!    A block holding NaN or ±Inf is NaN: all its elements become NaN.
//! 3. element `q = e2m1(x / (s_b · s_t))`: the exact quotient rounded with the rounding
//!    mode to E2M1, saturating at ±6; the value is `q · s_b · s_t`. A block whose scale is 0
//!    gives ±0 (the sign of `x`).
//!
//! The value `q · s_b · s_t` is exact in f64 (at most 31 significant bits) and rounded once
//! (nearest-even) to the tensor's dtype; in f32 that rounding can be inexact, so NVFP4
//! values stored as f32 need not round to themselves again.
//!
//! # Where sources differ, and the choices here
//! - Scales are decode scales divided into the data. TransformerEngine computes the
//!   encode scale `S_enc = 448 · 6 / amax_t` in f32, then `s_b = e4m3(amax_b / 6 · S_enc)`
//!   and multiplies elements by the f32 reciprocal `S_enc / s_b`; those f32 roundings can
//!   move a value across a rounding boundary. Here every step is one exact quotient rounded
//!   once, so results do not depend on the order of f32 operations.
//! - The block scale always rounds to nearest-even (the rounding mode applies to the
//!   elements only), as in TransformerEngine's `cvt.rn.satfinite.e4m3x2.f32`.
//! - Zero tensors: `s_t = 1` (TransformerEngine's choice for a zero amax); zero blocks get
//!   `s_b = 0` and zero elements.
//! - NaN and Inf: NaN blocks as in MX (TransformerEngine propagates NaN through its amax
//!   but leaves other elements of the block finite when the scale saturates).
//! - Stochastic rounding draws on the f64 quotient `fl64(x / (s_b · s_t))`: its relative
//!   error (2^-53) is far below the resolution of the 23-bit draw. Nearest and toward-zero
//!   results are those of the exact quotient: the code checks the rounding boundary with
//!   exact products ([`round_quotient`]).

use std::fmt;

use super::float::{Float, Overflow, Specials};
use super::grid::{parts, pow2};
use super::rounding::{NearestEven, RoundingRule, RuleKind, TowardZero};

/// Elements per NVFP4 block.
pub const NVFP4_BLOCK: usize = 16;

/// `448 · 6`: the largest E4M3 block scale times the largest E2M1 element.
pub const TENSOR_RANGE: f64 = 448.0 * 6.0;

/// E2M1 with subnormals, saturating (the NVFP4 element).
pub fn e2m1() -> Float {
    Float::with_options(2, 1, true, Overflow::Saturate, Specials::Finite).expect("e2m1 is valid")
}

/// E4M3 with subnormals, saturating at 448 (the NVFP4 block scale).
pub fn e4m3_saturating() -> Float {
    Float::with_options(4, 3, true, Overflow::Saturate, Specials::FiniteNan).expect("e4m3 is valid")
}

/// IEEE binary32 as a [`Float`], saturating at f32::MAX (the tensor scale).
fn binary32() -> Float {
    Float::with_options(8, 23, true, Overflow::Saturate, Specials::Ieee).expect("f32 is valid")
}

/// A validated NVFP4 format: the block axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Nvfp4 {
    dim: i64,
}

impl Nvfp4 {
    /// NVFP4 with blocks along `dim` (negative counts from the end).
    pub fn new(dim: i64) -> Self {
        Nvfp4 { dim }
    }

    /// The block axis as given (-1, the last, by default).
    pub fn dim(&self) -> i64 {
        self.dim
    }

    /// The tensor scale `s_t` (an f32 value) of a tensor whose largest finite magnitude is
    /// `amax` (rule 1 of the module docs).
    pub fn tensor_scale(amax: f64) -> f64 {
        if amax == 0.0 || !amax.is_finite() {
            return 1.0;
        }
        let s = round_quotient(amax, TENSOR_RANGE, &binary32(), NearestEven, 0);
        s.max(pow2(-149))
    }

    /// The block scale `s_b` (an E4M3 value) of a block whose largest magnitude is `amax`
    /// (NaN or Inf when the block holds one) under tensor scale `s_t`; NaN for a NaN block.
    pub fn block_scale(amax: f64, s_t: f64) -> f64 {
        if !amax.is_finite() {
            return f64::NAN;
        }
        round_quotient(amax, 6.0 * s_t, &e4m3_saturating(), NearestEven, 0)
    }

    /// Rounds `x` in a block of scale `s_b` under tensor scale `s_t` (rule 3).
    #[inline(always)]
    pub fn round<R: RoundingRule>(x: f64, s_b: f64, s_t: f64, rule: R, random: u32) -> f64 {
        if s_b.is_nan() {
            return f64::NAN;
        }
        if s_b == 0.0 {
            return if x.is_sign_negative() { -0.0 } else { 0.0 };
        }
        let d = s_b * s_t;
        round_quotient(x, d, &e2m1(), rule, random) * d
    }
}

impl fmt::Display for Nvfp4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvfp4")?;
        if self.dim != -1 {
            write!(f, "<dim={}>", self.dim)?;
        }
        Ok(())
    }
}

/// The next value of `f` above the nonnegative value `lo` of `f` (subnormals on).
fn successor(f: &Float, lo: f64) -> f64 {
    if lo == 0.0 {
        return f.min_positive();
    }
    let e = parts(lo).e.max(f.emin());
    lo + pow2(e - f.man() as i32)
}

/// The next value of `f` below the positive value `hi` of `f` (subnormals on).
fn predecessor(f: &Float, hi: f64) -> f64 {
    let e = parts(hi).e;
    let e = if e > f.emin() && hi == pow2(e) {
        e - 1
    } else {
        e.max(f.emin())
    };
    hi - pow2(e - f.man() as i32)
}

/// The exact quotient `a / d` (`d` positive and finite) rounded to the format `f`
/// (subnormals on, saturating) with `rule`.
///
/// The f64 quotient is correctly rounded, so it is never on the wrong side of a value of
/// `f` or of a midpoint between two (those are f64 values); it can only land on one when the
/// exact quotient is near it. The candidate is therefore checked with exact products
/// (`lo · d` and `mid · d` have at most 31 significant bits for the formats used here):
/// rounding then follows the exact quotient. Stochastic rules use the f64 quotient.
///
/// Where `v · d` is exact for every value `v` of `f` (the formats and scales of NVFP4), a
/// quotient below `v` stays below it in f64 too: `a <= v·d - u` with `u` the unit in the
/// last place below `v · d`, so `a / d` is at least `u / d` below `v`, more than half the
/// unit below `v`. The downward step after rounding toward zero then never fires; it guards
/// divisors of more bits.
pub fn round_quotient<R: RoundingRule>(a: f64, d: f64, f: &Float, rule: R, random: u32) -> f64 {
    if a.is_nan() || a == 0.0 {
        return a;
    }
    if R::KIND == RuleKind::Stochastic {
        return f.round(a / d, rule, random);
    }
    let abs = a.abs();
    let max = f.max_value();
    let q = abs / d;
    // The largest value of f at or below the exact quotient (or max).
    let mut lo = if q.is_infinite() {
        max
    } else {
        f.round(q, TowardZero, 0)
    };
    if lo > 0.0 && lo * d > abs {
        lo = predecessor(f, lo);
    }
    let v = if R::KIND == RuleKind::TowardZero {
        lo
    } else {
        let hi = successor(f, lo);
        if hi > max {
            lo
        } else {
            let mid = 0.5 * (lo + hi);
            match abs.partial_cmp(&(mid * d)) {
                Some(std::cmp::Ordering::Greater) => hi,
                Some(std::cmp::Ordering::Less) => lo,
                _ if R::KIND == RuleKind::NearestAway => hi,
                _ => f.round(mid, NearestEven, 0),
            }
        }
    };
    if a < 0.0 {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::rounding::NearestAway;

    #[test]
    fn neighbours_walk_the_e2m1_and_e4m3_grids() {
        let f = e2m1();
        let values = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for w in values.windows(2) {
            assert_eq!(successor(&f, w[0]), w[1]);
            assert_eq!(predecessor(&f, w[1]), w[0]);
        }
        let g = e4m3_saturating();
        assert_eq!(successor(&g, 0.0), pow2(-9));
        assert_eq!(predecessor(&g, pow2(-6)), 7.0 * pow2(-9));
        assert_eq!(successor(&g, 448.0), 480.0);
    }

    #[test]
    fn quotients_round_as_the_exact_value() {
        let f = e2m1();
        // 5 / 2 = 2.5: a tie between 2 and 3.
        assert_eq!(round_quotient(5.0, 2.0, &f, NearestEven, 0), 2.0);
        assert_eq!(round_quotient(5.0, 2.0, &f, NearestAway, 0), 3.0);
        assert_eq!(round_quotient(-5.0, 2.0, &f, NearestAway, 0), -3.0);
        // 1 / 3 is below the tie 0.25..0.5 midpoint? 0.333 > 0.25: rounds to 0.5.
        assert_eq!(round_quotient(1.0, 3.0, &f, NearestEven, 0), 0.5);
        // 2 / 3 toward zero: 0.5 (f64's 0.6666 is not on the grid, no correction needed).
        assert_eq!(round_quotient(2.0, 3.0, &f, TowardZero, 0), 0.5);
        assert_eq!(round_quotient(100.0, 3.0, &f, TowardZero, 0), 6.0);
    }

    /// Quotients just below and just above a grid value `v`: `a` is the f64 next to `v · d`
    /// (an exact product), so `a / d` is within about one unit of f64's last place of `v`.
    /// Each rounds as the exact quotient: toward zero to `v`'s predecessor from below and to
    /// `v` from above, to nearest to `v`. From below, f64's quotient never lands on `v`
    /// itself (see `round_quotient`'s docs), which the count checks.
    #[test]
    fn quotients_next_to_a_value_round_as_the_exact_quotient() {
        let (mut checked, mut landed_from_below) = (0, 0);
        for f in [e2m1(), e4m3_saturating()] {
            let mut grid = vec![f.min_positive()];
            while let Some(&last) = grid.last() {
                let next = successor(&f, last);
                if next > f.max_value() {
                    break;
                }
                grid.push(next);
            }
            let mut seed = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..2000 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                // A positive f32 divisor with a random 24-bit significand and exponent.
                let bits = (seed >> 41) as u32 | (((seed >> 20) as u32 % 40 + 107) << 23);
                let d = f64::from(f32::from_bits(bits));
                for (i, &v) in grid.iter().enumerate().skip(1) {
                    let (below, above) = ((v * d).next_down(), (v * d).next_up());
                    landed_from_below += usize::from(below / d == v);
                    let pred = grid[i - 1];
                    assert_eq!(
                        round_quotient(below, d, &f, TowardZero, 0),
                        pred,
                        "{below:e}/{d:e}"
                    );
                    assert_eq!(round_quotient(-below, d, &f, TowardZero, 0), -pred);
                    assert_eq!(
                        round_quotient(below, d, &f, NearestEven, 0),
                        v,
                        "{below:e}/{d:e}"
                    );
                    assert_eq!(
                        round_quotient(above, d, &f, TowardZero, 0),
                        v,
                        "{above:e}/{d:e}"
                    );
                    assert_eq!(
                        round_quotient(above, d, &f, NearestEven, 0),
                        v,
                        "{above:e}/{d:e}"
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 10_000);
        assert_eq!(
            landed_from_below, 0,
            "f64 quotients landed on a value from below"
        );
    }
}
