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

use rayon::prelude::*;

use super::gemm_cpu::{Bias, Dims};
use super::rule::GemmRule;
use super::scratch;

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
/// and the bias are rounded to the rule's format, as `fill`'s values must be.
///
/// Groups run in parallel (each GEMM on one thread) where there are at least as many as
/// threads, else one after another with parallel GEMMs.
pub fn image_gemms<F>(
    rule: &GemmRule,
    a: &[f64],
    (m, k, p): Dims,
    bias: Bias,
    n: usize,
    group: usize,
    fill: F,
) -> Vec<f32>
where
    F: Fn(usize, &mut [f64], usize) + Sync,
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
        let (mut b, mut o) = (scratch::take(k * cols), scratch::take(m * cols));
        for t in 0..images {
            fill(g * group + t, &mut b[t * p..], cols);
        }
        rule.gemm(a, &b, (m, k, cols), bias, &mut o, parallel);
        for (t, image) in dst.chunks_exact_mut(len).enumerate() {
            for (r, row) in image.chunks_exact_mut(p).enumerate() {
                let src = &o[r * cols + t * p..][..p];
                for (d, &v) in row.iter_mut().zip(src) {
                    *d = GemmRule::output(v);
                }
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
