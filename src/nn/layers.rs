//! Quantized layers: the f32 layer between rounding steps.
//!
//! A quantized layer computes `y = Q_act(f(x; Q_w(W), Q_w(b)))` in forward and rounds the
//! incoming gradient `dL/dy` with `Q_err` in backward before it flows into `f`'s backward.
//! `Q_w` uses the straight-through estimator (the gradient w.r.t. `W` is the gradient
//! w.r.t. `Q_w(W)`), so the optimizer sees an f32 gradient that it rounds with the
//! config's gradient category.
//!
//! ReLU and max-pooling map values on a grid to values on the same grid, and route (do
//! not change) gradients, so one quantizer after each linear or convolution layer rounds
//! every activation and every error of the network.
//!
//! With an `accumulate` setting other than `f32` ([`crate::quire::accumulate`]),
//! `QLinear` and `QConv2d` compute `f` itself in the simulated arithmetic: the forward GEMM
//! in the activation format, the input-gradient GEMM in the error format and the weight and
//! bias gradients in the gradient format ([`crate::quire::rule_linear`],
//! [`crate::quire::rule_conv2d`]). The quantizers stay where they are: `Q_w` before the
//! GEMM, `Q_act` after it (on values already on its grid), `Q_err` on the incoming gradient
//! before the backward GEMMs; a fused ReLU follows the GEMM as a separate step.
//!
//! The layers keep the variable names of candle-nn's (`name.weight`, `name.bias`), so a
//! model trained with them loads into a plain candle model and back.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};

use crate::nn::config::{Category, QConfig};
use crate::ops::{quantize, Quant, Quantizer};
use crate::quire::LayerArith;

/// The activation (forward) and error (backward) quantizer of layer `name`, or `None` if
/// both categories are off.
pub fn output_quantizer(config: &QConfig, name: &str) -> Option<Quantizer> {
    let forward = config.quant(name, Category::Activation);
    let backward = config.quant(name, Category::Error);
    (forward.is_some() || backward.is_some()).then(|| Quantizer::new(forward, backward))
}

/// The quantizers of a weight and an output quantizer, for resetting their streams.
fn collect_quants(weight: Option<&Quant>, output: Option<&Quantizer>) -> Vec<Quant> {
    let mut quants: Vec<Quant> = weight.into_iter().cloned().collect();
    if let Some(o) = output {
        quants.extend(o.forward_quant().cloned());
        quants.extend(o.backward_quant().cloned());
    }
    quants
}

fn round_weight(t: &Tensor, q: Option<&Quant>) -> Result<Tensor> {
    match q {
        Some(q) => quantize(t, q),
        None => Ok(t.clone()),
    }
}

fn round_output(y: Tensor, q: Option<&Quantizer>) -> Result<Tensor> {
    match q {
        Some(q) => q.forward(&y),
        None => Ok(y),
    }
}

/// What `QLinear` and `QConv2d` share: the variables, their weight rounding and the
/// layer's output quantizer.
#[derive(Debug, Clone)]
struct LayerParams {
    weight: Tensor,
    bias: Option<Tensor>,
    weight_quant: Option<Quant>,
    output: Option<Quantizer>,
    /// The rules of the layer's GEMMs; `None` for `accumulate = "f32"`.
    arith: Option<LayerArith>,
    name: String,
}

impl LayerParams {
    fn new(name: String, weight: &Tensor, bias: Option<&Tensor>, config: &QConfig) -> Result<Self> {
        let format = |c: Category| config.layer(&name).get(c).map(|s| s.format);
        let arith = LayerArith::new(
            &config.accumulate(&name),
            format(Category::Activation),
            format(Category::Error),
            format(Category::Gradient),
        )
        .map_err(|e| candle_core::Error::Msg(format!("layer {name}: {e}")))?;
        Ok(LayerParams {
            weight: weight.clone(),
            bias: bias.cloned(),
            weight_quant: config.quant(&name, Category::Weight),
            output: output_quantizer(config, &name),
            arith,
            name,
        })
    }

    /// The weight and bias as the layer uses them: rounded, straight-through.
    fn rounded(&self) -> Result<(Tensor, Option<Tensor>)> {
        let q = self.weight_quant.as_ref();
        let b = self.bias.as_ref().map(|b| round_weight(b, q)).transpose()?;
        Ok((round_weight(&self.weight, q)?, b))
    }

    fn quants(&self) -> Vec<Quant> {
        collect_quants(self.weight_quant.as_ref(), self.output.as_ref())
    }
}

/// A fully connected layer `y = x Wᵀ + b` with quantized weight, output and error.
#[derive(Debug, Clone)]
pub struct QLinear {
    params: LayerParams,
}

impl QLinear {
    /// A layer with variables `weight` (out, in) and `bias` (out) under `vb`'s prefix,
    /// initialised as candle-nn's `linear` does; the prefix is the layer name.
    pub fn new(in_dim: usize, out_dim: usize, vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let name = vb.prefix();
        let linear = candle_nn::linear(in_dim, out_dim, vb)?;
        Ok(QLinear {
            params: LayerParams::new(name, linear.weight(), linear.bias(), config)?,
        })
    }

    /// The layer name (its variables' prefix).
    pub fn name(&self) -> &str {
        &self.params.name
    }

    /// The full-precision weight variable.
    pub fn weight(&self) -> &Tensor {
        &self.params.weight
    }

    /// The layer's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        self.params.quants()
    }
}

impl Module for QLinear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = self.params.rounded()?;
        let y = match &self.params.arith {
            Some(arith) => crate::quire::rule_linear(x, &w, b.as_ref(), arith)?,
            None => candle_nn::Linear::new(w, b).forward(x)?,
        };
        round_output(y, self.params.output.as_ref())
    }
}

