//! The quantized building blocks (embedding, layer/RMS norm, attention matmul, average
//! pooling, smooth activations).
//!
//! Testing policy: each block is compared with candle-nn's computation of the same function
//! on the same (rounded) inputs. The forward pass must be `Q_act(reference)` bit for bit;
//! every gradient must equal the reference's gradient when the reference is fed the rounded
//! upstream gradient `Q_err(g)` (and, for operands that have their own error rounding, that
//! gradient rounded again). The unrounded blocks are also checked against central finite
//! differences in f64, which tests the backward math independently of candle's autograd.

use candle_core::{DType, Device, Module, Tensor, Var, D};
use candle_nn::{VarBuilder, VarMap};
use qcandle::nn::{
    Activation, NormStats, QActivation, QAdd, QAvgPool2d, QConfig, QEmbedding, QLayerNorm, QMatMul,
    QRmsNorm,
};
use qcandle::{quantize_no_grad, Quant};

type R = anyhow::Result<()>;

/// Weight, activation and error in three different formats, so a mix-up shows.
fn config() -> QConfig {
    QConfig::from_toml(
        "weight = \"posit<8,1>\"\nactivation = \"e4m3\"\nerror = \"bf16\"\ngradient = \"bf16\"",
    )
    .unwrap()
}

fn q(format: &str) -> Quant {
    Quant::new(format.parse().unwrap())
}

fn weight_q(t: &Tensor) -> Tensor {
    quantize_no_grad(t, &q("posit<8,1>")).unwrap()
}

fn act_q(t: &Tensor) -> Tensor {
    quantize_no_grad(t, &q("e4m3")).unwrap()
}

fn err_q(t: &Tensor) -> Tensor {
    quantize_no_grad(t, &q("bf16")).unwrap()
}

fn randn(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let v = qcandle::report::normal_samples(n, seed);
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    v.iter().map(|x| x.to_bits()).collect()
}

fn assert_same(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    assert_eq!(bits(a), bits(b), "{what}: bits differ");
}

/// Sets every variable of `varmap` to normal samples (so gains and biases are not 1 and 0).
fn randomise(varmap: &VarMap, dtype: DType) {
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for (i, name) in names.into_iter().enumerate() {
        let var = &data[name];
        var.set(&randn(var.dims(), 100 + i as u64, dtype)).unwrap();
    }
}

fn var(varmap: &VarMap, name: &str) -> Var {
    varmap.data().lock().unwrap()[name].clone()
}

/// The gradient of `sum(y * g)` w.r.t. each of `vars`.
fn grads_of(y: &Tensor, g: &Tensor, vars: &[&Tensor]) -> Vec<Tensor> {
    let loss = (y * g).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    vars.iter()
        .map(|v| grads.get(v).expect("a gradient").clone())
        .collect()
}

/// Central finite differences of `sum(f(x) * g)` w.r.t. the variable `x` (f64), against the
/// autograd gradient, on every element.
fn check_finite_differences(x: &Var, g: &Tensor, f: &dyn Fn() -> Tensor, what: &str) {
    let analytic = grads_of(&f(), g, &[x.as_tensor()])[0]
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let base = x
        .as_tensor()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap();
    let value = |v: &[f64]| -> f64 {
        x.set(&Tensor::from_slice(v, x.dims(), &Device::Cpu).unwrap())
            .unwrap();
        (f() * g)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let h = 1e-6;
    for i in 0..base.len() {
        let mut p = base.clone();
        p[i] += h;
        let up = value(&p);
        p[i] -= 2.0 * h;
        let down = value(&p);
        let numeric = (up - down) / (2.0 * h);
        let tol = 1e-6 * (1.0 + numeric.abs());
        assert!(
            (numeric - analytic[i]).abs() <= tol,
            "{what}: element {i}: finite difference {numeric}, autograd {}",
            analytic[i]
        );
    }
    value(&base);
}

#[test]
fn embedding_rounds_the_table_output_and_error_like_candle_nn() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QEmbedding::new(11, 6, vb.pp("embed"), &config())?;
    let ids = Tensor::new(&[[3u32, 0, 10], [3, 7, 7]], &Device::Cpu)?;
    let table = var(&varmap, "embed.weight");
    let y = layer.forward(&ids)?;
    let table_ref = Var::from_tensor(&weight_q(table.as_tensor()))?;
    let y_ref = candle_nn::Embedding::new(table_ref.as_tensor().clone(), 6).forward(&ids)?;
    // posit<8,1> values are not all e4m3 values: the output rounding is visible.
    assert_same(&y, &act_q(&y_ref), "forward");
    assert_ne!(
        bits(&y),
        bits(&y_ref),
        "the activation format changes some values"
    );
    let g = randn(&[2, 3, 6], 1, DType::F32);
    let grad = &grads_of(&y, &g, &[table.as_tensor()])[0];
    let grad_ref = &grads_of(&y_ref, &err_q(&g), &[table_ref.as_tensor()])[0];
    assert_same(grad, grad_ref, "table gradient");
    Ok(())
}

