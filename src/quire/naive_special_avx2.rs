//! The naive GEMM's register kernel with specialised roundings ([`super::naive_special`]) on
//! AVX2 with F16C: the same definition, the same kinds of tile and the same checks for Inf
//! and NaN, 8 lanes a register ([`super::lane_round_avx2`]). Two things differ:
//!
//! * **Round to odd by the error of the operation.** AVX2 has no rounding direction in the
//!   instruction, so the exact result is formed as `hi + lo` by TwoProduct (`hi = x·y`,
//!   `lo = fma(x, y, -hi)`) and TwoSum (six additions), as [`super::naive_lanes`] does, whose
//!   docs prove both exact for these operands. Rounding `hi + lo` to odd is truncation
//!   toward zero with a sticky bit: where `lo` is nonzero with the opposite sign of `hi`,
//!   the exact value lies below `hi` in magnitude and its truncation is the pattern `hi - 1`
//!   (same sign, next magnitude down: `hi` is a normal f32 and the result stays one), else
//!   it is `hi`; the sticky bit (pattern `| 1`) is set where `lo` is nonzero. An exact zero
//!   sum is `+0` as in round-to-nearest. Where `hi` is Inf or NaN, `lo` is NaN and the
//!   result is `hi`: a lane that overflows ends Inf or NaN here where the AVX-512 kernel
//!   carries the largest finite value, and either way such lanes leave their tile to the
//!   scalar definition (the roundings that can meet them keep specials, see
//!   [`super::naive_special`]).
//! * **Plain sums** (as in the AVX-512 kernel): where the native f32 sum rounded to the
//!   accumulator is the correctly rounded sum
//!   ([`super::lane_round::LaneRound::rounds_plain_sums`]: `naive` in posit<16,1>,
//!   posit<8,0>, e4m3, e5m2 or fp16, `naive:fp16` and `naive:bf16` on e4m3 or e5m2), one
//!   add instead of TwoSum and the step to odd (thirteen operations).
//! * **Posit steps by arithmetic.** The posit kinds compute each regime's step from `t`
//!   ([`super::lane_round::RegimeArith`]); a posit without that form takes the general
//!   kernel.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lane_round::LaneRound;
use super::lane_round_avx2::{has_f16c, round, Ymm};
use super::lane_round_avx512::{HALF, NARROW, POSIT, POSIT_RAISED, POSIT_SUM, WIDE};
use super::naive_lanes::{Products, TILE};
use super::naive_special::{run_kernel, Kinds, SumLanes, BINARY32, EXACT, FUSED, ROUNDED};

/// Registers of f32 in a tile.
const REGS: usize = TILE / 8;

/// `hi + lo` (exact, `|lo|` at most half an ulp of `hi`) rounded to odd at f32 precision
/// (see the module docs).
#[target_feature(enable = "avx2")]
#[inline]
fn to_odd(hi: __m256, lo: __m256) -> __m256i {
    let inexact = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_NEQ_OQ>(lo, _mm256_setzero_ps()));
    let (hi, lo) = (_mm256_castps_si256(hi), _mm256_castps_si256(lo));
    // -1 where lo's sign is not hi's: the truncation is one step down in magnitude.
    let below = _mm256_srai_epi32::<31>(_mm256_xor_si256(hi, lo));
    let truncated = _mm256_add_epi32(hi, _mm256_and_si256(below, inexact));
    _mm256_or_si256(truncated, _mm256_srli_epi32::<31>(inexact))
}

/// `x · y` rounded to odd at f32 precision (TwoProduct).
#[target_feature(enable = "avx2,fma")]
#[inline]
fn mul_odd(x: __m256, y: __m256) -> __m256i {
    let hi = _mm256_mul_ps(x, y);
    to_odd(hi, _mm256_fmsub_ps(x, y, hi))
}

/// `x + y` rounded to odd at f32 precision (TwoSum). NaN stays NaN, Inf stays Inf.
#[target_feature(enable = "avx2")]
#[inline]
fn add_odd(x: __m256, y: __m256) -> __m256i {
    let s = _mm256_add_ps(x, y);
    let yy = _mm256_sub_ps(s, x);
    let lo = _mm256_add_ps(_mm256_sub_ps(x, _mm256_sub_ps(s, yy)), _mm256_sub_ps(y, yy));
    to_odd(s, lo)
}

/// Whether `a` and the tile's rows of `b` are all finite.
#[target_feature(enable = "avx2,fma")]
fn finite_operands(a: &[f32], b: &[f32], stride: usize) -> bool {
    if !a.iter().all(|x| x.is_finite()) {
        return false;
    }
    // `y · 0 + flag` is NaN once some y was Inf or NaN.
    let zero = _mm256_setzero_ps();
    let mut flag = [zero; REGS];
    for t in 0..a.len() {
        let row = &b[t * stride..t * stride + TILE];
        for (r, f) in flag.iter_mut().enumerate() {
            // SAFETY: 8 f32 read from inside the row.
            let y = unsafe { _mm256_loadu_ps(row[8 * r..].as_ptr()) };
            *f = _mm256_fmadd_ps(y, zero, *f);
        }
    }
    flag.iter()
        .all(|&f| _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(f, f)) == 0)
}

