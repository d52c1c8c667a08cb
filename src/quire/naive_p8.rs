//! The naive GEMM of posit<8,0>: `c = round(c + round(a_t · b_t))` from `c = 0`, `k`
//! ascending, then `c = round(c + bias)`, every value an i16 in units of minpos
//! ([`super::p8_units`], whose module docs prove the arithmetic), summed in vector lanes
//! ([`super::p8_lanes`]).
//!
//! The operands are laid out for the kernel: `A` as product table rows (`m x k`, one byte
//! each, [`row_index`]), `B` as lane codes (`k` rows of `n` padded to whole tiles with 0,
//! whose products are 0; [`lane_code`]). From f32 ([`gemm_f32`]) they are rounded and
//! converted to units by the quire's operand table ([`IntOperand`], reading each operand in
//! its stored layout), then to keys by the vector conversions; `B` stored transposed (a
//! linear layer's weight) is converted as stored and transposed in blocks. From f64
//! ([`gemm_f64`]) each value's pattern comes from the operation tables ([`OpTables`]),
//! which round a value off the grid. The buffers are kept per thread between calls.
//!
//! A NaR operand (NaN or ±Inf) makes its row or column of outputs NaR, as does a NaR bias
//! term; the kernels read 0 in its place and the output is overwritten. From f32, the
//! output's rows are cut into one band per thread, each laying out its own rows of `A`
//! (`crate::team`); from f64, rows go to the rayon pool two at a time (the kernel's rows).

use std::cell::Cell;

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims, OpTables};
use super::int_operand::IntOperand;
use super::p8_fp16::to_bytes;
use super::p8_lanes::{sums, to_codes, to_rows, Columns, Kernel, LANES};
use super::p8_units::{lane_code, posit8_0, row_index, P8Units};
use super::quire_i16::Operand;
use crate::format::Format;
use crate::team::Threading;

/// Rows of `A` per kernel call.
const ROWS: usize = 2;

/// The NaR pattern.
const NAR: u8 = 0x80;

/// `B`'s buffers: its codes and bytes (the kernel's operand) and the units they come from.
#[derive(Default)]
struct ColumnBuffers {
    codes: Vec<i16>,
    bytes: Vec<u8>,
    units: Vec<i16>,
}

/// A band of `A`'s rows: its table rows (the kernel's operand) and the units they come
/// from.
#[derive(Default)]
struct RowBuffers {
    rows: Vec<u8>,
    units: Vec<i16>,
}

/// Buffers above this many elements in all are freed after the call instead of kept.
const KEEP: usize = 8 << 20;

thread_local! {
    /// `B`'s buffers of the last call on this thread, reused by the next.
    static COLUMNS: Cell<ColumnBuffers> = Cell::new(ColumnBuffers::default());
    /// The row buffers of the last band this thread ran, reused by the next.
    static ROWS_KEPT: Cell<RowBuffers> = Cell::new(RowBuffers::default());
}

impl ColumnBuffers {
    /// This thread's buffers (empty when a call on this thread holds them).
    fn take() -> Self {
        COLUMNS.with(|c| c.take())
    }

    /// Back to the thread, unless large.
    fn keep(self) {
        if self.codes.len() + self.bytes.len() + self.units.len() <= KEEP {
            COLUMNS.with(|c| c.set(self));
        }
    }
}

impl RowBuffers {
    /// This thread's buffers (empty when a band on this thread holds them).
    fn take() -> Self {
        ROWS_KEPT.with(|c| c.take())
    }

    /// Back to the thread, unless large.
    fn keep(self) {
        if self.rows.len() + self.units.len() <= KEEP {
            ROWS_KEPT.with(|c| c.set(self));
        }
    }
}

/// `v` resized to `len` (old values left in place).
fn sized<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    v.resize(len, T::default());
    &mut v[..len]
}

/// `n` rounded up to a multiple of [`LANES`].
fn padded(n: usize) -> usize {
    n.div_ceil(LANES) * LANES
}

