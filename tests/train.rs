//! The training workflow on the embedded Fashion-MNIST subset: it learns, it reproduces,
//! it resumes, it keeps every number on its grid.

/// The shared training set-up: the embedded subset, short LeNet-5 runs.
#[path = "common/training.rs"]
mod training;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use qcandle::io::read_tensors;
use qcandle::nn::{ModelKind, QConfig};
use qcandle::train::{init_vars, rank_of, train, TrainOptions};
use qcandle::{Format, Rounding};
use training::{subset, without_time};

type R = anyhow::Result<()>;

fn options(config: &str, epochs: usize) -> TrainOptions {
    training::lenet5_options(config, epochs, 3)
}

fn all_on_grid(values: &[f32], format: &Format) -> bool {
    values
        .iter()
        .all(|&x| format.round(x as f64, Rounding::NearestEven, 0) == x as f64)
}

#[test]
fn top_k_ranks_follow_a_stable_sort_where_the_lower_class_wins_a_tie() {
    let logits = [0.5f32, 2.0, 2.0, -1.0, 2.0];
    assert_eq!(rank_of(&logits, 1), 0);
    assert_eq!(rank_of(&logits, 2), 1);
    assert_eq!(rank_of(&logits, 4), 2);
    assert_eq!(rank_of(&logits, 0), 3);
    assert_eq!(rank_of(&logits, 3), 4);
    // A NaN logit elsewhere never outranks the target; a NaN target is last.
    let nan = [f32::NAN, 1.0, 0.0];
    assert_eq!(rank_of(&nan, 1), 0);
    assert_eq!(rank_of(&nan, 2), 1);
    assert_eq!(rank_of(&nan, 0), 3);
}

#[test]
fn lenet5_learns_fashion_mnist_in_float32_and_posit_16_1() -> R {
    let data = subset(3000, 1000);
    for config in ["float32", "posit<16,1>"] {
        let records = train(
            &data,
            &options(config, 1),
            &QConfig::load(config)?,
            None,
            true,
        )?;
        let last = records.last().unwrap();
        // Chance is 10% top-1 and 50% top-5.
        assert!(last.top1 > 60.0, "{config}: {last:?}");
        assert!(last.top5 > 95.0, "{config}: {last:?}");
        assert!(last.test_loss < 1.2, "{config}: {last:?}");
    }
    Ok(())
}

/// Training with the layers' GEMMs in the simulated arithmetic (`accumulate`) learns: LeNet-5
/// (convolutions through im2col) with every GEMM in posit<16,1> quire arithmetic, and an MLP
/// whose every multiply and add is rounded to posit<16,1>, in e4m3 with fp16 sums, and in
/// LNS arithmetic.
#[test]
fn training_with_accumulate_set_learns() -> R {
    let uniform = |format: &str, acc: &str| -> anyhow::Result<QConfig> {
        let text = format!(
            "weight = \"{format}\"\nactivation = \"{format}\"\nerror = \"{format}\"\ngradient = \"{format}\"\naccumulate = \"{acc}\"\n"
        );
        Ok(QConfig::from_toml(&text)?)
    };
    // The fp8 preset (e4m3 forward, e5m2 backward, f32 weight copy) with fp16 sums.
    let mut fp8 = QConfig::load("fp8")?;
    fp8.accumulate = "naive:fp16".parse()?;
    let cases = [
        (
            "lenet5",
            "posit<16,1>",
            "quire",
            uniform("posit<16,1>", "quire")?,
            2000,
        ),
        (
            "mlp",
            "posit<16,1>",
            "naive",
            uniform("posit<16,1>", "naive")?,
            1200,
        ),
        ("mlp", "fp8", "naive:fp16", fp8, 1200),
        (
            "mlp",
            "lns<16,8>",
            "lns:ideal",
            uniform("lns<16,8>", "lns:ideal")?,
            600,
        ),
    ];
    for (model, format, acc, config, n) in cases {
        let data = subset(n, 500);
        let opts = TrainOptions {
            model: model.into(),
            ..options(acc, 1)
        };
        let records = train(&data, &opts, &config, None, true)?;
        let last = records.last().unwrap();
        println!("{model} {format} {acc}: {last:?}");
        // Chance is 10% top-1.
        assert!(last.top1 > 40.0, "{model} {format} {acc}: {last:?}");
    }
    Ok(())
}

#[test]
fn the_same_seed_reproduces_the_same_numbers_and_another_seed_does_not() -> R {
    let data = subset(640, 200);
    let mut config = QConfig::load("posit<16,1>")?;
    config.base.gradient = Some(qcandle::nn::QuantSpec {
        format: "posit<16,1>".parse()?,
        rounding: Rounding::stochastic(16)?,
    });
    let a = train(&data, &options("p16sr", 2), &config, None, true)?;
    let b = train(&data, &options("p16sr", 2), &config, None, true)?;
    assert_eq!(without_time(&a), without_time(&b));
    let other = TrainOptions {
        seed: 4,
        ..options("p16sr", 2)
    };
    let c = train(&data, &other, &config, None, true)?;
    assert_ne!(without_time(&a), without_time(&c));
    Ok(())
}

