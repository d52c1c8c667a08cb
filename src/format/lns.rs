//! The logarithmic number system lns<w,f>: a value is zero or `±2^(k / 2^f)`, where `k` is a
//! (w-1)-bit two's complement integer read as a fixed-point base-2 logarithm with `f`
//! fraction bits (`B = 2^(2^-f)` is the base and `k` the exponent: the value is `±B^k`).
//!
//! # Encoding
//!
//! A `w`-bit pattern holds the sign in bit `w-1` (1 is negative) and `k` in the low `w-1`
//! bits as two's complement. The most negative `k`, `-2^(w-2)`, is reserved: with sign 0 it
//! is zero, with sign 1 it is NaN. Every other pattern is a finite nonzero value, so the
//! magnitudes are `2^(k/2^f)` for `k` in `[k_min, k_max] = [-2^(w-2) + 1, 2^(w-2) - 1]`,
//! symmetric about 1. There is no infinity.
//!
//! # Rounding
//!
//! A finite nonzero `x` has the exact logarithm `t = log2|x| * 2^f`, and `k` is `t` rounded
//! to an integer, in the log domain:
//!
//! | mode | `k` |
//! |---|---|
//! | nearest-even, nearest-away | `round(t)` |
//! | toward-zero | `floor(t)`: the magnitude never grows |
//! | stochastic, `b` bits | `floor(t) + 1` when `r < floor(frac(t) * 2^b)`, `r` the top `b` bits of `random` |
//!
//! Ties cannot happen: `t` is rational only when `|x|` is a power of two (`log2` of any other
//! rational is irrational), and then `t` is an integer, so `t` is never `k + 1/2` and both
//! nearest modes give the same `k`. Likewise `x` equals a value `2^(k/2^f)` of the format only
//! when that value is a power of two (`k` a multiple of `2^f`); toward-zero keeps those.
//!
//! Kept values: the stored value of a code (an f64, or the f32 of that f64 in an f32 tensor)
//! can lie a fraction of an ulp below `2^(k/2^f)`, where `floor(t)` is `k - 1`. Toward-zero
//! and stochastic rounding keep such an input at `k` (an input equal to the stored value of
//! `floor(t) + 1` keeps that code), so rounding a rounded tensor again changes nothing in
//! the nearest and toward-zero modes. A stored value that lies above `2^(k/2^f)` has
//! `floor(t) = k` and a tiny fraction, so stochastic rounding moves it up with that (tiny)
//! probability, as it would any other input there.
//!
//! Every decision is exact. `t >= j / 2^h` (the boundary of floor, nearest with `h = 1`, or
//! the stochastic threshold with `h = b`) is decided by a fast `log2` estimate with a proven
//! error bound (`lns_approx.rs`) when the estimate is farther than the
//! bound from the boundary, and otherwise by comparing `m^(2^(f+h))` with a power of two
//! exactly (`lns_exact.rs`), `m` the 53-bit significand of `x`.
//!
//! # Range
//!
//! - zero and -0 give zero (the lns zero is unsigned, so -0 gives +0); NaN gives NaN;
//! - ±Inf and magnitudes whose `k` exceeds `k_max` saturate to ±max in every mode;
//! - below the smallest magnitude `min = 2^(k_min/2^f)` (`k` below `k_min`), the log domain
//!   has no lower neighbour (zero is at `-∞`), so underflow is decided in the linear domain:
//!   nearest modes give ±min when `|x| > min / 2` and zero when `|x| < min / 2` (the tie,
//!   possible only for `f = 0`, goes to zero for nearest-even, whose pattern is even, and to
//!   min for nearest-away); toward-zero gives zero; stochastic gives ±min with probability
//!   `|x| / min64` (truncated to `b` bits, `min64` the f64 value of `min`) and zero
//!   otherwise, so it is unbiased in value there.
//!
//! # Values
//!
//! The value of `k` is the f64 nearest to `2^(k/2^f)` ([`Lns::value`]): correctly rounded,
//! including where it is an f64 subnormal; values beyond f64's range give ±Inf and those
//! below half its smallest subnormal give zero, as an IEEE conversion would. A 128-bit lower
//! bound of `2^(r/2^f)` with a proven error (read from two tables of the format's `f`,
//! `lns_approx::exp2_fraction_tabled`) decides all but the
//! inputs within about `2^-117` of a rounding midpoint, which the exact comparison decides.
//!
//! An f32 tensor holds the f32 of that f64, a second rounding: it is the f32 nearest to
//! `2^(k/2^f)` except when the f64 falls exactly halfway between two f32s, where ties to
//! even may pick the farther one. Neighbouring values are a factor `2^(2^-f)` apart, a
//! relative gap of about `ln 2 * 2^-f`: up to `f = 22` that exceeds f32's relative spacing
//! (at most `2^-23`), so distinct codes give distinct f32s; from `f = 23` on, neighbours
//! near the bottom of a binade share an f32 (tested both ways).

