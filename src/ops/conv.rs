//! 2-D convolution and max pooling on CPU f32 tensors, with their own backward passes.
//!
//! # Math
//!
//! For a batch of `N` images `x` of shape `(N, C, H, W)`, a weight `w` of shape
//! `(OC, C, KH, KW)` and an optional bias `b` of shape `(OC)`, let `cols[n]` be the
//! `K x P` column matrix of image `n` ([`crate::kernels::im2col`]: `K = C*KH*KW` rows,
//! `P = OH*OW` columns) and read `w` as the row-major `OC x K` matrix `W`. Then, per image:
//!
//! * forward: `Y[n] (OC x P) = W (OC x K) * cols[n] (K x P) + b` (one GEMM of `m = OC`,
//!   `n = P`, `k = K`, written straight into the `(OC, OH, OW)` output plane);
//! * weight gradient: `dW (OC x K) = sum_n dY[n] (OC x P) * cols[n]^T (P x K)` (`cols[n]` is
//!   recomputed by im2col; the transpose is a stride swap, nothing is copied);
//! * input gradient: `dX[n] = col2im(W^T (K x OC) * dY[n] (OC x P))`, skipped entirely when
//!   the input tensor tracks no gradient (a data batch);
//! * bias gradient: `db[o] = sum_n sum_q dY[n][o, q]`, a reduction over contiguous rows.
//!
//! Images are spread over the rayon pool (one GEMM per image on its thread, with its own
//! column buffer); for fewer images than threads the GEMM itself is parallel instead. The
//! weight gradient sums one partial `dW` per thread. The GEMMs are the `gemm` crate's, the
//! kernel candle-core uses for its own CPU matmul.
//!
//! Other devices, dtypes and grouped convolutions use candle's `Tensor::conv2d`, so results
//! are correct everywhere and fast on CPU f32.
//!
//! Max pooling ([`max_pool2d`]) takes the first maximum of each window in row-major order
//! (as candle's and PyTorch's forward do) and its backward sends each window's gradient to
//! that element, recomputing the position from the input; windows may overlap. This is
//! PyTorch's gradient. candle 0.11.1's own max-pool backward differs: it scales each
//! gradient by `1 / kernel^2` (it multiplies by the window mean of the max mask), misplaces
//! gradients when the input size is not a multiple of the window, and refuses overlapping
//! windows.
//!
//! The per-image GEMMs are small (for LeNet's conv2, `16 x 100 x 150`) but run at about
//! 60 GFLOP/s on one core, so the op needs no larger batched GEMM.

use std::borrow::Cow;
use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor,
};
use gemm::Parallelism;
use rayon::prelude::*;

use crate::format::Format;
use crate::kernels::im2col::{col2im, im2col, ConvGeom};
use crate::ops::quantize::{Quant, QuantizeOp, Quantizer};

/// A 2-D convolution of `x` `(N, C, H, W)` with `w` `(OC, C/groups, KH, KW)`, plus `bias`
/// `(OC)` when given, with `cfg`'s padding, stride, dilation and groups.
///
/// On CPU with f32 tensors and `groups == 1` this is an im2col + GEMM op with its own
/// backward (see the module docs); otherwise candle's `Tensor::conv2d`. Shape, dtype and
/// device mismatches are errors.
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::ones((1, 1, 3, 3), candle_core::DType::F32, &Device::Cpu)?;
/// let w = Tensor::ones((2, 1, 2, 2), candle_core::DType::F32, &Device::Cpu)?;
/// let b = Tensor::new(&[0.0f32, 1.0], &Device::Cpu)?;
/// let y = qcandle::ops::conv2d(&x, &w, Some(&b), &Default::default())?;
/// assert_eq!(y.dims(), [1, 2, 2, 2]);
/// assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [4.0, 4.0, 4.0, 4.0, 5.0, 5.0, 5.0, 5.0]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
) -> Result<Tensor> {
    conv2d_act(x, w, bias, cfg, false)
}

/// `relu(conv2d(x, w, bias))` in one op: the ReLU is applied to each output as it is
/// written and, in backward, the incoming gradient is masked by `y > 0` inside the op, so
/// neither pass makes extra passes over the (large) activation.
///
/// For any elementwise rounding `Q` with `Q(0) = 0` that keeps signs (every format here),
/// `Q(relu(y)) = relu(Q(y))` and masking commutes with rounding the gradient, so a
/// quantizer may follow the fused op instead of sitting between the convolution and the
/// ReLU.
pub fn conv2d_relu(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
) -> Result<Tensor> {
    conv2d_act(x, w, bias, cfg, true)
}

