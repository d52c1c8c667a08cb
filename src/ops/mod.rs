//! candle operations: the fused quantize op (straight-through backward), the `Quantizer`
//! layer with its own backward format, and bit-pattern packing.

pub mod pack;
pub mod quantize;

pub use pack::{pack, unpack};
pub use quantize::{quantize, quantize_, quantize_no_grad, Quant, Quantizer};
