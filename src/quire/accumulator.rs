//! The quire: an exact fixed-point accumulator of posit products.
//!
//! Every posit of posit(n, es) is an integer multiple of `minpos = 2^-s` (`s` the format's
//! `max_scale`, `maxpos = 2^s`), so every product of two posits is an integer multiple of
//! `minpos^2 = 2^-2s` of magnitude at most `maxpos^2 = 2^2s`. The quire holds the running
//! sum as a two's complement integer in units of `2^-2s`: `4s` bits reach `maxpos^2`, one is
//! the sign, and the rest are carry bits that absorb up to `2^carry` products of maxpos²
//! before anything could overflow.
//!
//! The 2022 posit standard's quire has `16n` bits with 31 carry bits (128 bits for
//! posit<8,2>, 256 for posit<16,2>); the legacy quires of posit<8,0> and posit<16,1>
//! (SoftPosit's `Q8E0`, `Q16E1`) are 32 and 128 bits with fewer carry bits. This quire is
//! deliberately wider: at least 64 carry bits, so it never overflows in practice, where
//! SoftPosit's `Q8E0` silently wraps once the sum passes 2^19 (tested).
//!
//! Converting back to a posit rounds once, to nearest with ties to the even pattern: the
//! exact integer becomes an f64 rounded to odd ([`super::round_odd`]), which the posit
//! rounding then treats exactly as it would the exact sum. NaR is sticky: a NaR (or NaN)
//! operand makes the quire NaR until it is cleared.

use crate::format::grid::{parts, pow2};
use crate::format::rounding::NearestEven;
use crate::format::Posit;

use super::round_odd::u128_to_f64_odd;

/// The largest `max_scale` (log2 of maxpos) a quire supports: every product then stays
/// inside f64's normal range. This admits every posit(n, es) with n <= 16 and every one
/// with es <= 4 (n <= 32).
pub const MAX_SCALE: i32 = 448;

/// Carry bits above `maxpos^2`.
const CARRY_BITS: i32 = 64;

/// An exact accumulator for sums of products of posits (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quire {
    posit: Posit,
    /// Two's complement integer in units of `minpos^2`, least significant limb first.
    limbs: Vec<u64>,
    nar: bool,
}

/// Why a format has no quire here.
pub fn quire_support(posit: Posit) -> Result<(), String> {
    if posit.max_scale() > MAX_SCALE {
        Err(format!(
            "posit<{},{}>: maxpos = 2^{} is beyond the quire's range (maxpos <= 2^{MAX_SCALE})",
            posit.n(),
            posit.es(),
            posit.max_scale()
        ))
    } else {
        Ok(())
    }
}

impl Quire {
    /// An empty (zero) quire for `posit`; an error when the format is too wide (see
    /// [`MAX_SCALE`]).
    pub fn new(posit: Posit) -> Result<Self, String> {
        quire_support(posit)?;
        let bits = 4 * posit.max_scale() + CARRY_BITS + 1;
        Ok(Quire {
            posit,
            limbs: vec![0; (bits as usize).div_ceil(64)],
            nar: false,
        })
    }

    /// The posit format this quire accumulates.
    pub fn posit(&self) -> Posit {
        self.posit
    }

    /// Width of the accumulator in bits.
    pub fn bits(&self) -> usize {
        self.limbs.len() * 64
    }

    /// Resets to zero (and clears NaR).
    pub fn clear(&mut self) {
        self.limbs.fill(0);
        self.nar = false;
    }

    /// Whether a NaR (or NaN) has been accumulated.
    pub fn is_nar(&self) -> bool {
        self.nar
    }

    /// Adds `a * b` exactly. Both operands are first rounded to the posit format (nearest,
    /// ties to even), so any f64 may be passed; values already on the format's grid are
    /// used as they are.
    pub fn add_product(&mut self, a: f64, b: f64) {
        let (a, b) = (self.round(a), self.round(b));
        self.add_exact_product(a, b);
    }

    /// Subtracts `a * b` exactly (operands rounded as in [`Quire::add_product`]).
    pub fn sub_product(&mut self, a: f64, b: f64) {
        let (a, b) = (self.round(a), self.round(b));
        self.add_exact_product(-a, b);
    }

    /// Adds the posit `a` (rounded to the format first).
    pub fn add(&mut self, a: f64) {
        let a = self.round(a);
        self.add_exact_product(a, 1.0);
    }

    /// Adds the products of two posit bit patterns.
    pub fn add_product_bits(&mut self, a: u32, b: u32) {
        self.add_exact_product(self.posit.decode(a), self.posit.decode(b));
    }

