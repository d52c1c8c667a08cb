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
//! term; the kernels read 0 in its place and the output is overwritten. Rows of the output
//! go to the rayon pool two at a time (the kernel's rows).

use std::cell::Cell;

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims, OpTables};
use super::int_operand::IntOperand;
use super::p8_fp16::to_bytes;
use super::p8_lanes::{sums, to_codes, to_rows, Columns, Kernel, LANES};
use super::p8_units::{lane_code, posit8_0, row_index, P8Units};
use super::quire_i16::Operand;
use crate::format::Format;

/// Rows of `A` per kernel call.
const ROWS: usize = 2;

/// The NaR pattern.
const NAR: u8 = 0x80;

/// Buffers of one call: `A`'s rows and `B`'s codes and bytes (the kernel's operands) and
/// the units they come from.
#[derive(Default)]
struct Buffers {
    a: Vec<u8>,
    b: Vec<i16>,
    b_bytes: Vec<u8>,
    a_units: Vec<i16>,
    b_units: Vec<i16>,
}

/// Buffers above this many elements in all are freed after the call instead of kept.
const KEEP: usize = 8 << 20;

thread_local! {
    /// The buffers of the last call on this thread, reused by the next.
    static SCRATCH: Cell<Buffers> = Cell::new(Buffers::default());
}

impl Buffers {
    /// This thread's buffers (empty when a call on this thread holds them).
    fn take() -> Buffers {
        SCRATCH.with(|c| c.take())
    }

