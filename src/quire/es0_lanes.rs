//! The rounding of f32 values to posit<n,0> (`3 <= n <= 8`) by magic constants, eight AVX2
//! lanes at a time: the operand conversion ([`super::int_operand`]) and the output rounding
//! ([`super::quire_i16`]) of the i16 quire GEMM without table look-ups.
//!
//! # The grid
//!
//! posit<n,0> has no exponent bits. A magnitude in the binade `[2^e, 2^(e+1))`, `e >= 0`, has
//! a regime of `e + 2` bits and `f = n - 3 - e` fraction bits, so the spacing of its values
//! is `2^g` with `g = 2e + 3 - n`; every binade below 1 has the spacing `minpos = 2^(2-n)`.
//! The largest value is `maxpos = 2^(n-2)`. Rounding to the nearest value, ties to the even
//! pattern, is rounding to the nearest multiple of the spacing, ties to the even multiple
//! (the pattern's last bit is the last fraction bit, the multiple's parity), with two
//! exceptions at the ends and one tie:
//!
//! * nonzero magnitudes below `minpos` round to `minpos` (a posit never rounds to zero),
//!   magnitudes above `maxpos` to `maxpos`;
//! * the top binade `[2^(n-3), maxpos)` has no fraction bits: its values are `2^(n-3)`
//!   (pattern `0 1…1 0`, even) and `maxpos` (`0 1…1`, odd), so its tie `1.5 · 2^(n-3)` goes
//!   down to `2^(n-3)`, the odd multiple of the spacing. (The lowest binade, `[minpos,
//!   2 minpos)`, has none either, but there the patterns' parities are the multiples'.)
//!
//! # The steps, per lane
//!
//! 1. `y = |x|` clamped to `[minpos, maxpos]`, as integers on the f32 bits (which order
//!    like the magnitudes).
//! 2. `M = 1.5 · 2^(23+g)` for `y`'s binade: with `E` the biased exponent field of `y`, the
//!    field of `M` is `2E - 101 - n` (`g = 2(E - 127) + 3 - n`), computed on the bits as
//!    `2 (E << 23) - ((101 + n) << 23) + 2^22` (the doubling may wrap; the result, below
//!    `2^31`, does not), then clamped to the fields of `minpos`'s spacing (`152 - n`, every
//!    binade below 1) and of the top binade's (`150 + n - 3`, which `maxpos` takes too).
//! 3. `r = (y + M) - M`. The sum lies in `M`'s binade `[2^(23+g), 2^(24+g))`, whose spacing
//!    is `2^g`, since `0 <= y < 2^(22+g)` (`y < 2^(e+1)` with `e + 1 <= 22 + g` for
//!    `n <= 24`; `y < 1 <= 2^(24-n)` below 1), so the f32 add rounds `y` to the nearest
//!    multiple of `2^g`, ties to the even one (`M / 2^g = 3 · 2^22` is even); the
//!    subtraction is exact.
//! 4. `r = 2^(n-3)` where `y = 1.5 · 2^(n-3)` (the top binade's tie).
//! 5. The caller puts the sign back and maps zero to 0 (the clamp made it `minpos`) and
//!    NaN and ±Inf to NaR.
//!
//! Eleven vector operations a rounding. The tests compare it with the quantize kernel on
//! every f32 (posit<8,0>, through the operand conversion) and on exact sums.
//!
//! # In the naive GEMM
//!
//! `Es0Ymm` holds the constants in registers for the naive GEMM's AVX2 kernel
//! ([`super::naive_special_avx2`]), whose products and sums are f32 values exact by
//! construction (products of two values have at most `2(n - 2)` significand bits, sums of
//! two values are multiples of `minpos` below `2 maxpos`). Two steps change there:
//!
//! * **`M` by look-up.** The fields of `y` from `1/2` to `maxpos` (at most eight, as
//!   `n <= 8`) differ in their low three bits, so step 2 is one `vpermps` of an
//!   eight-entry table of `M` by the field of `max(y, 1/2)` (every binade below 1 has
//!   `minpos`'s `M`).
//! * **The tie in the table.** The top binade's entry is `M + 2^g`, an odd multiple of the
//!   spacing `2^g`: `y + M'` still rounds to a multiple of `2^g` with ties to the even
//!   multiple, so `y` itself rounds to nearest with ties to the *odd* multiple. The top
//!   binade's multiples are `2^(n-3) = 1 · 2^g` and `maxpos = 2 · 2^g`, so its tie goes to
//!   `2^(n-3)`, as step 4 requires, without a compare and blend. (`maxpos` itself has its
//!   own field and the even `M`; the subtraction of `M'` is exact as before.)
//! * **Sums skip the lower clamp.** A nonzero sum of two values is a multiple of `minpos`,
//!   at least `minpos`; a zero sum keeps magnitude 0, whose `M` is clamped to `minpos`'s
//!   and `(0 + M) - M = +0`. Products keep both clamps and map a zero product to `+0`.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::backend::isa::{self, Isa};
use crate::format::Posit;

