//! The posit rounding of doubled f32 values by one magic constant per value, for the naive
//! GEMM's AVX2 kernel ([`super::naive_special_avx2`]): `r = (y + M) - M`, and for a product
//! `r = fma(x, y, M) - M`, with `M` computed from the exponent field of `y` (of the f32
//! product) in seven integer operations, where the binade's posit grid is uniform.
//!
//! # The grid of a binade
//!
//! In posit(n, es) the values of the binade `[2^e, 2^(e+1))` have regime `k = ⌊e / 2^es⌋`,
//! `rl(k) = max(k + 2, 1 - k)` regime bits and `fb(e) = n - 1 - es - rl(k)` fraction bits.
//! Where `fb >= 1` they are the multiples of `2^g`, `g = e - fb`, in the binade, and the
//! last bit of a value's pattern is the parity of its multiple (the binade starts at an
//! even multiple, `2^e = 2^fb · 2^g`). The first value above the binade, `2^(e+1)`, is an
//! even multiple too, and its pattern ends in 0: it is the next binade's first value, whose
//! last pattern bit is a fraction bit (0) or, where that binade has no fraction bits, the
//! lowest exponent bit of a regime's first binade (0: `fb` drops only where a new regime
//! starts). So in such a binade the posit rounding to nearest with ties to the even pattern
//! is the rounding to the nearest multiple of `2^g` with ties to the even multiple.
//!
//! # The magic constant
//!
//! Let `M = f · 2^X` with `X = 23 + g` and `f` in `[1 + 2^-(es+1), 2 - 2^-(es+1)]` with an
//! even last significand bit. As `|y| < 2^(e+1) = 2^(X - 22 + fb)` and `fb <= n - 3 - es`,
//! `|y| < 2^(n - 25 - es) · 2^X <= 2^-(es+8) · 2^X` for the posits admitted (`n <= 17`), so
//! `y + M` lies in `M`'s binade, whose f32 spacing
//! is `2^(X - 23) = 2^g`, and its f32 rounding is `M` plus the multiple of `2^g` nearest `y`,
//! ties to the even multiple (`M` is an even multiple). The subtraction of `M` is exact.
//! For a product, `fma(x, y, M)` rounds `x·y + M` once: the same rounding of the exact
//! product. `M` is taken from the binade of the f32 value (the f32 product, the f32 sum): it
//! differs from the exact value's binade only where the f32 rounding reaches the power of
//! two `2^e` from below; then the exact value lies within `2^(e - 24)` of `2^e`, a posit,
//! and both grids round it to `2^e`.
//!
//! # Seven operations from the exponent field
//!
//! The kernel works on doubled values (every product and sum twice the definition's, see
//! [`super::naive_special`]): a doubled value `y` of binade `e` has exponent field
//! `E = e + 128`, so `k = ⌊E / 2^es⌋ - 2^(7 - es)` (for `es <= 7`). With `E23 = E · 2^23`
//! (the pattern's exponent field in place) and `h = E23 >> es = ⌊E / 2^es⌋ · 2^23 + j`,
//! `j = (E mod 2^es) · 2^(23 - es)` below bit 23, the doubled grid's exponent field is
//! `E + rl(k) + 24 - n + es`, so
//!
//! ```text
//! M = E23 + max(h + c_a, c_b - h)          (the maximum of signed integers)
//! c_a = (26 - 2^(7-es) - n + es) · 2^23 + 2^(22 - es)
//! c_b = (25 + 2^(7-es) - n + es) · 2^23 + 2^23 - 2^(22 - es)
//! ```
//!
//! the first branch for `k >= 0` (`rl = k + 2`), the second for `k < 0` (`rl = 1 - k`); they
//! never tie in the exponent, and the larger exponent wins. The significand bits of the
//! chosen branch are `2^(22 - es) + j` or `2^23 - 2^(22 - es) - j`, both in
//! `[2^(22 - es), 2^23 - 2^(22 - es)]` (as `j <= 2^23 - 2^(23 - es)`) and multiples of
//! `2^(22 - es)`: the `f` required above.
//!
//! # Where it applies
//!
//! Where `fb(e) >= 1`: regimes `-(n - 3 - es) <= k <= n - 4 - es`, the exponent fields
//! `[LO, HI]`. A zero gives `M = c_b` (a normal f32 for the posits admitted), and
//! `0 + M - M = +0`, as the rounding of zero. Every other value (the binades next to minpos
//! and maxpos, where the exponent bits are cut and the grid is no longer uniform) is
//! reported out of range, and the kernel redoes its step with the general rounding
//! ([`super::lane_round`]). Its test: the running unsigned minimum of `E23 - 1` (a zero
//! wraps to the largest value) at least `LO · 2^23 - 1`, and the running maximum of `E23`
//! at most `HI · 2^23`.

