//! The naive GEMM's register kernel: one row of `A` against a tile of [`TILE`] output
//! columns, every product and partial sum rounded in f32 lanes.
//!
//! Each lane is one output `c_j`, and each lane runs the definition in its own order: from
//! `c = 0`, for `t` ascending, `c = S(c + P(a_t · b_tj))`, with `P` the rounding to the
//! operand format and `S` the rounding to the accumulator format (the operand format for
//! `naive`). Lanes never mix, so vectorising across columns leaves the order of every
//! output's operations unchanged. The bias and the output rounding follow in the caller.
//!
//! # Why every step is the correctly rounded operation
//!
//! The formats (checked by the caller, [`super::naive_f32`]) are posits with `n <= 24` and
//! `maxpos² <= 2^125`, and floats with at most 22 significand bits whose smallest magnitude
//! squared is at least `2^-126` and whose largest squared is below `2^127`. So:
//!
//! * **Products.** `x · y` of two such values has at most 44 significand bits. With a fused
//!   multiply-add, `hi = fl(x·y)` and `lo = fma(x, y, -hi)` give `x·y = hi + lo` exactly
//!   (TwoProduct): `hi` is a normal f32 (`|x·y|` lies in `[minpos², maxpos²]`, resp. the
//!   float bounds), and `lo` is a multiple of the product of the operands' last bits, at
//!   least `2^-126`, so it is an f32 and the fused operation returns it exactly. Without a
//!   fused multiply-add (the portable build) the product is formed in f64, where it is
//!   exact, and `lo` is the sign of `x·y - hi` there. Where both operands have at most 12
//!   significand bits (e4m3, e5m2, posit<16,2>, posit<8,0>, ...) the product is an f32
//!   and `lo = 0`: the kernel then skips the step.
//! * **Sums.** `s + p` of two values of the formats: TwoSum (six f32 operations) gives
//!   `hi + lo = s + p` exactly for any finite f32 inputs; no sum overflows (both are below
//!   `2^64`), and a nonzero sum is at least the smaller quantum, a normal f32.
//! * **Round to odd.** From `hi + lo` the kernel forms the exact value rounded to odd at f32
//!   precision: `hi` itself when `lo = 0` or `hi`'s last significand bit is 1, else the f32
//!   next to `hi` towards `lo` (the pattern plus or minus one; the exact value lies strictly
//!   between those two neighbours, and the one moved to is odd). A value `v` rounded to odd
//!   with 24 bits, `o`, agrees with `v` on every comparison with an f32 whose last bit is 0:
//!   it is never such a value unless `v` is, and lies on the same side of each. Every value
//!   of these formats, every midpoint between neighbours (at most 23 significand bits), and
//!   every power of two (the posit's pattern midpoints where exponent bits are cut) is such
//!   an f32. Nearest-even rounding to the format is decided by those comparisons and the
//!   parity of the neighbours, so it rounds `o` as it rounds `v`: `P(x·y)` and `S(s + p)`
//!   are the correct roundings of the exact product and sum. The rounding itself is the
//!   quantize kernel's branch-free step ([`F32Plan`]), bit-identical to the general path
//!   wherever it does not ask for that path.
//! * **Specials.** NaR and NaN operands, float overflow to Inf or NaN, and anything the
//!   plan leaves to the general path mark their lane; the tile is then reported as not done
//!   and the caller computes its columns with the scalar definition. With finite operands
//!   on the format's grid a lane is never marked for posits (they saturate); for floats
//!   only after an overflow.
//!
//! # Accumulators with f32's exponent range, and fused multiply-adds
//!
//! With `fma:<A>` ([`Products::Fused`]) a term is the exact product `a·b`, added to the sum
//! with one rounding; with `naive:<A>` the product rounded to the operand format `F`.
//!
//! * **Fused terms into a plan accumulator.** Where both operands have at most 12
//!   significand bits, `a·b` is an f32 (at most 24 significand bits, magnitude in
//!   `[u², max²]`, `u` the operand format's smallest positive value, inside f32's normal
//!   range by the caller's check). The kernel adds it as it adds a rounded product
//!   (TwoSum, round to odd, the plan): `S(s + a·b)`, one rounding. Wider operands take
//!   the caller's row kernel.
//! * **bf16 and other floats up to f32's range.** The accumulator may also be a float with
//!   at most 22 significand bits, values no larger than f32's largest and overflow to
//!   infinity (bf16 = `float<8,7>`, `float<8,m>`), whose smallest values lie below f32's
//!   normal range: no sum reaches them. Every term is an integer multiple of `q`, `u` for
//!   `naive` (every value of `F` is a multiple of `u`) or `u²` for `fma`, and `q >= 2^-126`
//!   (the caller's check on `F`: `u² >= 2^-126`, posits `minpos² >= 2^-125`). If the
//!   running sum `s` is a multiple of `q`, so is the exact `s + t`, and so is its rounding
//!   to `A`: a float's values in one binade are the multiples of one power of two there
//!   (the binade's spacing); where that spacing is below `q`, `s + t` is itself a value of
//!   `A` (a multiple of `q` is a multiple of the spacing), and otherwise the result is a
//!   multiple of a spacing of at least `q`, or the binade's upper end, a larger power of
//!   two. So from `s = 0` every sum is zero or at least `q >= 2^-126` in magnitude, a
//!   normal f32, and the argument above holds for `A`: every value of `A` at or above
//!   `2^-126`, and every midpoint between two of them (at most 23 significand bits), is an
//!   f32 whose last bit is 0. TwoSum's `hi` overflows only for a fused sum near f32's
//!   largest value (`|s| + |a·b|` past it); the lane is then marked and the scalar
//!   definition rounds the exact sum.
//! * **IEEE binary32 ([`Accumulator::Binary32`]).** Rounding to odd at 24 bits cannot
//!   serve a 24-bit target (the odd value is already an f32, which nearest rounding keeps:
//!   that is truncation with a sticky bit, not rounding to nearest). Binary32 needs none:
//!   `naive:fp32`'s `s + p` is the native f32 add, which IEEE 754 defines as the exact sum
//!   of two f32 values rounded once to nearest even (gradual underflow, overflow to
//!   infinity); `fma:fp32`'s `s + a·b` is the fused multiply-add `fma(a, b, s)`, the exact
//!   `a·b + s` rounded once. Each step is then the definition's operation for any f32
//!   operands. The portable build, which may lack the fused instruction, forms `a·b` in
//!   f64 (exact: at most 48 significand bits, exponents far inside f64's range), adds `s`
//!   rounded to odd at 53 bits ([`super::round_odd::add_odd`]) and narrows to f32 by
//!   conversion, rounding to nearest even: 53 >= 24 + 2 bits, so that is the correct
//!   rounding of the exact value, the fused instruction's bits. A sum that is Inf or NaN
//!   marks its lane (Inf, NaN or NaR operands; with finite operands a `naive` sum cannot
//!   overflow, its terms being below `2^64` while the overflow threshold lies `2^103`
//!   above f32's largest value, and a fused one only with products near `2^127`).
//!
//! Where both formats have a rounding specialised to them ([`super::lane_round`]: fp16,
//! bf16, e4m3, e5m2, posits up to 17 bits, ...) and the CPU has AVX-512 or AVX2 (with F16C),
//! the caller takes [`super::naive_special`] instead, the same definition with fewer
//! instructions a step.
//!
//! The kernel is compiled for AVX-512 (16 lanes a register, fused multiply-add), AVX2
//! (8 lanes, fused multiply-add) and the portable baseline (products in f64), chosen at run
//! time ([`crate::backend::isa`]); all give the same bits. [`TILE`] lanes make four
//! independent AVX-512 chains per step, enough to hide the latency of one step's ~70
//! dependent operations.

