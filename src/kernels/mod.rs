//! Loops over tensor storage. `cpu` holds the rayon kernels; CUDA kernels live in
//! `kernels/*.cu` at the repository root and `cuda` (with the `cuda` feature) launches them.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod im2col;
pub mod qc;
