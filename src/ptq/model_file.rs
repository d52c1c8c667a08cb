//! Model files for post-training quantization: the trained f32 model (`model.safetensors`
//! as `qcandle train` writes it) and the quantized model (bit patterns plus the format).
//!
//! A quantized model holds every parameter as the bit patterns of its format and names the
//! format and the model in the safetensors metadata (`qcandle.format`, `qcandle.model`).
//! Patterns of at most 8 bits are stored as `U8` (a quarter of the f32 file), of 9 to 16
//! bits as `I16` (the 16-bit pattern; candle has no u16 dtype), wider ones as `U32`:
//!
//! * posit and float formats: the format's own patterns ([`crate::ops::pack()`]);
//! * clamped fixed point `fixed<wl,fl>`: the `wl`-bit two's complement integer `k` of the
//!   value `k · 2^-fl`. Fixed point without clamping (`noclamp`) has values beyond its word
//!   and cannot be stored; block floating point has no per-element pattern either;
//! * the block-scaled formats (MX, NVFP4): every weight packed with its block scales, the
//!   biases in f32 ([`super::block_file`]).
//!
//! Reading either kind checks everything a wrong number could hide behind, and names the
//! file and the problem: a missing, extra or wrongly shaped tensor (with the shape found and
//! the shape the model needs), a non-float tensor in an f32 model, format metadata that does
//! not parse or does not match the dtype its patterns are stored in (a `posit<16,1>` label
//! on `U8` data would otherwise decode to wrong values), a pattern the format does not have,
//! NaN or infinite parameters (a diverged run: every score computed from them would be
//! meaningless), and a truncated or corrupt file.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use super::block_file::{self, is_block_scaled};
use crate::format::grid::pow2;
use crate::format::Fixed;
use crate::format::Format;
use crate::io::safetensors_file::with_sorted_header;
use crate::io::write_atomically;
use crate::nn::ModelKind;
use crate::ops::pack::{pattern_dtype, unpack_as};
use crate::ops::{pack, quantize_no_grad, Quant};

/// Metadata key naming the format of a quantized model's patterns.
pub const FORMAT_KEY: &str = "qcandle.format";
/// Metadata key naming the model of the zoo.
pub const MODEL_KEY: &str = "qcandle.model";

/// A model's parameters by name, as float tensors holding the values they stand for.
#[derive(Debug, Clone)]
pub struct Weights {
    /// The model of the zoo.
    pub model: ModelKind,
    /// Every parameter by name: f32 as read from an f32 model file, f64 as decoded from a
    /// quantized one (32-bit posit and fixed-point values need more than f32's 24 bits).
    pub tensors: HashMap<String, Tensor>,
    /// The format the values were read from, for a quantized model file.
    pub format: Option<Format>,
}

impl Weights {
    /// The parameter `name`.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .with_context(|| format!("the model has no parameter `{name}`"))
    }

    /// The same parameters on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Weights> {
        let tensors = self
            .tensors
            .iter()
            .map(|(name, t)| Ok((name.clone(), t.to_device(device)?)))
            .collect::<Result<_>>()?;
        Ok(Weights {
            model: self.model,
            tensors,
            format: self.format,
        })
    }

    /// The device the parameters are on (the CPU for a model without parameters).
    pub fn device(&self) -> Device {
        self.tensors
            .values()
            .next()
            .map_or(Device::Cpu, |t| t.device().clone())
    }
}

/// A model rounded to a format and encoded as the patterns a quantized model file holds.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The model of the zoo.
    pub model: ModelKind,
    /// The format of the patterns.
    pub format: Format,
    /// The pattern tensors, sorted by name.
    pub tensors: Vec<(String, Tensor)>,
    /// Metadata entries beside the format and the model (how to read packed weights back).
    pub metadata: Vec<(String, String)>,
}

/// The dtype a quantized model file stores `format`'s patterns in (for the block-scaled
/// formats: their packed codes and scale bytes), or why the format has no patterns to store
/// (block floating point, fixed point without clamping).
pub fn stored_dtype(format: &Format) -> Result<DType> {
    match format {
        Format::Mx(_) | Format::Nvfp4(_) => {
            block_file::along_inputs(format)?;
            Ok(DType::U8)
        }
        Format::Fixed(f) if !f.clamp() => bail!(
            "{format} is not clamped, so its values can lie beyond its {}-bit word and have no pattern to store",
            f.wl()
        ),
        Format::Fixed(f) => Ok(dtype_of_bits(f.wl())),
        Format::Block(_) => bail!(
            "{format} scales whole blocks, so its elements have no pattern of their own to store"
        ),
        _ => Ok(pattern_dtype(format)?),
    }
}

