//! The specialised roundings of [`super::lane_round`] on 8 f32 lanes at a time (AVX2 with
//! F16C), each the same operations as the scalar definition [`LaneRound::round`] lane by
//! lane, as [`super::lane_round_avx512`] computes them on 16: integer rounding of the
//! pattern (`WIDE`), the magic-constant addition (`NARROW`), the hardware's nearest-even
//! conversion to half precision and back (`HALF`), and for posits the per-regime step.
//!
//! AVX2 has no 32-entry table lookup, so the posit kinds compute the step of the regime
//! from `t` in the arithmetic form [`RegimeArith`](super::lane_round::RegimeArith) (a
//! maximum and per-lane shifts), which
//! [`PositTable::new`](super::lane_round::PositTable::new) keeps only where it gives every
//! entry of the table. The kinds `POSIT_RAISED` and `POSIT_SUM` are those of
//! [`super::lane_round_avx512`] (doubled values; sums of two values of the posit).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lane_round::LaneRound;
use super::lane_round_avx512::{kind_of, HALF, NARROW, POSIT, POSIT_RAISED, POSIT_SUM, WIDE};
use crate::backend::isa::{self, Isa};

/// A specialised rounding's constants in registers: a shift count and six vectors, whose
/// meaning depends on the kind (a plain struct, so that a kernel keeps them in registers).
///
/// * `WIDE`: count `s`; `half = 2^(s-1) - 1`, `mask = !(2^s - 1)`.
/// * `NARROW`: `e_lo`, `e_hi`, `shift`, `limit`, `over` (see [`LaneRound::Narrow`]).
/// * `HALF`: none.
/// * `POSIT`: count `23 + es`; `t_lo`, `t_hi - 1` (see [`RegimeArith`](super::lane_round::RegimeArith)), then its `up`,
///   `down` and `flip`.
#[derive(Clone, Copy)]
pub(crate) struct Ymm {
    count: __m128i,
    v: [__m256i; 6],
}

#[target_feature(enable = "avx2")]
#[inline]
fn splat(v: u32) -> __m256i {
    _mm256_set1_epi32(v as i32)
}

/// Whether this CPU converts to and from half precision (F16C), for the `HALF` kind.
pub(crate) fn has_f16c() -> bool {
    std::arch::is_x86_feature_detected!("f16c")
}

impl Ymm {
    /// The registers of `r` for its kind ([`kind_of`]); `None` for a posit whose table has
    /// no arithmetic form.
    #[target_feature(enable = "avx2")]
    pub(crate) fn new(r: &LaneRound) -> Option<Ymm> {
        if let Some((count, c)) = r.float_lanes() {
            return Some(Ymm {
                count: _mm_cvtsi32_si128(count as i32),
                v: [
                    splat(c[0]),
                    splat(c[1]),
                    splat(c[2]),
                    splat(c[3]),
                    splat(c[4]),
                    _mm256_setzero_si256(),
                ],
            });
        }
        let LaneRound::Posit(p) = r else {
            unreachable!("float roundings have lane constants")
        };
        let a = p.arith?;
        Some(Ymm {
            count: _mm_cvtsi32_si128(p.shift as i32),
            v: [
                splat(p.t_lo),
                splat(p.t_hi - 1),
                _mm256_set1_epi32(a.up),
                _mm256_set1_epi32(a.down),
                _mm256_set1_epi32(a.flip),
                _mm256_setzero_si256(),
            ],
        })
    }

    /// No constants ([`HALF`], or a rounding that is not used).
    #[target_feature(enable = "avx2")]
    pub(crate) fn none() -> Ymm {
        Ymm {
            count: _mm_setzero_si128(),
            v: [_mm256_setzero_si256(); 6],
        }
    }
}