use crate::format::Posit;

/// f32's exponent field.
const EXP: u32 = 0x7f80_0000;

/// The constants of the magic-constant rounding of doubled values of one posit (see the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositMagic {
    /// `es`: the shift of `E23` that gives `h`.
    pub es: u32,
    /// `c_a`, the constant of the branch `k >= 0`.
    pub c_a: u32,
    /// `c_b`, the constant of the branch `k < 0`.
    pub c_b: u32,
    /// `LO · 2^23 - 1`: the least `E23 - 1` of a nonzero value in range.
    pub lo: u32,
    /// `HI · 2^23`: the largest `E23` in range.
    pub hi: u32,
}

impl PositMagic {
    /// The constants of `p`, or `None` where the form does not apply: `n > 17` or
    /// `es > 6` (as [`super::lane_round::PositTable`]), or no regime on either side of 1
    /// with a fraction bit.
    pub fn new(p: &Posit) -> Option<Self> {
        let (n, es) = (p.n() as i32, p.es() as i32);
        if n > 17 || es > 6 || 2 * p.max_scale() > 125 {
            return None;
        }
        // Regimes with at least one fraction bit.
        let (k_lo, k_hi) = (-(n - 3 - es), n - 4 - es);
        if k_lo > -1 || k_hi < 0 {
            return None;
        }
        // Binades of those regimes, as doubled values' exponent fields (E = e + 128).
        let e_lo = (k_lo << es) + 128;
        let e_hi = ((k_hi + 1) << es) - 1 + 128;
        let bias = 1i32 << (7 - es);
        let low = 1i32 << (22 - es);
        let c_a = ((26 - bias - n + es) << 23).wrapping_add(low);
        let c_b = ((25 + bias - n + es) << 23) + (1 << 23) - low;
        Some(PositMagic {
            es: es as u32,
            c_a: c_a as u32,
            c_b: c_b as u32,
            lo: ((e_lo as u32) << 23) - 1,
            hi: (e_hi as u32) << 23,
        })
    }

    /// The magic constant `M` (as a pattern) of the doubled value with pattern `bits`.
    pub fn magic(&self, bits: u32) -> u32 {
        let e23 = bits & EXP;
        let h = e23 >> self.es;
        let a = h.wrapping_add(self.c_a) as i32;
        let b = self.c_b.wrapping_sub(h) as i32;
        e23.wrapping_add(a.max(b) as u32)
    }

    /// Whether the doubled value with pattern `bits` lies in a binade the form rounds
    /// (zero included).
    pub fn in_range(&self, bits: u32) -> bool {
        let e23 = bits & EXP;
        e23.wrapping_sub(1) >= self.lo && e23 <= self.hi
    }

    /// The doubled value `y` rounded to the posit's doubled grid, or `None` out of range.
    pub fn round(&self, y: f32) -> Option<f32> {
        let bits = y.to_bits();
        self.in_range(bits).then(|| {
            let m = f32::from_bits(self.magic(bits));
            (y + m) - m
        })
    }

    /// The product `x · y` of a doubled `x` rounded to the posit's doubled grid, or `None`
    /// where the f32 product is out of range.
    pub fn mul(&self, x: f32, y: f32) -> Option<f32> {
        let bits = (x * y).to_bits();
        self.in_range(bits).then(|| {
            let m = f32::from_bits(self.magic(bits));
            x.mul_add(y, m) - m
        })
    }
}

/// Steps of a part of a tile that the magic-constant kernels always try.
const TRIAL_STEPS: usize = 16;

/// After [`TRIAL_STEPS`], a kernel keeps trying while at most one step in
/// `1 << REDONE_SHIFT` was redone.
const REDONE_SHIFT: u32 = 3;

/// Whether the steps of one part of a tile are still tried by magic constants: past
/// [`TRIAL_STEPS`] steps with more than one in `2^REDONE_SHIFT` redone, the rest of the
/// part takes the general roundings at once (data mostly outside the uniform binades, as in
/// posit<8,0>'s narrow range). The AVX-512 and AVX2 kernels share it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Trials {
    tried: usize,
    redone: usize,
}

impl Trials {
    /// Whether the next step is tried by magic constants (counted as tried).
    #[inline]
    pub(crate) fn try_next(&mut self) -> bool {
        let pays = self.tried < TRIAL_STEPS || self.redone << REDONE_SHIFT <= self.tried;
        self.tried += usize::from(pays);
        pays
    }

    /// Counts a tried step that left the uniform binades and was redone.
    #[inline]
    pub(crate) fn redo(&mut self) {
        self.redone += 1;
    }
}