#[test]
fn embedding_refuses_float_and_out_of_range_ids() -> R {
    let vb = VarBuilder::from_varmap(&VarMap::new(), DType::F32, &Device::Cpu);
    let layer = QEmbedding::new(5, 2, vb.pp("embed"), &config())?;
    let float_ids = Tensor::new(&[1.0f32], &Device::Cpu)?;
    let e = layer.forward(&float_ids).unwrap_err().to_string();
    assert!(e.contains("integers"), "{e}");
    let big = Tensor::new(&[1u32, 5], &Device::Cpu)?;
    let e = layer.forward(&big).unwrap_err().to_string();
    assert!(e.contains("0..5"), "{e}");
    Ok(())
}

/// candle-nn's slow layer norm (the differentiable one), or its RMS norm.
fn norm_ref(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    match b {
        Some(b) => candle_nn::ops::layer_norm_slow(x, w, b, 1e-5).unwrap(),
        None => candle_nn::ops::rms_norm_slow(x, w, 1e-5).unwrap(),
    }
}

fn check_norm_against_candle_nn(layer_norm: bool) -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let config = config();
    let layer: Box<dyn Module> = if layer_norm {
        Box::new(QLayerNorm::new(
            8,
            1e-5,
            NormStats::F32,
            vb.pp("ln"),
            &config,
        )?)
    } else {
        Box::new(QRmsNorm::new(
            8,
            1e-5,
            NormStats::F32,
            vb.pp("ln"),
            &config,
        )?)
    };
    randomise(&varmap, DType::F32);
    let w = var(&varmap, "ln.weight");
    let b = layer_norm.then(|| var(&varmap, "ln.bias"));
    let x = Var::from_tensor(&act_q(&randn(&[2, 3, 8], 7, DType::F32)))?;
    let y = layer.forward(&x)?;
    let w_ref = Var::from_tensor(&weight_q(w.as_tensor()))?;
    let b_ref = b
        .as_ref()
        .map(|b| Var::from_tensor(&weight_q(b.as_tensor())).unwrap());
    let x_ref = Var::from_tensor(x.as_tensor())?;
    let y_ref = norm_ref(&x_ref, &w_ref, b_ref.as_ref().map(|b| b.as_tensor()));
    assert_same(&y, &act_q(&y_ref), "forward");
    // The fused candle-nn module computes the same function (other summation order).
    let module: Box<dyn Module> = match &b_ref {
        Some(b) => Box::new(candle_nn::LayerNorm::new(
            w_ref.as_tensor().clone(),
            b.as_tensor().clone(),
            1e-5,
        )),
        None => Box::new(candle_nn::RmsNorm::new(w_ref.as_tensor().clone(), 1e-5)),
    };
    let fused = module.forward(&x_ref)?;
    let diff = (fused - &y_ref)?.abs()?.max_all()?.to_scalar::<f32>()?;
    assert!(diff < 1e-5, "fused module differs by {diff}");
    let g = randn(&[2, 3, 8], 2, DType::F32);
    let mut vars = vec![x.as_tensor(), w.as_tensor()];
    let mut vars_ref = vec![x_ref.as_tensor(), w_ref.as_tensor()];
    if let (Some(b), Some(b_ref)) = (&b, &b_ref) {
        vars.push(b.as_tensor());
        vars_ref.push(b_ref.as_tensor());
    }
    let grads = grads_of(&y, &g, &vars);
    let grads_ref = grads_of(&y_ref, &err_q(&g), &vars_ref);
    for (i, (a, b)) in grads.iter().zip(&grads_ref).enumerate() {
        assert_same(a, b, &format!("gradient {i}"));
    }
    Ok(())
}

#[test]
fn layer_norm_matches_candle_nn_forward_and_every_gradient() -> R {
    check_norm_against_candle_nn(true)
}

