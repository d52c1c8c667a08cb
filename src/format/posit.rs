//! Posit(n, es): tapered-precision numbers of the 2022 posit standard, generalised to any
//! `2 <= n <= 32`, `0 <= es <= 5`.
//!
//! A posit's n bits are a sign, a regime (a run of k+1 ones then a zero for k >= 0, or -k
//! zeros then a one for k < 0), up to `es` exponent bits and the remaining fraction bits;
//! negative posits are the two's complement of the pattern. The value is
//! `useed^k * 2^e * (1 + f)` with `useed = 2^(2^es)`, so `maxpos = 2^((n-2) 2^es)` and
//! `minpos = 1 / maxpos`. The pattern `1000...0` is NaR (not a real), represented as NaN.
//!
//! # Rounding
//! The standard rounds the bit pattern: extend the exact value's encoding to infinite
//! precision and round to n bits, ties to the even pattern. Where a binade still has all its
//! exponent bits and `f >= 0` fraction bits, neighbours are evenly spaced and this is ordinary
//! rounding to a multiple of `2^(e - f)` ([`grid`](super::grid)); with `f = 0` the tie goes
//! to the even *pattern*, whose parity is the last exponent bit (or, for es = 0, the last
//! regime bit), not the parity of the value's significand. Near minpos and maxpos, where
//! the regime pushes exponent bits off the end, neighbours are powers of two up to `useed`
//! apart and the boundary is the value of the (n+1)-bit pattern between them, a geometric
//! midpoint: posit<16,1> rounds 2^27 to maxpos 2^28's neighbour by pattern, not by value.
//! That case is rounded on the pattern itself.
//!
//! Nonzero values never round to zero (`|x| < minpos` gives minpos) and finite values never
//! round to NaR (`|x| > maxpos` gives maxpos), in every rounding mode. NaN and ±Inf become
//! NaR. The posit zero is unsigned, so -0.0 becomes +0.0.
//!
//! Stochastic rounding goes up with probability `(x - lo) / (hi - lo)` (truncated to the
//! rule's random bits), computed exactly in integers also where the gap is not a power of
//! two, so it is unbiased in value everywhere between minpos and maxpos.

use super::grid::{parts, pow2, round_count, Parts};
use super::rounding::{RoundingRule, RuleKind};
use crate::error::FormatError;

const MANT_MASK: u64 = (1 << 52) - 1;

/// A validated posit format: `n` bits, `es` exponent bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Posit {
    n: u32,
    es: u32,
}

impl Posit {
    /// posit(n, es) with `2 <= n <= 32` and `0 <= es <= 5`.
    pub fn new(n: u32, es: u32) -> Result<Self, FormatError> {
        if !(2..=32).contains(&n) {
            return Err(FormatError::OutOfRange {
                format: "posit",
                param: "n",
                value: n as i64,
                valid: "2..=32",
            });
        }
        if es > 5 {
            return Err(FormatError::OutOfRange {
                format: "posit",
                param: "es",
                value: es as i64,
                valid: "0..=5",
            });
        }
        Ok(Posit { n, es })
    }

    /// Total bits.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// Exponent bits.
    pub fn es(&self) -> u32 {
        self.es
    }

    /// `log2(maxpos) = (n - 2) * 2^es`.
    #[inline(always)]
    pub fn max_scale(&self) -> i32 {
        ((self.n - 2) << self.es) as i32
    }

    /// Largest finite posit, `2^((n-2) 2^es)`.
    pub fn max_pos(&self) -> f64 {
        pow2(self.max_scale())
    }

    /// Smallest positive posit, `1 / maxpos`.
    pub fn min_pos(&self) -> f64 {
        pow2(-self.max_scale())
    }

    /// The NaR pattern, `1 << (n - 1)`.
    pub fn nar(&self) -> u32 {
        1 << (self.n - 1)
    }

    /// Mask of the n pattern bits.
    pub fn mask(&self) -> u32 {
        if self.n == 32 {
            u32::MAX
        } else {
            (1 << self.n) - 1
        }
    }

    /// Fraction bits available in binade `e` (negative where exponent bits are cut off).
    #[inline(always)]
    pub(crate) fn frac_bits(&self, e: i32) -> i32 {
        let k = e >> self.es;
        let regime_len = if k >= 0 { k + 2 } else { 1 - k };
        self.n as i32 - 1 - regime_len - self.es as i32
    }

