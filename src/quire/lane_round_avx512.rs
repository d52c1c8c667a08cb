//! The specialised roundings of [`super::lane_round`] on 16 f32 lanes at a time (AVX-512),
//! each the same operations as the scalar definition [`LaneRound::round`] lane by lane:
//! integer rounding of the pattern (`Wide`), the magic-constant addition (`Narrow`), the
//! hardware's nearest-even conversion to half precision and back (`Narrow` for IEEE
//! binary16: IEEE 754's correctly rounded conversion, so the same value as the addition),
//! and the posit tables looked up with `vpermt2d`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lane_round::LaneRound;
use crate::backend::isa::{self, Isa};

/// A specialised rounding's constants in registers: a shift count and six vectors, whose
/// meaning depends on the kind (a plain struct, so that a kernel keeps them in registers).
///
/// * `WIDE`: count `s`; `half = 2^(s-1) - 1`, `mask = !(2^s - 1)`.
/// * `NARROW`: `e_lo`, `e_hi`, `shift`, `limit`, `over` (see [`LaneRound::Narrow`]).
/// * `HALF`: none.
/// * `POSIT`: count `23 + es`; `t_lo`, `t_hi`, the increments (entries 0-15, 16-31) and
///   the masks (the same).
#[derive(Clone, Copy)]
pub(crate) struct Zmm {
    count: __m128i,
    v: [__m512i; 6],
}

/// Which rounding a [`Zmm`] is, as a constant for the kernels' type parameters.
pub(crate) const WIDE: u8 = 0;
/// See [`WIDE`].
pub(crate) const NARROW: u8 = 1;
/// See [`WIDE`].
pub(crate) const HALF: u8 = 2;
/// See [`WIDE`].
pub(crate) const POSIT: u8 = 3;
/// [`POSIT`] on doubled values, with the same constants: the input is `2x` and the output
/// `2 round(x)`. For every `x` whose double is a normal f32, the pattern of `2|x|` is that
/// of `|x|` plus `2^23` (the exponent field one higher), which is the posit rounding's `t`;
/// so `t` is read from the input, and the rounded `t` is the result, without adding and
/// subtracting `2^23`. A posit GEMM whose operands are doubled once (one factor of each
/// product) keeps every product and sum doubled, exactly (see [`super::naive_special`]).
pub(crate) const POSIT_RAISED: u8 = 6;
/// [`POSIT_RAISED`] for the sums of two values of the posit: without the lower clamp and
/// the zero test. Every value of a posit is a multiple of its minpos, so such a sum is `+0`
/// or at least minpos in magnitude (also rounded to odd: minpos is an f32), where the lower
/// clamp changes nothing; `+0` is `t = 0`, whose table entry (index 0) keeps it: every
/// entry's increment is below its `2^s`, so `(0 + h + 0) & mask = 0`.
pub(crate) const POSIT_SUM: u8 = 5;

#[target_feature(enable = "avx512f")]
#[inline]
fn splat(v: u32) -> __m512i {
    _mm512_set1_epi32(v as i32)
}

#[target_feature(enable = "avx512f")]
fn table(t: &[u32; 32]) -> [__m512i; 2] {
    // SAFETY: the loads read 16 u32 each from inside the array.
    unsafe {
        [
            _mm512_loadu_si512(t.as_ptr().cast()),
            _mm512_loadu_si512(t[16..].as_ptr().cast()),
        ]
    }
}

/// The kind of a specialised rounding ([`WIDE`], [`NARROW`], [`HALF`] or [`POSIT`]),
/// binary16 taking the conversion where `hardware_half`; the same for the AVX-512 and AVX2
/// lanes.
pub(crate) fn kind_of(r: &LaneRound, hardware_half: bool) -> u8 {
    match r {
        LaneRound::Wide(_) => WIDE,
        LaneRound::Narrow(_) if r.is_binary16() && hardware_half => HALF,
        LaneRound::Narrow(_) => NARROW,
        LaneRound::Posit(_) => POSIT,
    }
}

impl Zmm {
    /// The registers of `r` for its kind ([`kind_of`]).
    #[target_feature(enable = "avx512f")]
    pub(crate) fn new(r: &LaneRound) -> Zmm {
        if let Some((count, c)) = r.float_lanes() {
            return Zmm {
                count: _mm_cvtsi32_si128(count as i32),
                v: [
                    splat(c[0]),
                    splat(c[1]),
                    splat(c[2]),
                    splat(c[3]),
                    splat(c[4]),
                    _mm512_setzero_si512(),
                ],
            };
        }
        let LaneRound::Posit(p) = r else {
            unreachable!("float roundings have lane constants")
        };
        let [h0, h1] = table(&p.half);
        let [m0, m1] = table(&p.mask);
        Zmm {
            count: _mm_cvtsi32_si128(p.shift as i32),
            v: [splat(p.t_lo), splat(p.t_hi), h0, h1, m0, m1],
        }
    }

    /// No constants ([`HALF`], or a rounding that is not used).
    #[target_feature(enable = "avx512f")]
    pub(crate) fn none() -> Zmm {
        Zmm {
            count: _mm_setzero_si128(),
            v: [_mm512_setzero_si512(); 6],
        }
    }
}

