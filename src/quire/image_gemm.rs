//! A convolution's per-image GEMMs `Y[n] = A · B[n] (+ bias)` computed several images at a
//! time: the column matrices `B[n]` (`k x p`) of a group of `G` images sit side by side in
//! one `k x G·p` matrix, one GEMM under the layer's rule gives `A · [B[n0] … B[n0+G-1]]`
//! (`m x G·p`), and its column blocks are the images' outputs.
//!
//! Every output of a GEMM is its own accumulation: output `(r, t·p + q)` of the group's
//! GEMM sums exactly the terms `A[r, u] · B[n0 + t][u, q]` (`u` ascending) and the bias that
//! output `(r, q)` of image `n0 + t`'s GEMM sums, under the same rule, so the grouping
//! changes no bit of any rule's result ([`super::rule::GemmRule::gemm`]). What it changes
//! is the cost: one kernel call, one pass of operand norms and checks per group instead of
//! per image, on a group matrix that stays in cache and is reused across groups and calls
//! ([`super::scratch`]: filled completely for each group, never zeroed).
//!
//! The matrices hold f32 where the rule takes operands rounded in f32
//! ([`GemmRule::takes_rounded_f32`], [`GemmRule::operands_f32`]) and f64 otherwise (rounded
//! by [`GemmRule::operands`]); see [`Element`].

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims};
use super::quire_i16::Operand;
use super::rule::GemmRule;
use super::scratch;

/// The element type of a layer's operand matrices: `f32` for a rule that takes operands
/// rounded in f32 ([`GemmRule::takes_rounded_f32`]; operands from [`GemmRule::operands_f32`], [`GemmRule::gemm_f32_rounded`]), `f64` for
/// the others (operands rounded by [`GemmRule::operands`], [`GemmRule::gemm`]). The same
/// bits either way.
pub trait Element: scratch::Element + Send + Sync {
    /// Zero (padding and the stride's gaps).
    const ZERO: Self;
    /// One (the column of ones of a bias gradient).
    const ONE: Self;

    /// `A (m x k) · B (k x n) [+ bias]` under `rule` as f32 outputs (`m x n`), `b` holding
    /// `B`, or `Bᵀ` (`n x k`) where `b_transposed`.
    fn gemm(
        rule: &GemmRule,
        a: &[Self],
        b: &[Self],
        b_transposed: bool,
        dims: Dims,
        bias: Bias,
        parallel: bool,
    ) -> Vec<f32>;
}

impl Element for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;

    /// # Panics
    /// Where `rule` has no f32 path for `dims` (the caller checks
    /// [`GemmRule::takes_rounded_f32`], which implies one).
    fn gemm(
        rule: &GemmRule,
        a: &[f32],
        b: &[f32],
        b_transposed: bool,
        dims: Dims,
        bias: Bias,
        parallel: bool,
    ) -> Vec<f32> {
        let b = Operand {
            data: b,
            transposed: b_transposed,
        };
        rule.gemm_f32_rounded(Operand::rows(a), b, dims, bias, parallel)
            .expect("the caller checked that the rule has an f32 path")
    }
}

impl Element for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;

    fn gemm(
        rule: &GemmRule,
        a: &[f64],
        b: &[f64],
        b_transposed: bool,
        (m, k, n): Dims,
        bias: Bias,
        parallel: bool,
    ) -> Vec<f32> {
        let mut out = scratch::take(m * n);
        if b_transposed {
            rule.gemm_bt(a, b, (m, k, n), bias, &mut out, parallel);
        } else {
            rule.gemm(a, b, (m, k, n), bias, &mut out, parallel);
        }
        out.iter().map(|&v| GemmRule::output(v)).collect()
    }
}

/// Elements of a group's column matrix the automatic grouping aims at (1 MiB of f64: the
/// matrix stays in a core's L2 cache while the GEMM reads it).
const GROUP_ELEMENTS: usize = 1 << 17;

/// Images per GEMM for `n` images whose column matrices hold `per_image` elements each: as
/// many as fill 1 MiB of f64 (2^17 elements), at least one, and few enough to leave four groups per
/// thread of the rayon pool.
pub fn images_per_gemm(n: usize, per_image: usize) -> usize {
    let by_cache = (GROUP_ELEMENTS / per_image.max(1)).max(1);
    let by_balance = n.div_ceil(4 * rayon::current_num_threads()).max(1);
    by_cache.min(by_balance)
}

/// The f32 outputs `(n, m, p)` of `A (m x k) · B[i] (k x p) + bias` for images
/// `i = 0..n` under `rule`, `group` images per GEMM (the last group may hold fewer).
/// `fill(i, dst, row_stride)` writes image `i`'s column matrix `B[i]` with its row `u` at
/// `dst[u * row_stride..][..p]`, every one of those elements (the buffer is reused). `a`
/// and `fill`'s values as [`Element`] says for `T` (f64: rounded to the rule's format); the
/// bias rounded.
///
/// Groups run in parallel (each GEMM on one thread) where there are at least as many as
/// threads, else one after another with parallel GEMMs.
pub fn image_gemms<T: Element, F>(
    rule: &GemmRule,
    a: &[T],
    (m, k, p): Dims,
    bias: Bias,
    n: usize,
    group: usize,
    fill: F,
) -> Vec<f32>
where
    F: Fn(usize, &mut [T], usize) + Sync,
{
    let len = m * p;
    let mut out = vec![0f32; n * len];
    if len == 0 || n == 0 {
        return out;
    }
    let group = group.clamp(1, n);
    // One group: its images' column matrices side by side, one GEMM, the column blocks of
    // its result scattered to the images' outputs.
    let run = |(g, dst): (usize, &mut [f32]), parallel: bool| {
        let images = dst.len() / len;
        let cols = images * p;
        let mut b = scratch::take::<T>(k * cols);
        for t in 0..images {
            fill(g * group + t, &mut b[t * p..], cols);
        }
        let o = T::gemm(rule, a, &b, false, (m, k, cols), bias, parallel);
        for (t, image) in dst.chunks_exact_mut(len).enumerate() {
            for (r, row) in image.chunks_exact_mut(p).enumerate() {
                row.copy_from_slice(&o[r * cols + t * p..][..p]);
            }
        }
    };
    if n.div_ceil(group) >= rayon::current_num_threads() {
        out.par_chunks_mut(group * len)
            .enumerate()
            .for_each(|item| run(item, false));
    } else {
        out.chunks_mut(group * len)
            .enumerate()
            .for_each(|item| run(item, true));
    }
    out
}
