//! Quantized building blocks beyond linear and convolution layers: embeddings, layer and RMS
//! normalisation, the batched matmul of attention, average pooling and smooth activations.
//!
//! Each block follows the category rules of [`QLinear`](crate::nn::QLinear): its parameters
//! are rounded to the layer's `weight` format in forward (straight-through, so the optimizer
//! sees the f32 gradient and rounds it with the `gradient` category), its output is rounded
//! to the `activation` format, and the gradient w.r.t. its output (the error) is rounded to
//! the `error` format before it flows into the block's backward. The quantizers are looked
//! up by the block's name, so `[[layer]]` patterns in a config reach them like any layer.
//!
//! - [`QEmbedding`]: `y = Q_act(Q_w(E)[ids])`. The gathered rows are already on the weight
//!   grid; the output rounding matters when the activation format is narrower.
//! - [`QLayerNorm`]: `y = Q_act((x - μ) / sqrt(σ² + ε) · Q_w(γ) + Q_w(β))` with
//!   `μ = mean(x)`, `σ² = mean((x - μ)²)` over the last dimension; [`QRmsNorm`]:
//!   `y = Q_act(x / sqrt(mean(x²) + ε) · Q_w(γ))`. [`NormStats`] says how the statistics are
//!   computed: in f32 (the default, as fused normalisation kernels keep them), or with every
//!   intermediate of the statistics (`μ`, `x - μ`, `σ²`, `sqrt(σ² + ε)`) rounded to the
//!   activation format, as hardware without a wider register would. The rounded
//!   intermediates are straight-through in backward.
//! - [`QMatMul`]: `y = Q_act(Q_act(a) · Q_act(b))`, batched over the leading dimensions, the
//!   error rounded before the product's backward and again before it reaches each operand.
//!   The products are summed in f32, or, with an `accumulate` setting other than `f32`, in
//!   the layer's simulated arithmetic as a linear layer's GEMMs are: the product in the
//!   activation format, both operand gradients in the error format
//!   ([`crate::quire::rule_matmul`]).
//! - [`QAvgPool2d`]: `y = Q_act(avg_pool(x))`; the mean of values on a grid is off it, so
//!   unlike max-pooling the pool needs its own quantizer.
//! - [`QAdd`]: `y = Q_act(a + b)` (broadcasting), a residual connection: the sum of two
//!   values on a grid is off it.
//! - [`QActivation`]: `y = Q_act(f(x))` for TanH, GELU (erf and tanh forms), SiLU, sigmoid
//!   and softmax over the last dimension; `f` maps grid values off the grid, so each needs
//!   its quantizer (ReLU and max-pooling do not, see [`crate::nn::layers`]).
//!
//! The forward computations are candle-nn's own (`Embedding`, `layer_norm_slow`,
//! `rms_norm_slow`, `softmax`, ...) with the rounding steps added, so with nothing rounded a
//! block gives candle-nn's bits. Variables keep candle-nn's names (`name.weight`,
//! `name.bias`).

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use crate::nn::config::{Category, QConfig};
use crate::nn::layers::output_quantizer;
use crate::ops::{quantize, Quant, Quantizer};
use crate::quire::{rule_matmul, MatMulArith};

/// Rounds `t` to `q` (straight-through) when a format is set.
fn round(t: &Tensor, q: Option<&Quant>) -> Result<Tensor> {
    match q {
        Some(q) => quantize(t, q),
        None => Ok(t.clone()),
    }
}

/// Applies the output quantizer (activation forward, error backward) when one is set.
fn round_output(y: Tensor, q: Option<&Quantizer>) -> Result<Tensor> {
    match q {
        Some(q) => q.forward(&y),
        None => Ok(y),
    }
}

/// The weight quantizer and the output quantizer of a block, cloned for stream placement.
fn block_quants(
    weight: Option<&Quant>,
    extra: Option<&Quant>,
    out: Option<&Quantizer>,
) -> Vec<Quant> {
    let mut quants: Vec<Quant> = weight.into_iter().chain(extra).cloned().collect();
    if let Some(o) = out {
        quants.extend(o.forward_quant().cloned());
        quants.extend(o.backward_quant().cloned());
    }
    quants
}

/// A lookup table of `vocab` rows of width `dim`, with quantized weight, output and error.
#[derive(Debug, Clone)]
pub struct QEmbedding {
    weight: Tensor,
    vocab: usize,
    dim: usize,
    weight_quant: Option<Quant>,
    output: Option<Quantizer>,
    name: String,
}