/// `x` (16 f32 patterns) rounded by `r`, whose kind is `KIND` (see [`Zmm::new`]).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
#[inline]
pub(crate) fn round<const KIND: u8>(r: &Zmm, x: __m512i) -> __m512i {
    const ABS: u32 = 0x7fff_ffff;
    const EXP: u32 = 0x7f80_0000;
    const RAISE: u32 = 1 << 23;
    // ternary-logic immediate of `a | (b & c)`.
    const OR_AND: i32 = 0xf8;
    let v = &r.v;
    match KIND {
        WIDE => {
            let odd = _mm512_and_si512(_mm512_srl_epi32(x, r.count), splat(1));
            let up = _mm512_add_epi32(_mm512_add_epi32(x, v[0]), odd);
            let xf = _mm512_castsi512_ps(x);
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(xf, xf);
            _mm512_mask_mov_epi32(_mm512_and_si512(up, v[1]), nan, x)
        }
        HALF => {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_castsi512_ps(x),
            );
            _mm512_castps_si512(_mm512_cvtph_ps(h))
        }
        NARROW => {
            let abs = _mm512_and_si512(x, splat(ABS));
            let e = _mm512_and_si512(x, splat(EXP));
            let e = _mm512_min_epu32(_mm512_max_epu32(e, v[0]), v[1]);
            let c = _mm512_castsi512_ps(_mm512_add_epi32(e, v[2]));
            let r = _mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(abs), c), c);
            let r = _mm512_castps_si512(r);
            let r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(r, v[3]), v[4]);
            _mm512_ternarylogic_epi32::<OR_AND>(r, x, splat(!ABS))
        }
        _ => {
            let raised = KIND != POSIT;
            let abs = _mm512_and_si512(x, splat(ABS));
            let t = if raised {
                abs
            } else {
                _mm512_add_epi32(abs, splat(RAISE))
            };
            let t = if KIND == POSIT_SUM {
                t
            } else {
                _mm512_max_epi32(t, v[0])
            };
            let t = _mm512_min_epi32(t, v[1]);
            let i = _mm512_srl_epi32(t, r.count);
            let h = _mm512_permutex2var_epi32(v[2], i, v[3]);
            let m = _mm512_permutex2var_epi32(v[4], i, v[5]);
            // Bit s of t, the lowest bit the mask keeps.
            let odd = _mm512_test_epi32_mask(t, _mm512_sub_epi32(_mm512_setzero_si512(), m));
            let up = _mm512_add_epi32(t, h);
            let up = _mm512_mask_add_epi32(up, odd, up, splat(1));
            let r = _mm512_and_si512(up, m);
            let r = if raised {
                r
            } else {
                _mm512_sub_epi32(r, splat(RAISE))
            };
            if KIND == POSIT_SUM {
                _mm512_ternarylogic_epi32::<OR_AND>(r, x, splat(!ABS))
            } else {
                let nonzero = _mm512_test_epi32_mask(abs, abs);
                _mm512_maskz_ternarylogic_epi32::<OR_AND>(nonzero, r, x, splat(!ABS))
            }
        }
    }
}

/// Rounds `src` into `dst` with the AVX-512 lanes of `r` (16 at a time, the tail padded),
/// `kind` overriding the rounding's own (`POSIT_RAISED` or `POSIT_SUM` on doubled values),
/// `hardware_half` choosing the conversion for binary16; false where this CPU (or the cap
/// of [`isa::set_cap`]) has no AVX-512 and nothing was written. For the tests, through
/// [`super::lane_round::round_run`].
pub(crate) fn round_run_kind(
    r: &LaneRound,
    kind: Option<u8>,
    hardware_half: bool,
    src: &[f32],
    dst: &mut [f32],
) -> bool {
    if isa::active() != Isa::Avx512 {
        return false;
    }
    // SAFETY: AVX-512 F/BW/DQ/VL are present (checked above).
    unsafe { round_run_avx512_kind(r, kind, hardware_half, src, dst) };
    true
}

/// The rounds of [`round_run_kind`].
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn round_run_avx512_kind(
    r: &LaneRound,
    kind: Option<u8>,
    hardware_half: bool,
    src: &[f32],
    dst: &mut [f32],
) {
    let z = Zmm::new(r);
    let kind = kind.unwrap_or_else(|| kind_of(r, hardware_half));
    for (s, d) in src.chunks(16).zip(dst.chunks_mut(16)) {
        let mut lanes = [0u32; 16];
        for (l, &v) in lanes.iter_mut().zip(s) {
            *l = v.to_bits();
        }
        // SAFETY: 16 u32 are read from and written to the local array.
        let x = unsafe { _mm512_loadu_si512(lanes.as_ptr().cast()) };
        let y = match kind {
            WIDE => round::<WIDE>(&z, x),
            NARROW => round::<NARROW>(&z, x),
            HALF => round::<HALF>(&z, x),
            POSIT_SUM => round::<POSIT_SUM>(&z, x),
            POSIT_RAISED => round::<POSIT_RAISED>(&z, x),
            _ => round::<POSIT>(&z, x),
        };
        // SAFETY: as above.
        unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), y) };
        for (o, &l) in d.iter_mut().zip(&lanes) {
            *o = f32::from_bits(l);
        }
    }
}
