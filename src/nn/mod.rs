//! Low-precision training building blocks: the per-category quantization config
//! ([`config`]), quantized layers ([`layers`]), quantized blocks for transformers and
//! classic networks ([`blocks`]), constructors with candle-nn's signatures
//! ([`constructors`]) and a small model zoo ([`models`]).

pub mod batch_norm;
pub mod blocks;
pub mod config;
pub mod constructors;
pub mod layers;
pub mod models;
pub mod quantized_vb;
pub mod transformer;

pub use batch_norm::QBatchNorm2d;
pub use blocks::{
    Activation, NormStats, QActivation, QAdd, QAvgPool2d, QEmbedding, QLayerNorm, QMatMul, QRmsNorm,
};
pub use config::{Categories, Category, ConfigError, LayerOverride, QConfig, QuantSpec};
pub use constructors::{
    activation, add, conv2d, embedding, gelu_erf, layer_norm, linear, matmul, rms_norm,
    softmax_last_dim,
};
pub use layers::{round_vars_in_place, QConv2d, QLinear, QSequential, QWrap};
pub use models::{CifarNet, LeNet5, Mlp, Model, ModelKind, Stage};
pub use quantized_vb::quantized_var_builder;
pub use transformer::{Transformer, TransformerConfig, MODADD_P};
