//! The quire GEMM as an f64 GEMM checked by an error bound
//! ([`super::gemm_cpu::Accumulator::F64Checked`]): every output is computed by an ordinary
//! f64 GEMM, and its posit rounding is taken from there where a rigorous bound on the f64
//! error proves it equal to the rounding of the exact sum; the few outputs the bound cannot
//! decide are summed exactly (i128 chunks gathered in a [`Quire`], or a quire).
//!
//! # The bound
//!
//! Let posit(n, es) have `maxpos = 2^s`. Every posit is an integer multiple of
//! `minpos = 2^-s` of magnitude at most `2^s`, so every product of two posits is a multiple
//! of `2^-2s` of magnitude at most `2^2s`. An output is the sum of `T = k + 1` terms: the
//! `k` products `a_t b_t` and the bias `c` (a posit, or 0).
//!
//! The f64 GEMM (`gemm` crate, `dst := 1·dst + 1·A·B` with `dst` holding the bias) forms
//! each output by some binary tree of additions over the `T` leaves (the bias and the `k`
//! products), each product either rounded on its own or fused into an addition (FMA); the
//! multiplications by `alpha = beta = 1` are exact, and its k-blocking only adds partial
//! sums. Whatever the tree, every leaf passes through at most `T` roundings (its product's
//! and at most `T - 1` additions'), each a factor `1 + δ`, `|δ| <= u = 2^-53`, provided no
//! result is subnormal and none overflows. So (Higham, *Accuracy and Stability of Numerical
//! Algorithms*, 2nd ed., Lemma 3.1 and eq. (3.4)-(3.5))
//!
//! ```text
//! |ŝ - s| <= γ_T · (Σ_t |a_t b_t| + |c|),    γ_T = T·u / (1 - T·u).
//! ```
//!
//! **No subnormals, no overflow.** Every exact product and the bias are multiples of
//! `2^-2s`. A multiple of `2^-2s` rounded to f64 is again one (below `2^(53-2s)` it is
//! exact; above, f64's spacing is a power of two of at least `2^-2s`), so by induction every
//! computed product and partial sum is a multiple of `2^-2s`: zero, or at least `2^-2s` in
//! magnitude, a normal f64 while `2s <= 1022`. Every partial sum is at most
//! `(1 + γ_T)·T·2^2s` in magnitude, far below f64's maximum while `T <= 2^32` and
//! `2s <= 900` (the limits of [`applies`]; every posit with a quire has `2s <= 896`).
//!
//! **Bounding the sum of magnitudes.** By Cauchy-Schwarz, `Σ |a_t b_t| <= ‖a‖·‖b‖` with
//! `a` the output's row of `A` and `b` its column of `B`. The norms are computed once per
//! row and column: `na = fl(sqrt(fl(Σ a_t²)))`, in any order. The squares are multiples of
//! `2^-2s` below `2^2s`, so the same argument holds: `fl(Σ a_t²) >= (1 - γ_k)·Σ a_t²`, and
//! the square root loses at most one more factor `1 - u`. Then, with `p = fl(na·nb)`,
//!
//! ```text
//! ‖a‖·‖b‖ <= p / ((1 - u)³ (1 - γ_k))
//! ```
//!
//! and the computed bound `E = fl(C · fl(p + |c|))` with `C = T·2^-52` (exact) satisfies
//! `E >= C·(p + |c|)·(1 - u)²`. As `T·u <= 2^-21`, `γ_T <= T·u·(1 + 2^-20)` and the
//! factors `(1 - u)^-5 (1 - γ_k)^-1 <= 1 + 2^-20`, so `C = 2·T·u` leaves room to spare:
//! `E >= γ_T·(‖a‖·‖b‖ + |c|) >= |ŝ - s|`. `E` itself cannot underflow: a nonzero `p` is at
//! least `minpos² = 2^-2s` and `C >= 2^-52`, so `E >= 2^(-2s-52)`, normal for `2s <= 900`.
//! `E = 0` exactly when every term is zero (a zero row or column of the operands and no
//! bias), and then `ŝ = s = 0`.
//!
//! # The check
//!
//! The posit rounding `R` (nearest, ties to the even pattern, saturating at ±maxpos, never
//! rounding a nonzero value to zero) is monotone: `x <= y` implies `R(x) <= R(y)`. So with
//! `lo <= ŝ - E <= s <= ŝ + E <= hi`, `R(lo) = R(hi)` implies `R(s) = R(lo)`. The ends are
//! evaluated outward:
//!
//! * **posits whose values are all f32** (n <= 24, as posit<16,1>): `lo` is `fl(ŝ - E)`
//!   clamped to `[-maxpos, maxpos]` (which changes no rounding), converted to f32 and, unless
//!   the f32 is already below that f64, stepped one f32 down; `hi` likewise upward. The f64
//!   subtraction errs by at most half an ulp of its result, and an f32 strictly below an
//!   f64 lies at or below the f64's lower neighbour, which is at or below the exact
//!   `ŝ - E`. The two ends are rounded by the format's f32 plan
//!   ([`crate::backend::f32_plan`], the same bits as [`Posit::round`]). Where the two f32
//!   ends of all 16 outputs of a vector group agree on every bit from the finest round
//!   bit's position up and each has a nonzero bit below it, they round alike without
//!   rounding `hi` (`below_round_bit` proves it), so only `lo` is rounded.
//! * **other posits** (posit<32,2>): `lo = next_down(fl(ŝ - E))`, `hi = next_up(fl(ŝ + E))`
//!   in f64, rounded by [`Posit::round`].
//!
//! Where `E = 0` the ends are `ŝ` itself (exact). Where `R(lo) != R(hi)` (a rounding
//! boundary inside the interval: a sum within `E` of a midpoint between two posits, an
//! interval straddling zero, a large cancellation), the output is summed exactly. A NaR
//! operand (NaN or ±Inf) makes its row or column norm, or the bias, non-finite, and so `E`:
//! those outputs are NaR, and an f64 sum that is not finite never reaches an output (it
//! fails the check and is summed exactly).
//!
//! For posit<16,1> the products are even exact (13-bit significands) and the interval is
//! about `k·2^-52` relative to the norms, against a posit spacing of at least `2^-12`
//! relative: the exact path runs for a negligible share of random outputs.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::accumulator::Quire;
use super::gemm_cpu::{dgemm_strided, for_rows, Bias, Dims, Strided};
use super::quire_i16::Operand;
use super::round_odd::i128_to_f64_odd;
use super::scratch::{self, Scratch};
use crate::backend::f32_plan::{F32Plan, NearestLanes, SHAPE_POSIT};
use crate::format::grid::pow2;
use crate::format::rounding::{NearestEven, RuleKind};
use crate::format::{Format, Posit};
use crate::team::Threading;