impl QEmbedding {
    /// An embedding with variable `weight` (vocab, dim) under `vb`'s prefix (the layer name),
    /// initialised as candle-nn's `embedding` does.
    pub fn new(vocab: usize, dim: usize, vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let name = vb.prefix();
        let inner = candle_nn::embedding(vocab, dim, vb)?;
        Ok(QEmbedding {
            weight: inner.embeddings().clone(),
            vocab,
            dim,
            weight_quant: config.quant(&name, Category::Weight),
            output: output_quantizer(config, &name),
            name,
        })
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The full-precision table.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The block's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        block_quants(self.weight_quant.as_ref(), None, self.output.as_ref())
    }
}

impl Module for QEmbedding {
    /// Rows of the table for integer ids of any shape: `(..) -> (.., dim)`. Float ids and
    /// ids outside `0..vocab` are an error.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if !matches!(ids.dtype(), DType::U8 | DType::U32 | DType::I64) {
            candle_core::bail!(
                "embedding {}: ids must be integers (u8, u32 or i64), got {:?}",
                self.name,
                ids.dtype()
            );
        }
        if ids.elem_count() > 0 {
            let max = ids.flatten_all()?.to_dtype(DType::F64)?.max(0)?;
            let max = max.to_scalar::<f64>()?;
            let min = ids.flatten_all()?.to_dtype(DType::F64)?.min(0)?;
            let min = min.to_scalar::<f64>()?;
            if min < 0.0 || max >= self.vocab as f64 {
                candle_core::bail!(
                    "embedding {}: ids must lie in 0..{}, got ids from {min} to {max}",
                    self.name,
                    self.vocab
                );
            }
        }
        let table = round(&self.weight, self.weight_quant.as_ref())?;
        let y = candle_nn::Embedding::new(table, self.dim).forward(ids)?;
        round_output(y, self.output.as_ref())
    }
}

/// How a normalisation layer computes its statistics (mean, variance, root mean square).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NormStats {
    /// In f32, unrounded: only the layer's output is rounded.
    #[default]
    F32,
    /// Every intermediate of the statistics rounded to the layer's activation format.
    Rounded,
}

/// Mixed into the activation stream's seed for the statistics' stream.
const STATS_STREAM: u64 = 0x5354_4154_5321_0001;

/// What layer and RMS normalisation share.
#[derive(Debug, Clone)]
struct Norm {
    weight: Tensor,
    bias: Option<Tensor>,
    eps: f64,
    remove_mean: bool,
    stats: NormStats,
    weight_quant: Option<Quant>,
    stats_quant: Option<Quant>,
    output: Option<Quantizer>,
    name: String,
}