#[test]
fn rms_norm_matches_candle_nn_forward_and_every_gradient() -> R {
    check_norm_against_candle_nn(false)
}

#[test]
fn rounded_statistics_put_the_mean_and_deviation_on_the_activation_grid() -> R {
    let config = QConfig::from_toml("activation = \"posit<8,0>\"")?;
    let vb = VarBuilder::from_varmap(&VarMap::new(), DType::F32, &Device::Cpu);
    let f32_stats = QLayerNorm::new(4, 1e-5, NormStats::F32, vb.pp("a"), &config)?;
    let rounded = QLayerNorm::new(4, 1e-5, NormStats::Rounded, vb.pp("b"), &config)?;
    let p8 = |t: &Tensor| quantize_no_grad(t, &q("posit<8,0>")).unwrap();
    let x = p8(&Tensor::new(&[[0.3f32, 1.7, -0.9, 2.2]], &Device::Cpu)?);
    // By hand: every intermediate rounded to posit<8,0>, then the output.
    let xs = x.to_vec2::<f32>()?[0].clone();
    let r = |v: f32| {
        p8(&Tensor::new(&[v], &Device::Cpu).unwrap())
            .to_vec1::<f32>()
            .unwrap()[0]
    };
    let mean = r(xs.iter().sum::<f32>() / 4.0);
    let centred: Vec<f32> = xs.iter().map(|v| r(v - mean)).collect();
    let var = r(centred.iter().map(|c| c * c).sum::<f32>() / 4.0);
    let std = r(((var as f64) + 1e-5).sqrt() as f32);
    let expected: Vec<f32> = centred.iter().map(|c| r(c / std)).collect();
    assert_eq!(rounded.forward(&x)?.to_vec2::<f32>()?[0], expected);
    assert_ne!(
        f32_stats.forward(&x)?.to_vec2::<f32>()?[0],
        expected,
        "f32 statistics give other values on this input"
    );
    Ok(())
}

#[test]
fn norms_backward_matches_finite_differences() -> R {
    for layer_norm in [true, false] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
        let config = QConfig::float32();
        let layer: Box<dyn Module> = if layer_norm {
            Box::new(QLayerNorm::new(
                5,
                1e-5,
                NormStats::F32,
                vb.pp("ln"),
                &config,
            )?)
        } else {
            Box::new(QRmsNorm::new(
                5,
                1e-5,
                NormStats::F32,
                vb.pp("ln"),
                &config,
            )?)
        };
        randomise(&varmap, DType::F64);
        let x = Var::from_tensor(&randn(&[3, 5], 9, DType::F64))?;
        let g = randn(&[3, 5], 10, DType::F64);
        let f = || layer.forward(&x).unwrap();
        check_finite_differences(&x, &g, &f, "input");
        check_finite_differences(&var(&varmap, "ln.weight"), &g, &f, "gain");
        if layer_norm {
            check_finite_differences(&var(&varmap, "ln.bias"), &g, &f, "bias");
        }
    }
    Ok(())
}

#[test]
fn attention_matmul_rounds_operands_product_and_errors() -> R {
    let op = QMatMul::new("attn", &config())?;
    let a = Var::from_tensor(&randn(&[2, 3, 4, 5], 3, DType::F32))?;
    let b = Var::from_tensor(&randn(&[2, 3, 5, 6], 4, DType::F32))?;
    let y = op.forward(&a, &b)?;
    let a_ref = Var::from_tensor(&act_q(&a))?;
    let b_ref = Var::from_tensor(&act_q(&b))?;
    let y_ref = a_ref.matmul(&b_ref)?;
    assert_same(&y, &act_q(&y_ref), "forward");
    let g = randn(&[2, 3, 4, 6], 5, DType::F32);
    let grads = grads_of(&y, &g, &[a.as_tensor(), b.as_tensor()]);
    let grads_ref = grads_of(&y_ref, &err_q(&g), &[a_ref.as_tensor(), b_ref.as_tensor()]);
    assert_same(&grads[0], &err_q(&grads_ref[0]), "gradient of a");
    assert_same(&grads[1], &err_q(&grads_ref[1]), "gradient of b");
    Ok(())
}

