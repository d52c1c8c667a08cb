//! Posit GEMMs on candle tensors: exact (quire) and naive (rounded after every operation)
//! matrix products, linear layers and 2-D convolutions.
//!
//! Inputs of any float dtype and device are first rounded to the format (nearest even),
//! computed on the CPU in f64 (every value of the formats involved is exact there), and
//! returned in the first input's dtype and device. With the `cuda` feature, matmuls and
//! linear layers of f32 tensors on a CUDA device in posits of at most 8 bits (maxpos <=
//! 2^24: posit<8,0>, <8,1>, <8,2>) run on the device instead, with the same bits
//! (`quire::gemm_cuda`, `cuda/gemm.cu`). Convolutions go through the shared
//! im2col layout ([`crate::backend::im2col`]): per image, `Y (OC x P) = W (OC x K) · cols`.
//! No backward pass: these ops evaluate trained models.

use candle_core::{bail, DType, Device, Result, Tensor};
use rayon::prelude::*;

use super::accumulator::quire_support;
use super::gemm_cpu::{naive_gemm, quire_gemm, Bias, Dims};
use crate::backend::im2col::{im2col, ConvGeom};
use crate::format::Format;
use crate::ops::{quantize_no_grad, Quant};

/// How a dot product is accumulated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accumulation {
    /// Every product accumulated exactly in a quire, one rounding per output (posits only).
    Quire,
    /// Rounded after every multiply and every add, `k` ascending (any elementwise format).
    Naive,
}

impl Accumulation {
    /// Checks that `format` supports this accumulation.
    pub fn check(self, format: &Format) -> Result<()> {
        match (self, format) {
            (Accumulation::Quire, Format::Posit(p)) => {
                quire_support(*p).map_err(candle_core::Error::Msg)
            }
            (Accumulation::Quire, other) => bail!(
                "{other} has no quire: quire GEMMs take posit formats (naive GEMMs take any elementwise format)"
            ),
            (Accumulation::Naive, Format::Block(_) | Format::Mx(_) | Format::Nvfp4(_)) => bail!(
                "{format} rounds whole blocks, not single operations: naive GEMMs take posit, float and fixed-point formats"
            ),
            (Accumulation::Naive, Format::Posit(p)) => {
                quire_support(*p).map_err(candle_core::Error::Msg)
            }
            (Accumulation::Naive, _) => Ok(()),
        }
    }

    /// The GEMM kernel of this accumulation.
    fn gemm(self, format: &Format, g: Operands, out: &mut [f64], parallel: bool) {
        let Operands { a, b, dims, bias } = g;
        match (self, format) {
            (Accumulation::Quire, Format::Posit(p)) => {
                quire_gemm(*p, a, b, dims, bias, out, parallel)
            }
            (Accumulation::Quire, _) => unreachable!("checked by Accumulation::check"),
            (Accumulation::Naive, f) => naive_gemm(f, a, b, dims, bias, out, parallel),
        }
    }
}

/// The operands of one GEMM: `a (m x k)`, `b (k x n)`, row-major, and the bias.
#[derive(Clone, Copy)]
struct Operands<'a> {
    a: &'a [f64],
    b: &'a [f64],
    dims: Dims,
    bias: Bias<'a>,
}

/// The elements of `x` rounded to `format`, as f64 in row-major order.
fn rounded(x: &Tensor, format: &Format, what: &str) -> Result<Vec<f64>> {
    if !matches!(
        x.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        bail!(
            "{what}: unsupported dtype {:?}; posit GEMMs take float tensors",
            x.dtype()
        );
    }
    let x = x.to_device(&Device::Cpu)?;
    if x.dtype() != DType::F32 || !values_fit_f32(format) {
        // Round the value in f64: the format's value may lie beyond the input dtype (an f16
        // 65504 is posit<16,1> 65536).
        let q = quantize_no_grad(&x.to_dtype(DType::F64)?, &Quant::new(*format))?;
        return q.flatten_all()?.to_vec1::<f64>();
    }
    let q = quantize_no_grad(&x, &Quant::new(*format))?;
    // One pass from the rounded f32 storage to the f64 operands (no intermediate tensor).
    let (storage, layout) = q.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        bail!("{what}: expected a CPU tensor");
    };
    let data = cpu.as_slice::<f32>()?;
    let widen = |v: &[f32]| v.par_iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
    Ok(match layout.contiguous_offsets() {
        Some((start, end)) => widen(&data[start..end]),
        None => widen(&crate::backend::cpu::gather(data, layout)),
    })
}

/// Whether every value of `format` is an f32 (so rounding an f32 input in f32 is exact).
fn values_fit_f32(format: &Format) -> bool {
    let (max, min) = (format.max_finite(), format.min_positive());
    format.bits() <= 24
        && max.is_some_and(|m| m <= f64::from(f32::MAX))
        && min.is_some_and(|m| m >= 2f64.powi(-149))
}

/// The result tensor: `out` in `like`'s dtype and device (f32 written directly).
fn finish(out: Vec<f64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    let t = if like.dtype() == DType::F32 {
        let narrow: Vec<f32> = out.par_iter().map(|&v| v as f32).collect();
        Tensor::from_vec(narrow, shape, &Device::Cpu)?
    } else {
        Tensor::from_vec(out, shape, &Device::Cpu)?.to_dtype(like.dtype())?
    };
    t.to_device(like.device())
}

