//! An LNS value as a sign and an exponent (or zero, or NaN), its bit pattern, its exact f64
//! value and the nearest value to an f64.
//!
//! The pattern layout is the one of [`Lns`]: sign in bit `w-1`, the exponent `k` in the low
//! `w-1` bits as two's complement, the exponent `-2^(w-2)` reserved for zero (sign 0) and NaN
//! (sign 1).

use crate::format::grid::{parts, pow2};
use crate::format::lns::{Lns, LnsCode};
use crate::format::lns_approx::{log2_significand, LOG2_ERROR};
use crate::format::lns_small_f;
use crate::format::rounding::NearestEven;

use super::error::LnsError;

/// One value of an lns<w,f> format: `±B^k` with `B = 2^(2^-f)`, zero, or NaN.
///
/// The value does not carry its format: the same `k` means a different number in another
/// `f`. The arithmetic ([`LnsArith`](super::LnsArith)) reads `Finite { k, .. }` as the exact
/// number `±B^k` whether or not `k` is inside the format's range, and always returns values
/// inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LnsValue {
    /// Zero (the format has one zero, without a sign).
    Zero,
    /// Not a number: an invalid operation's result (`x / 0`, any operation on NaN).
    NaN,
    /// `±B^k`.
    Finite {
        /// True for a negative value.
        negative: bool,
        /// The exponent: the value's magnitude is `2^(k / 2^f)`.
        k: i32,
    },
}

impl LnsValue {
    /// `±B^k`, refused when `k` is outside `[k_min, k_max]` of `lns`.
    pub fn finite(lns: Lns, negative: bool, k: i64) -> Result<Self, LnsError> {
        if !(lns.k_min()..=lns.k_max()).contains(&k) {
            return Err(LnsError::Exponent {
                w: lns.w(),
                f: lns.f(),
                k,
                k_min: lns.k_min(),
                k_max: lns.k_max(),
            });
        }
        Ok(LnsValue::Finite {
            negative,
            k: k as i32,
        })
    }

    /// `1 = B^0`.
    pub const ONE: LnsValue = LnsValue::Finite {
        negative: false,
        k: 0,
    };

    /// The value of a `w`-bit pattern; refused when bits above bit `w-1` are set.
    pub fn from_bits(lns: Lns, bits: u32) -> Result<Self, LnsError> {
        let w = lns.w();
        if w < 32 && bits >> w != 0 {
            return Err(LnsError::Pattern {
                w,
                f: lns.f(),
                bits,
            });
        }
        Ok(lns.pattern_code(bits).into())
    }

    /// The `w`-bit pattern; refused for a finite value whose `k` is outside the format's range.
    pub fn to_bits(self, lns: Lns) -> Result<u32, LnsError> {
        if let LnsValue::Finite { negative, k } = self {
            LnsValue::finite(lns, negative, k as i64)?;
        }
        Ok(lns.code_pattern(self.into()))
    }

    /// The value in f64: [`Lns::code_value`], correctly rounded (`±inf` beyond the largest
    /// f64, `±0` below half the smallest subnormal).
    pub fn to_f64(self, lns: Lns) -> f64 {
        lns.code_value(self.into())
    }

    /// The value of `lns` nearest to `x`, exactly as the format rounds
    /// ([`Lns::round_code`] with nearest-even): `k` is the integer nearest to `2^f log2|x|`
    /// (never a tie for an f64), above `k_max` (and `±inf`) it saturates to `k_max`, and below
    /// the smallest magnitude `min` the choice between `±min` and zero is made in the value
    /// (`|x| > min / 2` gives `±min`). `±0` is zero and NaN is NaN.
    ///
    /// For `f <= 10`, a normal `x` whose code lies in the range is read from a table of the
    /// rounding boundaries (`format::lns_small_f`). Most other inputs take a shortcut: `t` estimated within `2^(f-44)` units (the format's
    /// `log2` estimate), and when that estimate is farther than twice its bound from
    /// a half-integer and its rounding lies inside `[k_min, k_max]`, `k` is that rounding
    /// (nearest rounding needs no exact floor, unlike the format's general path, which
    /// decides `floor(t)` exactly and so works hard on inputs near a code's own value). The
    /// others go to [`Lns::round_code`].
    #[inline]
    pub fn nearest(lns: Lns, x: f64) -> Self {
        if let Some((negative, k)) = lns_small_f::nearest(lns, x) {
            // k lies in the range, within i32.
            return LnsValue::Finite {
                negative,
                k: k as i32,
            };
        }
        Self::nearest_estimated(lns, x)
    }

