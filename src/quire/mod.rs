//! Exact and naive posit arithmetic for dot products: the quire, and GEMMs built on it.
//!
//! * [`Quire`]: an exact accumulator of posit products with one rounding at the end.
//! * [`gemm_cpu`]: GEMMs on f64 slices: exact (a quire per output, or a narrower
//!   accumulator where that is provably exact) and naive (rounded after every operation;
//!   256 x 256 operation tables for 8-bit formats).
//! * [`ops`]: the same on candle tensors: [`quire_matmul`], [`naive_matmul`], [`linear`]
//!   and [`conv2d`] (through im2col).
//! * `gemm_cuda` (feature `cuda`): the launches of the same GEMMs on a CUDA device
//!   (`cuda/gemm.cu`), with the CPU GEMMs' bits.
//! * [`round_odd`]: f64 operations rounded to odd, so that one later rounding to the
//!   format is correct.

pub mod accumulator;
pub mod gemm_cpu;
#[cfg(feature = "cuda")]
pub mod gemm_cuda;
pub mod int_dot;
pub mod naive_f32;
pub mod ops;
pub mod round_odd;

pub use accumulator::Quire;
pub use ops::{conv2d, linear, matmul, naive_matmul, quire_matmul, Accumulation};
