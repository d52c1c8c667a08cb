//! 2-D convolution and max pooling on CPU f32 tensors, with their own backward passes.
//!
//! # Math
//!
//! For a batch of `N` images `x` of shape `(N, C, H, W)`, a weight `w` of shape
//! `(OC, C, KH, KW)` and an optional bias `b` of shape `(OC)`, let `cols[n]` be the
//! `K x P` column matrix of image `n` ([`crate::backend::im2col`]: `K = C*KH*KW` rows,
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
//! The per-image GEMMs are small (for LeNet's conv2, `16 x 100 x 150`) but run at about
//! 60 GFLOP/s on one core, so the op needs no larger batched GEMM.
//!
//! Rooms: `forward` (the op and its forward pass), `backward` (the gradients, the ReLU mask
//! and the quantizer's rounding of the incoming gradient) and `sgemm` (the `gemm` crate's f32
//! GEMM on strided views, and the split of images over threads). Max pooling is
//! [`crate::ops::pool`].

mod backward;
mod forward;
mod sgemm;

use candle_core::{bail, DType, Result, Tensor};

use crate::backend::im2col::ConvGeom;
use crate::format::Format;
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
    conv2d_quantized(x, w, bias, cfg, relu, None)
}

/// [`conv2d`] or [`conv2d_relu`] (`relu`) followed by `quantizer`, in one op: the output
/// is rounded with its forward quantization in place, and in backward the incoming gradient
/// is rounded with its backward quantization before the convolution's gradients are formed. Equal to the separate
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
    quantizer: Option<&Quantizer>,
) -> Result<Tensor> {
    let output = quantizer.and_then(Quantizer::forward_quant);
    let error = quantizer.and_then(Quantizer::backward_quant);
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
        return match quantizer {
            Some(q) if output.is_some() || error.is_some() => candle_core::Module::forward(q, &y),
            _ => Ok(y),
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
    match quantizer {
        Some(q) if separate => candle_core::Module::forward(q, &y),
        _ => Ok(y),
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
