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
//!
//! How the GEMMs run (none of it changes a bit of any output, each output being its own
//! accumulation under its rule):
//!
//! * the per-image GEMMs (`Y[n]`, `dX[n]`) take several images at a time, their column
//!   matrices side by side ([`super::image_gemm`]);
//! * the matrices hold f32 operands rounded once where the rule's register kernel runs
//!   ([`GemmRule::takes_rounded_f32`]: `naive`, `naive:<A>`, `fma:<A>` in the formats it
//!   covers), f64 operands rounded once for the other kernels;
//! * `db` is one more column of the `dW` GEMM (a row of ones appended to `cols[n]ᵀ`), which
//!   shares its operand `dY` and its rule;
//! * under the checked f64 quire ([`super::gemm_checked`]), `dX` is summed through col2im
//!   without building `T` ([`super::conv_input_grad`]), and `dW` and `db` group of images
//!   by group of images without the whole batch's column matrix
//!   ([`super::conv_weight_grad`]).

use candle_core::{bail, CpuStorage, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::conv_input_grad;
use super::conv_weight_grad;
use super::gemm_cpu::{accumulator_for, Accumulator, Bias};
use super::image_gemm::{image_gemms, images_per_gemm, Element};
use super::layer_io::{apply, check_tensor, outputs, storage_f32, tensor_f32, LayerOp};
use super::rule::{GemmRule, LayerArith};
use super::scratch;
use crate::backend::im2col::{im2col_row, im2col_strided, ConvGeom};

/// `conv2d(x, w) + bias` with stride, zero padding and dilation (no groups) under `arith`'s
/// rules, forward and backward (see the module docs). f32 CPU tensors; shapes are checked.
pub fn rule_conv2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    arith: &LayerArith,
) -> Result<Tensor> {
    conv(x, w, bias, cfg, arith, None)
}

/// [`rule_conv2d`] with the per-image GEMMs (the forward pass and the input gradient) run
/// `images` images at a time ([`super::image_gemm`]) instead of a group size picked from
/// the shapes: the same bits for every grouping, which the tests check.
pub fn rule_conv2d_grouped(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    arith: &LayerArith,
    images: usize,
) -> Result<Tensor> {
    if images == 0 {
        bail!("conv2d: a GEMM takes at least one image, got images = 0");
    }
    conv(x, w, bias, cfg, arith, Some(images))
}

fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    arith: &LayerArith,
    group: Option<usize>,
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
        group,
    };
    apply(x, w, bias, op)
}

#[derive(Clone)]
struct ConvOp {
    arith: LayerArith,
    geom: ConvGeom,
    oc: usize,
    /// Images per GEMM of the forward pass and the input gradient (None: by the shapes).
    group: Option<usize>,
}