fn conv2d_act(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    relu: bool,
) -> Result<Tensor> {
    conv2d_quantized(x, w, bias, cfg, relu, None, None)
}

/// [`conv2d`] or [`conv2d_relu`] (`relu`) followed by a quantizer, in one op: the output
/// is rounded with `output` in place, and in backward the incoming gradient is rounded with
/// `error` before the convolution's gradients are formed. Equal to the separate
/// [`crate::Quantizer`] after the convolution (same streams, same calls), without the
/// quantizer's allocations and graph node. (With a ReLU and an output format that can round
/// a positive value to zero, i.e. any but a posit, the quantizer is that separate layer: the
/// fused backward would mask the gradient where the rounded output is zero.)
pub fn conv2d_quantized(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    cfg: &candle_nn::Conv2dConfig,
    relu: bool,
    output: Option<&Quant>,
    error: Option<&Quant>,
) -> Result<Tensor> {
    let (n, c, h, wd) = x.dims4()?;
    let (oc, wc, kh, kw) = w.dims4()?;
    if cfg.groups == 0 || cfg.stride == 0 || cfg.dilation == 0 {
        bail!(
            "conv2d: groups ({}), stride ({}) and dilation ({}) must be positive",
            cfg.groups,
            cfg.stride,
            cfg.dilation
        )
    }
    if wc.checked_mul(cfg.groups) != Some(c) || oc % cfg.groups != 0 {
        bail!(
            "conv2d: input (N, C, H, W) = {:?} and weight (OC, C/groups, KH, KW) = {:?} do not \
             match for groups = {}",
            x.dims(),
            w.dims(),
            cfg.groups
        )
    }
    if x.dtype() != w.dtype() || !x.device().same_device(w.device()) {
        bail!(
            "conv2d: input ({:?}, {:?}) and weight ({:?}, {:?}) differ in dtype or device",
            x.dtype(),
            x.device().location(),
            w.dtype(),
            w.device().location()
        )
    }
    if let Some(b) = bias {
        if b.dims() != [oc] {
            bail!(
                "conv2d: bias of shape {:?} for a weight with {oc} output channels",
                b.dims()
            )
        }
        if b.dtype() != x.dtype() || !b.device().same_device(x.device()) {
            bail!("conv2d: bias differs from the input in dtype or device")
        }
    }
    let Some(geom) = ConvGeom::new((c, h, wd), (kh, kw), cfg.stride, cfg.padding, cfg.dilation)
    else {
        bail!(
            "conv2d: kernel {kh}x{kw} (dilation {}) does not fit the {h}x{wd} input with \
             padding {}",
            cfg.dilation,
            cfg.padding
        )
    };
    let fast = x.device().is_cpu() && x.dtype() == DType::F32 && cfg.groups == 1;
    if !fast || n == 0 || oc == 0 || geom.rows() == 0 || geom.image_len() == 0 {
        let y = x.conv2d(w, cfg.padding, cfg.stride, cfg.dilation, cfg.groups)?;
        let y = match bias {
            Some(b) => y.broadcast_add(&b.reshape((1, oc, 1, 1))?)?,
            None => y,
        };
        let y = if relu { y.relu()? } else { y };
        return if output.is_some() || error.is_some() {
            candle_core::Module::forward(&Quantizer::new(output.cloned(), error.cloned()), &y)
        } else {
            Ok(y)
        };
    }
    // The fused backward masks the gradient with the op's rounded output; a format that can
    // round a positive value to zero (all but posits) would mask more than the ReLU does,
    // so such a quantizer stays a separate layer after a fused ReLU.
    let separate = relu && output.is_some_and(|q| !matches!(q.format(), Format::Posit(_)));
    let op = ConvOp {
        geom,
        out_channels: oc,
        relu,
        output: if separate {
            None
        } else {
            output.map(Quant::op)
        },
        error: if separate { None } else { error.cloned() },
    };
    let y = match bias {
        Some(b) => x.apply_op3(w, b, op),
        None => x.apply_op2(w, op),
    }?;
    if separate {
        candle_core::Module::forward(&Quantizer::new(output.cloned(), error.cloned()), &y)
    } else {
        Ok(y)
    }
}