use crate::backend::f32_plan::{F32Plan, NearestLanes, SHAPE_FLOAT, SHAPE_POSIT};
use crate::backend::isa::{self, Isa};

use super::round_odd::add_odd;

/// Output columns per tile (four AVX-512 registers of f32).
pub const TILE: usize = 64;

/// The exponent field of an f32 pattern, all ones for Inf and NaN.
const EXP_MASK: u32 = 0x7f80_0000;

/// `hi + lo` rounded to odd at f32 precision (see the module docs), and whether `hi` is Inf
/// or NaN (the lane is then left to the scalar definition).
#[inline(always)]
fn to_odd(hi: f32, lo: f32) -> (f32, bool) {
    let bits = hi.to_bits();
    let inexact = (lo != 0.0) & (bits & 1 == 0);
    // Towards lo: up in magnitude when lo has hi's sign, else down.
    let step = if (lo.to_bits() ^ bits) >> 31 == 0 {
        1
    } else {
        u32::MAX
    };
    let odd = bits.wrapping_add(if inexact { step } else { 0 });
    (f32::from_bits(odd), bits & EXP_MASK == EXP_MASK)
}

/// `x · y` as `hi + lo` (exact; see the module docs). `FMA` chooses the fused
/// multiply-add; without it the product is formed in f64.
#[inline(always)]
fn two_product<const FMA: bool>(x: f32, y: f32) -> (f32, f32) {
    let hi = x * y;
    let lo = if FMA {
        x.mul_add(y, -hi)
    } else {
        (f64::from(x) * f64::from(y) - f64::from(hi)) as f32
    };
    (hi, lo)
}

