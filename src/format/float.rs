//! Float(exp, man): IEEE-754-style binary floats with any exponent/mantissa split.
//!
//! Value of a normal pattern: `(-1)^s 2^(E - bias) (1 + M / 2^man)` with
//! `bias = 2^(exp-1) - 1`; subnormals (E = 0) are `2^(1 - bias) M / 2^man`. Options:
//!
//! - **subnormals** (default on). Off, the representable set is `{0} ∪ normals`, so values
//!   below the smallest normal `2^emin` round to 0 or `2^emin` (the midpoint `2^(emin-1)` ties
//!   to 0, the even neighbour); this is the set a flush-to-zero unit can produce.
//! - **specials**: [`Specials::Ieee`] reserves the all-ones exponent for ±Inf and NaN;
//!   [`Specials::FiniteNan`] (OCP e4m3) has no Inf, uses the all-ones exponent for normal
//!   values and keeps only `S.1..1.1..1` as NaN; [`Specials::Finite`] (OCP FP6/FP4) has
//!   neither Inf nor NaN.
//! - **overflow**: [`Overflow::Infinity`] (default) turns a result beyond the largest finite
//!   value into ±Inf, or NaN where the format has no Inf; [`Overflow::Saturate`] clamps to
//!   ±max. Formats without Inf and NaN always saturate.
//!
//! # Rounding
//! A finite magnitude is rounded to a multiple of `2^(max(e, emin) - man)` (or `2^emin`
//! below the normal range without subnormals) as if the exponent were unbounded, then the
//! overflow rule applies: under nearest-even fp16's 65520 ties to 65536 and overflows to Inf,
//! while e4m3's 464 ties to the even 448. Toward-zero never overflows to Inf (IEEE: it
//! saturates, and only ±Inf inputs stay infinite). The sign of zero is kept. NaN stays NaN.
//! With `man = 0` every normal significand is 1, so "even" cannot pick a neighbour: a tie
//! between 2^e and 2^(e+1) goes to 2^(e+1) (the integer step counts 2^e as the odd count 1).
//!
//! Results are produced in f64 and stored in the tensor's dtype; every value of a format
//! with `exp <= 8` and `man <= 23` is exactly representable in f32, except the extended
//! range of `exp = 8` finite formats, which f32 stores as ±Inf.

use super::grid::{parts, pow2, round_to_multiple};
use super::rounding::{RoundingRule, RuleKind};
use crate::error::FormatError;

/// Which bit patterns are special values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Specials {
    /// All-ones exponent: ±Inf (zero mantissa) and NaN (nonzero mantissa).
    #[default]
    Ieee,
    /// No Inf; only the all-ones pattern `S.1..1.1..1` is NaN (OCP FP8 e4m3).
    FiniteNan,
    /// No Inf and no NaN; every pattern is a finite value (OCP MX FP6 and FP4).
    Finite,
}

/// What happens to a finite value beyond the largest finite magnitude.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Overflow {
    /// ±Inf, or NaN where the format has no Inf.
    #[default]
    Infinity,
    /// ±max finite.
    Saturate,
}

/// A validated float format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Float {
    exp: u32,
    man: u32,
    subnormals: bool,
    overflow: Overflow,
    specials: Specials,
    // Derived, cached for the kernels.
    emin: i32,
    max_bits: u64,
}

impl Float {
    /// An IEEE-style float with subnormals, overflow to Inf, `2 <= exp <= 8`, `1 <= man <= 23`.
    pub fn new(exp: u32, man: u32) -> Result<Self, FormatError> {
        Self::with_options(exp, man, true, Overflow::Infinity, Specials::Ieee)
    }

    /// A float with every option given; checks that the options are consistent.
    pub fn with_options(
        exp: u32,
        man: u32,
        subnormals: bool,
        overflow: Overflow,
        specials: Specials,
    ) -> Result<Self, FormatError> {
        if !(2..=8).contains(&exp) {
            return Err(FormatError::OutOfRange {
                format: "float",
                param: "exp",
                value: exp as i64,
                valid: "2..=8",
            });
        }
        if man > 23 {
            return Err(FormatError::OutOfRange {
                format: "float",
                param: "man",
                value: man as i64,
                valid: "0..=23",
            });
        }
        if specials == Specials::Ieee && man == 0 {
            return Err(FormatError::Inconsistent {
                format: "float",
                reason: "IEEE specials need man >= 1 to tell NaN from Inf".into(),
            });
        }
        if specials == Specials::Finite && overflow == Overflow::Infinity {
            return Err(FormatError::Inconsistent {
                format: "float",
                reason: "a format without Inf and NaN (fin) must saturate on overflow".into(),
            });
        }
        let bias = (1i32 << (exp - 1)) - 1;
        let emin = 1 - bias;
        let top = (1i32 << exp) - 1 - bias; // binade of the all-ones exponent
        let max = match specials {
            Specials::Ieee => pow2(top - 1) * (2.0 - pow2(-(man as i32))),
            Specials::Finite => pow2(top) * (2.0 - pow2(-(man as i32))),
            Specials::FiniteNan if man == 0 => pow2(top - 1),
            Specials::FiniteNan => pow2(top) * (2.0 - pow2(1 - man as i32)),
        };
        Ok(Float {
            exp,
            man,
            subnormals,
            overflow,
            specials,
            emin,
            max_bits: max.to_bits(),
        })
    }

