//! The arithmetics a trained model is evaluated in: how each convolution or linear layer
//! computes, and how values are held between layers.
//!
//! * float32: the model as trained.
//! * float16: weights, the input and every layer's output rounded to fp16 (nearest even);
//!   products accumulated in f32, as fp16 inference with f32 accumulation does.
//! * int8: per-tensor symmetric quantization of weights and activations to integers in
//!   [-127, 127] (scale = max |x| / 127, nearest even). Activation scales come from the
//!   largest magnitude seen at each layer's input over calibration images; the bias becomes
//!   an integer in units of `s_x · s_w`. Integer products are summed exactly (in f64, exact
//!   for any k below 2^38) and the sum is scaled back: `y = s_x s_w (Σ q_x q_w + q_b)`.
//! * posit naive / posit quire: weights and the input rounded to the posit format;
//!   every layer runs through [`crate::quire`]'s GEMMs (rounded after every operation, or
//!   accumulated exactly with one rounding per output, the bias inside the accumulation);
//!   activations stay posits (ReLU and max-pooling are exact on them). Values are held in
//!   f64 so that posits of up to 32 bits are exact; on a CUDA device, formats whose GEMMs
//!   run there (posits of at most 8 bits, every value an f32) are held in f32, which the
//!   device GEMMs take, with the same values.
//! * `F naive:<A>`, `F fma:<A>`, `F lns:<impl>`: weights rounded to `F`; every layer runs
//!   [`crate::quire::rule_linear`] or [`crate::quire::rule_conv2d`] with the GEMM rule of the
//!   setting ([`crate::quire::GemmRule`]; [`crate::quire::accumulate`] defines each): the
//!   layer's input, weight and bias rounded to `F`, then for every output, `k` ascending,
//!   `naive:<A>` rounds each product to `F` and each partial sum to `A`, `fma:<A>` rounds each
//!   multiply-add once to `A`, `lns:<impl>` multiplies exactly in the logarithm and adds by
//!   Gaussian logarithms (`ideal`, `truncated` or `table`); the bias is the last term, and the
//!   output is rounded to `F`. Values are held in f32 and the GEMMs run on the host: the
//!   elementwise formats these take are exact there; an LNS value is held as the f32 nearest
//!   to it, which the next layer rounds back to the same LNS value (its spacing is far wider
//!   than an f32's), so the logits are the f32 nearest to the LNS results.
//! * block-scaled (MX, NVFP4), as microxcaling's MX layers compute: the weights and every
//!   layer's input rounded to the format in blocks along axis 1 (the input channels, the
//!   reduction axis of both linear layers and convolutions), nearest even; products and
//!   sums in f32 (candle's matmul and our convolution), the bias in f32, the layer's output
//!   unrounded (the next layer rounds its input). Values are held in f32: NVFP4 values
//!   (products of three scales) take a second rounding to f32 there, as its quantize op
//!   gives for f32 tensors. A quantized model's weights are taken as stored: NVFP4 rounding
//!   is not idempotent (the tensor scale follows the rounded maximum), and the file holds
//!   the values that were evaluated.

use std::collections::HashMap;

use candle_core::{DType, Device, Result, Tensor};

use super::model_file::Weights;
use crate::format::Format;
use crate::nn::Stage;
use crate::ops::{quantize_no_grad, Quant};
use crate::quire::{self, Accumulate, Accumulation, GemmRule, LayerArith};

/// A way to compute a model's layers.
pub trait Arithmetic: Sync {
    /// The model's input as this arithmetic holds it.
    fn input(&self, images: &Tensor) -> Result<Tensor>;
    /// Layer `name` (a convolution with `conv = Some((stride, padding))`, else linear)
    /// applied to `x`.
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor>;
}

/// Parameters of one layer.
#[derive(Debug, Clone)]
struct Layer {
    weight: Tensor,
    bias: Tensor,
}

fn layers(
    weights: &Weights,
    map: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<HashMap<String, Layer>> {
    let mut out = HashMap::new();
    for stage in weights.model.plan() {
        if let Stage::Conv { name, .. } | Stage::Linear { name, .. } = stage {
            let get = |p: &str| -> Result<Tensor> {
                let t = weights
                    .get(&format!("{name}.{p}"))
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                map(t)
            };
            out.insert(
                name.to_string(),
                Layer {
                    weight: get("weight")?,
                    bias: get("bias")?,
                },
            );
        }
    }
    Ok(out)
}

fn layer<'a>(layers: &'a HashMap<String, Layer>, name: &str) -> Result<&'a Layer> {
    layers
        .get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("no layer `{name}`")))
}

