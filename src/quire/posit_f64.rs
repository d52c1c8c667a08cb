//! Nearest-even rounding of f64 values to a posit on the f64 bit pattern: the rounding of
//! [`super::lane_round`]'s posit tables carried from f32 to f64 patterns, so that posits
//! with more than 17 bits (posit<32,2>, posit<24,1>, ...) round with a few integer
//! operations instead of the general [`Posit::round`](crate::format::Posit) step. It is the
//! rounding of the naive posit GEMM in f64 ([`super::naive_posit_f64`]); the tests compare
//! it with [`Format::round`](crate::Format::round) bit for bit over every class of input.
//!
//! # The raised exponent
//!
//! Let `x` be finite and nonzero, `e` its binade (`2^e <= |x| < 2^(e+1)`). The integer
//! `t = bits(|x|) + 2^52` is the pattern of `|x|` with the exponent field raised by one,
//! `e + 1024`; since `1024` is a multiple of `2^es` (`es <= 4`), the field's low `es` bits
//! are the posit's exponent bits `e mod 2^es` and the bits above them, `t >> (52 + es) = k +
//! 1024 / 2^es`, give the regime `k = floor(e / 2^es)`. Below the field lie the 52 fraction
//! bits. So the bits of `t` from bit `52 + es` down are the posit's exponent and fraction
//! bits in the order the posit pattern holds them, and in regime `k`, which keeps `fb(k)`
//! fraction bits ([`Posit::frac_bits`](crate::format::Posit), the same for every binade of
//! the regime), the posit's n-bit pattern keeps exactly the bits of `t` from bit `s = 52 -
//! fb(k)` up (`s > 52` where exponent bits are cut: `fb(k) < 0`).
//!
//! Rounding the pattern to nearest, ties to even, is then rounding `t` at bit `s`:
//! `(t + 2^(s-1) - 1 + odd) & !(2^s - 1)`, with `odd` the last kept bit. A carry out of the
//! kept fraction raises the exponent, a carry out of the exponent raises the regime (the
//! next regime's first value, `2^(2^es (k+1))`, is a posit), as the pattern's own carry
//! does; where exponent bits are cut, the tie between two kept exponents is the pattern
//! midpoint, a power of two, exactly as the standard's rounding of the pattern puts it.
//!
//! * **Parity.** `odd` is bit `s` of `t` where a fraction or exponent bit is kept (at
//!   `s = 52` the low exponent bit, by the raised field). Where the whole exponent is cut
//!   (`fb(k) = -es`, the regimes next to minpos and maxpos) the kept pattern ends in the
//!   regime, whose last bit is 0 for `k >= 0` (the terminating zero) and 1 for `k < 0`,
//!   while bit `s` of `t` is the low bit of `k + 1024 / 2^es`: the regime's increment is
//!   corrected by the difference. The increment is at most `2^(s-1)`, so `odd` moves only
//!   ties.
//! * **Clamps.** Posits never round to zero or past maxpos: `t` is clamped to the `t` of
//!   minpos and of maxpos first (both posits, which round to themselves). Regime `n - 2`
//!   holds maxpos alone and is reached only by the clamp: increment 0, mask all ones.
//! * **Zero, NaN, Inf.** Zero (either sign) gives `+0`, the posit's unsigned zero; NaN and
//!   ±Inf give NaN (NaR), as [`Posit::round`](crate::format::Posit) does. The sign is put
//!   back on the rounded magnitude.
//!
//! The regimes run from `-(n - 2)` to `n - 2`: at most 61, indexed by `k + n - 2` in tables
//! of 64 entries.

use super::lane_round::regime_step;
use crate::format::{Format, Posit};

const SIGN: u64 = 1 << 63;
/// The raise of the exponent field by one.
const RAISE: u64 = 1 << 52;

/// The nearest-even rounding of f64 values to one posit, on the f64 pattern (see the
/// module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositF64 {
    posit: Posit,
    /// `52 + es`: `t >> shift` is the regime plus `1024 / 2^es`.
    shift: u32,
    /// `1024 / 2^es - (n - 2)`: subtracted from `t >> shift`, the table index `k + n - 2`.
    base: u64,
    /// The `t` of minpos.
    t_lo: u64,
    /// The `t` of maxpos.
    t_hi: u64,
    /// Per regime: `2^(s-1) - 1`, corrected by the parity where the exponent is cut (0 for
    /// maxpos).
    half: [u64; 64],
    /// Per regime: `!(2^s - 1)` (all ones for maxpos).
    mask: [u64; 64],
}

impl PositF64 {
    /// The rounding of `format`, where it is a posit with `n >= 3` and `es <= 4` (every
    /// regime rounds at a bit inside the pattern, and every product of two of its values is
    /// a normal f64); `None` otherwise.
    pub fn new(format: &Format) -> Option<Self> {
        match format {
            Format::Posit(p) => Self::of(p),
            _ => None,
        }
    }

    /// See [`PositF64::new`].
    pub fn of(p: &Posit) -> Option<Self> {
        let (n, es) = (p.n() as i32, p.es() as i32);
        if !(3..=32).contains(&n) || es > 4 {
            return None;
        }
        let k_max = n - 2;
        let shift = 52 + es as u32;
        let mut table = PositF64 {
            posit: *p,
            shift,
            base: ((1024 >> es) - k_max) as u64,
            t_lo: p.min_pos().to_bits() + RAISE,
            t_hi: p.max_pos().to_bits() + RAISE,
            half: [0; 64],
            mask: [u64::MAX; 64],
        };
        for k in -k_max..k_max {
            let i = (k + k_max) as usize;
            // The parity correction where the exponent is cut: see the module docs.
            let (s, correction) = regime_step(p, k, 52);
            let s = s as u32; // 52 - fb <= 52 + es < 64, and fb <= n - 3 - es < 52
            table.half[i] = ((1i64 << (s - 1)) - 1 + correction) as u64;
            table.mask[i] = !((1u64 << s) - 1);
        }
        Some(table)
    }

    /// The posit.
    pub fn posit(&self) -> Posit {
        self.posit
    }

    /// `x` rounded to the posit, nearest even: the same value as
    /// [`Posit::round`](crate::format::Posit) with nearest-even (NaN for NaN and ±Inf, `+0`
    /// for either zero).
    #[inline]
    pub fn round(&self, x: f64) -> f64 {
        let bits = x.to_bits();
        let sign = bits & SIGN;
        let abs = bits ^ sign;
        if abs >= f64::INFINITY.to_bits() {
            return f64::NAN;
        }
        if abs == 0 {
            return 0.0;
        }
        let t = (abs + RAISE).clamp(self.t_lo, self.t_hi);
        let i = ((t >> self.shift) - self.base) as usize & 63;
        let mask = self.mask[i];
        // Bit s of t: the lowest bit the mask keeps.
        let odd = (t & mask.wrapping_neg() != 0) as u64;
        let r = ((t + self.half[i] + odd) & mask) - RAISE;
        f64::from_bits(r | sign)
    }
}
