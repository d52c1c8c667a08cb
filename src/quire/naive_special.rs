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
//! * **`naive` in a posit by magic constants** (posit<16,1>, posit<16,2>, ... with plain
//!   sums, `kernel_magic`): each product is `fma(x, y, M) - M` and each sum `(s + M) - M`,
//!   with `M` from the value's exponent field ([`super::posit_magic`], whose docs prove it
//!   the posit rounding in every binade with a uniform grid), about twenty-five
//!   instructions a step against about forty for the two integer roundings and the
//!   product's step to odd. A step whose products or sums leave those binades (values next
//!   to minpos or maxpos) is redone from the sums before it with the integer roundings, so
//!   every step ends with the definition's sums. The AVX2 kernel does the same.
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
use super::posit_magic::{PositMagic, Trials};
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
            let term = product::<OP, PROD>(&op, xv, y);
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
        special |= store_sums(c[r], &mut acc[16 * r..16 * r + 16]);
        special |= _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(flag[r], flag[r]);
    }
    special == 0
}

/// The term `x · y` of a step: exact (`FUSED`), or rounded by `op` (of kind `OP`) from the
/// product exact in f32 (`EXACT`) or rounded to odd (`ROUNDED`).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
#[inline]
fn product<const OP: u8, const PROD: u8>(op: &Zmm, x: __m512, y: __m512) -> __m512 {
    match PROD {
        FUSED => _mm512_mul_ps(x, y),
        _ => {
            let odd = if PROD == EXACT {
                _mm512_castps_si512(_mm512_mul_ps(x, y))
            } else {
                mul_odd(x, y)
            };
            _mm512_castsi512_ps(round::<OP>(op, odd))
        }
    }
}

/// Stores 16 finished sums into `dst`; the mask of those that are Inf or NaN (the exponent
/// field all ones).
#[target_feature(enable = "avx512f")]
#[inline]
fn store_sums(v: __m512, dst: &mut [f32]) -> __mmask16 {
    let exp = _mm512_set1_epi32(0x7f80_0000);
    let field = _mm512_and_si512(_mm512_castps_si512(v), exp);
    assert!(dst.len() >= 16);
    // SAFETY: 16 f32 written inside `dst` (asserted).
    unsafe { _mm512_storeu_ps(dst.as_mut_ptr(), v) };
    _mm512_cmpeq_epi32_mask(field, exp)
}

/// [`PositMagic`]'s constants in registers.
#[derive(Clone, Copy)]
struct MagicZmm {
    exp: __m512i,
    c_a: __m512i,
    c_b: __m512i,
    lo: __m512i,
    hi: __m512i,
    es: __m128i,
}

impl MagicZmm {
    #[target_feature(enable = "avx512f")]
    fn new(m: &PositMagic) -> MagicZmm {
        MagicZmm {
            exp: _mm512_set1_epi32(0x7f80_0000),
            c_a: _mm512_set1_epi32(m.c_a as i32),
            c_b: _mm512_set1_epi32(m.c_b as i32),
            lo: _mm512_set1_epi32(m.lo as i32),
            hi: _mm512_set1_epi32(m.hi as i32),
            es: _mm_cvtsi32_si128(m.es as i32),
        }
    }

    /// The magic constant of each lane of `v` ([`PositMagic::magic`]), its exponent field
    /// folded into the step's running minimum of `E23 - 1` and maximum of `E23`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn magic(&self, v: __m512, lo: &mut __m512i, hi: &mut __m512i) -> __m512 {
        let e = _mm512_and_si512(_mm512_castps_si512(v), self.exp);
        *lo = _mm512_min_epu32(*lo, _mm512_add_epi32(e, _mm512_set1_epi32(-1)));
        *hi = _mm512_max_epu32(*hi, e);
        let h = _mm512_srl_epi32(e, self.es);
        let a = _mm512_add_epi32(h, self.c_a);
        let b = _mm512_sub_epi32(self.c_b, h);
        _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_max_epi32(a, b)))
    }

    /// Whether every value a step folded into `lo` and `hi` was in range
    /// ([`PositMagic::in_range`]).
    #[target_feature(enable = "avx512f")]
    #[inline]
    fn in_range(&self, lo: __m512i, hi: __m512i) -> bool {
        _mm512_cmplt_epu32_mask(lo, self.lo) | _mm512_cmpgt_epu32_mask(hi, self.hi) == 0
    }
}

