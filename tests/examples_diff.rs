//! The conversion costs the README states, measured: the lines that differ between each
//! plain candle example and its converted copy under `examples/`, and the number of
//! quantized layers and ops of the zoo's transformer. The README's figures are read back
//! and must be the measured ones. The transformer examples are run here, and their models
//! checked against the zoo's `transformer`: the converted one computes its bits, forward and
//! backward, and the plain one its float32 function up to f32 rounding.
//!
//! A changed line is a line of the converted program that is not in a longest common
//! subsequence of the two programs' lines (an edited or an added line); the module doc
//! comments (`//!`) at the top, which describe each file, are not counted.

use std::collections::BTreeSet;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use qcandle::nn::{ModelKind, QConfig, Transformer, TransformerConfig};

/// `examples/transformer.rs`, the plain candle program.
#[path = "../examples/transformer.rs"]
mod plain;

/// `examples/transformer_q.rs`, the converted program.
#[path = "../examples/transformer_q.rs"]
mod converted;

type R = anyhow::Result<()>;

/// The program's lines after its leading module doc comment.
fn code_lines(path: &str) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .map(str::to_string)
        .collect())
}

/// Lines of `new` outside a longest common subsequence with `old`, and lines of `old` outside
/// it (edited or added, edited or removed).
fn changed_lines(old: &[String], new: &[String]) -> (usize, usize) {
    let (n, m) = (old.len(), new.len());
    // lcs[i][j]: the LCS length of old[i..] and new[j..].
    let mut lcs = vec![vec![0usize; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if old[i] == new[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    (m - lcs[0][0], n - lcs[0][0])
}

fn pair(plain: &str, converted: &str) -> anyhow::Result<(usize, usize)> {
    Ok(changed_lines(
        &code_lines(&format!("examples/{plain}"))?,
        &code_lines(&format!("examples/{converted}"))?,
    ))
}

fn readme() -> anyhow::Result<String> {
    Ok(std::fs::read_to_string("README.md")?.replace('\n', " "))
}

#[test]
fn the_line_count_finds_edits_additions_and_removals() {
    let lines = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(changed_lines(&lines("a b c"), &lines("a b c")), (0, 0));
    assert_eq!(changed_lines(&lines("a b c"), &lines("a x c")), (1, 1));
    assert_eq!(changed_lines(&lines("a b c"), &lines("a b y c")), (1, 0));
    assert_eq!(changed_lines(&lines("a b c"), &lines("a c")), (0, 1));
    assert_eq!(
        changed_lines(&lines("a b c d"), &lines("x a c d z w")),
        (3, 1)
    );
}

fn lines(n: usize) -> String {
    format!("{n} changed {}", if n == 1 { "line" } else { "lines" })
}

/// Checks that the README states `claim`.
fn assert_readme_states(claim: &str) -> R {
    assert!(readme()?.contains(claim), "README lacks {claim:?}");
    Ok(())
}

#[test]
fn the_readme_states_the_measured_convnet_conversion_costs() -> R {
    let (weight_only, removed) = pair("convnet_eval.rs", "convnet_eval_q.rs")?;
    assert_eq!(removed, 0, "weight-only quantization only adds lines");
    let (every_category, _) = pair("convnet.rs", "convnet_q.rs")?;
    assert_readme_states(&format!("weight-only quantization: {}", lines(weight_only)))?;
    assert_readme_states(&format!("every category: {}", lines(every_category)))
}

#[test]
fn the_readme_states_the_measured_transformer_conversion_costs() -> R {
    let (weight_only, removed) = pair("transformer_eval.rs", "transformer_eval_q.rs")?;
    assert_eq!(removed, 0, "weight-only quantization only adds lines");
    assert_eq!(
        weight_only, 1,
        "weight-only quantization is the VarBuilder's line"
    );
    let (every_category, _) = pair("transformer.rs", "transformer_q.rs")?;
    assert_readme_states(&format!(
        "the transformer, weight-only: {}",
        lines(weight_only)
    ))?;
    assert_readme_states(&format!(
        "the transformer, every category: {}",
        lines(every_category)
    ))
}

#[test]
fn the_transformer_examples_train() -> R {
    plain::main()?;
    converted::main()
}

/// Bits of a float tensor.
fn bits(t: &Tensor) -> anyhow::Result<Vec<u32>> {
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    Ok(v.into_iter().map(f32::to_bits).collect())
}

/// The zoo's transformer on `varmap`'s variables (made by an example's model before).
fn zoo(varmap: &VarMap, config: &QConfig) -> anyhow::Result<Transformer> {
    let vb = VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
    Ok(Transformer::new(TransformerConfig::default(), vb, config)?)
}

/// Tensors' bits by name.
type NamedBits = Vec<(String, Vec<u32>)>;

/// The loss of `logits` and the gradient of every variable of `varmap`, by name.
fn loss_and_grads(
    varmap: &VarMap,
    logits: &Tensor,
    sums: &Tensor,
) -> anyhow::Result<(f32, NamedBits)> {
    let loss = candle_nn::loss::cross_entropy(logits, sums)?;
    let grads = loss.backward()?;
    let data = varmap.data().lock().expect("the varmap's lock");
    let mut named = Vec::new();
    for (name, var) in data.iter() {
        let g = grads.get(var.as_tensor());
        let g = g.ok_or_else(|| anyhow::anyhow!("no gradient for {name}"))?;
        named.push((name.clone(), bits(g)?));
    }
    named.sort();
    Ok((loss.to_scalar::<f32>()?, named))
}

#[test]
fn the_converted_example_computes_the_zoo_transformers_bits() -> R {
    for preset in ["posit<16,1>", "bf16", "e4m3"] {
        let config = QConfig::load(preset)?;
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let example = converted::Transformer::new(vb, &config)?;
        let zoo = zoo(&varmap, &config)?;
        let (tokens, sums) = plain::modadd_batch(64, &Device::Cpu)?;
        let (a, b) = (example.forward(&tokens)?, zoo.forward(&tokens)?);
        assert_eq!(bits(&a)?, bits(&b)?, "{preset}: logits");
        let (loss_a, grads_a) = loss_and_grads(&varmap, &a, &sums)?;
        let (loss_b, grads_b) = loss_and_grads(&varmap, &b, &sums)?;
        assert_eq!(loss_a.to_bits(), loss_b.to_bits(), "{preset}: loss");
        assert_eq!(grads_a.len(), 2 + 12 * 2 + 4, "{preset}: every variable");
        for ((name, ga), (_, gb)) in grads_a.iter().zip(&grads_b) {
            assert_eq!(ga, gb, "{preset}: the gradient of {name}");
        }
    }
    Ok(())
}

#[test]
fn the_plain_example_computes_the_zoo_transformers_float32_function() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let example = plain::Transformer::new(vb)?;
    let zoo = zoo(&varmap, &QConfig::float32())?;
    let (tokens, _) = plain::modadd_batch(64, &Device::Cpu)?;
    let (a, b) = (example.forward(&tokens)?, zoo.forward(&tokens)?);
    assert_eq!(a.dims(), [64, plain::P]);
    // candle-nn's fused layer norm and last-dimension softmax against the zoo's unfused
    // forms: the same function, rounded differently in f32.
    let scale = b.abs()?.max_all()?.to_scalar::<f32>()?;
    let diff = (a - &b)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(scale > 0.1, "logits of size {scale}");
    assert!(
        diff <= 1e-5 * scale,
        "logits differ by {diff} at scale {scale}"
    );
    Ok(())
}

#[test]
fn the_readme_states_the_number_of_quantized_layers_of_the_transformer() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = ModelKind::Transformer.build(vb, &QConfig::load("posit<16,1>")?)?;
    let layers: BTreeSet<String> = model
        .quants()
        .iter()
        .filter_map(|q| q.site().map(|s| s.layer.clone()))
        .collect();
    let claim = format!("{} quantized layers and ops", layers.len());
    assert!(
        readme()?.contains(&claim),
        "README lacks {claim:?}: {layers:?}"
    );
    Ok(())
}
