//! Low-precision training building blocks: the per-category quantization config
//! ([`config`]), quantized layers ([`layers`]) and a small model zoo ([`models`]).

pub mod config;
pub mod layers;
pub mod models;

pub use config::{Categories, Category, ConfigError, LayerOverride, QConfig, QuantSpec};
pub use layers::{round_vars_in_place, QConv2d, QLinear, QSequential, QWrap};
pub use models::{CifarNet, LeNet5, Mlp, Model, ModelKind, Stage};