impl ConvOp {
    /// Images per GEMM for `n` images whose column matrices hold `per_image` elements.
    fn group(&self, n: usize, per_image: usize) -> usize {
        self.group.unwrap_or_else(|| images_per_gemm(n, per_image))
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
        let bv = match b {
            Some((s, l)) => Some(rule.operands(&storage_f32(s, l, "bias")?)),
            None => None,
        };
        let bias = bv.as_deref().map_or(Bias::None, Bias::PerRow);
        let (xs, ws) = (
            storage_f32(x.0, x.1, "input")?,
            storage_f32(w.0, w.1, "weight")?,
        );
        let out = if rule.takes_rounded_f32(g.rows() + usize::from(bv.is_some())) {
            let (xr, wr) = (rule.operands_f32(&xs), rule.operands_f32(&ws));
            self.forward_gemms(rule, &xr, &wr, bias, n)
        } else {
            let (xv, wv) = (rule.operands(&xs), rule.operands(&ws));
            self.forward_gemms(rule, &xv, &wv, bias, n)
        };
        let shape = Shape::from((n, oc, g.out_h, g.out_w));
        Ok((CpuStorage::F32(out), shape))
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
        let (k, p) = (g.rows(), g.cols());
        let dy = tensor_f32(grad)?;
        let device = x.device();
        let need_w = w.track_op();
        let need_b = b.is_some_and(|b| b.track_op());
        let (mut dw, mut db) = (None, None);
        if need_w || need_b {
            let rule = &self.arith.weight_grad;
            let xs = if need_w { tensor_f32(x)? } else { Vec::new() };
            let k_w = if need_w { k } else { 0 };
            let rows = k_w + usize::from(need_b);
            let dims = (k_w, rows);
            let out = match rule {
                GemmRule::Quire(posit)
                    if accumulator_for(*posit, n * p) == Accumulator::F64Checked =>
                {
                    let with = (need_w, need_b);
                    let (xv, gy) = (rule.operands(&xs), rule.operands(&dy));
                    outputs(&conv_weight_grad::weight_grad(*posit, &xv, &gy, g, oc, with).0)
                }
                _ if rule.takes_rounded_f32(n * p) => {
                    let (xr, gy) = (rule.operands_f32(&xs), rule.operands_f32(&dy));
                    weight_grad_gemm(rule, &xr, &gy, g, oc, dims)
                }
                _ => {
                    let (xv, gy) = (rule.operands(&xs), rule.operands(&dy));
                    weight_grad_gemm(rule, &xv, &gy, g, oc, dims)
                }
            };
            if need_w {
                let dw_v: Vec<f32> = out
                    .chunks(rows)
                    .flat_map(|r| r[..k].iter().copied())
                    .collect();
                let shape = [oc, g.channels, g.kernel_h, g.kernel_w];
                dw = Some(Tensor::from_vec(dw_v, &shape, &Device::Cpu)?.to_device(device)?);
            }
            if need_b {
                let db_v: Vec<f32> = out.chunks(rows).map(|r| r[k_w]).collect();
                db = Some(Tensor::from_vec(db_v, oc, &Device::Cpu)?.to_device(device)?);
            }
        }
        let dx = if x.track_op() {
            let rule = &self.arith.input_grad;
            let ws = tensor_f32(w)?;
            let kk = oc * g.kernel_h * g.kernel_w;
            let shape = [n, g.channels, g.height, g.width];
            let out = match rule {
                GemmRule::Quire(posit)
                    if accumulator_for(*posit, kk) == Accumulator::F64Checked =>
                {
                    let (e, wv) = (rule.operands(&dy), rule.operands(&ws));
                    conv_input_grad::input_grad(*posit, &wv, &e, g, oc).0
                }
                _ if rule.takes_rounded_f32(kk) => {
                    let (e, wr) = (rule.operands_f32(&dy), rule.operands_f32(&ws));
                    self.input_grad_gemms(rule, &e, &wr, n)
                }
                _ => {
                    let (e, wv) = (rule.operands(&dy), rule.operands(&ws));
                    self.input_grad_gemms(rule, &e, &wv, n)
                }
            };
            Some(Tensor::from_vec(out, &shape, &Device::Cpu)?.to_device(device)?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
}

impl ConvOp {
    /// The forward pass's per-image GEMMs `Y[n] = W·cols[n] + b` of the input `x` and the
    /// weight `w` (as [`Element`] says for `T`), the bias rounded.
    fn forward_gemms<T: Element>(
        &self,
        rule: &GemmRule,
        x: &[T],
        w: &[T],
        bias: Bias,
        n: usize,
    ) -> Vec<f32> {
        let g = &self.geom;
        let (k, p, image) = (g.rows(), g.cols(), g.image_len());
        let strides = [g.height * g.width, g.width, 1];
        let group = self.group(n, k * p);
        image_gemms(
            rule,
            w,
            (self.oc, k, p),
            bias,
            n,
            group,
            |i, dst, stride| {
                im2col_strided(x, i * image, strides, g, T::ZERO, dst, stride);
            },
        )
    }

    /// The input gradient's per-image GEMMs `dX[n] = Wc·T[n]` (see the module docs) of the
    /// output gradient `e` and the weight `w` (as [`Element`] says for `T`).
    fn input_grad_gemms<T: Element>(
        &self,
        rule: &GemmRule,
        e: &[T],
        w: &[T],
        n: usize,
    ) -> Vec<f32> {
        let (g, oc) = (&self.geom, self.oc);
        let (c, taps, p) = (g.channels, g.kernel_h * g.kernel_w, g.cols());
        let kk = oc * taps;
        // Wc (C x OC·KH·KW): Wc[c, (o, i, j)] = w[o, c, i, j].
        let mut wc = vec![T::ZERO; c * kk];
        for ch in 0..c {
            for o in 0..oc {
                for t in 0..taps {
                    wc[ch * kk + o * taps + t] = w[(o * c + ch) * taps + t];
                }
            }
        }
        let hw = g.height * g.width;
        let group = self.group(n, kk * hw);
        image_gemms(
            rule,
            &wc,
            (c, kk, hw),
            Bias::None,
            n,
            group,
            |i, dst, stride| {
                transposed_cols(&e[i * oc * p..(i + 1) * oc * p], g, oc, dst, stride);
            },
        )
    }
}

/// `[dW | db] (OC x rows)` as one GEMM over the batch (see the module docs) under `rule`,
/// of the input `x` and output gradient `gy` (as [`Element`] says for `T`): the weight
/// gradient's `k_w` columns (`K`, or none), then the bias gradient where `rows > k_w`.
fn weight_grad_gemm<T: Element>(
    rule: &GemmRule,
    x: &[T],
    gy: &[T],
    g: &ConvGeom,
    oc: usize,
    (k_w, rows): (usize, usize),
) -> Vec<f32> {
    let (p, image) = (g.cols(), g.image_len());
    let np = gy.len().checked_div(oc).unwrap_or(0);
    // A (OC x N·P): row o holds dY[n, o, :] for n ascending.
    let mut a = scratch::take::<T>(oc * np);
    a.par_chunks_mut(np.max(1))
        .enumerate()
        .for_each(|(o, row)| {
            for (i, dst) in row.chunks_mut(p).enumerate() {
                dst.copy_from_slice(&gy[(i * oc + o) * p..(i * oc + o + 1) * p]);
            }
        });
    // Bᵀ: row r < K holds row r of every image's column matrix, image n at columns
    // n·P..(n+1)·P; with the bias, one more row of ones (db = dY·1 as the last column of
    // the same GEMM: every output is its own sum).
    let mut bt = scratch::take::<T>(rows * np);
    let strides = [g.height * g.width, g.width, 1];
    bt.par_chunks_mut(np.max(1))
        .enumerate()
        .for_each(|(r, dst)| {
            if r == k_w {
                dst.fill(T::ONE);
                return;
            }
            for (i, run) in dst.chunks_mut(p).enumerate() {
                im2col_row(x, i * image, strides, g, T::ZERO, r, run);
            }
        });
    T::gemm(rule, &a, &bt, true, (oc, np, rows), Bias::None, true)
}

/// `T (OC·KH·KW x H·W)` of one image's `dY (OC x P)`: `T[(o, i, j), (y, x)] = dY[o, oy, ox]`
/// where `y = oy·s + i·d - p`, `x = ox·s + j·d - p` for an output pixel, else zero; row
/// `(o, i, j)` written whole (zeros included) at `dst[((o·KH + i)·KW + j) · row_stride..]`.
fn transposed_cols<T: Element>(
    dy: &[T],
    g: &ConvGeom,
    oc: usize,
    dst: &mut [T],
    row_stride: usize,
) {
    let (h, w) = (g.height, g.width);
    let (s, d, pad) = (g.stride, g.dilation, g.padding);
    // The output coordinate of input coordinate `y` through tap `i`, if any.
    let out_of = |y: usize, tap: usize, out: usize| -> Option<usize> {
        let v = (y + pad).checked_sub(tap * d)?;
        (v % s == 0 && v / s < out).then_some(v / s)
    };
    let taps = g.kernel_h * g.kernel_w;
    for r in 0..oc * taps {
        let (o, i, j) = (r / taps, r % taps / g.kernel_w, r % g.kernel_w);
        let row = &mut dst[r * row_stride..r * row_stride + h * w];
        let plane = &dy[o * g.cols()..(o + 1) * g.cols()];
        if s == 1 {
            // Unit stride: for each input row with an output row, the input columns with
            // an output pixel are one run, `x = ox + j·d - p` for `ox` in `0..OW` (clipped
            // to the image); zeros around it.
            let shift = (j * d) as isize - pad as isize;
            let x0 = shift.clamp(0, w as isize) as usize;
            let x1 = (shift + g.out_w as isize).clamp(x0 as isize, w as isize) as usize;
            for (y, line) in row.chunks_exact_mut(w).enumerate() {
                let Some(oy) = out_of(y, i, g.out_h).filter(|_| x0 < x1) else {
                    line.fill(T::ZERO);
                    continue;
                };
                let ox0 = (x0 as isize - shift) as usize;
                line[..x0].fill(T::ZERO);
                line[x0..x1].copy_from_slice(&plane[oy * g.out_w + ox0..][..x1 - x0]);
                line[x1..].fill(T::ZERO);
            }
            continue;
        }
        for (y, line) in row.chunks_exact_mut(w).enumerate() {
            let Some(oy) = out_of(y, i, g.out_h) else {
                line.fill(T::ZERO);
                continue;
            };
            for (x, v) in line.iter_mut().enumerate() {
                *v = out_of(x, j, g.out_w).map_or(T::ZERO, |ox| plane[oy * g.out_w + ox]);
            }
        }
    }
}
