//! Tensor files.
