//! Post-training quantization: a trained f32 model evaluated in other arithmetics.
//!
//! Deep PeNSieve's flow, made exact: the trained weights are rounded to a posit format
//! (posit rounding already clips to [minpos, maxpos]: no nonzero weight becomes 0 and none
//! overflows) and the test set is evaluated with posit arithmetic, either naive (every
//! multiply and add rounded, `k` ascending) or with a quire (every product of a dot product
//! and the bias accumulated exactly, one rounding per output). Beside them: the f32 model
//! itself, fp16 and int8 (see [`arith`] for the exact definition of each).
//!
//! Ranking: top-1 and top-5 come from a stable sort of the logits, so among equal logits
//! the lower class index ranks first ([`crate::train::rank_of`]). Low-precision logits tie
//! often (a few percent of posit<8,0> test images have two classes sharing the top logit), so
//! the tie rule moves top-1 by more than the gaps between methods; the report gives the
//! share of images whose top logit is tied.
//!
//! Rows: each `--format` is a [`FormatRows`]: a format alone gives its default rows, a format
//! followed by accumulate settings (`e4m3 naive:fp16 fma:fp32`) one row per setting
//! ([`spec`]). What each takes, checked for every requested format and row before anything
//! is evaluated or written ([`check_formats`]):
//!
//! | format                                      | default rows         | rows it can be asked for | saved model                    |
//! |---------------------------------------------|----------------------|--------------------------|--------------------------------|
//! | posit whose maxpos fits the quire (2^448)   | naive, quire         | naive, quire, `naive:<A>`, `fma:<A>` | posit patterns          |
//! | float (`float<e,m>`, fp16, bf16, e4m3, ...) | naive                | naive, `naive:<A>`, `fma:<A>` | float patterns                |
//! | clamped fixed point (`fixed<wl,fl>`)        | naive                | naive, `naive:<A>`, `fma:<A>` | two's complement integers     |
//! | LNS (`lns<w,f>`)                            | lns:ideal, lns:table | `lns:ideal`, `lns:truncated`, `lns:table[:g:b]` | LNS patterns  |
//! | fixed point without clamping (`noclamp`)    | refused              | refused                  | none: values beyond its word   |
//! | block floating point                        | refused: it rounds whole blocks, not single operations | refused | none |
//! | MX, NVFP4 (without `<dim=...>`)             | f32: f32 sums of block-scaled operands | f32     | packed codes and scales, f32 biases |
//!
//! `<A>` is an elementwise accumulator format (`fp16`, `bf16`, `fp32`, `posit<16,1>`, ...);
//! `fma:<A>` also needs the operand products exact in f64 (formats of at most 26 significand
//! bits). A row that cannot apply is an error naming why (`e4m3 quire`: no quire; `lns<8,4>
//! naive`: LNS sums are `lns:<impl>`; `e4m3 f32`: f32 rows are those of block-scaled formats).
//! [`arith`] defines every row.
//!
//! The table above is that of the models made of convolution and linear stages, which ptq
//! replays stage by stage ([`arith`]). A model without such a plan (the transformer) is
//! evaluated by building it with one config per row instead ([`built`]): float32, float16
//! and, per format, f32, naive and quire sums where the format takes them (`lns:ideal` and
//! `lns:table` for LNS), rows that do not apply left out with a note in the report; a format
//! with settings gives one row per setting.
//!
//! A model holding NaN or infinite parameters is refused when it is read (see
//! [`model_file`]): the scores of a diverged model would be meaningless, and formats
//! without NaN could not save it.
//!
//! Device: the methods run where the weights are ([`Weights::to_device`]; [`run`] takes the
//! device), each test batch moved there as it is read. On a CUDA device float32 and float16
//! run there (candle's convolution and matrix product, the CUDA quantize kernel); int8 runs
//! its integer convolutions and products there but rounds each layer's input to its integer
//! codes on the host. The posit and float rows use [`crate::quire`]'s GEMMs: linear layers
//! in posits of at most 8 bits run on the device ([`crate::quire::ops`]), everything else
//! (every convolution, other formats, every `naive:<A>`, `fma:<A>` and `lns:<impl>` row) is
//! computed on the host and its result copied back, with the same bits either way.

pub mod arith;
pub mod block_file;
pub mod built;
pub mod checks;
pub mod model_file;
pub mod spec;

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::data::Dataset;
use crate::format::Format;
use crate::quire::{Accumulate, Accumulation, LnsSum};
use arith::{run_plan, Arithmetic, BlockScaled, Float16, Float32, Int8, PositGemm, RuleGemm};
pub use checks::{check_formats, model_file_name, prepare_out_dir};
pub use model_file::{encode, read_weights, write_encoded, write_quantized, Encoded, Weights};
pub use spec::FormatRows;