use std::cmp::Ordering;

use super::grid::{parts, pow2};
use super::lns_approx::{exp2_fraction_tabled, log2_significand, EXP2_TABLED_ERROR, LOG2_ERROR};
use super::lns_exact::pow_cmp;
use super::lns_small_f;
use super::rounding::{RoundingRule, RuleKind};
use crate::error::FormatError;

/// A rounded value as a code: zero, NaN, or a sign and an exponent `k` in `[k_min, k_max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LnsCode {
    /// The (unsigned) zero.
    Zero,
    /// Not a number.
    Nan,
    /// `±2^(k/2^f)`.
    Value {
        /// Whether the value is negative.
        negative: bool,
        /// The exponent.
        k: i64,
    },
}

/// A validated lns<w,f> format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lns {
    w: u32,
    f: u32,
}

impl Lns {
    /// lns<w,f> with `3 <= w <= 32` bits and `0 <= f <= w - 2` fraction bits of the
    /// logarithm.
    pub fn new(w: u32, f: u32) -> Result<Self, FormatError> {
        if !(3..=32).contains(&w) {
            return Err(FormatError::OutOfRange {
                format: "lns",
                param: "w",
                value: w as i64,
                valid: "3..=32",
            });
        }
        if f > w - 2 {
            return Err(FormatError::Inconsistent {
                format: "lns",
                reason: format!(
                    "f = {f} fraction bits do not fit the {} bits of the logarithm beside its sign and integer part (f <= w - 2 = {})",
                    w - 1,
                    w - 2
                ),
            });
        }
        Ok(Lns { w, f })
    }

    /// Bits per value.
    pub fn w(&self) -> u32 {
        self.w
    }

    /// Fraction bits of the logarithm.
    pub fn f(&self) -> u32 {
        self.f
    }

    /// The smallest exponent of a nonzero value, `-2^(w-2) + 1`.
    pub fn k_min(&self) -> i64 {
        -(1i64 << (self.w - 2)) + 1
    }

    /// The largest exponent, `2^(w-2) - 1`.
    pub fn k_max(&self) -> i64 {
        (1i64 << (self.w - 2)) - 1
    }

    /// The reserved exponent field, `-2^(w-2)`: zero with sign 0, NaN with sign 1.
    pub fn k_reserved(&self) -> i64 {
        -(1i64 << (self.w - 2))
    }

    /// The mask of the `w` pattern bits.
    pub fn mask(&self) -> u32 {
        u32::MAX >> (32 - self.w)
    }

    /// The NaN pattern: sign 1 and the reserved exponent field.
    pub fn nan_pattern(&self) -> u32 {
        (1 << (self.w - 1)) | (1 << (self.w - 2))
    }

    /// The largest magnitude `2^(k_max/2^f)`, as the f64 nearest to it.
    pub fn max_value(&self) -> f64 {
        self.value(self.k_max())
    }

    /// The smallest magnitude `2^(k_min/2^f)`, as the f64 nearest to it (zero when it is
    /// below half f64's smallest subnormal).
    pub fn min_positive(&self) -> f64 {
        self.value(self.k_min())
    }

    /// The gap between 1 and the next larger value, `2^(2^-f) - 1` (as f64s).
    pub fn epsilon(&self) -> f64 {
        self.value(1) - 1.0
    }

    /// The f64 nearest to `2^(k/2^f)` (see the module docs: correctly rounded, ±Inf above
    /// f64's range, subnormal or zero below it).
    pub fn value(&self, k: i64) -> f64 {
        lns_small_f::value(k, self.f, value_of).unwrap_or_else(|| value_of(k, self.f))
    }

    /// [`Lns::value`] by the exact path alone (the tables of small `f` are built from it).
    #[cfg(test)]
    pub(crate) fn value_exact(&self, k: i64) -> f64 {
        value_of(k, self.f)
    }

    /// The code of `x` rounded with `rule` (see the module docs for the policy), for an f64
    /// result.
    #[inline]
    pub fn round_code<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> LnsCode {
        self.round_code_stored(x, rule, random, |v| v)
    }