impl Norm {
    fn new(
        dim: usize,
        eps: f64,
        remove_mean: bool,
        stats: NormStats,
        vb: VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        if dim == 0 || !(eps > 0.0 && eps.is_finite()) {
            candle_core::bail!(
                "normalisation {}: needs a width >= 1 and a finite eps > 0, got {dim} and {eps}",
                vb.prefix()
            );
        }
        let name = vb.prefix();
        let (weight, bias) = if remove_mean {
            let ln = candle_nn::layer_norm(dim, eps, vb)?;
            (ln.weight().clone(), ln.bias().cloned())
        } else {
            let rms = candle_nn::rms_norm(dim, eps, vb)?;
            (rms.into_inner().weight().clone(), None)
        };
        // The activation format, on a stream of its own (the statistics draw other bits
        // than the output).
        let stats_quant = match stats {
            NormStats::F32 => None,
            NormStats::Rounded => config
                .quant(&name, Category::Activation)
                .map(|q| q.clone().with_seed(q.seed() ^ STATS_STREAM)),
        };
        Ok(Norm {
            weight,
            bias,
            eps,
            remove_mean,
            stats,
            weight_quant: config.quant(&name, Category::Weight),
            stats_quant,
            output: output_quantizer(config, &name),
            name,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let width = self.weight.dim(0)?;
        if x.rank() == 0 || x.dim(D::Minus1)? != width {
            candle_core::bail!(
                "normalisation {}: the last dimension must be {width}, got shape {:?}",
                self.name,
                x.dims()
            );
        }
        let s = self.stats_quant.as_ref();
        let hidden = width as f64;
        // candle-nn's layer_norm_slow / rms_norm_slow, with the statistics' rounding steps.
        let x = if self.remove_mean {
            let mean = round(&(x.sum_keepdim(D::Minus1)? / hidden)?, s)?;
            round(&x.broadcast_sub(&mean)?, s)?
        } else {
            x.clone()
        };
        let var = round(&(x.sqr()?.sum_keepdim(D::Minus1)? / hidden)?, s)?;
        let std = round(&(var + self.eps)?.sqrt()?, s)?;
        let normed = x.broadcast_div(&std)?;
        let w = self.weight_quant.as_ref();
        let y = normed.broadcast_mul(&round(&self.weight, w)?)?;
        let y = match &self.bias {
            Some(b) => y.broadcast_add(&round(b, w)?)?,
            None => y,
        };
        round_output(y, self.output.as_ref())
    }

    fn quants(&self) -> Vec<Quant> {
        block_quants(
            self.weight_quant.as_ref(),
            self.stats_quant.as_ref(),
            self.output.as_ref(),
        )
    }
}

/// Layer normalisation over the last dimension with a gain and a bias (see the module docs).
#[derive(Debug, Clone)]
pub struct QLayerNorm(Norm);

impl QLayerNorm {
    /// A layer norm of width `dim` with variables `weight` (gain, 1 at start) and `bias`
    /// (0 at start) under `vb`'s prefix, statistics computed per `stats`.
    pub fn new(
        dim: usize,
        eps: f64,
        stats: NormStats,
        vb: VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        Norm::new(dim, eps, true, stats, vb, config).map(QLayerNorm)
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// How the statistics are computed.
    pub fn stats(&self) -> NormStats {
        self.0.stats
    }

    /// The block's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        self.0.quants()
    }
}

impl Module for QLayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// RMS normalisation over the last dimension with a gain (see the module docs).
#[derive(Debug, Clone)]
pub struct QRmsNorm(Norm);

impl QRmsNorm {
    /// An RMS norm of width `dim` with variable `weight` (gain, 1 at start) under `vb`'s
    /// prefix, statistics computed per `stats`.
    pub fn new(
        dim: usize,
        eps: f64,
        stats: NormStats,
        vb: VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        Norm::new(dim, eps, false, stats, vb, config).map(QRmsNorm)
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// How the statistics are computed.
    pub fn stats(&self) -> NormStats {
        self.0.stats
    }

    /// The block's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        self.0.quants()
    }
}

impl Module for QRmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// The batched matrix product of attention with rounded operands, product and errors.
#[derive(Debug, Clone)]
pub struct QMatMul {
    quantizer: Option<Quantizer>,
    /// The rules of the product's GEMMs; `None` for `accumulate = "f32"`.
    arith: Option<MatMulArith>,
    name: String,
}

impl QMatMul {
    /// The product named `name`: its operands and result are rounded with that layer's
    /// activation format, their errors with its error format, and the products computed
    /// per its `accumulate` setting. A setting the formats cannot take is an error.
    pub fn new(name: &str, config: &QConfig) -> Result<Self> {
        let format = |c: Category| config.layer(name).get(c).map(|s| s.format);
        let arith = MatMulArith::new(
            &config.accumulate(name),
            format(Category::Activation),
            format(Category::Error),
        )
        .map_err(|e| candle_core::Error::Msg(format!("matmul {name}: {e}")))?;
        Ok(QMatMul {
            quantizer: output_quantizer(config, name),
            arith,
            name: name.to_string(),
        })
    }

    /// The op's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `Q(Q(a) · Q(b))` for `a` (.., m, k) and `b` (.., k, n) with equal leading dimensions.
    pub fn forward(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (da, db) = (a.dims(), b.dims());
        if !crate::quire::layer_matmul::matmul_shapes_agree(da, db) {
            candle_core::bail!(
                "matmul {}: needs (.., m, k) and (.., k, n) with equal leading dimensions, got \
                 {da:?} and {db:?}",
                self.name
            );
        }
        let q = self.quantizer.as_ref();
        let a = round_output(a.clone(), q)?;
        let b = round_output(b.clone(), q)?;
        let y = match &self.arith {
            Some(arith) => rule_matmul(&a, &b, arith)?,
            None => a.contiguous()?.matmul(&b.contiguous()?)?,
        };
        round_output(y, q)
    }

    /// The op's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        block_quants(None, None, self.quantizer.as_ref())
    }
}

/// Average pooling over square windows with a rounded output and error.
#[derive(Debug, Clone)]
pub struct QAvgPool2d {
    kernel: usize,
    stride: usize,
    output: Option<Quantizer>,
    name: String,
}

impl QAvgPool2d {
    /// A `kernel` x `kernel` mean with step `stride`, named `name`.
    pub fn new(name: &str, kernel: usize, stride: usize, config: &QConfig) -> Result<Self> {
        if kernel == 0 || stride == 0 {
            candle_core::bail!("avg-pool {name}: kernel and stride must be >= 1");
        }
        Ok(QAvgPool2d {
            kernel,
            stride,
            output: output_quantizer(config, name),
            name: name.to_string(),
        })
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The block's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        block_quants(None, None, self.output.as_ref())
    }
}

impl Module for QAvgPool2d {
    /// `(N, C, H, W) -> (N, C, (H - k) / s + 1, (W - k) / s + 1)`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match x.dims() {
            [_, _, h, w] if *h >= self.kernel && *w >= self.kernel => {}
            dims => candle_core::bail!(
                "avg-pool {}: needs (N, C, H, W) with H and W >= {}, got {dims:?}",
                self.name,
                self.kernel
            ),
        }
        let y = x.avg_pool2d_with_stride(self.kernel, self.stride)?;
        round_output(y, self.output.as_ref())
    }
}

