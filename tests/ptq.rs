//! Post-training quantization: the evaluation plan replays the trained model, model files
//! are checked and round-trip, and each arithmetic computes what its definition says.

/// The shared training set-up: the embedded subset, short LeNet-5 runs.
#[path = "common/training.rs"]
mod training;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use qcandle::io::{read_tensors, write_tensors};
use qcandle::nn::{ModelKind, QConfig};
use qcandle::ptq::arith::{run_plan, Arithmetic, Float16, Float32, Int8, PositGemm};
use qcandle::ptq::{
    evaluate, methods, read_weights, top_is_tied, write_quantized, Method, Weights,
};
use qcandle::quire::{self, Accumulation};
use qcandle::train::{init_vars, train, OptimizerKind, TrainOptions};
use qcandle::{Format, Rounding};

type R = anyhow::Result<()>;

use training::{subset, threads};

/// A LeNet-5 trained for one epoch on the 6000 images of the embedded subset (once per test
/// binary), and the directory holding its run.
fn trained() -> &'static (PathBuf, tempfile::TempDir) {
    static RUN: OnceLock<(PathBuf, tempfile::TempDir)> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = dir.path().join("run");
        let options = TrainOptions {
            model: "lenet5".into(),
            config_name: "float32".into(),
            epochs: 1,
            batch: 64,
            lr: 1e-3,
            optimizer: OptimizerKind::Adam,
            seed: 5,
            train_limit: None,
            device: qcandle::device::DeviceSpec::Cpu,
            schedule: Default::default(),
            weight_decay: None,
            beta2: None,
        };
        let config = QConfig::preset("float32").expect("a preset");
        train(&subset(6000, 1000), &options, &config, Some(&out), true).expect("training");
        (out.join("model.safetensors"), dir)
    })
}

fn trained_weights() -> Weights {
    read_weights(&trained().0, Some(ModelKind::Lenet5)).expect("the trained model reads back")
}

fn random_weights(kind: ModelKind, seed: u64) -> anyhow::Result<(Weights, qcandle::nn::Model)> {
    threads::tune_cpu_threads();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    let model = kind.build(vb, &QConfig::default())?;
    init_vars(&varmap, seed)?;
    let tensors: HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    Ok((
        Weights {
            model: kind,
            tensors,
            format: None,
        },
        model,
    ))
}

fn images(kind: ModelKind, n: usize, seed: u64) -> anyhow::Result<Tensor> {
    let (c, h, w) = kind.input_shape();
    let v: Vec<f32> = qcandle::report::normal_samples(n * c * h * w, seed)
        .into_iter()
        .map(|x| x.clamp(-1.0, 1.0))
        .collect();
    Ok(Tensor::from_vec(v, (n, c, h, w), &Device::Cpu)?)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> anyhow::Result<f32> {
    Ok((a - b)?.abs()?.max_all()?.to_scalar::<f32>()?)
}

#[test]
fn the_float32_plan_of_every_model_replays_the_candle_model() -> R {
    for (kind, _) in ModelKind::ALL {
        let (weights, model) = random_weights(kind, 11)?;
        let x = images(kind, 3, 2)?;
        let expected = model.forward(&x)?;
        let got = run_plan(kind, &Float32::new(&weights)?, &x, |_, _| Ok(()))?;
        let scale = expected.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-3);
        let diff = max_abs_diff(&expected, &got)?;
        assert!(
            diff <= 1e-5 * scale,
            "{kind}: plan differs by {diff} (scale {scale})"
        );
    }
    Ok(())
}

