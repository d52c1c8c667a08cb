//! The `accumulate` setting in configs: parsing and printing, per-layer overrides, errors that
//! name the field or the category at fault, and the default `f32` layers unchanged (the same
//! bits as a config without the setting, and as candle's layers on rounded weights).

use candle_core::{DType, Device, Module, Tensor, Var};
use candle_nn::{Conv2dConfig, VarBuilder, VarMap};
use qcandle::nn::{QConfig, QConv2d, QLinear};
use qcandle::quire::{Accumulate, LnsSum};
use qcandle::Format;

type R = anyhow::Result<()>;

#[test]
fn every_spelling_parses_and_prints_back() -> R {
    let cases: [(&str, Accumulate); 9] = [
        ("f32", Accumulate::F32),
        ("quire", Accumulate::Quire),
        ("naive", Accumulate::Naive),
        ("naive:fp16", Accumulate::NaiveSum("fp16".parse()?)),
        ("fma:fp32", Accumulate::Fma(Format::float(8, 23)?)),
        ("lns:ideal", Accumulate::Lns(LnsSum::Ideal)),
        ("lns:truncated", Accumulate::Lns(LnsSum::Truncated)),
        ("lns:table", Accumulate::Lns(LnsSum::Table(None))),
        (
            "lns:table:3:4",
            Accumulate::Lns(LnsSum::Table(Some((3, 4)))),
        ),
    ];
    for (text, want) in cases {
        let got: Accumulate = text.parse()?;
        assert_eq!(got, want, "{text}");
        let again: Accumulate = got.to_string().parse()?;
        assert_eq!(again, want, "{text} printed as {got}");
    }
    assert_eq!(Accumulate::default(), Accumulate::F32);
    Ok(())
}

