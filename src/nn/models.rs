//! A small model zoo built from the quantized layers: MLP, LeNet-5 (with ReLU and max
//! pooling, or the classic TanH and average pooling), CifarNet and a small transformer.
//!
//! Every image model takes images (N, C, H, W) scaled to [-1, 1] and returns logits (N, 10);
//! images of another shape are refused before the first layer with a message saying what
//! the model needs and what it was given ([`ModelKind::check_input`]). The input is rounded
//! with the activation format of the pseudo-layer `input` (real hardware would hold its input
//! in the format too); each linear or convolution layer rounds its output and error (see
//! [`crate::nn::layers`]).
//!
//! Each model is defined once, as its plan ([`ModelKind::plan`]): a list of [`Stage`]s with
//! the layers' names and sizes. [`ModelKind::build`] makes the layers of those stages and the
//! model's forward pass walks them in order; post-training quantization replays the same list
//! in other arithmetics. A convolution followed by a ReLU runs as one fused op
//! ([`QConv2d::with_relu`]).
//!
//! LeNet-5 follows Deep PeNSieve's network: 28x28 images padded to 32x32 with the
//! background value (-1 after scaling), conv 5x5 (6) → ReLU → max-pool 2 → conv 5x5 (16) →
//! ReLU → max-pool 2 → fc 120 → ReLU → fc 84 → ReLU → fc 10: 61,706 parameters. Without the
//! padding, fc1 sees 16·4·4 inputs instead of 16·5·5 and the count is 44,426.
//!
//! LeNet-5 classic is LeCun et al. (1998)'s activations and pooling on the same sizes, as the
//! posit literature trains it: TanH after every layer but the last, and 2x2 average pooling
//! (rounded by its own quantizer, since a mean of grid values is off the grid), 61,706
//! parameters. Its activations and pools are named `tanh1`..`tanh4` and `pool1`, `pool2`.
//!
//! The transformer ([`crate::nn::transformer`]) takes rows of 3 token ids, held as f32
//! "images" (N, 1, 1, 3) so it runs on the same datasets' plumbing (`--data modadd`), and
//! returns logits (N, 97). It is not a list of stages: its [`plan`](ModelKind::plan) is
//! empty and [`has_plan`](ModelKind::has_plan) is false, so post-training quantization
//! builds it with a config per row instead of replaying a plan (`ptq::built`, with the `cli` feature).
//!
//! CifarNet is TF-slim's CIFAR-10 network without local response normalisation and
//! dropout, with 2x2 pooling: conv 5x5 (64, same) → ReLU → max-pool 2 → conv 5x5 (64, same)
//! → ReLU → max-pool 2 → fc 384 → ReLU → fc 192 → ReLU → fc 10 on 3x32x32 images.

use std::fmt;
use std::str::FromStr;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};

use crate::nn::blocks::{Activation, QActivation, QAvgPool2d};
use crate::nn::config::{Category, QConfig};
use crate::nn::layers::{QConv2d, QLinear};
use crate::nn::transformer::{Transformer, TransformerConfig};
use crate::ops::{quantize_no_grad, Quant};

/// The models of the zoo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// 784 → 256 → 128 → 10, ReLU.
    Mlp,
    /// LeNet-5 on 28x28 images padded to 32x32 (61,706 parameters).
    Lenet5,
    /// LeNet-5 on unpadded 28x28 images (44,426 parameters).
    Lenet5Unpadded,
    /// CifarNet on 3x32x32 images.
    CifarNet,
    /// LeNet-5 with TanH and average pooling on 28x28 images padded to 32x32.
    Lenet5Classic,
    /// A 2-block pre-norm transformer (width 128, 4 heads) on 3 tokens (modular addition).
    Transformer,
}

