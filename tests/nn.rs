//! Quantized layers, models and the per-category config.

/// The tool's CPU thread settings (applied once, before a test's first candle op), so that
/// the tests run as the tool does.
#[path = "../src/bin/qcandle/threads.rs"]
mod threads;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Conv2dConfig, VarBuilder, VarMap};
use qcandle::nn::config::glob_match;
use qcandle::nn::{
    round_vars_in_place, Category, CifarNet, ConfigError, LeNet5, Mlp, ModelKind, QConfig, QConv2d,
    QLinear, QSequential, QuantSpec, Stage,
};
use qcandle::{quantize_no_grad, Format, Quant, Rounding};

type R = anyhow::Result<()>;

fn spec(s: &str) -> QuantSpec {
    QuantSpec::nearest(s.parse().unwrap())
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    threads::tune_cpu_threads();
    let n: usize = shape.iter().product();
    let v = qcandle::report::normal_samples(n, seed);
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

fn on_grid(t: &Tensor, format: &Format) -> bool {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.iter()
        .all(|&x| format.round(x as f64, Rounding::NearestEven, 0) == x as f64)
}

fn n_params(varmap: &VarMap) -> usize {
    varmap.all_vars().iter().map(|v| v.elem_count()).sum()
}

fn model_params(kind: ModelKind) -> anyhow::Result<(usize, Tensor)> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = kind.build(vb, &QConfig::float32())?;
    let (c, h, w) = kind.input_shape();
    let logits = model.forward(&Tensor::zeros((2, c, h, w), DType::F32, &Device::Cpu)?)?;
    Ok((n_params(&varmap), logits))
}

#[test]
fn lenet5_has_the_papers_61706_parameters_padded_and_44426_unpadded() -> R {
    let (padded, logits) = model_params(ModelKind::Lenet5)?;
    assert_eq!(padded, 61_706);
    assert_eq!(logits.dims(), [2, 10]);
    let (unpadded, logits) = model_params(ModelKind::Lenet5Unpadded)?;
    assert_eq!(unpadded, 44_426);
    assert_eq!(logits.dims(), [2, 10]);
    Ok(())
}

