//! A 2-D convolution whose GEMMs follow a layer's rules ([`LayerArith`]), through im2col,
//! with its own backward pass.
//!
//! With `x (N, C, H, W)`, `w (OC, C, KH, KW)` read as the `OC x K` matrix `W`
//! (`K = C·KH·KW`), `cols[n]` the `K x P` column matrix of image `n`
//! ([`crate::backend::im2col`], `P = OH·OW`; padding contributes zeros) and the incoming
//! gradient `dY (N, OC, OH, OW)`:
//!
//! | GEMM | per | summation index, ascending | rule |
//! |---|---|---|---|
//! | `Y[n] = W·cols[n] + b` | image | `(c, i, j)`, the weight's storage order | forward (activation format), bias last |
//! | `dW = Σ_n dY[n]·cols[n]ᵀ` | layer | `(n, oy, ox)`: images, then output pixels | weight gradient (gradient format) |
//! | `db = Σ_n dY[n]·1` | layer | `(n, oy, ox)` | weight gradient (gradient format) |
//! | `dX[n] = Wc·T[n]` | image | `(o, i, j)`, the weight's storage order for one input channel | input gradient (error format) |
//!
//! The input gradient is the transposed convolution written as one GEMM per image, so that
//! every input pixel is one accumulation: `Wc (C x OC·KH·KW)` holds `Wc[c, (o, i, j)] =
//! w[o, c, i, j]`, and `T[n] (OC·KH·KW x H·W)` holds, for pixel `(y, x)` and tap `(o, i, j)`,
//! `dY[n, o, oy, ox]` where `y = oy·s + i·d - p` and `x = ox·s + j·d - p` for an output
//! pixel `(oy, ox)`, and zero where there is none (the stride's gaps and the border). The
//! zero terms are summed like the others (a product `±0`), which matters only for the sign
//! of a zero result in float formats.
//!
//! Every GEMM first rounds its operands to its format (see [`super::accumulate`]). `dX` is
//! computed only when `x` needs a gradient (not for a data batch).

use candle_core::{bail, CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::gemm_cpu::Bias;
use super::layer_io::{apply, check_tensor, outputs, storage_f32, tensor_f32, to_tensor, LayerOp};
use super::rule::LayerArith;
use crate::backend::im2col::{im2col, ConvGeom};

/// `conv2d(x, w) + bias` with stride, zero padding and dilation (no groups) under `arith`'s
/// rules, forward and backward (see the module docs). f32 CPU tensors; shapes are checked.
pub fn rule_conv2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    arith: &LayerArith,
) -> Result<Tensor> {
    let setting = arith.setting.to_string();
    check_tensor(x, "input", &setting)?;
    check_tensor(w, "weight", &setting)?;
    if cfg.groups != 1 {
        bail!(
            "accumulate = \"{setting}\": grouped convolutions (groups = {}) are not supported",
            cfg.groups
        );
    }
    let (_, c, h, wd) = x.dims4()?;
    let (oc, wc, kh, kw) = w.dims4()?;
    if wc != c {
        bail!(
            "conv2d: input {:?} has {c} channels but the weight {:?} expects {wc}",
            x.dims(),
            w.dims()
        );
    }
    if let Some(b) = bias {
        check_tensor(b, "bias", &setting)?;
        if b.dims() != [oc] {
            bail!("conv2d: bias of shape {:?}, expected [{oc}]", b.dims());
        }
    }
    let Some(geom) = ConvGeom::new((c, h, wd), (kh, kw), cfg.stride, cfg.padding, cfg.dilation)
    else {
        bail!(
            "conv2d: a {kh}x{kw} kernel (stride {}, padding {}, dilation {}) does not fit a {h}x{wd} input",
            cfg.stride,
            cfg.padding,
            cfg.dilation
        );
    };
    let op = ConvOp {
        arith: arith.clone(),
        geom,
        oc,
    };
    apply(x, w, bias, op)
}

#[derive(Clone)]
struct ConvOp {
    arith: LayerArith,
    geom: ConvGeom,
    oc: usize,
}