/// The dtype holding patterns of `bits` bits.
fn dtype_of_bits(bits: u32) -> DType {
    match bits {
        0..=8 => DType::U8,
        9..=16 => DType::I16,
        _ => DType::U32,
    }
}

/// Rounds every parameter of `weights` to `format` (nearest-even) and encodes it as the
/// patterns a quantized model file holds.
pub fn encode(weights: &Weights, format: &Format) -> Result<Encoded> {
    stored_dtype(format)?;
    if is_block_scaled(format) {
        let (tensors, metadata) = block_file::encode(&weights.tensors, format)?;
        return Ok(Encoded {
            model: weights.model,
            format: *format,
            tensors,
            metadata,
        });
    }
    let mut names: Vec<&String> = weights.tensors.keys().collect();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let t = &weights.tensors[name];
        let patterns = match format {
            Format::Fixed(f) => fixed_patterns(t, f),
            _ => Ok(pack(t, format)?),
        }
        .with_context(|| format!("tensor `{name}` cannot be stored as {format}"))?;
        tensors.push((name.clone(), patterns));
    }
    Ok(Encoded {
        model: weights.model,
        format: *format,
        tensors,
        metadata: Vec::new(),
    })
}

/// Writes `encoded` with its format and model in the metadata, atomically. Returns the
/// file's size in bytes.
pub fn write_encoded(path: &Path, encoded: &Encoded) -> Result<u64> {
    let mut metadata = HashMap::from([
        (FORMAT_KEY.to_string(), encoded.format.to_string()),
        (MODEL_KEY.to_string(), encoded.model.to_string()),
    ]);
    metadata.extend(encoded.metadata.iter().cloned());
    let bytes = safetensors::serialize(
        encoded.tensors.iter().map(|(n, t)| (n.as_str(), t)),
        Some(metadata),
    )
    .context("cannot serialize the quantized model")?;
    let bytes = with_sorted_header(bytes)?;
    write_atomically(path, |tmp| {
        std::fs::write(tmp, &bytes).with_context(|| format!("cannot write {}", tmp.display()))
    })?;
    Ok(std::fs::metadata(path)
        .with_context(|| format!("cannot read back {}", path.display()))?
        .len())
}

/// Writes `weights` rounded to `format` as bit patterns, with the format and model in the
/// metadata, atomically. Returns the file's size in bytes.
pub fn write_quantized(path: &Path, weights: &Weights, format: &Format) -> Result<u64> {
    write_encoded(path, &encode(weights, format)?)
}

/// Reads a model file: an f32 model as `qcandle train` writes it, or a quantized one (its
/// format and model come from the metadata). `model` is required for f32 files and, for
/// quantized ones, must agree with the metadata when given.
pub fn read_weights(path: &Path, model: Option<ModelKind>) -> Result<Weights> {
    let (tensors, metadata) = read_file(path)?;
    let model = match (model, model_from_metadata(&metadata, path)?) {
        (Some(a), Some(b)) if a != b => {
            bail!("{}: holds a {b} model, not {a}", path.display())
        }
        (Some(m), _) | (None, Some(m)) => m,
        (None, None) => bail!(
            "{}: cannot tell which model this is; pass --arch or keep the run.json that `qcandle train` wrote beside it",
            path.display()
        ),
    };
    let format = format_from_metadata(&metadata, path)?;
    if let Some(f) = format.filter(is_block_scaled) {
        let values = block_file::decode(tensors, &metadata, &f)
            .with_context(|| format!("{}", path.display()))?;
        check_parameters(model, &values, path)?;
        check_finite(&values, path)?;
        return Ok(Weights {
            model,
            tensors: values,
            format,
        });
    }
    check_parameters(model, &tensors, path)?;
    let mut values = HashMap::new();
    for (name, t) in tensors {
        let v = match &format {
            Some(f) => decode(&t, f)
                .with_context(|| format!("{}: tensor `{name}`", path.display()))?,
            None if t.dtype().is_float() => t.to_dtype(DType::F32)?,
            None => bail!(
                "{}: tensor `{name}` has dtype {:?}; a model file holds float tensors (or a quantized model's patterns with `{FORMAT_KEY}` metadata)",
                path.display(),
                t.dtype()
            ),
        };
        values.insert(name, v);
    }
    check_finite(&values, path)?;
    Ok(Weights {
        model,
        tensors: values,
        format,
    })
}