#[test]
fn mlp_and_cifarnet_have_their_layer_sums_of_parameters() -> R {
    let (mlp, _) = model_params(ModelKind::Mlp)?;
    assert_eq!(mlp, 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
    let (cifar, logits) = model_params(ModelKind::CifarNet)?;
    let conv = 3 * 64 * 25 + 64 + 64 * 64 * 25 + 64;
    let fc = 4096 * 384 + 384 + 384 * 192 + 192 + 192 * 10 + 10;
    assert_eq!(cifar, conv + fc);
    assert_eq!(logits.dims(), [2, 10]);
    Ok(())
}

#[test]
fn every_models_variables_are_the_layers_of_its_plan_with_their_sizes() -> R {
    for (kind, name) in ModelKind::ALL {
        let mut expected: Vec<(String, Vec<usize>)> = Vec::new();
        for stage in kind.plan() {
            let (layer, weight, out) = match stage {
                Stage::Conv {
                    name,
                    in_channels,
                    out_channels,
                    kernel,
                    ..
                } => (
                    name,
                    vec![out_channels, in_channels, kernel, kernel],
                    out_channels,
                ),
                Stage::Linear {
                    name,
                    in_dim,
                    out_dim,
                } => (name, vec![out_dim, in_dim], out_dim),
                _ => continue,
            };
            expected.push((format!("{layer}.bias"), vec![out]));
            expected.push((format!("{layer}.weight"), weight));
        }
        expected.sort();
        assert_eq!(kind.parameter_shapes()?, expected, "{name}");
    }
    Ok(())
}

#[test]
fn the_zoo_types_compute_what_their_models_do() -> R {
    // Over the same variables (built under the same names) and an unrounded config, the
    // stand-alone layer stacks give the model's logits bit for bit.
    let config = QConfig::float32();
    for (kind, name) in ModelKind::ALL {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = kind.build(vb.clone(), &config)?;
        let stack: Box<dyn Module> = match kind {
            ModelKind::Mlp => Box::new(Mlp::new(&[784, 256, 128, 10], vb, &config)?),
            ModelKind::Lenet5 => Box::new(LeNet5::new(true, vb, &config)?),
            ModelKind::Lenet5Unpadded => Box::new(LeNet5::new(false, vb, &config)?),
            ModelKind::CifarNet => Box::new(CifarNet::new(vb, &config)?),
            // No stand-alone type (tests/transformer.rs covers them).
            ModelKind::Lenet5Classic | ModelKind::Transformer => continue,
        };
        let (c, h, w) = kind.input_shape();
        let x = randn(&[2, c, h, w], 5).clamp(-1f32, 1f32)?;
        let logits = model.forward(&x)?.to_vec2::<f32>()?;
        assert_eq!(stack.forward(&x)?.to_vec2::<f32>()?, logits, "{name}");
    }
    Ok(())
}

#[test]
fn lenet5_pads_with_the_background_value_minus_one() -> R {
    // The padded model on a 28x28 image equals plain candle layers on the image padded to
    // 32x32 by hand with -1 (zero padding would give other logits).
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = ModelKind::Lenet5.build(vb, &QConfig::float32())?;
    let v = varmap.data().lock().unwrap().clone();
    let t = |name: &str| v[name].as_tensor().clone();
    let conv = |x: &Tensor, l: &str| -> candle_core::Result<Tensor> {
        let b = t(&format!("{l}.bias"));
        let n = b.elem_count();
        x.conv2d(&t(&format!("{l}.weight")), 0, 1, 1, 1)?
            .broadcast_add(&b.reshape((1, n, 1, 1))?)
    };
    let fc = |x: &Tensor, l: &str| -> candle_core::Result<Tensor> {
        candle_nn::Linear::new(t(&format!("{l}.weight")), Some(t(&format!("{l}.bias")))).forward(x)
    };
    let manual = |x: &Tensor| -> candle_core::Result<Tensor> {
        let x = conv(x, "conv1")?.relu()?.max_pool2d(2)?;
        let x = conv(&x, "conv2")?.relu()?.max_pool2d(2)?;
        let x = fc(&x.flatten_from(1)?, "fc1")?.relu()?;
        let x = fc(&x, "fc2")?.relu()?;
        fc(&x, "fc3")
    };
    let x = randn(&[2, 1, 28, 28], 11).clamp(-1f32, 1f32)?;
    let minus_one = Tensor::full(-1f32, (2, 1, 32, 32), &Device::Cpu)?;
    let padded = minus_one.slice_assign(&[0..2, 0..1, 2..30, 2..30], &x)?;
    let expected = manual(&padded)?.to_vec2::<f32>()?;
    let got = model.forward(&x)?.to_vec2::<f32>()?;
    for (g, e) in got.iter().flatten().zip(expected.iter().flatten()) {
        assert!((g - e).abs() <= 1e-5 * (1.0 + e.abs()), "{g} vs {e}");
    }
    let zero_padded = manual(&x.pad_with_zeros(2, 2, 2)?.pad_with_zeros(3, 2, 2)?)?;
    assert_ne!(zero_padded.to_vec2::<f32>()?, got);
    Ok(())
}

#[test]
fn qlinear_equals_the_f32_layer_on_rounded_weights_then_rounded() -> R {
    let config = QConfig::uniform(spec("posit<8,0>"));
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QLinear::new(7, 5, vb.pp("fc"), &config)?;
    let x = randn(&[3, 7], 1);
    let q = Quant::new("posit<8,0>".parse()?);
    let vars = varmap.data().lock().unwrap().clone();
    let w = quantize_no_grad(vars["fc.weight"].as_tensor(), &q)?;
    let b = quantize_no_grad(vars["fc.bias"].as_tensor(), &q)?;
    let expected = quantize_no_grad(&x.matmul(&w.t()?)?.broadcast_add(&b)?, &q)?;
    let got = layer.forward(&x)?;
    assert_eq!(got.to_vec2::<f32>()?, expected.to_vec2::<f32>()?);
    // The weights were not on the grid, so the rounding mattered.
    let plain = x.matmul(&vars["fc.weight"].as_tensor().t()?)?;
    assert_ne!(plain.to_vec2::<f32>()?, got.to_vec2::<f32>()?);
    Ok(())
}

#[test]
fn qconv2d_equals_the_f32_convolution_on_rounded_weights_then_rounded() -> R {
    let config = QConfig::uniform(spec("e4m3"));
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let conv = Conv2dConfig {
        padding: 1,
        stride: 2,
        ..Default::default()
    };
    let layer = QConv2d::new(2, 3, 3, conv, vb.pp("conv"), &config)?;
    let x = randn(&[2, 2, 7, 6], 2);
    let q = Quant::new("e4m3".parse()?);
    let vars = varmap.data().lock().unwrap().clone();
    let w = quantize_no_grad(vars["conv.weight"].as_tensor(), &q)?;
    let b = quantize_no_grad(vars["conv.bias"].as_tensor(), &q)?;
    let y = x
        .conv2d(&w, 1, 2, 1, 1)?
        .broadcast_add(&b.reshape((1, 3, 1, 1))?)?;
    let expected = quantize_no_grad(&y, &q)?;
    let got = layer.forward(&x)?;
    let (g, e) = (
        got.flatten_all()?.to_vec1::<f32>()?,
        expected.flatten_all()?.to_vec1::<f32>()?,
    );
    assert_eq!(g.len(), e.len());
    // The convolutions may sum in different orders: allow a one-ulp-of-f32 difference
    // before rounding, which can move a value across a rounding boundary only rarely.
    let differ = g.iter().zip(&e).filter(|(a, b)| a != b).count();
    assert!(differ <= g.len() / 50, "{differ} of {} differ", g.len());
    assert!(on_grid(&got, &"e4m3".parse()?));
    Ok(())
}

#[test]
fn errors_are_rounded_in_backward_and_unrounded_without_an_error_format() -> R {
    // Batch 1: the gradient of a layer's bias is exactly the error at its output, so it
    // lies on the error format's grid.
    let error: Format = "posit<8,0>".parse()?;
    let mut config = QConfig::float32();
    config.base.error = Some(QuantSpec::nearest(error));
    for quantized in [true, false] {
        let cfg = if quantized {
            config.clone()
        } else {
            QConfig::float32()
        };
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let model = QSequential::new(&cfg)
            .layer("fc1", candle_nn::linear(6, 8, vb.pp("fc1"))?)
            .step(candle_nn::Activation::Relu)
            .layer("fc2", candle_nn::linear(8, 3, vb.pp("fc2"))?);
        let x = randn(&[1, 6], 3);
        let loss = model.forward(&x)?.sqr()?.sum_all()?.affine(0.37, 0.0)?;
        let grads = loss.backward()?;
        let vars = varmap.data().lock().unwrap().clone();
        for name in ["fc1.bias", "fc2.bias"] {
            let g = grads.get(vars[name].as_tensor()).expect("bias gradient");
            assert_eq!(
                on_grid(g, &error),
                quantized,
                "{name} quantized={quantized}"
            );
        }
    }
    Ok(())
}

#[test]
fn qsequential_inserts_a_quantizer_after_each_named_layer_only() -> R {
    let config = QConfig::uniform(spec("posit<8,0>"));
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let fc1 = candle_nn::linear(4, 4, vb.pp("fc1"))?;
    let fc2 = candle_nn::linear(4, 2, vb.pp("fc2"))?;
    let model = QSequential::from_layers(
        &config,
        vec![
            ("fc1".to_string(), Box::new(fc1.clone())),
            ("fc2".to_string(), Box::new(fc2.clone())),
        ],
    );
    assert_eq!(model.layer_names(), ["fc1", "fc2"]);
    let q = Quant::new("posit<8,0>".parse()?);
    let x = randn(&[5, 4], 4);
    let h = quantize_no_grad(&fc1.forward(&x)?, &q)?;
    let expected = quantize_no_grad(&fc2.forward(&h)?, &q)?;
    assert_eq!(
        model.forward(&x)?.to_vec2::<f32>()?,
        expected.to_vec2::<f32>()?
    );
    Ok(())
}

#[test]
fn round_vars_in_place_puts_every_variable_on_its_layers_weight_grid() -> R {
    let mut config = QConfig::uniform(spec("posit<8,0>"));
    config.layers = QConfig::from_toml("[[layer]]\npattern = \"fc3\"\nweight = \"bf16\"")?.layers;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    ModelKind::Lenet5.build(vb, &config)?;
    round_vars_in_place(&varmap, &config)?;
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let format: Format = if name.starts_with("fc3") {
            "bf16".parse()?
        } else {
            "posit<8,0>".parse()?
        };
        assert!(on_grid(var.as_tensor(), &format), "{name}");
    }
    // fc3 in bf16 is not on posit<8,0>'s grid.
    let fc3 = varmap.data().lock().unwrap()["fc3.weight"]
        .as_tensor()
        .clone();
    assert!(!on_grid(&fc3, &"posit<8,0>".parse()?));
    Ok(())
}

