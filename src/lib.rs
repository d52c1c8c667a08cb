//! # qcandle
//!
//! Bit-exact simulation of low-precision number formats on [candle](https://github.com/huggingface/candle) tensors: posits,
//! IEEE-style floats of any exponent/mantissa split (fp16, bf16, FP8, FP6, FP4, ...), fixed
//! point and block floating point, each with nearest-even, nearest-away, toward-zero and
//! reproducible stochastic rounding.
//!
//! A low-precision number is represented by the f32 (or f64, f16, bf16) value it stands
//! for. A model computes in full precision and a fused [`quantize()`] op removes the extra
//! precision wherever the simulated hardware would round.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use qcandle::{quantize, Quant, Rounding};
//! let x = Tensor::new(&[0.1f32, 1.0, 2.6, 1e6], &Device::Cpu)?;
//! let q = Quant::new("posit<8,0>".parse()?).with_rounding(Rounding::NearestEven);
//! let y = quantize(&x, &q)?;
//! assert_eq!(y.to_vec1::<f32>()?, [0.09375, 1.0, 2.625, 64.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Layers: [`format`](mod@format) (scalar rounding math, one file per family, and [`error`], why a
//! format string or parameter is refused), [`philox`] (the counter-based random stream),
//! [`backend`] (loops over storage on the CPU, CUDA launches), [`ops`] (candle ops), [`nn`]
//! (quantized layers, models and their configs), [`optim`] (low-precision optimizers),
//! [`quire`] (exact posit dot products), [`lns`] (arithmetic on logarithmic-number-system
//! codes: exact products, sums by Gaussian logarithms, a naive matrix product), [`report`] (the formats table and rounding-error
//! statistics), [`stats`] (what a rounding did to a tensor, where a format's values lie, and
//! the collectors that observe quantizers) and [`device`] (the CPU or a CUDA GPU by name, as `--device` takes it).
//!
//! The `cli` feature (on by default) adds the `qcandle` command-line tool and the modules
//! only it needs: `data` (datasets), `io` (tensor files), `train` and `run_dir` (training
//! runs), `ptq` (post-training quantization), `sweep` (grids of runs, local or on Slurm) and
//! `plot` (training-curve PNGs), with their dependencies (clap, indicatif, plotters, anyhow,
//! flate2, sha2, safetensors, ctrlc, libc). A library user who needs none of them depends on
//! qcandle with `default-features = false`.
#![warn(missing_docs)]

pub mod backend;
#[cfg(feature = "cli")]
pub mod data;
pub mod device;
pub mod error;
pub mod format;
#[cfg(feature = "cli")]
pub mod io;
pub mod lns;
pub mod nn;
pub mod ops;
pub mod optim;
pub mod philox;
#[cfg(feature = "cli")]
pub mod plot;
#[cfg(feature = "cli")]
pub mod ptq;
pub mod quire;
pub mod report;
mod rows;
#[cfg(feature = "cli")]
pub mod run_dir;
#[cfg(feature = "cli")]
pub mod run_stats;
pub mod stats;
#[cfg(feature = "cli")]
pub mod sweep;
mod team;
#[cfg(feature = "cli")]
pub mod train;

pub use error::FormatError;
pub use format::{Format, Rounding};
pub use ops::{pack, quantize, quantize_, quantize_no_grad, unpack, Quant, Quantizer};