/// Reads the safetensors file at `path`: its tensors and metadata.
fn read_file(path: &Path) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| {
        anyhow!(
            "{} is not a readable .safetensors file (truncated or corrupt?): {e}",
            path.display()
        )
    })?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let tensors =
        candle_core::safetensors::load_buffer(&bytes, &Device::Cpu).with_context(|| {
            format!(
                "{} is not a readable .safetensors file (truncated or corrupt?)",
                path.display()
            )
        })?;
    Ok((tensors, metadata))
}

/// The model named by the `qcandle.model` metadata, if any.
fn model_from_metadata(
    metadata: &HashMap<String, String>,
    path: &Path,
) -> Result<Option<ModelKind>> {
    let Some(name) = metadata.get(MODEL_KEY) else {
        return Ok(None);
    };
    let model = name.parse::<ModelKind>().map_err(|e| {
        anyhow!(
            "{}: metadata `{MODEL_KEY}` = {name:?} does not name a model: {e}",
            path.display()
        )
    })?;
    Ok(Some(model))
}

/// The format named by the `qcandle.format` metadata, if any; it must be one whose
/// patterns a model file can hold.
fn format_from_metadata(metadata: &HashMap<String, String>, path: &Path) -> Result<Option<Format>> {
    let Some(text) = metadata.get(FORMAT_KEY) else {
        return Ok(None);
    };
    let format = text.parse::<Format>().map_err(|e| {
        anyhow!(
            "{}: metadata `{FORMAT_KEY}` = {text:?} does not name a format: {e}",
            path.display()
        )
    })?;
    stored_dtype(&format).map_err(|e| {
        anyhow!(
            "{}: metadata `{FORMAT_KEY}` = {text:?}: {e}",
            path.display()
        )
    })?;
    Ok(Some(format))
}

/// Checks `tensors` against `model`'s parameters: same names, same shapes.
fn check_parameters(
    model: ModelKind,
    tensors: &HashMap<String, Tensor>,
    path: &Path,
) -> Result<()> {
    let expected = model.parameter_shapes()?;
    let missing: Vec<String> = expected
        .iter()
        .filter(|(n, _)| !tensors.contains_key(n))
        .map(|(n, shape)| format!("{n} (shape {shape:?})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "{}: not a {model} model: missing tensors {}",
            path.display(),
            missing.join(", ")
        );
    }
    let mut extra: Vec<&str> = tensors
        .keys()
        .filter(|n| !expected.iter().any(|(e, _)| e == *n))
        .map(String::as_str)
        .collect();
    if !extra.is_empty() {
        extra.sort();
        bail!(
            "{}: not a {model} model: unexpected tensors {}",
            path.display(),
            extra.join(", ")
        );
    }
    for (name, shape) in &expected {
        let got = tensors[name].dims();
        if got != shape.as_slice() {
            bail!(
                "{}: tensor `{name}` has shape {got:?}, but {model} needs {shape:?}",
                path.display()
            );
        }
    }
    Ok(())
}

/// The values (f64) of the patterns `t` of `format`, which must be stored in the dtype
/// [`stored_dtype`] gives.
fn decode(t: &Tensor, format: &Format) -> Result<Tensor> {
    let dtype = stored_dtype(format)?;
    if t.dtype() != dtype {
        bail!(
            "metadata `{FORMAT_KEY}` = {format} stores its patterns as {dtype:?}, but the tensor has dtype {:?}",
            t.dtype()
        );
    }
    match format {
        Format::Fixed(f) => fixed_values(t, f),
        _ => Ok(unpack_as(t, format, DType::F64)?),
    }
}

/// Rounds `t` to the clamped fixed-point format `f` and returns the `wl`-bit two's
/// complement integers of the values.
fn fixed_patterns(t: &Tensor, f: &Fixed) -> Result<Tensor> {
    let rounded = quantize_no_grad(&t.to_dtype(DType::F64)?, &Quant::new(Format::Fixed(*f)))?;
    let scale = pow2(f.fl());
    let mask = u32::MAX >> (32 - f.wl());
    let (lowest, highest) = (-pow2(f.wl() as i32 - 1), pow2(f.wl() as i32 - 1) - 1.0);
    let patterns = rounded
        .flatten_all()?
        .to_vec1::<f64>()?
        .into_iter()
        .map(|v| {
            let k = v * scale;
            if !(lowest..=highest).contains(&k) || k.fract() != 0.0 {
                bail!("{v} is not a value of {}", Format::Fixed(*f));
            }
            Ok((k as i64 as u32) & mask)
        })
        .collect::<Result<Vec<u32>>>()?;
    patterns_tensor(&patterns, dtype_of_bits(f.wl()), t.dims())
}