/// The constants of the rounding to one posit<n,0> (see the module docs), as f32 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Es0Lanes {
    /// `n`.
    n: u32,
    /// `minpos`.
    minpos: u32,
    /// `maxpos`.
    maxpos: u32,
    /// `(101 + n) << 23` less `2^22`: `M = 2 (E << 23) - k`.
    k: u32,
    /// `M` for the spacing `minpos`.
    m_low: u32,
    /// `M` for the top binade's spacing.
    m_top: u32,
    /// The top binade's tie, `1.5 · 2^(n-3)`.
    tie: u32,
    /// Where that tie goes, `2^(n-3)`.
    tie_to: u32,
}

/// The f32 bits of `2^e` (normal `e`).
const fn pow2_bits(e: i32) -> u32 {
    ((127 + e) as u32) << 23
}

/// The f32 bits of `1.5 · 2^e` (normal `e`).
const fn magic_bits(e: i32) -> u32 {
    pow2_bits(e) | 1 << 22
}

impl Es0Lanes {
    /// The rounding to `posit`, or `None` unless it is posit<n,0> with `3 <= n <= 8`.
    pub fn new(posit: Posit) -> Option<Es0Lanes> {
        let n = posit.n();
        if posit.es() != 0 || !(3..=8).contains(&n) {
            return None;
        }
        let s = n as i32 - 2;
        Some(Es0Lanes {
            n,
            minpos: pow2_bits(-s),
            maxpos: pow2_bits(s),
            k: ((101 + n) << 23) - (1 << 22),
            m_low: magic_bits(23 - s),
            m_top: magic_bits(23 + s - 1),
            tie: magic_bits(s - 1),
            tie_to: pow2_bits(s - 1),
        })
    }

    /// `n` of the posit.
    pub fn n(&self) -> u32 {
        self.n
    }

    /// Whether the vector code runs here (x86-64 with AVX2 active, [`isa::active`]).
    pub fn available() -> bool {
        cfg!(target_arch = "x86_64") && isa::active() >= Isa::Avx2
    }

    /// The same steps on one value, in scalar f32 arithmetic (the definition of the lanes;
    /// NaN and ±Inf give `f32::NAN`).
    pub fn round(&self, x: f32) -> f32 {
        if !x.is_finite() {
            return f32::NAN;
        }
        let mag = x.to_bits() & 0x7fff_ffff;
        if mag == 0 {
            return 0.0;
        }
        let y = mag.clamp(self.minpos, self.maxpos);
        let m = self.magic(y);
        let (yf, mf) = (f32::from_bits(y), f32::from_bits(m));
        let r = if y == self.tie {
            f32::from_bits(self.tie_to)
        } else {
            (yf + mf) - mf
        };
        if x < 0.0 {
            -r
        } else {
            r
        }
    }

    /// Step 2: the magic constant `M` of a magnitude `y` in `[minpos, maxpos]` (f32 bits).
    #[inline]
    fn magic(&self, y: u32) -> u32 {
        ((y & 0x7f80_0000).wrapping_mul(2))
            .wrapping_sub(self.k)
            .clamp(self.m_low, self.m_top)
    }

    /// `R(t · 2^-2s)` of exact sums `t` in units of `minpos^2` (`|t| < 2^53`) into `dst`:
    /// [`Es0Lanes::sum_value`] of each, then [`Es0Lanes::round_in_place`].
    pub fn round_sums(&self, t: &[i64], dst: &mut [f32]) {
        for (d, &v) in dst.iter_mut().zip(t) {
            *d = self.sum_value(v);
        }
        let len = t.len().min(dst.len());
        self.round_in_place(&mut dst[..len]);
    }

    /// An exact sum `t` in units of `minpos^2` (`|t| < 2^53`) as an f32 that rounds as
    /// `t · 2^-2s` does: clamped to `±2^(3s+1)` (beyond `maxpos = 2^3s` units, so it still
    /// saturates), then scaled, both exact.
    #[inline]
    pub fn sum_value(&self, t: i64) -> f32 {
        let (cap, unit) = self.sum_bounds();
        t.clamp(-cap, cap) as f32 * unit
    }

    /// The bounds of [`Es0Lanes::sum_value`]: sums are clamped to `±2^(3s+1)` (beyond
    /// `maxpos = 2^3s` units, and exact in f32), then scaled by the unit `2^-2s`.
    pub fn sum_bounds(&self) -> (i64, f32) {
        let s = self.n as i32 - 2;
        (1i64 << (3 * s + 1), f32::from_bits(pow2_bits(-2 * s)))
    }