/// The most terms (products and bias) of one output the bound admits.
pub const MAX_TERMS: usize = 1 << 32;

/// The largest `2s` (`maxpos = 2^s`) the bound admits.
const MAX_TWO_S: i32 = 900;

/// Whether the checked GEMM applies to `posit` with `terms` summed terms (see the module
/// docs).
pub fn applies(posit: Posit, terms: usize) -> bool {
    2 * posit.max_scale() <= MAX_TWO_S && terms <= MAX_TERMS
}

/// How the two ends of an output's interval are rounded.
enum Ends {
    /// Through the format's f32 plan (every value of the posit is an f32).
    F32(std::sync::Arc<F32Plan>),
    /// In f64 by [`Posit::round`].
    F64,
}

impl Ends {
    fn new(posit: Posit) -> Ends {
        let format = Format::Posit(posit);
        if values_are_f32(posit) {
            if let Some(plan) = F32Plan::shared(&format, RuleKind::NearestEven) {
                return Ends::F32(plan);
            }
        }
        Ends::F64
    }
}

/// Whether every value of `posit` is an f32: at most 24 significand bits, and its range
/// inside f32's normal range.
fn values_are_f32(posit: Posit) -> bool {
    posit.n() <= 24 && posit.max_scale() <= 126
}

/// The GEMM's operands in f64 (on the posit's grid) with the 2-norm of every row of `A`
/// and every column of `B` (not finite where it holds a NaR).
struct Prepared<'a> {
    a: Strided<'a>,
    b: Strided<'a>,
    a_norms: &'a [f64],
    b_norms: &'a [f64],
}

/// `out (m x n) = round(A · B + bias)` for f64 operands on the posit's grid, `a` (`m x k`)
/// and `b` (`k x n`) row-major; returns how many outputs the bound left to the exact path.
/// The caller checks [`applies`].
pub fn gemm_f64(
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) -> usize {
    let (a, b) = (F64Operand::rows(a), F64Operand::rows(b));
    gemm_f64_layout(posit, a, b, dims, bias, out, parallel)
}

/// An f64 operand on the posit's grid and how it is stored.
#[derive(Debug, Clone, Copy)]
pub struct F64Operand<'a> {
    /// The values, row-major.
    pub data: &'a [f64],
    /// Whether `data` holds the operand's transpose (`k x m` for `A`, `n x k` for `B`).
    pub transposed: bool,
}

impl<'a> F64Operand<'a> {
    /// An operand stored as it is (row-major, not transposed).
    pub fn rows(data: &'a [f64]) -> Self {
        F64Operand {
            data,
            transposed: false,
        }
    }
}