/// What the kernel needs of `B` besides its buffers ([`ColumnBuffers`]).
struct ColumnInfo {
    /// The kernel that sums.
    kernel: Kernel,
    /// `B`'s row length in its codes (`n` padded to whole tiles).
    stride: usize,
    /// Columns of `B` holding a NaR.
    col_nar: Vec<bool>,
}

/// `dst (k rows of stride) = src (n rows of k)ᵀ`, the columns from `n` on set to 0, in
/// blocks that stay in the cache.
fn transpose_padded(src: &[i16], (n, k): (usize, usize), dst: &mut [i16], stride: usize) {
    const BLOCK: usize = 32;
    let dst = &mut dst[..k * stride];
    for (t0, band) in (0..k).step_by(BLOCK).zip(dst.chunks_mut(BLOCK * stride)) {
        let rows = band.len() / stride;
        for j0 in (0..n).step_by(BLOCK) {
            for j in j0..(j0 + BLOCK).min(n) {
                let col = &src[j * k + t0..][..rows];
                for (dt, &v) in col.iter().enumerate() {
                    band[dt * stride + j] = v;
                }
            }
        }
        for row in band.chunks_mut(stride) {
            row[n..].fill(0);
        }
    }
}

/// From f64 operands (`a` `m x k`, `b` `k x n`, row-major): each value's pattern as the
/// operation tables find it (a value off the grid is rounded), then its key. Returns the
/// rows' NaR flags and `B`'s layout.
fn layout_f64(
    (rows, cols): (&mut RowBuffers, &mut ColumnBuffers),
    a: &[f64],
    b: &[f64],
    (m, k, n): Dims,
    kernel: Kernel,
) -> (Vec<bool>, ColumnInfo) {
    let ops = OpTables::get(&Format::Posit(posit8_0())).expect("posit<8,0> has tables");
    let units = &P8Units::get().units;
    let (mut row_nar, mut col_nar) = (vec![false; m], vec![false; n]);
    let a_rows = sized(&mut rows.rows, m * k);
    a_rows
        .par_chunks_mut(k.max(1))
        .zip(a[..m * k].par_chunks(k.max(1)))
        .zip(row_nar.par_iter_mut())
        .with_min_len(16)
        .for_each(|((dst, src), nar)| {
            for (d, &x) in dst.iter_mut().zip(src) {
                let p = ops.pattern(x);
                *nar |= p == NAR;
                *d = row_index(units[p as usize]);
            }
        });
    let stride = padded(n);
    let codes = sized(&mut cols.codes, k * stride);
    for (row, src) in codes
        .chunks_mut(stride.max(1))
        .zip(b.chunks(n.max(1)))
        .take(k)
    {
        for (j, (c, &x)) in row.iter_mut().zip(src).enumerate() {
            let p = ops.pattern(x);
            col_nar[j] |= p == NAR;
            *c = lane_code(units[p as usize]);
        }
        row[n..].fill(0);
    }
    if kernel.reads_bytes() {
        to_bytes(codes, (k, stride), &mut cols.bytes);
    }
    let info = ColumnInfo {
        kernel,
        stride,
        col_nar,
    };
    (row_nar, info)
}

/// `B` from f32 not yet rounded, stored as it is (`k x n`, converted row by row, its
/// columns' NaR flags read from the f32 values) or transposed (`n x k`, a linear layer's
/// weight: converted as stored, then transposed): rounded and converted to units by
/// [`IntOperand`], then to codes (and bytes, for a kernel that reads them). `par` spreads
/// the conversion over the rayon pool.
fn layout_columns_f32(
    bufs: &mut ColumnBuffers,
    b: Operand,
    (k, n): (usize, usize),
    kernel: Kernel,
    par: bool,
) -> ColumnInfo {
    let conv = IntOperand::get(posit8_0()).expect("posit<8,0> has an operand table");
    let mut col_nar = vec![false; n];
    let mut t_nar = vec![false; k];
    let stride = padded(n);
    let ColumnBuffers {
        codes,
        bytes,
        units,
    } = bufs;
    let units = sized(units, n * k);
    let codes = sized(codes, k * stride);
    if b.transposed {
        // Bᵀ (n x k) as stored: a row per column of B, with its NaR flag.
        conv.fill(b.data, false, (n, k), units, &mut col_nar, par);
        to_codes(units);
        transpose_padded(units, (n, k), codes, stride);
    } else {
        conv.fill(b.data, false, (k, n), units, &mut t_nar, par);
        for (t, row) in codes.chunks_mut(stride.max(1)).enumerate().take(k) {
            row[..n].copy_from_slice(&units[t * n..t * n + n]);
            row[n..].fill(0);
            to_codes(&mut row[..n]);
            if t_nar[t] {
                let src = &b.data[t * n..t * n + n];
                for (flag, x) in col_nar.iter_mut().zip(src) {
                    *flag |= !x.is_finite();
                }
            }
        }
    }
    if kernel.reads_bytes() {
        to_bytes(codes, (k, stride), bytes);
    }
    ColumnInfo {
        kernel,
        stride,
        col_nar,
    }
}

