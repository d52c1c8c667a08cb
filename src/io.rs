//! Tensor files: `.npy` (one array) and `.safetensors` (named tensors), read with candle's
//! readers and written atomically (to a temporary file in the target's directory, then
//! renamed), so an interrupted run never leaves a half-written output.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};

/// The tensor file kinds this crate reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorFile {
    /// NumPy `.npy`: one array.
    Npy,
    /// `.safetensors`: named tensors.
    Safetensors,
}

impl TensorFile {
    /// The kind of file a path names, from its extension.
    pub fn of(path: &Path) -> Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("npy") => Ok(TensorFile::Npy),
            Some("safetensors") => Ok(TensorFile::Safetensors),
            _ => bail!(
                "{}: unsupported file type (expected .npy or .safetensors)",
                path.display()
            ),
        }
    }
}

/// Reads the named tensors of a file (an `.npy` gives one tensor named after the file stem).
pub fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let kind = TensorFile::of(path)?;
    if !path.exists() {
        bail!("{}: no such file", path.display());
    }
    match kind {
        TensorFile::Npy => {
            let t = Tensor::read_npy(path)
                .with_context(|| format!("{}: not a readable .npy file", path.display()))?;
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("array")
                .to_string();
            Ok(vec![(name, t)])
        }
        TensorFile::Safetensors => {
            let map = candle_core::safetensors::load(path, &Device::Cpu)
                .with_context(|| format!("{}: not a readable .safetensors file", path.display()))?;
            let mut v: Vec<(String, Tensor)> = map.into_iter().collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            Ok(v)
        }
    }
}

/// A temporary path beside `path` (same directory, so the final rename is atomic).
fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("tmp");
    path.with_file_name(format!(".{name}.{}.partial.{ext}", std::process::id()))
}

/// Writes `path` through `write` atomically: the file appears complete or not at all.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
    }
    let tmp = temporary_beside(path);
    let result = write(&tmp).and_then(|()| {
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes named tensors to an `.npy` (exactly one tensor) or `.safetensors` file, atomically.
pub fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let kind = TensorFile::of(path)?;
    write_atomically(path, |tmp| match kind {
        TensorFile::Npy => {
            let [(_, t)] = tensors else {
                bail!(
                    "{}: an .npy file holds one array, got {}",
                    path.display(),
                    tensors.len()
                )
            };
            Ok(t.write_npy(tmp)?)
        }
        TensorFile::Safetensors => {
            let map: std::collections::HashMap<String, Tensor> = tensors.iter().cloned().collect();
            Ok(candle_core::safetensors::save(&map, tmp)?)
        }
    })
}