/// [`gemm_f64`] with each operand in either layout (read in place, no transposed copy).
pub fn gemm_f64_layout(
    posit: Posit,
    a: F64Operand,
    b: F64Operand,
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) -> usize {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n && out.len() >= m * n);
    let (av, bv) = (&a.data[..m * k], &b.data[..k * n]);
    // The norms run along A's rows and B's columns, whichever way each is stored.
    let (a_norms, b_norms) = join(
        parallel,
        || {
            norms(
                av,
                if a.transposed { (k, m) } else { (m, k) },
                !a.transposed,
                parallel,
            )
        },
        || {
            norms(
                bv,
                if b.transposed { (n, k) } else { (k, n) },
                b.transposed,
                parallel,
            )
        },
    );
    let ops = Prepared {
        a: view(av, a.transposed, (m, k)),
        b: view(bv, b.transposed, (k, n)),
        a_norms: &a_norms,
        b_norms: &b_norms,
    };
    run(posit, &ops, dims, bias, &mut out[..m * n], None, parallel)
}

/// The `rows x cols` operand stored in `data` as it is or transposed, as a strided view.
fn view(data: &[f64], transposed: bool, (rows, cols): (usize, usize)) -> Strided<'_> {
    if transposed {
        Strided::new(data, 1, rows)
    } else {
        Strided::new(data, cols, 1)
    }
}

/// `round(A · B + bias)` (`m x n`, row-major f32) for f32 operands not yet rounded to the
/// posit, each in either layout; the bias already rounded. Also returns how many outputs
/// the bound left to the exact path. The caller checks [`applies`].
///
/// `B` is rounded once, on the calling thread. Where `parallel` and `A` has enough rows
/// (`team::Threading::of`), the output rows are cut into one band per thread of rayon's pool,
/// shared with the caller through `crate::team`: each band rounds its rows of `A` (a helper
/// does so while the caller still rounds `B`) and runs its own serial f64 GEMM and check,
/// so that a call hands work to the pool once (the f64 GEMM's own threading hands it over
/// twice per block of `k`, each time waiting for a sleeping worker to wake).
pub fn gemm_f32(
    posit: Posit,
    a: Operand,
    b: Operand,
    dims: Dims,
    bias: Bias,
    parallel: bool,
) -> (Vec<f32>, usize) {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return (out, 0);
    }
    let (bands, parallel) = Threading::of(parallel, dims).bands();
    // `B` (k x n): stored as is, or as its transpose (n x k); its norms run along its
    // columns. Rounded once, on the calling thread, while the helpers wake.
    let b_shape = if b.transposed { (n, k) } else { (k, n) };
    let prepare_b = || prepare(posit, &b.data[..k * n], b_shape, b.transposed, parallel);
    // Rows `r0..` of `A` rounded, by the thread that claims the band (before `B` is ready).
    let own = |&(r0, ref out): &(usize, &mut [f32])| {
        prepare_rows(posit, a, (m, k), r0..r0 + out.len() / n, parallel)
    };
    // Rows `r0..` of the output (`out` holds them) from rows `r0..` of `A`.
    let band = |(bv, b_norms): &(Scratch<f64>, Vec<f64>),
                (r0, out): (usize, &mut [f32]),
                (av, a_norms): (Scratch<f64>, Vec<f64>)| {
        let rows = out.len() / n;
        let ops = Prepared {
            a: view(&av, a.transposed, (rows, k)),
            b: view(bv, b.transposed, (k, n)),
            a_norms: &a_norms,
            b_norms,
        };
        let bias = match bias {
            Bias::PerRow(v) => Bias::PerRow(&v[r0..r0 + rows]),
            other => other,
        };
        let mut sums = scratch::take::<f64>(rows * n);
        run(
            posit,
            &ops,
            (rows, k, n),
            bias,
            &mut sums,
            Some(out),
            parallel,
        )
    };
    let tasks = crate::team::row_bands(&mut out, n, bands, 1);
    let fallbacks = crate::team::run_prepared(bands - 1, prepare_b, tasks, own, band)
        .into_iter()
        .sum();
    (out, fallbacks)
}

/// Rows `rows` of `A` (`m x k`, stored as is or transposed) rounded to the posit in f64,
/// with their 2-norms, stored as `A` is (`k x rows` where transposed).
fn prepare_rows(
    posit: Posit,
    a: Operand,
    (m, k): (usize, usize),
    rows: std::ops::Range<usize>,
    parallel: bool,
) -> (Scratch<f64>, Vec<f64>) {
    let shape = if a.transposed {
        (k, rows.len())
    } else {
        (rows.len(), k)
    };
    prepare(posit, &a.band((m, k), rows), shape, !a.transposed, parallel)
}

/// `(f(), g())`, on the rayon pool when `parallel`.
fn join<A: Send, B: Send>(
    parallel: bool,
    f: impl FnOnce() -> A + Send,
    g: impl FnOnce() -> B + Send,
) -> (A, B) {
    if parallel {
        rayon::join(f, g)
    } else {
        (f(), g())
    }
}