    /// [`Lns::round_code`] for a result stored through `stored` (f64 to the storage type
    /// and back: `|v| v as f32 as f64` for f32 tensors): toward-zero and stochastic rounding
    /// keep an input equal to the stored value of the code above `floor(t)`.
    #[inline]
    pub fn round_code_stored<R: RoundingRule>(
        &self,
        x: f64,
        rule: R,
        random: u32,
        stored: impl Fn(f64) -> f64,
    ) -> LnsCode {
        if x.is_nan() {
            return LnsCode::Nan;
        }
        if x == 0.0 {
            return LnsCode::Zero;
        }
        let negative = x < 0.0;
        if x.is_infinite() {
            return LnsCode::Value {
                negative,
                k: self.k_max(),
            };
        }
        let p = parts(x);
        let f = self.f;
        let (j, phi) = floor_log(p.m, f);
        // floor(t) = e 2^f + j; `phi` estimates frac(t) within LOG2_ERROR 2^f.
        let floor_t = ((p.e as i64) << f) + j as i64;
        let eta = LOG2_ERROR * pow2(f as i32);
        let exact_integer = p.m == 1 << 52;
        if floor_t > self.k_max() {
            return LnsCode::Value {
                negative,
                k: self.k_max(),
            };
        }
        // Kept values: the stored value of floor(t) + 1 can lie a fraction of an ulp below
        // 2^((floor t + 1)/2^f); an input equal to it keeps that code (so rounding twice
        // changes nothing). Nearest modes keep it anyway. Only codes of the format are
        // kept: below k_min the input is not a value of it (the f32 of a smaller power).
        if matches!(R::KIND, RuleKind::TowardZero | RuleKind::Stochastic)
            && phi > 0.5
            && floor_t < self.k_max()
            && floor_t >= self.k_min() - 1
            && stored(self.value(floor_t + 1)) == x.abs()
        {
            return LnsCode::Value {
                negative,
                k: floor_t + 1,
            };
        }
        let k = match R::KIND {
            RuleKind::TowardZero => floor_t,
            RuleKind::NearestEven | RuleKind::NearestAway => {
                let up = !exact_integer && above_threshold(p.m, f, j, 1, 1, phi, 0.5, eta);
                floor_t + up as i64
            }
            RuleKind::Stochastic => {
                if floor_t < self.k_min() {
                    return self.stochastic_underflow(x, rule, random);
                }
                let bits = rule.random_bits();
                let r = (random >> (32 - bits)) as u64;
                let c = (r + 1) as f64 * pow2(-(bits as i32));
                let up = !exact_integer && above_threshold(p.m, f, j, bits, r + 1, phi, c, eta);
                floor_t + up as i64
            }
        };
        if k > self.k_max() {
            return LnsCode::Value {
                negative,
                k: self.k_max(),
            };
        }
        if k >= self.k_min() {
            return LnsCode::Value { negative, k };
        }
        // Underflow of a deterministic rule.
        let half_min = self.k_min() - (1i64 << f);
        let to_min = match R::KIND {
            RuleKind::TowardZero => false,
            _ if floor_t > half_min => true,
            _ if floor_t < half_min => false,
            // floor(t) is the boundary itself: a tie when t is an integer.
            RuleKind::NearestAway => true,
            _ => !exact_integer,
        };
        if to_min {
            LnsCode::Value {
                negative,
                k: self.k_min(),
            }
        } else {
            LnsCode::Zero
        }
    }

    /// Stochastic rounding below min: ±min with probability `|x| / min64`, else zero.
    #[cold]
    fn stochastic_underflow<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> LnsCode {
        let min = self.min_positive();
        let (a, b) = (parts(x), parts(min));
        // |x| / min = a.m / b.m * 2^(a.e - b.e), with a.e - b.e <= 1.
        let shift = a.e - b.e;
        let up = if shift >= 0 {
            rule.up_ratio((a.m as u128) << shift, b.m as u128, random)
        } else if shift > -70 {
            rule.up_ratio(a.m as u128, (b.m as u128) << -shift, random)
        } else {
            false
        };
        if up {
            LnsCode::Value {
                negative: x < 0.0,
                k: self.k_min(),
            }
        } else {
            LnsCode::Zero
        }
    }

    /// The value of a code.
    pub fn code_value(&self, code: LnsCode) -> f64 {
        match code {
            LnsCode::Zero => 0.0,
            LnsCode::Nan => f64::NAN,
            LnsCode::Value { negative, k } => {
                let v = self.value(k);
                if negative {
                    -v
                } else {
                    v
                }
            }
        }
    }

    /// The pattern of a code.
    pub fn code_pattern(&self, code: LnsCode) -> u32 {
        let sign = 1u32 << (self.w - 1);
        match code {
            LnsCode::Zero => (self.k_reserved() as u32) & (sign - 1),
            LnsCode::Nan => self.nan_pattern(),
            LnsCode::Value { negative, k } => {
                (if negative { sign } else { 0 }) | (k as u32 & (sign - 1))
            }
        }
    }

    /// The code of a pattern (bits above `w` ignored).
    pub fn pattern_code(&self, pattern: u32) -> LnsCode {
        let p = pattern & self.mask();
        let negative = p >> (self.w - 1) == 1;
        // Sign-extend the (w-1)-bit field.
        let shift = 33 - self.w;
        let k = (((p << shift) as i32) >> shift) as i64;
        match (k == self.k_reserved(), negative) {
            (true, false) => LnsCode::Zero,
            (true, true) => LnsCode::Nan,
            (false, _) => LnsCode::Value { negative, k },
        }
    }

