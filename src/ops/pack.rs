//! Conversion between values and the bit patterns of a format.
//!
//! `pack` rounds to nearest-even and returns each element's pattern: `u8` for formats of at
//! most 8 bits, `i16` holding the 16-bit pattern for 9 to 16 bits (candle has no u16 dtype;
//! read the bits with `as u16`), and `u32` above. `unpack` is its inverse and returns f32
//! (or f64 with [`unpack_as`]). Posit, float and lns formats have patterns; fixed point and block
//! floating point are refused with an error. NaN packs to the format's canonical NaN pattern
//! (positive sign; for IEEE formats the quiet-NaN pattern with the top mantissa bit set).

use candle_core::{bail, DType, Device, Result, Tensor};

use crate::format::Format;

/// The candle dtype that holds this format's patterns.
pub fn pattern_dtype(format: &Format) -> Result<DType> {
    let bits = match format {
        Format::Posit(_) | Format::Float(_) | Format::Lns(_) => format.bits(),
        Format::Fixed(_) | Format::Block(_) => bail!(
            "pack/unpack support posit, float and lns formats, not {format} (values of fixed point and block formats are best kept as floats)"
        ),
        Format::Mx(_) | Format::Nvfp4(_) => bail!(
            "{format} elements have no pattern without their block's scale: use pack_blocks/unpack_blocks, which keep the scales (pack/unpack support posit, float and lns formats)"
        ),
    };
    Ok(match bits {
        0..=8 => DType::U8,
        9..=16 => DType::I16,
        _ => DType::U32,
    })
}

/// [`Format::encode`] as a candle result.
fn encode(format: &Format, x: f64) -> Result<u32> {
    Ok(format.encode(x)?)
}

/// [`Format::decode`] of a format that [`pattern_dtype`] accepted (so it has patterns).
fn decode(format: &Format, p: u32) -> f64 {
    format
        .decode(p)
        .expect("pattern_dtype refuses the formats without patterns")
}

/// Rounds `x` to `format` (nearest-even) and returns the bit patterns.
pub fn pack(x: &Tensor, format: &Format) -> Result<Tensor> {
    let dtype = pattern_dtype(format)?;
    if !matches!(
        x.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        bail!(
            "pack: unsupported dtype {:?}; pack takes float tensors",
            x.dtype()
        );
    }
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        return cuda::pack(x, format, dtype);
    }
    let values = x.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let patterns = values
        .iter()
        .map(|&v| encode(format, v))
        .collect::<Result<Vec<u32>>>()?;
    let dev = Device::Cpu;
    let t = match dtype {
        DType::U8 => Tensor::from_vec(
            patterns.iter().map(|&p| p as u8).collect::<Vec<_>>(),
            x.shape(),
            &dev,
        )?,
        DType::I16 => Tensor::from_vec(
            patterns
                .iter()
                .map(|&p| p as u16 as i16)
                .collect::<Vec<_>>(),
            x.shape(),
            &dev,
        )?,
        _ => Tensor::from_vec(patterns, x.shape(), &dev)?,
    };
    t.to_device(x.device())
}

/// Decodes bit patterns of `format` to f32 values.
pub fn unpack(patterns: &Tensor, format: &Format) -> Result<Tensor> {
    unpack_as(patterns, format, DType::F32)
}