    /// Exponent bits.
    pub fn exp(&self) -> u32 {
        self.exp
    }
    /// Mantissa (fraction) bits.
    pub fn man(&self) -> u32 {
        self.man
    }
    /// Whether subnormals are representable.
    pub fn subnormals(&self) -> bool {
        self.subnormals
    }
    /// Overflow policy.
    pub fn overflow(&self) -> Overflow {
        self.overflow
    }
    /// Special-value encoding.
    pub fn specials(&self) -> Specials {
        self.specials
    }
    /// Exponent bias `2^(exp-1) - 1`.
    pub fn bias(&self) -> i32 {
        (1 << (self.exp - 1)) - 1
    }
    /// Binade of the smallest normal, `1 - bias`.
    pub fn emin(&self) -> i32 {
        self.emin
    }
    /// Total bits: sign + exp + man.
    pub fn bits(&self) -> u32 {
        1 + self.exp + self.man
    }
    /// Largest finite value.
    pub fn max_value(&self) -> f64 {
        f64::from_bits(self.max_bits)
    }
    /// Smallest positive value (subnormal when enabled).
    pub fn min_positive(&self) -> f64 {
        if self.subnormals {
            pow2(self.emin - self.man as i32)
        } else {
            pow2(self.emin)
        }
    }
    /// Distance from 1 to the next larger value, `2^-man`.
    pub fn epsilon(&self) -> f64 {
        pow2(-(self.man as i32))
    }

    fn overflow_value<R: RoundingRule>(&self) -> f64 {
        if R::KIND == RuleKind::TowardZero || self.overflow == Overflow::Saturate {
            self.max_value()
        } else if self.specials == Specials::Ieee {
            f64::INFINITY
        } else {
            f64::NAN
        }
    }

    /// Rounds `x` to this format with `rule` (see the module docs for the policy).
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        if x.is_nan() || x == 0.0 {
            return x;
        }
        let v = if x.is_infinite() {
            match self.specials {
                Specials::Ieee => return x,
                _ if self.overflow == Overflow::Saturate => self.max_value(),
                _ => return f64::NAN,
            }
        } else {
            let p = parts(x);
            let man = self.man as i32;
            let q = if p.e >= self.emin {
                p.e - man
            } else if self.subnormals {
                self.emin - man
            } else {
                self.emin
            };
            let v = round_to_multiple(p, q, rule, random);
            if v > self.max_value() {
                self.overflow_value::<R>()
            } else {
                v
            }
        };
        if x < 0.0 {
            -v
        } else {
            v
        }
    }

    /// Bit pattern of `x` rounded to nearest-even. Fails for NaN in a format without NaN.
    pub fn encode(&self, x: f64) -> Result<u32, FormatError> {
        let v = self.round(x, super::rounding::NearestEven, 0);
        let man = self.man;
        let sign_bit = 1u32 << (self.exp + man);
        let all_ones_exp = ((1u32 << self.exp) - 1) << man;
        if v.is_nan() {
            return match self.specials {
                Specials::Ieee => Ok(all_ones_exp | (1 << (man - 1))),
                Specials::FiniteNan => Ok(all_ones_exp | ((1 << man) - 1)),
                Specials::Finite => Err(FormatError::Inconsistent {
                    format: "float",
                    reason: format!("{} has no NaN encoding", super::Format::Float(*self)),
                }),
            };
        }
        let sign = if v.is_sign_negative() { sign_bit } else { 0 };
        if v.is_infinite() {
            return Ok(sign | all_ones_exp);
        }
        if v == 0.0 {
            return Ok(sign);
        }
        let p = parts(v);
        let body = if p.e >= self.emin {
            let field = (p.e + self.bias()) as u32;
            (field << man) | ((p.m >> (52 - man)) as u32 & ((1u32 << man) - 1))
        } else {
            // Subnormal: the count of 2^(emin - man) quanta.
            let s = (self.emin - man as i32) - (p.e - 52);
            (p.m >> s) as u32
        };
        Ok(sign | body)
    }

    /// Value of a `bits()`-bit pattern (upper bits ignored).
    pub fn decode(&self, pattern: u32) -> f64 {
        let man = self.man;
        let p = pattern & ((1u64 << self.bits()) - 1) as u32;
        let negative = p >> (self.exp + man) & 1 == 1;
        let field = (p >> man) & ((1 << self.exp) - 1);
        let m = p & ((1u32 << man) - 1);
        let all_ones = (1u32 << self.exp) - 1;
        let v = if field == all_ones && self.specials == Specials::Ieee {
            if m == 0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        } else if field == all_ones
            && self.specials == Specials::FiniteNan
            && m == (1u32 << man) - 1
        {
            f64::NAN
        } else if field == 0 {
            m as f64 * pow2(self.emin - man as i32)
        } else {
            (1.0 + m as f64 * pow2(-(man as i32))) * pow2(field as i32 - self.bias())
        };
        if negative {
            -v
        } else {
            v
        }
    }
}
