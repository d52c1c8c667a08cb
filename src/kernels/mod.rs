//! Loops over tensor storage. `cpu` holds the rayon kernels; CUDA kernels live in
//! `kernels/*.cu` at the repository root and `cuda` (quantize, pack), with the `cuda`
//! feature, launches them (the posit GEMMs' launcher lives with the quire:
//! `crate::quire::gemm_cuda`).

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod im2col;
pub mod qc;
