//! Quantized model files of the block-scaled formats (MX, NVFP4), whose elements have no
//! pattern without their block's scale.
//!
//! Post-training quantization blocks every weight along axis 1, its input channels: the
//! reduction axis of a linear layer's `(out, in)` weight and of a convolution's `(out, in,
//! kh, kw)` weight, as microxcaling's MX layers block them (and as [`super::arith`]
//! evaluates them). A weight (a parameter of rank two or more) is stored in the packed form
//! of [`mod@crate::ops::pack_blocks`]:
//!
//! * `NAME`: a `U8` tensor of the element codes, bit-packed LSB first in row-major order;
//! * `NAME.scales`: a `U8` tensor of one scale byte per block (MX's E8M0, NVFP4's E4M3);
//! * the metadata entries of [`safetensors_metadata`] under `NAME.`: the format with its
//!   axis (`mxfp8_e4m3<dim=1>`), the shape, element bits, block size, code order and NVFP4's
//!   f32 tensor scale (exactly: it is written in the shortest form that reads back to the
//!   same f32).
//!
//! Biases (rank one) stay f32: they enter the f32 accumulator of their layer's dot products,
//! which MX's dot product defines in f32 or wider, and are a few hundred values.
//!
//! Reading checks every part (dtypes, lengths against the shape, the format of each weight
//! against the file's, its axis, the tensor scale) and names the tensor and the problem.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use super::model_file::FORMAT_KEY;
use crate::format::{Format, Mx, Nvfp4};
use crate::ops::pack_blocks::{pack_blocks, safetensors_metadata, unpack_blocks, PackedBlocks};

/// Suffix of the tensor holding a packed weight's scale bytes.
pub const SCALES_SUFFIX: &str = ".scales";

/// Whether `format` is block-scaled (MX or NVFP4), so that its model files hold packed
/// weights.
pub fn is_block_scaled(format: &Format) -> bool {
    matches!(format, Format::Mx(_) | Format::Nvfp4(_))
}

/// `format` with its blocks along axis 1 (the weights' input channels), or why not: the
/// format must be block-scaled and name no axis of its own, since post-training
/// quantization blocks each tensor along its layer's reduction axis.
pub fn along_inputs(format: &Format) -> Result<Format> {
    let dim = match format {
        Format::Mx(m) => m.dim(),
        Format::Nvfp4(n) => n.dim(),
        other => bail!("{other} is not a block-scaled format"),
    };
    if dim != -1 {
        bail!(
            "{format} names its block axis; post-training quantization blocks every tensor along its layer's reduction axis (the input channels, axis 1): give the format without `<dim=...>`"
        );
    }
    Ok(match format {
        Format::Mx(m) => Format::Mx(Mx::new(m.element(), 1)),
        _ => Format::Nvfp4(Nvfp4::new(1)),
    })
}

/// The tensors of a block-scaled model file (sorted by name) and the metadata entries that
/// say how to read its packed weights back.
pub type PackedModel = (Vec<(String, Tensor)>, Vec<(String, String)>);

