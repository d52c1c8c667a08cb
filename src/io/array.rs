//! Arrays as tensor files hold them: an element type, a shape, and the elements' bytes,
//! little-endian and in row-major (C) order, borrowed from the file where they need no
//! conversion. Both readers produce them and both writers take them, so a file can be
//! rewritten without its tensors going through candle: element types candle lacks (`U16`,
//! `I8`, `BOOL`, `U64`, FP8, ...) are copied byte for byte, and only the four float types
//! are turned into candle tensors, rounded, and turned back.
//!
//! Conversion to candle ([`RawArray::to_tensor`]) widens what candle cannot hold as is but
//! can hold exactly (`U16` to `U32`, `I8` to `I16`, `BOOL` to `U8` 0/1) and refuses the
//! rest, so a value is never changed on the way in.

use std::borrow::Cow;
use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor};

pub use safetensors::Dtype;

/// One array: its element type, its shape, and its elements' bytes (little-endian,
/// row-major).
#[derive(Debug, Clone, PartialEq)]
pub struct RawArray<'a> {
    /// The element type.
    pub dtype: Dtype,
    /// The dimensions, outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    /// The elements' bytes: little-endian, row-major, exactly [`data_size`] bytes.
    pub data: Cow<'a, [u8]>,
}

/// The named tensors of a file (sorted by name) and its `__metadata__` map, if any.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawFile<'a> {
    /// The tensors, sorted by name.
    pub tensors: Vec<(String, RawArray<'a>)>,
    /// The free-form string map of a `.safetensors` file (`__metadata__`).
    pub metadata: Option<HashMap<String, String>>,
}

/// The number of elements of `shape`, or an error naming the overflow.
pub fn element_count(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .with_context(|| {
            format!("shape {shape:?} has more elements than a 64-bit count can hold (overflow)")
        })
}

/// The size in bytes of an array of `dtype` and `shape`, or an error naming the overflow
/// (or a size that is not a whole number of bytes, for the sub-byte types).
pub fn data_size(dtype: Dtype, shape: &[usize]) -> Result<usize> {
    let bits = element_count(shape)? as u128 * dtype.bitsize() as u128;
    ensure!(
        bits.is_multiple_of(8),
        "shape {shape:?} of {dtype} is not a whole number of bytes"
    );
    usize::try_from(bits / 8).map_err(|_| {
        anyhow::anyhow!(
            "shape {shape:?} of {dtype} has more bytes than a 64-bit size can hold (overflow)"
        )
    })
}

/// Whether `dtype` is one of the float types that can be rounded (F16, BF16, F32, F64).
pub fn is_roundable(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64)
}

impl RawArray<'_> {
    /// The array as a CPU tensor holding the same values. `U16`, `I8` and `BOOL`, which
    /// candle lacks, are widened exactly (to `U32`, `I16`, and `U8` 0/1); element types
    /// candle cannot hold exactly are an error.
    pub fn to_tensor(&self) -> Result<Tensor> {
        let (shape, data) = (&self.shape[..], &self.data[..]);
        let cpu = &Device::Cpu;
        let tensor = match self.dtype {
            Dtype::U16 => {
                let v: Vec<u32> = data
                    .chunks_exact(2)
                    .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                    .collect();
                Tensor::from_vec(v, shape, cpu)?
            }
            Dtype::I8 => {
                let v: Vec<i16> = data.iter().map(|&b| i16::from(b as i8)).collect();
                Tensor::from_vec(v, shape, cpu)?
            }
            Dtype::BOOL => {
                let v: Vec<u8> = data.iter().map(|&b| u8::from(b != 0)).collect();
                Tensor::from_vec(v, shape, cpu)?
            }
            dtype => {
                let candle = candle_dtype(dtype)?;
                Tensor::from_raw_buffer(data, candle, shape, cpu)?
            }
        };
        Ok(tensor)
    }
}

impl RawArray<'static> {
    /// The elements of `tensor` (any device, any layout) as an owned array of the same
    /// element type.
    pub fn from_tensor(tensor: &Tensor) -> Result<Self> {
        let dtype = safetensors_dtype(tensor.dtype())?;
        Ok(RawArray {
            dtype,
            shape: tensor.dims().to_vec(),
            data: Cow::Owned(le_bytes(tensor)?),
        })
    }
}

