//! A small model zoo built from the quantized layers: MLP, LeNet-5 and CifarNet.
//!
//! Every model takes images (N, C, H, W) scaled to [-1, 1] and returns logits (N, 10);
//! images of another shape are refused before the first layer with a message saying what
//! the model needs and what it was given ([`ModelKind::check_input`]). The input is rounded with the activation format of the pseudo-layer `input` (real hardware
//! would hold its input in the format too); each linear or convolution layer rounds its
//! output and error (see [`crate::nn::layers`]).
//!
//! LeNet-5 follows Deep PeNSieve's network: 28x28 images padded to 32x32 with the
//! background value (-1 after scaling), conv 5x5 (6) → ReLU → max-pool 2 → conv 5x5 (16) →
//! ReLU → max-pool 2 → fc 120 → ReLU → fc 84 → ReLU → fc 10: 61,706 parameters. Without the
//! padding, fc1 sees 16·4·4 inputs instead of 16·5·5 and the count is 44,426.
//!
//! CifarNet is TF-slim's CIFAR-10 network without local response normalisation and
//! dropout, with 2x2 pooling: conv 5x5 (64, same) → ReLU → max-pool 2 → conv 5x5 (64, same)
//! → ReLU → max-pool 2 → fc 384 → ReLU → fc 192 → ReLU → fc 10 on 3x32x32 images.

use std::fmt;
use std::str::FromStr;

use candle_core::{Module, Result, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder};

use crate::nn::config::{Category, QConfig};
use crate::nn::layers::{QConv2d, QLinear};
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
}

impl ModelKind {
    /// Every model, with its command-line name.
    pub const ALL: [(ModelKind, &'static str); 4] = [
        (ModelKind::Mlp, "mlp"),
        (ModelKind::Lenet5, "lenet5"),
        (ModelKind::Lenet5Unpadded, "lenet5-unpadded"),
        (ModelKind::CifarNet, "cifarnet"),
    ];

    /// The input image shape (C, H, W) the model expects.
    pub fn input_shape(self) -> (usize, usize, usize) {
        match self {
            ModelKind::CifarNet => (3, 32, 32),
            _ => (1, 28, 28),
        }
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

    /// Builds the model's variables under `vb` and the model itself.
    pub fn build(self, vb: VarBuilder, config: &QConfig) -> Result<Model> {
        let input = config.quant("input", Category::Activation);
        let net = match self {
            ModelKind::Mlp => Net::Mlp(Mlp::new(&[784, 256, 128, 10], vb, config)?),
            ModelKind::Lenet5 => Net::Lenet5(LeNet5::new(true, vb, config)?),
            ModelKind::Lenet5Unpadded => Net::Lenet5(LeNet5::new(false, vb, config)?),
            ModelKind::CifarNet => Net::CifarNet(CifarNet::new(vb, config)?),
        };
        Ok(Model {
            kind: self,
            input,
            net,
        })
    }
}

impl fmt::Display for ModelKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = ModelKind::ALL.iter().find(|(k, _)| k == self).map(|p| p.1);
        f.write_str(name.unwrap_or("?"))
    }
}

impl FromStr for ModelKind {
    type Err = candle_core::Error;

    fn from_str(s: &str) -> Result<Self> {
        ModelKind::ALL
            .iter()
            .find(|(_, name)| *name == s)
            .map(|p| p.0)
            .ok_or_else(|| {
                let names: Vec<&str> = ModelKind::ALL.iter().map(|p| p.1).collect();
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
    net: Net,
}

#[derive(Debug, Clone)]
enum Net {
    Mlp(Mlp),
    Lenet5(LeNet5),
    CifarNet(CifarNet),
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
        let layers: Vec<Vec<Quant>> = match &self.net {
            Net::Mlp(m) => m.layers.iter().map(QLinear::quants).collect(),
            Net::Lenet5(m) => vec![
                m.conv1.quants(),
                m.conv2.quants(),
                m.fc1.quants(),
                m.fc2.quants(),
                m.fc3.quants(),
            ],
            Net::CifarNet(m) => vec![
                m.conv1.quants(),
                m.conv2.quants(),
                m.fc1.quants(),
                m.fc2.quants(),
                m.fc3.quants(),
            ],
        };
        quants.extend(layers.into_iter().flatten());
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
        match &self.net {
            Net::Mlp(m) => m.forward(&x),
            Net::Lenet5(m) => m.forward(&x),
            Net::CifarNet(m) => m.forward(&x),
        }
    }
}

/// Max-pooling with a square window and equal stride.
fn max_pool(x: &Tensor, size: usize) -> Result<Tensor> {
    crate::ops::max_pool2d(x, size, size)
}

/// A multilayer perceptron on flattened images, ReLU between layers.
#[derive(Debug, Clone)]
pub struct Mlp {
    layers: Vec<QLinear>,
}

impl Mlp {
    /// Layers `fc1`, `fc2`, ... mapping `dims[0]` → ... → `dims[last]`.
    pub fn new(dims: &[usize], vb: VarBuilder, config: &QConfig) -> Result<Self> {
        if dims.len() < 2 {
            candle_core::bail!("an MLP needs at least an input and an output size, got {dims:?}");
        }
        let layers = dims
            .windows(2)
            .enumerate()
            .map(|(i, d)| QLinear::new(d[0], d[1], vb.pp(format!("fc{}", i + 1)), config))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.flatten_from(1)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(&x)?;
            if i + 1 < self.layers.len() {
                x = x.relu()?;
            }
        }
        Ok(x)
    }
}

/// LeNet-5 as in Deep PeNSieve (see the module docs).
#[derive(Debug, Clone)]
pub struct LeNet5 {
    padded: bool,
    conv1: QConv2d,
    conv2: QConv2d,
    fc1: QLinear,
    fc2: QLinear,
    fc3: QLinear,
}

impl LeNet5 {
    /// LeNet-5 on 28x28 images, padded to 32x32 with -1 when `padded`.
    pub fn new(padded: bool, vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let conv = Conv2dConfig::default();
        let side = if padded { 5 } else { 4 };
        Ok(LeNet5 {
            padded,
            conv1: QConv2d::new(1, 6, 5, conv, vb.pp("conv1"), config)?.with_relu(),
            conv2: QConv2d::new(6, 16, 5, conv, vb.pp("conv2"), config)?.with_relu(),
            fc1: QLinear::new(16 * side * side, 120, vb.pp("fc1"), config)?,
            fc2: QLinear::new(120, 84, vb.pp("fc2"), config)?,
            fc3: QLinear::new(84, 10, vb.pp("fc3"), config)?,
        })
    }
}

impl Module for LeNet5 {
    /// Logits of images `(N, 1, 28, 28)` (checked first, see [`ModelKind::check_input`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let kind = if self.padded {
            ModelKind::Lenet5
        } else {
            ModelKind::Lenet5Unpadded
        };
        kind.check_input(x.dims())?;
        let x = if self.padded {
            // Pad with the background value -1: shift so it becomes 0, zero-pad, shift back.
            (x + 1.0)?
                .pad_with_zeros(2, 2, 2)?
                .pad_with_zeros(3, 2, 2)?
                .affine(1.0, -1.0)?
        } else {
            x.clone()
        };
        let x = max_pool(&self.conv1.forward(&x)?, 2)?;
        let x = max_pool(&self.conv2.forward(&x)?, 2)?;
        let x = self.fc1.forward(&x.flatten_from(1)?)?.relu()?;
        let x = self.fc2.forward(&x)?.relu()?;
        self.fc3.forward(&x)
    }
}