/// Decodes bit patterns of `format` to values of `dtype`.
pub fn unpack_as(patterns: &Tensor, format: &Format, dtype: DType) -> Result<Tensor> {
    pattern_dtype(format)?;
    #[cfg(feature = "cuda")]
    if patterns.device().is_cuda() {
        return cuda::unpack(patterns, format, dtype);
    }
    let flat = patterns.flatten_all()?;
    let raw: Vec<u32> = match patterns.dtype() {
        DType::U8 => flat.to_vec1::<u8>()?.into_iter().map(u32::from).collect(),
        DType::I16 => flat
            .to_vec1::<i16>()?
            .into_iter()
            .map(|p| p as u16 as u32)
            .collect(),
        DType::U32 => flat.to_vec1::<u32>()?,
        other => bail!("unpack: patterns must be u8, i16 or u32, got {other:?}"),
    };
    let bits = format.bits();
    if let Some(&bad) = raw.iter().find(|&&p| bits < 32 && p >> bits != 0) {
        return Err(misfit(format, bad));
    }
    let values: Vec<f64> = raw.iter().map(|&p| decode(format, p)).collect();
    Tensor::from_vec(values, patterns.shape(), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(patterns.device())
}

/// unpack's error for a pattern with bits above the format's.
fn misfit(format: &Format, pattern: u32) -> candle_core::Error {
    let bits = format.bits();
    candle_core::Error::Msg(format!(
        "unpack: pattern {pattern:#x} does not fit the {bits} bits of {format}"
    ))
    .bt()
}

/// pack and unpack of CUDA tensors, through the kernels of `cuda/quant.cu`.
#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::Tensor;
    use candle_core::{bail, CpuStorage, CudaStorage, CustomOp1, DType, Layout, Result, Shape};

    use super::{encode, misfit};
    use crate::format::Format;

    /// pack on the device: f16/bf16 are widened to f32 (exact; NaN packs to the canonical
    /// pattern whatever its payload), strided views made contiguous.
    pub(super) fn pack(x: &Tensor, format: &Format, pattern: DType) -> Result<Tensor> {
        let x = match x.dtype() {
            DType::F16 | DType::BF16 => x.to_dtype(DType::F32)?,
            _ => x.clone(),
        };
        x.contiguous()?.apply_op1_no_bwd(&PackOp {
            format: *format,
            pattern,
        })
    }

    /// `patterns` made contiguous. candle 0.11.1 copies a strided i16 CUDA view with kernels
    /// (`ucopy_i16`, `copy2d_i16`) that its kernel library lacks ("named symbol not found"),
    /// so such a view is made contiguous on the host (its storage goes there and back); other
    /// views stay on the device.
    fn contiguous_patterns(patterns: &Tensor) -> Result<Tensor> {
        if patterns.dtype() == DType::I16 && !patterns.is_contiguous() {
            return patterns
                .to_device(&candle_core::Device::Cpu)?
                .contiguous()?
                .to_device(patterns.device());
        }
        patterns.contiguous()
    }

    /// unpack on the device: f32 and f64 directly; other dtypes through f64 as on the CPU,
    /// the last conversion made on the host so that it is the CPU's (half's) conversion.
    pub(super) fn unpack(patterns: &Tensor, format: &Format, dtype: DType) -> Result<Tensor> {
        match patterns.dtype() {
            DType::U8 | DType::I16 | DType::U32 => {}
            other => bail!("unpack: patterns must be u8, i16 or u32, got {other:?}"),
        }
        let direct = matches!(dtype, DType::F32 | DType::F64);
        let op = UnpackOp {
            format: *format,
            dtype: if direct { dtype } else { DType::F64 },
        };
        let values = contiguous_patterns(patterns)?.apply_op1_no_bwd(&op)?;
        if direct {
            Ok(values)
        } else {
            values
                .to_device(&candle_core::Device::Cpu)?
                .to_dtype(dtype)?
                .to_device(patterns.device())
        }
    }

    struct PackOp {
        format: Format,
        pattern: DType,
    }

    impl CustomOp1 for PackOp {
        fn name(&self) -> &'static str {
            "qcandle-pack"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            bail!("qcandle-pack: the CUDA op was given a CPU tensor")
        }

        fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            match crate::backend::cuda::pack(storage, layout, &self.format, self.pattern)? {
                Some(out) => Ok((out, layout.shape().clone())),
                // The only value without a pattern is NaN in a `fin` format: the CPU's error.
                None => encode(&self.format, f64::NAN)
                    .and_then(|_| bail!("pack: a value of {} has no pattern", self.format)),
            }
        }
    }

    struct UnpackOp {
        format: Format,
        dtype: DType,
    }

    impl CustomOp1 for UnpackOp {
        fn name(&self) -> &'static str {
            "qcandle-unpack"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            bail!("qcandle-unpack: the CUDA op was given a CPU tensor")
        }

        fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
            match crate::backend::cuda::unpack(storage, layout, &self.format, self.dtype)? {
                Ok(out) => Ok((out, layout.shape().clone())),
                Err(pattern) => Err(misfit(&self.format, pattern)),
            }
        }
    }
}
