//! Post-training quantization of a model without a stage plan (the transformer): each row
//! builds the model through the zoo with a config of its own and evaluates it as training
//! does.
//!
//! The convolution-and-linear models replay their [plan](crate::nn::ModelKind::plan) in each
//! arithmetic ([`super::arith`]). A transformer has layers no plan describes (embeddings,
//! norms, attention, GELU), so its rows are stated as configs instead, and the model's own
//! quantized blocks compute them: the stored weights are rounded to the row's `weight`
//! format as they load ([`crate::nn::quantized_var_builder`]), every block's output is
//! rounded to its `activation` format, and the linear layers and attention's products sum
//! per the row's `accumulate` setting ([`crate::quire`]); norms, softmax, GELU and residual
//! sums compute in f32 between the roundings, as they do in training. The rows:
//!
//! | row | weight, activation | accumulate |
//! |---|---|---|
//! | float32 | (none) | f32: the model as trained |
//! | float16 | fp16 | f32 |
//! | `F f32` | `F` | f32 |
//! | `F naive` | `F` | naive: every product and partial sum rounded to `F` (formats that round single operations) |
//! | `F quire` | `F` | quire: exact sums, one rounding per output (posits whose maxpos fits the quire) |
//! | `F lns:ideal`, `F lns:table` | `F` | LNS: exact products, Gaussian-log sums (LNS formats, in place of naive and quire) |
//! | `F <setting>` | `F` | a format given with settings (`bf16 naive:fp32 fma:fp32`): one row per setting of [`crate::quire::accumulate`] the format takes (checked as for the other models: `f32` only for block-scaled formats, whose f32 row is their default) |
//!
//! All rounding is to nearest (ties to even). A block-scaled `F` rounds each tensor in
//! blocks along its last axis, which is the reduction axis of every linear layer's weight
//! and input. int8 (per-tensor scales calibrated at each plan stage's input) has no such
//! statement and is omitted, as are the `naive` and `quire` rows of formats that cannot take
//! them; [`methods`] gives a note for each row left out. The tokens are the input: they are
//! not rounded. Evaluation runs the test split in batches of 1000 (as training's test pass
//! does), so the float32 row is the trained model's test accuracy, bit for bit.

use anyhow::{Context, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;

use super::{FormatRows, Method, Score};
use crate::data::Dataset;
use crate::format::Format;
use crate::nn::config::{Categories, QuantSpec};
use crate::nn::{quantized_var_builder, QConfig};
use crate::quire::{Accumulate, GemmRule, LnsSum};

/// The rows for `formats` (see the module docs) and a note for each row left out.
pub fn methods(formats: &[FormatRows]) -> (Vec<Method>, Vec<String>) {
    let mut rows = vec![Method::Float32, Method::Float16];
    let mut notes = vec![
        "int8 omitted: its per-tensor scales are calibrated at the inputs of a convolution and linear plan, which this model does not have".to_string(),
    ];
    for spec in formats {
        let format = spec.format;
        if !spec.settings.is_empty() {
            // Checked by check_formats: every one applies.
            for &accumulate in &spec.settings {
                rows.push(Method::Config { format, accumulate });
            }
            continue;
        }
        rows.push(Method::Config {
            format,
            accumulate: Accumulate::F32,
        });
        let tried = match format {
            Format::Lns(_) => [
                Accumulate::Lns(LnsSum::Ideal),
                Accumulate::Lns(LnsSum::Table(None)),
            ],
            _ => [Accumulate::Naive, Accumulate::Quire],
        };
        for accumulate in tried {
            match GemmRule::new(&accumulate, &format) {
                Ok(_) => rows.push(Method::Config { format, accumulate }),
                Err(why) => notes.push(format!("{format} {accumulate} omitted: {why}")),
            }
        }
    }
    (rows, notes)
}

/// The config of a row: `None` for float32 (nothing rounded), else the row's format in the
/// weight and activation categories (and in error and gradient, which a rule checks but
/// evaluation does not use) with its `accumulate` setting. Rows of the plan models only
/// (int8, block-scaled) are an error.
pub fn row_config(method: Method) -> Result<QConfig> {
    let (format, accumulate) = match method {
        Method::Float32 => return Ok(QConfig::float32()),
        Method::Float16 => (Format::float(5, 10)?, Accumulate::F32),
        Method::Config { format, accumulate } => (format, accumulate),
        other => anyhow::bail!("{other} is a row of the convolution and linear models only"),
    };
    let spec = Some(QuantSpec::nearest(format));
    Ok(QConfig {
        base: Categories {
            weight: spec,
            activation: spec,
            error: spec,
            gradient: spec,
            ..Categories::default()
        },
        accumulate,
        ..QConfig::float32()
    })
}

/// `method`'s score of the model `weights` on the test split of `data`: the model built
/// from the weights with [`row_config`] on the weights' device, its logits ranked as
/// [`super::evaluate`] ranks them.
pub fn evaluate(weights: &super::Weights, method: Method, data: &Dataset) -> Result<Score> {
    let config = row_config(method)?;
    let device = weights.device();
    let tensors = weights
        .tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_dtype(DType::F32)?)))
        .collect::<Result<_>>()?;
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
    let model = weights
        .model
        .build(quantized_var_builder(vb, &config), &config)
        .with_context(|| format!("building {} for the {method} row", weights.model))?;
    super::score(data, &device, |tokens: &Tensor| {
        Ok(model.forward(&tokens.to_device(&device)?)?)
    })
}
