//! Tensor files: `.npy` (one array) and `.safetensors` (named tensors and a metadata map).
//!
//! Both formats are parsed here from the file's bytes ([`npy::parse`],
//! [`safetensors_file::parse`]), so that nothing a header declares is believed before it
//! is checked against the file: a shape whose size overflows, a size larger than the data
//! the file holds, a truncated file, a repeated tensor name or an element type that cannot
//! be read is an error naming the file and the problem, never a panic, an abort on a huge
//! allocation, or an array misread in silence.
//!
//! Files are read whole into a [`RawFile`] (element type, shape and bytes per tensor), which
//! converts to candle tensors ([`read_tensors`]) or is rewritten with only its float tensors
//! changed ([`rewrite_float_tensors`]): every other tensor, whatever its type, and the
//! metadata map are written back byte for byte.
//!
//! Every output is written atomically ([`write_atomically`]): to a temporary file in the
//! target's directory, then renamed, so an interrupted or failed write never leaves a
//! half-written output. The output gets the permissions of any new file of the user (read
//! and write as the umask allows), whatever the writer did to the temporary file.

mod array;
pub mod npy;
pub mod safetensors_file;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use candle_core::Tensor;

pub(crate) use array::le_bytes;
pub use array::{data_size, element_count, is_roundable, Dtype, RawArray, RawFile};

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

/// Reads the named tensors of a file, sorted by name (an `.npy` gives one tensor named
/// after the file stem). Element types candle lacks are widened exactly (see
/// [`RawArray::to_tensor`]).
pub fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>> {
    Ok(read_tensors_with_metadata(path)?.0)
}

/// Named tensors, sorted by name, and a file's metadata map.
pub type TensorsAndMetadata = (Vec<(String, Tensor)>, HashMap<String, String>);

/// Like [`read_tensors`], with the file's metadata map (empty for an `.npy` file or a
/// `.safetensors` file without one).
pub fn read_tensors_with_metadata(path: &Path) -> Result<TensorsAndMetadata> {
    let kind = TensorFile::of(path)?;
    let bytes = read_file(path)?;
    let file = parse_file(kind, &bytes, path)?;
    let tensors = file
        .tensors
        .iter()
        .map(|(name, array)| {
            let tensor = array
                .to_tensor()
                .map_err(|e| anyhow!("{}: tensor `{name}`: {e:#}", path.display()))?;
            Ok((name.clone(), tensor))
        })
        .collect::<Result<_>>()?;
    Ok((tensors, file.metadata.unwrap_or_default()))
}

/// Writes named tensors to an `.npy` (exactly one tensor) or `.safetensors` file,
/// atomically.
pub fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let tensors = tensors
        .iter()
        .map(|(name, tensor)| {
            let array = RawArray::from_tensor(tensor)
                .map_err(|e| anyhow!("{}: tensor `{name}`: {e:#}", path.display()))?;
            Ok((name.clone(), array))
        })
        .collect::<Result<_>>()?;
    write_raw(
        path,
        &RawFile {
            tensors,
            metadata: None,
        },
    )
}

/// Writes `file` to an `.npy` (exactly one tensor; the metadata map is not stored) or
/// `.safetensors` file, atomically.
pub fn write_raw(path: &Path, file: &RawFile<'_>) -> Result<()> {
    let kind = TensorFile::of(path)?;
    let bytes = encode_file(kind, file).map_err(|e| anyhow!("{}: {e:#}", path.display()))?;
    write_atomically(path, |tmp| Ok(std::fs::write(tmp, &bytes)?))
}

/// What [`rewrite_float_tensors`] did with a file's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rewritten {
    /// Float tensors (F16, BF16, F32, F64) replaced by what the function returned.
    pub rounded: usize,
    /// Other tensors, copied byte for byte.
    pub copied: usize,
    /// Entries of the input's metadata map left out because the output is an `.npy` file.
    pub metadata_dropped: usize,
}

/// Reads `input`, replaces every F16, BF16, F32 and F64 tensor by `round` of it (which must
/// keep its element type and shape), and writes the result to `output` atomically. Every
/// other tensor and the metadata map are written back unchanged, in their own types.
/// Everything that can make the output unwritable (an `.npy` output for several tensors
/// or for a type NumPy lacks) is checked before the first tensor is rounded.
pub fn rewrite_float_tensors(
    input: &Path,
    output: &Path,
    mut round: impl FnMut(&Tensor) -> Result<Tensor>,
) -> Result<Rewritten> {
    let (input_kind, output_kind) = (TensorFile::of(input)?, TensorFile::of(output)?);
    let bytes = read_file(input)?;
    let mut file = parse_file(input_kind, &bytes, input)?;
    check_storable(output_kind, &file).map_err(|e| {
        anyhow!(
            "{} cannot hold the tensors of {}: {e:#}",
            output.display(),
            input.display()
        )
    })?;
    let mut done = Rewritten::default();
    for (name, array) in &mut file.tensors {
        if !is_roundable(array.dtype) {
            done.copied += 1;
            continue;
        }
        *array = round_array(array, &mut round)
            .map_err(|e| anyhow!("{}: tensor `{name}`: {e:#}", input.display()))?;
        done.rounded += 1;
    }
    if output_kind == TensorFile::Npy {
        done.metadata_dropped = file.metadata.take().map_or(0, |m| m.len());
    }
    write_raw(output, &file)?;
    Ok(done)
}

