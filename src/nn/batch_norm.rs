//! Batch normalisation over channels (N, C, H, W) with quantized weight, output, error and
//! running statistics.
//!
//! In training, each channel is normalised by the batch's statistics over (N, H, W):
//! `y = Q_act((x - μ_B) / sqrt(σ²_B + ε) · Q_w(γ) + Q_w(β))`, the error rounded with `Q_err`
//! before the backward pass, and the running statistics move towards the batch's,
//! `r ← (1 - m) r + m s` (the variance unbiased by `n / (n - 1)`), as candle-nn's
//! `BatchNorm` does. The running statistics are state that persists across steps, like an
//! optimizer's moments, so after every update they are rounded in place to the layer's
//! `momentum` category (not rounded when it is off). In evaluation the running statistics
//! replace the batch's. The batch statistics themselves are computed in f32. The running
//! statistics are updated in place, so they must be variables (a `VarBuilder` over a
//! `VarMap`); tensors read from a file are not updated (only rounded).
//!
//! The computation is candle-nn's `BatchNorm` on the rounded weight and bias, so the
//! variables keep its names (`name.weight`, `name.bias`, `name.running_mean`,
//! `name.running_var`).

use candle_core::{ModuleT, Result, Tensor};
use candle_nn::{BatchNormConfig, VarBuilder};

use crate::nn::config::{Category, QConfig};
use crate::nn::layers::output_quantizer;
use crate::ops::{quantize, quantize_, Quant, Quantizer};

/// 2-D batch normalisation with rounded weight, output, error and running statistics.
#[derive(Debug, Clone)]
pub struct QBatchNorm2d {
    channels: usize,
    weight: Tensor,
    bias: Tensor,
    running_mean: Tensor,
    running_var: Tensor,
    eps: f64,
    momentum: f64,
    weight_quant: Option<Quant>,
    state_quant: Option<Quant>,
    output: Option<Quantizer>,
    name: String,
}

impl QBatchNorm2d {
    /// A batch norm of `channels` with variables `weight` (1), `bias` (0), `running_mean` (0)
    /// and `running_var` (1) under `vb`'s prefix; `momentum` is the running statistics'
    /// update weight (candle-nn's default is 0.1).
    pub fn new(
        channels: usize,
        eps: f64,
        momentum: f64,
        vb: VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        let name = vb.prefix();
        if channels == 0 || !(eps > 0.0 && eps.is_finite()) || !(0.0..=1.0).contains(&momentum) {
            candle_core::bail!(
                "batch-norm {name}: needs channels >= 1, a finite eps > 0 and a momentum in \
                 [0, 1], got {channels}, {eps} and {momentum}"
            );
        }
        let cfg = BatchNormConfig {
            eps,
            remove_mean: true,
            affine: true,
            momentum,
        };
        let inner = candle_nn::batch_norm(channels, cfg, vb)?;
        let (weight, bias) = inner
            .weight_and_bias()
            .ok_or_else(|| candle_core::Error::Msg("an affine batch norm has weights".into()))?;
        Ok(QBatchNorm2d {
            channels,
            weight: weight.clone(),
            bias: bias.clone(),
            running_mean: inner.running_mean().clone(),
            running_var: inner.running_var().clone(),
            eps,
            momentum,
            weight_quant: config.quant(&name, Category::Weight),
            state_quant: config.quant(&name, Category::Momentum),
            output: output_quantizer(config, &name),
            name,
        })
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The running mean and variance.
    pub fn running_stats(&self) -> (&Tensor, &Tensor) {
        (&self.running_mean, &self.running_var)
    }

    /// The layer's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        let mut quants: Vec<Quant> = [&self.weight_quant, &self.state_quant]
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        if let Some(o) = &self.output {
            quants.extend(o.forward_quant().cloned());
            quants.extend(o.backward_quant().cloned());
        }
        quants
    }
}

impl ModuleT for QBatchNorm2d {
    /// Normalises `x` (N, C, H, W) with the batch's statistics (`train`, updating and
    /// rounding the running ones) or the running ones.
    fn forward_t(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        match x.dims() {
            [n, c, h, w] if *c == self.channels && (!train || n * h * w > 1) => {}
            dims => candle_core::bail!(
                "batch-norm {}: needs (N, {}, H, W) with more than one value per channel in \
                 training, got {dims:?}",
                self.name,
                self.channels
            ),
        }
        let round = |t: &Tensor| match &self.weight_quant {
            Some(q) => quantize(t, q),
            None => Ok(t.clone()),
        };
        // The running statistics are the layer's variables (shared storage), so candle-nn's
        // update lands in them.
        let inner = candle_nn::BatchNorm::new_with_momentum(
            self.channels,
            self.running_mean.clone(),
            self.running_var.clone(),
            round(&self.weight)?,
            round(&self.bias)?,
            self.eps,
            self.momentum,
        )?;
        let y = inner.forward_t(x, train)?;
        if train {
            if let Some(q) = &self.state_quant {
                quantize_(&self.running_mean, q)?;
                quantize_(&self.running_var, q)?;
            }
        }
        match &self.output {
            Some(q) => candle_core::Module::forward(q, &y),
            None => Ok(y),
        }
    }
}
