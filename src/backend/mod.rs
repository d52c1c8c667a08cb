//! Where the per-format math of [`crate::format`] meets tensor storage, per device.
//!
//! * [`cpu`]: the rayon loops over CPU storage (quantize, block maxima, strided gather), with
//!   [`f32_plan`], the vectorised f32 rounding they run (a table per format, cached per
//!   thread), [`lns_plan`], the table-driven f32 rounding of the logarithmic format, and
//!   [`mx_plan`] and [`nvfp4_plan`], the integer f32 rounding of the block-scaled formats,
//!   and [`nvfp4_stochastic_plan`], stochastic NVFP4 on f32 from a quotient estimate.
//! * [`isa`]: which vector instruction set (portable, AVX2, AVX-512) the CPU passes run,
//!   detected at run time, with a cap for tests that compare the compiled paths.
//! * [`im2col`]: the column layout of a 2-D convolution, shared by the training and the
//!   posit convolutions.
//! * `cuda` (feature `cuda`): the launches of the CUDA C++ kernels in `cuda/*.cu` at the
//!   repository root (quantize, pack), and [`qc`], the formats as that code's C structs.
//!   The posit GEMMs' launcher lives with the quire (`crate::quire::gemm_cuda`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod f32_plan;
pub mod im2col;
pub mod isa;
pub mod lns_plan;
pub mod mx_plan;
pub mod nvfp4_plan;
pub mod nvfp4_stochastic_plan;
pub mod qc;