/// A float layer on f32 tensors (our convolution op, candle's matmul).
fn float_layer(l: &Layer, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
    match conv {
        Some((stride, padding)) => {
            let cfg = candle_nn::Conv2dConfig {
                stride,
                padding,
                ..Default::default()
            };
            crate::ops::conv2d(x, &l.weight, Some(&l.bias), &cfg)
        }
        None => x.matmul(&l.weight.t()?)?.broadcast_add(&l.bias),
    }
}

/// The trained model in f32.
pub struct Float32 {
    layers: HashMap<String, Layer>,
}

impl Float32 {
    /// The f32 arithmetic of `weights`.
    pub fn new(weights: &Weights) -> Result<Self> {
        Ok(Float32 {
            layers: layers(weights, |t| t.to_dtype(DType::F32))?,
        })
    }
}

impl Arithmetic for Float32 {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        images.to_dtype(DType::F32)
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        float_layer(layer(&self.layers, name)?, conv, x)
    }
}

/// Weights, input and layer outputs rounded to a float format, f32 accumulation.
pub struct Float16 {
    layers: HashMap<String, Layer>,
    quant: Quant,
}

impl Float16 {
    /// fp16 arithmetic of `weights`.
    pub fn new(weights: &Weights) -> Result<Self> {
        let quant = Quant::new("fp16".parse()?);
        Ok(Float16 {
            layers: layers(weights, |t| {
                quantize_no_grad(&t.to_dtype(DType::F32)?, &quant)
            })?,
            quant,
        })
    }
}

impl Arithmetic for Float16 {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        quantize_no_grad(&images.to_dtype(DType::F32)?, &self.quant)
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        quantize_no_grad(
            &float_layer(layer(&self.layers, name)?, conv, x)?,
            &self.quant,
        )
    }
}

/// Largest integer code of int8 symmetric quantization.
const INT8_MAX: f64 = 127.0;

/// `round(x / scale)` clamped to ±127, nearest even, as f64 integers.
fn int8_codes(x: &Tensor, scale: f64) -> Result<Tensor> {
    let v = x.to_dtype(DType::F64)?;
    let codes: Vec<f64> = v
        .flatten_all()?
        .to_vec1::<f64>()?
        .into_iter()
        .map(|x| (x / scale).round_ties_even().clamp(-INT8_MAX, INT8_MAX))
        .collect();
    Tensor::from_vec(codes, v.shape(), v.device())
}

fn int8_scale(max_abs: f64) -> f64 {
    if max_abs > 0.0 && max_abs.is_finite() {
        max_abs / INT8_MAX
    } else {
        1.0
    }
}

/// Per-tensor symmetric int8 weights and activations (see the module docs).
pub struct Int8 {
    /// Per layer: integer weight codes (f64), bias codes, and the output scale `s_x s_w`.
    layers: HashMap<String, (Layer, f64)>,
    input_scales: HashMap<String, f64>,
}

impl Int8 {
    /// int8 arithmetic of `weights`, with activation scales from the largest magnitude at
    /// each layer's input on `calibration` (images in the model's input shape), measured
    /// in float32.
    pub fn new(weights: &Weights, calibration: &Tensor) -> Result<Self> {
        let float = Float32::new(weights)?;
        let mut input_max: HashMap<String, f64> = HashMap::new();
        run_plan(weights.model, &float, calibration, |name, x| {
            let m = x
                .abs()?
                .max_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
            let e = input_max.entry(name.to_string()).or_insert(0.0);
            *e = e.max(m);
            Ok(())
        })?;
        let mut layers = HashMap::new();
        let mut input_scales = HashMap::new();
        for (name, l) in &float.layers {
            let s_x = int8_scale(input_max.get(name).copied().unwrap_or(0.0));
            let w_max = l
                .weight
                .abs()?
                .max_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
            let s_w = int8_scale(w_max);
            let weight = int8_codes(&l.weight, s_w)?;
            let bias = (l.bias.to_dtype(DType::F64)? / (s_x * s_w))?.round()?;
            layers.insert(name.clone(), (Layer { weight, bias }, s_x * s_w));
            input_scales.insert(name.clone(), s_x);
        }
        Ok(Int8 {
            layers,
            input_scales,
        })
    }
}

