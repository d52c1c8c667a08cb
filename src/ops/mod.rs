//! candle operations: convolution and max pooling with fast CPU backward passes, the fused
//! quantize op (straight-through backward), the `Quantizer` layer with its own backward
//! format, bit-pattern packing, and the packed form of the block-scaled formats (MX, NVFP4).

pub mod conv;
pub mod pack;
pub mod pack_blocks;
pub mod pool;
pub mod quantize;
mod slices;

pub use conv::{conv2d, conv2d_quantized, conv2d_relu};
pub use pack::{pack, unpack};
pub use pack_blocks::{pack_blocks, unpack_blocks, PackedBlocks};
pub use pool::{max_pool2d, max_pool2d_by_gather};
pub use quantize::{quantize, quantize_, quantize_no_grad, Quant, Quantizer};
