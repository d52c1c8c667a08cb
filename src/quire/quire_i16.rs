//! The quire GEMM of posits whose values are i16 multiples of minpos
//! ([`super::gemm_cpu::Accumulator::I16`], posit<8,0>), from f64 or straight from f32
//! operands.
//!
//! Each operand value `v` becomes the integer `v · 2^s` (`maxpos = 2^s`, exact: `v` is a
//! multiple of `minpos = 2^-s`), laid out so that every output is a contiguous dot product:
//! `A` row-major and `B` transposed. The sums ([`super::int_dot::gemm`]) are exact integers
//! in units of `minpos^2`; the bias, a posit, is one more such integer. Each output is then
//! rounded once to the posit ([`super::int_round`], or the format's rounding where no table
//! applies). A NaR operand (NaN or ±Inf, no posit value) makes its row or column of
//! outputs NaR.
//!
//! The f32 entry ([`gemm_f32`]) rounds its operands to the posit through the quantize
//! kernel's f32 path (the same values as [`super::rule::GemmRule::operands`]) and reads each
//! operand in either layout, so a layer's GEMMs need neither f64 copies nor transposes of
//! their tensors.

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims};
use super::int_dot;
use super::int_round::IntRound;
use crate::format::grid::pow2;
use crate::format::rounding::NearestEven;
use crate::format::{Format, Posit};

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
        let mut t = vec![0f32; rows * cols];
        if cols > 0 {
            t.par_chunks_mut(cols).enumerate().for_each(|(r, dst)| {
                for (c, d) in dst.iter_mut().enumerate() {
                    *d = self.data[c * rows + r];
                }
            });
        }
        std::borrow::Cow::Owned(t)
    }
}

/// An integer matrix with a NaR flag per row.
struct IntMatrix {
    values: Vec<i16>,
    nar: Vec<bool>,
}

/// `rows x cols` integers `v · scale` of `get(r, c)`, row `r` flagged where a value is not
/// finite.
fn int_matrix(
    rows: usize,
    cols: usize,
    scale: f64,
    get: impl Fn(usize, usize) -> f64 + Sync,
) -> IntMatrix {
    let mut values = vec![0i16; rows * cols];
    let mut nar = vec![false; rows];
    if cols > 0 {
        values
            .par_chunks_mut(cols)
            .zip(nar.par_iter_mut())
            .enumerate()
            .with_min_len(16)
            .for_each(|(r, (dst, flag))| {
                for (c, d) in dst.iter_mut().enumerate() {
                    let v = get(r, c);
                    *flag |= !v.is_finite();
                    *d = (v * scale) as i16;
                }
            });
    }
    IntMatrix { values, nar }
}

/// [`int_matrix`] of a row-major `rows x cols` f32 matrix as it is stored (`scale` a power
/// of two, so `v · scale` is exact in f32).
fn int_rows(src: &[f32], rows: usize, cols: usize, scale: f32) -> IntMatrix {
    let mut values = vec![0i16; rows * cols];
    let mut nar = vec![false; rows];
    if cols > 0 {
        values
            .par_chunks_mut(cols)
            .zip(src[..rows * cols].par_chunks(cols))
            .zip(nar.par_iter_mut())
            .with_min_len(16)
            .for_each(|((dst, row), flag)| {
                *flag = row.iter().any(|v| !v.is_finite());
                for (d, &v) in dst.iter_mut().zip(row) {
                    *d = (v * scale) as i16;
                }
            });
    }
    IntMatrix { values, nar }
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
    let ai = int_matrix(m, k, scale, |i, t| a[i * k + t]);
    let bt = int_matrix(n, k, scale, |j, t| b[t * n + j]);
    let mut vals = vec![0f32; m * n];
    finish(posit, &ai, &bt, dims, bias, &mut vals, parallel);
    out[..m * n]
        .iter_mut()
        .zip(&vals)
        .for_each(|(o, &v)| *o = f64::from(v));
}

/// `round(A · B + bias)` (`m x n`, row-major f32) for f32 operands not yet rounded to the
/// posit (see the module docs); the bias already rounded. `None` where the posit's values
/// are not all f32s (then use the f64 path).
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
    let ar = rounded(posit, &a.data[..m * k])?;
    let br = rounded(posit, &b.data[..k * n])?;
    let scale = pow2(posit.max_scale());
    let ai = if a.transposed {
        int_matrix(m, k, scale, |i, t| f64::from(ar[t * m + i]))
    } else {
        int_rows(&ar, m, k, scale as f32)
    };
    let bt = if b.transposed {
        int_rows(&br, n, k, scale as f32)
    } else {
        int_matrix(n, k, scale, |j, t| f64::from(br[t * n + j]))
    };
    let mut out = vec![0f32; m * n];
    finish(posit, &ai, &bt, dims, bias, &mut out, parallel);
    Some(out)
}

/// `xs` rounded to the posit through the quantize kernel's f32 path.
fn rounded(posit: Posit, xs: &[f32]) -> Option<Vec<f32>> {
    let mut out = vec![0f32; xs.len()];
    crate::backend::cpu::quantize_slice(
        Some(xs),
        &mut out,
        &[xs.len()],
        &Format::Posit(posit),
        crate::format::Rounding::NearestEven,
        None,
    )
    .ok()?;
    Some(out)
}

/// The exact sums and the rounding of each output (with its bias term) into `out`.
fn finish(
    posit: Posit,
    a: &IntMatrix,
    bt: &IntMatrix,
    dims: Dims,
    bias: Bias,
    out: &mut [f32],
    parallel: bool,
) {
    let (m, _, n) = dims;
    let mut sums = vec![0i64; m * n];
    int_dot::gemm(&a.values, &bt.values, dims, &mut sums, parallel);
    let s = posit.max_scale();
    let scale = pow2(s);
    let unit = pow2(-2 * s);
    let table = IntRound::get(posit);
    let row = |(i, (dst, sums)): (usize, (&mut [f32], &[i64]))| {
        for (j, (o, &sum)) in dst.iter_mut().zip(sums).enumerate() {
            let bias_v = match bias {
                Bias::None => None,
                Bias::PerRow(v) => Some(v[i]),
                Bias::PerCol(v) => Some(v[j]),
            };
            let nar = a.nar[i] || bt.nar[j] || bias_v.is_some_and(|v| !v.is_finite());
            *o = if nar {
                f32::NAN
            } else {
                // The bias is a posit: an integer in units of minpos^2 too; the total is
                // below 2^53 in magnitude (`accumulator_for`).
                let total = sum + bias_v.map_or(0, |v| (v * scale * scale) as i64);
                match &table {
                    Some(t) => t.round(total),
                    None => posit.round(total as f64 * unit, NearestEven, 0) as f32,
                }
            };
        }
    };
    if n == 0 {
        return;
    }
    if parallel {
        out[..m * n]
            .par_chunks_mut(n)
            .zip(sums.par_chunks(n))
            .enumerate()
            .with_min_len(8)
            .for_each(row);
    } else {
        out[..m * n]
            .chunks_mut(n)
            .zip(sums.chunks(n))
            .enumerate()
            .for_each(row);
    }
}