impl Arithmetic for Int8 {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        images.to_dtype(DType::F32)
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        let (l, scale) = self
            .layers
            .get(name)
            .ok_or_else(|| candle_core::Error::Msg(format!("no layer `{name}`")))?;
        let codes = int8_codes(x, self.input_scales[name])?;
        let acc = match conv {
            Some((stride, padding)) => codes
                .conv2d(&l.weight, padding, stride, 1, 1)?
                .broadcast_add(&l.bias.reshape((1, (), 1, 1))?)?,
            None => codes.matmul(&l.weight.t()?)?.broadcast_add(&l.bias)?,
        };
        (acc * *scale)?.to_dtype(DType::F32)
    }
}

/// Posit weights and activations with naive or quire GEMMs.
pub struct PositGemm {
    layers: HashMap<String, Layer>,
    format: Format,
    acc: Accumulation,
    /// What values are held in (see [`held_dtype`]).
    dtype: DType,
}

/// The dtype `format`'s values are held in on `device`: f32 where the CUDA GEMMs take the
/// format (their operands are f32, and every value of those formats is one), else f64.
#[cfg(feature = "cuda")]
fn held_dtype(format: &Format, device: &Device) -> DType {
    if device.is_cuda() && crate::quire::gemm_cuda::supported(format).is_some() {
        DType::F32
    } else {
        DType::F64
    }
}

/// The dtype `format`'s values are held in: f64 (no device GEMMs without CUDA support).
#[cfg(not(feature = "cuda"))]
fn held_dtype(_format: &Format, _device: &Device) -> DType {
    DType::F64
}

impl PositGemm {
    /// `weights` rounded to `format`, layers computed with accumulation `acc`, on the
    /// weights' device.
    pub fn new(weights: &Weights, format: Format, acc: Accumulation) -> Result<Self> {
        acc.check(&format)?;
        let quant = Quant::new(format);
        let dtype = held_dtype(&format, &weights.device());
        Ok(PositGemm {
            // Rounded in f64 (a quantized model's values may have more bits than an f32),
            // then held in `dtype`, which holds every value of the format exactly.
            layers: layers(weights, |t| {
                quantize_no_grad(&t.to_dtype(DType::F64)?, &quant)?.to_dtype(dtype)
            })?,
            format,
            acc,
            dtype,
        })
    }
}

impl Arithmetic for PositGemm {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        quantize_no_grad(&images.to_dtype(self.dtype)?, &Quant::new(self.format))
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        let l = layer(&self.layers, name)?;
        match conv {
            Some((stride, padding)) => quire::conv2d(
                x,
                &l.weight,
                Some(&l.bias),
                stride,
                padding,
                &self.format,
                self.acc,
            ),
            None => quire::linear(x, &l.weight, Some(&l.bias), &self.format, self.acc),
        }
    }
}

/// Weights and activations in a format, layers computed by the GEMM rule of an accumulate
/// setting (`naive:<A>`, `fma:<A>`, `lns:<impl>`; see the module docs).
pub struct RuleGemm {
    /// The layers' weights and biases rounded to the format, held in f32 on the host.
    layers: HashMap<String, Layer>,
    /// The rule of every layer (only the forward GEMM runs).
    arith: LayerArith,
    /// Where the inputs come from and the outputs go back to.
    device: Device,
}

impl RuleGemm {
    /// `weights` rounded to `format`, layers computed under `accumulate`; an error naming
    /// why the setting cannot apply to the format (`f32` has no rule: it is not a GEMM of
    /// [`crate::quire`]).
    pub fn new(weights: &Weights, format: Format, accumulate: Accumulate) -> Result<Self> {
        let rule = GemmRule::new(&accumulate, &format)
            .map_err(|why| candle_core::Error::Msg(format!("{format} {accumulate}: {why}")))?
            .ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "{format} {accumulate}: f32 sums are not a rule of the simulated GEMMs"
                ))
            })?;
        let arith = LayerArith {
            setting: accumulate,
            forward: rule.clone(),
            input_grad: rule.clone(),
            weight_grad: rule,
        };
        let quant = Quant::new(format);
        Ok(RuleGemm {
            // Rounded in f64 (a quantized model's values may have more bits than an f32),
            // then held in f32, which the rule rounds to the same value again.
            layers: layers(weights, |t| {
                quantize_no_grad(&t.to_dtype(DType::F64)?, &quant)?
                    .to_dtype(DType::F32)?
                    .to_device(&Device::Cpu)
            })?,
            arith,
            device: weights.device(),
        })
    }
}