/// Runs `f(i, chunk)` over the `len`-sized chunks of `out`: in parallel over images when
/// there are enough of them (each GEMM serial), else one image at a time with parallel GEMMs.
fn per_image<F>(out: &mut [f64], len: usize, f: F)
where
    F: Fn(usize, &mut [f64], bool) + Sync,
{
    if len == 0 {
        return;
    }
    let n = out.len() / len;
    if n >= rayon::current_num_threads() {
        out.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, o)| f(i, o, false));
    } else {
        out.chunks_mut(len)
            .enumerate()
            .for_each(|(i, o)| f(i, o, true));
    }
}

impl LayerOp for ConvOp {
    const NAMES: [&'static str; 2] = ["qcandle-rule-conv2d", "qcandle-rule-conv2d-bias"];

    fn forward(
        &self,
        x: (&CpuStorage, &Layout),
        w: (&CpuStorage, &Layout),
        b: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let (g, oc, rule) = (&self.geom, self.oc, &self.arith.forward);
        let n = x.1.dims()[0];
        let (k, p, image) = (g.rows(), g.cols(), g.image_len());
        let xv = rule.operands(&storage_f32(x.0, x.1, "input")?);
        let wv = rule.operands(&storage_f32(w.0, w.1, "weight")?);
        let bv = match b {
            Some((s, l)) => Some(rule.operands(&storage_f32(s, l, "bias")?)),
            None => None,
        };
        let bias = bv.as_deref().map_or(Bias::None, Bias::PerRow);
        let mut out = vec![0.0; n * oc * p];
        per_image(&mut out, oc * p, |i, o, parallel| {
            let mut cols = vec![0.0; k * p];
            im2col(
                &xv,
                i * image,
                [g.height * g.width, g.width, 1],
                g,
                0.0,
                &mut cols,
            );
            rule.gemm(&wv, &cols, (oc, k, p), bias, o, parallel);
        });
        let shape = Shape::from((n, oc, g.out_h, g.out_w));
        Ok((CpuStorage::F32(outputs(&out)), shape))
    }

    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (g, oc) = (&self.geom, self.oc);
        let n = x.dims()[0];
        let (k, p, image) = (g.rows(), g.cols(), g.image_len());
        let dy = tensor_f32(grad)?;
        let device = x.device();
        let need_w = w.track_op();
        let need_b = b.is_some_and(|b| b.track_op());
        let (mut dw, mut db) = (None, None);
        if need_w || need_b {
            let rule = &self.arith.weight_grad;
            let gy = rule.operands(&dy);
            // A (OC x N·P): row o holds dY[n, o, :] for n ascending.
            let mut a = vec![0.0; oc * n * p];
            a.par_chunks_mut(n * p).enumerate().for_each(|(o, row)| {
                for (i, dst) in row.chunks_mut(p.max(1)).enumerate() {
                    dst.copy_from_slice(&gy[(i * oc + o) * p..(i * oc + o + 1) * p]);
                }
            });
            if need_w {
                let xv = rule.operands(&tensor_f32(x)?);
                // Bᵀ (K x N·P): image n's column matrix at columns n·P..(n+1)·P, so that
                // B (N·P x K) is read transposed in place where the kernel can.
                let mut cols = vec![0.0; n * k * p];
                cols.par_chunks_mut((k * p).max(1))
                    .enumerate()
                    .for_each(|(i, dst)| {
                        im2col(
                            &xv,
                            i * image,
                            [g.height * g.width, g.width, 1],
                            g,
                            0.0,
                            dst,
                        );
                    });
                let np = n * p;
                let mut bt = vec![0.0; k * np];
                bt.par_chunks_mut(np.max(1))
                    .enumerate()
                    .for_each(|(r, dst)| {
                        for (i, run) in dst.chunks_mut(p.max(1)).enumerate() {
                            run.copy_from_slice(&cols[(i * k + r) * p..(i * k + r + 1) * p]);
                        }
                    });
                let mut out = vec![0.0; oc * k];
                rule.gemm_bt(&a, &bt, (oc, np, k), Bias::None, &mut out, true);
                let shape = [oc, g.channels, g.kernel_h, g.kernel_w];
                dw = Some(to_tensor(&out, &shape, device)?);
            }
            if need_b {
                let ones = vec![1.0; n * p];
                let mut out = vec![0.0; oc];
                rule.gemm(&a, &ones, (oc, n * p, 1), Bias::None, &mut out, true);
                db = Some(to_tensor(&out, &[oc], device)?);
            }
        }
        let dx = if x.track_op() {
            let rule = &self.arith.input_grad;
            let e = rule.operands(&dy);
            let wv = rule.operands(&tensor_f32(w)?);
            let (c, taps) = (g.channels, g.kernel_h * g.kernel_w);
            // Wc (C x OC·KH·KW): Wc[c, (o, i, j)] = w[o, c, i, j].
            let kk = oc * taps;
            let mut wc = vec![0.0; c * kk];
            for ch in 0..c {
                for o in 0..oc {
                    for t in 0..taps {
                        wc[ch * kk + o * taps + t] = wv[(o * c + ch) * taps + t];
                    }
                }
            }
            let hw = g.height * g.width;
            let mut out = vec![0.0; n * image];
            per_image(&mut out, image, |i, o, parallel| {
                let t = transposed_cols(&e[i * oc * p..(i + 1) * oc * p], g, oc);
                rule.gemm(&wc, &t, (c, kk, hw), Bias::None, o, parallel);
            });
            Some(to_tensor(&out, &[n, c, g.height, g.width], device)?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
}

/// `T (OC·KH·KW x H·W)` of one image's `dY (OC x P)`: `T[(o, i, j), (y, x)] = dY[o, oy, ox]`
/// where `y = oy·s + i·d - p`, `x = ox·s + j·d - p` for an output pixel, else zero.
fn transposed_cols(dy: &[f64], g: &ConvGeom, oc: usize) -> Vec<f64> {
    let (h, w) = (g.height, g.width);
    let (s, d, pad) = (g.stride, g.dilation, g.padding);
    let mut t = vec![0.0; oc * g.kernel_h * g.kernel_w * h * w];
    // The output coordinate of input coordinate `y` through tap `i`, if any.
    let out_of = |y: usize, tap: usize, out: usize| -> Option<usize> {
        let v = (y + pad).checked_sub(tap * d)?;
        (v % s == 0 && v / s < out).then_some(v / s)
    };
    let mut rows = t.chunks_mut(h * w);
    if s == 1 {
        // Unit stride: for each tap and input row, the input columns with an output pixel
        // are one run, `x = ox + j·d - p` for `ox` in `0..OW` (clipped to the image).
        for o in 0..oc {
            for i in 0..g.kernel_h {
                for j in 0..g.kernel_w {
                    let row = rows.next().expect("one row per tap");
                    let shift = (j * d) as isize - pad as isize;
                    let x0 = shift.max(0) as usize;
                    let x1 = (shift + g.out_w as isize).clamp(0, w as isize) as usize;
                    if x0 >= x1 {
                        continue;
                    }
                    for y in 0..h {
                        let Some(oy) = out_of(y, i, g.out_h) else {
                            continue;
                        };
                        let ox0 = (x0 as isize - shift) as usize;
                        let src = &dy[o * g.cols() + oy * g.out_w + ox0..][..x1 - x0];
                        row[y * w + x0..y * w + x1].copy_from_slice(src);
                    }
                }
            }
        }
        return t;
    }
    for o in 0..oc {
        for i in 0..g.kernel_h {
            for j in 0..g.kernel_w {
                let row = rows.next().expect("one row per tap");
                for y in 0..h {
                    let Some(oy) = out_of(y, i, g.out_h) else {
                        continue;
                    };
                    for x in 0..w {
                        if let Some(ox) = out_of(x, j, g.out_w) {
                            row[y * w + x] = dy[o * g.cols() + oy * g.out_w + ox];
                        }
                    }
                }
            }
        }
    }
    t
}