#[test]
fn the_plan_visits_every_layer_once_in_order_with_the_layer_input_shapes() -> R {
    let (weights, _) = random_weights(ModelKind::Lenet5, 1)?;
    let mut seen = Vec::new();
    run_plan(
        ModelKind::Lenet5,
        &Float32::new(&weights)?,
        &images(ModelKind::Lenet5, 2, 1)?,
        |name, x| {
            seen.push((name.to_string(), x.dims().to_vec()));
            Ok(())
        },
    )?;
    let expected: Vec<(String, Vec<usize>)> = [
        ("conv1", vec![2, 1, 32, 32]),
        ("conv2", vec![2, 6, 14, 14]),
        ("fc1", vec![2, 400]),
        ("fc2", vec![2, 120]),
        ("fc3", vec![2, 84]),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    assert_eq!(seen, expected);
    Ok(())
}

#[test]
fn the_padding_value_minus_one_reaches_the_first_layer_exactly_in_posit_arithmetic() -> R {
    // posit<16,1> holds values next to -1 and 0 that an (x + 1) - 1 padding would lose.
    let (weights, _) = random_weights(ModelKind::Lenet5, 4)?;
    let format: Format = "posit<16,1>".parse()?;
    let arith = PositGemm::new(&weights, format, Accumulation::Quire)?;
    let tiny = Tensor::full(3.0e-8f32, (1, 1, 28, 28), &Device::Cpu)?;
    let mut first = None;
    run_plan(ModelKind::Lenet5, &arith, &tiny, |name, x| {
        if name == "conv1" {
            first = Some(x.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?);
        }
        Ok(())
    })?;
    let first = first.expect("conv1 was visited");
    let inner = format.round(3.0e-8, Rounding::NearestEven, 0);
    assert!(inner != 0.0 && inner < 1e-7);
    for (i, &v) in first.iter().enumerate() {
        let (y, x) = (i / 32, i % 32);
        let border = !(2..30).contains(&y) || !(2..30).contains(&x);
        assert_eq!(v, if border { -1.0 } else { inner }, "pixel ({y}, {x})");
    }
    Ok(())
}

#[test]
fn posit_layers_are_the_quire_and_naive_ops_on_rounded_weights_and_outputs_stay_on_the_grid() -> R {
    let weights = trained_weights();
    let format: Format = "posit<8,0>".parse()?;
    let x = images(ModelKind::Lenet5, 4, 9)?;
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        let arith = PositGemm::new(&weights, format, acc)?;
        let input = arith.input(&x)?.flatten_from(1)?.narrow(1, 0, 400)?;
        let got = arith.layer("fc1", None, &input)?;
        let expected = quire::linear(
            &input,
            weights.get("fc1.weight")?,
            Some(weights.get("fc1.bias")?),
            &format,
            acc,
        )?;
        assert_eq!(
            got.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
            expected
                .to_dtype(DType::F64)?
                .flatten_all()?
                .to_vec1::<f64>()?
        );
        let logits = run_plan(ModelKind::Lenet5, &arith, &x, |_, _| Ok(()))?;
        for v in logits
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?
        {
            assert_eq!(
                format.round(v, Rounding::NearestEven, 0),
                v,
                "{acc:?} logit {v}"
            );
        }
    }
    Ok(())
}

#[test]
fn float16_rounds_weights_inputs_and_layer_outputs_to_fp16() -> R {
    let weights = trained_weights();
    let arith = Float16::new(&weights)?;
    let x = images(ModelKind::Lenet5, 2, 3)?;
    let fp16: Format = "fp16".parse()?;
    let on_grid = |t: &Tensor| -> anyhow::Result<bool> {
        Ok(t.flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .all(|&v| fp16.round(v as f64, Rounding::NearestEven, 0) == v as f64))
    };
    assert!(on_grid(&arith.input(&x)?)?);
    assert!(!on_grid(&x)?, "the sample must need rounding");
    let logits = run_plan(ModelKind::Lenet5, &arith, &x, |name, input| {
        let ok = on_grid(input).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        assert!(ok, "input of {name}");
        Ok(())
    })?;
    assert!(on_grid(&logits)?);
    Ok(())
}