impl ModelKind {
    /// Every image model (a plan of stages, classes 0..10), with its command-line name.
    pub const ALL: [(ModelKind, &'static str); 5] = [
        (ModelKind::Mlp, "mlp"),
        (ModelKind::Lenet5, "lenet5"),
        (ModelKind::Lenet5Unpadded, "lenet5-unpadded"),
        (ModelKind::CifarNet, "cifarnet"),
        (ModelKind::Lenet5Classic, "lenet5-classic"),
    ];

    /// The sequence models (token rows in, no plan of stages), with their command-line name.
    pub const SEQUENCE: [(ModelKind, &'static str); 1] = [(ModelKind::Transformer, "transformer")];

    /// Every model of the zoo: [`ALL`](Self::ALL), then [`SEQUENCE`](Self::SEQUENCE).
    pub fn every() -> impl Iterator<Item = (ModelKind, &'static str)> {
        ModelKind::ALL.into_iter().chain(ModelKind::SEQUENCE)
    }

    /// The input shape (C, H, W) the model expects: images, or for the transformer its 3
    /// tokens as a 1x1x3 "image".
    pub fn input_shape(self) -> (usize, usize, usize) {
        match self {
            ModelKind::CifarNet => (3, 32, 32),
            ModelKind::Transformer => (1, 1, TransformerConfig::default().seq_len),
            ModelKind::Mlp
            | ModelKind::Lenet5
            | ModelKind::Lenet5Unpadded
            | ModelKind::Lenet5Classic => (1, 28, 28),
        }
    }

    /// Whether the model is a [plan](Self::plan) of stages (every image model), which
    /// post-training quantization can replay; the transformer is not (ptq builds it per row).
    pub fn has_plan(self) -> bool {
        self != ModelKind::Transformer
    }

    /// Checks that images of shape `dims` suit the model, before any layer sees them.
    ///
    /// `dims` is one image `(C, H, W)` or a batch `(N, C, H, W)`; either way `(C, H, W)`
    /// must be [`input_shape`](Self::input_shape). The error says what the model needs and
    /// what the data has: "cifarnet needs 3x32x32 images; the data has 1x28x28".
    pub fn check_input(&self, dims: &[usize]) -> Result<()> {
        let (c, h, w) = self.input_shape();
        match dims {
            [dc, dh, dw] | [_, dc, dh, dw] if (*dc, *dh, *dw) == (c, h, w) => Ok(()),
            [dc, dh, dw] | [_, dc, dh, dw] => {
                candle_core::bail!("{self} needs {c}x{h}x{w} images; the data has {dc}x{dh}x{dw}")
            }
            _ => candle_core::bail!(
                "{self} needs images of shape (N, {c}, {h}, {w}) or ({c}, {h}, {w}); the data \
                 has shape {dims:?}"
            ),
        }
    }

    /// Builds the model's variables under `vb` and the model itself: the layers of its
    /// [plan](Self::plan), after the rounding of the input.
    ///
    /// The transformer's input is token ids, which are not rounded.
    pub fn build(self, vb: VarBuilder, config: &QConfig) -> Result<Model> {
        if self == ModelKind::Transformer {
            let transformer = Transformer::new(TransformerConfig::default(), vb, config)?;
            return Ok(Model {
                kind: self,
                input: None,
                body: Body::Transformer(Box::new(transformer)),
            });
        }
        let input = config.quant("input", Category::Activation);
        // The model checks its input before rounding it; its layers need not check again.
        let layers = Layers::build(self.plan(), None, &vb, config)?;
        Ok(Model {
            kind: self,
            input,
            body: Body::Layers(layers),
        })
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = ModelKind::every().find(|(k, _)| k == self).map(|p| p.1);
        f.write_str(name.unwrap_or("?"))
    }
}

impl FromStr for ModelKind {
    type Err = candle_core::Error;

    fn from_str(s: &str) -> Result<Self> {
        ModelKind::every()
            .find(|(_, name)| *name == s)
            .map(|p| p.0)
            .ok_or_else(|| {
                let names: Vec<&str> = ModelKind::every().map(|p| p.1).collect();
                candle_core::Error::Msg(format!(
                    "unknown model `{s}`; models: {}",
                    names.join(", ")
                ))
            })
    }
}

/// A model of the zoo: logits from images.
#[derive(Debug, Clone)]
pub struct Model {
    kind: ModelKind,
    input: Option<Quant>,
    body: Body,
}

/// What a model computes after the rounding of its input.
#[derive(Debug, Clone)]
enum Body {
    Layers(Layers),
    Transformer(Box<Transformer>),
}

impl Model {
    /// Which model this is.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// Every quantizer of the model (clones sharing their call counters), so a training
    /// loop can place their random streams.
    pub fn quants(&self) -> Vec<Quant> {
        let mut quants: Vec<Quant> = self.input.iter().cloned().collect();
        quants.extend(match &self.body {
            Body::Layers(layers) => layers.quants(),
            Body::Transformer(t) => t.quants(),
        });
        quants
    }
}

impl Module for Model {
    /// Logits `(N, 10)` of images `(N, C, H, W)`; images of another shape are an error
    /// saying what the model needs ([`ModelKind::check_input`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.kind.check_input(x.dims())?;
        let x = match &self.input {
            Some(q) => quantize_no_grad(x, q)?,
            None => x.clone(),
        };
        match &self.body {
            Body::Layers(layers) => layers.forward(&x),
            Body::Transformer(t) => t.forward(&x),
        }
    }
}

/// The layers of a plan, built: one per stage, except that a ReLU after a convolution is
/// fused into it. Checks the input shape first when `check` names a model.
#[derive(Debug, Clone)]
struct Layers {
    check: Option<ModelKind>,
    layers: Vec<Layer>,
}

/// One built stage.
#[derive(Debug, Clone)]
enum Layer {
    Pad { pad: usize, value: f32 },
    Conv(QConv2d),
    Linear(QLinear),
    Relu,
    MaxPool(usize),
    Flatten,
    Tanh(QActivation),
    AvgPool(QAvgPool2d),
}

impl Layers {
    /// The layers of `stages`, with their variables under `vb`.
    fn build(
        stages: Vec<Stage>,
        check: Option<ModelKind>,
        vb: &VarBuilder,
        config: &QConfig,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(stages.len());
        let mut stages = stages.into_iter().peekable();
        while let Some(stage) = stages.next() {
            layers.push(match stage {
                Stage::Pad { pad, value } => Layer::Pad { pad, value },
                Stage::Conv {
                    name,
                    in_channels,
                    out_channels,
                    kernel,
                    stride,
                    padding,
                } => {
                    let conv = Conv2dConfig {
                        padding,
                        stride,
                        ..Default::default()
                    };
                    let layer =
                        QConv2d::new(in_channels, out_channels, kernel, conv, vb.pp(name), config)?;
                    if stages.next_if_eq(&Stage::Relu).is_some() {
                        Layer::Conv(layer.with_relu())
                    } else {
                        Layer::Conv(layer)
                    }
                }
                Stage::Linear {
                    name,
                    in_dim,
                    out_dim,
                } => Layer::Linear(QLinear::new(in_dim, out_dim, vb.pp(name), config)?),
                Stage::Relu => Layer::Relu,
                Stage::MaxPool(k) => Layer::MaxPool(k),
                Stage::Flatten => Layer::Flatten,
                Stage::Tanh { name } => {
                    Layer::Tanh(QActivation::new(&name, Activation::Tanh, config))
                }
                Stage::AvgPool { name, kernel } => {
                    Layer::AvgPool(QAvgPool2d::new(&name, kernel, kernel, config)?)
                }
            });
        }
        Ok(Layers { check, layers })
    }

    /// The quantizers of the convolution and linear layers, in order.
    fn quants(&self) -> Vec<Quant> {
        let layer_quants = self.layers.iter().map(|layer| match layer {
            Layer::Conv(c) => c.quants(),
            Layer::Linear(l) => l.quants(),
            Layer::Tanh(a) => a.quants(),
            Layer::AvgPool(p) => p.quants(),
            _ => vec![],
        });
        layer_quants.flatten().collect()
    }
}

impl Module for Layers {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(kind) = self.check {
            kind.check_input(x.dims())?;
        }
        let mut x = x.clone();
        for layer in &self.layers {
            x = match layer {
                Layer::Pad { pad, value } => pad_with(&x, *pad, f64::from(*value))?,
                Layer::Conv(c) => c.forward(&x)?,
                Layer::Linear(l) => l.forward(&x)?,
                Layer::Relu => x.relu()?,
                Layer::MaxPool(k) => crate::ops::max_pool2d(&x, *k, *k)?,
                Layer::Flatten => x.flatten_from(1)?,
                Layer::Tanh(a) => a.forward(&x)?,
                Layer::AvgPool(p) => p.forward(&x)?,
            };
        }
        Ok(x)
    }
}

/// Pads height and width of `x` (N, C, H, W) by `pad` on every side with `value`: shifted
/// so that `value` becomes 0, zero-padded, shifted back.
fn pad_with(x: &Tensor, pad: usize, value: f64) -> Result<Tensor> {
    x.affine(1.0, -value)?
        .pad_with_zeros(2, pad, pad)?
        .pad_with_zeros(3, pad, pad)?
        .affine(1.0, value)
}

/// A multilayer perceptron on flattened images, ReLU between layers.
#[derive(Debug, Clone)]
pub struct Mlp(Layers);

impl Mlp {
    /// Layers `fc1`, `fc2`, ... mapping `dims[0]` → ... → `dims[last]`.
    pub fn new(dims: &[usize], vb: VarBuilder, config: &QConfig) -> Result<Self> {
        if dims.len() < 2 {
            candle_core::bail!("an MLP needs at least an input and an output size, got {dims:?}");
        }
        Layers::build(mlp_plan(dims), None, &vb, config).map(Mlp)
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// LeNet-5 as in Deep PeNSieve (see the module docs): the layers of [`ModelKind::Lenet5`]
/// or [`ModelKind::Lenet5Unpadded`].
#[derive(Debug, Clone)]
pub struct LeNet5(Layers);

impl LeNet5 {
    /// LeNet-5 on 28x28 images, padded to 32x32 with -1 when `padded`.
    pub fn new(padded: bool, vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let kind = if padded {
            ModelKind::Lenet5
        } else {
            ModelKind::Lenet5Unpadded
        };
        Layers::build(kind.plan(), Some(kind), &vb, config).map(LeNet5)
    }
}

impl Module for LeNet5 {
    /// Logits of images `(N, 1, 28, 28)` (checked first, see [`ModelKind::check_input`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// CifarNet (see the module docs): the layers of [`ModelKind::CifarNet`].
#[derive(Debug, Clone)]
pub struct CifarNet(Layers);

impl CifarNet {
    /// CifarNet on 3x32x32 images.
    pub fn new(vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let kind = ModelKind::CifarNet;
        Layers::build(kind.plan(), Some(kind), &vb, config).map(CifarNet)
    }
}

impl Module for CifarNet {
    /// Logits of images `(N, 3, 32, 32)` (checked first, see [`ModelKind::check_input`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.0.forward(x)
    }
}

/// One step of a model's forward pass ([`ModelKind::plan`]): the models of the zoo are built
/// from these, and the post-training evaluation replays them with other arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Pads height and width by `pad` on every side with `value`.
    Pad {
        /// Pixels added on each side.
        pad: usize,
        /// The value of the added pixels.
        value: f32,
    },
    /// The convolution layer `name` (weight `name.weight` of shape (out, in, k, k), bias
    /// `name.bias`).
    Conv {
        /// Layer name.
        name: String,
        /// Input channels.
        in_channels: usize,
        /// Output channels.
        out_channels: usize,
        /// Kernel side `k`.
        kernel: usize,
        /// Stride on both axes.
        stride: usize,
        /// Zero padding on every side.
        padding: usize,
    },
    /// The linear layer `name` (weight `name.weight` of shape (out, in), bias `name.bias`).
    Linear {
        /// Layer name.
        name: String,
        /// Input features.
        in_dim: usize,
        /// Output features.
        out_dim: usize,
    },
    /// ReLU.
    Relu,
    /// Max pooling with a square window and equal stride.
    MaxPool(usize),
    /// Flattens every dimension after the batch.
    Flatten,
    /// TanH, its output and error rounded by the quantizer of layer `name`.
    Tanh {
        /// Layer name.
        name: String,
    },
    /// Average pooling with a square window and equal stride, its output and error rounded
    /// by the quantizer of layer `name`.
    AvgPool {
        /// Layer name.
        name: String,
        /// Window side (and stride).
        kernel: usize,
    },
}

impl ModelKind {
    /// The model's definition: its forward pass as a list of stages, with the layers' names
    /// and sizes. [`ModelKind::build`] builds a model of exactly these stages (plus the
    /// rounding of its input and its layers' quantizers). The transformer is not a list of
    /// stages: its plan is empty (see [`has_plan`](Self::has_plan)).
    pub fn plan(self) -> Vec<Stage> {
        use Stage::*;
        let conv = |name: &str, in_channels, out_channels, padding| Conv {
            name: name.into(),
            in_channels,
            out_channels,
            kernel: 5,
            stride: 1,
            padding,
        };
        // LeNet-5's fc1 sees 16 maps of 5x5 (padded input) or 4x4.
        let lenet5 = |padded: bool| {
            let side = if padded { 5 } else { 4 };
            let pad = padded.then_some(Pad {
                pad: 2,
                value: -1.0,
            });
            let convs = [
                conv("conv1", 1, 6, 0),
                Relu,
                MaxPool(2),
                conv("conv2", 6, 16, 0),
                Relu,
                MaxPool(2),
            ];
            let head = mlp_plan(&[16 * side * side, 120, 84, 10]);
            pad.into_iter().chain(convs).chain(head).collect()
        };
        let tanh = |i: usize| Tanh {
            name: format!("tanh{i}"),
        };
        let avg_pool = |i: usize| AvgPool {
            name: format!("pool{i}"),
            kernel: 2,
        };
        match self {
            ModelKind::Transformer => Vec::new(),
            ModelKind::Lenet5Classic => {
                let mut stages = vec![
                    Pad {
                        pad: 2,
                        value: -1.0,
                    },
                    conv("conv1", 1, 6, 0),
                    tanh(1),
                    avg_pool(1),
                    conv("conv2", 6, 16, 0),
                    tanh(2),
                    avg_pool(2),
                ];
                // The head of LeNet-5 with TanH in place of ReLU.
                let mut head = mlp_plan(&[16 * 5 * 5, 120, 84, 10]);
                let mut i = 2;
                for stage in &mut head {
                    if *stage == Relu {
                        i += 1;
                        *stage = tanh(i);
                    }
                }
                stages.append(&mut head);
                stages
            }
            ModelKind::Mlp => mlp_plan(&[784, 256, 128, 10]),
            ModelKind::Lenet5 => lenet5(true),
            ModelKind::Lenet5Unpadded => lenet5(false),
            ModelKind::CifarNet => {
                let convs = [
                    conv("conv1", 3, 64, 2),
                    Relu,
                    MaxPool(2),
                    conv("conv2", 64, 64, 2),
                    Relu,
                    MaxPool(2),
                ];
                convs
                    .into_iter()
                    .chain(mlp_plan(&[64 * 8 * 8, 384, 192, 10]))
                    .collect()
            }
        }
    }

