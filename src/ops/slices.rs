//! f32 slices of CPU storage, shared by the convolution and pooling ops.

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, Layout, Result};

/// The f32 elements of `s`, or an error naming `what` for another dtype.
pub(crate) fn f32s<'a>(s: &'a CpuStorage, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(v) => Ok(v),
        other => bail!("conv2d: {what} must be f32, got {:?}", other.dtype()),
    }
}

/// The elements of a tensor in row-major order, borrowed when the layout is contiguous.
pub(crate) fn contiguous<'a>(v: &'a [f32], l: &Layout) -> Cow<'a, [f32]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Cow::Borrowed(&v[a..b]),
        None => Cow::Owned(crate::backend::cpu::gather(v, l)),
    }
}
