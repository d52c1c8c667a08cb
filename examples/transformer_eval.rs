//! The transformer of `transformer.rs` evaluated from a model file (here one written with
//! random weights, standing for a trained model): `cargo run --release --example
//! transformer_eval`. `transformer_eval_q.rs` is the same program with weight-only
//! post-training quantization; `tests/examples_diff.rs` counts the lines that differ.

#[path = "transformer.rs"]
#[allow(dead_code)] // the training program's `main`
mod transformer;

use anyhow::Result;
use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use transformer::{modadd_batch, Transformer};

fn main() -> Result<()> {
    let device = Device::Cpu;
    let path = std::env::temp_dir().join("qcandle-example-transformer.safetensors");
    let varmap = VarMap::new();
    Transformer::new(VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    varmap.save(&path)?;

    let tensors = candle_core::safetensors::load(&path, &device)?;
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
    let model = Transformer::new(vb)?;
    let (tokens, _) = modadd_batch(8, &device)?;
    let logits = model.forward(&tokens)?;
    println!("predicted sums: {}", logits.argmax(1)?);
    Ok(())
}