/// The kernel of `naive` in a posit with plain sums ([`Kinds`] `POSIT_RAISED`,
/// `POSIT_SUM`, products `PROD`) by magic constants ([`super::posit_magic`]), as the AVX2
/// kernel of [`super::naive_special_avx2`] runs it: each product `fma(x, y, M) - M` and
/// each sum `(s + M) - M` (about twenty-five instructions a step against forty for the
/// integer roundings and the step to odd), a step with a product or sum outside the
/// uniform binades redone from the sums before it with the general roundings
/// ([`Trials`] decides when to stop trying). The tile's first `width` columns run in parts
/// of `R` registers, each part's sums held in registers through the whole of `a` (the
/// padding past `width` is not computed and its sums are left 0); a zero `a_t` leaves the
/// sums as they are (`c + 0 = c`, a value of the format).
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
fn kernel_magic<const PROD: u8, const R: usize>(
    magic: &PositMagic,
    op: &Zmm,
    a: &[f32],
    b: &[f32],
    (stride, width): (usize, usize),
    acc: &mut [f32; TILE],
) -> bool {
    let op = *op;
    let mg = MagicZmm::new(magic);
    let parts = width.div_ceil(16 * R).min(TILE / (16 * R));
    acc[parts * 16 * R..].fill(0.0);
    let mut special = 0u16;
    for part in 0..parts {
        let mut trials = Trials::default();
        let mut c = [_mm512_setzero_ps(); R];
        for (t, &x) in a.iter().enumerate() {
            if x == 0.0 {
                continue;
            }
            let row = &b[t * stride + part * 16 * R..][..16 * R];
            // Doubled values (see the module docs).
            let xv = _mm512_set1_ps(2.0 * x);
            if trials.try_next() {
                let mut lo = _mm512_set1_epi32(-1);
                let mut hi = _mm512_setzero_si512();
                let mut next = c;
                for (r, c) in next.iter_mut().enumerate() {
                    // SAFETY: 16 f32 read from inside the row.
                    let y = unsafe { _mm512_loadu_ps(row[16 * r..].as_ptr()) };
                    let m = mg.magic(_mm512_mul_ps(xv, y), &mut lo, &mut hi);
                    let p = _mm512_sub_ps(_mm512_fmadd_ps(xv, y, m), m);
                    let s = _mm512_add_ps(*c, p);
                    let m = mg.magic(s, &mut lo, &mut hi);
                    *c = _mm512_sub_ps(_mm512_add_ps(s, m), m);
                }
                if mg.in_range(lo, hi) {
                    c = next;
                    continue;
                }
                trials.redo();
            }
            for (r, c) in c.iter_mut().enumerate() {
                // SAFETY: as above.
                let y = unsafe { _mm512_loadu_ps(row[16 * r..].as_ptr()) };
                let term = product::<POSIT_RAISED, PROD>(&op, xv, y);
                let s = _mm512_castps_si512(_mm512_add_ps(*c, term));
                *c = _mm512_castsi512_ps(round::<POSIT_SUM>(&op, s));
            }
        }
        for (r, &v) in c.iter().enumerate() {
            // None special with finite operands; checked as the other kernels do.
            let at = part * 16 * R + 16 * r;
            special |= store_sums(_mm512_mul_ps(v, _mm512_set1_ps(0.5)), &mut acc[at..at + 16]);
        }
    }
    special == 0
}

/// Registers of f32 in a part of [`kernel_magic`]'s tile: the whole tile at once (four
/// independent sums a step), or halves where the tile's outputs fit in one
/// ([`NARROW_WIDTH`]), so that no padding is computed.
const WIDE_REGS: usize = TILE / 16;

/// See [`WIDE_REGS`].
const NARROW_REGS: usize = WIDE_REGS / 2;

/// Widths up to this run in parts of [`NARROW_REGS`].
const NARROW_WIDTH: usize = 16 * NARROW_REGS;

/// The kernel for the run-time kinds, on an AVX-512 CPU.
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
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
    let magic = match op {
        Some(LaneRound::Posit(p)) if kinds.same && kinds.plain_sums && !kinds.check => p.magic,
        _ => None,
    };
    if let (Some(m), POSIT_RAISED) = (magic, kinds.op) {
        let tile = (stride, width);
        return Some(match kinds.prod {
            EXACT if width <= NARROW_WIDTH => {
                kernel_magic::<EXACT, NARROW_REGS>(&m, o, a, b, tile, acc)
            }
            EXACT => kernel_magic::<EXACT, WIDE_REGS>(&m, o, a, b, tile, acc),
            _ if width <= NARROW_WIDTH => {
                kernel_magic::<ROUNDED, NARROW_REGS>(&m, o, a, b, tile, acc)
            }
            _ => kernel_magic::<ROUNDED, WIDE_REGS>(&m, o, a, b, tile, acc),
        });
    }
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
    let (shape, finite) = ((stride, width), operands_finite);
    match isa::active() {
        // SAFETY: AVX-512 F/BW/DQ/VL are present (checked by `active`) and imply the fused
        // multiply-add.
        Isa::Avx512 => unsafe { dispatch(op, sum, products, a, b, shape, acc, finite) },
        Isa::Avx2 => super::naive_special_avx2::tile(op, sum, products, a, b, shape, acc, finite),
        Isa::Portable => None,
    }
}