    /// The first n-1 magnitude bits of the infinitely precise encoding of `p` (a value with
    /// `minpos <= p < maxpos`), the next bit (guard) and whether any later bit is set.
    #[inline]
    fn truncated_pattern(&self, p: Parts) -> (u32, bool, bool) {
        let es = self.es;
        let k = p.e >> es;
        let (regime, len) = if k >= 0 {
            (((1u64 << (k + 1)) - 1) << 1, (k + 2) as u32)
        } else {
            (1u64, (1 - k) as u32)
        };
        let mut body = regime << (64 - len);
        let avail = 64 - len - es; // >= 64 - 31 - 5
        if es > 0 {
            body |= ((p.e & ((1 << es) - 1)) as u64) << avail;
        }
        let frac = p.m & MANT_MASK;
        let mut lost = false;
        if avail >= 52 {
            body |= frac << (avail - 52);
        } else {
            body |= frac >> (52 - avail);
            lost = frac & ((1u64 << (52 - avail)) - 1) != 0;
        }
        let keep = self.n - 1;
        let pattern = (body >> (64 - keep)) as u32;
        let guard = (body >> (63 - keep)) & 1 == 1;
        let sticky = lost || body & ((1u64 << (63 - keep)) - 1) != 0;
        (pattern, guard, sticky)
    }

    /// Decodes an n-bit pattern (upper bits ignored). NaR decodes to NaN.
    pub fn decode(&self, pattern: u32) -> f64 {
        let p = pattern & self.mask();
        if p == 0 {
            return 0.0;
        }
        let nar = self.nar();
        if p == nar {
            return f64::NAN;
        }
        let negative = p & nar != 0;
        let mag = if negative {
            p.wrapping_neg() & self.mask()
        } else {
            p
        };
        let v = self.decode_magnitude(mag);
        if negative {
            -v
        } else {
            v
        }
    }

    /// Value of a positive pattern `1 <= mag < 2^(n-1)`.
    #[inline]
    fn decode_magnitude(&self, mag: u32) -> f64 {
        let b = (mag as u64) << (65 - self.n);
        let (k, run) = if b >> 63 == 1 {
            let run = (!b).leading_zeros();
            (run as i32 - 1, run)
        } else {
            let run = b.leading_zeros();
            (-(run as i32), run)
        };
        let rest = b << (run + 1);
        let e = if self.es > 0 {
            (rest >> (64 - self.es)) as i32
        } else {
            0
        };
        let frac = rest << self.es;
        let scale = (k << self.es) + e;
        f64::from_bits((((scale + 1023) as u64) << 52) | (frac >> 12))
    }

    /// Encodes `x` with the standard's rounding (nearest, ties to even pattern).
    /// NaN and ±Inf give NaR.
    pub fn encode(&self, x: f64) -> u32 {
        if !x.is_finite() {
            return self.nar();
        }
        if x == 0.0 {
            return 0;
        }
        let p = parts(x);
        let mag = if p.e >= self.max_scale() {
            self.nar() - 1
        } else if p.e < -self.max_scale() {
            1
        } else {
            let (t, guard, sticky) = self.truncated_pattern(p);
            t + (guard && (sticky || t & 1 == 1)) as u32
        };
        if x < 0.0 {
            mag.wrapping_neg() & self.mask()
        } else {
            mag
        }
    }

    /// Rounds `x` to this posit format with `rule` (see the module docs for the policy).
    #[inline(always)]
    pub fn round<R: RoundingRule>(&self, x: f64, rule: R, random: u32) -> f64 {
        if !x.is_finite() {
            return f64::NAN;
        }
        if x == 0.0 {
            return 0.0;
        }
        let p = parts(x);
        let max_scale = self.max_scale();
        let v = if p.e >= max_scale {
            pow2(max_scale)
        } else if p.e < -max_scale {
            pow2(-max_scale)
        } else {
            let fb = self.frac_bits(p.e);
            if fb >= 0 {
                let q = p.e - fb;
                let odd_hint = if fb == 0 {
                    // The pattern ends in an exponent bit (es >= 1) or a regime bit (es = 0).
                    Some(if self.es > 0 { p.e & 1 == 1 } else { p.e < 0 })
                } else {
                    None
                };
                round_count(p, q, rule, random, odd_hint) as f64 * pow2(q)
            } else {
                self.round_cut(p, rule, random)
            }
        };
        if x < 0.0 {
            -v
        } else {
            v
        }
    }

    /// Rounding where exponent bits are cut off: on the bit pattern.
    #[inline(never)]
    fn round_cut<R: RoundingRule>(&self, p: Parts, rule: R, random: u32) -> f64 {
        let (t, guard, sticky) = self.truncated_pattern(p);
        let up = match R::KIND {
            RuleKind::NearestEven => guard && (sticky || t & 1 == 1),
            RuleKind::NearestAway => guard,
            RuleKind::TowardZero => false,
            RuleKind::Stochastic => {
                if !guard && !sticky {
                    false
                } else {
                    // lo = 2^a <= x < hi = 2^b, exact in units of 2^(e - 52).
                    let a = parts(self.decode_magnitude(t)).e;
                    let b = parts(self.decode_magnitude(t + 1)).e;
                    let unit = p.e - 52;
                    let lo = 1u128 << (a - unit);
                    let hi = 1u128 << (b - unit);
                    rule.up_ratio(p.m as u128 - lo, hi - lo, random)
                }
            }
        };
        self.decode_magnitude(t + up as u32)
    }

    /// Distance from 1 to the next larger posit.
    pub fn epsilon(&self) -> f64 {
        self.decode(self.encode(1.0) + 1) - 1.0
    }
}
