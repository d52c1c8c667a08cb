//! The naive GEMM's register kernel with roundings specialised to the formats
//! ([`super::lane_round`]), written for AVX-512 (and for AVX2 in
//! [`super::naive_special_avx2`], whose differences its docs give): the same definition and
//! the same steps as
//! [`super::naive_lanes`] (whose docs prove that each step is the correctly rounded
//! operation), with the quantize plan's general step replaced by the format's own rounding
//! and the checks for Inf and NaN made cheaper.
//!
//! Each of the [`TILE`] lanes is one output `c_j`: from `c = 0`, for `t` ascending,
//! `c = S(c + P(a_t · b_tj))`, with `P` and `S` the specialised roundings, each rounding to
//! nearest even as [`crate::Format::round`] does (the tests compare them over every class of
//! f32 pattern). As in [`super::naive_lanes`], `P` and `S` are applied to the exact product
//! and sum rounded to odd at f32 precision, which by the round-to-odd argument there gives
//! the correctly rounded product and sum (every value and midpoint of these formats is an
//! f32 whose last bit is 0). The value rounded to odd is formed differently here:
//!
//! * **Round to odd is the odd one of the results rounded up and down.** An exact result
//!   rounds up and down to itself. Of the two f32 neighbours of an inexact finite result,
//!   the patterns differ by one (they have the same sign: sums and products of the
//!   operands admitted never come near zero without being exact, see below), so exactly
//!   one is odd, and rounding to odd picks it. An overflow rounds up and down to the
//!   largest finite value and Inf, and the largest value (odd) is its rounding to odd. An
//!   exact zero sum `x + (-x)` rounds up to `+0` and down to `-0`; the upward one is taken,
//!   the sign rounding toward zero gives (and the definition's f64 sum). So
//!   an operation is two additions or multiplications with the rounding direction in the
//!   instruction, one test of the last bit and one blend: four instructions, against
//!   TwoSum's six operations or the fused remainder of the product, then the step to odd.
//! * **Products.** Where both operands have at most 12 significand bits the product is an
//!   f32 and is used as it is; `fma:<A>` leaves it unrounded. Otherwise the product rounded
//!   to odd as above: it is far above f32's subnormals by the caller's range check, so the
//!   neighbours argument holds.
//! * **Sums.** The sum rounded to odd as above: a sum of two nonzero values of these grids
//!   that is below f32's normal range is exact, and then both directions give it. Where
//!   the native f32 sum rounded to the accumulator is already the correctly rounded sum
//!   ([`LaneRound::rounds_plain_sums`], whose docs give the argument and its check:
//!   floats of at most 11 significand bits, posits such as posit<16,1>; both addends
//!   values of the accumulator), the sum is one add. For posits it holds of the doubled
//!   values below as well: f32's rounding commutes with doubling in its normal range.
//! * **`naive` in a posit: doubled values.** Each `a_t` is doubled once (exact), so every
//!   product, rounded product, sum and rounded sum is the double of the definition's
//!   (scaling by two commutes with every rounding here: the doubled values stay normal
//!   f32, as `2 minpos² >= 2^-124` and `2 maxpos² <= 2^126` for the posits admitted). The
//!   posit rounding of a doubled value reads its `t` from the pattern directly and returns
//!   the rounded double (`POSIT_RAISED` of [`super::lane_round_avx512`]), two integer
//!   operations fewer a rounding, and the sums' rounding, whose addends are both values of
//!   the format, skips the lower clamp and the zero test as well (`POSIT_SUM`). The sums
//!   are halved at the end.
//! * **IEEE binary16.** `S` is the hardware conversion (`vcvtps2ph` with nearest even, then
//!   back), IEEE 754's correctly rounded conversion of the odd value, with binary16's
//!   subnormals and overflow to infinity. Binary32 sums are the native add.
//!
//! # Inf and NaN
//!
//! The tile's operands are checked once (`a` and the tile's rows of `b`, or by the caller
//! once for a whole GEMM); a tile with an
//! Inf or NaN operand (NaR is NaN here) is left to the caller's scalar definition. With
//! finite operands of the formats the caller admits, no product or sum leaves f32's normal
//! range (see [`super::naive_lanes`]): an Inf or NaN can only come from a rounding that
//! overflows (a float format that overflows to Inf or NaN, [`LaneRound::keeps_specials`]).
//! Such roundings keep what they produce: every input that is Inf, NaN or past the
//! overflow threshold gives Inf or NaN, and so do the sums and products of an Inf or NaN
//! rounded to odd (Inf plus a finite value is Inf in both rounding directions, and NaN
//! gives NaN in both). So a lane whose value became special
//! through such roundings is special at the end, and a special final sum hands the tile
//! to the scalar definition. Only where the sums clamp (posits, saturating floats) while
//! the products may overflow (e4m3 products into posit sums) is the sum's input checked at
//! every step (`odd · 0 + flag` is NaN once `odd` was Inf or NaN, one fused multiply-add).
//! So the tile is reported done only when every step ran on finite values, and then every
//! step is the correct operation.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::lane_round::LaneRound;
use super::lane_round_avx512::{
    kind_of, round, Zmm, HALF, NARROW, POSIT, POSIT_RAISED, POSIT_SUM, WIDE,
};
use super::naive_lanes::{Products, TILE};
use crate::backend::isa::{self, Isa};

