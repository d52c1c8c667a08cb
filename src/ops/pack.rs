//! Conversion between values and the bit patterns of a format.
//!
//! `pack` rounds to nearest-even and returns each element's pattern: `u8` for formats of at
//! most 8 bits, `i16` holding the 16-bit pattern for 9 to 16 bits (candle has no u16 dtype;
//! read the bits with `as u16`), and `u32` above. `unpack` is its inverse and returns f32
//! (or f64 with [`unpack_as`]). Posit and float formats have patterns; fixed point and block
//! floating point are refused with an error. NaN packs to the format's canonical NaN pattern
//! (positive sign; for IEEE formats the quiet-NaN pattern with the top mantissa bit set).

use candle_core::{bail, DType, Device, Result, Tensor};

use crate::format::Format;

/// The candle dtype that holds this format's patterns.
pub fn pattern_dtype(format: &Format) -> Result<DType> {
    let bits = match format {
        Format::Posit(_) | Format::Float(_) => format.bits(),
        Format::Fixed(_) | Format::Block(_) => bail!(
            "pack/unpack support posit and float formats, not {format} (values of fixed point and block formats are best kept as floats)"
        ),
    };
    Ok(match bits {
        0..=8 => DType::U8,
        9..=16 => DType::I16,
        _ => DType::U32,
    })
}

fn encode(format: &Format, x: f64) -> Result<u32> {
    match format {
        Format::Posit(p) => Ok(p.encode(x)),
        Format::Float(f) => Ok(f.encode(x)?),
        _ => unreachable!("pattern_dtype refuses the other families"),
    }
}

fn decode(format: &Format, p: u32) -> f64 {
    match format {
        Format::Posit(posit) => posit.decode(p),
        Format::Float(f) => f.decode(p),
        _ => unreachable!("pattern_dtype refuses the other families"),
    }
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
    if let Some(bad) = raw.iter().find(|&&p| bits < 32 && p >> bits != 0) {
        bail!("unpack: pattern {bad:#x} does not fit the {bits} bits of {format}");
    }
    let values: Vec<f64> = raw.iter().map(|&p| decode(format, p)).collect();
    Tensor::from_vec(values, patterns.shape(), &Device::Cpu)?
        .to_dtype(dtype)?
        .to_device(patterns.device())
}
