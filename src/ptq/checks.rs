//! What post-training quantization is checked for before any evaluation starts: every
//! requested format can be evaluated and its model saved, and the output directory can be
//! written. An evaluation takes from seconds to minutes; a format or a directory found bad
//! only after it would throw that work away and leave a partial set of results behind.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};

use super::block_file::along_inputs;
use super::model_file::stored_dtype;
use super::{block_scaled, row_settings, FormatRows};
use crate::format::Format;
use crate::quire::{Accumulate, GemmRule};
use crate::run_dir::open_in_output_dir;

/// The file name of the quantized model of `format` (`model-posit_8_0.safetensors`).
pub fn model_file_name(format: &Format) -> String {
    let name = format.to_string().replace(['<', '>', ','], "_");
    format!("model-{}.safetensors", name.trim_end_matches('_'))
}

/// Why post-training quantization cannot take `spec` (every reason: a row it cannot
/// evaluate, a model it cannot save), or `None` when it can.
pub fn unsupported(spec: &FormatRows) -> Option<String> {
    let format = &spec.format;
    if block_scaled(format) {
        if let Err(e) = along_inputs(format) {
            return Some(format!("{e:#}"));
        }
    }
    let mut reasons: Vec<String> = Vec::new();
    for setting in row_settings(spec) {
        if let Some(why) = row_refused(format, &setting) {
            let row = match spec.settings.is_empty() {
                true => String::new(),
                false => format!(" the row `{format} {setting}`"),
            };
            reasons.push(
                format!("{row} cannot be evaluated: {why}")
                    .trim()
                    .to_string(),
            );
        }
    }
    if let Err(e) = stored_dtype(format) {
        reasons.push(format!("its model cannot be saved: {e}"));
    }
    reasons.dedup();
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Why the row of `format` summed per `setting` cannot be evaluated, if it cannot: `f32`
/// is the row of block-scaled formats; every other setting is a GEMM rule of
/// [`crate::quire`] ([`GemmRule::new`] names why it does not apply).
fn row_refused(format: &Format, setting: &Accumulate) -> Option<String> {
    match (setting, block_scaled(format)) {
        (Accumulate::F32, true) => None,
        (Accumulate::F32, false) => Some(format!(
            "f32 rows (operands rounded to the format, f32 sums) are those of block-scaled formats; {format} takes naive, naive:<format> and fma:<format> (fma:fp32 sums in binary32)"
        )),
        (setting, _) => GemmRule::new(setting, format).err(),
    }
}

/// Checks every format of `formats` at once: each must be supported (see [`unsupported`])
/// and given once. The error lists every bad format and why.
pub fn check_formats(formats: &[FormatRows]) -> Result<()> {
    let mut problems = Vec::new();
    let mut files = HashSet::new();
    for spec in formats {
        let format = &spec.format;
        if !files.insert(model_file_name(format)) {
            problems.push(format!(
                "{format}: given more than once (list all of its rows in one format: `{format} naive naive:fp32`)"
            ));
        } else if let Some(why) = unsupported(spec) {
            problems.push(format!("{spec}: {why}"));
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "post-training quantization cannot take {} of the formats given:\n  {}\n\
         It evaluates posit formats whose maxpos fits the quire (a naive and a quire row), \
         float formats and clamped fixed point (a naive row), LNS (lns:ideal and lns:table rows), \
         MX and NVFP4 without `<dim=...>` (f32 sums of block-scaled operands), and saves each \
         model as bit patterns. A format followed by accumulate settings (`e4m3 naive:fp16 \
         fma:fp32`) gives one row per setting instead.",
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
