//! The conversion costs the README states, measured: the lines that differ between each
//! plain candle example and its converted copy under `examples/`, and the number of
//! quantized layers and ops of the zoo's transformer. The README's figures are read back
//! and must be the measured ones.
//!
//! A changed line is a line of the converted program that is not in a longest common
//! subsequence of the two programs' lines (an edited or an added line); the module doc
//! comments (`//!`) at the top, which describe each file, are not counted.

use std::collections::BTreeSet;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use qcandle::nn::{ModelKind, QConfig};

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

#[test]
fn the_readme_states_the_measured_convnet_conversion_costs() -> R {
    let (weight_only, removed) = pair("convnet_eval.rs", "convnet_eval_q.rs")?;
    assert_eq!(removed, 0, "weight-only quantization only adds lines");
    let (every_category, _) = pair("convnet.rs", "convnet_q.rs")?;
    let text = readme()?;
    let one = |n: usize| if n == 1 { "line" } else { "lines" };
    let weight_only_claim = format!(
        "weight-only quantization: {weight_only} changed {}",
        one(weight_only)
    );
    let every_claim = format!(
        "every category: {every_category} changed {}",
        one(every_category)
    );
    assert!(
        text.contains(&weight_only_claim),
        "README lacks {weight_only_claim:?}"
    );
    assert!(text.contains(&every_claim), "README lacks {every_claim:?}");
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