/// The tensors and metadata entries of a model whose parameters `tensors` are stored in
/// the block-scaled `format` (see the module docs).
pub fn encode(tensors: &HashMap<String, Tensor>, format: &Format) -> Result<PackedModel> {
    let along = along_inputs(format)?;
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let (mut out, mut metadata) = (Vec::new(), Vec::new());
    for name in names {
        let t = &tensors[name];
        if t.rank() < 2 {
            out.push((name.clone(), t.to_dtype(DType::F32)?));
            continue;
        }
        let packed = pack_blocks(t, &along)
            .with_context(|| format!("tensor `{name}` cannot be stored as {format}"))?;
        metadata.extend(safetensors_metadata(name, &packed));
        let bytes = |v: &[u8]| Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu);
        out.push((name.clone(), bytes(&packed.codes)?));
        out.push((format!("{name}{SCALES_SUFFIX}"), bytes(&packed.scales)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((out, metadata))
}

/// The parameters (f64) of a model file holding `tensors` and `metadata` in the
/// block-scaled `format`: every packed weight unpacked, every bias widened.
pub fn decode(
    mut tensors: HashMap<String, Tensor>,
    metadata: &HashMap<String, String>,
    format: &Format,
) -> Result<HashMap<String, Tensor>> {
    let along = along_inputs(format)?;
    let mut packed_names: Vec<&str> = metadata
        .keys()
        .filter(|k| k.as_str() != FORMAT_KEY)
        .filter_map(|k| k.strip_suffix(".format"))
        .collect();
    packed_names.sort();
    let mut values = HashMap::new();
    for name in packed_names {
        let packed = packed_weight(name, &mut tensors, metadata, &along)
            .with_context(|| format!("packed weight `{name}`"))?;
        let v = unpack_blocks(&packed).with_context(|| format!("packed weight `{name}`"))?;
        values.insert(name.to_string(), v);
    }
    for (name, t) in tensors {
        if name.ends_with(SCALES_SUFFIX) {
            bail!(
                "tensor `{name}` looks like a packed weight's scales, but the metadata has no `{}.format`",
                name.trim_end_matches(SCALES_SUFFIX)
            );
        }
        if !t.dtype().is_float() {
            bail!(
                "tensor `{name}` has dtype {:?} and no `{name}.format` metadata; a {format} model stores its biases as floats and its weights packed",
                t.dtype()
            );
        }
        values.insert(name, t.to_dtype(DType::F64)?);
    }
    Ok(values)
}

/// Takes the parts of the packed weight `name` out of `tensors` and checks them against
/// its metadata and the file's format (`along`, blocked along axis 1).
fn packed_weight(
    name: &str,
    tensors: &mut HashMap<String, Tensor>,
    metadata: &HashMap<String, String>,
    along: &Format,
) -> Result<PackedBlocks> {
    let entry = |key: &str| -> Result<&String> {
        metadata
            .get(&format!("{name}.{key}"))
            .ok_or_else(|| anyhow!("metadata `{name}.{key}` is missing"))
    };
    let text = entry("format")?;
    let format: Format = text
        .parse()
        .map_err(|e| anyhow!("metadata `{name}.format` = {text:?} does not name a format: {e}"))?;
    if format != *along {
        bail!(
            "metadata `{name}.format` = {text:?}, but this model's weights are {along} (the file's format, blocked along axis 1)"
        );
    }
    let shape_text = entry("shape")?;
    let shape = shape_text
        .split(',')
        .map(|d| d.trim().parse::<usize>())
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|e| anyhow!("metadata `{name}.shape` = {shape_text:?} is not a shape: {e}"))?;
    if shape.len() < 2 {
        bail!("metadata `{name}.shape` = {shape_text:?}: a packed weight has rank 2 or more");
    }
    let tensor_scale = match format {
        Format::Nvfp4(_) => {
            let text = entry("tensor_scale")?;
            text.parse::<f32>().map_err(|e| {
                anyhow!("metadata `{name}.tensor_scale` = {text:?} is not a number: {e}")
            })?
        }
        _ => 1.0,
    };
    let mut bytes = |tensor: &str| -> Result<Vec<u8>> {
        let t = tensors
            .remove(tensor)
            .ok_or_else(|| anyhow!("tensor `{tensor}` is missing"))?;
        if t.dtype() != DType::U8 || t.rank() != 1 {
            bail!(
                "tensor `{tensor}` must be a vector of U8 bytes, got {:?} of shape {:?}",
                t.dtype(),
                t.dims()
            );
        }
        Ok(t.to_vec1::<u8>()?)
    };
    let codes = bytes(name)?;
    let scales = bytes(&format!("{name}{SCALES_SUFFIX}"))?;
    Ok(PackedBlocks {
        format,
        shape,
        codes,
        scales,
        tensor_scale,
    })
}