/// `x + y` as `hi + lo` (TwoSum, exact for finite inputs).
#[inline(always)]
fn two_sum(x: f32, y: f32) -> (f32, f32) {
    let s = x + y;
    let yy = s - x;
    let lo = (x - (s - yy)) + (y - yy);
    (s, lo)
}

/// `(hi + lo)` rounded to odd, then to the plan's format; true where the lane needs the
/// scalar definition.
#[inline(always)]
fn round_exact<const SHAPE: u8>(plan: &NearestLanes, hi: f32, lo: f32) -> (f32, bool) {
    let (odd, special) = to_odd(hi, lo);
    let (bits, slow) = plan.round::<SHAPE>(odd);
    (f32::from_bits(bits), special | slow)
}

/// The accumulator shape of IEEE binary32 sums: the native f32 add (or fused
/// multiply-add), no plan.
const SHAPE_BINARY32: u8 = u8::MAX;

/// Products rounded to the operand format, formed by TwoProduct.
const PRODUCTS_ROUNDED: u8 = 0;
/// Products rounded to the operand format, exact in f32 (no TwoProduct).
const PRODUCTS_EXACT: u8 = 1;
/// Products left exact and added with one rounding (`fma:<A>`).
const PRODUCTS_FUSED: u8 = 2;

/// `c + x·y` rounded once to binary32: the fused multiply-add where `FMA`, else the exact
/// f64 product (at most 48 significand bits) added in f64 rounded to odd and narrowed to
/// f32, the same correct rounding.
#[inline(always)]
fn fma_binary32<const FMA: bool>(x: f32, y: f32, c: f32) -> f32 {
    if FMA {
        x.mul_add(y, c)
    } else {
        add_odd(f64::from(c), f64::from(x) * f64::from(y)) as f32
    }
}

/// The tile loop (see [`tile`]), for plans of shapes `OP` and `SUM` ([`SHAPE_BINARY32`]:
/// native f32 sums) and products as `PROD` says.
#[inline(always)]
fn tile_body<const OP: u8, const SUM: u8, const FMA: bool, const PROD: u8>(
    op: NearestLanes,
    sum: Option<NearestLanes>,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    let sum = sum.unwrap_or(op);
    let mut c = [0f32; TILE];
    let mut marked = [0u32; TILE];
    for (t, &x) in a.iter().enumerate() {
        let row: &[f32; TILE] = b[t * stride..t * stride + TILE]
            .try_into()
            .expect("a full tile");
        for j in 0..TILE {
            if SUM == SHAPE_BINARY32 && PROD == PRODUCTS_FUSED {
                c[j] = fma_binary32::<FMA>(x, row[j], c[j]);
                marked[j] |= (c[j].to_bits() & EXP_MASK == EXP_MASK) as u32;
                continue;
            }
            let (p, p_marked) = match PROD {
                // Exact in f32 (at most 24 significand bits): added unrounded.
                PRODUCTS_FUSED => (x * row[j], false),
                PRODUCTS_EXACT => round_exact::<OP>(&op, x * row[j], 0.0),
                _ => {
                    let (hi, lo) = two_product::<FMA>(x, row[j]);
                    round_exact::<OP>(&op, hi, lo)
                }
            };
            let (s, s_marked) = if SUM == SHAPE_BINARY32 {
                let s = c[j] + p;
                (s, s.to_bits() & EXP_MASK == EXP_MASK)
            } else {
                let (hi, lo) = two_sum(c[j], p);
                round_exact::<SUM>(&sum, hi, lo)
            };
            c[j] = s;
            marked[j] |= (p_marked | s_marked) as u32;
        }
    }
    *acc = c;
    marked.iter().fold(0, |m, &l| m | l) == 0
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
fn tile_avx512<const OP: u8, const SUM: u8, const PROD: u8>(
    op: NearestLanes,
    sum: Option<NearestLanes>,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    tile_body::<OP, SUM, true, PROD>(op, sum, a, b, stride, acc)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_avx2<const OP: u8, const SUM: u8, const PROD: u8>(
    op: NearestLanes,
    sum: Option<NearestLanes>,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    tile_body::<OP, SUM, true, PROD>(op, sum, a, b, stride, acc)
}

fn tile_portable<const OP: u8, const SUM: u8, const PROD: u8>(
    op: NearestLanes,
    sum: Option<NearestLanes>,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    tile_body::<OP, SUM, false, PROD>(op, sum, a, b, stride, acc)
}

/// The compiled path for this CPU (at most the cap of [`isa::set_cap`]): AVX2 needs the
/// fused multiply-add too.
fn path() -> Isa {
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if !std::arch::is_x86_feature_detected!("fma") => Isa::Portable,
        other => other,
    }
}

/// The tile at one pair of plan shapes on the chosen path.
fn tile_shapes<const OP: u8, const SUM: u8, const PROD: u8>(
    op: NearestLanes,
    sum: Option<NearestLanes>,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    match path() {
        // SAFETY: `path` returns AVX-512 or AVX2 only where the CPU has those instruction
        // sets (AVX-512 F/BW/DQ/VL implies the fused multiply-add; AVX2 is checked for it).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { tile_avx512::<OP, SUM, PROD>(op, sum, a, b, stride, acc) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { tile_avx2::<OP, SUM, PROD>(op, sum, a, b, stride, acc) },
        _ => tile_portable::<OP, SUM, PROD>(op, sum, a, b, stride, acc),
    }
}

/// The accumulator of a tile's sums.
#[derive(Debug, Clone, Copy)]
pub enum Accumulator<'a> {
    /// Sums rounded to nearest even by this plan (a posit or float plan of a format the
    /// module docs admit as an accumulator).
    Plan(&'a F32Plan),
    /// IEEE binary32 sums: the native f32 add (or fused multiply-add).
    Binary32,
}

/// How a tile forms each term of its sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// `P(a·b)`: the product rounded to the operand format (`naive`, `naive:<A>`).
    Rounded,
    /// As [`Products::Rounded`], for operands of at most 12 significand bits, whose
    /// products are f32 values (the TwoProduct step is skipped).
    RoundedExact,
    /// `a·b` unrounded, added with one rounding (`fma:<A>`); with a plan accumulator the
    /// operands must have at most 12 significand bits.
    Fused,
}

