//! Optimizers whose gradients, state and weights are rounded to low-precision formats.