/// A 2-D convolution with quantized weight, output and error.
#[derive(Debug, Clone)]
pub struct QConv2d {
    params: LayerParams,
    config: Conv2dConfig,
    relu: bool,
}

impl QConv2d {
    /// A convolution with variables `weight` (out, in, k, k) and `bias` (out) under `vb`'s
    /// prefix, initialised as candle-nn's `conv2d` does.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        conv: Conv2dConfig,
        vb: VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        let name = vb.prefix();
        let layer = candle_nn::conv2d(in_channels, out_channels, kernel, conv, vb)?;
        Ok(QConv2d {
            params: LayerParams::new(name, layer.weight(), layer.bias(), config)?,
            config: conv,
            relu: false,
        })
    }

    /// The same layer followed by a ReLU, fused into the convolution op
    /// ([`crate::ops::conv2d_relu`]): the output is `Q_act(relu(conv(x)))`, which equals
    /// `relu(Q_act(conv(x)))` because rounding keeps signs and zero.
    pub fn with_relu(mut self) -> Self {
        self.relu = true;
        self
    }

    /// The layer name (its variables' prefix).
    pub fn name(&self) -> &str {
        &self.params.name
    }

    /// The full-precision weight variable.
    pub fn weight(&self) -> &Tensor {
        &self.params.weight
    }

    /// The layer's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        self.params.quants()
    }
}

impl Module for QConv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (w, b) = self.params.rounded()?;
        if let Some(arith) = &self.params.arith {
            let y = crate::quire::rule_conv2d(x, &w, b.as_ref(), &self.config, arith)?;
            let y = if self.relu { y.relu()? } else { y };
            return round_output(y, self.params.output.as_ref());
        }
        // The output quantizer runs inside the convolution op (same streams and calls).
        let quantizer = self.params.output.as_ref();
        crate::ops::conv2d_quantized(x, &w, b.as_ref(), &self.config, self.relu, quantizer)
    }
}

/// Any candle module followed by its layer's activation/error quantizer.
///
/// The wrapper cannot see inside the module, so its weights are not rounded in forward:
/// they are kept on the weight grid by rounding the variables in place
/// ([`round_vars_in_place`]) at initialisation and by the low-precision optimizers after
/// every step.
#[derive(Debug, Clone)]
pub struct QWrap<M> {
    inner: M,
    output: Option<Quantizer>,
    name: String,
}

impl<M: Module> QWrap<M> {
    /// Wraps `inner` as layer `name`.
    pub fn new(name: &str, inner: M, config: &QConfig) -> Self {
        QWrap {
            inner,
            output: output_quantizer(config, name),
            name: name.to_string(),
        }
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The wrapped module.
    pub fn inner(&self) -> &M {
        &self.inner
    }

    /// The layer's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        collect_quants(None, self.output.as_ref())
    }
}

impl<M: Module> Module for QWrap<M> {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        round_output(self.inner.forward(x)?, self.output.as_ref())
    }
}

/// Layers applied in order with a quantizer after each named one (QPyTorch's automatic
/// quantizer insertion); unnamed steps (ReLU, pooling, reshapes) are applied as they are.
#[derive(Default)]
pub struct QSequential {
    steps: Vec<(Option<String>, Box<dyn Module + Send + Sync>)>,
    config: QConfig,
}

impl QSequential {
    /// An empty sequence whose quantizers follow `config`.
    pub fn new(config: &QConfig) -> Self {
        QSequential {
            steps: Vec::new(),
            config: config.clone(),
        }
    }

    /// Appends layer `name`, followed by its activation/error quantizer.
    pub fn layer<M: Module + Send + Sync + 'static>(mut self, name: &str, module: M) -> Self {
        let wrapped = QWrap::new(name, module, &self.config);
        self.steps.push((Some(name.to_string()), Box::new(wrapped)));
        self
    }

    /// Appends a step with no quantizer (its outputs are already on the grid).
    pub fn step<M: Module + Send + Sync + 'static>(mut self, module: M) -> Self {
        self.steps.push((None, Box::new(module)));
        self
    }

    /// Builds a sequence from `(name, module)` pairs, a quantizer after each.
    pub fn from_layers(
        config: &QConfig,
        layers: Vec<(String, Box<dyn Module + Send + Sync>)>,
    ) -> Self {
        let mut seq = QSequential::new(config);
        for (name, module) in layers {
            seq = seq.layer(&name, BoxedModule(module));
        }
        seq
    }

    /// The names of the quantized layers, in order.
    pub fn layer_names(&self) -> Vec<&str> {
        self.steps
            .iter()
            .filter_map(|(n, _)| n.as_deref())
            .collect()
    }
}

impl Module for QSequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for (_, step) in &self.steps {
            x = step.forward(&x)?;
        }
        Ok(x)
    }
}

struct BoxedModule(Box<dyn Module + Send + Sync>);

impl Module for BoxedModule {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// Rounds every variable of `varmap` to its layer's weight format, in place, so a model
/// starts on the grid it will be trained on.
pub fn round_vars_in_place(varmap: &candle_nn::VarMap, config: &QConfig) -> Result<()> {
    let vars = varmap
        .data()
        .lock()
        .map_err(|_| candle_core::Error::Msg("poisoned var map".into()))?;
    for (name, var) in vars.iter() {
        if let Some(q) = config.param_quant(name).weight {
            crate::ops::quantize_(var.as_tensor(), &q)?;
        }
    }
    Ok(())
}
