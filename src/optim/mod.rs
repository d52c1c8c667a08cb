//! Optimizers whose gradients, state and weights are rounded to low-precision formats.

use crate::ops::Quant;

/// The quantizers applied to one parameter during an optimizer step.
#[derive(Debug, Clone, Default)]
pub struct ParamQuant {
    /// Rounds the gradient before anything else.
    pub gradient: Option<Quant>,
    /// Rounds optimizer state each time it is updated.
    pub momentum: Option<Quant>,
    /// Rounds the weights the model sees.
    pub weight: Option<Quant>,
    /// Rounds the separate weight copy that updates land in (none: no copy).
    pub accumulator: Option<Quant>,
}