    fn round(&self, x: f64) -> f64 {
        self.posit.round(x, NearestEven, 0)
    }

    /// Adds `a * b` where `a` and `b` are posit values (or ±1), multiples of minpos; NaN or
    /// ±Inf (not posit values) make the quire NaR.
    pub(crate) fn add_exact_product(&mut self, a: f64, b: f64) {
        if !a.is_finite() || !b.is_finite() {
            self.nar = true;
            return;
        }
        if a == 0.0 || b == 0.0 {
            return;
        }
        let (ma, ea) = integer_parts(a);
        let (mb, eb) = integer_parts(b);
        // a * b = ma * mb * 2^(ea + eb), in units of 2^-2s.
        let shift = ea + eb + 2 * self.posit.max_scale();
        debug_assert!(shift >= 0, "operands must be multiples of minpos");
        let product = ma as u128 * mb as u128;
        self.add_shifted(product, shift as u32, (a < 0.0) != (b < 0.0));
    }

    /// Adds the integer `v` in units of `minpos^2` (the quire's own unit) exactly.
    pub(crate) fn add_units(&mut self, v: i128) {
        if v != 0 {
            self.add_shifted(v.unsigned_abs(), 0, v < 0);
        }
    }

    /// Adds (or subtracts) `value << shift` into the limbs.
    fn add_shifted(&mut self, value: u128, shift: u32, negative: bool) {
        let (limb, bit) = ((shift / 64) as usize, shift % 64);
        // value < 2^106 and bit < 64 (or bit = 0), so three limbs hold the shifted value.
        let lo = (value << bit) as u64;
        let mid = ((value << bit) >> 64) as u64;
        let hi = if bit == 0 {
            0
        } else {
            (value >> (128 - bit)) as u64
        };
        let mut carry = false;
        for (i, word) in [lo, mid, hi].into_iter().enumerate().chain(
            // Then propagate the carry (or borrow) through the upper limbs.
            (3..self.limbs.len() - limb).map(|i| (i, 0)),
        ) {
            let Some(slot) = self.limbs.get_mut(limb + i) else {
                break;
            };
            if negative {
                let (d, b1) = slot.overflowing_sub(word);
                let (d, b2) = d.overflowing_sub(carry as u64);
                *slot = d;
                carry = b1 || b2;
            } else {
                let (s, c1) = slot.overflowing_add(word);
                let (s, c2) = s.overflowing_add(carry as u64);
                *slot = s;
                carry = c1 || c2;
            }
            if !carry && i >= 2 {
                break;
            }
        }
    }

    /// The accumulated value as f64, rounded to odd (exact when it fits 53 bits); NaN for NaR.
    pub fn to_f64_odd(&self) -> f64 {
        if self.nar {
            return f64::NAN;
        }
        let negative = self.limbs.last().is_some_and(|&w| w >> 63 == 1);
        let mut mag = self.limbs.clone();
        if negative {
            // Two's complement negation: invert and add one.
            let mut carry = true;
            for w in mag.iter_mut() {
                let (s, c) = (!*w).overflowing_add(carry as u64);
                *w = s;
                carry = c;
            }
        }
        let Some(top) = mag.iter().rposition(|&w| w != 0) else {
            return 0.0;
        };
        // The top two limbs as a 128-bit window; lower limbs only feed the sticky bit.
        let window = if top == 0 {
            mag[0] as u128
        } else {
            ((mag[top] as u128) << 64) | mag[top - 1] as u128
        };
        let below = top.saturating_sub(1);
        let sticky = mag[..below].iter().any(|&w| w != 0);
        let v = u128_to_f64_odd(window | sticky as u128);
        let unit = 64 * below as i32 - 2 * self.posit.max_scale();
        let v = v * pow2(unit);
        if negative {
            -v
        } else {
            v
        }
    }

    /// The sum rounded once to the posit format (nearest, ties to the even pattern); NaN
    /// for NaR.
    pub fn to_posit(&self) -> f64 {
        self.round(self.to_f64_odd())
    }

    /// The sum rounded once to the posit format, as a bit pattern.
    pub fn to_bits(&self) -> u32 {
        self.posit.encode(self.to_f64_odd())
    }
}

/// A finite nonzero f64 as `m * 2^e` with `m` odd (`m < 2^53`).
#[inline(always)]
pub(crate) fn integer_parts(x: f64) -> (u64, i32) {
    let p = parts(x);
    let tz = p.m.trailing_zeros();
    (p.m >> tz, p.e - 52 + tz as i32)
}