    /// Every value of `v` rounded in place (`f32::NAN` for NaN and ±Inf), eight at a time
    /// by the vector code where it runs, else by [`Es0Lanes::round`].
    pub fn round_in_place(&self, v: &mut [f32]) {
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if Es0Lanes::available() {
            done = v.len() - v.len() % 8;
            // SAFETY: AVX2 is active (`available`).
            unsafe { self.round_in_place_avx2(&mut v[..done]) };
        }
        for x in &mut v[done..] {
            *x = self.round(*x);
        }
    }

    /// [`Es0Lanes::round_in_place`] of whole vectors (`v.len()` a multiple of 8).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn round_in_place_avx2(&self, v: &mut [f32]) {
        for c in v.chunks_exact_mut(8) {
            // SAFETY: 8 f32 are read and written.
            unsafe {
                let r = self.round_signed_avx2(_mm256_loadu_si256(c.as_ptr().cast()));
                _mm256_storeu_ps(c.as_mut_ptr(), r);
            }
        }
    }

    /// Steps 1 to 4 on eight magnitudes (f32 bits, below `2^31`): the rounded magnitudes,
    /// `minpos` for 0.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn round_mag_avx2(&self, mag: __m256i) -> __m256 {
        let splat = |v: u32| _mm256_set1_epi32(v as i32);
        let y = _mm256_max_epi32(
            _mm256_min_epi32(mag, splat(self.maxpos)),
            splat(self.minpos),
        );
        let e = _mm256_and_si256(y, splat(0x7f80_0000));
        let m = _mm256_sub_epi32(_mm256_add_epi32(e, e), splat(self.k));
        let m = _mm256_min_epi32(_mm256_max_epi32(m, splat(self.m_low)), splat(self.m_top));
        let (yf, mf) = (_mm256_castsi256_ps(y), _mm256_castsi256_ps(m));
        let r = _mm256_sub_ps(_mm256_add_ps(yf, mf), mf);
        let tie = _mm256_castsi256_ps(_mm256_cmpeq_epi32(y, splat(self.tie)));
        _mm256_blendv_ps(r, _mm256_castsi256_ps(splat(self.tie_to)), tie)
    }

    /// Eight f32 values (bits) rounded with their signs; 0 for ±0, `f32::NAN` for NaN and
    /// ±Inf.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn round_signed_avx2(&self, bits: __m256i) -> __m256 {
        let mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
        let r = _mm256_castps_si256(self.round_mag_avx2(mag));
        let sign = _mm256_andnot_si256(_mm256_set1_epi32(0x7fff_ffff), bits);
        // ±0 to +0.
        let zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
        let r = _mm256_andnot_si256(zero, _mm256_or_si256(r, sign));
        // NaN and ±Inf to the NaR value, f32::NAN (one bit pattern, as elsewhere).
        let nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f7f_ffff));
        let r = _mm256_blendv_epi8(r, _mm256_set1_epi32(f32::NAN.to_bits() as i32), nan);
        _mm256_castsi256_ps(r)
    }

    /// The integers `R(x) · 2^s` of eight f32 values (bits) as i32 lanes, 0 for ±0, NaN
    /// and ±Inf, and the lanes that are NaN or ±Inf (all ones).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn units_avx2(&self, bits: __m256i) -> (__m256i, __m256i) {
        let mag = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
        let nar = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7f7f_ffff));
        let r = self.round_mag_avx2(mag);
        let scale = _mm256_castsi256_ps(_mm256_set1_epi32(pow2_bits(self.n as i32 - 2) as i32));
        // Exact: an integer of at most 2^2s.
        let units = _mm256_cvtps_epi32(_mm256_mul_ps(r, scale));
        let dead = _mm256_or_si256(nar, _mm256_cmpeq_epi32(mag, _mm256_setzero_si256()));
        // `vpsign`: negated where the f32 is negative (its bits are then a negative i32).
        (
            _mm256_sign_epi32(_mm256_andnot_si256(dead, units), bits),
            nar,
        )
    }

    /// [`Es0Lanes::round_mag_avx2`] on sixteen magnitudes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn round_mag_avx512(&self, mag: __m512i) -> __m512 {
        let splat = |v: u32| _mm512_set1_epi32(v as i32);
        let y = _mm512_max_epi32(
            _mm512_min_epi32(mag, splat(self.maxpos)),
            splat(self.minpos),
        );
        let e = _mm512_and_si512(y, splat(0x7f80_0000));
        let m = _mm512_sub_epi32(_mm512_add_epi32(e, e), splat(self.k));
        let m = _mm512_min_epi32(_mm512_max_epi32(m, splat(self.m_low)), splat(self.m_top));
        let (yf, mf) = (_mm512_castsi512_ps(y), _mm512_castsi512_ps(m));
        let r = _mm512_sub_ps(_mm512_add_ps(yf, mf), mf);
        let tie = _mm512_cmpeq_epi32_mask(y, splat(self.tie));
        _mm512_mask_mov_ps(r, tie, _mm512_castsi512_ps(splat(self.tie_to)))
    }

    /// [`Es0Lanes::units_avx2`] on sixteen f32 values (bits): the integers `R(x) · 2^s` as
    /// i32 lanes (0 for ±0, NaN and ±Inf), and the mask of the NaN and ±Inf lanes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn units_avx512(&self, bits: __m512i) -> (__m512i, __mmask16) {
        let mag = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fff_ffff));
        let nar = _mm512_cmpgt_epi32_mask(mag, _mm512_set1_epi32(0x7f7f_ffff));
        let r = self.round_mag_avx512(mag);
        let scale = _mm512_castsi512_ps(_mm512_set1_epi32(pow2_bits(self.n as i32 - 2) as i32));
        // Exact: an integer of at most 2^2s.
        let units = _mm512_cvtps_epi32(_mm512_mul_ps(r, scale));
        let zero = _mm512_setzero_si512();
        let dead = nar | _mm512_cmpeq_epi32_mask(mag, zero);
        let units = _mm512_maskz_mov_epi32(!dead, units);
        // Negated where the f32 is negative (its bits are then a negative i32).
        let negative = _mm512_cmplt_epi32_mask(bits, zero);
        (_mm512_mask_sub_epi32(units, negative, zero, units), nar)
    }
}

