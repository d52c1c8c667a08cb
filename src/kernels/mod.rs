//! Loops over tensor storage. `cpu` holds the rayon kernels; CUDA kernels live in
//! `kernels/*.cu` at the repository root and `cuda` (quantize, pack) and `cuda_gemm` (posit
//! GEMMs), with the `cuda` feature, launch them.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_gemm;
pub mod im2col;
pub mod qc;