/// Number of training images the int8 activation scales are calibrated on.
pub const CALIBRATION_IMAGES: usize = 1000;

/// An arithmetic a model is evaluated in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The model as trained.
    Float32,
    /// fp16 weights and activations, f32 accumulation.
    Float16,
    /// Per-tensor symmetric int8 weights and activations, exact integer accumulation.
    Int8,
    /// Weights and activations in `format`, layers computed with `acc`.
    Format {
        /// The number format.
        format: Format,
        /// Naive or quire accumulation.
        acc: Accumulation,
    },
    /// Weights and layer inputs in a block-scaled `format` (MX, NVFP4) along the reduction
    /// axis, f32 products and sums ([`BlockScaled`]).
    BlockScaled {
        /// The block-scaled format.
        format: Format,
    },
    /// Weights and activations in `format`, layers computed by the GEMM rule of `accumulate`
    /// (`naive:<A>`, `fma:<A>`, `lns:<impl>`; [`RuleGemm`]).
    Rule {
        /// The number format.
        format: Format,
        /// The accumulate setting of every layer.
        accumulate: Accumulate,
    },
    /// A model without a plan built with weights and activations in `format` and its GEMMs
    /// summed per `accumulate` ([`built`]).
    Config {
        /// The number format.
        format: Format,
        /// How the linear layers and attention's products sum.
        accumulate: Accumulate,
    },
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Method::Float32 => f.write_str("float32"),
            Method::Float16 => f.write_str("float16"),
            Method::Int8 => f.write_str("int8"),
            Method::Format { format, acc } => {
                let how = match acc {
                    Accumulation::Naive => "naive",
                    Accumulation::Quire => "quire",
                };
                write!(f, "{format} {how}")
            }
            Method::BlockScaled { format } => write!(f, "{format} f32"),
            Method::Rule { format, accumulate } | Method::Config { format, accumulate } => {
                write!(f, "{format} {}", spec::setting_name(accumulate))
            }
        }
    }
}

/// Whether `format` is block-scaled along one axis (MX, NVFP4), whose rows sum in f32.
fn block_scaled(format: &Format) -> bool {
    matches!(format, Format::Mx(_) | Format::Nvfp4(_))
}

/// The settings of `format`'s default rows: `f32` for a block-scaled format, `naive` and
/// `quire` for a posit, `lns:ideal` and `lns:table` for LNS, `naive` otherwise.
pub fn default_settings(format: &Format) -> Vec<Accumulate> {
    match format {
        f if block_scaled(f) => vec![Accumulate::F32],
        Format::Posit(_) => vec![Accumulate::Naive, Accumulate::Quire],
        Format::Lns(_) => vec![
            Accumulate::Lns(LnsSum::Ideal),
            Accumulate::Lns(LnsSum::Table(None)),
        ],
        _ => vec![Accumulate::Naive],
    }
}

/// The settings of `spec`'s rows: those it names, else its format's defaults.
pub fn row_settings(spec: &FormatRows) -> Vec<Accumulate> {
    match spec.settings.is_empty() {
        true => default_settings(&spec.format),
        false => spec.settings.clone(),
    }
}

/// The row of a model with a plan for `format` summed per `setting`: `f32` is the
/// block-scaled row, `naive` and `quire` the posit GEMMs of [`PositGemm`], every other
/// setting a [`Method::Rule`]. Whether it applies is [`check_formats`]'s question.
pub fn plan_method(format: Format, setting: Accumulate) -> Method {
    match setting {
        Accumulate::F32 => Method::BlockScaled { format },
        Accumulate::Naive => Method::Format {
            format,
            acc: Accumulation::Naive,
        },
        Accumulate::Quire => Method::Format {
            format,
            acc: Accumulation::Quire,
        },
        accumulate => Method::Rule { format, accumulate },
    }
}

/// The methods evaluated for `formats` on a model with a plan: float32, float16, int8, then
/// each format's rows ([`row_settings`], [`plan_method`]): by default naive and (for posits)
/// quire, f32 sums for a block-scaled format, `lns:ideal` and `lns:table` for LNS.
pub fn methods(formats: &[FormatRows]) -> Vec<Method> {
    let mut m = vec![Method::Float32, Method::Float16, Method::Int8];
    for spec in formats {
        for setting in row_settings(spec) {
            m.push(plan_method(spec.format, setting));
        }
    }
    m
}