/// The sums of one tile: for each of the [`TILE`] columns `j`, from `c_j = 0` and `t`
/// ascending, `c_j = S(c_j + T(a_t · b[t·stride + j]))`, each operation rounded to nearest
/// even: `T` the rounding to the operand format by `op`'s plan (none for
/// [`Products::Fused`]), `S` the accumulator's. The results go to `acc`. Returns false when
/// some lane met a value the kernel leaves to the scalar definition (NaR, NaN, Inf, or the
/// plan's general path); `acc` then holds no result. The plans must be posit or float plans
/// of formats the module docs admit.
pub fn tile(
    op: &F32Plan,
    sum: Accumulator<'_>,
    products: Products,
    a: &[f32],
    b: &[f32],
    stride: usize,
    acc: &mut [f32; TILE],
) -> bool {
    assert!(a.is_empty() || b.len() >= (a.len() - 1) * stride + TILE);
    const P: u8 = SHAPE_POSIT;
    const F: u8 = SHAPE_FLOAT;
    const B: u8 = SHAPE_BINARY32;
    const R: u8 = PRODUCTS_ROUNDED;
    const X: u8 = PRODUCTS_EXACT;
    const U: u8 = PRODUCTS_FUSED;
    let o = op.lanes();
    let (s, sum_shape) = match sum {
        Accumulator::Plan(plan) => (Some(plan.lanes()), plan.shape()),
        Accumulator::Binary32 => (None, B),
    };
    let prod = match products {
        Products::Rounded => R,
        Products::RoundedExact => X,
        Products::Fused => U,
    };
    match (op.shape(), sum_shape, prod) {
        (P, P, R) => tile_shapes::<P, P, R>(o, s, a, b, stride, acc),
        (P, P, X) => tile_shapes::<P, P, X>(o, s, a, b, stride, acc),
        (P, F, R) => tile_shapes::<P, F, R>(o, s, a, b, stride, acc),
        (P, F, X) => tile_shapes::<P, F, X>(o, s, a, b, stride, acc),
        (F, P, R) => tile_shapes::<F, P, R>(o, s, a, b, stride, acc),
        (F, P, X) => tile_shapes::<F, P, X>(o, s, a, b, stride, acc),
        (F, F, R) => tile_shapes::<F, F, R>(o, s, a, b, stride, acc),
        (F, F, X) => tile_shapes::<F, F, X>(o, s, a, b, stride, acc),
        (P, B, R) => tile_shapes::<P, B, R>(o, s, a, b, stride, acc),
        (P, B, X) => tile_shapes::<P, B, X>(o, s, a, b, stride, acc),
        (F, B, R) => tile_shapes::<F, B, R>(o, s, a, b, stride, acc),
        (F, B, X) => tile_shapes::<F, B, X>(o, s, a, b, stride, acc),
        // Fused: the operand plan is not used.
        (_, P, U) => tile_shapes::<F, P, U>(o, s, a, b, stride, acc),
        (_, F, U) => tile_shapes::<F, F, U>(o, s, a, b, stride, acc),
        (_, B, U) => tile_shapes::<F, B, U>(o, s, a, b, stride, acc),
        _ => false,
    }
}
