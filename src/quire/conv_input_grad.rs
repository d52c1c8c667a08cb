//! A convolution's input gradient in the checked f64 quire ([`super::gemm_checked`]),
//! summed through col2im instead of the transposed column matrix.
//!
//! [`super::layer_conv`] writes the input gradient of image `n` as the GEMM
//! `dX[n] = Wc · T[n]`: output `(c, y, x)` sums the terms `w[o, c, i, j] · T[(o, i, j),
//! (y, x)]` over `(o, i, j)`, where `T` holds `dY[n, o, oy, ox]` for the output pixel
//! `(oy, ox)` that reads input pixel `(y, x)` through tap `(i, j)`, and zero where there is
//! none. `T` is `OC·KH·KW x H·W`, most of it zeros or repeats of `dY`; this path never
//! builds it. The same nonzero terms are summed in f64 as
//!
//! ```text
//! Z = Wᵀ · dY[n]     (K x P: Z[(c, i, j), q] = Σ_o w[o, c, i, j] · dY[n, o, q])
//! S = col2im(Z)      (C x H·W: each Z[(c, i, j), q] added into the pixel tap (i, j) of
//!                     output pixel q reads)
//! ```
//!
//! so that `S[c, (y, x)]` is the sum of exactly output `(c, y, x)`'s nonzero terms, by a
//! binary tree of f64 additions (the GEMM's over `o`, col2im's over the taps; additions to
//! the zeros the buffers start from are exact), each product rounded or fused once. That is
//! what the bound of [`super::gemm_checked`] needs, with `k = OC·KH·KW` terms (more than
//! the nonzero ones: the bound only grows). Its norms are the same vectors' norms:
//!
//! * row `c` of `Wc`: `‖w[:, c, :, :]‖`;
//! * column `(y, x)` of `T`: the square root of the sum of `dY[n, o, oy, ox]²` over `o` and
//!   the taps that reach an output pixel, which is `col2im` (one channel) of
//!   `Σ_o dY[n, o, q]²` repeated for every tap: again a sum of the column's squares in
//!   some order, as the bound admits.
//!
//! The checked quire's check ([`super::gemm_checked`]) then rounds every output whose
//! interval holds no rounding boundary and sums the others exactly from their terms (`T`'s
//! entries computed one at a time), so the result is the quire's bit for bit, like the GEMM
//! on `T`. A NaR in `dY`
//! reaches exactly the outputs whose column of `T` holds it (through the column norm), a
//! NaR weight its channel's outputs (through the row norm), as in the GEMM.

use gemm::Parallelism;
use rayon::prelude::*;

use super::gemm_checked::check;
use super::gemm_cpu::{dgemm_strided, Bias, Strided};
use crate::backend::im2col::{col2im, ConvGeom};
use crate::format::Posit;

/// `dX (N, C, H, W)` as f32 of the rounded weight `w (OC, C, KH, KW)` and output gradient
/// `dy (N, OC, OH, OW)` (both on the posit's grid), each output rounded once from the
/// exact sum (see the module docs). The caller checks that the checked quire applies to
/// `OC·KH·KW` terms ([`super::gemm_checked::applies`]). Also returns how many outputs the
/// bound left to the exact path.
pub fn input_grad(
    posit: Posit,
    w: &[f64],
    dy: &[f64],
    g: &ConvGeom,
    oc: usize,
) -> (Vec<f32>, usize) {
    let (c, hw, p) = (g.channels, g.height * g.width, g.cols());
    let (k, taps) = (g.rows(), g.kernel_h * g.kernel_w);
    let kk = oc * taps;
    let n = dy.len().checked_div(oc * p).unwrap_or(0);
    let mut out = vec![0f32; n * c * hw];
    if out.is_empty() {
        return (out, 0);
    }
    // ‖Wc row c‖² = Σ_{o, t} w[o, c, t]².
    let a_norms: Vec<f64> = (0..c)
        .map(|ch| {
            let sq: f64 = (0..oc)
                .flat_map(|o| &w[(o * c + ch) * taps..(o * c + ch + 1) * taps])
                .map(|v| v * v)
                .sum();
            sq.sqrt()
        })
        .collect();
    // One channel, the same taps: col2im of a per-output-pixel value adds it into every
    // input pixel that pixel's taps read.
    let g1 = ConvGeom { channels: 1, ..*g };
    let wt = Strided::new(w, 1, k);
    // The output pixel along one axis that reads input coordinate `v` through tap `t`.
    let (s, d, pad) = (g.stride, g.dilation, g.padding);
    let out_of = |v: usize, t: usize, size: usize| -> Option<usize> {
        let u = (v + pad).checked_sub(t * d)?;
        (u % s == 0 && u / s < size).then_some(u / s)
    };
    let image = |(n, dst): (usize, &mut [f32]), bufs: &mut Buffers| {
        let dyn_ = &dy[n * oc * p..(n + 1) * oc * p];
        let Buffers {
            z,
            sums,
            sq_cols,
            col_sq,
        } = bufs;
        z.clear();
        z.resize(k * p, 0.0);
        dgemm_strided(
            (k, oc, p),
            wt,
            Strided::new(dyn_, p, 1),
            z,
            Parallelism::None,
        );
        sums.clear();
        sums.resize(c * hw, 0.0);
        col2im(z, g, sums);
        // Σ_o dY[o, q]², repeated for every tap, then gathered per input pixel.
        sq_cols.clear();
        sq_cols.resize(taps * p, 0.0);
        for (q, v) in sq_cols[..p].iter_mut().enumerate() {
            *v = (0..oc).map(|o| dyn_[o * p + q] * dyn_[o * p + q]).sum();
        }
        for t in 1..taps {
            sq_cols.copy_within(0..p, t * p);
        }
        col_sq.clear();
        col_sq.resize(hw, 0.0);
        col2im(sq_cols, &g1, col_sq);
        col_sq.iter_mut().for_each(|v| *v = v.sqrt());
        // Term u = (o, i, j) of output (ch, y·W + x): (w[o, ch, i, j], T[u, (y, x)]).
        let term = |ch: usize, pixel: usize, u: usize| {
            let (o, t) = (u / taps, u % taps);
            let (i, j) = (t / g.kernel_w, t % g.kernel_w);
            let (y, x) = (pixel / g.width, pixel % g.width);
            let e = match (out_of(y, i, g.out_h), out_of(x, j, g.out_w)) {
                (Some(oy), Some(ox)) => dyn_[o * p + oy * g.out_w + ox],
                _ => 0.0,
            };
            (w[(o * c + ch) * taps + t], e)
        };
        let dims = (c, kk, hw);
        let norms = (&a_norms[..], &col_sq[..]);
        check(posit, dims, norms, Bias::None, term, sums, Some(dst), false)
    };
    let fallbacks = out
        .par_chunks_mut(c * hw)
        .enumerate()
        .map_init(Buffers::default, |bufs, item| image(item, bufs))
        .sum();
    (out, fallbacks)
}

/// One task's scratch, reused from image to image (cleared and refilled for each).
#[derive(Default)]
struct Buffers {
    /// `Z = Wᵀ · dY[n]` (`K x P`).
    z: Vec<f64>,
    /// Its col2im: the f64 sums (`C x H·W`), then the outputs.
    sums: Vec<f64>,
    /// `Σ_o dY[n, o, q]²` for every tap (`KH·KW x P`).
    sq_cols: Vec<f64>,
    /// The column norms of `T` (`H·W`).
    col_sq: Vec<f64>,
}
