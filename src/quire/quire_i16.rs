//! The quire GEMM of posits whose values are i16 multiples of minpos
//! ([`super::gemm_cpu::Accumulator::I16`], posit<8,0>), from f64 or straight from f32
//! operands.
//!
//! Each operand value `v` becomes the integer `v · 2^s` (`maxpos = 2^s`, exact: `v` is a
//! multiple of `minpos = 2^-s`), laid out so that every output is a contiguous dot product:
//! `A` row-major and `B` transposed. The sums ([`super::int_dot::gemm_map`]) are exact
//! integers in units of `minpos^2`; the bias, a posit, is one more such integer. Each output
//! is rounded once to the posit as it leaves the kernel's tile ([`super::int_round`], or the
//! format's rounding where no table applies), so no matrix of sums is stored. posit<n,0>
//! on CPUs with AVX2 stores each total as the f32 that rounds like it (clamped past maxpos,
//! exact: [`super::es0_lanes::Es0Lanes::sum_value`]) and rounds the whole output in one
//! vector pass after the kernel, eight values a step by magic constants instead of one
//! table look-up each. A NaR operand
//! (NaN or ±Inf, no posit value) makes its row or column of outputs NaR.
//!
//! The f32 entry ([`gemm_f32`]) rounds each f32 operand and converts it to its integer in
//! one look-up ([`super::int_operand`]: the posit's rounding, the same values as
//! [`super::rule::GemmRule::operands`]), reading each operand in either layout, so a layer's
//! GEMMs need neither f64 copies nor transposes of their tensors. `Bᵀ`'s integers are made
//! once, on the calling thread; the output's rows are cut into one band per thread
//! (`crate::team`), each converting its own rows of `A`, summing and rounding them on its
//! thread. The integer matrices live in buffers kept per thread from one call to the next
//! (no fresh pages per call). For posit<n,0> on AVX-512, `B` is also packed once by pairs
//! of `k` ([`super::int_pairs`]), and the bands whose operands keep every sum within an i32
//! take that kernel, which reduces nothing across lanes (the others take the tiles of
//! [`super::int_dot`]).

use rayon::prelude::*;

use super::es0_lanes::Es0Lanes;
use super::gemm_cpu::{Bias, Dims};
use super::int_dot;
use super::int_operand::IntOperand;
use super::int_pairs::{self, PairPacked};
use super::int_round::IntRound;
use crate::format::grid::pow2;
use crate::format::rounding::NearestEven;
use crate::format::Posit;
use crate::team::Threading;

/// An f32 operand of a GEMM and how it is stored.
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a> {
    /// The values, row-major.
    pub data: &'a [f32],
    /// Whether `data` holds the operand's transpose (`k x m` for `A`, `n x k` for `B`).
    pub transposed: bool,
}

impl<'a> Operand<'a> {
    /// An operand stored as it is (row-major, not transposed).
    pub fn rows(data: &'a [f32]) -> Self {
        Operand {
            data,
            transposed: false,
        }
    }

    /// The operand (`rows x cols`) row-major, a copy where it is stored transposed.
    pub fn row_major(&self, rows: usize, cols: usize) -> std::borrow::Cow<'a, [f32]> {
        if !self.transposed {
            return std::borrow::Cow::Borrowed(&self.data[..rows * cols]);
        }
        // Stored `cols x rows`.
        let t = super::layer_io::transpose(&self.data[..rows * cols], cols, rows);
        std::borrow::Cow::Owned(t)
    }

    /// The values of rows `band` of the operand (`rows x cols`), stored as the operand is:
    /// row-major (`band.len() x cols`, a slice of the data) or, where it is stored
    /// transposed, as their transpose (`cols x band.len()`, gathered from the `cols` stored
    /// rows unless the band is every row).
    pub(crate) fn band(
        &self,
        (rows, cols): (usize, usize),
        band: std::ops::Range<usize>,
    ) -> std::borrow::Cow<'a, [f32]> {
        use std::borrow::Cow;
        if !self.transposed {
            Cow::Borrowed(&self.data[band.start * cols..band.end * cols])
        } else if band.len() == rows {
            Cow::Borrowed(&self.data[..cols * rows])
        } else {
            let runs =
                (0..cols).flat_map(|u| &self.data[u * rows + band.start..u * rows + band.end]);
            Cow::Owned(runs.copied().collect())
        }
    }
}