/// The forward op: `(x, w)` or `(x, w, bias)`.
#[derive(Debug, Clone)]
struct ConvOp {
    geom: ConvGeom,
    out_channels: usize,
    /// Whether a ReLU follows the convolution (inside the op).
    relu: bool,
    /// Rounding of the output (its random stream drawn when the op was built).
    output: Option<QuantizeOp>,
    /// Rounding of the incoming gradient in backward.
    error: Option<Quant>,
}

fn f32s<'a>(s: &'a CpuStorage, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        other => bail!("conv2d: {what} must be f32, got {:?}", other.dtype()),
    }
}

/// The elements of a tensor in row-major order, borrowed when the layout is contiguous.
fn contiguous<'a>(v: &'a [f32], l: &Layout) -> Cow<'a, [f32]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Cow::Borrowed(&v[a..b]),
        None => Cow::Owned(crate::kernels::cpu::gather(v, l)),
    }
}

/// A row-major view of a matrix: element `(i, j)` at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
struct Mat<'a> {
    data: &'a [f32],
    rs: usize,
    cs: usize,
}

impl Mat<'_> {
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `dst (m x n, row-major, contiguous) = [dst +] lhs (m x k) * rhs (k x n)`.
fn sgemm(
    (m, n, k): (usize, usize, usize),
    dst: &mut [f32],
    accumulate: bool,
    lhs: Mat,
    rhs: Mat,
    par: Parallelism,
) {
    assert!(dst.len() >= m * n && lhs.fits(m, k) && rhs.fits(k, n));
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    // SAFETY: the assert above keeps every index the kernel touches inside the slices, and
    // `dst` is borrowed mutably so it does not alias `lhs` or `rhs`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

/// None to spread `n` images over the threads (each GEMM sequential); `Some(threads)` when
/// there are fewer images than threads, to run them one after the other with parallel GEMMs.
fn gemm_threads(n: usize) -> Option<usize> {
    let threads = rayon::current_num_threads();
    (n < threads).then_some(threads)
}

/// Runs `f(i, scratch, out_i, parallelism)` for every image `i` of `n`, `out_i` being the
/// `i`-th of `n` equal parts of `out` and `scratch` a buffer of `scratch` elements. Images
/// are split into one contiguous run per thread, each with its own buffer.
fn per_image<F>(out: &mut [f32], n: usize, scratch: usize, f: F)
where
    F: Fn(usize, &mut [f32], &mut [f32], Parallelism) + Sync,
{
    let len = out.len() / n.max(1);
    if len == 0 {
        return;
    }
    match gemm_threads(n) {
        None => {
            let per = n.div_ceil(rayon::current_num_threads());
            out.par_chunks_mut(per * len)
                .enumerate()
                .for_each(|(run, chunk)| {
                    let mut buf = vec![0f32; scratch];
                    for (j, o) in chunk.chunks_mut(len).enumerate() {
                        f(run * per + j, &mut buf, o, Parallelism::None);
                    }
                })
        }
        Some(t) => {
            let mut buf = vec![0f32; scratch];
            for (i, o) in out.chunks_mut(len).enumerate() {
                f(i, &mut buf, o, Parallelism::Rayon(t));
            }
        }
    }
}

fn image_strides(l: &Layout) -> (usize, [usize; 3]) {
    let s = l.stride();
    (s[0], [s[1], s[2], s[3]])
}

impl ConvOp {
    fn forward(
        &self,
        x: (&[f32], &Layout),
        w: (&[f32], &Layout),
        bias: Option<(&[f32], &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let (n, oc) = (x.1.dims()[0], self.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let wm = contiguous(w.0, w.1);
        let bias = bias.map(|(b, l)| contiguous(b, l));
        let (sn, strides) = image_strides(x.1);
        let x0 = x.1.start_offset();
        let mut out = vec![0f32; n * oc * p];
        // Round each image's output while it is in cache where that gives the same bits.
        let per_image_rounding = self.output.filter(QuantizeOp::rounds_parts_alike);
        let failed = Mutex::new(None);
        let image = |i: usize, cols: &mut [f32], y: &mut [f32], par| {
            im2col(x.0, x0 + i * sn, strides, g, 0.0, cols);
            if let Some(b) = &bias {
                for (row, &bv) in y.chunks_exact_mut(p).zip(b.iter()) {
                    row.fill(bv);
                }
            }
            let lhs = Mat {
                data: &wm,
                rs: k,
                cs: 1,
            };
            let rhs = Mat {
                data: cols,
                rs: p,
                cs: 1,
            };
            sgemm((oc, p, k), y, bias.is_some(), lhs, rhs, par);
            if self.relu {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            if let Some(q) = &per_image_rounding {
                if let Err(e) = q.round_f32_in_place(y, &[oc, g.out_h, g.out_w]) {
                    failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            }
        };
        per_image(&mut out, n, k * p, image);
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
        let dims = [n, oc, g.out_h, g.out_w];
        if let (Some(q), None) = (&self.output, per_image_rounding) {
            q.round_f32_in_place(&mut out, &dims)?;
        }
        Ok((CpuStorage::F32(out), Shape::from(dims.to_vec())))
    }

    fn grads(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: Option<&Tensor>,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let error = self.error.as_ref().map(Quant::op);
        let prepared;
        let grad = match (error, self.relu) {
            // Masked and rounded in one pass, chunk by chunk (rounding a masked zero gives
            // zero, so masking first changes nothing).
            (Some(q), true) if q.rounds_parts_alike() => {
                prepared = grad.apply_op2_no_bwd(res, &ReluMask(Some(q)))?;
                &prepared
            }
            (q, relu) => {
                let rounded = match q {
                    Some(q) => grad.apply_op1_no_bwd(&q)?,
                    None => grad.clone(),
                };
                prepared = if relu {
                    rounded.apply_op2_no_bwd(res, &ReluMask(None))?
                } else {
                    rounded
                };
                &prepared
            }
        };
        let dw = if w.track_op() {
            Some(x.apply_op2_no_bwd(grad, &WeightGrad(self.clone()))?)
        } else {
            None
        };
        let dx = if x.track_op() {
            Some(grad.apply_op2_no_bwd(w, &InputGrad(self.clone()))?)
        } else {
            None
        };
        let db = match b {
            Some(b) if b.track_op() => Some(grad.apply_op1_no_bwd(&BiasGrad)?),
            _ => None,
        };
        Ok((dx, dw, db))
    }
}

impl CustomOp2 for ConvOp {
    fn name(&self) -> &'static str {
        "qcandle-conv2d"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.forward((f32s(s1, "input")?, l1), (f32s(s2, "weight")?, l2), None)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (dx, dw, _) = self.grads(x, w, None, res, grad)?;
        Ok((dx, dw))
    }
}

impl CustomOp3 for ConvOp {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-bias"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let b = (f32s(s3, "bias")?, l3);
        self.forward((f32s(s1, "input")?, l1), (f32s(s2, "weight")?, l2), Some(b))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        self.grads(x, w, Some(b), res, grad)
    }
}

/// The ReLU's backward: `dY * (Y > 0)`, applied to `(dY, Y)`, then rounded when given a
/// rounding whose parts round alike ([`QuantizeOp::rounds_parts_alike`]), each chunk while
/// it is in cache.
struct ReluMask(Option<QuantizeOp>);

impl CustomOp2 for ReluMask {
    fn name(&self) -> &'static str {
        "qcandle-relu-mask"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let dy = contiguous(f32s(s1, "gradient")?, l1);
        let y = contiguous(f32s(s2, "output")?, l2);
        let mut out = vec![0f32; dy.len()];
        out.par_chunks_mut(1 << 14)
            .zip(dy.par_chunks(1 << 14).zip(y.par_chunks(1 << 14)))
            .try_for_each(|(o, (g, y))| {
                for ((o, &g), &y) in o.iter_mut().zip(g).zip(y) {
                    *o = if y > 0.0 { g } else { 0.0 };
                }
                match &self.0 {
                    Some(q) => q.round_f32_in_place(o, &[o.len()]),
                    None => Ok(()),
                }
            })?;
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

/// Images per partial weight gradient (see [`WeightGrad`]).
const IMAGES_PER_PARTIAL: usize = 16;

/// `dW = sum_n dY[n] * cols[n]^T`, applied to `(x, dY)`: partial sums over fixed runs of
/// [`IMAGES_PER_PARTIAL`] images, in parallel, then added in order.
struct WeightGrad(ConvOp);

impl CustomOp2 for WeightGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-weight-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0.geom;
        let (n, oc) = (l1.dims()[0], self.0.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let x = f32s(s1, "input")?;
        let dy = contiguous(f32s(s2, "gradient")?, l2);
        let (sn, strides) = image_strides(l1);
        let x0 = l1.start_offset();
        // Adds images `range` into `dw`.
        let chunk = |range: std::ops::Range<usize>, dw: &mut [f32], cols: &mut [f32], par| {
            for i in range {
                im2col(x, x0 + i * sn, strides, g, 0.0, cols);
                let lhs = Mat {
                    data: &dy[i * oc * p..(i + 1) * oc * p],
                    rs: p,
                    cs: 1,
                };
                let rhs = Mat {
                    data: cols,
                    rs: 1,
                    cs: p,
                };
                sgemm((oc, k, p), dw, true, lhs, rhs, par);
            }
        };
        // Partial sums over fixed runs of images, added in order: the result does not
        // depend on the thread count or on how rayon schedules the runs. With fewer runs
        // than threads each GEMM is parallel itself (over its output tiles only).
        let runs = n.div_ceil(IMAGES_PER_PARTIAL);
        let threads = rayon::current_num_threads();
        let par = if runs < threads {
            Parallelism::Rayon(threads)
        } else {
            Parallelism::None
        };
        let partials: Vec<Vec<f32>> = (0..runs)
            .into_par_iter()
            .map(|run| {
                let mut dw = vec![0f32; oc * k];
                let mut cols = vec![0f32; k * p];
                let start = run * IMAGES_PER_PARTIAL;
                chunk(
                    start..(start + IMAGES_PER_PARTIAL).min(n),
                    &mut dw,
                    &mut cols,
                    par,
                );
                dw
            })
            .collect();
        let mut dw = vec![0f32; oc * k];
        for partial in &partials {
            dw.iter_mut().zip(partial).for_each(|(a, b)| *a += b);
        }
        let shape = Shape::from((oc, g.channels, g.kernel_h, g.kernel_w));
        Ok((CpuStorage::F32(dw), shape))
    }
}

/// `dX[n] = col2im(W^T * dY[n])`, applied to `(dY, w)`.
struct InputGrad(ConvOp);

impl CustomOp2 for InputGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-input-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.0.geom;
        let (n, oc) = (l1.dims()[0], self.0.out_channels);
        let (k, p) = (g.rows(), g.cols());
        let dy = contiguous(f32s(s1, "gradient")?, l1);
        let wm = contiguous(f32s(s2, "weight")?, l2);
        let img = g.image_len();
        let mut dx = vec![0f32; n * img];
        let image = |i: usize, dcols: &mut [f32], dxi: &mut [f32], par| {
            let lhs = Mat {
                data: &wm,
                rs: 1,
                cs: k,
            };
            let rhs = Mat {
                data: &dy[i * oc * p..(i + 1) * oc * p],
                rs: p,
                cs: 1,
            };
            sgemm((k, p, oc), dcols, false, lhs, rhs, par);
            col2im(dcols, g, dxi);
        };
        per_image(&mut dx, n, k * p, image);
        let shape = Shape::from((n, g.channels, g.height, g.width));
        Ok((CpuStorage::F32(dx), shape))
    }
}

/// `db[o] = sum over n, q of dY[n, o, q]`, applied to `dY`.
struct BiasGrad;

impl CustomOp1 for BiasGrad {
    fn name(&self) -> &'static str {
        "qcandle-conv2d-bias-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, oc, h, w) = l.shape().dims4()?;
        let p = h * w;
        let dy = contiguous(f32s(s, "gradient")?, l);
        let db: Vec<f32> = (0..oc)
            .into_par_iter()
            .map(|o| {
                let mut acc = 0f64;
                for i in 0..n {
                    let row = &dy[(i * oc + o) * p..(i * oc + o + 1) * p];
                    acc += lane_sum(row) as f64;
                }
                acc as f32
            })
            .collect();
        Ok((CpuStorage::F32(db), Shape::from(oc)))
    }
}