/// The accumulator of a tile with specialised roundings.
#[derive(Debug, Clone, Copy)]
pub enum SumLanes<'a> {
    /// Sums rounded by a specialised rounding.
    Round(&'a LaneRound),
    /// IEEE binary32 sums: the native f32 add.
    Binary32,
}

/// The kind of binary32 sums, beside the roundings' kinds.
pub(crate) const BINARY32: u8 = 4;
/// Products rounded to the operand format, rounded to odd first ([`Products::Rounded`]).
pub(crate) const ROUNDED: u8 = 0;
/// Products rounded to the operand format, exact in f32 ([`Products::RoundedExact`]).
pub(crate) const EXACT: u8 = 1;
/// Products left exact ([`Products::Fused`]).
pub(crate) const FUSED: u8 = 2;

/// The kinds a tile's kernel is compiled for: the operand rounding's and the sums' (the
/// kinds of [`super::lane_round_avx512`], or [`BINARY32`]), the products', whether the sums'
/// inputs are checked for Inf and NaN at every step, whether the accumulator is the
/// operand format, and whether the native f32 sum serves ([`LaneRound::rounds_plain_sums`],
/// with products rounded to a format the accumulator contains: the sum of two values of
/// the accumulator then needs no rounding to odd).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kinds {
    pub op: u8,
    pub sum: u8,
    pub prod: u8,
    pub check: bool,
    pub same: bool,
    pub plain_sums: bool,
}

impl Kinds {
    /// The kinds of a tile (see [`tile`]); `None` where no specialised kernel serves it
    /// (no operand rounding for rounded products, fused binary32 sums).
    pub(crate) fn new(
        op: Option<&LaneRound>,
        sum: SumLanes<'_>,
        products: Products,
        hardware_half: bool,
    ) -> Option<Kinds> {
        let prod = match products {
            Products::Rounded => ROUNDED,
            Products::RoundedExact => EXACT,
            Products::Fused => FUSED,
        };
        let (op_kind, op_overflows) = match op {
            Some(r) => (kind_of(r, hardware_half), r.keeps_specials()),
            // Fused products ignore the operand rounding (HALF stands for none).
            None if prod == FUSED => (HALF, false),
            None => return None,
        };
        let (sum_kind, sum_clamps) = match sum {
            SumLanes::Round(r) => (kind_of(r, hardware_half), !r.keeps_specials()),
            // Fused binary32 sums are one fused multiply-add in the general kernel already.
            SumLanes::Binary32 if prod == FUSED => return None,
            SumLanes::Binary32 => (BINARY32, false),
        };
        // With finite operands, products are finite: only a rounded product's overflow
        // makes a term Inf or NaN, which a clamping accumulator would hide.
        let check = sum_clamps && op_overflows && prod != FUSED;
        // One set of registers where both roundings are the same (`naive`).
        let same = matches!((op, sum), (Some(o), SumLanes::Round(s)) if o == s) && prod != FUSED;
        // Both addends values of the accumulator (the products rounded to a format it
        // contains).
        let plain_sums = prod != FUSED
            && match (op, sum) {
                (Some(o), SumLanes::Round(s)) => s.rounds_plain_sums() && s.contains(o),
                _ => false,
            };
        // `naive` in a posit: doubled values, sums of two posit values (see the module docs).
        let (op_kind, sum_kind) = if same && op_kind == POSIT {
            (POSIT_RAISED, POSIT_SUM)
        } else {
            (op_kind, sum_kind)
        };
        Some(Kinds {
            op: op_kind,
            sum: sum_kind,
            prod,
            check,
            same,
            plain_sums,
        })
    }
}