#[test]
fn attention_matmul_refuses_mismatched_shapes_and_matches_finite_differences() -> R {
    let op = QMatMul::new("attn", &QConfig::float32())?;
    let a = randn(&[2, 4, 5], 3, DType::F32);
    let e = op
        .forward(&a, &randn(&[3, 5, 6], 3, DType::F32))
        .unwrap_err();
    assert!(e.to_string().contains("leading dimensions"), "{e}");
    assert!(op.forward(&a, &randn(&[2, 4, 6], 3, DType::F32)).is_err());
    let a = Var::from_tensor(&randn(&[2, 3, 4], 6, DType::F64))?;
    let b = Var::from_tensor(&randn(&[2, 4, 2], 7, DType::F64))?;
    let g = randn(&[2, 3, 2], 8, DType::F64);
    let f = || op.forward(&a, &b).unwrap();
    check_finite_differences(&a, &g, &f, "a");
    check_finite_differences(&b, &g, &f, "b");
    Ok(())
}

#[test]
fn average_pooling_rounds_its_output_and_error() -> R {
    let pool = QAvgPool2d::new("pool", 2, 2, &config())?;
    let x = Var::from_tensor(&act_q(&randn(&[2, 3, 6, 6], 11, DType::F32)))?;
    let y = pool.forward(&x)?;
    let x_ref = Var::from_tensor(x.as_tensor())?;
    let y_ref = x_ref.avg_pool2d(2)?;
    assert_same(&y, &act_q(&y_ref), "forward");
    assert_ne!(bits(&y), bits(&y_ref), "the mean leaves the grid");
    let g = randn(&[2, 3, 3, 3], 12, DType::F32);
    let grad = &grads_of(&y, &g, &[x.as_tensor()])[0];
    let grad_ref = &grads_of(&y_ref, &err_q(&g), &[x_ref.as_tensor()])[0];
    assert_same(grad, grad_ref, "input gradient");
    let e = pool
        .forward(&randn(&[1, 1, 1, 5], 1, DType::F32))
        .unwrap_err();
    assert!(e.to_string().contains("H and W >= 2"), "{e}");
    Ok(())
}

#[test]
fn residual_add_rounds_its_sum_and_error_and_broadcasts() -> R {
    let add = QAdd::new("res", &config());
    let a = Var::from_tensor(&act_q(&randn(&[2, 3, 4], 21, DType::F32)))?;
    let b = Var::from_tensor(&act_q(&randn(&[3, 4], 22, DType::F32)))?;
    let y = add.forward(&a, &b)?;
    let (a_ref, b_ref) = (Var::from_tensor(&a)?, Var::from_tensor(&b)?);
    let y_ref = a_ref.broadcast_add(&b_ref)?;
    assert_same(&y, &act_q(&y_ref), "forward");
    assert_ne!(bits(&y), bits(&y_ref), "the sum leaves the grid");
    let g = randn(&[2, 3, 4], 23, DType::F32);
    let grads = grads_of(&y, &g, &[a.as_tensor(), b.as_tensor()]);
    let grads_ref = grads_of(&y_ref, &err_q(&g), &[a_ref.as_tensor(), b_ref.as_tensor()]);
    assert_same(&grads[0], &grads_ref[0], "gradient of a");
    assert_same(
        &grads[1],
        &grads_ref[1],
        "gradient of b (summed over the broadcast)",
    );
    // Equal shapes: the bits of `a + b`.
    let same = QAdd::new("res", &QConfig::float32());
    let c = randn(&[2, 3, 4], 24, DType::F32);
    assert_same(&same.forward(&a, &c)?, &(a.as_tensor() + &c)?, "unrounded");
    let e = add.forward(&a, &randn(&[5], 1, DType::F32)).unwrap_err();
    assert!(e.to_string().contains("add res: the shapes"), "{e}");
    let a = Var::from_tensor(&randn(&[2, 3], 25, DType::F64))?;
    let b = Var::from_tensor(&randn(&[3], 26, DType::F64))?;
    let g = randn(&[2, 3], 27, DType::F64);
    let f = || same.forward(&a, &b).unwrap();
    check_finite_differences(&a, &g, &f, "a");
    check_finite_differences(&b, &g, &f, "b");
    Ok(())
}