#[test]
fn an_interrupted_run_resumes_to_the_same_results_and_files() -> R {
    let data = subset(640, 200);
    let mut config = QConfig::load("posit<16,1>")?;
    config.base.activation = Some(qcandle::nn::QuantSpec {
        format: "posit<16,1>".parse()?,
        rounding: Rounding::stochastic(12)?,
    });
    let dir = tempfile::tempdir()?;
    let (straight, resumed) = (dir.path().join("straight"), dir.path().join("resumed"));
    let full = train(&data, &options("sr", 3), &config, Some(&straight), true)?;
    let first = train(&data, &options("sr", 1), &config, Some(&resumed), true)?;
    assert_eq!(first.len(), 1);
    let rest = train(&data, &options("sr", 3), &config, Some(&resumed), true)?;
    assert_eq!(without_time(&rest), without_time(&full));
    let model = |d: &std::path::Path| -> anyhow::Result<Vec<(String, Vec<f32>)>> {
        read_tensors(&d.join("model.safetensors"))?
            .into_iter()
            .map(|(n, t)| Ok((n, t.flatten_all()?.to_vec1::<f32>()?)))
            .collect()
    };
    assert_eq!(model(&straight)?, model(&resumed)?);
    for file in [
        "run.json",
        "metrics.csv",
        "config.toml",
        "model.safetensors",
        "checkpoint.safetensors",
        "curves.png",
    ] {
        assert!(resumed.join(file).is_file(), "{file}");
    }
    let csv = std::fs::read_to_string(resumed.join("metrics.csv"))?;
    assert_eq!(csv.lines().count(), 4, "{csv}");
    assert_eq!(
        QConfig::load(resumed.join("config.toml").to_str().unwrap())?,
        config.with_seed(3)
    );
    // Nothing left half-written.
    let leftovers: Vec<_> = std::fs::read_dir(&resumed)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    Ok(())
}

#[test]
fn a_different_run_in_the_same_directory_is_refused() -> R {
    let data = subset(128, 100);
    let dir = tempfile::tempdir()?;
    train(
        &data,
        &options("float32", 1),
        &QConfig::float32(),
        Some(dir.path()),
        true,
    )?;
    let other = TrainOptions {
        lr: 0.1,
        ..options("float32", 2)
    };
    let e = train(&data, &other, &QConfig::float32(), Some(dir.path()), true).unwrap_err();
    assert!(e.to_string().contains("different run"), "{e}");
    Ok(())
}

#[test]
fn training_keeps_weights_and_optimizer_state_on_their_grids() -> R {
    let data = subset(256, 100);
    let text = r#"
        weight = "posit<8,1>"
        momentum = "bf16"
        accumulator = "posit<16,1>"
        gradient = "e5m2"
    "#;
    let config = QConfig::from_toml(text)?;
    let dir = tempfile::tempdir()?;
    train(&data, &options("grid", 1), &config, Some(dir.path()), true)?;
    let weight: Format = "posit<8,1>".parse()?;
    let momentum: Format = "bf16".parse()?;
    let accumulator: Format = "posit<16,1>".parse()?;
    let mut checked = (0, 0);
    for (name, t) in read_tensors(&dir.path().join("checkpoint.safetensors"))? {
        if t.dtype() != DType::F32 {
            continue; // step counts and stream positions
        }
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        if name.starts_with("model.") {
            assert!(all_on_grid(&v, &weight), "{name}");
            checked.0 += 1;
        } else if name.contains("acc") {
            assert!(all_on_grid(&v, &accumulator), "{name}");
            // The accumulator holds more precision than the weights.
            assert!(!all_on_grid(&v, &weight) || v.len() < 16, "{name}");
        } else {
            assert!(all_on_grid(&v, &momentum), "{name}");
            checked.1 += 1;
        }
    }
    assert_eq!(checked.0, 10);
    assert!(checked.1 >= 10, "{checked:?}");
    Ok(())
}

#[test]
fn initialisation_is_reproducible_and_within_pytorchs_bounds() -> R {
    let init = |seed| -> anyhow::Result<Vec<(String, Vec<f32>)>> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        ModelKind::Lenet5.build(vb, &QConfig::float32())?;
        init_vars(&varmap, seed)?;
        let mut v: Vec<(String, Vec<f32>)> = varmap
            .data()
            .lock()
            .unwrap()
            .iter()
            .map(|(n, v)| {
                (
                    n.clone(),
                    v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                )
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    };
    let a = init(1)?;
    assert_eq!(a, init(1)?);
    assert_ne!(a, init(2)?);
    for (name, values) in &a {
        let fan_in = match name.split('.').next().unwrap() {
            "conv1" => 25.0,
            "conv2" => 150.0,
            "fc1" => 400.0,
            "fc2" => 120.0,
            _ => 84.0,
        };
        let bound = 1.0 / f32::sqrt(fan_in);
        let max = values.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(max <= bound, "{name}: {max} vs {bound}");
        if values.len() < 100 {
            continue;
        }
        assert!(max > 0.95 * bound, "{name}: {max} vs {bound}");
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        assert!(mean.abs() < 0.2 * bound, "{name}: mean {mean}");
    }
    Ok(())
}