/// Calls `$kernel::<OP, SUM, PROD, CHECK, SAME, PLAIN_SUMS>$args` for the run-time
/// [`Kinds`] `$k`, or returns `None` from the enclosing function for a combination no
/// kernel is compiled for. Plain sums are compiled for the combinations that have them
/// (a float operand format into a float accumulator that contains it, or the same
/// format); elsewhere the flag is ignored and the sums are rounded to odd first,
/// which is correct for every combination. Shared by the AVX-512 and AVX2 dispatches,
/// whose kernels take the same parameters; the caller has the kinds' constants in scope.
macro_rules! run_kernel {
    ($kernel:ident, $k:expr, $args:tt) => {{
        let k: $crate::quire::naive_special::Kinds = $k;
        run_kernel!(@sums $kernel, k, $args;
            NARROW, ROUNDED; NARROW, EXACT;
            HALF, ROUNDED; HALF, EXACT; HALF, FUSED;
            POSIT, ROUNDED; POSIT, EXACT;
        )
    }};
    (@sums $kernel:ident, $k:ident, $args:tt; $($ok:ident, $p:ident;)*) => {
        run_kernel!(@run $kernel, $k, $args;
            // Plain sums of two formats: e4m3 or e5m2 products into fp16, bf16 or a
            // narrow float containing them.
            NARROW, NARROW; NARROW, HALF; NARROW, WIDE;
        ; $(
            $ok, WIDE, $p; $ok, NARROW, $p; $ok, HALF, $p; $ok, POSIT, $p; $ok, BINARY32, $p;
        )*;
            // The same format for products and sums (never both clamping and overflowing),
            // plain sums last: posits up to posit<16,2> and floats of at most 11
            // significand bits (e4m3, e5m2, fp16) have them.
            POSIT_RAISED, POSIT_SUM, ROUNDED, false; POSIT_RAISED, POSIT_SUM, EXACT, false;
            NARROW, NARROW, ROUNDED, false; NARROW, NARROW, EXACT, false;
            HALF, HALF, ROUNDED, false; HALF, HALF, EXACT, false;
            POSIT_RAISED, POSIT_SUM, EXACT, true; POSIT_RAISED, POSIT_SUM, ROUNDED, true;
            NARROW, NARROW, EXACT, true; HALF, HALF, EXACT, true;
        )
    };
    (@run $kernel:ident, $k:ident, $args:tt; $($po:ident, $ps:ident;)*;
        $($ok:ident, $sk:ident, $p:ident;)*;
        $($so:ident, $ss:ident, $sp:ident, $ex:tt;)*) => {
        match ($k.op, $k.sum, $k.prod, $k.check, $k.same, $k.plain_sums) {
            $(
                ($po, $ps, EXACT, false, false, true) => {
                    $kernel::<$po, $ps, EXACT, false, false, true> $args
                }
            )*
            $(
                ($ok, $sk, $p, false, false, _) => {
                    $kernel::<$ok, $sk, $p, false, false, false> $args
                }
                ($ok, $sk, $p, true, false, _) => {
                    $kernel::<$ok, $sk, $p, true, false, false> $args
                }
            )*
            $(
                ($so, $ss, $sp, false, true, $ex) => $kernel::<$so, $ss, $sp, false, true, $ex> $args,
            )*
            _ => return None,
        }
    };
}
pub(crate) use run_kernel;