/// An integer matrix with a NaR flag per row.
struct IntMatrix {
    values: Vec<i16>,
    nar: Vec<bool>,
}

/// Rows of an integer matrix per task of [`int_matrix`].
const INT_ROWS: usize = 64;

/// Columns of an integer matrix per block of [`int_matrix`]'s transposed reading.
const INT_COLS: usize = 16;

/// `rows x cols` integers `v · scale` of the matrix `src` holds row-major (`rows x cols`),
/// or, where `transposed`, as its transpose (`cols x rows`); row `r` flagged where a value
/// is not finite. A transposed source is read a run of [`INT_ROWS`] values of each of its
/// rows at a time (a task's rows), so every cache line read is used whole, and
/// [`INT_COLS`] runs are converted into a small block (contiguous loops, which vectorise)
/// before the block is written out transposed, a run of [`INT_COLS`] integers to each
/// row (a convolution's column matrices, `k` x images·pixels, are read this way).
fn int_matrix(rows: usize, cols: usize, scale: f64, src: &[f64], transposed: bool) -> IntMatrix {
    let mut values = vec![0i16; rows * cols];
    let mut nar = vec![false; rows];
    if cols > 0 {
        values
            .par_chunks_mut(INT_ROWS * cols)
            .zip(nar.par_chunks_mut(INT_ROWS))
            .enumerate()
            .for_each(|(blk, (dst, flags))| {
                let r0 = blk * INT_ROWS;
                if transposed {
                    let here = flags.len();
                    let mut block = [[0i16; INT_ROWS]; INT_COLS];
                    let mut finite = [true; INT_ROWS];
                    for c0 in (0..cols).step_by(INT_COLS) {
                        let width = INT_COLS.min(cols - c0);
                        for (c, ints) in block[..width].iter_mut().enumerate() {
                            let run = &src[(c0 + c) * rows + r0..][..here];
                            if !scaled_ints(run, scale, &mut ints[..here]) {
                                for (f, v) in finite.iter_mut().zip(run) {
                                    *f &= v.is_finite();
                                }
                            }
                        }
                        for (r, row) in dst.chunks_exact_mut(cols).enumerate() {
                            for (d, ints) in row[c0..c0 + width].iter_mut().zip(&block) {
                                *d = ints[r];
                            }
                        }
                    }
                    for (flag, &f) in flags.iter_mut().zip(&finite) {
                        *flag = !f;
                    }
                } else {
                    for (r, (row, flag)) in dst.chunks_mut(cols).zip(flags.iter_mut()).enumerate() {
                        let from = &src[(r0 + r) * cols..(r0 + r + 1) * cols];
                        *flag = !scaled_ints(from, scale, row);
                    }
                }
            });
    }
    IntMatrix { values, nar }
}

/// `dst[i] = src[i] · scale` as integers, for values on a posit's grid scaled to integers
/// below `2^15` in magnitude (exact); whether every value of `src` is finite (a value that
/// is not gets an unspecified integer). Eight values a step on CPUs with AVX2.
fn scaled_ints(src: &[f64], scale: f64, dst: &mut [i16]) -> bool {
    assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if crate::backend::isa::active() != crate::backend::isa::Isa::Portable {
        // SAFETY: the CPU has AVX2 (`isa::active`); the lengths are equal (asserted).
        return unsafe { scaled_ints_avx2(src, scale, dst) };
    }
    scaled_ints_scalar(src, scale, dst)
}

/// [`scaled_ints`] one value at a time (also the vector form's tail).
fn scaled_ints_scalar(src: &[f64], scale: f64, dst: &mut [i16]) -> bool {
    let mut finite = true;
    for (d, &v) in dst.iter_mut().zip(src) {
        finite &= v.is_finite();
        *d = (v * scale) as i16;
    }
    finite
}

