//! The shared integer core: split an f64 into sign, binade and significand, and round a
//! magnitude to a multiple of a power of two.
//!
//! A finite nonzero magnitude is `|x| = m * 2^(e - 52)` with `m` in `[2^52, 2^53)` and
//! `e = floor(log2 |x|)` (subnormal f64 inputs are normalised, so `e` can go below -1022).
//! Rounding to the grid of multiples of `2^q` keeps `c = m >> s` with `s = q - (e - 52)`
//! and lets the [`RoundingRule`] decide from the remainder whether `c` becomes `c + 1`.
//! The result `c * 2^q` is exact in f64 whenever it is representable: `c < 2^53`, and `2^q`
//! is exact down to f64's smallest subnormal 2^-1074 (block floating point on tiny f64
//! blocks reaches there; below it every f64 is already on the grid). Every format's rounding reduces to this step except
//! posits where exponent bits are cut off, which round on the bit pattern (see `posit.rs`).

use super::rounding::RoundingRule;

/// A finite nonzero magnitude as `m * 2^(e - 52)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// Significand with the hidden bit, in `[2^52, 2^53)`.
    pub m: u64,
    /// Binade: `floor(log2 |x|)`.
    pub e: i32,
}

const MANT_MASK: u64 = (1 << 52) - 1;

/// Splits a finite nonzero `x` into its magnitude parts; the sign is ignored.
#[inline(always)]
pub fn parts(x: f64) -> Parts {
    let bits = x.to_bits() & 0x7fff_ffff_ffff_ffff;
    let biased = (bits >> 52) as i32;
    if biased != 0 {
        Parts {
            m: (bits & MANT_MASK) | (1 << 52),
            e: biased - 1023,
        }
    } else {
        // Subnormal: normalise so the leading one lands on bit 52.
        let lz = bits.leading_zeros() as i32 - 11;
        Parts {
            m: bits << lz,
            e: -1022 - lz,
        }
    }
}

/// `2^q` as f64 (a subnormal, 0 or Inf outside f64's normal range).
#[inline(always)]
pub fn pow2(q: i32) -> f64 {
    if (-1022..=1023).contains(&q) {
        f64::from_bits(((q + 1023) as u64) << 52)
    } else {
        pow2_outside(q)
    }
}

#[cold]
fn pow2_outside(q: i32) -> f64 {
    match q {
        -1074..=-1023 => f64::from_bits(1u64 << (q + 1074)),
        i32::MIN..=-1075 => 0.0,
        _ => f64::INFINITY,
    }
}

/// The magnitude `m * 2^(e - 52)` back as an f64 (exact).
#[inline(always)]
pub fn magnitude(p: Parts) -> f64 {
    if p.e >= -1022 {
        f64::from_bits((((p.e + 1023) as u64) << 52) | (p.m & MANT_MASK))
    } else {
        f64::from_bits(p.m >> (-1022 - p.e))
    }
}

/// Rounds the magnitude `p` (with `q > e - 52`) to a multiple of `2^q` and returns the kept count `c`
/// (the result is `c * 2^q`). `odd_hint` overrides the parity used for ties when the
/// count's parity is not the parity of the encoding (posits with no fraction bits);
/// pass `None` to use the count's own parity.
#[inline(always)]
pub fn round_count<R: RoundingRule>(
    p: Parts,
    q: i32,
    rule: R,
    random: u32,
    odd_hint: Option<bool>,
) -> u64 {
    let s = q - (p.e - 52);
    debug_assert!(s >= 1, "round_count needs a grid coarser than the input");
    let s = s as u32;
    let (kept, rem) = if s >= 64 {
        (0, p.m)
    } else {
        (p.m >> s, p.m & ((1u64 << s) - 1))
    };
    let odd = odd_hint.unwrap_or(kept & 1 == 1);
    if rem != 0 && rule.up(rem, s, odd, random) {
        kept + 1
    } else {
        kept
    }
}

/// Rounds a finite nonzero magnitude to a multiple of `2^q`, returning the magnitude.
#[inline(always)]
pub fn round_to_multiple<R: RoundingRule>(p: Parts, q: i32, rule: R, random: u32) -> f64 {
    let s = q - (p.e - 52);
    if s <= 0 {
        return magnitude(p);
    }
    round_count(p, q, rule, random, None) as f64 * pow2(q)
}