    /// Rounds `x` to this format with `rule` (see the module docs for the policy).
    #[inline]
    pub fn round<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        self.code_value(self.round_code(x, rule, random))
    }

    /// [`Lns::round`] for a result stored through `stored` (see [`Lns::round_code_stored`]).
    #[inline]
    pub fn round_stored<R: RoundingRule>(
        &self,
        x: f64,
        rule: R,
        random: u32,
        stored: impl Fn(f64) -> f64,
    ) -> f64 {
        self.code_value(self.round_code_stored(x, rule, random, stored))
    }

    /// Bit pattern of `x` rounded to nearest.
    pub fn encode(&self, x: f64) -> u32 {
        self.code_pattern(self.round_code(x, super::rounding::NearestEven, 0))
    }

    /// Value of a `w`-bit pattern (upper bits ignored).
    pub fn decode(&self, pattern: u32) -> f64 {
        self.code_value(self.pattern_code(pattern))
    }
}

/// `floor(log2(m / 2^52) * 2^f)` for `2^52 <= m < 2^53`, exact, and an estimate of the
/// fraction (within `LOG2_ERROR * 2^f` of the true one).
#[inline(always)]
fn floor_log(m: u64, f: u32) -> (u64, f64) {
    let scale = pow2(f as i32);
    let t = log2_significand(m) * scale;
    let mut j = t.floor();
    let mut phi = t - j;
    let eta = LOG2_ERROR * scale;
    if phi < eta && !log_at_least(m, f, j as i64) {
        j -= 1.0;
        phi += 1.0;
    } else if phi > 1.0 - eta && log_at_least(m, f, j as i64 + 1) {
        j += 1.0;
        phi -= 1.0;
    }
    (j as u64, phi)
}

/// Whether `log2(m / 2^52) >= b / 2^g`, exactly.
#[inline]
fn log_at_least(m: u64, g: u32, b: i64) -> bool {
    pow_cmp(m, g, (52i64 << g) + b) != Ordering::Less
}

/// Whether `frac(t) >= c = num / 2^h` for the exact fraction (`j` the exact floor of
/// `log2(m/2^52) 2^f`, `phi` its estimated fraction within `eta`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn above_threshold(m: u64, f: u32, j: u64, h: u32, num: u64, phi: f64, c: f64, eta: f64) -> bool {
    if (phi - c).abs() > eta {
        phi > c
    } else {
        log_at_least(m, f + h, ((j << h) + num) as i64)
    }
}

/// The f64 nearest to `2^(k/2^f)`.
fn value_of(k: i64, f: u32) -> f64 {
    let q = k >> f;
    let r = (k & ((1i64 << f) - 1)) as u64;
    if r == 0 {
        return pow2(q.clamp(-2000, 2000) as i32);
    }
    if q >= 1024 {
        return f64::INFINITY;
    }
    // Significant bits available: 53, fewer for subnormals.
    let p = if q >= -1022 { 53 } else { q + 1075 };
    if p <= 0 {
        // 2^q * 2^(r/2^f) lies in (2^q, 2^(q+1)): above half the smallest subnormal only
        // when q = -1075.
        return if p == 0 { pow2(-1074) } else { 0.0 };
    }
    let p = p as u32;
    let y = exp2_fraction_tabled(r, f);
    let s = 128 - p;
    let kept = (y >> s) as u64;
    let rem = y & ((1u128 << s) - 1);
    let half = 1u128 << (s - 1);
    let up = if rem >= half {
        true
    } else if rem + EXP2_TABLED_ERROR < half {
        false
    } else {
        // Above the midpoint (2 kept + 1) / 2^p exactly when (2 kept + 1)^(2^f) < 2^(r + p 2^f).
        pow_cmp(2 * kept + 1, f, r as i64 + ((p as i64) << f)) == Ordering::Less
    };
    let m = kept + up as u64;
    let lsb = if q >= -1022 { q as i32 - 52 } else { -1074 };
    m as f64 * pow2(lsb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked_and_the_exponent_range_is_symmetric() {
        assert!(Lns::new(2, 0).is_err());
        assert!(Lns::new(33, 4).is_err());
        assert!(Lns::new(8, 7).is_err());
        let l = Lns::new(8, 3).unwrap();
        assert_eq!((l.k_min(), l.k_max(), l.k_reserved()), (-63, 63, -64));
        let l = Lns::new(32, 30).unwrap();
        assert_eq!((l.k_min(), l.k_max()), (-(1 << 30) + 1, (1 << 30) - 1));
    }
}