#[test]
fn bad_spellings_are_errors_saying_what_is_expected() {
    for (text, needle) in [
        ("exact", "expected one of f32, quire"),
        ("naive:", "needs a format"),
        ("naive:posit<8,9>", "naive:<format>"),
        ("fma", "needs an accumulator format"),
        ("lns", "needs an implementation"),
        ("lns:best", "unknown LNS adder"),
        ("lns:table:3", "unknown LNS adder"),
        ("lns:table:x:1", "grid_bits `x`"),
        ("quire:fp32", "expected one of"),
    ] {
        let e = text.parse::<Accumulate>().expect_err(text).to_string();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn configs_read_the_setting_at_top_level_and_per_layer_and_write_it_back() -> R {
    let text = r#"
        weight = "posit<16,1>"
        activation = "posit<16,1>"
        error = "posit<16,1>"
        gradient = "posit<16,1>"
        accumulate = "quire"
        [[layer]]
        pattern = "fc*"
        accumulate = "naive"
        [[layer]]
        pattern = "fc3"
        accumulate = "naive:fp32"
        [[layer]]
        pattern = "fc*"
        weight = "none"
    "#;
    let config = QConfig::from_toml(text)?;
    assert_eq!(config.accumulate("conv1"), Accumulate::Quire);
    assert_eq!(config.accumulate("fc1"), Accumulate::Naive);
    // A later entry wins; one that does not name the setting leaves it.
    assert_eq!(config.accumulate("fc3"), "naive:fp32".parse()?);
    assert_eq!(QConfig::from_toml(&config.to_toml())?, config);
    assert_eq!(QConfig::from_json(&config.to_json())?, config);
    let json = QConfig::from_json(r#"{"activation": "e4m3", "accumulate": "fma:fp16"}"#)?;
    assert_eq!(json.accumulate("any"), "fma:fp16".parse()?);
    Ok(())
}

#[test]
fn a_config_without_the_setting_prints_as_before() -> R {
    let config = QConfig::load("posit<16,1>")?;
    assert_eq!(config.accumulate("fc1"), Accumulate::F32);
    assert!(!config.to_toml().contains("accumulate"));
    assert!(!config.to_json().contains("accumulate"));
    Ok(())
}

#[test]
fn bad_settings_in_configs_name_the_field() {
    for (text, field, needle) in [
        ("accumulate = \"exact\"", "accumulate", "expected one of"),
        ("accumulate = 3", "accumulate", "expected a string"),
        (
            "[[layer]]\npattern = \"fc1\"\naccumulate = \"lns:fast\"",
            "layer[0].accumulate",
            "unknown LNS adder",
        ),
    ] {
        let e = QConfig::from_toml(text).expect_err(text);
        assert_eq!(e.field, field, "{text}");
        assert!(e.message.contains(needle), "{text}: {}", e.message);
    }
}

fn linear_error(config: &str) -> String {
    let config = QConfig::from_toml(config).expect("parses");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    QLinear::new(4, 3, vb.pp("fc1"), &config)
        .expect_err("refused")
        .to_string()
}

#[test]
fn layers_refuse_settings_that_cannot_apply_naming_the_layer_and_category() {
    let all = |f: &str, acc: &str| {
        format!("activation = \"{f}\"\nerror = \"{f}\"\ngradient = \"{f}\"\naccumulate = \"{acc}\"")
    };
    for (config, needles) in [
        (
            all("e4m3", "quire"),
            vec!["layer fc1", "quire needs a posit format", "activation"],
        ),
        (all("block<8>", "naive"), vec!["rounds whole blocks"]),
        (
            all("mxfp8_e4m3<dim=1>", "naive:fp16"),
            vec!["rounds whole blocks"],
        ),
        (all("lns<16,8>", "naive"), vec!["lns:<impl>"]),
        (all("posit<16,1>", "lns:ideal"), vec!["needs an lns format"]),
        (
            all("posit<32,2>", "fma:fp32"),
            vec!["products exact in f64"],
        ),
        (
            all("e4m3", "naive:lns<16,8>"),
            vec!["the accumulator", "logarithmic"],
        ),
        (all("lns<16,8>", "lns:table:9:0"), vec!["grid"]),
        (
            "activation = \"posit<16,1>\"\nerror = \"posit<16,1>\"\naccumulate = \"quire\""
                .to_string(),
            vec!["needs a gradient format", "weight-gradient GEMM"],
        ),
        (
            "error = \"posit<16,1>\"\ngradient = \"posit<16,1>\"\naccumulate = \"naive\""
                .to_string(),
            vec!["needs an activation format"],
        ),
    ] {
        let e = linear_error(&config);
        for n in needles {
            assert!(e.contains(n), "{config}: `{e}` lacks `{n}`");
        }
    }
}

#[test]
fn tensors_the_rules_cannot_take_are_errors() -> R {
    let config = QConfig::from_toml(
        "activation = \"posit<8,0>\"\nerror = \"posit<8,0>\"\ngradient = \"posit<8,0>\"\naccumulate = \"quire\"",
    )?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QLinear::new(4, 3, vb.pp("fc1"), &config)?;
    let wrong = Tensor::zeros((2, 5), DType::F32, &Device::Cpu)?;
    let e = layer.forward(&wrong).expect_err("wrong width").to_string();
    assert!(e.contains("expected (..., 4)"), "{e}");
    let f64s = Tensor::zeros((2, 4), DType::F64, &Device::Cpu)?;
    assert!(layer.forward(&f64s).is_err());
    let conv_vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let grouped = Conv2dConfig {
        groups: 2,
        ..Default::default()
    };
    let conv = QConv2d::new(4, 4, 3, grouped, conv_vb.pp("conv1"), &config)?;
    let x = Tensor::zeros((1, 4, 5, 5), DType::F32, &Device::Cpu)?;
    let e = conv.forward(&x).expect_err("groups").to_string();
    assert!(e.contains("grouped"), "{e}");
    Ok(())
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Output and gradients of a layer under `config` for fixed weights and inputs.
fn linear_run(config: &QConfig) -> anyhow::Result<Vec<Vec<u32>>> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QLinear::new(6, 4, vb.pp("fc"), config)?;
    let w = Tensor::from_vec(qcandle::report::normal_samples(24, 5), (4, 6), &Device::Cpu)?;
    varmap.data().lock().unwrap()["fc.weight"].set(&w)?;
    varmap.data().lock().unwrap()["fc.bias"].set(&Tensor::zeros(4, DType::F32, &Device::Cpu)?)?;
    let x = Var::from_tensor(&Tensor::from_vec(
        qcandle::report::normal_samples(18, 6),
        (3, 6),
        &Device::Cpu,
    )?)?;
    let y = layer.forward(x.as_tensor())?;
    let g = Tensor::from_vec(qcandle::report::normal_samples(12, 7), (3, 4), &Device::Cpu)?;
    let grads = (&y * &g)?.sum_all()?.backward()?;
    let weight = varmap.data().lock().unwrap()["fc.weight"]
        .as_tensor()
        .clone();
    // The f32 layer is candle's linear on the rounded weight, then rounded.
    let p16: Format = "posit<16,1>".parse()?;
    let wq = qcandle::quantize_no_grad(&w, &qcandle::Quant::new(p16))?;
    let plain = candle_nn::Linear::new(wq, None).forward(x.as_tensor())?;
    let plain = qcandle::quantize_no_grad(&plain, &qcandle::Quant::new(p16))?;
    Ok(vec![
        bits(&y),
        bits(grads.get(x.as_tensor()).expect("dX")),
        bits(grads.get(&weight).expect("dW")),
        bits(&plain),
    ])
}

#[test]
fn accumulate_f32_is_the_layer_without_the_setting() -> R {
    let without = QConfig::load("posit<16,1>")?;
    let mut with = without.clone();
    with.accumulate = "f32".parse()?;
    let (a, b) = (linear_run(&without)?, linear_run(&with)?);
    assert_eq!(a, b);
    // And the output is candle's f32 product on the rounded weight (zero bias), rounded.
    assert_eq!(a[0], a[3]);
    Ok(())
}