#[test]
fn int8_layers_compute_integer_dot_products_with_calibrated_symmetric_scales() -> R {
    let weights = trained_weights();
    let calibration = subset(1000, 1).train_images;
    let arith = Int8::new(&weights, &calibration)?;
    // fc3 by hand: scale of its input from the f32 model's fc3 inputs on the calibration set.
    let float = Float32::new(&weights)?;
    let mut fc3_max = 0f64;
    run_plan(ModelKind::Lenet5, &float, &calibration, |name, x| {
        if name == "fc3" {
            fc3_max = fc3_max.max(x.abs()?.max_all()?.to_scalar::<f32>()? as f64);
        }
        Ok(())
    })?;
    let s_x = fc3_max / 127.0;
    let w = weights
        .get("fc3.weight")?
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()?;
    let b = weights
        .get("fc3.bias")?
        .to_dtype(DType::F64)?
        .to_vec1::<f64>()?;
    let w_max = w.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    let s_w = w_max / 127.0;
    let code = |v: f64, s: f64| (v / s).round_ties_even().clamp(-127.0, 127.0) as i64;
    // Inputs beyond the calibrated range clamp to ±127.
    let input: Vec<f64> = (0..84)
        .map(|i| (i as f64 - 40.0) * fc3_max / 30.0)
        .collect();
    let x = Tensor::from_vec(input.clone(), (1, 84), &Device::Cpu)?.to_dtype(DType::F32)?;
    let got = arith
        .layer("fc3", None, &x)?
        .to_dtype(DType::F64)?
        .to_vec2::<f64>()?;
    for (o, row) in w.iter().enumerate() {
        let mut acc: i64 = (b[o] / (s_x * s_w)).round() as i64;
        for (xi, wi) in input.iter().zip(row) {
            let xv = (*xi as f32) as f64;
            acc += code(xv, s_x) * code(*wi, s_w);
        }
        let expected = ((acc as f64) * (s_x * s_w)) as f32 as f64;
        assert_eq!(got[0][o], expected, "output {o}");
    }
    Ok(())
}

#[test]
fn every_method_keeps_a_learned_model_within_six_points_of_float32_and_posit_8_0_logits_tie() -> R {
    // One epoch on 6000 images reaches about 70% top-1 in float32; rounding the weights and
    // activations to 8-bit formats must keep it within a few points.
    let weights = trained_weights();
    let data = subset(1000, 1000);
    let formats: Vec<qcandle::ptq::FormatRows> = vec!["posit<8,0>".parse()?];
    let mut scores = HashMap::new();
    for method in methods(&formats) {
        let arith = qcandle::ptq::arithmetic(method, &weights, &data)?;
        scores.insert(
            method.to_string(),
            evaluate(&weights, arith.as_ref(), &data)?,
        );
    }
    let f32_top1 = scores["float32"].top1;
    assert!(f32_top1 > 60.0, "float32 top-1 {f32_top1}");
    for (name, s) in &scores {
        assert!(
            s.top1 > f32_top1 - 6.0,
            "{name}: {} vs float32 {f32_top1}",
            s.top1
        );
        assert!(s.top5 >= s.top1);
    }
    assert_eq!(scores["float32"].tied, 0.0);
    assert!(
        scores["posit<8,0> quire"].tied > 0.0,
        "posit<8,0> logits tie on some images"
    );
    Ok(())
}

#[test]
fn methods_list_float32_float16_int8_then_naive_and_quire_per_posit_and_naive_only_otherwise() -> R
{
    let formats: Vec<qcandle::ptq::FormatRows> = vec!["posit<8,0>".parse()?, "e4m3".parse()?];
    let names: Vec<String> = methods(&formats).iter().map(Method::to_string).collect();
    assert_eq!(
        names,
        [
            "float32",
            "float16",
            "int8",
            "posit<8,0> naive",
            "posit<8,0> quire",
            "e4m3 naive"
        ]
    );
    Ok(())
}

#[test]
fn a_tie_for_the_top_logit_is_detected_and_ranked_to_the_lower_class() {
    assert!(top_is_tied(&[0.5, 2.0, -1.0, 2.0]));
    assert!(!top_is_tied(&[0.5, 2.0, -1.0, 1.99]));
    assert!(
        !top_is_tied(&[0.5, 0.5, 1.0]),
        "a tie below the top is not a top tie"
    );
    let logits = [0.5f64, 2.0, -1.0, 2.0];
    assert_eq!(qcandle::train::rank_of(&logits, 1), 0);
    assert_eq!(qcandle::train::rank_of(&logits, 3), 1);
}