/// The candle element type of the same name, for the types candle holds with their own
/// meaning (the MX types it only carries as opaque bytes are left out).
fn candle_dtype(dtype: Dtype) -> Result<DType> {
    Ok(match dtype {
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F8_E4M3 => DType::F8E4M3,
        other => bail!("element type {other} has no candle equivalent"),
    })
}

/// The safetensors element type of a candle tensor's.
fn safetensors_dtype(dtype: DType) -> Result<Dtype> {
    Ok(match dtype {
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::F8E4M3 => Dtype::F8_E4M3,
        other => bail!("cannot store tensors of candle type {other:?}"),
    })
}

/// The little-endian bytes of `tensor`'s elements in row-major order.
pub(crate) fn le_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    fn each<T: candle_core::WithDType, const N: usize>(
        t: &Tensor,
        to_bytes: fn(T) -> [u8; N],
    ) -> Result<Vec<u8>> {
        Ok(t.flatten_all()?
            .to_vec1::<T>()?
            .into_iter()
            .flat_map(to_bytes)
            .collect())
    }
    match tensor.dtype() {
        DType::U8 => each(tensor, u8::to_le_bytes),
        DType::U32 => each(tensor, u32::to_le_bytes),
        DType::I16 => each(tensor, i16::to_le_bytes),
        DType::I32 => each(tensor, i32::to_le_bytes),
        DType::I64 => each(tensor, i64::to_le_bytes),
        DType::F16 => each(tensor, half::f16::to_le_bytes),
        DType::BF16 => each(tensor, half::bf16::to_le_bytes),
        DType::F32 => each(tensor, f32::to_le_bytes),
        DType::F64 => each(tensor, f64::to_le_bytes),
        // One byte per element: candle's own conversion to bytes is exact.
        DType::F8E4M3 => Ok(safetensors::View::data(&tensor).into_owned()),
        other => bail!("cannot store tensors of candle type {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_overflow_into_errors() {
        assert_eq!(data_size(Dtype::F32, &[2, 3]).unwrap(), 24);
        assert_eq!(data_size(Dtype::F32, &[]).unwrap(), 4);
        assert!(data_size(Dtype::F4, &[3]).is_err());
        let err = data_size(Dtype::F32, &[1 << 62, 4]).unwrap_err();
        assert!(format!("{err}").contains("overflow"), "{err}");
        let err = data_size(Dtype::F32, &[1 << 62]).unwrap_err();
        assert!(format!("{err}").contains("overflow"), "{err}");
        assert_eq!(data_size(Dtype::F64, &[1 << 60]).unwrap(), 1 << 63);
    }

    #[test]
    fn widened_types_keep_their_values() {
        let u16s = RawArray {
            dtype: Dtype::U16,
            shape: vec![3],
            data: Cow::Borrowed(&[1, 0, 0xff, 0xff, 0, 1]),
        };
        assert_eq!(
            u16s.to_tensor().unwrap().to_vec1::<u32>().unwrap(),
            [1, 65535, 256]
        );
        let i8s = RawArray {
            dtype: Dtype::I8,
            shape: vec![2],
            data: Cow::Borrowed(&[0x80, 0x7f]),
        };
        assert_eq!(
            i8s.to_tensor().unwrap().to_vec1::<i16>().unwrap(),
            [-128, 127]
        );
        let u64s = RawArray {
            dtype: Dtype::U64,
            shape: vec![1],
            data: Cow::Borrowed(&[0xff; 8]),
        };
        assert!(u64s.to_tensor().is_err());
    }

    #[test]
    fn tensors_round_trip_through_bytes() {
        let t = Tensor::new(&[[1.5f32, -2.0], [3.25, 0.0]], &Device::Cpu).unwrap();
        let raw = RawArray::from_tensor(&t.t().unwrap()).unwrap();
        assert_eq!(raw.shape, [2, 2]);
        assert_eq!(&raw.data[..4], &1.5f32.to_le_bytes());
        assert_eq!(&raw.data[4..8], &3.25f32.to_le_bytes());
        let back = raw.to_tensor().unwrap();
        assert_eq!(
            back.to_vec2::<f32>().unwrap(),
            t.t().unwrap().to_vec2::<f32>().unwrap()
        );
    }
}