#[test]
fn candle_nn_style_constructors_name_each_op_by_the_var_builders_prefix() -> R {
    let config = QConfig::from_toml(
        "activation = \"e4m3\"\n[[layer]]\npattern = \"block0.*\"\nactivation = \"bf16\"",
    )?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu).pp("block0");
    let x = randn(&[2, 3, 8], 31, DType::F32);
    let bf16 = |t: &Tensor| quantize_no_grad(t, &q("bf16")).unwrap();
    let softmax = qcandle::nn::softmax_last_dim(vb.pp("softmax"), &config);
    assert_eq!(softmax.name(), "block0.softmax");
    assert_same(
        &softmax.forward(&x)?,
        &bf16(&reference(Activation::Softmax, &x)),
        "softmax",
    );
    let gelu = qcandle::nn::gelu_erf(vb.pp("gelu"), &config);
    assert_same(&gelu.forward(&x)?, &bf16(&x.gelu_erf()?), "gelu");
    let add = qcandle::nn::add(vb.pp("res1"), &config);
    assert_eq!(add.name(), "block0.res1");
    assert_same(
        &add.forward(&x, &x.sin()?)?,
        &bf16(&(&x + x.sin()?)?),
        "add",
    );
    let mm = qcandle::nn::matmul(vb.pp("scores"), &config)?;
    assert_eq!(mm.name(), "block0.scores");
    let xt = x.transpose(1, 2)?;
    let want = bf16(&bf16(&x).matmul(&bf16(&xt).contiguous()?)?);
    assert_same(&mm.forward(&x, &xt)?, &want, "matmul");
    let ln = qcandle::nn::layer_norm(8, 1e-5, vb.pp("ln1"), &config)?;
    assert_eq!((ln.name(), ln.stats()), ("block0.ln1", NormStats::F32));
    let rms = qcandle::nn::rms_norm(8, 1e-5, vb.pp("rms"), &config)?;
    assert_eq!((rms.name(), rms.stats()), ("block0.rms", NormStats::F32));
    let e = qcandle::nn::embedding(5, 8, vb.pp("embed"), &config)?;
    assert_eq!(e.weight().dims(), [5, 8]);
    let fc = qcandle::nn::linear(8, 4, vb.pp("fc"), &config)?;
    assert_eq!(
        (fc.name(), fc.weight().dims()),
        ("block0.fc", &[4usize, 8][..])
    );
    let conv = qcandle::nn::conv2d(3, 4, 3, Default::default(), vb.pp("c"), &config)?;
    assert_eq!(conv.weight().dims(), [4, 3, 3, 3]);
    // Outside the pattern, the config's default activation format.
    let other = qcandle::nn::add(vb.root().pp("res1"), &config);
    let e4m3 = act_q(&(&x + x.sin()?)?);
    assert_same(
        &other.forward(&x, &x.sin()?)?,
        &e4m3,
        "add outside the pattern",
    );
    Ok(())
}

const FUNCTIONS: [(Activation, candle_nn::Activation); 4] = [
    (Activation::Gelu, candle_nn::Activation::Gelu),
    (Activation::GeluTanh, candle_nn::Activation::NewGelu),
    (Activation::Silu, candle_nn::Activation::Silu),
    (Activation::Sigmoid, candle_nn::Activation::Sigmoid),
];

/// candle's or candle-nn's own form of each function.
fn reference(function: Activation, x: &Tensor) -> Tensor {
    match function {
        Activation::Tanh => x.tanh().unwrap(),
        Activation::Softmax => candle_nn::ops::softmax(x, D::Minus1).unwrap(),
        f => {
            let module = FUNCTIONS.iter().find(|p| p.0 == f).unwrap().1;
            module.forward(x).unwrap()
        }
    }
}

const ALL: [Activation; 6] = [
    Activation::Tanh,
    Activation::Gelu,
    Activation::GeluTanh,
    Activation::Silu,
    Activation::Sigmoid,
    Activation::Softmax,
];

#[test]
fn activations_round_output_and_error_like_candle_nn() -> R {
    for function in ALL {
        let layer = QActivation::new("act", function, &config());
        let x = Var::from_tensor(&act_q(&randn(&[3, 7], 13, DType::F32)))?;
        let y = layer.forward(&x)?;
        let x_ref = Var::from_tensor(x.as_tensor())?;
        let y_ref = reference(function, &x_ref);
        assert_same(&y, &act_q(&y_ref), &format!("{function:?} forward"));
        let g = randn(&[3, 7], 14, DType::F32);
        let grad = &grads_of(&y, &g, &[x.as_tensor()])[0];
        let grad_ref = &grads_of(&y_ref, &err_q(&g), &[x_ref.as_tensor()])[0];
        assert_same(grad, grad_ref, &format!("{function:?} gradient"));
    }
    Ok(())
}