#[test]
fn a_quantized_model_holds_u8_patterns_a_quarter_of_the_size_and_reads_back_to_the_same_scores() -> R
{
    let weights = trained_weights();
    let dir = tempfile::tempdir()?;
    let format: Format = "posit<8,0>".parse()?;
    let path = dir.path().join("q.safetensors");
    let bytes = write_quantized(&path, &weights, &format)?;
    let f32_bytes = std::fs::metadata(&trained().0)?.len();
    let ratio = bytes as f64 / f32_bytes as f64;
    assert!((0.25..0.27).contains(&ratio), "size ratio {ratio}");
    for (name, t) in read_tensors(&path)? {
        assert_eq!(t.dtype(), DType::U8, "{name}");
    }
    let back = read_weights(&path, None)?;
    assert_eq!(back.model, ModelKind::Lenet5);
    assert_eq!(back.format, Some(format));
    let q = qcandle::Quant::new(format);
    for (name, t) in &weights.tensors {
        let rounded = qcandle::quantize_no_grad(t, &q)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        // Read back in f64 (exact for every pattern); posit<8,0> values are exact in f32.
        let loaded = back.tensors[name]
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert_eq!(rounded, loaded, "{name}");
    }
    let data = subset(1, 500);
    for acc in [Accumulation::Quire, Accumulation::Naive] {
        let a = evaluate(&weights, &PositGemm::new(&weights, format, acc)?, &data)?;
        let b = evaluate(&back, &PositGemm::new(&back, format, acc)?, &data)?;
        assert_eq!(
            (a.top1, a.top5, a.tied),
            (b.top1, b.top5, b.tied),
            "{acc:?}"
        );
    }
    Ok(())
}

/// The safetensors crate writes metadata in a `HashMap`'s order, which differs between maps
/// (and processes): with two metadata keys, 16 writes in one order by chance has odds 2^-15.
#[test]
fn a_quantized_model_file_has_the_same_bytes_every_time_it_is_written() -> R {
    let weights = trained_weights();
    let dir = tempfile::tempdir()?;
    let format: Format = "posit<8,0>".parse()?;
    let first = dir.path().join("first.safetensors");
    write_quantized(&first, &weights, &format)?;
    let expected = std::fs::read(&first)?;
    for i in 0..15 {
        let path = dir.path().join(format!("{i}.safetensors"));
        write_quantized(&path, &weights, &format)?;
        assert!(std::fs::read(&path)? == expected, "write {i} differs");
    }
    assert_eq!(read_weights(&first, None)?.format, Some(format));
    Ok(())
}

fn write_model(path: &Path, tensors: Vec<(String, Tensor)>) -> R {
    write_tensors(path, &tensors)
}

fn model_tensors() -> Vec<(String, Tensor)> {
    read_tensors(&trained().0).expect("the trained model")
}

