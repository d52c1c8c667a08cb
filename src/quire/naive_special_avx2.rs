//! The naive GEMM's register kernel with specialised roundings ([`super::naive_special`]) on
//! AVX2 with F16C: the same definition, the same kinds of tile and the same checks for Inf
//! and NaN, 8 lanes a register ([`super::lane_round_avx2`]). Its forms, where they differ from
//! the AVX-512 kernel's and where they share them:
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
//! * **`naive` in a posit by magic constants** (posit<16,1>, posit<16,2>, ... with plain
//!   sums, `kernel_magic`): each product is `fma(x, y, M) - M` and each sum
//!   `(s + M) - M`, with `M` from the value's exponent field in seven integer operations
//!   ([`super::posit_magic`], whose docs prove it the posit rounding in every binade with a
//!   uniform grid), against about twenty for the integer rounding of the pattern and the
//!   step to odd of the product (the AVX-512 kernel has the same form). A step whose products or sums leave those binades (values
//!   next to minpos or maxpos, where exponent bits are cut) is redone from the sums before
//!   it with the general roundings: every step ends with the definition's sums. A tile of
//!   more than 32 outputs runs as one part of eight registers (eight independent sums a
//!   step, whose latency the step's throughput then hides), a narrower one in halves of
//!   four, so that no padding is computed.
//! * **`naive` in posit<n,0>, `n <= 8`, by magic constants in every binade**
//!   (`kernel_es0`): without exponent bits every binade's grid is uniform, and the clamps
//!   to minpos and maxpos and the top binade's tie are a few integer operations more
//!   ([`super::es0_lanes`]), so no step is redone: the exact product `x · y` (values of at
//!   most six significand bits) and the exact sum are each rounded in about fifteen
//!   operations, values not doubled. The tile runs in parts as above (the same loop,
//!   `in_parts`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::es0_lanes::{Es0Lanes, Es0Ymm};
use super::lane_round::LaneRound;
use super::lane_round_avx2::{has_f16c, round, Ymm};
use super::lane_round_avx512::{HALF, NARROW, POSIT, POSIT_RAISED, POSIT_SUM, WIDE};
use super::naive_lanes::{Products, TILE};
use super::naive_special::{run_kernel, Kinds, SumLanes, BINARY32, EXACT, FUSED, ROUNDED};
use super::posit_magic::{PositMagic, Trials};

/// Registers of f32 in a tile.
const REGS: usize = TILE / 8;

/// Registers of f32 in a part of the tile of [`kernel_magic`] and [`kernel_es0`]: the
/// whole tile at once (eight independent sums a step), or halves where the tile's outputs
/// fit in one ([`NARROW_WIDTH`]), so that no padding is computed.
const WIDE_REGS: usize = 8;

/// See [`WIDE_REGS`].
const NARROW_REGS: usize = 4;

/// Widths up to this run in parts of [`NARROW_REGS`].
const NARROW_WIDTH: usize = 8 * NARROW_REGS;

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
            let term = product::<OP, PROD>(&op, xv, y);
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
    let mut special = 0;
    for r in 0..REGS {
        special |= store_sums(c[r], &mut acc[8 * r..8 * r + 8]);
        special |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(flag[r], flag[r]));
    }
    special == 0
}

/// The term `x · y` of a step: exact (`FUSED`), or rounded by `op` (of kind `OP`) from the
/// product exact in f32 (`EXACT`) or rounded to odd (`ROUNDED`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
fn product<const OP: u8, const PROD: u8>(op: &Ymm, x: __m256, y: __m256) -> __m256 {
    match PROD {
        FUSED => _mm256_mul_ps(x, y),
        _ => {
            let odd = if PROD == EXACT {
                _mm256_castps_si256(_mm256_mul_ps(x, y))
            } else {
                mul_odd(x, y)
            };
            _mm256_castsi256_ps(round::<OP>(op, odd))
        }
    }
}

/// Stores 8 finished sums into `dst`; nonzero where one is Inf or NaN (the exponent field
/// all ones).
#[target_feature(enable = "avx2")]
#[inline]
fn store_sums(v: __m256, dst: &mut [f32]) -> i32 {
    let exp = _mm256_set1_epi32(0x7f80_0000);
    let field = _mm256_and_si256(_mm256_castps_si256(v), exp);
    assert!(dst.len() >= 8);
    // SAFETY: 8 f32 written inside `dst` (asserted).
    unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) };
    _mm256_movemask_epi8(_mm256_cmpeq_epi32(field, exp))
}

/// [`PositMagic`]'s constants in registers.
#[derive(Clone, Copy)]
struct MagicYmm {
    exp: __m256i,
    c_a: __m256i,
    c_b: __m256i,
    lo: __m256i,
    hi: __m256i,
    es: __m128i,
}

