//! Loops over tensor storage. `cpu` holds the rayon kernels, `f32_plan` the vectorised f32
//! rounding they run (a table per format, cached per thread); CUDA kernels live in
//! `kernels/*.cu` at the repository root and `cuda` (quantize, pack), with the `cuda`
//! feature, launches them (the posit GEMMs' launcher lives with the quire:
//! `crate::quire::gemm_cuda`).

pub mod cpu;
pub mod f32_plan;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod im2col;
pub mod qc;