fn read_error(path: &Path, arch: Option<ModelKind>) -> String {
    match read_weights(path, arch) {
        Ok(_) => panic!("{} read without error", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn model_files_with_missing_extra_misshapen_or_integer_tensors_are_refused_by_name() -> R {
    let dir = tempfile::tempdir()?;
    let arch = Some(ModelKind::Lenet5);
    let path = dir.path().join("m.safetensors");

    let missing: Vec<_> = model_tensors()
        .into_iter()
        .filter(|(n, _)| n != "fc2.bias")
        .collect();
    write_model(&path, missing)?;
    let e = read_error(&path, arch);
    assert!(e.contains("missing tensors fc2.bias"), "{e}");

    let mut extra = model_tensors();
    extra.push((
        "fc4.weight".into(),
        Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?,
    ));
    write_model(&path, extra)?;
    let e = read_error(&path, arch);
    assert!(e.contains("unexpected tensors fc4.weight"), "{e}");

    let misshapen: Vec<_> = model_tensors()
        .into_iter()
        .map(|(n, t)| {
            let t = if n == "conv2.weight" {
                Tensor::zeros((16, 6, 3, 3), DType::F32, &Device::Cpu).unwrap()
            } else {
                t
            };
            (n, t)
        })
        .collect();
    write_model(&path, misshapen)?;
    let e = read_error(&path, arch);
    assert!(e.contains("`conv2.weight` has shape [16, 6, 3, 3]"), "{e}");

    let integer: Vec<_> = model_tensors()
        .into_iter()
        .map(|(n, t)| {
            let t = if n == "fc3.bias" {
                t.to_dtype(DType::U32).unwrap()
            } else {
                t
            };
            (n, t)
        })
        .collect();
    write_model(&path, integer)?;
    let e = read_error(&path, arch);
    assert!(e.contains("`fc3.bias` has dtype U32"), "{e}");

    // A CifarNet reading of a LeNet-5 file names what is missing.
    write_model(&path, model_tensors())?;
    let e = read_error(&path, Some(ModelKind::CifarNet));
    assert!(e.contains("but cifarnet needs"), "{e}");
    Ok(())
}

#[test]
fn truncated_corrupt_absent_and_unlabelled_model_files_are_clear_errors() -> R {
    let dir = tempfile::tempdir()?;
    let arch = Some(ModelKind::Lenet5);
    let bytes = std::fs::read(&trained().0)?;

    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2])?;
    let e = read_error(&truncated, arch);
    assert!(e.contains("truncated or corrupt"), "{e}");

    let header_cut = dir.path().join("header.safetensors");
    std::fs::write(&header_cut, &bytes[..5])?;
    let e = read_error(&header_cut, arch);
    assert!(e.contains("truncated or corrupt"), "{e}");

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"this is not a tensor file at all")?;
    let e = read_error(&garbage, arch);
    assert!(e.contains("truncated or corrupt"), "{e}");

    let e = read_error(&dir.path().join("absent.safetensors"), arch);
    assert!(e.contains("cannot read"), "{e}");

    // No --arch and no run.json beside the file: the model cannot be told.
    let lone = dir.path().join("lone.safetensors");
    std::fs::write(&lone, &bytes)?;
    let e = read_error(&lone, None);
    assert!(e.contains("cannot tell which model"), "{e}");

    // A quantized file names its model; a contradicting --arch is refused.
    let q = dir.path().join("q.safetensors");
    write_quantized(&q, &trained_weights(), &"posit<8,0>".parse()?)?;
    let e = read_error(&q, Some(ModelKind::Mlp));
    assert!(e.contains("holds a lenet5 model, not mlp"), "{e}");
    Ok(())
}

#[test]
fn posit_arithmetic_refuses_formats_without_a_quire_or_elementwise_rounding() -> R {
    let weights = trained_weights();
    for (format, acc, needle) in [
        ("e4m3", Accumulation::Quire, "has no quire"),
        ("fixed<8,4>", Accumulation::Quire, "has no quire"),
        ("block<8>", Accumulation::Naive, "rounds whole blocks"),
        (
            "posit<32,5>",
            Accumulation::Quire,
            "beyond the quire's range",
        ),
    ] {
        let Err(e) = PositGemm::new(&weights, format.parse()?, acc) else {
            panic!("{format} {acc:?} accepted");
        };
        assert!(e.to_string().contains(needle), "{format}: {e}");
    }
    Ok(())
}

#[test]
fn a_model_read_from_its_run_directory_needs_no_arch() -> R {
    let w = read_weights(
        &trained().0,
        qcandle::ptq::model_file::model_of_run(&trained().0)?,
    )?;
    assert_eq!(w.model, ModelKind::Lenet5);
    assert_eq!(w.format, None);
    assert_eq!(w.tensors.len(), 10);
    Ok(())
}

/// An MLP "arithmetic" whose logits always tie classes 0 and 1 at the top.
struct TiedLogits;

impl Arithmetic for TiedLogits {
    fn input(&self, images: &Tensor) -> candle_core::Result<Tensor> {
        Ok(images.clone())
    }
    fn layer(
        &self,
        name: &str,
        _: Option<(usize, usize)>,
        x: &Tensor,
    ) -> candle_core::Result<Tensor> {
        let n = x.dim(0)?;
        match name {
            "fc1" => Tensor::zeros((n, 256), DType::F32, x.device()),
            "fc2" => Tensor::zeros((n, 128), DType::F32, x.device()),
            _ => {
                let row = [2.0f32, 2.0, 1.0, 0.5, 0.0, -1.0, -1.0, -2.0, -3.0, -4.0];
                Tensor::new(&row, x.device())?.unsqueeze(0)?.repeat((n, 1))
            }
        }
    }
}