/// The operand `src` (`rows x cols` row-major) rounded to the posit in f64, and the 2-norm
/// of each row (`along_rows`) or each column, in one pass; blocks of rows in parallel where
/// `parallel` and the operand is large.
fn prepare(
    posit: Posit,
    src: &[f32],
    (rows, cols): (usize, usize),
    along_rows: bool,
    parallel: bool,
) -> (Scratch<f64>, Vec<f64>) {
    let plan = if values_are_f32(posit) {
        F32Plan::shared(&Format::Posit(posit), RuleKind::NearestEven)
    } else {
        None
    };
    let src = &src[..rows * cols];
    let mut values = scratch::take::<f64>(src.len());
    if rows == 0 || cols == 0 {
        return (values, vec![0.0; if along_rows { rows } else { cols }]);
    }
    let block = |src: &[f32], dst: &mut [f64]| {
        round_rows(posit, plan.as_deref(), src, dst, cols, along_rows)
    };
    let block_len = (BLOCK / cols).max(1) * cols;
    let sums = if !parallel || src.len() <= block_len {
        block(src, &mut values)
    } else if along_rows {
        let blocks = src
            .par_chunks(block_len)
            .zip(values.par_chunks_mut(block_len));
        blocks.flat_map_iter(|(s, d)| block(s, d)).collect()
    } else {
        src.par_chunks(block_len)
            .zip(values.par_chunks_mut(block_len))
            .map(|(s, d)| block(s, d))
            .reduce_with(|mut x, y| {
                x.iter_mut().zip(&y).for_each(|(s, t)| *s += t);
                x
            })
            .unwrap_or_else(|| vec![0.0; cols])
    };
    (values, sums.into_iter().map(f64::sqrt).collect())
}

/// Values per piece of [`round_rows`], staged on the stack between rounding and widening.
const STAGE: usize = 512;

/// Whole rows `src` (of `cols` values) rounded to the posit into `dst` in f64; returns the
/// sum of squares of each row (`along_rows`) or of each column over these rows, summed in
/// any order (see the module docs). Pieces of [`STAGE`] values are rounded by the quantize
/// kernel's f32 plan where there is one (the same values as `Posit::round`), then widened
/// and squared while still in the L1 cache.
fn round_rows(
    posit: Posit,
    plan: Option<&F32Plan>,
    src: &[f32],
    dst: &mut [f64],
    cols: usize,
    along_rows: bool,
) -> Vec<f64> {
    let round = |x: f64| posit.round(x, NearestEven, 0);
    let mut sums = vec![0.0; if along_rows { src.len() / cols } else { cols }];
    let mut stage = [0f32; STAGE];
    for (r, (src, dst)) in src.chunks(cols).zip(dst.chunks_mut(cols)).enumerate() {
        let mut row_sum = 0.0;
        for (p, (src, dst)) in src.chunks(STAGE).zip(dst.chunks_mut(STAGE)).enumerate() {
            let squares = if along_rows {
                Squares::Row(&mut row_sum)
            } else {
                Squares::Columns(&mut sums[p * STAGE..p * STAGE + dst.len()])
            };
            match plan {
                Some(plan) => {
                    let stage = &mut stage[..src.len()];
                    crate::backend::cpu::round_nearest_run(plan, src, stage, round);
                    widen(stage, dst, squares);
                }
                None => {
                    for (d, &x) in dst.iter_mut().zip(src) {
                        *d = round(f64::from(x));
                    }
                    squares.add(dst);
                }
            }
        }
        if along_rows {
            sums[r] = row_sum;
        }
    }
    sums
}

/// Where [`widen`] adds the squares of a piece of values.
enum Squares<'a> {
    /// Into one running sum (a row's).
    Row(&'a mut f64),
    /// Each into its column's sum.
    Columns(&'a mut [f64]),
}

impl Squares<'_> {
    /// Adds the squares of `v` (in the same order on every instruction set: no fused
    /// operations are formed, and each sum's terms are added in `v`'s order by lane).
    #[inline(always)]
    fn add(self, v: &[f64]) {
        match self {
            Squares::Row(sum) => *sum += sum_of_squares(v),
            Squares::Columns(acc) => {
                for (s, &x) in acc.iter_mut().zip(v) {
                    *s += x * x;
                }
            }
        }
    }
}

