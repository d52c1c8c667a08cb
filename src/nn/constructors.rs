//! Constructors with candle-nn's signatures and the config as one more argument, so that
//! converting a candle model to the quantized layers changes each constructor call's path
//! and appends the config: `candle_nn::linear(i, o, vb.pp("fc1"))?` becomes
//! `qcandle::nn::linear(i, o, vb.pp("fc1"), &config)?`.
//!
//! The ops without variables (attention's products, activations, residual sums) take a
//! `VarBuilder` too, for its prefix only: the prefix is the op's name, so in a block built
//! from `vb = root.pp("block0")`, `softmax_last_dim(vb.pp("softmax"), &config)` is the op
//! `block0.softmax`, named as the block's layers are and reached by the same `[[layer]]`
//! patterns. Each function is the quantized block's own constructor (see
//! [`crate::nn::blocks`] and [`crate::nn::layers`] for what each rounds).

use candle_core::Result;
use candle_nn::{Conv2dConfig, VarBuilder};

use crate::nn::blocks::{
    Activation, NormStats, QActivation, QAdd, QEmbedding, QLayerNorm, QMatMul, QRmsNorm,
};
use crate::nn::config::QConfig;
use crate::nn::layers::{QConv2d, QLinear};

/// `candle_nn::linear`: a [`QLinear`] with variables `weight` and `bias` under `vb`.
pub fn linear(in_dim: usize, out_dim: usize, vb: VarBuilder, config: &QConfig) -> Result<QLinear> {
    QLinear::new(in_dim, out_dim, vb, config)
}

/// `candle_nn::conv2d`: a [`QConv2d`] with variables `weight` and `bias` under `vb`.
pub fn conv2d(
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    cfg: Conv2dConfig,
    vb: VarBuilder,
    config: &QConfig,
) -> Result<QConv2d> {
    QConv2d::new(in_channels, out_channels, kernel_size, cfg, vb, config)
}

/// `candle_nn::embedding`: a [`QEmbedding`] of `in_size` rows of width `out_size`.
pub fn embedding(
    in_size: usize,
    out_size: usize,
    vb: VarBuilder,
    config: &QConfig,
) -> Result<QEmbedding> {
    QEmbedding::new(in_size, out_size, vb, config)
}

/// `candle_nn::layer_norm` with a gain and a bias: a [`QLayerNorm`] with its statistics in
/// f32 ([`NormStats::F32`]).
pub fn layer_norm(size: usize, eps: f64, vb: VarBuilder, config: &QConfig) -> Result<QLayerNorm> {
    QLayerNorm::new(size, eps, NormStats::F32, vb, config)
}

/// `candle_nn::rms_norm`: a [`QRmsNorm`] with its statistics in f32 ([`NormStats::F32`]).
pub fn rms_norm(size: usize, eps: f64, vb: VarBuilder, config: &QConfig) -> Result<QRmsNorm> {
    QRmsNorm::new(size, eps, NormStats::F32, vb, config)
}

/// The batched product `a.matmul(&b)` as a [`QMatMul`] named by `vb`'s prefix.
pub fn matmul(vb: VarBuilder, config: &QConfig) -> Result<QMatMul> {
    QMatMul::new(&vb.prefix(), config)
}

/// `candle_nn::ops::softmax_last_dim` as a [`QActivation`] named by `vb`'s prefix.
pub fn softmax_last_dim(vb: VarBuilder, config: &QConfig) -> QActivation {
    activation(Activation::Softmax, vb, config)
}

/// `Tensor::gelu_erf` as a [`QActivation`] named by `vb`'s prefix.
pub fn gelu_erf(vb: VarBuilder, config: &QConfig) -> QActivation {
    activation(Activation::Gelu, vb, config)
}

/// `function` as a [`QActivation`] named by `vb`'s prefix.
pub fn activation(function: Activation, vb: VarBuilder, config: &QConfig) -> QActivation {
    QActivation::new(&vb.prefix(), function, config)
}

/// A sum `a + b` (a residual connection) as a [`QAdd`] named by `vb`'s prefix.
pub fn add(vb: VarBuilder, config: &QConfig) -> QAdd {
    QAdd::new(&vb.prefix(), config)
}