#[test]
fn ties_go_to_the_lower_class_and_the_report_gives_the_range_over_tie_rules() -> R {
    let data = subset(1, 1000);
    let labels = data.test_labels.to_vec1::<u32>()?;
    let share = |f: &dyn Fn(u32) -> bool| {
        100.0 * labels.iter().filter(|&&l| f(l)).count() as f64 / labels.len() as f64
    };
    let (weights, _) = random_weights(ModelKind::Mlp, 1)?;
    let s = evaluate(&weights, &TiedLogits, &data)?;
    assert_eq!(s.tied, 100.0);
    assert_eq!(s.top1, share(&|l| l == 0), "class 0 wins the tie");
    assert_eq!(s.top1_range, (0.0, share(&|l| l <= 1)));
    assert_eq!(s.top5, share(&|l| l <= 4));
    let table = qcandle::ptq::markdown(&[(Method::Float32, s)]);
    assert!(
        table.contains(&format!("| float32 | {:.2} |", s.top1)),
        "{table}"
    );
    assert!(
        table.contains(&format!("| 0.00–{:.2} |", share(&|l| l <= 1))),
        "{table}"
    );
    Ok(())
}

/// The values of `t` rounded (nearest even) to the block-scaled `format` in blocks along
/// axis 1, by the scalar rules: blocks of 32 (MX) or 16 (NVFP4) consecutive indices of axis
/// 1 for each position of the other axes, a shorter last block, NVFP4's tensor scale from
/// the largest magnitude of the whole tensor.
fn blocks_along_axis1(t: &Tensor, format: &Format) -> anyhow::Result<Vec<f64>> {
    use qcandle::format::nvfp4::Nvfp4;
    let dims = t.dims().to_vec();
    let (outer, along) = (dims[0], dims[1]);
    let inner: usize = dims[2..].iter().product();
    let x = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let block = if matches!(format, Format::Nvfp4(_)) {
        16
    } else {
        32
    };
    let s_t = Nvfp4::tensor_scale(x.iter().fold(0f64, |m, v| m.max(v.abs())));
    let mut out = vec![0f64; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            for start in (0..along).step_by(block) {
                let idx: Vec<usize> = (start..(start + block).min(along))
                    .map(|a| (o * along + a) * inner + i)
                    .collect();
                let amax = idx.iter().fold(0f64, |m, &k| m.max(x[k].abs()));
                for &k in &idx {
                    out[k] = match format {
                        Format::Mx(m) => m.round(
                            x[k],
                            m.scale_exponent(amax),
                            qcandle::format::rounding::NearestEven,
                            0,
                        ),
                        _ => Nvfp4::round(
                            x[k],
                            Nvfp4::block_scale(amax, s_t),
                            s_t,
                            qcandle::format::rounding::NearestEven,
                            0,
                        ),
                    };
                }
            }
        }
    }
    Ok(out)
}

fn f32_bits(v: &[f64]) -> Vec<u32> {
    v.iter().map(|&v| (v as f32).to_bits()).collect()
}

fn tensor_bits(t: &Tensor) -> anyhow::Result<Vec<u32>> {
    Ok(t.to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .iter()
        .map(|v| v.to_bits())
        .collect())
}