/// `dst = f64(src)` and the squares of `dst` added to `squares`, on the widest
/// instruction set this CPU runs (the same values on each).
fn widen(src: &[f32], dst: &mut [f64], squares: Squares) {
    #[inline(always)]
    fn body(src: &[f32], dst: &mut [f64], squares: Squares) {
        for (d, &x) in dst.iter_mut().zip(src) {
            *d = f64::from(x);
        }
        squares.add(dst);
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn avx512(src: &[f32], dst: &mut [f64], squares: Squares) {
        body(src, dst, squares)
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn avx2(src: &[f32], dst: &mut [f64], squares: Squares) {
        body(src, dst, squares)
    }
    match crate::backend::isa::active() {
        // SAFETY: `isa::active` names only instruction sets this CPU has.
        #[cfg(target_arch = "x86_64")]
        crate::backend::isa::Isa::Avx512 => unsafe { avx512(src, dst, squares) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        crate::backend::isa::Isa::Avx2 => unsafe { avx2(src, dst, squares) },
        _ => body(src, dst, squares),
    }
}

/// Elements per parallel block of the operand passes: smaller operands are one block, on
/// the calling thread (a hand-off to the pool costs more than the pass).
const BLOCK: usize = 1 << 16;

/// The 2-norm `sqrt(Σ v²)` of each row (`along_rows`) or each column of `v` (`rows x cols`,
/// row-major), summed in any order (see the module docs); NaN or Inf where a value is not
/// finite. Blocks of rows run in parallel where `parallel` and the matrix is large.
pub(crate) fn norms(
    v: &[f64],
    (rows, cols): (usize, usize),
    along_rows: bool,
    parallel: bool,
) -> Vec<f64> {
    if rows == 0 || cols == 0 {
        return vec![0.0; if along_rows { rows } else { cols }];
    }
    let v = &v[..rows * cols];
    let block_len = (BLOCK / cols).max(1) * cols;
    let sums = if along_rows {
        let row_sums =
            |block: &[f64]| -> Vec<f64> { block.chunks(cols).map(sum_of_squares).collect() };
        if !parallel || v.len() <= block_len {
            row_sums(v)
        } else {
            v.par_chunks(block_len).flat_map_iter(row_sums).collect()
        }
    } else {
        let column_sums = |block: &[f64]| {
            let mut acc = vec![0.0; cols];
            for r in block.chunks(cols) {
                for (s, x) in acc.iter_mut().zip(r) {
                    *s += x * x;
                }
            }
            acc
        };
        if !parallel || v.len() <= block_len {
            column_sums(v)
        } else {
            v.par_chunks(block_len)
                .map(column_sums)
                .reduce_with(|mut x, y| {
                    x.iter_mut().zip(&y).for_each(|(s, t)| *s += t);
                    x
                })
                .unwrap_or_else(|| vec![0.0; cols])
        }
    };
    sums.into_iter().map(f64::sqrt).collect()
}

/// `Σ x²` in eight interleaved partial sums (any order serves the bound; this one
/// vectorises).
#[inline]
pub(crate) fn sum_of_squares(v: &[f64]) -> f64 {
    let (groups, tail) = v.as_chunks::<8>();
    let mut acc = [0.0; 8];
    for g in groups {
        for l in 0..8 {
            acc[l] += g[l] * g[l];
        }
    }
    let mut total = acc.iter().sum::<f64>();
    for x in tail {
        total += x * x;
    }
    total
}

/// The f64 GEMM into `out` (`m x n`), the check and the exact fallbacks in place, and each
/// row also as f32 into `out32` where given; returns the number of fallbacks.
fn run(
    posit: Posit,
    ops: &Prepared,
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    out32: Option<&mut [f32]>,
    parallel: bool,
) -> usize {
    let (m, k, n) = dims;
    if m == 0 || n == 0 {
        return 0;
    }
    for i in 0..m {
        for (j, o) in out[i * n..i * n + n].iter_mut().enumerate() {
            *o = bias.at(i, j).unwrap_or(0.0);
        }
    }
    let par = if parallel && m * n * k >= 1 << 15 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    dgemm_strided(dims, ops.a, ops.b, out, par);
    let norms = (ops.a_norms, ops.b_norms);
    let term = |i: usize, j: usize, u: usize| (ops.a.at(i, u), ops.b.at(u, j));
    check(posit, dims, norms, bias, term, out, out32, parallel)
}

/// The check and the exact fallbacks (see the module docs) of f64 sums already in `out`
/// (`m x n`, row-major, each output's terms and bias summed by some binary tree of f64
/// additions, products rounded or fused, so that the module docs' bound holds), in place,
/// each row also as f32 into `out32` where given; returns the number of fallbacks.
///
/// `norms` are the 2-norms of `A`'s rows and `B`'s columns (computed in any order, not
/// finite where they hold a NaR); `term(i, j, u)` is the pair `(A[i, u], B[u, j])` of
/// output `(i, j)`'s term `u < k`, for its exact sum.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check<T>(
    posit: Posit,
    dims: Dims,
    (a_norms, b_norms): (&[f64], &[f64]),
    bias: Bias,
    term: T,
    out: &mut [f64],
    out32: Option<&mut [f32]>,
    parallel: bool,
) -> usize
where
    T: Fn(usize, usize, usize) -> (f64, f64) + Sync,
{
    let (m, k, n) = dims;
    if m == 0 || n == 0 {
        return 0;
    }
    let c = (k + 1) as f64 * pow2(-52);
    let ends = Ends::new(posit);
    let maxpos = posit.max_pos();
    // |bias| per column (zeros without a column bias) and per row.
    let col_bias: Vec<f64> = match bias {
        Bias::PerCol(v) => v[..n].iter().map(|x| x.abs()).collect(),
        _ => vec![0.0; n],
    };
    let row_bias = |i: usize| match bias {
        Bias::PerRow(v) => v[i].abs(),
        _ => 0.0,
    };
    let fallbacks = AtomicUsize::new(0);
    let row = |i: usize, dst: &mut [f64]| {
        let na = a_norms[i];
        let rb = row_bias(i);
        // The bound of output (i, j) (see the module docs): not finite for NaR.
        let bound = |j: usize| c * (na * b_norms[j] + (col_bias[j] + rb));
        let mut count = 0;
        // The scalar decision, for what the vector pass leaves: NaR, or the two ends'
        // roundings (the exact sum where they differ).
        let mut settle = |j: usize, o: &mut f64, lo: f64, hi: f64| {
            let e = bound(j);
            *o = if !e.is_finite() {
                f64::NAN
            } else {
                let (rl, rh) = (
                    posit.round(lo, NearestEven, 0),
                    posit.round(hi, NearestEven, 0),
                );
                if rl == rh {
                    rl
                } else {
                    count += 1;
                    exact_output(posit, k, |u| term(i, j, u), bias.at(i, j))
                }
            };
        };
        match &ends {
            Ends::F32(plan) => {
                let lanes = plan.lanes();
                let low = below_round_bit(posit);
                let consts = GroupConsts {
                    na,
                    rb,
                    c,
                    maxpos,
                    low,
                };
                for (g, chunk) in dst.chunks_mut(GROUP).enumerate() {
                    let j0 = g * GROUP;
                    let len = chunk.len();
                    // A short last group is padded with zero sums and bounds (exact zeros).
                    let mut sums = [0.0; GROUP];
                    let mut nb = [0.0; GROUP];
                    let mut cb = [0.0; GROUP];
                    sums[..len].copy_from_slice(chunk);
                    nb[..len].copy_from_slice(&b_norms[j0..j0 + len]);
                    cb[..len].copy_from_slice(&col_bias[j0..j0 + len]);
                    let group = check_group(&lanes, &consts, &sums, &nb, &cb);
                    for (l, o) in chunk.iter_mut().enumerate() {
                        if group.flagged[l] == 0 {
                            *o = f64::from(f32::from_bits(group.rounded[l]));
                        } else {
                            let (lo, hi) = (group.lo[l], group.hi[l]);
                            settle(j0 + l, o, f64::from(lo), f64::from(hi));
                        }
                    }
                }
            }
            Ends::F64 => {
                for (j, o) in dst.iter_mut().enumerate() {
                    let e = bound(j);
                    let (lo, hi) = if e > 0.0 {
                        ((*o - e).next_down(), (*o + e).next_up())
                    } else {
                        (*o, *o)
                    };
                    settle(j, o, lo, hi);
                }
            }
        }
        fallbacks.fetch_add(count, Ordering::Relaxed);
    };
    // Rows per parallel task: at least ROW_TASK outputs each.
    let min_rows = ROW_TASK.div_ceil(n).max(1);
    match out32 {
        None if parallel => out[..m * n]
            .par_chunks_mut(n)
            .enumerate()
            .with_min_len(min_rows)
            .for_each(|(i, r)| row(i, r)),
        None => for_rows(out, m, n, false, row),
        Some(o) => {
            let job = |(i, (sums, dst)): (usize, (&mut [f64], &mut [f32]))| {
                row(i, sums);
                for (d, &v) in dst.iter_mut().zip(sums.iter()) {
                    *d = v as f32;
                }
            };
            let (sums, o) = (&mut out[..m * n], &mut o[..m * n]);
            if parallel {
                sums.par_chunks_mut(n)
                    .zip(o.par_chunks_mut(n))
                    .enumerate()
                    .with_min_len(min_rows)
                    .for_each(job);
            } else {
                sums.chunks_mut(n)
                    .zip(o.chunks_mut(n))
                    .enumerate()
                    .for_each(job);
            }
        }
    }
    fallbacks.into_inner()
}

/// Outputs per parallel task of the check, at least (smaller GEMMs check on one thread).
const ROW_TASK: usize = 1 << 13;

/// Outputs per group of the vectorised check (one AVX-512 vector of f32).
const GROUP: usize = 16;

/// What a row's groups share: the row's norm and bias magnitude, `C`, maxpos, and the
/// f32 bits below the finest rounding position's round bit ([`below_round_bit`]).
struct GroupConsts {
    na: f64,
    rb: f64,
    c: f64,
    maxpos: f64,
    low: u32,
}

/// `L = 22 - f`, with `f = n - 3 - es` the most fraction bits a posit of the format holds
/// (the shortest regime, 2 bits): rounding an f32 to the posit drops at least its `23 - f`
/// lowest fraction bits, so its round bit is bit `L` of the f32 or above, and its sticky
/// bits include bits `0..L`. Two f32 of one sign that agree on every bit from `L` up
/// (binade included) and both have a nonzero bit below `L` have the same round bit, the
/// same kept bits and both a set sticky bit, wherever the posit rounds them: they round to
/// the same posit (neither is a tie). [`check_group_body`] takes that as proof that the
/// interval's ends agree without rounding the upper end.
fn below_round_bit(posit: Posit) -> u32 {
    22 - (posit.n() - 3 - posit.es())
}

/// One group's check: the f32 ends, the rounding where both ends agree, and a flag where
/// the scalar decision must settle the output (the ends differ, an end needs the plan's
/// general path, or the bound is not finite: NaR).
struct Group {
    lo: [f32; GROUP],
    hi: [f32; GROUP],
    rounded: [u32; GROUP],
    flagged: [u32; GROUP],
}

/// [`Group`] of the sums `s` with column norms `nb` and column bias magnitudes `cb`, on the
/// widest instruction set this CPU runs (every path computes the same values: no fused
/// operations are formed).
fn check_group(
    lanes: &NearestLanes,
    k: &GroupConsts,
    s: &[f64; GROUP],
    nb: &[f64; GROUP],
    cb: &[f64; GROUP],
) -> Group {
    match crate::backend::isa::active() {
        // SAFETY: `isa::active` names only instruction sets this CPU has.
        #[cfg(target_arch = "x86_64")]
        crate::backend::isa::Isa::Avx512 => unsafe { check_group_avx512(lanes, k, s, nb, cb) },
        #[cfg(target_arch = "x86_64")]
        crate::backend::isa::Isa::Avx2 => unsafe { check_group_avx2(lanes, k, s, nb, cb) },
        _ => check_group_body(lanes, k, s, nb, cb),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl")]
fn check_group_avx512(
    lanes: &NearestLanes,
    k: &GroupConsts,
    s: &[f64; GROUP],
    nb: &[f64; GROUP],
    cb: &[f64; GROUP],
) -> Group {
    check_group_body(lanes, k, s, nb, cb)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn check_group_avx2(
    lanes: &NearestLanes,
    k: &GroupConsts,
    s: &[f64; GROUP],
    nb: &[f64; GROUP],
    cb: &[f64; GROUP],
) -> Group {
    check_group_body(lanes, k, s, nb, cb)
}

#[inline(always)]
fn check_group_body(
    lanes: &NearestLanes,
    k: &GroupConsts,
    s: &[f64; GROUP],
    nb: &[f64; GROUP],
    cb: &[f64; GROUP],
) -> Group {
    let mut g = Group {
        lo: [0.0; GROUP],
        hi: [0.0; GROUP],
        rounded: [0; GROUP],
        flagged: [0; GROUP],
    };
    let mut e = [0.0; GROUP];
    let mut same = [false; GROUP];
    let below = (1u32 << k.low) - 1;
    for l in 0..GROUP {
        e[l] = k.c * (k.na * nb[l] + (cb[l] + k.rb));
        let (lo, hi) = ends_f32(s[l], e[l], k.maxpos);
        g.lo[l] = lo;
        g.hi[l] = hi;
        let (a, b) = (lo.to_bits(), hi.to_bits());
        same[l] = ((a ^ b) >> k.low == 0) & (a & below != 0) & (b & below != 0);
    }
    let outs = g.rounded.iter_mut().zip(g.flagged.iter_mut());
    let ends = g.lo.iter().zip(&g.hi).zip(&e);
    if same.iter().all(|&x| x) {
        // Every pair of ends rounds alike ([`below_round_bit`]): one rounding each.
        for ((rounded, flagged), ((&lo, _), e)) in outs.zip(ends) {
            let (pl, slow) = lanes.round::<SHAPE_POSIT>(lo);
            *rounded = pl;
            *flagged = (slow | !e.is_finite()) as u32;
        }
        return g;
    }
    for ((rounded, flagged), ((&lo, &hi), e)) in outs.zip(ends) {
        let (pl, slow_l) = lanes.round::<SHAPE_POSIT>(lo);
        let (ph, slow_h) = lanes.round::<SHAPE_POSIT>(hi);
        *rounded = pl;
        *flagged = (slow_l | slow_h | (pl != ph) | !e.is_finite()) as u32;
    }
    g
}

/// The interval `[ŝ - e, ŝ + e]` widened outward to f32 ends, clamped to ±maxpos (see the
/// module docs); `ŝ` itself where `e = 0`.
#[inline(always)]
fn ends_f32(s: f64, e: f64, maxpos: f64) -> (f32, f32) {
    let lo = (s - e).max(-maxpos).min(maxpos);
    let hi = (s + e).max(-maxpos).min(maxpos);
    let (l, h) = (lo as f32, hi as f32);
    let widen = e > 0.0;
    let l = if widen & (f64::from(l) >= lo) {
        step_down(l)
    } else {
        l
    };
    let h = if widen & (f64::from(h) <= hi) {
        -step_down(-h)
    } else {
        h
    };
    (l, h)
}

/// The next f32 below a finite `x` (branch-free, so that the check vectorises).
#[inline(always)]
fn step_down(x: f32) -> f32 {
    let b = x.to_bits();
    let bits = if x > 0.0 {
        b.wrapping_sub(1)
    } else if x < 0.0 {
        b.wrapping_add(1)
    } else {
        0x8000_0001 // below ±0: the negative subnormal nearest zero
    };
    f32::from_bits(bits)
}

/// One output summed exactly and rounded once: the products of its `k` terms `term(u)` in
/// i128 chunks of at most `2^(126 - 4s)` (whose sums stay below 2^126) gathered in a
/// [`Quire`] where `2s <= 62`, else each product into the quire; the bias last.
fn exact_output(
    posit: Posit,
    k: usize,
    term: impl Fn(usize) -> (f64, f64),
    bias: Option<f64>,
) -> f64 {
    let s = posit.max_scale();
    if 2 * s <= 62 {
        if let Some(v) = exact_output_i128(posit, k, &term, bias) {
            return v;
        }
    }
    let mut q = Quire::new(posit).expect("formats are checked by the ops");
    if 2 * s <= 62 {
        let scale = pow2(s);
        let to_int = |v: f64| (v * scale) as i64 as i128;
        let chunk = i128_chunk(s);
        let mut t = 0;
        while t < k {
            let end = t.saturating_add(chunk).min(k);
            let sum: i128 = (t..end)
                .map(|u| {
                    let (a, b) = term(u);
                    to_int(a) * to_int(b)
                })
                .sum();
            q.add_units(sum);
            t = end;
        }
    } else {
        for u in 0..k {
            let (a, b) = term(u);
            q.add_exact_product(a, b);
        }
    }
    if let Some(v) = bias {
        q.add_exact_product(v, 1.0);
    }
    q.to_posit()
}

/// Products of posits with `maxpos = 2^s` (each at most `2^4s` units of `minpos^2`) one
/// i128 sums without overflow: `2^(126 - 4s)`, at least one.
fn i128_chunk(s: i32) -> usize {
    1usize
        .checked_shl((126 - 4 * s) as u32)
        .unwrap_or(usize::MAX)
        .max(1)
}

/// [`exact_output`] without a [`Quire`], for `2s <= 62` (`maxpos = 2^s`): where the `k`
/// products fit one i128 sum ([`i128_chunk`]) and the bias is a multiple of `minpos`, the
/// total in units of `minpos^2` is exact in an i128, and its f64 rounded to odd
/// ([`i128_to_f64_odd`], scaled exactly), rounded once more to the posit, is the total's
/// rounding ([`super::round_odd`]: posits with `2s <= 62` keep far fewer than 51 fraction
/// bits). `None` otherwise (the quire then sums).
///
/// The exact path runs for outputs on or near a rounding boundary or whose interval
/// straddles zero. In training, a patch repeated across images (a uniform background)
/// repeats its sum, so one sum on a boundary can send thousands of a step's outputs here.
fn exact_output_i128(
    posit: Posit,
    k: usize,
    term: &impl Fn(usize) -> (f64, f64),
    bias: Option<f64>,
) -> Option<f64> {
    let s = posit.max_scale();
    if k > i128_chunk(s) {
        return None;
    }
    let scale = pow2(s);
    let to_int = |v: f64| (v * scale) as i64 as i128;
    let mut sum: i128 = (0..k)
        .map(|u| {
            let (a, b) = term(u);
            to_int(a) * to_int(b)
        })
        .sum();
    if let Some(v) = bias {
        // A posit bias is `c · minpos`, `|c| <= 2^2s`: `c · 2^s` units of minpos^2.
        let c = v * scale;
        if c.fract() != 0.0 || c.abs() > pow2(2 * s) {
            return None;
        }
        sum += (c as i128) << s;
    }
    Some(posit.round(i128_to_f64_odd(sum) * pow2(-2 * s), NearestEven, 0))
}