impl Arithmetic for RuleGemm {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        // Each layer rounds its input to the format (padding included).
        images.to_dtype(DType::F32)
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        let l = layer(&self.layers, name)?;
        let x = x.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
        let y = match conv {
            Some((stride, padding)) => {
                let cfg = candle_nn::Conv2dConfig {
                    stride,
                    padding,
                    ..Default::default()
                };
                quire::rule_conv2d(&x, &l.weight, Some(&l.bias), &cfg, &self.arith)?
            }
            None => quire::rule_linear(&x, &l.weight, Some(&l.bias), &self.arith)?,
        };
        y.to_device(&self.device)
    }
}

/// Block-scaled weights and layer inputs (MX, NVFP4), f32 products and sums.
pub struct BlockScaled {
    layers: HashMap<String, Layer>,
    /// The rounding of every layer's input (the format blocked along axis 1).
    quant: Quant,
}

impl BlockScaled {
    /// `weights` rounded to the block-scaled `format` along their input channels (unless
    /// they are already stored in `format`), on the weights' device.
    pub fn new(weights: &Weights, format: Format) -> Result<Self> {
        let along = super::block_file::along_inputs(&format)
            .map_err(|e| candle_core::Error::Msg(format!("{e:#}")))?;
        let quant = Quant::new(along);
        let stored = weights.format == Some(format);
        let layers = layers(weights, |t| {
            if stored || t.rank() < 2 {
                t.to_dtype(DType::F32)
            } else {
                quantize_no_grad(&t.to_dtype(DType::F64)?, &quant)?.to_dtype(DType::F32)
            }
        })?;
        Ok(BlockScaled { layers, quant })
    }
}

impl Arithmetic for BlockScaled {
    fn input(&self, images: &Tensor) -> Result<Tensor> {
        images.to_dtype(DType::F32)
    }
    fn layer(&self, name: &str, conv: Option<(usize, usize)>, x: &Tensor) -> Result<Tensor> {
        let x = quantize_no_grad(&x.to_dtype(DType::F32)?, &self.quant)?;
        float_layer(layer(&self.layers, name)?, conv, &x)
    }
}

/// Pads the last two dimensions of `x` by `pad` with `value`.
fn pad_with(x: &Tensor, pad: usize, value: f64) -> Result<Tensor> {
    let (n, c, h, w) = x.dims4()?;
    let rows = (Tensor::ones((n, c, pad, w), x.dtype(), x.device())? * value)?;
    let x = Tensor::cat(&[&rows, x, &rows], 2)?;
    let cols = (Tensor::ones((n, c, h + 2 * pad, pad), x.dtype(), x.device())? * value)?;
    Tensor::cat(&[&cols, &x, &cols], 3)
}

/// Runs `model`'s plan on `images` in `arith`, calling `inspect(layer, input)` before
/// every convolution or linear layer. Returns the logits.
pub fn run_plan(
    model: crate::nn::ModelKind,
    arith: &dyn Arithmetic,
    images: &Tensor,
    mut inspect: impl FnMut(&str, &Tensor) -> Result<()>,
) -> Result<Tensor> {
    let mut x = arith.input(images)?;
    for stage in model.plan() {
        x = match stage {
            Stage::Pad { pad, value } => pad_with(&x, pad, value as f64)?,
            Stage::Conv {
                name,
                stride,
                padding,
                ..
            } => {
                inspect(&name, &x)?;
                arith.layer(&name, Some((stride, padding)), &x)?
            }
            Stage::Linear { name, .. } => {
                inspect(&name, &x)?;
                arith.layer(&name, None, &x)?
            }
            Stage::Relu => x.relu()?,
            Stage::MaxPool(k) => crate::ops::max_pool2d(&x, k, k)?,
            Stage::Flatten => x.flatten_from(1)?,
            // In f32, their outputs not rounded: only the layers use the arithmetic under test.
            Stage::Tanh { .. } => x.tanh()?,
            Stage::AvgPool { kernel, .. } => x.avg_pool2d(kernel)?,
        };
    }
    Ok(x)
}