/// [`scaled_ints`] eight values a step (two vectors of four f64): truncating conversions to
/// i32 (exact for integers) packed to i16, and `v · 0 = 0` exactly for the finite `v`.
///
/// # Safety
/// The CPU has AVX2; `src` and `dst` have the same length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scaled_ints_avx2(src: &[f64], scale: f64, dst: &mut [i16]) -> bool {
    use std::arch::x86_64::*;
    let (s, zero) = (_mm256_set1_pd(scale), _mm256_setzero_pd());
    let mut finite = _mm256_cmp_pd::<_CMP_EQ_OQ>(zero, zero);
    let whole = src.len() / 8 * 8;
    let (body, src_tail) = src.split_at(whole);
    let (dst_body, dst_tail) = dst.split_at_mut(whole);
    for (from, to) in body.chunks_exact(8).zip(dst_body.chunks_exact_mut(8)) {
        // SAFETY: each chunk holds eight values.
        let (v0, v1) = unsafe {
            (
                _mm256_mul_pd(_mm256_loadu_pd(from.as_ptr()), s),
                _mm256_mul_pd(_mm256_loadu_pd(from.as_ptr().add(4)), s),
            )
        };
        let ok0 = _mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_mul_pd(v0, zero), zero);
        let ok1 = _mm256_cmp_pd::<_CMP_EQ_OQ>(_mm256_mul_pd(v1, zero), zero);
        finite = _mm256_and_pd(finite, _mm256_and_pd(ok0, ok1));
        let ints = _mm_packs_epi32(_mm256_cvttpd_epi32(v0), _mm256_cvttpd_epi32(v1));
        // SAFETY: as above.
        unsafe { _mm_storeu_si128(to.as_mut_ptr().cast(), ints) };
    }
    let tail_finite = scaled_ints_scalar(src_tail, scale, dst_tail);
    _mm256_movemask_pd(finite) == 0xf && tail_finite
}

/// `out = round(A · B + bias)` for f64 operands on the posit's grid, `a` (`m x k`) and `b`
/// (`k x n`) row-major.
pub fn gemm_f64(
    posit: Posit,
    a: &[f64],
    b: &[f64],
    dims: Dims,
    bias: Bias,
    out: &mut [f64],
    parallel: bool,
) {
    let (m, k, n) = dims;
    let scale = pow2(posit.max_scale());
    let ai = int_matrix(m, k, scale, a, false);
    let bt = int_matrix(n, k, scale, b, true);
    let mut vals = vec![0f32; m * n];
    let ints = IntMatrices {
        a: &ai.values,
        a_nar: &ai.nar,
        bt: &bt.values,
        bt_nar: &bt.nar,
        bt_pairs: None,
    };
    finish(posit, &ints, dims, bias, &mut vals, parallel);
    out[..m * n]
        .iter_mut()
        .zip(&vals)
        .for_each(|(o, &v)| *o = f64::from(v));
}

/// Scratch buffers above this many i16 are freed after the call instead of kept.
const KEEP_SCRATCH: usize = 8 << 20;

thread_local! {
    /// `Bᵀ`'s integers of the last call that laid it out on this thread, reused by the next.
    static COLUMNS: std::cell::Cell<Vec<i16>> = const { std::cell::Cell::new(Vec::new()) };
    /// The integers of the last band of `A`'s rows this thread ran, reused by the next.
    static ROWS: std::cell::Cell<Vec<i16>> = const { std::cell::Cell::new(Vec::new()) };
}

/// i16 values per 64 bytes (a cache line, and a 512-bit register).
const LINE: usize = 32;

/// `len` elements of `v` starting on a 64-byte boundary (values left from earlier use): the
/// kernels' whole-register loads of rows that start there never straddle two cache lines,
/// which measured up to 1.7x faster at 1024³ on AVX-512.
fn aligned(v: &mut Vec<i16>, len: usize) -> &mut [i16] {
    if v.len() < len + LINE {
        v.resize(len + LINE, 0);
    }
    let skip = (64 - v.as_ptr() as usize % 64) % 64 / 2;
    &mut v[skip..skip + len]
}

/// `v` back into this thread's `slot`, unless large.
fn keep(slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<i16>>>, v: Vec<i16>) {
    if v.len() <= KEEP_SCRATCH {
        slot.with(|c| c.set(v));
    }
}