/// The sum of `v` in 16 interleaved f32 lanes (element `i` into lane `i % 16`), then the
/// lanes in order: independent additions vectorise where one running sum would wait on
/// every add. The order is fixed, so the result does not depend on threads.
fn lane_sum(v: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = v.chunks_exact(16);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += x;
    }
    lanes.iter().sum()
}

/// Max pooling of `x` `(N, C, H, W)` over `kernel x kernel` windows every `stride` pixels
/// (no padding; output `(H - kernel) / stride + 1` per axis).
///
/// On CPU with f32 this is an op whose backward sends each window's gradient to the first
/// maximum of the window (overlapping windows add up); on other devices and dtypes,
/// [`max_pool2d_by_gather`], built from candle ops with the same gradient. Forward values
/// equal candle's `max_pool2d_with_stride`, whose own backward is wrong (module docs).
///
/// ```
/// use candle_core::{Device, Tensor};
/// let x = Tensor::arange(0f32, 16.0, &Device::Cpu)?.reshape((1, 1, 4, 4))?;
/// let y = qcandle::ops::max_pool2d(&x, 2, 2)?;
/// assert_eq!(y.flatten_all()?.to_vec1::<f32>()?, [5.0, 7.0, 13.0, 15.0]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn max_pool2d(x: &Tensor, kernel: usize, stride: usize) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if kernel == 0 || stride == 0 {
        bail!("max_pool2d: kernel ({kernel}) and stride ({stride}) must be positive")
    }
    if h < kernel || w < kernel {
        bail!("max_pool2d: kernel {kernel} is larger than the {h}x{w} input")
    }
    if n * c == 0 {
        return x.max_pool2d_with_stride(kernel, stride);
    }
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return max_pool2d_by_gather(x, kernel, stride);
    }
    x.apply_op1(MaxPool { kernel, stride })
}