/// The tile loop of [`super::naive_special`]'s kernel with the same type parameters, on 8
/// lanes a register; `PLAIN_SUMS`: the sums are the native add ([`LaneRound::rounds_plain_sums`]).
#[target_feature(enable = "avx2,fma,f16c")]
fn kernel<
    const OP: u8,
    const SUM: u8,
    const PROD: u8,
    const CHECK: bool,
    const SAME: bool,
    const PLAIN_SUMS: bool,
>(
    op: &Ymm,
    sum: &Ymm,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    // Copies, kept in registers.
    let op = *op;
    let sum = if SAME { op } else { *sum };
    // Posit products and sums in doubled values (see [`super::naive_special`]).
    let doubled = OP == POSIT_RAISED;
    let zero = _mm256_setzero_ps();
    let mut c = [zero; REGS];
    let mut flag = [zero; REGS];
    for (t, &x) in a.iter().enumerate() {
        let row: &[f32; TILE] = b[t * stride..t * stride + TILE]
            .try_into()
            .expect("a full tile");
        let xv = _mm256_set1_ps(if doubled { 2.0 * x } else { x });
        for r in 0..REGS {
            // SAFETY: 8 f32 read from inside the row.
            let y = unsafe { _mm256_loadu_ps(row[8 * r..].as_ptr()) };
            let term = match PROD {
                FUSED => _mm256_mul_ps(xv, y),
                _ => {
                    let odd = if PROD == EXACT {
                        _mm256_castps_si256(_mm256_mul_ps(xv, y))
                    } else {
                        mul_odd(xv, y)
                    };
                    _mm256_castsi256_ps(round::<OP>(&op, odd))
                }
            };
            c[r] = if SUM == BINARY32 {
                _mm256_add_ps(c[r], term)
            } else {
                let odd = if PLAIN_SUMS {
                    _mm256_castps_si256(_mm256_add_ps(c[r], term))
                } else {
                    add_odd(c[r], term)
                };
                if CHECK {
                    // `odd · 0 + flag` is NaN once odd was Inf or NaN.
                    flag[r] = _mm256_fmadd_ps(_mm256_castsi256_ps(odd), zero, flag[r]);
                }
                _mm256_castsi256_ps(round::<SUM>(&sum, odd))
            };
        }
    }
    if doubled {
        for v in &mut c {
            *v = _mm256_mul_ps(*v, _mm256_set1_ps(0.5));
        }
    }
    let exp = _mm256_set1_epi32(0x7f80_0000);
    let mut special = 0;
    for r in 0..REGS {
        // Inf or NaN: the exponent field all ones.
        let field = _mm256_and_si256(_mm256_castps_si256(c[r]), exp);
        special |= _mm256_movemask_epi8(_mm256_cmpeq_epi32(field, exp));
        special |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(flag[r], flag[r]));
        // SAFETY: 8 f32 written inside the tile.
        unsafe { _mm256_storeu_ps(acc[8 * r..].as_mut_ptr(), c[r]) };
    }
    special == 0
}

/// The kernel for the run-time kinds, on an AVX2 CPU with F16C.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn dispatch(
    op: Option<&LaneRound>,
    sum: SumLanes<'_>,
    products: Products,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
    operands_finite: bool,
) -> Option<bool> {
    let kinds = Kinds::new(op, sum, products, true)?;
    let op_ymm = match op {
        Some(r) => Ymm::new(r)?,
        None => Ymm::none(),
    };
    let sum_ymm = match sum {
        SumLanes::Round(r) => Ymm::new(r)?,
        SumLanes::Binary32 => Ymm::none(),
    };
    if !operands_finite && !finite_operands(a, b, stride) {
        return Some(false);
    }
    let (o, s) = (&op_ymm, &sum_ymm);
    Some(run_kernel!(kernel, kinds, (o, s, a, b, stride, acc)))
}

/// [`super::naive_special::tile`] on AVX2 (the caller has found the CPU, or its cap, to be
/// AVX2 with the fused multiply-add): `None` without F16C, where a posit rounding has no
/// arithmetic form, or for a combination no kernel serves.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    op: Option<&LaneRound>,
    sum: SumLanes<'_>,
    products: Products,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
    operands_finite: bool,
) -> Option<bool> {
    if !has_f16c() {
        return None;
    }
    // SAFETY: the caller checked AVX2 and the fused multiply-add (`isa::active`), F16C is
    // checked above.
    unsafe { dispatch(op, sum, products, a, b, stride, acc, operands_finite) }
}