    /// [`LnsValue::nearest`] without the tables of small `f`.
    #[inline(never)]
    fn nearest_estimated(lns: Lns, x: f64) -> Self {
        if x.is_finite() && x != 0.0 {
            let p = parts(x);
            let f = lns.f();
            let scale = pow2(f as i32);
            let t = log2_significand(p.m) * scale;
            // t >= 0: truncation is the floor.
            let j = t as i64;
            let frac = t - j as f64;
            if (frac - 0.5).abs() > 2.0 * LOG2_ERROR * scale {
                let k = ((p.e as i64) << f) + j + i64::from(frac > 0.5);
                if (lns.k_min()..=lns.k_max()).contains(&k) {
                    return LnsValue::Finite {
                        negative: x < 0.0,
                        k: k as i32,
                    };
                }
            }
        }
        lns.round_code(x, NearestEven, 0).into()
    }

    /// `±B^k` brought into the format: `k > k_max` saturates to `k_max`, `k < k_min` flushes
    /// to zero.
    pub fn saturate(lns: Lns, negative: bool, k: i64) -> Self {
        if k < lns.k_min() {
            LnsValue::Zero
        } else {
            LnsValue::Finite {
                negative,
                k: k.min(lns.k_max()) as i32,
            }
        }
    }

    /// True for NaN.
    pub fn is_nan(self) -> bool {
        self == LnsValue::NaN
    }

    /// True for zero.
    pub fn is_zero(self) -> bool {
        self == LnsValue::Zero
    }
}

impl From<LnsCode> for LnsValue {
    /// The same value; the format's codes always have `k` inside `i32`.
    fn from(code: LnsCode) -> Self {
        match code {
            LnsCode::Zero => LnsValue::Zero,
            LnsCode::Nan => LnsValue::NaN,
            LnsCode::Value { negative, k } => LnsValue::Finite {
                negative,
                k: k as i32,
            },
        }
    }
}

impl From<LnsValue> for LnsCode {
    /// The same value.
    fn from(v: LnsValue) -> Self {
        match v {
            LnsValue::Zero => LnsCode::Zero,
            LnsValue::NaN => LnsCode::Nan,
            LnsValue::Finite { negative, k } => LnsCode::Value {
                negative,
                k: k as i64,
            },
        }
    }
}

impl std::ops::Neg for LnsValue {
    type Output = LnsValue;

    /// The value with the opposite sign (zero and NaN are their own negation).
    fn neg(self) -> Self {
        match self {
            LnsValue::Finite { negative, k } => LnsValue::Finite {
                negative: !negative,
                k,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lns_5_2_pattern_round_trips() {
        let lns = Lns::new(5, 2).unwrap();
        for bits in 0..32u32 {
            let v = LnsValue::from_bits(lns, bits).unwrap();
            assert_eq!(v.to_bits(lns).unwrap(), bits, "pattern {bits:#x}");
        }
        assert_eq!(LnsValue::from_bits(lns, 0b01000).unwrap(), LnsValue::Zero);
        assert_eq!(LnsValue::from_bits(lns, 0b11000).unwrap(), LnsValue::NaN);
        assert!(LnsValue::from_bits(lns, 32).is_err());
    }
}