impl MagicYmm {
    #[target_feature(enable = "avx2")]
    fn new(m: &PositMagic) -> MagicYmm {
        MagicYmm {
            exp: _mm256_set1_epi32(0x7f80_0000),
            c_a: _mm256_set1_epi32(m.c_a as i32),
            c_b: _mm256_set1_epi32(m.c_b as i32),
            lo: _mm256_set1_epi32(m.lo as i32),
            hi: _mm256_set1_epi32(m.hi as i32),
            es: _mm_cvtsi32_si128(m.es as i32),
        }
    }

    /// The magic constant of each lane of `v` ([`PositMagic::magic`]), its exponent field
    /// folded into the step's running minimum of `E23 - 1` and maximum of `E23`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn magic(&self, v: __m256, lo: &mut __m256i, hi: &mut __m256i) -> __m256 {
        let e = _mm256_and_si256(_mm256_castps_si256(v), self.exp);
        *lo = _mm256_min_epu32(*lo, _mm256_add_epi32(e, _mm256_set1_epi32(-1)));
        *hi = _mm256_max_epu32(*hi, e);
        let h = _mm256_srl_epi32(e, self.es);
        let a = _mm256_add_epi32(h, self.c_a);
        let b = _mm256_sub_epi32(self.c_b, h);
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_max_epi32(a, b)))
    }

    /// Whether every value a step folded into `lo` and `hi` was in range
    /// ([`PositMagic::in_range`]).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn in_range(&self, lo: __m256i, hi: __m256i) -> bool {
        let lo_ok = _mm256_cmpeq_epi32(_mm256_max_epu32(lo, self.lo), lo);
        let hi_ok = _mm256_cmpeq_epi32(_mm256_min_epu32(hi, self.hi), hi);
        _mm256_movemask_epi8(_mm256_and_si256(lo_ok, hi_ok)) == -1
    }
}

/// The tile loop of [`kernel_magic`] and [`kernel_es0`]: the tile's first `width` columns
/// (padding past them not computed, its sums left 0) in parts of `R` registers, each
/// part's sums held in registers through the whole of `a`. Per part, `part()` gives the
/// step, which takes the sums from zero through every nonzero `a_t` (a zero one leaves
/// them as they are: `c + 0 = c`, a value of the format) with the part's slice of row `t`
/// of `b`; each final sum is stored as `finish(c)`. Returns whether none is Inf or NaN.
#[target_feature(enable = "avx2")]
#[inline]
fn in_parts<const R: usize, S>(
    a: &[f32],
    b: &[f32],
    (stride, width): (usize, usize),
    acc: &mut [f32; TILE],
    mut part: impl FnMut() -> S,
    finish: impl Fn(__m256) -> __m256,
) -> bool
where
    S: FnMut(&mut [__m256; R], f32, &[f32]),
{
    let mut special = 0;
    let parts = width.div_ceil(8 * R).min(REGS / R);
    acc[parts * 8 * R..].fill(0.0);
    for p in 0..parts {
        let mut step = part();
        let mut c = [_mm256_setzero_ps(); R];
        for (t, &x) in a.iter().enumerate() {
            if x != 0.0 {
                let start = t * stride + p * 8 * R;
                step(&mut c, x, &b[start..start + 8 * R]);
            }
        }
        for (r, v) in c.iter().enumerate() {
            let at = p * 8 * R + 8 * r;
            special |= store_sums(finish(*v), &mut acc[at..at + 8]);
        }
    }
    special == 0
}

