//! The packed form of the block-scaled formats (MX, NVFP4), whose elements have no pattern
//! without their block's scale.
//!
//! [`pack_blocks`] rounds a tensor to nearest-even and returns:
//!
//! - `codes`: every element's code in logical row-major order, `bits` bits each (8 for
//!   MXFP8 and MXINT8, 6 for MXFP6, 4 for MXFP4 and NVFP4), packed densely LSB first (element
//!   `i` occupies bits `i·bits .. (i+1)·bits` of the little-endian bit stream: two FP4 codes
//!   per byte, the first in the low nibble; four FP6 codes per three bytes). FP codes are the
//!   element's sign-exponent-mantissa pattern; MXINT8 codes are the two's complement byte.
//! - `scales`: one byte per block, in the block order of
//!   [`MxGrid`]: MX's E8M0 (`X + 127`; 0xFF for a NaN block,
//!   whose codes are 0), NVFP4's E4M3 pattern of `s_b` (0x7F for a NaN block).
//! - `tensor_scale`: NVFP4's f32 tensor scale (1 for MX, which has none).
//!
//! [`unpack_blocks`] is its exact inverse on the values: it returns the f64 values `code ·
//! scale`, which are [`quantize`](crate::quantize()) with nearest-even (the same bits in
//! f64, and the same f32 values after the same single rounding).
//!
//! [`safetensors_metadata`] gives the string pairs that say how to read a packed tensor back
//! (format, shape, axis, block size, element bits).

use candle_core::{bail, DType, Device, Result, Tensor};

use crate::format::mx::{ElementFormat, MxGrid, MX_BLOCK};
use crate::format::nvfp4::{e2m1, e4m3_saturating, round_quotient, NVFP4_BLOCK};
use crate::format::rounding::NearestEven;
use crate::format::{Format, Nvfp4};

/// A tensor of a block-scaled format in its packed form (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedBlocks {
    /// The format (MX or NVFP4, with its axis).
    pub format: Format,
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// Element codes, `bits` each, LSB first.
    pub codes: Vec<u8>,
    /// One scale byte per block.
    pub scales: Vec<u8>,
    /// NVFP4's tensor scale (1 for MX).
    pub tensor_scale: f32,
}

/// The block grid and element bits of a block-scaled format.
fn layout(format: &Format, shape: &[usize]) -> Result<(MxGrid, u32)> {
    Ok(match format {
        Format::Mx(m) => (
            MxGrid::new(MX_BLOCK, m.dim(), shape, "mx")?,
            m.element().bits(),
        ),
        Format::Nvfp4(n) => (MxGrid::new(NVFP4_BLOCK, n.dim(), shape, "nvfp4")?, 4),
        other => bail!(
            "pack_blocks takes MX and NVFP4 formats, not {other} (pack/unpack cover posits and floats)"
        ),
    })
}

/// Writes `code` (`bits` bits) as element `i` of the LSB-first bit stream `out`.
fn put_code(out: &mut [u8], i: usize, bits: u32, code: u32) {
    for b in 0..bits as usize {
        if code >> b & 1 == 1 {
            let at = i * bits as usize + b;
            out[at / 8] |= 1 << (at % 8);
        }
    }
}

/// Reads element `i` of the LSB-first bit stream `codes`.
fn get_code(codes: &[u8], i: usize, bits: u32) -> u32 {
    (0..bits as usize).fold(0, |c, b| {
        let at = i * bits as usize + b;
        c | (((codes[at / 8] >> (at % 8)) & 1) as u32) << b
    })
}

