//! Loops over tensor storage. `cpu` holds the rayon kernels; CUDA kernels live in
//! `kernels/*.cu` at the repository root.

pub mod cpu;
pub mod im2col;
