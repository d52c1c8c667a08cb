//! A convolution's weight and bias gradients in the checked f64 quire
//! ([`super::gemm_checked`]), summed image group by image group instead of through the
//! whole batch's column matrix.
//!
//! [`super::layer_conv`] writes them as one GEMM over the batch, `[dW | db] = A · B` with
//! `A (OC x N·P)` holding `dY[n, o, q]` at column `n·P + q` and `B (N·P x K+1)` every
//! image's transposed column matrix `cols[n]ᵀ` (and a column of ones for the bias): output
//! `(o, r)` sums `dY[n, o, q] · B[(n, q), r]` over all images and output pixels. For a
//! large batch `B` is tens of megabytes, written once and read from memory. Here the sum
//! runs over groups of images whose column matrices fit in cache:
//!
//! ```text
//! S = Σ_groups A_g · B_g     (A_g, B_g: the group's columns of A and rows of B)
//! ```
//!
//! each group's product an f64 GEMM, the groups' results added in f64. Every output is
//! then still the sum of exactly its terms by a binary tree of f64 additions (each group's
//! GEMM, then the additions across groups), each product rounded or fused once: the bound
//! of [`super::gemm_checked`] holds with `k = N·P` terms. The norms are the same sums of
//! squares, gathered the same way: `‖A row o‖² = Σ_g Σ dY[n, o, q]²` and `‖B column r‖² =
//! Σ_g Σ B[(n, q), r]²`. The check rounds every output whose interval holds no rounding
//! boundary and sums the others exactly from their terms (`B`'s entries read from the
//! images one at a time), so the result is the quire's, bit for bit, like the batch GEMM.

use gemm::Parallelism;
use rayon::prelude::*;

use super::gemm_checked::{check, sum_of_squares};
use super::gemm_cpu::{dgemm_strided, Bias, Strided};
use super::image_gemm::images_per_gemm;
use super::scratch;
use crate::backend::im2col::{im2col_row, ConvGeom};
use crate::format::Posit;

/// The sums of one or more groups: `S` (`OC x rows`) and the sums of squares of `A`'s rows
/// and `B`'s columns.
struct Partial {
    sums: Vec<f64>,
    a_sq: Vec<f64>,
    b_sq: Vec<f64>,
}

impl Partial {
    fn zeros(oc: usize, rows: usize) -> Self {
        Partial {
            sums: vec![0.0; oc * rows],
            a_sq: vec![0.0; oc],
            b_sq: vec![0.0; rows],
        }
    }

    /// `self + other`, element by element.
    fn add(mut self, other: Partial) -> Self {
        let pairs = [
            (&mut self.sums, &other.sums),
            (&mut self.a_sq, &other.a_sq),
            (&mut self.b_sq, &other.b_sq),
        ];
        for (x, y) in pairs {
            x.iter_mut().zip(y).for_each(|(s, t)| *s += t);
        }
        self
    }
}

/// `(OC x rows)` outputs: the weight gradient `dW (OC x K)` (when `with_w`) followed by the
/// bias gradient `db` as the last column (when `with_b`), of the rounded input `x (N, C,
/// H, W)` and output gradient `dy (N, OC, OH, OW)` (both on the posit's grid), each output
/// rounded once from the exact sum (see the module docs); also how many outputs the bound
/// left to the exact path. The caller checks that the checked quire applies to `N·P` terms
/// ([`super::gemm_checked::applies`]).
pub fn weight_grad(
    posit: Posit,
    x: &[f64],
    dy: &[f64],
    g: &ConvGeom,
    oc: usize,
    (with_w, with_b): (bool, bool),
) -> (Vec<f64>, usize) {
    let (k, p, image) = (g.rows(), g.cols(), g.image_len());
    let k_w = if with_w { k } else { 0 };
    let rows = k_w + usize::from(with_b);
    let n = dy.len().checked_div(oc * p).unwrap_or(0);
    if oc * rows == 0 {
        return (vec![0.0; oc * rows], 0);
    }
    let strides = [g.height * g.width, g.width, 1];
    let group = images_per_gemm(n, (rows + oc) * p);
    // One group of images: its A_g (OC x G·P) and B_gᵀ (rows x G·P), their product and
    // sums of squares.
    let part = |first: usize| {
        let images = group.min(n - first);
        let cols = images * p;
        let mut a = scratch::take(oc * cols);
        let mut bt = scratch::take(rows * cols);
        for t in 0..images {
            let src = &dy[(first + t) * oc * p..(first + t + 1) * oc * p];
            for o in 0..oc {
                a[o * cols + t * p..][..p].copy_from_slice(&src[o * p..(o + 1) * p]);
            }
            for r in 0..k_w {
                let dst = &mut bt[r * cols + t * p..][..p];
                im2col_row(x, (first + t) * image, strides, g, 0.0, r, dst);
            }
        }
        if with_b {
            bt[k_w * cols..(k_w + 1) * cols].fill(1.0);
        }
        let mut out = Partial::zeros(oc, rows);
        dgemm_strided(
            (oc, cols, rows),
            Strided::new(&a[..], cols, 1),
            Strided::new(&bt[..], 1, cols),
            &mut out.sums,
            Parallelism::None,
        );
        for (s, row) in out.a_sq.iter_mut().zip(a.chunks_exact(cols)) {
            *s = sum_of_squares(row);
        }
        for (s, row) in out.b_sq.iter_mut().zip(bt.chunks_exact(cols)) {
            *s = sum_of_squares(row);
        }
        out
    };
    let total = (0..n)
        .into_par_iter()
        .step_by(group)
        .map(part)
        .reduce(|| Partial::zeros(oc, rows), Partial::add);
    let a_norms: Vec<f64> = total.a_sq.iter().map(|v| v.sqrt()).collect();
    let b_norms: Vec<f64> = total.b_sq.iter().map(|v| v.sqrt()).collect();
    // Term u = (n, q) of output (o, r): (dY[n, o, q], B[(n, q), r]).
    let (s, d, pad) = (g.stride, g.dilation, g.padding);
    let taps = g.kernel_h * g.kernel_w;
    let term = |o: usize, r: usize, u: usize| {
        let (img, q) = (u / p, u % p);
        let a = dy[(img * oc + o) * p + q];
        if r == k_w {
            return (a, 1.0);
        }
        let (c, i, j) = (r / taps, r % taps / g.kernel_w, r % g.kernel_w);
        let (oy, ox) = (q / g.out_w, q % g.out_w);
        let at = |o: usize, t: usize, size: usize| {
            (o * s + t * d).checked_sub(pad).filter(|&v| v < size)
        };
        let b = match (at(oy, i, g.height), at(ox, j, g.width)) {
            (Some(y), Some(xx)) => x[img * image + (c * g.height + y) * g.width + xx],
            _ => 0.0,
        };
        (a, b)
    };
    let mut sums = total.sums;
    let dims = (oc, n * p, rows);
    let norms = (&a_norms[..], &b_norms[..]);
    let fallbacks = check(posit, dims, norms, Bias::None, term, &mut sums, None, true);
    (sums, fallbacks)
}