#[test]
fn block_scaled_layers_round_weights_and_inputs_along_the_input_channels_and_sum_in_f32() -> R {
    use qcandle::ptq::arith::BlockScaled;
    let weights = trained_weights();
    let x = images(ModelKind::Lenet5, 3, 21)?;
    for name in ["mxfp8_e4m3", "mxfp4_e2m1", "mxint8", "nvfp4"] {
        let format: Format = name.parse()?;
        let arith = BlockScaled::new(&weights, format)?;
        // conv2 (16, 6, 5, 5): one block of 6 channels per output and kernel position; fc1
        // (120, 400): twelve blocks of 32 and one of 16 (MX), 25 of 16 (NVFP4).
        let conv_in = Tensor::from_vec(
            qcandle::report::normal_samples(3 * 6 * 12 * 12, 4),
            (3, 6, 12, 12),
            &Device::Cpu,
        )?;
        let fc_in = Tensor::from_vec(
            qcandle::report::normal_samples(3 * 400, 5),
            (3, 400),
            &Device::Cpu,
        )?;
        for (layer, input, conv) in [("conv2", &conv_in, Some((1, 0))), ("fc1", &fc_in, None)] {
            let w = weights.get(&format!("{layer}.weight"))?;
            let b = weights
                .get(&format!("{layer}.bias"))?
                .to_dtype(DType::F32)?;
            let rw = Tensor::from_vec(
                blocks_along_axis1(w, &format)?
                    .iter()
                    .map(|&v| v as f32)
                    .collect::<Vec<f32>>(),
                w.dims(),
                &Device::Cpu,
            )?;
            let rx = Tensor::from_vec(
                blocks_along_axis1(input, &format)?
                    .iter()
                    .map(|&v| v as f32)
                    .collect::<Vec<f32>>(),
                input.dims(),
                &Device::Cpu,
            )?;
            let expected = match conv {
                Some((stride, padding)) => {
                    let cfg = candle_nn::Conv2dConfig {
                        stride,
                        padding,
                        ..Default::default()
                    };
                    qcandle::ops::conv2d(&rx, &rw, Some(&b), &cfg)?
                }
                None => rx.matmul(&rw.t()?)?.broadcast_add(&b)?,
            };
            let got = arith.layer(layer, conv, input)?;
            assert_eq!(
                tensor_bits(&got)?,
                tensor_bits(&expected)?,
                "{name} {layer}"
            );
            assert_ne!(
                tensor_bits(&rx)?,
                tensor_bits(input)?,
                "{name}: the input must need rounding"
            );
        }
        // The images enter the first layer as they are, and its rounding makes them blocks of
        // one channel: each pixel its own scale.
        let logits = run_plan(ModelKind::Lenet5, &arith, &x, |_, _| Ok(()))?;
        assert_eq!(logits.dims(), [3, 10]);
    }
    Ok(())
}

#[test]
fn methods_give_block_scaled_formats_one_f32_row_and_refuse_an_explicit_block_axis() -> R {
    let formats: Vec<qcandle::ptq::FormatRows> = vec!["mxfp8_e4m3".parse()?, "nvfp4".parse()?];
    let names: Vec<String> = methods(&formats).iter().map(Method::to_string).collect();
    assert_eq!(
        names,
        ["float32", "float16", "int8", "mxfp8_e4m3 f32", "nvfp4 f32"]
    );
    qcandle::ptq::check_formats(&formats)?;
    for text in ["mxfp8_e4m3<dim=0>", "nvfp4<dim=-2>"] {
        let err = qcandle::ptq::check_formats(&[text.parse()?]).unwrap_err();
        assert!(
            format!("{err:#}").contains("names its block axis"),
            "{err:#}"
        );
    }
    Ok(())
}

#[test]
fn a_block_scaled_model_is_packed_codes_and_scales_and_reads_back_to_the_evaluated_values() -> R {
    use qcandle::ptq::arith::BlockScaled;
    let weights = trained_weights();
    let f32_bytes = std::fs::metadata(&trained().0)?.len();
    let dir = tempfile::tempdir()?;
    let data = subset(1, 300);
    for (name, bits, block) in [
        ("mxfp8_e4m3", 8, 32),
        ("mxfp6_e2m3", 6, 32),
        ("mxfp4_e2m1", 4, 32),
        ("nvfp4", 4, 16),
    ] {
        let format: Format = name.parse()?;
        let path = dir.path().join(format!("{name}.safetensors"));
        let bytes = write_quantized(&path, &weights, &format)?;
        // Per weight: its codes, densely packed, and a scale byte per block of axis 1; per
        // bias: f32.
        let mut payload = 0;
        for t in weights.tensors.values() {
            let dims = t.dims();
            payload += if dims.len() < 2 {
                4 * t.elem_count()
            } else {
                let rows = t.elem_count() / dims[1];
                (t.elem_count() * bits).div_ceil(8) + rows * dims[1].div_ceil(block)
            };
        }
        let stored = read_tensors(&path)?;
        let stored_bytes: usize = stored
            .iter()
            .map(|(_, t)| t.elem_count() * t.dtype().size_in_bytes())
            .sum();
        assert_eq!(stored_bytes, payload, "{name}");
        let ratio = bytes as f64 / f32_bytes as f64;
        assert!(ratio < 0.3, "{name}: size ratio {ratio}");
        for (tensor, t) in &stored {
            let want = if tensor.ends_with(".bias") {
                DType::F32
            } else {
                DType::U8
            };
            assert_eq!(t.dtype(), want, "{name} {tensor}");
        }
        assert_eq!(
            stored.len(),
            weights.tensors.len() + 5,
            "{name}: a scales tensor per weight"
        );
        let back = read_weights(&path, None)?;
        assert_eq!(back.format, Some(format));
        for (tensor, t) in &weights.tensors {
            let expected = if t.rank() < 2 {
                tensor_bits(t)?
            } else {
                f32_bits(&blocks_along_axis1(t, &format)?)
            };
            assert_eq!(
                tensor_bits(&back.tensors[tensor])?,
                expected,
                "{name} {tensor}"
            );
        }
        let a = evaluate(&weights, &BlockScaled::new(&weights, format)?, &data)?;
        let b = evaluate(&back, &BlockScaled::new(&back, format)?, &data)?;
        assert_eq!((a.top1, a.top5, a.tied), (b.top1, b.top5, b.tied), "{name}");
        assert!(a.top1 > 50.0, "{name}: top-1 {}", a.top1);
        let again = dir.path().join(format!("{name}-again.safetensors"));
        write_quantized(&again, &weights, &format)?;
        assert!(std::fs::read(&again)? == std::fs::read(&path)?, "{name}");
    }
    Ok(())
}

