//! Weight-only quantization of any candle model, by changing the line that makes its
//! `VarBuilder`.
//!
//! [`quantized_var_builder`] wraps a `VarBuilder` (safetensors files, a `VarMap`, tensors in
//! memory) in a backend that rounds every tensor as it is read: the variable `name` is
//! rounded to the `weight` category of its layer (the name up to the last dot, as
//! [`QConfig::param_quant`] resolves it, so `[[layer]]` patterns apply; `"none"` leaves a
//! layer in full precision). Tensors of a layer without a weight format, and integer
//! tensors, are passed through unchanged. The model built from it computes in f32 on rounded
//! weights: post-training, weight-only quantization of a pretrained model with one changed
//! line:
//!
//! ```
//! use candle_core::{DType, Device, Module, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use qcandle::nn::{quantized_var_builder, QConfig};
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let _ = candle_nn::linear(4, 2, vb.pp("fc"))?; // stands for the pretrained weights
//! let config = QConfig::load("posit<8,0>")?;
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let layer = candle_nn::linear(4, 2, quantized_var_builder(vb, &config).pp("fc"))?;
//! let y = layer.forward(&Tensor::ones((1, 4), DType::F32, &Device::Cpu)?)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The rounded tensors are copies: a model built this way is for evaluation; training with
//! the variables of a `VarMap` uses the quantized layers instead (their weights are rounded in
//! every forward pass, and the optimizer updates the full-precision variables).

use candle_core::{DType, Device, Result, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};

use crate::nn::config::QConfig;
use crate::ops::quantize_no_grad;

/// A backend that reads from another `VarBuilder` and rounds each tensor to its layer's
/// weight format.
struct RoundingBackend<'a> {
    inner: VarBuilder<'a>,
    config: QConfig,
}

impl RoundingBackend<'_> {
    fn round(&self, name: &str, t: Tensor) -> Result<Tensor> {
        if !t.dtype().is_float() {
            return Ok(t);
        }
        match self.config.param_quant(name).weight {
            Some(q) => quantize_no_grad(&t, &q),
            None => Ok(t),
        }
    }
}

impl SimpleBackend for RoundingBackend<'_> {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let t = self.inner.get_with_hints_dtype(s, name, h, dtype)?;
        self.round(name, t.to_device(dev)?)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> Result<Tensor> {
        let t = self.inner.get_unchecked_dtype(name, dtype)?;
        self.round(name, t.to_device(dev)?)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
}

/// `inner` with every tensor rounded to its layer's weight format of `config` as it is read
/// (see the module docs). The result has `inner`'s dtype and device, and the root prefix.
pub fn quantized_var_builder<'a>(inner: VarBuilder<'a>, config: &QConfig) -> VarBuilder<'a> {
    let (dtype, device) = (inner.dtype(), inner.device().clone());
    let backend = RoundingBackend {
        inner: inner.root(),
        config: config.clone(),
    };
    let backend: Box<dyn SimpleBackend + 'a> = Box::new(backend);
    VarBuilder::from_backend(backend, dtype, device)
}
