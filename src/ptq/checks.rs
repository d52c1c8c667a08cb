//! What post-training quantization is checked for before any evaluation starts: every
//! requested format can be evaluated and its model saved, and the output directory can be
//! written. An evaluation takes from seconds to minutes; a format or a directory found bad
//! only after it would throw that work away and leave a partial set of results behind.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::block_file::{along_inputs, is_block_scaled};
use super::model_file::stored_dtype;
use super::{methods, Method};
use crate::format::Format;
use crate::run_dir::open_in_output_dir;

/// The file name of the quantized model of `format` (`model-posit_8_0.safetensors`).
pub fn model_file_name(format: &Format) -> String {
    let name = format.to_string().replace(['<', '>', ','], "_");
    format!("model-{}.safetensors", name.trim_end_matches('_'))
}

/// Why post-training quantization cannot take `format` (every reason: a row it cannot
/// evaluate, a model it cannot save), or `None` when it can.
pub fn unsupported(format: &Format) -> Option<String> {
    if is_block_scaled(format) {
        return along_inputs(format).err().map(|e| format!("{e:#}"));
    }
    let mut reasons: Vec<String> = Vec::new();
    for method in methods(std::slice::from_ref(format)) {
        if let Method::Format { acc, .. } = method {
            if let Err(e) = acc.check(format) {
                reasons.push(format!("cannot be evaluated: {}", plain(e)));
            }
        }
    }
    if let Err(e) = stored_dtype(format) {
        reasons.push(format!("its model cannot be saved: {e}"));
    }
    reasons.dedup();
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Checks every format of `formats` at once: each must be supported (see [`unsupported`])
/// and given once. The error lists every bad format and why.
pub fn check_formats(formats: &[Format]) -> Result<()> {
    let mut problems = Vec::new();
    let mut files = HashSet::new();
    for format in formats {
        if !files.insert(model_file_name(format)) {
            problems.push(format!("{format}: given more than once"));
        } else if let Some(why) = unsupported(format) {
            problems.push(format!("{format}: {why}"));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "post-training quantization cannot take {} of the formats given:\n  {}\n\
         It evaluates posit formats whose maxpos fits the quire (a naive and a quire row), \
         float formats and clamped fixed point (a naive row), MX and NVFP4 without `<dim=...>` \
         (f32 sums of block-scaled operands), and saves each model as bit patterns.",
        problems.len(),
        problems.join("\n  ")
    )
}

/// Creates the directory `dir` (and its parents) and checks that a file can be written
/// in it, by writing and removing a small probe file (errors as
/// [`crate::run_dir::open_in_output_dir`]'s).
pub fn prepare_out_dir(dir: &Path) -> Result<()> {
    let name = format!(".qcandle-probe.{}", std::process::id());
    let probe = dir.join(&name);
    let written = open_in_output_dir(dir, &name)?.write_all(b"probe");
    let removed = std::fs::remove_file(&probe);
    written.with_context(|| format!("cannot write in the output directory {}", dir.display()))?;
    removed.with_context(|| {
        format!(
            "cannot remove the probe file {} from the output directory",
            probe.display()
        )
    })
}

/// The message of a candle error without the backtrace that `RUST_BACKTRACE` attaches.
fn plain(e: candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => plain(*inner),
        other => other.to_string(),
    }
}