/// The kernel of `naive` in a posit with plain sums ([`Kinds`] `POSIT_RAISED`,
/// `POSIT_SUM`, products `PROD`), each product and sum rounded by its magic constant
/// ([`super::posit_magic`]): `fma(x, y, M) - M` and `(s + M) - M`, in parts of `R`
/// registers ([`in_parts`]). A step (one `a_t` against the part's row) with a product or
/// sum out of the form's range is redone with the general roundings from the sums before
/// it.
#[target_feature(enable = "avx2,fma,f16c")]
fn kernel_magic<const PROD: u8, const R: usize>(
    magic: &PositMagic,
    op: &Ymm,
    a: &[f32],
    b: &[f32],
    tile: (usize, usize),
    acc: &mut [f32; TILE],
) -> bool {
    let op = *op;
    let mg = MagicYmm::new(magic);
    let part = || {
        let mut trials = Trials::default();
        move |c: &mut [__m256; R], x: f32, row: &[f32]| {
            // Doubled values (see [`super::naive_special`]).
            let xv = _mm256_set1_ps(2.0 * x);
            if trials.try_next() {
                let mut lo = _mm256_set1_epi32(-1);
                let mut hi = _mm256_setzero_si256();
                let mut next = *c;
                for (r, c) in next.iter_mut().enumerate() {
                    // SAFETY: 8 f32 read from inside the row.
                    let y = unsafe { _mm256_loadu_ps(row[8 * r..].as_ptr()) };
                    let m = mg.magic(_mm256_mul_ps(xv, y), &mut lo, &mut hi);
                    let p = _mm256_sub_ps(_mm256_fmadd_ps(xv, y, m), m);
                    let s = _mm256_add_ps(*c, p);
                    let m = mg.magic(s, &mut lo, &mut hi);
                    *c = _mm256_sub_ps(_mm256_add_ps(s, m), m);
                }
                if mg.in_range(lo, hi) {
                    *c = next;
                    return;
                }
                trials.redo();
            }
            for (r, c) in c.iter_mut().enumerate() {
                // SAFETY: as above.
                let y = unsafe { _mm256_loadu_ps(row[8 * r..].as_ptr()) };
                let term = product::<POSIT_RAISED, PROD>(&op, xv, y);
                let s = _mm256_castps_si256(_mm256_add_ps(*c, term));
                *c = _mm256_castsi256_ps(round::<POSIT_SUM>(&op, s));
            }
        }
    };
    // None special with finite operands; checked as the other kernels do.
    in_parts(a, b, tile, acc, part, |v| {
        _mm256_mul_ps(v, _mm256_set1_ps(0.5))
    })
}

/// The kernel of `naive` in posit<n,0> (`n <= 8`; [`Kinds`] with the same rounding for
/// products and sums, products exact in f32): from `c = 0`, `c = S(c + P(a_t · y))` with
/// `P` and `S` [`Es0Ymm`]'s roundings, which cover every finite value, so every step runs
/// in registers, in parts of `R` registers ([`in_parts`]).
#[target_feature(enable = "avx2,fma")]
fn kernel_es0<const R: usize>(
    lanes: &Es0Lanes,
    a: &[f32],
    b: &[f32],
    tile: (usize, usize),
    acc: &mut [f32; TILE],
) -> bool {
    let round = Es0Ymm::new(lanes);
    let part = || {
        |c: &mut [__m256; R], x: f32, row: &[f32]| {
            let xv = _mm256_set1_ps(x);
            for (r, c) in c.iter_mut().enumerate() {
                // SAFETY: 8 f32 read from inside the row.
                let y = unsafe { _mm256_loadu_ps(row[8 * r..].as_ptr()) };
                let p = round.product(_mm256_mul_ps(xv, y));
                *c = round.sum(_mm256_add_ps(*c, p));
            }
        }
    };
    // None special with finite operands; checked as the other kernels do.
    in_parts(a, b, tile, acc, part, |v| v)
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
    (stride, width): (usize, usize),
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
    if let Some(LaneRound::Posit(p)) = op {
        if let (Some(lanes), true) = (&p.es0, kinds.same && !kinds.check && kinds.prod == EXACT) {
            let tile = (stride, width);
            return Some(if width <= NARROW_WIDTH {
                kernel_es0::<NARROW_REGS>(lanes, a, b, tile, acc)
            } else {
                kernel_es0::<WIDE_REGS>(lanes, a, b, tile, acc)
            });
        }
    }
    let magic = match op {
        Some(LaneRound::Posit(p)) if kinds.same && kinds.plain_sums && !kinds.check => p.magic,
        _ => None,
    };
    if let (Some(m), POSIT_RAISED) = (magic, kinds.op) {
        return Some(match kinds.prod {
            EXACT if width <= NARROW_WIDTH => {
                kernel_magic::<EXACT, NARROW_REGS>(&m, o, a, b, (stride, width), acc)
            }
            EXACT => kernel_magic::<EXACT, WIDE_REGS>(&m, o, a, b, (stride, width), acc),
            _ if width <= NARROW_WIDTH => {
                kernel_magic::<ROUNDED, NARROW_REGS>(&m, o, a, b, (stride, width), acc)
            }
            _ => kernel_magic::<ROUNDED, WIDE_REGS>(&m, o, a, b, (stride, width), acc),
        });
    }
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
    (stride, width): (usize, usize),
    acc: &mut [f32; TILE],
    operands_finite: bool,
) -> Option<bool> {
    if !has_f16c() {
        return None;
    }
    // SAFETY: the caller checked AVX2 and the fused multiply-add (`isa::active`), F16C is
    // checked above.
    unsafe {
        dispatch(
            op,
            sum,
            products,
            a,
            b,
            (stride, width),
            acc,
            operands_finite,
        )
    }
}