/// Max pooling from candle ops that every device has, with PyTorch's gradient: the window
/// elements are gathered with `index_select` (`(N*C, OH*OW, kernel^2)`), the maximum of each
/// window is picked by `argmax` and read back with `gather`. The backward of `gather` puts
/// each window's gradient on the picked element and that of `index_select` adds
/// overlapping windows. The path [`max_pool2d`] takes off CPU f32; public so that it can be
/// checked on any machine. Which maximum `argmax` picks among equal values (and how it
/// treats NaN) is the device's: on CPU the first, as in [`max_pool2d`].
pub fn max_pool2d_by_gather(x: &Tensor, kernel: usize, stride: usize) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    if kernel == 0 || stride == 0 || h < kernel || w < kernel {
        bail!("max_pool2d: kernel {kernel} with stride {stride} does not fit a {h}x{w} input")
    }
    let (oh, ow) = ((h - kernel) / stride + 1, (w - kernel) / stride + 1);
    let mut at = Vec::with_capacity(oh * ow * kernel * kernel);
    for oy in 0..oh {
        for ox in 0..ow {
            for i in 0..kernel {
                for j in 0..kernel {
                    at.push(((oy * stride + i) * w + ox * stride + j) as u32);
                }
            }
        }
    }
    let at = Tensor::from_vec(at, oh * ow * kernel * kernel, x.device())?;
    let windows = x.reshape((n * c, h * w))?.index_select(&at, 1)?.reshape((
        n * c,
        oh * ow,
        kernel * kernel,
    ))?;
    let pick = windows.argmax_keepdim(2)?;
    windows.gather(&pick, 2)?.reshape((n, c, oh, ow))
}

