//! Low-precision training building blocks: the per-category quantization config and the
//! quantized layers and models.