/// [`Es0Lanes`]'s constants in AVX2 registers, and its rounding of the naive GEMM's exact
/// products and sums (see "In the naive GEMM" in the module docs).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(crate) struct Es0Ymm {
    abs: __m256i,
    half: __m256i,
    minpos: __m256i,
    maxpos: __m256i,
    /// `M` by the low three bits of the exponent field, for the fields of `1/2 .. maxpos`.
    magic: __m256,
}

#[cfg(target_arch = "x86_64")]
impl Es0Ymm {
    /// The constants of `lanes`.
    #[target_feature(enable = "avx2")]
    pub(crate) fn new(lanes: &Es0Lanes) -> Es0Ymm {
        let splat = |v: u32| _mm256_set1_epi32(v as i32);
        let mut magic = [0u32; 8];
        for field in 126..134u32 {
            magic[(field & 7) as usize] = lanes.magic(field << 23);
        }
        // The top binade's: one spacing more (see the module docs).
        let top = 127 + lanes.n - 3;
        magic[(top & 7) as usize] += 1;
        Es0Ymm {
            abs: splat(0x7fff_ffff),
            half: splat(pow2_bits(-1)),
            minpos: splat(lanes.minpos),
            maxpos: splat(lanes.maxpos),
            // SAFETY: 8 u32 read.
            magic: unsafe { _mm256_castsi256_ps(_mm256_loadu_si256(magic.as_ptr().cast())) },
        }
    }

    /// Steps 2 to 4 on clamped magnitudes `y` (or 0) by the table of `M`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn round_clamped(&self, y: __m256i) -> __m256i {
        let field = _mm256_srli_epi32::<23>(_mm256_max_epi32(y, self.half));
        let mf = _mm256_permutevar8x32_ps(self.magic, field);
        let yf = _mm256_castsi256_ps(y);
        _mm256_castps_si256(_mm256_sub_ps(_mm256_add_ps(yf, mf), mf))
    }

    /// Eight exact finite products rounded with their signs, `+0` for a zero product.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn product(&self, p: __m256) -> __m256 {
        let bits = _mm256_castps_si256(p);
        let mag = _mm256_and_si256(bits, self.abs);
        let y = _mm256_max_epi32(_mm256_min_epi32(mag, self.maxpos), self.minpos);
        let r = _mm256_or_si256(self.round_clamped(y), _mm256_andnot_si256(self.abs, bits));
        let zero = _mm256_cmpeq_epi32(mag, _mm256_setzero_si256());
        _mm256_castsi256_ps(_mm256_andnot_si256(zero, r))
    }

    /// Eight exact sums of two values (neither `-0`) rounded with their signs.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn sum(&self, s: __m256) -> __m256 {
        let bits = _mm256_castps_si256(s);
        let mag = _mm256_and_si256(bits, self.abs);
        let y = _mm256_min_epi32(mag, self.maxpos);
        _mm256_castsi256_ps(_mm256_or_si256(
            self.round_clamped(y),
            _mm256_andnot_si256(self.abs, bits),
        ))
    }
}