    /// The name and shape of every parameter, sorted by name (as the model's
    /// `model.safetensors` holds them).
    pub fn parameter_shapes(self) -> Result<Vec<(String, Vec<usize>)>> {
        let varmap = candle_nn::VarMap::new();
        let vb =
            VarBuilder::from_varmap(&varmap, candle_core::DType::F32, &candle_core::Device::Cpu);
        self.build(vb, &QConfig::default())?;
        let data = varmap
            .data()
            .lock()
            .map_err(|_| candle_core::Error::Msg("variable map poisoned".into()))?;
        let mut shapes: Vec<(String, Vec<usize>)> = data
            .iter()
            .map(|(name, var)| (name.clone(), var.dims().to_vec()))
            .collect();
        shapes.sort();
        Ok(shapes)
    }
}

/// Flatten, then linear layers `fc1`, `fc2`, ... mapping `dims[0]` → ... → `dims[last]` with
/// a ReLU between two of them.
fn mlp_plan(dims: &[usize]) -> Vec<Stage> {
    let mut stages = vec![Stage::Flatten];
    for (i, d) in dims.windows(2).enumerate() {
        if i > 0 {
            stages.push(Stage::Relu);
        }
        stages.push(Stage::Linear {
            name: format!("fc{}", i + 1),
            in_dim: d[0],
            out_dim: d[1],
        });
    }
    stages
}