/// `round(A · B + bias)` (`m x n`, row-major f32) for f32 operands not yet rounded to the
/// posit (see the module docs); the bias already rounded. `None` where the posit has no
/// operand table ([`IntOperand`]; then use the f64 path).
///
/// `Bᵀ` is laid out once, on the calling thread. Where `parallel` and `A` has enough rows
/// (`team::Threading::of`), the output rows are cut into one band per thread of rayon's
/// pool, shared with the caller through `crate::team`: each band converts its own rows of
/// `A`, sums them against `Bᵀ` and rounds its outputs, all on its thread.
pub fn gemm_f32(
    posit: Posit,
    a: Operand,
    b: Operand,
    dims: Dims,
    bias: Bias,
    parallel: bool,
) -> Option<Vec<f32>> {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let conv = IntOperand::get(posit)?;
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return Some(out);
    }
    let (bands, inside) = Threading::of(parallel, dims).bands();
    // Rows padded with zeros to whole cache lines, which leave every sum as it is.
    let kp = k.div_ceil(LINE) * LINE;
    // Taken out of the thread's scratch: a call nested on this thread while this one waits
    // finds it empty and allocates its own.
    let mut bv = COLUMNS.with(|c| c.take());
    let bv_ref = &mut bv;
    let conv = &*conv;
    let columns = move || {
        // Moving the borrow out makes this closure `FnOnce`, free to hand it on.
        let bv = bv_ref;
        // `Bᵀ` row-major (n x kp): `B` stored transposed is `Bᵀ`.
        let bi = aligned(bv, n * kp);
        let mut b_nar = vec![false; n];
        conv.fill_padded(b.data, !b.transposed, (n, k), (bi, kp), &mut b_nar, inside);
        // posit<n,0> on AVX-512: `B` packed by pairs of `k` for the kernel without
        // reductions (`finish_es0`).
        let pairs = es0_lanes(posit).and_then(|_| PairPacked::new(bi, n, kp));
        (&*bi, b_nar, pairs)
    };
    type Columns<'c> = (&'c [i16], Vec<bool>, Option<PairPacked>);
    let band = |(bi, b_nar, pairs): &Columns, (r0, out): (usize, &mut [f32])| {
        let len = out.len() / n;
        let mut av = ROWS.with(|c| c.take());
        let ai = aligned(&mut av, len * kp);
        let mut a_nar = vec![false; len];
        let rows = a.band((m, k), r0..r0 + len);
        conv.fill_padded(&rows, a.transposed, (len, k), (ai, kp), &mut a_nar, inside);
        let ints = IntMatrices {
            a: ai,
            a_nar: &a_nar,
            bt: bi,
            bt_nar: b_nar,
            bt_pairs: pairs.as_ref(),
        };
        let bias = match bias {
            Bias::PerRow(v) => Bias::PerRow(&v[r0..r0 + len]),
            other => other,
        };
        finish(posit, &ints, (len, kp, n), bias, out, inside);
        keep(&ROWS, av);
    };
    let tasks = crate::team::row_bands(&mut out, n, bands, 1);
    crate::team::run(bands - 1, columns, tasks, band);
    keep(&COLUMNS, bv);
    Some(out)
}

/// The integer operands of one GEMM: `A` (`m x k`) and `Bᵀ` (`n x k`) row-major, with a
/// NaR flag per row.
struct IntMatrices<'a> {
    a: &'a [i16],
    a_nar: &'a [bool],
    bt: &'a [i16],
    bt_nar: &'a [bool],
    /// `B` packed by pairs of `k` ([`int_pairs`]), where the f32 entry built it.
    bt_pairs: Option<&'a PairPacked>,
}