/// Rounding up and down, exceptions suppressed.
const UP: i32 = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
/// See [`UP`].
const DOWN: i32 = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;

/// Of an operation's results rounded up and down, the odd one, else the one rounded up:
/// the exact result rounded to odd at f32 precision (see the module docs). Taking the
/// upward one where neither is odd keeps an exact zero sum `+0`, as rounding toward zero
/// gives it (rounding down gives `-0`).
#[target_feature(enable = "avx512f")]
#[inline]
fn odd_of(up: __m512, down: __m512) -> __m512i {
    let (up, down) = (_mm512_castps_si512(up), _mm512_castps_si512(down));
    let down_is_odd = _mm512_test_epi32_mask(down, _mm512_set1_epi32(1));
    _mm512_mask_blend_epi32(down_is_odd, up, down)
}

/// `x · y` rounded to odd at f32 precision: the odd one of the products rounded up and
/// down.
#[target_feature(enable = "avx512f")]
#[inline]
fn mul_odd(x: __m512, y: __m512) -> __m512i {
    odd_of(
        _mm512_mul_round_ps::<UP>(x, y),
        _mm512_mul_round_ps::<DOWN>(x, y),
    )
}

/// `x + y` rounded to odd at f32 precision: the odd one of the sums rounded up and down.
/// NaN stays NaN, Inf stays Inf.
#[target_feature(enable = "avx512f")]
#[inline]
fn add_odd(x: __m512, y: __m512) -> __m512i {
    odd_of(
        _mm512_add_round_ps::<UP>(x, y),
        _mm512_add_round_ps::<DOWN>(x, y),
    )
}

/// Whether `a` and the tile's rows of `b` are all finite.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
fn finite_operands(a: &[f32], b: &[f32], stride: usize) -> bool {
    if !a.iter().all(|x| x.is_finite()) {
        return false;
    }
    // `y · 0 + flag` is NaN once some y was Inf or NaN.
    let zero = _mm512_setzero_ps();
    let mut flag = [zero; TILE / 16];
    for t in 0..a.len() {
        let row = &b[t * stride..t * stride + TILE];
        for (r, f) in flag.iter_mut().enumerate() {
            // SAFETY: 16 f32 read from inside the row.
            let y = unsafe { _mm512_loadu_ps(row[16 * r..].as_ptr()) };
            *f = _mm512_fmadd_ps(y, zero, *f);
        }
    }
    flag.iter()
        .all(|&f| _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(f, f) == 0)
}

/// The tile loop for operand rounding `OP`, accumulator `SUM` and products `PROD` (finite
/// operands). `CHECK`: the sums' inputs are checked for Inf and NaN at every step (the
/// accumulator clamps while products may overflow to Inf or NaN). `SAME`: the accumulator
/// is the operand format (`sum` is not read). `PLAIN_SUMS`: the native f32 sum rounded by
/// `SUM` is the correctly rounded sum ([`LaneRound::rounds_plain_sums`]), one add instead
/// of the four instructions of the rounding to odd.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
fn kernel<
    const OP: u8,
    const SUM: u8,
    const PROD: u8,
    const CHECK: bool,
    const SAME: bool,
    const PLAIN_SUMS: bool,