/// Rows `rows` of `A` (`m x k`, f32 not yet rounded, stored as it is or transposed) as
/// table rows in `bufs.rows`, through units as [`layout_columns_f32`] makes them; returns
/// their NaR flags (a band of a transposed `A` gathered first: `Operand::band`). `par`
/// spreads the conversion over the rayon pool.
fn layout_rows_f32(
    bufs: &mut RowBuffers,
    a: Operand,
    (m, k): (usize, usize),
    rows: std::ops::Range<usize>,
    par: bool,
) -> Vec<bool> {
    let conv = IntOperand::get(posit8_0()).expect("posit<8,0> has an operand table");
    let len = rows.len();
    let mut row_nar = vec![false; len];
    let units = sized(&mut bufs.units, len * k);
    let band = a.band((m, k), rows);
    conv.fill(&band, a.transposed, (len, k), units, &mut row_nar, par);
    to_rows(units, sized(&mut bufs.rows, len * k));
    row_nar
}

/// The bias terms in units (`None` for NaR), per row or per column.
enum BiasUnits {
    None,
    PerRow(Vec<Option<i16>>),
    PerCol(Vec<Option<i16>>),
}

impl BiasUnits {
    fn new(bias: Bias) -> BiasUnits {
        let units = &P8Units::get().units;
        let convert = |v: &[f64]| -> Vec<Option<i16>> {
            let ops = OpTables::get(&Format::Posit(posit8_0())).expect("posit<8,0> has tables");
            v.iter()
                .map(|&x| {
                    let p = ops.pattern(x);
                    (p != NAR).then(|| units[p as usize])
                })
                .collect()
        };
        match bias {
            Bias::None => BiasUnits::None,
            Bias::PerRow(v) => BiasUnits::PerRow(convert(v)),
            Bias::PerCol(v) => BiasUnits::PerCol(convert(v)),
        }
    }

    /// The term of output `(i, j)`: `Some(None)` for NaR.
    #[inline]
    fn at(&self, i: usize, j: usize) -> Option<Option<i16>> {
        match self {
            BiasUnits::None => None,
            BiasUnits::PerRow(v) => Some(v[i]),
            BiasUnits::PerCol(v) => Some(v[j]),
        }
    }
}