#[test]
fn presets_round_trip_through_toml_and_json() -> R {
    for (name, _) in qcandle::nn::config::presets() {
        let config = QConfig::preset(name)?.with_seed(42);
        assert_eq!(
            QConfig::from_toml(&config.to_toml())?,
            config,
            "{name} toml"
        );
        assert_eq!(
            QConfig::from_json(&config.to_json())?,
            config,
            "{name} json"
        );
        assert_eq!(QConfig::load(name)?, QConfig::preset(name)?);
    }
    assert_eq!(
        QConfig::preset("posit16")?.base.momentum,
        Some(spec("posit<16,2>"))
    );
    assert_eq!(QConfig::preset("float32")?.base.weight, None);
    let fp8 = QConfig::preset("fp8")?;
    assert_eq!(fp8.base.activation, Some(spec("e4m3")));
    assert_eq!(fp8.base.error, Some(spec("e5m2")));
    Ok(())
}

#[test]
fn a_preset_name_means_the_same_format_as_a_config_and_as_a_format() -> R {
    for (name, _, format) in qcandle::Format::presets() {
        let config = QConfig::preset(name)?;
        let uniform = QConfig::uniform(QuantSpec::nearest(format));
        assert_eq!(config, uniform, "{name}");
        assert_eq!(QConfig::load(name)?, uniform, "{name}");
        assert_eq!(config.base.accumulator, None, "{name}");
    }
    for (name, format) in [
        ("posit8", "posit<8,2>"),
        ("posit16", "posit<16,2>"),
        ("posit32", "posit<32,2>"),
    ] {
        assert_eq!(QConfig::preset(name)?.base.weight, Some(spec(format)));
    }
    Ok(())
}