/// Rewrites the safetensors file `from` to `to` after `edit` changed its tensors and
/// metadata.
fn edit_model(
    from: &Path,
    to: &Path,
    edit: impl FnOnce(&mut HashMap<String, Tensor>, &mut HashMap<String, String>),
) -> R {
    let bytes = std::fs::read(from)?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)?;
    let mut metadata = header.metadata().clone().unwrap_or_default();
    let mut tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?;
    edit(&mut tensors, &mut metadata);
    let out = safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(metadata))?;
    std::fs::write(to, out)?;
    Ok(())
}

#[test]
fn a_packed_model_with_missing_misshapen_or_mislabelled_parts_is_refused_by_name() -> R {
    let weights = trained_weights();
    let dir = tempfile::tempdir()?;
    let good = dir.path().join("good.safetensors");
    write_quantized(&good, &weights, &"nvfp4".parse()?)?;
    let bad = dir.path().join("bad.safetensors");
    type Edit = Box<dyn FnOnce(&mut HashMap<String, Tensor>, &mut HashMap<String, String>)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|t, _| {
                t.remove("fc1.weight.scales");
            }),
            "tensor `fc1.weight.scales` is missing",
        ),
        (
            Box::new(|t, _| {
                let s = t["fc2.weight.scales"].narrow(0, 0, 10).unwrap();
                t.insert("fc2.weight.scales".into(), s);
            }),
            "packed weight `fc2.weight`",
        ),
        (
            Box::new(|t, _| {
                let c = t["conv1.weight"].to_dtype(DType::F32).unwrap();
                t.insert("conv1.weight".into(), c);
            }),
            "tensor `conv1.weight` must be a vector of U8 bytes",
        ),
        (
            Box::new(|_, m| {
                m.insert("fc3.weight.format".into(), "mxfp4_e2m1<dim=1>".into());
            }),
            "metadata `fc3.weight.format`",
        ),
        (
            Box::new(|_, m| {
                m.insert("fc3.weight.format".into(), "nvfp4<dim=0>".into());
            }),
            "blocked along axis 1",
        ),
        (
            Box::new(|_, m| {
                m.remove("conv2.weight.tensor_scale");
            }),
            "metadata `conv2.weight.tensor_scale` is missing",
        ),
        (
            Box::new(|_, m| {
                m.insert("conv2.weight.tensor_scale".into(), "-1".into());
            }),
            "tensor scale",
        ),
        (
            Box::new(|_, m| {
                m.insert("conv2.weight.shape".into(), "16,6,5".into());
            }),
            "packed weight `conv2.weight`",
        ),
        (
            Box::new(|_, m| {
                m.remove("fc1.weight.format");
            }),
            "no `fc1.weight.format`",
        ),
    ];
    for (i, (edit, expected)) in cases.into_iter().enumerate() {
        edit_model(&good, &bad, edit)?;
        let err = read_error(&bad, None);
        assert!(err.contains(expected), "case {i}: {err}");
        assert!(err.contains("bad.safetensors"), "case {i}: {err}");
    }
    Ok(())
}