/// The outputs of a band of rows of `A` (`a_rows`, `rows x k` table rows, with their NaR
/// flags; row `first` of the GEMM first) into `out` (`rows x n`), each as
/// `to(Some(units))`, or `to(None)` where it is NaR; the kernel's rows two at a time,
/// spread over the rayon pool where `parallel`.
#[allow(clippy::too_many_arguments)]
fn sum_band<T: Send>(
    (a_rows, row_nar, first): (&[u8], &[bool], usize),
    (cols, info): (&ColumnBuffers, &ColumnInfo),
    (k, n): (usize, usize),
    bias: &BiasUnits,
    out: &mut [T],
    parallel: bool,
    to: impl Fn(Option<i16>) -> T + Sync,
) {
    if n == 0 || out.is_empty() {
        return;
    }
    let tables = P8Units::get();
    let stride = info.stride;
    let group = |g: usize, dst: &mut [T], acc: &mut Vec<i16>| {
        let r0 = g * ROWS;
        let rows = dst.len() / n;
        let a: Vec<&[u8]> = (r0..r0 + rows).map(|r| &a_rows[r * k..r * k + k]).collect();
        let b = Columns {
            codes: &cols.codes,
            stride,
            bytes: &cols.bytes,
        };
        sums(info.kernel, tables, &a, &b, k, sized(acc, rows * stride));
        for (r, (o, c)) in dst.chunks_mut(n).zip(acc.chunks(stride)).enumerate() {
            let i = first + r0 + r;
            for (j, (o, &c)) in o.iter_mut().zip(c).enumerate() {
                let nar = row_nar[r0 + r] || info.col_nar[j];
                *o = to(match bias.at(i, j) {
                    _ if nar => None,
                    None => Some(c),
                    Some(None) => None,
                    Some(Some(v)) => Some(tables.round(c + v)),
                });
            }
        }
    };
    if parallel {
        out.par_chunks_mut(ROWS * n)
            .enumerate()
            .for_each_init(Vec::new, |acc, (g, dst)| group(g, dst, acc));
    } else {
        let mut acc = Vec::new();
        for (g, dst) in out.chunks_mut(ROWS * n).enumerate() {
            group(g, dst, &mut acc);
        }
    }
}

/// `out (m x n) = A · B [+ bias]` in posit<8,0>, every multiply and add rounded, `k`
/// ascending from zero, the bias last; `a` (`m x k`), `b` (`k x n`) and the bias f64 values
/// of the posit (others are rounded to it first), NaN and ±Inf read as NaR. `parallel`
/// spreads rows over the rayon pool.
pub fn gemm_f64(a: &[f64], b: &[f64], dims: Dims, bias: Bias, out: &mut [f64], parallel: bool) {
    let (m, k, n) = dims;
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    let (mut rows, mut cols) = (RowBuffers::take(), ColumnBuffers::take());
    let (row_nar, info) = layout_f64((&mut rows, &mut cols), a, b, dims, Kernel::best());
    let bias = BiasUnits::new(bias);
    sum_band(
        (&rows.rows, &row_nar, 0),
        (&cols, &info),
        (k, n),
        &bias,
        &mut out[..m * n],
        parallel,
        |u| u.map_or(f64::NAN, |u| f64::from(u) / 64.0),
    );
    rows.keep();
    cols.keep();
}

/// [`gemm_f64`] from f32 operands not yet rounded to posit<8,0> (each in either layout,
/// rounded to nearest even), the bias already rounded: the outputs as f32 (NaR as NaN).
///
/// `B` is laid out once, on the calling thread. Where `parallel` and `A` has enough rows
/// (`team::Threading::of`), the output rows are cut into one band per thread of rayon's pool,
/// shared with the caller through `crate::team`, each band laying out its rows of `A`
/// and summing them.
pub fn gemm_f32(a: Operand, b: Operand, dims: Dims, bias: Bias, parallel: bool) -> Vec<f32> {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let kernel = Kernel::best();
    let bias = BiasUnits::new(bias);
    let mut out = vec![0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let (bands, inside) = Threading::of(parallel, dims).bands();
    let mut cols = ColumnBuffers::take();
    let cols_ref = &mut cols;
    let columns = move || {
        // Moving the borrow out makes this closure `FnOnce`, free to hand it on.
        let cols = cols_ref;
        let info = layout_columns_f32(cols, b, (k, n), kernel, inside);
        (&*cols, info)
    };
    let band = |(cols, info): &(&ColumnBuffers, ColumnInfo), (r0, out): (usize, &mut [f32])| {
        let len = out.len() / n;
        let mut rows = RowBuffers::take();
        let row_nar = layout_rows_f32(&mut rows, a, (m, k), r0..r0 + len, inside);
        sum_band(
            (&rows.rows, &row_nar, r0),
            (cols, info),
            (k, n),
            &bias,
            out,
            inside,
            |u| u.map_or(f32::NAN, |u| f32::from(u) / 64.0),
        );
        rows.keep();
    };
    // Bands of whole pairs of rows (the kernel's rows).
    let tasks = crate::team::row_bands(&mut out, n, bands, ROWS);
    crate::team::run(bands - 1, columns, tasks, band);
    cols.keep();
    out
}