/// CifarNet (see the module docs).
#[derive(Debug, Clone)]
pub struct CifarNet {
    conv1: QConv2d,
    conv2: QConv2d,
    fc1: QLinear,
    fc2: QLinear,
    fc3: QLinear,
}

impl CifarNet {
    /// CifarNet on 3x32x32 images.
    pub fn new(vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let same = Conv2dConfig {
            padding: 2,
            ..Default::default()
        };
        Ok(CifarNet {
            conv1: QConv2d::new(3, 64, 5, same, vb.pp("conv1"), config)?.with_relu(),
            conv2: QConv2d::new(64, 64, 5, same, vb.pp("conv2"), config)?.with_relu(),
            fc1: QLinear::new(64 * 8 * 8, 384, vb.pp("fc1"), config)?,
            fc2: QLinear::new(384, 192, vb.pp("fc2"), config)?,
            fc3: QLinear::new(192, 10, vb.pp("fc3"), config)?,
        })
    }
}

impl Module for CifarNet {
    /// Logits of images `(N, 3, 32, 32)` (checked first, see [`ModelKind::check_input`]).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ModelKind::CifarNet.check_input(x.dims())?;
        let x = max_pool(&self.conv1.forward(x)?, 2)?;
        let x = max_pool(&self.conv2.forward(&x)?, 2)?;
        let x = self.fc1.forward(&x.flatten_from(1)?)?.relu()?;
        let x = self.fc2.forward(&x)?.relu()?;
        self.fc3.forward(&x)
    }
}

/// One step of a model's forward pass, as the post-training evaluation replays it with
/// other arithmetic ([`ModelKind::plan`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Stage {
    /// Pads height and width by `pad` on every side with `value`.
    Pad {
        /// Pixels added on each side.
        pad: usize,
        /// The value of the added pixels.
        value: f32,
    },
    /// The convolution layer `name` (weight `name.weight`, bias `name.bias`).
    Conv {
        /// Layer name.
        name: &'static str,
        /// Stride on both axes.
        stride: usize,
        /// Zero padding on every side.
        padding: usize,
    },
    /// The linear layer `name` (weight `name.weight`, bias `name.bias`).
    Linear {
        /// Layer name.
        name: &'static str,
    },
    /// ReLU.
    Relu,
    /// Max pooling with a square window and equal stride.
    MaxPool(usize),
    /// Flattens every dimension after the batch.
    Flatten,
}

impl ModelKind {
    /// The model's forward pass as a list of stages, the same computation as
    /// [`ModelKind::build`]'s model without its quantizers (a test checks the two agree).
    pub fn plan(self) -> Vec<Stage> {
        use Stage::*;
        let conv = |name, padding| Conv {
            name,
            stride: 1,
            padding,
        };
        let head = [
            Flatten,
            Linear { name: "fc1" },
            Relu,
            Linear { name: "fc2" },
            Relu,
            Linear { name: "fc3" },
        ];
        let mut stages = match self {
            ModelKind::Mlp => vec![],
            ModelKind::Lenet5 | ModelKind::Lenet5Unpadded => {
                let mut s = if self == ModelKind::Lenet5 {
                    vec![Pad {
                        pad: 2,
                        value: -1.0,
                    }]
                } else {
                    vec![]
                };
                s.extend([
                    conv("conv1", 0),
                    Relu,
                    MaxPool(2),
                    conv("conv2", 0),
                    Relu,
                    MaxPool(2),
                ]);
                s
            }
            ModelKind::CifarNet => vec![
                conv("conv1", 2),
                Relu,
                MaxPool(2),
                conv("conv2", 2),
                Relu,
                MaxPool(2),
            ],
        };
        stages.extend(head);
        stages
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