#[test]
fn a_format_string_config_is_that_format_in_every_category_but_the_accumulator() -> R {
    for spelling in [
        "posit<16,1>",
        "posit<8,0>",
        "float<5,2,nosub>",
        "bf16",
        "fixed<8,4>",
    ] {
        let config = QConfig::load(spelling)?;
        for category in Category::ALL {
            let want = (category != Category::Accumulator).then(|| spec(spelling));
            assert_eq!(config.base.get(category), want, "{spelling} {category}");
        }
        assert_eq!(config.seed, 0);
    }
    let e = QConfig::load("posit<8,9>").unwrap_err();
    assert_eq!(e.field, "file");
    assert!(e.message.contains("es"), "{e}");
    Ok(())
}

#[test]
fn a_config_with_roundings_and_overrides_round_trips_and_resolves_in_order() -> R {
    let text = r#"
        seed = 9
        weight = "posit<16,1>"
        gradient = { format = "posit<16,1>", rounding = "stochastic:8" }
        activation = { format = "float<5,2>" }
        [[layer]]
        pattern = "fc*"
        weight = "bf16"
        activation = "none"
        [[layer]]
        pattern = "fc3"
        weight = { format = "fixed<8,4>", rounding = "toward-zero" }
    "#;
    let config = QConfig::from_toml(text)?;
    assert_eq!(config.seed, 9);
    assert_eq!(
        config.base.gradient.unwrap().rounding,
        Rounding::stochastic(8)?
    );
    assert_eq!(QConfig::from_toml(&config.to_toml())?, config);
    assert_eq!(QConfig::from_json(&config.to_json())?, config);
    let conv = config.layer("conv1");
    assert_eq!(conv.weight, Some(spec("posit<16,1>")));
    assert_eq!(conv.activation, Some(spec("float<5,2>")));
    let fc1 = config.layer("fc1");
    assert_eq!(fc1.weight, Some(spec("bf16")));
    assert_eq!(fc1.activation, None);
    let fc3 = config.layer("fc3");
    assert_eq!(fc3.weight.unwrap().format, "fixed<8,4>".parse()?);
    assert_eq!(fc3.weight.unwrap().rounding, Rounding::TowardZero);
    assert_eq!(fc3.activation, None);
    // The optimizer's view of a variable follows its layer.
    let p = config.param_quant("fc3.bias");
    assert_eq!(*p.weight.unwrap().format(), "fixed<8,4>".parse()?);
    assert!(p.momentum.is_none());
    Ok(())
}