/// A sum of two tensors (a residual connection) with a rounded output and error.
#[derive(Debug, Clone)]
pub struct QAdd {
    output: Option<Quantizer>,
    name: String,
}

impl QAdd {
    /// The sum named `name`: its result is rounded to that layer's activation format and
    /// its error to the error format.
    pub fn new(name: &str, config: &QConfig) -> Self {
        QAdd {
            output: output_quantizer(config, name),
            name: name.to_string(),
        }
    }

    /// The op's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `Q(a + b)`, broadcasting as candle's `broadcast_add` does (the same bits as `a + b`
    /// when the shapes agree); shapes that do not broadcast are an error.
    pub fn forward(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let y = a.broadcast_add(b).map_err(|e| {
            candle_core::Error::Msg(format!(
                "add {}: the shapes {:?} and {:?} do not broadcast ({e})",
                self.name,
                a.dims(),
                b.dims()
            ))
        })?;
        round_output(y, self.output.as_ref())
    }

    /// The op's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        block_quants(None, None, self.output.as_ref())
    }
}

/// The smooth activation functions of [`QActivation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// Hyperbolic tangent.
    Tanh,
    /// GELU, `x Φ(x)` with the error function (candle-nn's `Activation::Gelu`).
    Gelu,
    /// GELU's tanh approximation (candle-nn's `Activation::NewGelu`).
    GeluTanh,
    /// SiLU (swish), `x σ(x)`.
    Silu,
    /// The logistic sigmoid.
    Sigmoid,
    /// Softmax over the last dimension.
    Softmax,
}

impl Activation {
    /// `f(x)` in f32, as candle and candle-nn compute it.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Tanh => x.tanh(),
            Activation::Gelu => x.gelu_erf(),
            Activation::GeluTanh => x.gelu(),
            Activation::Silu => x.silu(),
            Activation::Sigmoid => candle_nn::ops::sigmoid(x),
            Activation::Softmax => candle_nn::ops::softmax(x, D::Minus1),
        }
    }
}

/// An activation function with a rounded output and error.
#[derive(Debug, Clone)]
pub struct QActivation {
    function: Activation,
    output: Option<Quantizer>,
    name: String,
}

impl QActivation {
    /// `function` as layer `name`.
    pub fn new(name: &str, function: Activation, config: &QConfig) -> Self {
        QActivation {
            function,
            output: output_quantizer(config, name),
            name: name.to_string(),
        }
    }

    /// The layer name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The function.
    pub fn function(&self) -> Activation {
        self.function
    }

    /// The block's quantizers (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        block_quants(None, None, self.output.as_ref())
    }
}

impl Module for QActivation {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.function == Activation::Softmax && x.rank() == 0 {
            candle_core::bail!("softmax {}: needs at least one dimension", self.name);
        }
        round_output(self.function.apply(x)?, self.output.as_ref())
    }
}
