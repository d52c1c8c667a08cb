//! Model files for post-training quantization: the trained f32 model (`model.safetensors`
//! as `qcandle train` writes it) and the quantized model (bit patterns plus the format).
//!
//! A quantized model holds every parameter as the bit patterns of its format (`u8` for
//! formats of at most 8 bits, so a quarter of the f32 file) and names the format and the
//! model in the safetensors metadata (`qcandle.format`, `qcandle.model`). Reading either
//! kind checks the tensors against the model's parameters: a missing, extra or wrongly
//! shaped tensor, a non-float tensor in an f32 model, and a truncated or corrupt file are
//! errors that name the problem.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::format::Format;
use crate::io::write_atomically;
use crate::nn::ModelKind;
use crate::ops::{pack, unpack};

/// Metadata key naming the format of a quantized model's patterns.
pub const FORMAT_KEY: &str = "qcandle.format";
/// Metadata key naming the model of the zoo.
pub const MODEL_KEY: &str = "qcandle.model";

/// A model's parameters by name, as f32 tensors holding the values they stand for.
#[derive(Debug, Clone)]
pub struct Weights {
    /// The model of the zoo.
    pub model: ModelKind,
    /// Every parameter by name.
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
}

/// Reads the safetensors file at `path`: its tensors and metadata.
fn read_file(path: &Path) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| {
        anyhow::anyhow!(
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

/// Checks `tensors` against `model`'s parameters: same names, same shapes.
fn check_parameters(
    model: ModelKind,
    tensors: &HashMap<String, Tensor>,
    path: &Path,
) -> Result<()> {
    let expected = model.parameter_shapes()?;
    let missing: Vec<&str> = expected
        .iter()
        .filter(|(n, _)| !tensors.contains_key(n))
        .map(|(n, _)| n.as_str())
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

/// Reads a model file: an f32 model as `qcandle train` writes it, or a quantized one (its
/// format and model come from the metadata). `model` is required for f32 files and, for
/// quantized ones, must agree with the metadata when given.
pub fn read_weights(path: &Path, model: Option<ModelKind>) -> Result<Weights> {
    let (tensors, metadata) = read_file(path)?;
    let stored_model = metadata
        .get(MODEL_KEY)
        .map(|m| m.parse::<ModelKind>())
        .transpose()?;
    let model = match (model, stored_model) {
        (Some(a), Some(b)) if a != b => {
            bail!("{}: holds a {b} model, not {a}", path.display())
        }
        (Some(m), _) | (None, Some(m)) => m,
        (None, None) => bail!(
            "{}: cannot tell which model this is; pass --arch or keep the run.json that `qcandle train` wrote beside it",
            path.display()
        ),
    };
    check_parameters(model, &tensors, path)?;
    let format = match metadata.get(FORMAT_KEY) {
        Some(f) => Some(
            f.parse::<Format>()
                .with_context(|| format!("{}: bad `{FORMAT_KEY}` metadata", path.display()))?,
        ),
        None => None,
    };
    let mut values = HashMap::new();
    for (name, t) in tensors {
        let v = match &format {
            Some(f) => unpack(&t, f).with_context(|| format!("{}: tensor `{name}`", path.display()))?,
            None if t.dtype().is_float() => t.to_dtype(DType::F32)?,
            None => bail!(
                "{}: tensor `{name}` has dtype {:?}; a model file holds float tensors (or a quantized model's patterns with `{FORMAT_KEY}` metadata)",
                path.display(),
                t.dtype()
            ),
        };
        values.insert(name, v);
    }
    Ok(Weights {
        model,
        tensors: values,
        format,
    })
}

/// Writes `weights` rounded to `format` as bit patterns, with the format and model in the
/// metadata, atomically. Returns the file's size in bytes.
pub fn write_quantized(path: &Path, weights: &Weights, format: &Format) -> Result<u64> {
    let mut names: Vec<&String> = weights.tensors.keys().collect();
    names.sort();
    let mut packed = Vec::with_capacity(names.len());
    for name in names {
        packed.push((name.clone(), pack(&weights.tensors[name], format)?));
    }
    let metadata = HashMap::from([
        (FORMAT_KEY.to_string(), format.to_string()),
        (MODEL_KEY.to_string(), weights.model.to_string()),
    ]);
    write_atomically(path, |tmp| {
        safetensors::serialize_to_file(
            packed.iter().map(|(n, t)| (n.as_str(), t)),
            Some(metadata),
            tmp,
        )
        .with_context(|| format!("cannot write {}", tmp.display()))
    })?;
    Ok(std::fs::metadata(path)?.len())
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
    Ok(Some(run.options.model.parse()?))
}