/// `round` of a float array, checked to keep its element type and shape.
fn round_array(
    array: &RawArray<'_>,
    round: &mut impl FnMut(&Tensor) -> Result<Tensor>,
) -> Result<RawArray<'static>> {
    let tensor = array.to_tensor()?;
    let rounded = round(&tensor)?;
    ensure!(
        rounded.dtype() == tensor.dtype() && rounded.dims() == tensor.dims(),
        "rounding turned {:?} {:?} into {:?} {:?}",
        tensor.dtype(),
        tensor.dims(),
        rounded.dtype(),
        rounded.dims()
    );
    RawArray::from_tensor(&rounded)
}

/// Checks that a file of `kind` can hold `file`'s tensors.
fn check_storable(kind: TensorFile, file: &RawFile<'_>) -> Result<()> {
    if kind == TensorFile::Npy {
        let [(_, array)] = file.tensors.as_slice() else {
            bail!("an .npy file holds one array, not {}", file.tensors.len());
        };
        npy::descr_of(array.dtype)?;
    }
    Ok(())
}

/// The bytes of a file of `kind` holding `file`.
fn encode_file(kind: TensorFile, file: &RawFile<'_>) -> Result<Vec<u8>> {
    check_storable(kind, file)?;
    match kind {
        TensorFile::Npy => npy::encode(&file.tensors[0].1),
        TensorFile::Safetensors => safetensors_file::encode(file),
    }
}

/// Parses the bytes of a tensor file read from `path`; errors name the path.
fn parse_file<'a>(kind: TensorFile, bytes: &'a [u8], path: &Path) -> Result<RawFile<'a>> {
    let parsed = match kind {
        TensorFile::Npy => npy::parse(bytes).map(|array| RawFile {
            tensors: vec![(npy_array_name(path), array)],
            metadata: None,
        }),
        TensorFile::Safetensors => safetensors_file::parse(bytes),
    };
    parsed.map_err(|e| anyhow!("{}: {e:#}", path.display()))
}

/// The name of an `.npy` file's array: the file stem.
fn npy_array_name(path: &Path) -> String {
    path.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("array")
        .to_string()
}

/// The bytes of the regular file at `path`; errors name the path and the problem.
fn read_file(path: &Path) -> Result<Vec<u8>> {
    let cannot_read = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::NotFound => anyhow!("{}: no such file", path.display()),
        _ => anyhow!("{}: cannot read: {e}", path.display()),
    };
    let metadata = std::fs::metadata(path).map_err(cannot_read)?;
    ensure!(
        !metadata.is_dir(),
        "{}: is a directory, not a tensor file",
        path.display()
    );
    ensure!(metadata.is_file(), "{}: not a regular file", path.display());
    std::fs::read(path).map_err(cannot_read)
}

/// A temporary path beside `path` (same directory, so the final rename is atomic).
/// Whether a file name is one of the temporary files [`write_atomically`] writes
/// (`.NAME.PID.partial.EXT`), or one of the `.tmpXXXXXX` files earlier versions' writers
/// used: what a writer killed mid-write leaves behind.
pub fn is_temporary_name(name: &str) -> bool {
    name.starts_with(".tmp") || (name.starts_with('.') && name.contains(".partial."))
}

fn temporary_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("tmp");
    path.with_file_name(format!(".{name}.{}.partial.{ext}", std::process::id()))
}

/// Writes `path` through `write` atomically: the file appears complete or not at all.
/// `write` gets a temporary path beside `path`, created empty with the permissions of any
/// new file of the user, which the output keeps even if `write` replaces that file. Errors
/// name `path` and the problem.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    write_through_temporary(path, write)
        .map_err(|e| anyhow!("cannot write {}: {e:#}", path.display()))
}

/// [`write_atomically`], without the path in its errors.
fn write_through_temporary(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure!(
            !dir.exists() || dir.is_dir(),
            "{} is not a directory",
            dir.display()
        );
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
    }
    let tmp = temporary_beside(path);
    let permissions = File::create(&tmp)
        .and_then(|f| f.metadata())
        .with_context(|| format!("cannot create {}", tmp.display()))?
        .permissions();
    let result = write(&tmp)
        .and_then(|()| {
            std::fs::set_permissions(&tmp, permissions)
                .with_context(|| format!("cannot set the permissions of {}", tmp.display()))
        })
        .and_then(|()| {
            std::fs::rename(&tmp, path)
                .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a quote or a
/// line break (format names hold commas: `posit<8,0>`); as it is otherwise.
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The fields of one CSV line written with [`csv_field`] (quoted fields unquoted).
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                fields.last_mut().expect("one field").push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(String::new()),
            (c, _) => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_files_written_are_the_ones_recognised_as_leftovers() {
        for name in ["model.safetensors", "run.json", "curves.png", "noext"] {
            let tmp = temporary_beside(Path::new("dir").join(name).as_path());
            let tmp = tmp.file_name().unwrap().to_string_lossy();
            assert!(is_temporary_name(&tmp), "{tmp}");
            assert!(!is_temporary_name(name), "{name}");
        }
    }
}