/// The exact sums, each rounded (with its bias term) as it leaves the kernel, into `out`.
fn finish(
    posit: Posit,
    ints: &IntMatrices,
    dims: Dims,
    bias: Bias,
    out: &mut [f32],
    parallel: bool,
) {
    let s = posit.max_scale();
    let scale = pow2(s);
    let unit = pow2(-2 * s);
    // The bias terms as integers in units of minpos^2 (a posit is one), per row or per
    // column, and the rows and columns whose outputs are NaR.
    let (m, _, n) = dims;
    let (mut row_term, mut col_term) = (vec![0i64; m], vec![0i64; n]);
    let (mut row_nar, mut col_nar) = (ints.a_nar.to_vec(), ints.bt_nar.to_vec());
    let (values, terms, nar): (&[f64], _, _) = match bias {
        Bias::None => (&[], &mut row_term, &mut row_nar),
        Bias::PerRow(v) => (v, &mut row_term, &mut row_nar),
        Bias::PerCol(v) => (v, &mut col_term, &mut col_nar),
    };
    for ((term, flag), &v) in terms.iter_mut().zip(nar.iter_mut()).zip(values) {
        *flag |= !v.is_finite();
        *term = if v.is_finite() {
            (v * scale * scale) as i64
        } else {
            0
        };
    }
    // posit<n,0> where the vector code runs: no tables.
    if let Some(lanes) = es0_lanes(posit) {
        let terms = (&row_term[..], &col_term[..]);
        finish_es0(
            &lanes,
            ints,
            dims,
            terms,
            (&row_nar, &col_nar),
            out,
            parallel,
        );
        return;
    }
    // The total is below 2^53 in magnitude (`accumulator_for`).
    let total = |i: usize, j: usize, sum: i64| {
        (!(row_nar[i] | col_nar[j])).then(|| sum + row_term[i] + col_term[j])
    };
    // Whether any column of each group of four (the kernel's tiles) is NaR.
    let quad_nar: Vec<bool> = col_nar.chunks(4).map(|c| c.iter().any(|&f| f)).collect();
    let kernel = int_dot::Kernel::best();
    let table = IntRound::get(posit);
    let table = table.as_deref();
    // One exact total to its posit: by the table where there is one, else by `Posit::round`.
    let round = |t: i64| match table {
        Some(table) => table.round(t),
        None => posit.round(t as f64 * unit, NearestEven, 0) as f32,
    };
    int_dot::gemm_map(
        kernel,
        ints.a,
        ints.bt,
        dims,
        out,
        parallel,
        |i, j, s, dst| match table {
            // A full tile with no NaR: the four totals without the NaR checks.
            Some(table) if dst.len() == 4 && !row_nar[i] && !quad_nar[j / 4] => {
                let (r, c) = (row_term[i], &col_term[j..j + 4]);
                let t = [
                    s[0] + r + c[0],
                    s[1] + r + c[1],
                    s[2] + r + c[2],
                    s[3] + r + c[3],
                ];
                for (d, v) in dst.iter_mut().zip(t) {
                    *d = table.round(v);
                }
            }
            _ => {
                for (c, d) in dst.iter_mut().enumerate() {
                    *d = total(i, j + c, s[c]).map_or(f32::NAN, &round);
                }
            }
        },
    );
}

/// [`finish`] for posit<n,0> where its vector rounding runs: every total as the f32 that
/// rounds like it ([`Es0Lanes::sum_value`], in the tile's registers on AVX2), NaR rows and
/// columns NaN, then the whole output rounded in one vector pass.
#[allow(clippy::too_many_arguments)]
fn finish_es0(
    lanes: &Es0Lanes,
    ints: &IntMatrices,
    dims: Dims,
    (row_term, col_term): (&[i64], &[i64]),
    (row_nar, col_nar): (&[bool], &[bool]),
    out: &mut [f32],
    parallel: bool,
) {
    let (m, k, n) = dims;
    let kernel = int_dot::Kernel::best();
    let bounds = lanes.sum_bounds();
    let terms = (row_term, col_term);
    let paired = ints
        .bt_pairs
        .is_some_and(|b| int_pairs::gemm_clamped(ints.a, b, (m, k), terms, bounds, out, parallel));
    if !paired {
        int_dot::gemm_clamped(kernel, ints.a, ints.bt, dims, terms, bounds, out, parallel);
    }
    let out = &mut out[..m * n];
    // NaR columns, once: most products have none, and the scan of every output cost about
    // 5% of a 1024³ product.
    let nar_cols: Vec<usize> = (0..n).filter(|&j| col_nar[j]).collect();
    for (row, &bad) in out.chunks_mut(n).zip(row_nar) {
        if bad {
            row.fill(f32::NAN);
        } else {
            for &j in &nar_cols {
                row[j] = f32::NAN;
            }
        }
    }
    // NaN (NaR) stays NaN.
    if parallel {
        out.par_chunks_mut(ROUND_CHUNK)
            .for_each(|c| lanes.round_in_place(c));
    } else {
        lanes.round_in_place(out);
    }
}

/// posit<n,0>'s vector rounding, where it runs.
fn es0_lanes(posit: Posit) -> Option<Es0Lanes> {
    Es0Lanes::new(posit).filter(|_| Es0Lanes::available())
}

/// Outputs per task of the rounding pass of posit<n,0>.
const ROUND_CHUNK: usize = 1 << 14;