#[test]
fn activations_backward_matches_finite_differences() -> R {
    for function in ALL {
        let layer = QActivation::new("act", function, &QConfig::float32());
        let x = Var::from_tensor(&randn(&[2, 5], 15, DType::F64))?;
        let g = randn(&[2, 5], 16, DType::F64);
        let f = || layer.forward(&x).unwrap();
        check_finite_differences(&x, &g, &f, &format!("{function:?}"));
    }
    Ok(())
}

#[test]
fn embedding_backward_matches_finite_differences() -> R {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let layer = QEmbedding::new(4, 3, vb.pp("e"), &QConfig::float32())?;
    let ids = Tensor::new(&[2u32, 0, 2], &Device::Cpu)?;
    let g = randn(&[3, 3], 17, DType::F64);
    let f = || layer.forward(&ids).unwrap();
    check_finite_differences(&var(&varmap, "e.weight"), &g, &f, "table");
    Ok(())
}

#[test]
fn batch_norm_matches_candle_nn_and_rounds_its_running_statistics() -> R {
    use candle_core::ModuleT;
    use qcandle::nn::QBatchNorm2d;
    let config = QConfig::from_toml(
        "weight = \"posit<8,1>\"\nactivation = \"e4m3\"\nerror = \"bf16\"\nmomentum = \"posit<6,0>\"",
    )?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let layer = QBatchNorm2d::new(3, 1e-5, 0.1, vb.pp("bn"), &config)?;
    for name in ["bn.weight", "bn.bias"] {
        var(&varmap, name).set(&randn(&[3], name.len() as u64, DType::F32))?;
    }
    let w = var(&varmap, "bn.weight");
    let b = var(&varmap, "bn.bias");
    let x = Var::from_tensor(&act_q(&randn(&[4, 3, 2, 2], 21, DType::F32)))?;
    // The reference: candle-nn's BatchNorm on the rounded weights, with its own statistics.
    let w_ref = Var::from_tensor(&weight_q(&w))?;
    let b_ref = Var::from_tensor(&weight_q(&b))?;
    let zeros = Var::from_tensor(&Tensor::zeros(3, DType::F32, &Device::Cpu)?)?;
    let ones = Var::from_tensor(&Tensor::ones(3, DType::F32, &Device::Cpu)?)?;
    let reference = candle_nn::BatchNorm::new_with_momentum(
        3,
        zeros.as_tensor().clone(),
        ones.as_tensor().clone(),
        w_ref.as_tensor().clone(),
        b_ref.as_tensor().clone(),
        1e-5,
        0.1,
    )?;
    let x_ref = Var::from_tensor(x.as_tensor())?;
    let y = layer.forward_t(&x, true)?;
    let y_ref = reference.forward_t(&x_ref, true)?;
    assert_same(&y, &act_q(&y_ref), "training forward");
    let p6 = |t: &Tensor| quantize_no_grad(t, &q("posit<6,0>")).unwrap();
    let (mean, var_) = layer.running_stats();
    assert_same(mean, &p6(reference.running_mean()), "running mean");
    assert_same(var_, &p6(reference.running_var()), "running variance");
    assert_ne!(
        bits(mean),
        bits(reference.running_mean()),
        "posit<6,0> rounds the mean"
    );
    let g = randn(&[4, 3, 2, 2], 22, DType::F32);
    let grads = grads_of(&y, &g, &[x.as_tensor(), w.as_tensor(), b.as_tensor()]);
    let grads_ref = grads_of(
        &y_ref,
        &err_q(&g),
        &[x_ref.as_tensor(), w_ref.as_tensor(), b_ref.as_tensor()],
    );
    for (i, (a, b)) in grads.iter().zip(&grads_ref).enumerate() {
        assert_same(a, b, &format!("gradient {i}"));
    }
    // Evaluation uses the rounded running statistics.
    let eval_ref = candle_nn::BatchNorm::new_with_momentum(
        3,
        mean.copy()?,
        var_.copy()?,
        w_ref.as_tensor().clone(),
        b_ref.as_tensor().clone(),
        1e-5,
        0.1,
    )?;
    assert_same(
        &layer.forward_t(&x, false)?,
        &act_q(&eval_ref.forward_t(&x, false)?),
        "evaluation forward",
    );
    let e = layer
        .forward_t(&randn(&[1, 3, 1, 1], 1, DType::F32), true)
        .unwrap_err();
    assert!(e.to_string().contains("more than one value"), "{e}");
    Ok(())
}