/// Batched matrix product `a (..., m, k) · b (..., k, n)` (or `b (k, n)` shared by every
/// batch item) with the given accumulation; inputs are rounded to `format` first.
pub fn matmul(a: &Tensor, b: &Tensor, format: &Format, acc: Accumulation) -> Result<Tensor> {
    acc.check(format)?;
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || bd.len() < 2 {
        bail!("matmul needs matrices (rank >= 2), got shapes {ad:?} and {bd:?}");
    }
    let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (kb, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    let batch_dims = &ad[..ad.len() - 2];
    let shared_b = bd.len() == 2;
    if kb != k || !(shared_b || bd[..bd.len() - 2] == *batch_dims) {
        bail!("matmul: shapes {ad:?} and {bd:?} do not match (a: (..., m, k), b: (..., k, n) or (k, n))");
    }
    #[cfg(feature = "cuda")]
    if let Some(out) = super::gemm_cuda::matmul(a, b, format, acc)? {
        return Ok(out);
    }
    let batch: usize = batch_dims.iter().product();
    let (av, bv) = (rounded(a, format, "matmul")?, rounded(b, format, "matmul")?);
    let mut out = vec![0.0; batch * m * n];
    for (i, o) in out.chunks_mut((m * n).max(1)).enumerate().take(batch) {
        let bi = if shared_b { 0 } else { i };
        let g = Operands {
            a: &av[i * m * k..],
            b: &bv[bi * k * n..],
            dims: (m, k, n),
            bias: Bias::None,
        };
        acc.gemm(format, g, o, true);
    }
    let mut shape = batch_dims.to_vec();
    shape.extend([m, n]);
    finish(out, &shape, a)
}

/// [`matmul`] with a quire: every product accumulated exactly, one rounding per output.
pub fn quire_matmul(a: &Tensor, b: &Tensor, format: &Format) -> Result<Tensor> {
    matmul(a, b, format, Accumulation::Quire)
}

/// [`matmul`] rounded after every multiply and every add, `k` ascending.
pub fn naive_matmul(a: &Tensor, b: &Tensor, format: &Format) -> Result<Tensor> {
    matmul(a, b, format, Accumulation::Naive)
}

/// A linear layer `x (N, in) · w (out, in)^T + bias (out)` with the bias accumulated as one
/// more term (inside the quire, or as a last rounded add).
pub fn linear(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    format: &Format,
    acc: Accumulation,
) -> Result<Tensor> {
    acc.check(format)?;
    let ((rows, inp), (out_f, w_in)) = (x.dims2()?, w.dims2()?);
    if w_in != inp {
        bail!(
            "linear: input has {inp} features but the weight {:?} expects {w_in}",
            w.dims()
        );
    }
    // A bias of the wrong shape falls through to the host path's error.
    #[cfg(feature = "cuda")]
    if bias.is_none_or(|b| b.dims() == [out_f]) {
        if let Some(out) = super::gemm_cuda::linear(x, w, bias, format, acc)? {
            return Ok(out);
        }
    }
    let bias = bias_values(bias, out_f, format, "linear")?;
    let xv = rounded(x, format, "linear")?;
    let wt = rounded(&w.t()?.contiguous()?, format, "linear")?;
    let mut out = vec![0.0; rows * out_f];
    let b = bias.as_deref().map_or(Bias::None, Bias::PerCol);
    let g = Operands {
        a: &xv,
        b: &wt,
        dims: (rows, inp, out_f),
        bias: b,
    };
    acc.gemm(format, g, &mut out, true);
    finish(out, &[rows, out_f], x)
}

fn bias_values(
    bias: Option<&Tensor>,
    len: usize,
    format: &Format,
    what: &str,
) -> Result<Option<Vec<f64>>> {
    let Some(b) = bias else { return Ok(None) };
    if b.dims() != [len] {
        bail!("{what}: bias has shape {:?}, expected [{len}]", b.dims());
    }
    rounded(b, format, what).map(Some)
}

/// 2-D convolution of `x (N, C, H, W)` with `w (OC, C, KH, KW)` and an optional bias
/// `(OC)`, stride and zero padding on both axes, through im2col; inputs are rounded to
/// `format` first (so the padding value 0 is exact in every format).
pub fn conv2d(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    stride: usize,
    padding: usize,
    format: &Format,
    acc: Accumulation,
) -> Result<Tensor> {
    acc.check(format)?;
    let (n, c, h, wd) = x.dims4()?;
    let (oc, wc, kh, kw) = w.dims4()?;
    if wc != c {
        bail!(
            "conv2d: input has {c} channels but the weight {:?} expects {wc}",
            w.dims()
        );
    }
    let Some(geom) = ConvGeom::new((c, h, wd), (kh, kw), stride, padding, 1) else {
        bail!("conv2d: a {kh}x{kw} kernel with stride {stride} and padding {padding} does not fit a {h}x{wd} input");
    };
    let bias = bias_values(bias, oc, format, "conv2d")?;
    let xv = rounded(x, format, "conv2d")?;
    let wv = rounded(w, format, "conv2d")?;
    let (k, p) = (geom.rows(), geom.cols());
    let image = geom.image_len();
    let mut out = vec![0.0; n * oc * p];
    let b = bias.as_deref().map_or(Bias::None, Bias::PerRow);
    let one = |i: usize, cols: &mut Vec<f64>, o: &mut [f64], parallel: bool| {
        im2col(&xv, i * image, [h * wd, wd, 1], &geom, 0.0, cols);
        let g = Operands {
            a: &wv,
            b: cols,
            dims: (oc, k, p),
            bias: b,
        };
        acc.gemm(format, g, o, parallel);
    };
    let chunk = (oc * p).max(1);
    if n >= rayon::current_num_threads() {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each_init(|| vec![0.0; k * p], |cols, (i, o)| one(i, cols, o, false));
    } else {
        let mut cols = vec![0.0; k * p];
        for (i, o) in out.chunks_mut(chunk).enumerate() {
            one(i, &mut cols, o, true);
        }
    }
    finish(out, &[n, oc, geom.out_h, geom.out_w], x)
}