#[test]
fn stream_seeds_differ_per_layer_category_and_config_seed() {
    let config = QConfig::uniform(spec("posit<8,0>")).with_seed(1);
    let seed = |c: &QConfig, layer: &str, cat| c.quant(layer, cat).unwrap().seed();
    let a = seed(&config, "fc1", Category::Activation);
    assert_ne!(a, seed(&config, "fc2", Category::Activation));
    assert_ne!(a, seed(&config, "fc1", Category::Error));
    assert_ne!(
        a,
        seed(&config.clone().with_seed(2), "fc1", Category::Activation)
    );
    assert_eq!(a, seed(&config, "fc1", Category::Activation));
    let p = config.param_quant("fc1.weight");
    let b = config.param_quant("fc1.bias");
    assert_ne!(p.gradient.unwrap().seed(), b.gradient.unwrap().seed());
}

fn field_of(e: ConfigError) -> String {
    e.field
}

#[test]
fn bad_configs_are_errors_naming_the_field() {
    let cases = [
        ("weigth = \"posit8\"", "weigth"),
        ("weight = \"posit<40,1>\"", "weight"),
        ("weight = 3", "weight"),
        (
            "gradient = { format = \"bf16\", rounding = \"upward\" }",
            "gradient.rounding",
        ),
        (
            "gradient = { format = \"bf16\", mode = \"x\" }",
            "gradient.mode",
        ),
        (
            "gradient = { rounding = \"stochastic\" }",
            "gradient.format",
        ),
        ("seed = -1", "seed"),
        ("[[layer]]\nweight = \"bf16\"", "layer[0].pattern"),
        (
            "[[layer]]\npattern = \"fc1\"\nwieght = \"bf16\"",
            "layer[0].wieght",
        ),
        (
            "[[layer]]\npattern = \"a\"\n[[layer]]\npattern = \"b\"\nerror = \"float<1,1>\"",
            "layer[1].error",
        ),
        ("weight = ", "file"),
    ];
    for (text, field) in cases {
        let e = QConfig::from_toml(text).expect_err(text);
        assert!(e.to_string().contains(field), "{text}: {e}");
        assert_eq!(field_of(e), field, "{text}");
    }
    let e = QConfig::from_json("{\"activation\": \"posit<8,9>\"}").unwrap_err();
    assert_eq!(e.field, "activation");
    assert!(e.message.contains("es"), "{e}");
    assert_eq!(QConfig::load("posit12").unwrap_err().field, "file");
    assert_eq!(QConfig::preset("posit12").unwrap_err().field, "preset");
}

#[test]
fn glob_patterns_match_whole_names() {
    assert!(glob_match("fc*", "fc1"));
    assert!(glob_match("fc*", "fc"));
    assert!(glob_match("*", "conv1"));
    assert!(glob_match("c?nv1", "conv1"));
    assert!(glob_match("*.1*", "block.1.conv"));
    assert!(!glob_match("fc", "fc1"));
    assert!(!glob_match("fc?", "fc"));
    assert!(!glob_match("conv*", "fc1"));
    assert!(!glob_match("*conv", "conv1"));
}

#[test]
fn a_var_bound_to_a_qlinear_keeps_candle_nns_names() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QLinear::new(3, 2, vb.pp("head"), &QConfig::float32())?;
    assert_eq!(layer.name(), "head");
    let mut names: Vec<String> = varmap.data().lock().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(names, ["head.bias", "head.weight"]);
    // With nothing quantized the layer is candle-nn's linear layer.
    let vars = varmap.data().lock().unwrap().clone();
    let plain = candle_nn::Linear::new(
        vars["head.weight"].as_tensor().clone(),
        Some(vars["head.bias"].as_tensor().clone()),
    );
    let x = randn(&[4, 3], 5);
    assert_eq!(
        layer.forward(&x)?.to_vec2::<f32>()?,
        plain.forward(&x)?.to_vec2::<f32>()?
    );
    Ok(())
}