/// Test-set accuracy of one method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// Top-1 accuracy in percent (ties to the lower class index).
    pub top1: f64,
    /// Top-5 accuracy in percent.
    pub top5: f64,
    /// Percent of test images whose largest logit is shared by two or more classes.
    pub tied: f64,
    /// Top-1 if every tie went against the label (the label's logit must be the only
    /// largest), and if every tie went for it (no logit larger than the label's): the range
    /// any tie rule can give.
    pub top1_range: (f64, f64),
    /// Wall-clock seconds of the evaluation.
    pub seconds: f64,
}

/// Whether the largest value of `logits` occurs more than once.
pub fn top_is_tied(logits: &[f64]) -> bool {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    logits.iter().filter(|&&x| x == max).count() > 1
}

/// Evaluates `arith` on the test split of `data`, on the device of `weights` (which `arith`
/// was made from).
pub fn evaluate(weights: &Weights, arith: &dyn Arithmetic, data: &Dataset) -> Result<Score> {
    let device = weights.device();
    score(data, &device, |images: &Tensor| {
        let images = images.to_device(&device)?;
        Ok(run_plan(weights.model, arith, &images, |_, _| Ok(()))?)
    })
}

/// The score of `logits_of` (a batch of test inputs to its logits) on the test split of
/// `data`, read in batches of 1000.
pub fn score(
    data: &Dataset,
    device: &Device,
    logits_of: impl Fn(&Tensor) -> Result<Tensor>,
) -> Result<Score> {
    let start = Instant::now();
    let (mut top1, mut top5, mut tied, mut n) = (0usize, 0usize, 0usize, 0usize);
    let (mut lost, mut won) = (0usize, 0usize);
    for batch in data.test_batches(1000)? {
        let (images, labels) = batch?;
        let logits = logits_of(&images.to_device(device)?)?
            .to_dtype(DType::F64)?
            .to_vec2::<f64>()?;
        for (row, &label) in logits.iter().zip(&labels.to_vec1::<u32>()?) {
            let rank = crate::train::rank_of(row, label as usize);
            top1 += usize::from(rank < 1);
            top5 += usize::from(rank < 5);
            tied += usize::from(top_is_tied(row));
            let t = row[label as usize];
            let above = row.iter().filter(|&&x| x > t).count();
            let equal = row.iter().filter(|&&x| x == t).count();
            won += usize::from(above == 0 && !t.is_nan());
            lost += usize::from(above == 0 && equal == 1);
        }
        n += labels.dim(0)?;
    }
    let pct = |k: usize| 100.0 * k as f64 / n.max(1) as f64;
    Ok(Score {
        top1: pct(top1),
        top5: pct(top5),
        tied: pct(tied),
        top1_range: (pct(lost), pct(won)),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The arithmetic of `method` for `weights`, on their device; int8 is calibrated on the first
/// [`CALIBRATION_IMAGES`] training images of `data`.
pub fn arithmetic(
    method: Method,
    weights: &Weights,
    data: &Dataset,
) -> Result<Box<dyn Arithmetic>> {
    Ok(match method {
        Method::Float32 => Box::new(Float32::new(weights)?),
        Method::Float16 => Box::new(Float16::new(weights)?),
        Method::Int8 => {
            let n = CALIBRATION_IMAGES.min(data.train_len());
            let calibration = data
                .train_images
                .narrow(0, 0, n)?
                .to_device(&weights.device())?;
            Box::new(Int8::new(weights, &calibration)?)
        }
        Method::Format { format, acc } => Box::new(PositGemm::new(weights, format, acc)?),
        Method::Rule { format, accumulate } => {
            Box::new(RuleGemm::new(weights, format, accumulate)?)
        }
        Method::BlockScaled { format } => Box::new(BlockScaled::new(weights, format)?),
        Method::Config { .. } => {
            anyhow::bail!("{method} is a row of models built from a config ([`built`])")
        }
    })
}

/// Evaluates every method of [`methods`]`(formats)`, calling `progress` after each.
/// The formats are checked first ([`check_formats`]): a bad one fails before any row.
pub fn evaluate_methods(
    weights: &Weights,
    data: &Dataset,
    formats: &[FormatRows],
    mut progress: impl FnMut(Method, &Score),
) -> Result<Vec<(Method, Score)>> {
    check_formats(formats)?;
    let mut rows = Vec::new();
    let methods = match weights.model.has_plan() {
        true => methods(formats),
        false => built::methods(formats).0,
    };
    for method in methods {
        let score = match weights.model.has_plan() {
            true => {
                let arith =
                    arithmetic(method, weights, data).with_context(|| format!("{method}"))?;
                evaluate(weights, arith.as_ref(), data)
            }
            false => built::evaluate(weights, method, data),
        }
        .with_context(|| format!("{method}"))?;
        progress(method, &score);
        rows.push((method, score));
    }
    Ok(rows)
}

/// The rows as a markdown table.
pub fn markdown(rows: &[(Method, Score)]) -> String {
    let mut s = String::from(
        "| method | top-1 % | top-5 % | top logit tied % | top-1 range over tie rules |\n|---|---|---|---|---|\n",
    );
    for (m, r) in rows {
        s.push_str(&format!(
            "| {m} | {:.2} | {:.2} | {:.2} | {:.2}–{:.2} |\n",
            r.top1, r.top5, r.tied, r.top1_range.0, r.top1_range.1
        ));
    }
    s
}

/// The rows as CSV: `method,top1,top5,tied,top1_ties_lost,top1_ties_won,seconds` (a method
/// whose format holds a comma is quoted: `"posit<8,0> quire"`).
pub fn csv(rows: &[(Method, Score)]) -> String {
    let mut s = String::from("method,top1,top5,tied,top1_ties_lost,top1_ties_won,seconds\n");
    for (m, r) in rows {
        s.push_str(&format!(
            "{},{:.2},{:.2},{:.2},{:.2},{:.2},{:.3}\n",
            crate::io::csv_field(&m.to_string()),
            r.top1,
            r.top5,
            r.tied,
            r.top1_range.0,
            r.top1_range.1,
            r.seconds
        ));
    }
    s
}

/// What [`run`] evaluated and wrote.
#[derive(Debug, Clone)]
pub struct Report {
    /// One row per method, in [`methods`] order.
    pub rows: Vec<(Method, Score)>,
    /// The markdown report written to `ptq.md`: the table, the tie rule and each saved model.
    pub markdown: String,
}

/// The whole post-training quantization step: evaluates every method of
/// [`methods`]`(formats)` (calling `progress` after each), writes `ptq.md`, `ptq.csv` and one
/// quantized model per format under `out`, and returns the rows and the report. Before the
/// first evaluation the formats are checked, every model is encoded and `out` is created and
/// probed, so a bad format, a weight a format cannot store or an unwritable `out` costs no
/// evaluation. `f32_bytes` is the size of the f32 model the saved ones are compared with.
/// The methods are evaluated on `device` (see the module docs); the saved models are the
/// same on any device.
pub fn run(
    weights: &Weights,
    data: &Dataset,
    formats: &[FormatRows],
    out: &std::path::Path,
    f32_bytes: u64,
    device: &candle_core::Device,
    progress: impl FnMut(Method, &Score),
) -> Result<Report> {
    check_formats(formats)?;
    let models = formats
        .iter()
        .map(|f| encode(weights, &f.format))
        .collect::<Result<Vec<_>>>()?;
    prepare_out_dir(out)?;
    let on_device = weights.to_device(device)?;
    let rows = evaluate_methods(&on_device, data, formats, progress)?;
    let mut report = markdown(&rows);
    report.push_str(
        "\nTop-1/top-5 ties go to the lower class index (a stable sort of the logits).\n",
    );
    if !weights.model.has_plan() {
        report.push_str(
            "Rows built from configs (weights and activations rounded to the format, the linear layers and attention's products summed per the row's accumulate setting; see `qcandle::ptq::built`).\n",
        );
        for note in built::methods(formats).1 {
            report.push_str(&format!("{note}\n"));
        }
    }
    for model in &models {
        let path = out.join(model_file_name(&model.format));
        let bytes = write_encoded(&path, model)?;
        report.push_str(&format!(
            "{} model: {} ({bytes} bytes; the f32 model {f32_bytes} bytes, {:.3}x)\n",
            model.format,
            path.display(),
            bytes as f64 / f32_bytes as f64
        ));
    }
    let write_text = |name: &str, text: &str| {
        crate::io::write_atomically(&out.join(name), |p| {
            std::fs::write(p, text).with_context(|| format!("cannot write {}", p.display()))
        })
    };
    write_text("ptq.md", &report)?;
    write_text("ptq.csv", &csv(&rows))?;
    Ok(Report {
        rows,
        markdown: report,
    })
}