#[derive(Debug, Clone, Copy)]
struct MaxPool {
    kernel: usize,
    stride: usize,
}

impl MaxPool {
    fn out(&self, h: usize, w: usize) -> (usize, usize) {
        (
            (h - self.kernel) / self.stride + 1,
            (w - self.kernel) / self.stride + 1,
        )
    }

    /// For 2x2 windows every 2 pixels along rows of unit stride (LeNet's and CifarNet's
    /// pooling), the offset of `plane` and the row stride, for the branch-free loops that
    /// read each window as two pairs; None otherwise.
    fn pairs(&self, l: &Layout, plane: usize) -> Option<(usize, usize)> {
        let s = l.stride();
        let c = l.dims()[1];
        (self.kernel == 2 && self.stride == 2 && s[3] == 1).then(|| {
            (
                l.start_offset() + (plane / c) * s[0] + (plane % c) * s[1],
                s[2],
            )
        })
    }

    /// Calls `f(q, y, x, value)` for every window `q` of `plane` (an index into `N * C`) with
    /// the coordinates and value of the window's first maximum in row-major order.
    fn for_each_argmax(
        &self,
        x: &[f32],
        l: &Layout,
        plane: usize,
        mut f: impl FnMut(usize, usize, usize, f32),
    ) {
        let (c, h, w) = (l.dims()[1], l.dims()[2], l.dims()[3]);
        let s = l.stride();
        let (oh, ow) = self.out(h, w);
        let base = l.start_offset() + (plane / c) * s[0] + (plane % c) * s[1];
        for oy in 0..oh {
            for ox in 0..ow {
                let (y0, x0) = (oy * self.stride, ox * self.stride);
                let (mut by, mut bx) = (y0, x0);
                let mut best = x[base + y0 * s[2] + x0 * s[3]];
                for yy in y0..y0 + self.kernel {
                    let row = base + yy * s[2];
                    for xx in x0..x0 + self.kernel {
                        let v = x[row + xx * s[3]];
                        if best < v {
                            (best, by, bx) = (v, yy, xx);
                        }
                    }
                }
                f(oy * ow + ox, by, bx, best);
            }
        }
    }
}