/// Rounds `x` (f16, bf16, f32 or f64, any device) to `format` (MX or NVFP4), nearest-even,
/// and packs it.
pub fn pack_blocks(x: &Tensor, format: &Format) -> Result<PackedBlocks> {
    if !matches!(
        x.dtype(),
        DType::F32 | DType::F64 | DType::F16 | DType::BF16
    ) {
        bail!(
            "pack_blocks: unsupported dtype {:?}; it takes float tensors",
            x.dtype()
        );
    }
    let shape = x.dims().to_vec();
    let (grid, bits) = layout(format, &shape)?;
    let xs = x.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    // Largest magnitude per block, NaN and Inf as +Inf (a NaN block).
    let mut amax = vec![0f64; grid.count()];
    for (i, &v) in xs.iter().enumerate() {
        let b = grid.block_of(i);
        amax[b] = amax[b].max(if v.is_finite() {
            v.abs()
        } else {
            f64::INFINITY
        });
    }
    let mut codes = vec![0u8; (xs.len() * bits as usize).div_ceil(8)];
    let (scales, tensor_scale) = match format {
        Format::Mx(m) => {
            let element = m.element().format();
            let exps: Vec<Option<i32>> = amax.iter().map(|&a| m.scale_exponent(a)).collect();
            for (i, &v) in xs.iter().enumerate() {
                if let Some(e) = exps[grid.block_of(i)] {
                    let scaled = crate::format::grid::pow2(-e) * v;
                    let code = match element {
                        ElementFormat::Float(f) => f.encode(scaled)?,
                        ElementFormat::Fixed(f) => {
                            let k = f.round(scaled, NearestEven, 0) / f.quantum();
                            k as i32 as u8 as u32
                        }
                    };
                    put_code(&mut codes, i, bits, code);
                }
            }
            let bytes = exps.iter().map(|e| e.map_or(0xFF, |e| (e + 127) as u8));
            (bytes.collect(), 1.0)
        }
        _ => {
            let finite_max = crate::format::block::block_max(xs.iter().copied());
            let s_t = Nvfp4::tensor_scale(finite_max);
            let s_b: Vec<f64> = amax.iter().map(|&a| Nvfp4::block_scale(a, s_t)).collect();
            let (fp4, fp8) = (e2m1(), e4m3_saturating());
            for (i, &v) in xs.iter().enumerate() {
                let s = s_b[grid.block_of(i)];
                if s.is_nan() {
                    continue;
                }
                let q = if s == 0.0 {
                    if v.is_sign_negative() {
                        -0.0
                    } else {
                        0.0
                    }
                } else {
                    round_quotient(v, s * s_t, &fp4, NearestEven, 0)
                };
                put_code(&mut codes, i, bits, fp4.encode(q)?);
            }
            let bytes = s_b.iter().map(|&s| fp8.encode(s).map(|c| c as u8));
            (
                bytes.collect::<std::result::Result<Vec<u8>, _>>()?,
                s_t as f32,
            )
        }
    };
    Ok(PackedBlocks {
        format: *format,
        shape,
        codes,
        scales,
        tensor_scale,
    })
}

/// The values of a packed tensor, as an f64 tensor of its shape on the CPU; a clear error
/// when the parts do not fit the format and shape.
pub fn unpack_blocks(p: &PackedBlocks) -> Result<Tensor> {
    let (grid, bits) = layout(&p.format, &p.shape)?;
    let n: usize = p.shape.iter().product();
    let want_codes = (n * bits as usize).div_ceil(8);
    let want_scales = if n == 0 { 0 } else { grid.count() };
    if p.codes.len() != want_codes || (n > 0 && p.scales.len() != want_scales) {
        bail!(
            "packed {}: shape {:?} needs {want_codes} code bytes and {want_scales} scale bytes, got {} and {}",
            p.format,
            p.shape,
            p.codes.len(),
            p.scales.len()
        );
    }
    let s_t = p.tensor_scale as f64;
    if matches!(p.format, Format::Nvfp4(_)) && !(s_t.is_finite() && s_t > 0.0) {
        bail!(
            "packed {}: tensor scale {s_t} is not positive and finite",
            p.format
        );
    }
    let mut values = Vec::with_capacity(n);
    for i in 0..n {
        let scale = p.scales[grid.block_of(i)];
        let code = get_code(&p.codes, i, bits);
        let v = match p.format {
            Format::Mx(m) => {
                if scale == 0xFF {
                    f64::NAN
                } else {
                    let unit = crate::format::grid::pow2(scale as i32 - 127);
                    match m.element().format() {
                        ElementFormat::Float(f) => f.decode(code) * unit,
                        ElementFormat::Fixed(f) => (code as u8 as i8) as f64 * f.quantum() * unit,
                    }
                }
            }
            _ => e2m1().decode(code) * (e4m3_saturating().decode(scale as u32) * s_t),
        };
        values.push(v);
    }
    Tensor::from_vec(values, p.shape.as_slice(), &Device::Cpu)
}

/// The safetensors metadata entries that describe a packed tensor named `name`: its format
/// (which names the axis), shape, element bits, block size and NVFP4's tensor scale, under
/// keys prefixed with `name.` so that several tensors share one file's metadata.
pub fn safetensors_metadata(name: &str, p: &PackedBlocks) -> Vec<(String, String)> {
    let block = match p.format {
        Format::Nvfp4(_) => NVFP4_BLOCK,
        _ => MX_BLOCK,
    };
    let bits = match p.format {
        Format::Mx(m) => m.element().bits(),
        _ => 4,
    };
    let shape: Vec<String> = p.shape.iter().map(|d| d.to_string()).collect();
    vec![
        (format!("{name}.format"), p.format.to_string()),
        (format!("{name}.shape"), shape.join(",")),
        (format!("{name}.element_bits"), bits.to_string()),
        (format!("{name}.block_size"), block.to_string()),
        (
            format!("{name}.code_order"),
            "row-major, LSB first".to_string(),
        ),
        (
            format!("{name}.tensor_scale"),
            format!("{:e}", p.tensor_scale),
        ),
    ]
}