>(
    op: &Zmm,
    sum: &Zmm,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    // Copies, kept in registers.
    let op = *op;
    let sum = if SAME { op } else { *sum };
    // Posit products and sums in doubled values (see the module docs).
    let doubled = OP == POSIT_RAISED;
    let zero = _mm512_setzero_ps();
    let mut c = [zero; TILE / 16];
    let mut flag = [zero; TILE / 16];
    for (t, &x) in a.iter().enumerate() {
        let row: &[f32; TILE] = b[t * stride..t * stride + TILE]
            .try_into()
            .expect("a full tile");
        let xv = _mm512_set1_ps(if doubled { 2.0 * x } else { x });
        for r in 0..TILE / 16 {
            // SAFETY: 16 f32 read from inside the row.
            let y = unsafe { _mm512_loadu_ps(row[16 * r..].as_ptr()) };
            let term = match PROD {
                FUSED => _mm512_mul_ps(xv, y),
                _ => {
                    let odd = if PROD == EXACT {
                        _mm512_castps_si512(_mm512_mul_ps(xv, y))
                    } else {
                        mul_odd(xv, y)
                    };
                    _mm512_castsi512_ps(round::<OP>(&op, odd))
                }
            };
            c[r] = if SUM == BINARY32 {
                _mm512_add_ps(c[r], term)
            } else {
                let odd = if PLAIN_SUMS {
                    _mm512_castps_si512(_mm512_add_ps(c[r], term))
                } else {
                    add_odd(c[r], term)
                };
                if CHECK {
                    // `odd · 0 + flag` is NaN once odd was Inf or NaN.
                    flag[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(odd), zero, flag[r]);
                }
                _mm512_castsi512_ps(round::<SUM>(&sum, odd))
            };
        }
    }
    if doubled {
        for v in &mut c {
            *v = _mm512_mul_ps(*v, _mm512_set1_ps(0.5));
        }
    }
    let mut special = 0u16;
    for r in 0..TILE / 16 {
        // Inf or NaN: the exponent field all ones.
        let field = _mm512_and_si512(_mm512_castps_si512(c[r]), _mm512_set1_epi32(0x7f80_0000));
        special |= _mm512_cmpeq_epi32_mask(field, _mm512_set1_epi32(0x7f80_0000));
        special |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(flag[r], flag[r]);
        // SAFETY: 16 f32 written inside the tile.
        unsafe { _mm512_storeu_ps(acc[16 * r..].as_mut_ptr(), c[r]) };
    }
    special == 0
}

/// The kernel for the run-time kinds, on an AVX-512 CPU.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
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
    let op_zmm = match op {
        Some(r) => Zmm::new(r),
        None => Zmm::none(),
    };
    let sum_zmm = match sum {
        SumLanes::Round(r) => Zmm::new(r),
        SumLanes::Binary32 => Zmm::none(),
    };
    if !operands_finite && !finite_operands(a, b, stride) {
        return Some(false);
    }
    let (o, s) = (&op_zmm, &sum_zmm);
    Some(run_kernel!(kernel, kinds, (o, s, a, b, stride, acc)))
}

/// The sums of one tile as [`super::naive_lanes::tile`] computes them (same definition,
/// same bits), with the specialised roundings `op` (products; `None` only for
/// [`Products::Fused`], which does not round them) and `sum`. `None` where the CPU (or the
/// cap of [`isa::set_cap`]) has neither AVX-512 nor AVX2 (with F16C), where a rounding has no
/// AVX2 form, or for fused binary32 sums (the general
/// kernel's single fused multiply-add); otherwise `Some(done)`, `done` false when a lane met
/// Inf or NaN (the tile is then left to the scalar definition and `acc` holds no result).
/// The formats must be ones [`super::naive_lanes`] admits. `operands_finite`: the caller
/// has found `a` and the tile's rows of `b` finite (once for a whole GEMM, instead of once
/// a tile); otherwise the tile checks them itself. `b` holds the tile's rows `stride`
/// apart; `width` of its columns are outputs, whose sums `acc` receives (a kernel may leave
/// the sums of the others, columns of padding, uncomputed).
#[allow(clippy::too_many_arguments)]
pub fn tile(
    op: Option<&LaneRound>,
    sum: SumLanes<'_>,
    products: Products,
    a: &[f32],
    b: &[f32],
    (stride, width): (usize, usize),
    acc: &mut [f32; TILE],
    operands_finite: bool,
) -> Option<bool> {
    assert!(a.is_empty() || b.len() >= (a.len() - 1) * stride + TILE);
    assert!(width <= TILE);
    match isa::active() {
        // SAFETY: AVX-512 F/BW/DQ/VL are present (checked by `active`) and imply the fused
        // multiply-add.
        Isa::Avx512 => unsafe { dispatch(op, sum, products, a, b, stride, acc, operands_finite) },
        Isa::Avx2 => super::naive_special_avx2::tile(
            op,
            sum,
            products,
            a,
            b,
            (stride, width),
            acc,
            operands_finite,
        ),
        Isa::Portable => None,
    }
}