/// The values (f64) of the `wl`-bit two's complement integers `t` of the fixed-point
/// format `f`.
fn fixed_values(t: &Tensor, f: &Fixed) -> Result<Tensor> {
    let wl = f.wl();
    let scale = pow2(-f.fl());
    let shift = 32 - wl;
    let values = raw_patterns(t)?
        .into_iter()
        .map(|p| {
            if wl < 32 && p >> wl != 0 {
                bail!(
                    "pattern {p:#x} does not fit the {wl} bits of {}",
                    Format::Fixed(*f)
                );
            }
            let k = ((p << shift) as i32 >> shift) as i64;
            if f.symmetric() && k == -(1i64 << (wl - 1)) {
                bail!(
                    "pattern {p:#x} is not a value of {}, which excludes the most negative integer",
                    Format::Fixed(*f)
                );
            }
            Ok(k as f64 * scale)
        })
        .collect::<Result<Vec<f64>>>()?;
    Ok(Tensor::from_vec(values, t.dims(), &Device::Cpu)?)
}

/// The patterns of a `U8`, `I16` or `U32` tensor, as u32.
fn raw_patterns(t: &Tensor) -> Result<Vec<u32>> {
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::U8 => flat.to_vec1::<u8>()?.into_iter().map(u32::from).collect(),
        DType::I16 => flat
            .to_vec1::<i16>()?
            .into_iter()
            .map(|p| u32::from(p as u16))
            .collect(),
        DType::U32 => flat.to_vec1::<u32>()?,
        other => bail!("patterns must be U8, I16 or U32, got {other:?}"),
    })
}

/// A tensor of `dtype` (`U8`, `I16` or `U32`) holding `patterns` in `shape`.
fn patterns_tensor(patterns: &[u32], dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let dev = Device::Cpu;
    Ok(match dtype {
        DType::U8 => {
            let v: Vec<u8> = patterns.iter().map(|&p| p as u8).collect();
            Tensor::from_vec(v, shape, &dev)?
        }
        DType::I16 => {
            let v: Vec<i16> = patterns.iter().map(|&p| p as u16 as i16).collect();
            Tensor::from_vec(v, shape, &dev)?
        }
        _ => Tensor::from_vec(patterns.to_vec(), shape, &dev)?,
    })
}

/// Counts of NaN and infinite elements of `t`.
fn non_finite(t: &Tensor) -> Result<(usize, usize)> {
    let values = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    let nan = values.iter().filter(|v| v.is_nan()).count();
    let inf = values.iter().filter(|v| v.is_infinite()).count();
    Ok((nan, inf))
}

/// Refuses parameters holding NaN or infinities, naming every such tensor and its counts.
fn check_finite(tensors: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut bad = Vec::new();
    for name in names {
        let t = &tensors[name];
        let (nan, inf) = non_finite(t)?;
        if nan + inf > 0 {
            bad.push(format!(
                "`{name}` holds {nan} NaN and {inf} infinite of its {} values",
                t.elem_count()
            ));
        }
    }
    if !bad.is_empty() {
        bail!(
            "{}: non-finite parameters (did the training run diverge?): {}; post-training quantization needs finite weights",
            path.display(),
            bad.join("; ")
        );
    }
    Ok(())
}

/// The model of the zoo that the run directory holding `model_path` trained, from its
/// `run.json`, if there is one.
pub fn model_of_run(model_path: &Path) -> Result<Option<ModelKind>> {
    let Some(dir) = model_path.parent() else {
        return Ok(None);
    };
    if !dir.join("run.json").exists() {
        return Ok(None);
    }
    let run = crate::train::load_run(dir)?;
    let model = run.options.model.parse().map_err(|e| {
        anyhow!(
            "{}: the run's model {:?} is not a model of the zoo: {e}",
            dir.join("run.json").display(),
            run.options.model
        )
    })?;
    Ok(Some(model))
}