/// The first maximum of a window's values in row-major order and its position: a later
/// value replaces the best only when strictly greater, so ties keep the first and a NaN
/// never replaces (a NaN in first place stays), as in [`MaxPool::for_each_argmax`].
#[inline(always)]
fn first_max(v: [f32; 4]) -> (usize, f32) {
    let (mut at, mut best) = (0, v[0]);
    for (i, &x) in v.iter().enumerate().skip(1) {
        let greater = best < x;
        at = if greater { i } else { at };
        best = if greater { x } else { best };
    }
    (at, best)
}

impl CustomOp1 for MaxPool {
    fn name(&self) -> &'static str {
        "qcandle-max-pool2d"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l.shape().dims4()?;
        let x = f32s(s, "input")?;
        let (oh, ow) = self.out(h, w);
        let mut y = vec![0f32; n * c * oh * ow];
        y.par_chunks_mut(oh * ow)
            .enumerate()
            .for_each(|(plane, yp)| match self.pairs(l, plane) {
                Some((base, row)) => {
                    for (oy, out) in yp.chunks_exact_mut(ow).enumerate() {
                        let top = &x[base + 2 * oy * row..][..2 * ow];
                        let bottom = &x[base + (2 * oy + 1) * row..][..2 * ow];
                        for (o, (t, b)) in out
                            .iter_mut()
                            .zip(top.chunks_exact(2).zip(bottom.chunks_exact(2)))
                        {
                            *o = first_max([t[0], t[1], b[0], b[1]]).1;
                        }
                    }
                }
                None => self.for_each_argmax(x, l, plane, |q, _, _, v| yp[q] = v),
            });
        Ok((CpuStorage::F32(y), Shape::from((n, c, oh, ow))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(grad, &MaxPoolGrad(*self))?))
    }
}

/// Scatters the output gradient to the window maxima, applied to `(x, dY)`.
struct MaxPoolGrad(MaxPool);

impl CustomOp2 for MaxPoolGrad {
    fn name(&self) -> &'static str {
        "qcandle-max-pool2d-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = l1.shape().dims4()?;
        let x = f32s(s1, "input")?;
        let dy = contiguous(f32s(s2, "gradient")?, l2);
        let (oh, ow) = self.0.out(h, w);
        let mut dx = vec![0f32; n * c * h * w];
        dx.par_chunks_mut(h * w)
            .enumerate()
            .for_each(|(plane, dxp)| {
                let g = &dy[plane * oh * ow..(plane + 1) * oh * ow];
                match self.0.pairs(l1, plane) {
                    Some((base, row)) => {
                        // Windows do not overlap: each writes its four pixels once.
                        for (oy, gr) in g.chunks_exact(ow).enumerate() {
                            let top = &x[base + 2 * oy * row..][..2 * ow];
                            let bottom = &x[base + (2 * oy + 1) * row..][..2 * ow];
                            let (d0, rest) = dxp[2 * oy * w..].split_at_mut(w);
                            let d1 = &mut rest[..w];
                            for (ox, &gv) in gr.iter().enumerate() {
                                let (t, b) =
                                    (&top[2 * ox..2 * ox + 2], &bottom[2 * ox..2 * ox + 2]);
                                let at = first_max([t[0], t[1], b[0], b[1]]).0;
                                let pick = |i: usize| if at == i { gv } else { 0.0 };
                                d0[2 * ox] = pick(0);
                                d0[2 * ox + 1] = pick(1);
                                d1[2 * ox] = pick(2);
                                d1[2 * ox + 1] = pick(3);
                            }
                        }
                    }
                    None => self
                        .0
                        .for_each_argmax(x, l1, plane, |q, yy, xx, _| dxp[yy * w + xx] += g[q]),
                }
            });
        Ok((CpuStorage::F32(dx), Shape::from((n, c, h, w))))
    }
}