    /// Back to the thread, unless large.
    fn keep(self) {
        let len = self.a.len()
            + self.b.len()
            + self.b_bytes.len()
            + self.a_units.len()
            + self.b_units.len();
        if len <= KEEP {
            SCRATCH.with(|c| c.set(self));
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

/// The operands of one GEMM in the kernel's layout, in `bufs.a`, `bufs.b` and (for a
/// kernel that reads them) `bufs.b_bytes`.
struct Layout {
    /// The kernel that sums.
    kernel: Kernel,
    /// `B`'s row length in `bufs.b` (`n` padded to whole tiles).
    stride: usize,
    /// Rows of `A` holding a NaR.
    row_nar: Vec<bool>,
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
/// operation tables find it (a value off the grid is rounded), then its key.
fn layout_f64(bufs: &mut Buffers, a: &[f64], b: &[f64], (m, k, n): Dims, kernel: Kernel) -> Layout {
    let ops = OpTables::get(&Format::Posit(posit8_0())).expect("posit<8,0> has tables");
    let units = &P8Units::get().units;
    let (mut row_nar, mut col_nar) = (vec![false; m], vec![false; n]);
    let rows = sized(&mut bufs.a, m * k);
    rows.par_chunks_mut(k.max(1))
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
    let codes = sized(&mut bufs.b, k * stride);
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
        to_bytes(codes, (k, stride), &mut bufs.b_bytes);
    }
    Layout {
        kernel,
        stride,
        row_nar,
        col_nar,
    }
}

/// From f32 operands not yet rounded, each in either layout: rounded and converted to units
/// by [`IntOperand`], then to keys. `B` stored as it is (`k x n`) is converted row by row
/// and its columns' NaR flags read from the f32 values; stored transposed (`n x k`, a
/// linear layer's weight) it is converted as stored and transposed.
fn layout_f32(
    bufs: &mut Buffers,
    (a, b): (Operand, Operand),
    (m, k, n): Dims,
    kernel: Kernel,
    par: bool,
) -> Layout {
    let conv = IntOperand::get(posit8_0()).expect("posit<8,0> has an operand table");
    let (mut row_nar, mut col_nar) = (vec![false; m], vec![false; n]);
    let mut t_nar = vec![false; k];
    let stride = padded(n);
    let Buffers {
        a: a_rows,
        b: codes,
        b_bytes,
        a_units,
        b_units,
    } = bufs;
    let a_units = sized(a_units, m * k);
    let b_units = sized(b_units, n * k);
    let codes = sized(codes, k * stride);
    let mut fill_a = || {
        conv.fill(a.data, a.transposed, (m, k), a_units, &mut row_nar, par);
        to_rows(a_units, sized(a_rows, m * k));
    };
    let mut fill_b = || {
        if b.transposed {
            // Bᵀ (n x k) as stored: a row per column of B, with its NaR flag.
            conv.fill(b.data, false, (n, k), b_units, &mut col_nar, par);
            to_codes(b_units);
            transpose_padded(b_units, (n, k), codes, stride);
        } else {
            conv.fill(b.data, false, (k, n), b_units, &mut t_nar, par);
            for (t, row) in codes.chunks_mut(stride.max(1)).enumerate().take(k) {
                row[..n].copy_from_slice(&b_units[t * n..t * n + n]);
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
            to_bytes(codes, (k, stride), b_bytes);
        }
    };
    if par {
        rayon::join(fill_a, fill_b);
    } else {
        fill_a();
        fill_b();
    }
    Layout {
        kernel,
        stride,
        row_nar,
        col_nar,
    }
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

/// The GEMM on operands in the kernel's layout: each output as `to(Some(units))`, or
/// `to(None)` where it is NaR.
fn run<T: Send>(
    bufs: &Buffers,
    layout: &Layout,
    (m, k, n): Dims,
    bias: &BiasUnits,
    (out, parallel): (&mut [T], bool),
    to: impl Fn(Option<i16>) -> T + Sync,
) {
    if n == 0 || m == 0 {
        return;
    }
    let tables = P8Units::get();
    let stride = layout.stride;
    let group = |g: usize, dst: &mut [T], acc: &mut Vec<i16>| {
        let first = g * ROWS;
        let rows = dst.len() / n;
        let a: Vec<&[u8]> = (first..first + rows)
            .map(|i| &bufs.a[i * k..i * k + k])
            .collect();
        let b = Columns {
            codes: &bufs.b,
            stride,
            bytes: &bufs.b_bytes,
        };
        sums(layout.kernel, tables, &a, &b, k, sized(acc, rows * stride));
        for (r, (o, c)) in dst.chunks_mut(n).zip(acc.chunks(stride)).enumerate() {
            let i = first + r;
            for (j, (o, &c)) in o.iter_mut().zip(c).enumerate() {
                let nar = layout.row_nar[i] || layout.col_nar[j];
                *o = to(match bias.at(i, j) {
                    _ if nar => None,
                    None => Some(c),
                    Some(None) => None,
                    Some(Some(v)) => Some(tables.round(c + v)),
                });
            }
        }
    };
    let out = &mut out[..m * n];
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
    let mut bufs = Buffers::take();
    let layout = layout_f64(&mut bufs, a, b, dims, Kernel::best());
    let bias = BiasUnits::new(bias);
    run(&bufs, &layout, dims, &bias, (out, parallel), |u| {
        u.map_or(f64::NAN, |u| f64::from(u) / 64.0)
    });
    bufs.keep();
}

/// [`gemm_f64`] from f32 operands not yet rounded to posit<8,0> (each in either layout,
/// rounded to nearest even), the bias already rounded: the outputs as f32 (NaR as NaN).
pub fn gemm_f32(a: Operand, b: Operand, dims: Dims, bias: Bias, parallel: bool) -> Vec<f32> {
    let (m, k, n) = dims;
    assert!(a.data.len() >= m * k && b.data.len() >= k * n);
    let mut bufs = Buffers::take();
    let layout = layout_f32(&mut bufs, (a, b), dims, Kernel::best(), parallel);
    let bias = BiasUnits::new(bias);
    let mut out = vec![0f32; m * n];
    run(&bufs, &layout, dims, &bias, (&mut out, parallel), |u| {
        u.map_or(f32::NAN, |u| f32::from(u) / 64.0)
    });
    bufs.keep();
    out
}