/// `x` (8 f32 patterns) rounded by `r`, whose kind is `KIND` (see [`Ymm::new`]).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(crate) fn round<const KIND: u8>(r: &Ymm, x: __m256i) -> __m256i {
    const ABS: u32 = 0x7fff_ffff;
    const EXP: u32 = 0x7f80_0000;
    const RAISE: u32 = 1 << 23;
    let v = &r.v;
    let sign = |r: __m256i| _mm256_or_si256(r, _mm256_andnot_si256(splat(ABS), x));
    match KIND {
        WIDE => {
            let odd = _mm256_and_si256(_mm256_srl_epi32(x, r.count), splat(1));
            let up = _mm256_add_epi32(_mm256_add_epi32(x, v[0]), odd);
            let xf = _mm256_castsi256_ps(x);
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(xf, xf));
            _mm256_blendv_epi8(_mm256_and_si256(up, v[1]), x, nan)
        }
        HALF => {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_castsi256_ps(x));
            _mm256_castps_si256(_mm256_cvtph_ps(h))
        }
        NARROW => {
            let abs = _mm256_and_si256(x, splat(ABS));
            let e = _mm256_and_si256(x, splat(EXP));
            let e = _mm256_min_epu32(_mm256_max_epu32(e, v[0]), v[1]);
            let c = _mm256_castsi256_ps(_mm256_add_epi32(e, v[2]));
            let r = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(abs), c), c);
            let r = _mm256_castps_si256(r);
            // Magnitudes (at most Inf's pattern) compare as signed integers.
            let r = _mm256_blendv_epi8(r, v[4], _mm256_cmpgt_epi32(r, v[3]));
            sign(r)
        }
        _ => {
            let raised = KIND != POSIT;
            let abs = _mm256_and_si256(x, splat(ABS));
            let t = if raised {
                abs
            } else {
                _mm256_add_epi32(abs, splat(RAISE))
            };
            let t = if KIND == POSIT_SUM {
                t
            } else {
                _mm256_max_epi32(t, v[0])
            };
            let t = _mm256_min_epi32(t, v[1]);
            let top = _mm256_srl_epi32(t, r.count);
            let s = _mm256_max_epi32(_mm256_add_epi32(top, v[2]), _mm256_sub_epi32(v[3], top));
            let ones = _mm256_set1_epi32(-1);
            let mask = _mm256_sllv_epi32(ones, s);
            let half = _mm256_srli_epi32::<1>(_mm256_andnot_si256(mask, ones));
            // Bit s of t, inverted where the whole exponent is cut and n is even.
            let flip = _mm256_cmpeq_epi32(s, v[4]);
            let odd = _mm256_and_si256(_mm256_xor_si256(_mm256_srlv_epi32(t, s), flip), splat(1));
            let up = _mm256_add_epi32(_mm256_add_epi32(t, half), odd);
            let r = _mm256_and_si256(up, mask);
            let r = if raised {
                r
            } else {
                _mm256_sub_epi32(r, splat(RAISE))
            };
            if KIND == POSIT_SUM {
                sign(r)
            } else {
                // `+0` where |x| is 0 (`vpsignd` by a nonnegative pattern keeps or zeroes).
                _mm256_sign_epi32(sign(r), abs)
            }
        }
    }
}

/// Rounds `src` into `dst` with the AVX2 lanes of `r` (8 at a time, the tail padded),
/// `kind` overriding the rounding's own (`POSIT_RAISED` or `POSIT_SUM` on doubled values);
/// false where the CPU (or the cap of [`isa::set_cap`]) has no AVX2, the conversion asked
/// for is missing (F16C), or `r` has no AVX2 form (see [`Ymm::new`]). For the tests.
pub(crate) fn round_run_kind(
    r: &LaneRound,
    kind: Option<u8>,
    hardware_half: bool,
    src: &[f32],
    dst: &mut [f32],
) -> bool {
    if isa::active() < Isa::Avx2 || !has_f16c() {
        return false;
    }
    // SAFETY: AVX2 and F16C are present (checked above).
    unsafe { round_run_avx2(r, kind, hardware_half, src, dst) }
}

#[target_feature(enable = "avx2,f16c")]
fn round_run_avx2(
    r: &LaneRound,
    kind: Option<u8>,
    hardware_half: bool,
    src: &[f32],
    dst: &mut [f32],
) -> bool {
    let Some(y) = Ymm::new(r) else {
        return false;
    };
    let kind = kind.unwrap_or_else(|| kind_of(r, hardware_half));
    for (s, d) in src.chunks(8).zip(dst.chunks_mut(8)) {
        let mut lanes = [0u32; 8];
        for (l, &v) in lanes.iter_mut().zip(s) {
            *l = v.to_bits();
        }
        // SAFETY: 8 u32 are read from and written to the local array.
        let x = unsafe { _mm256_loadu_si256(lanes.as_ptr().cast()) };
        let out = match kind {
            WIDE => round::<WIDE>(&y, x),
            NARROW => round::<NARROW>(&y, x),
            HALF => round::<HALF>(&y, x),
            POSIT_SUM => round::<POSIT_SUM>(&y, x),
            POSIT_RAISED => round::<POSIT_RAISED>(&y, x),
            _ => round::<POSIT>(&y, x),
        };
        // SAFETY: as above.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), out) };
        for (o, &l) in d.iter_mut().zip(&lanes) {
            *o = f32::from_bits(l);
        }
    }
    true
}
